"""The machinery of the Redis LRU experiment (redis_lru.py): which Redis binaries there are,
the native client, and the Commands of one run of redis-server under one configuration (the
driver measures them: bench/driver.py).

One run, while the driver samples the server for as long as it lives:

  1. redis-server starts as an LRU cache (`maxmemory`, `allkeys-lru`, no persistence) on a
     free loopback port, under the configuration's allocator;
  2. the client (the Conductor, a framework.Command client: the driver runs it in a thread)
     waits for the port, runs the native client (phase 1:
     many keys with small values, phase 2: fewer keys with larger ones, pipelined), switches
     `activedefrag` on where the configuration asks for it (the paper enables it once all
     keys are in), keeps the server idle until the hold time is over (the figure is memory
     over time: background compaction needs the time to show), reads INFO, and shuts the
     server down cleanly (`redis-cli shutdown nosave`) so that meshalloc prints its
     statistics at exit;
  3. the samples, the client's timings, Redis's INFO and meshalloc's statistics are kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..allocators import MESHALLOC_CONFIG_OVERRIDES, Allocator
from ..measure import RunResult, summarize
from .framework import TIMED, Command, ExperimentUnavailable, Served
from .framework import Run as Measured

# Where scripts/redis/build.sh caches its binaries (REDIS_CACHE overrides, as for the script).
CACHE_VARIABLE = "REDIS_CACHE"
DEFAULT_CACHE = Path("third_party_cache")
BIN_SUBDIR = "redis-bin"
LIBC_SERVER = "redis-server-libc"
JEMALLOC_SERVER = "redis-server-jemalloc"
CACHED_CLI = "redis-cli"
BUILD_SCRIPT = Path("scripts") / "redis" / "build.sh"
# Debian's own packages (redis-server, redis-tools; scripts/setup.sh installs them): linked
# against Debian's jemalloc 5.3, which lacks the hook Redis's active defragmentation needs.
DEBIAN_SERVER = Path("/usr/bin/redis-server")
DEBIAN_CLI = Path("/usr/bin/redis-cli")

CLIENT_SOURCE = Path("bench") / "redis" / "lru_client.c"
# Not part of the CMake tree: compiled beside it, as the rest of build/ is ours to write.
CLIENT_BINARY = Path("build") / "redis" / "lru_client"
CLIENT_CFLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra"]

# redis-server options every configuration gets besides `--maxmemory`: an LRU cache with no
# persistence, listening on loopback only.
SERVER_OPTIONS = ["--maxmemory-policy", "allkeys-lru", "--save", "", "--appendonly", "no", "--daemonize", "no",
                  "--protected-mode", "yes", "--bind", "127.0.0.1"]
# Redis's own "Active defrag" test (tests/unit/memefficiency.tcl, which the paper adapted)
# tunes defragmentation like this: a cycle may start once fragmentation passes 5 % and 2 MB,
# and may take 65-75 % of the main thread, 100 times a second. `activedefrag yes` itself is
# set only after the insertion, as in the paper.
ACTIVEDEFRAG_OPTIONS = ["--hz", "100", "--active-defrag-threshold-lower", "5", "--active-defrag-cycle-min", "65",
                        "--active-defrag-cycle-max", "75", "--active-defrag-ignore-bytes", "2mb"]
# The meshalloc command's own variables (where the build is), not options of the library.
CLI_ONLY_VARIABLES = ("MESHALLOC_BUILD_DIR", "MESHALLOC_ROOT")

SERVER_READY_TIMEOUT_S = 15.0
CLIENT_TIMEOUT_S = 600.0
SHUTDOWN_TIMEOUT_S = 30.0
CLI_TIMEOUT_S = 10.0
KILL_GRACE_S = 2.0
POLL_S = 0.01
HOLD_SLICE_S = 0.05
CONNECT_PROBE_S = 0.2
# Beyond the client's own timeout: the shutdown and its fallbacks.
CONDUCTOR_JOIN_SLACK_S = SHUTDOWN_TIMEOUT_S + 2 * KILL_GRACE_S + 60
NS_PER_MS = 1e6
NS_PER_S = 1e9
# Metrics read from meshalloc's nanosecond statistics at exit: name -> (statistic, divisor).
NANOSECOND_STATS = {
    "mesh_pause_max_ms": ("mesh_pause_max_ns", NS_PER_MS),
    "mesh_pause_wait_max_ms": ("mesh_pause_wait_max_ns", NS_PER_MS),
    "mesh_barrier_max_ms": ("mesh_barrier_max_ns", NS_PER_MS),
    "mesh_pause_total_s": ("mesh_pause_total_ns", NS_PER_S),
    "mesh_cpu_s": ("mesh_cpu_ns", NS_PER_S),
}
MS_PER_S = 1000


# ---------------------------------------------------------------------------------------------
# What to run

@dataclass(frozen=True)
class Workload:
    """The load of one run and how long the server lives."""

    maxmemory: str  # Redis's syntax: "100mb" (Redis reads it as MiB)
    phases: Tuple[Tuple[int, int], ...]  # (keys, value bytes) per client phase
    pipeline: int  # SET commands per pipelined batch
    hold_s: float  # the server lives this long after its start ...
    idle_after_s: float  # ... but at least this long after the insertion
    interval_s: float  # sampling interval
    seed: int  # the client's seed for repetition 1 (repetition N uses seed + N - 1)
    reads: int = 0  # GETs of random inserted keys after the insertion (the client's --reads)
    rate: int = 0  # keys per second the insertion is paced at (the client's --rate); 0: unpaced

    def describe(self) -> str:
        (keys1, size1), (keys2, size2) = self.phases
        reads = f", then {self.reads:,} GETs of random inserted keys" if self.reads else ""
        return (f"`maxmemory {self.maxmemory}`, `allkeys-lru`; {keys1:,} keys with {size1}-byte values, then "
                f"{keys2:,} keys with {size2}-byte values, pipelined {self.pipeline} at a time{reads}; the server "
                f"is kept {self.hold_s:g} s in all (at least {self.idle_after_s:g} s after the insertion), then "
                "shut down")


@dataclass(frozen=True)
class RedisInstall:
    """The redis-server binaries one experiment runs."""

    jemalloc_server: Path  # the bundled-jemalloc build, or Debian's binary
    libc_server: Optional[Path]  # MALLOC=libc, for glibc and preloaded allocators; None on Debian's
    cli: Path
    from_source: bool  # scripts/redis/build.sh's builds (False: Debian's packaged binary)

    @property
    def preload_server(self) -> Path:
        """The binary preloaded allocators go into: the libc build when there is one. Debian's
        binary links jemalloc dynamically, so a preloaded malloc takes its place (Redis's
        calls of jemalloc's `mallctl`/`nallocx` still go to jemalloc, or to meshalloc's own
        `mallctl`)."""
        return self.libc_server or self.jemalloc_server

    @property
    def has_activedefrag(self) -> bool:
        return self.from_source

    def version(self) -> str:
        """"7.0.15 (malloc=jemalloc-5.2.1)", from the jemalloc server's --version."""
        try:
            text = subprocess.run([str(self.jemalloc_server), "--version"], capture_output=True, text=True,
                                  timeout=CLI_TIMEOUT_S, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return "?"
        version = re.search(r"v=(\S+)", text)
        malloc = re.search(r"malloc=(\S+)", text)
        return f"{version.group(1) if version else '?'} (malloc={malloc.group(1) if malloc else '?'})"


@dataclass
class Config:
    """One column of the figure: a server binary, an allocator, Redis options."""

    name: str
    server: Path
    allocator: Allocator
    extra_args: List[str] = field(default_factory=list)
    activedefrag_after_insert: bool = False
    meshalloc: bool = False

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name)


def cache_directory(root: Path) -> Path:
    explicit = os.environ.get(CACHE_VARIABLE)
    cache = Path(explicit) if explicit else DEFAULT_CACHE
    return cache if cache.is_absolute() else root / cache


def cached_install(root: Path) -> Optional[RedisInstall]:
    """scripts/redis/build.sh's binaries when all three are there."""
    bin_dir = cache_directory(root) / BIN_SUBDIR
    servers = (bin_dir / JEMALLOC_SERVER, bin_dir / LIBC_SERVER, bin_dir / CACHED_CLI)
    if not all(os.access(path, os.X_OK) for path in servers):
        return None
    return RedisInstall(jemalloc_server=servers[0], libc_server=servers[1], cli=servers[2], from_source=True)


def debian_install() -> Optional[RedisInstall]:
    if os.access(DEBIAN_SERVER, os.X_OK) and os.access(DEBIAN_CLI, os.X_OK):
        return RedisInstall(jemalloc_server=DEBIAN_SERVER, libc_server=None, cli=DEBIAN_CLI, from_source=False)
    return None


def any_install(root: Path) -> Optional[RedisInstall]:
    """What a smoke run uses: the source builds if cached, else Debian's binary."""
    return cached_install(root) or debian_install()


def ensure_source_build(root: Path, log: Callable[[str], None]) -> RedisInstall:
    """The source builds, built first if they are missing (once: the script caches them).
    ExperimentUnavailable, with the script's last error line, when that fails."""
    install = cached_install(root)
    if install is not None:
        return install
    script = root / BUILD_SCRIPT
    if not os.access(script, os.X_OK):
        raise ExperimentUnavailable(f"no Redis builds and no {BUILD_SCRIPT} to make them")
    log(f"building Redis from Debian's source package ({BUILD_SCRIPT}; minutes, once)")
    completed = subprocess.run([str(script)], cwd=root, capture_output=True, text=True, check=False)
    install = cached_install(root)
    if completed.returncode != 0 or install is None:
        lines = [line.strip() for line in (completed.stderr + completed.stdout).splitlines() if line.strip()]
        failed = [line for line in lines if "FAILED" in line]
        last = (failed or lines or [f"exit status {completed.returncode}"])[-1]
        raise ExperimentUnavailable(f"cannot build Redis ({BUILD_SCRIPT}): {last}")
    return install


def compile_client(root: Path) -> Path:
    """build/redis/lru_client, compiled when missing or older than its source."""
    source = root / CLIENT_SOURCE
    binary = root / CLIENT_BINARY
    if binary.is_file() and os.access(binary, os.X_OK) and binary.stat().st_mtime >= source.stat().st_mtime:
        return binary
    compiler = shutil.which("cc")
    if compiler is None:
        raise ExperimentUnavailable(f"no C compiler (cc) to build {CLIENT_SOURCE}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    # Compiled under a temporary name and renamed: two experiments (a test and a run, say)
    # starting at once must never execute a half-written binary.
    handle, temporary = tempfile.mkstemp(dir=binary.parent, prefix=".lru_client-")
    os.close(handle)
    completed = subprocess.run([compiler, *CLIENT_CFLAGS, "-o", temporary, str(source)], capture_output=True,
                               text=True, check=False)
    if completed.returncode != 0:
        os.unlink(temporary)
        last = (completed.stderr.strip().splitlines() or ["?"])[-1]
        raise ExperimentUnavailable(f"cannot compile {CLIENT_SOURCE}: {last}")
    os.replace(temporary, binary)
    return binary


# ---------------------------------------------------------------------------------------------
# One run

@dataclass
class Run:
    config: Config
    repetition: int
    order: int
    directory: Path
    result: Optional[RunResult] = None
    client: Dict[str, str] = field(default_factory=dict)
    # The client's report from the timed run: the same server and load, not sampled (see
    # timed_command), from which the insertion time comes.
    timed_client: Dict[str, str] = field(default_factory=dict)
    client_start_s: Optional[float] = None  # seconds since the server was started
    client_end_s: Optional[float] = None
    info: Dict[str, str] = field(default_factory=dict)
    mesh_stats: Dict[str, Any] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)
    load_before: Optional[float] = None  # the 1-minute load average when the run started

    @property
    def insertion_s(self) -> Optional[float]:
        """The insertion's wall time in the timed (unsampled) run."""
        value = self.timed_client.get("total_s")
        return float(value) if value is not None else None

    @property
    def insertion_cpu_s(self) -> Optional[float]:
        """The server's main-thread CPU time over the timed run's insertion."""
        value = self.timed_client.get(MAIN_THREAD_CPU_KEY)
        return float(value) if value is not None else None

    @property
    def sampled_insertion_s(self) -> Optional[float]:
        """The insertion's wall time while the sampler read the server's smaps_rollup."""
        value = self.client.get("total_s")
        return float(value) if value is not None else None

    @property
    def served(self) -> bool:
        """The sampled server ran to its end and the client saw no error reply."""
        return (self.result is not None and self.result.succeeded and not self.problems
                and self.client.get("errors") == "0")

    @property
    def ok(self) -> bool:
        """Served, and the unsampled timing run (timed_command) also completed without errors."""
        return self.served and self.insertion_s is not None and self.timed_client.get("errors") == "0"

    def _info_number(self, key: str) -> Optional[float]:
        try:
            return float(self.info[key])
        except (KeyError, ValueError):
            return None

    def metric(self, name: str) -> Optional[float]:  # noqa: C901 - one flat table of names
        """One number of this run by name, for the tables, the TSV files and the claims."""
        result = self.result
        pss = result.summary("pss") if result else None
        stats = self.mesh_stats
        if name == "mean_pss":
            return pss.mean if pss else None
        if name == "final_pss":
            return pss.final if pss else None
        if name == "peak_pss":
            return pss.peak if pss else None
        if name == "mean_pss_after_insertion":
            if not result or self.client_end_s is None:
                return None
            after = [sample for sample in result.samples if sample.time >= self.client_end_s]
            shifted = summarize(after, "pss", result.wall_time) if after else None
            return shifted.mean if shifted else None
        if name in ("peak_pte", "peak_maps"):
            summary = result.summary(name[len("peak_"):]) if result else None
            return summary.peak if summary else None
        if name == "peak_cgroup":
            if result and result.cgroup_kernel_peak is not None:
                return result.cgroup_kernel_peak
            summary = result.summary("cgroup") if result else None
            return summary.peak if summary else None
        if name == "insertion_s":
            return self.insertion_s
        if name == "insertion_cpu_s":
            return self.insertion_cpu_s
        if name == "sampled_insertion_s":
            return self.sampled_insertion_s
        if name in ("phase1_s", "phase2_s"):
            value = self.client.get(name)
            return float(value) if value is not None else None
        if name == "load":
            return self.load_before
        if name == "hz":
            return result.achieved_rate if result else None
        if name == "server_cpu_s":
            user, system = self._info_number("used_cpu_user"), self._info_number("used_cpu_sys")
            return user + system if user is not None and system is not None else None
        if name == "defrag_s":
            if not self.config.activedefrag_after_insert:
                return None
            value = self._info_number("total_active_defrag_time")  # milliseconds
            return value / MS_PER_S if value is not None else None
        if name == "keys":
            match = re.match(r"keys=(\d+)", self.info.get("db0", ""))
            return float(match.group(1)) if match else None
        if name in ("evicted_keys", "used_memory"):
            return self._info_number(name)
        # meshalloc's own statistics at exit
        if name in ("mesh_count", "mesh_released", "mesh_released_peak", "mappings", "mesh_passes", "mesh_pauses"):
            return float(stats[name]) if name in stats else None
        if name == "barrier_faults":
            return float(stats[name]) if name in stats else None
        if name in NANOSECOND_STATS:
            source, scale = NANOSECOND_STATS[name]
            return stats[source] / scale if source in stats else None
        raise KeyError(name)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_PROBE_S):
            return True
    except OSError:
        return False


def parse_info(text: str) -> Dict[str, str]:
    info = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    return info


def redis_cli(cli: Path, port: int, *words: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(cli), "-h", "127.0.0.1", "-p", str(port), *words],
                          capture_output=True, text=True, timeout=timeout, check=False)


def run_seed(workload: Workload, repetition: int) -> int:
    """The client's seed in a repetition: every configuration of a repetition inserts the same keys."""
    return workload.seed + repetition - 1


# Redis stamps each key with a clock of one-second resolution (LRU_CLOCK_RESOLUTION: whole
# seconds of the wall clock), and eviction prefers keys with older stamps. The first phase's
# last keys share a stamp with the second phase's when both fall within one wall-clock second,
# so how many of them survive -- and so how much memory fragmentation is left -- depends on
# where in a second the insertion starts: on this machine meshalloc 3y ended with 151 MiB of
# PSS when the client started on a whole second and 126 MiB half a second later, every time.
# The client therefore starts at a set fraction of a second: the same for every configuration
# of a repetition (or timing round), spread over the second from one repetition to the next
# (multiples of the golden ratio's fraction: well spread however many there are).
GOLDEN_FRACTION = 0.6180339887498949


def clock_phase(index: int) -> float:
    """The fraction of a wall-clock second at which repetition (or timing round) `index` (from 1)
    starts its insertion."""
    return ((index - 1) * GOLDEN_FRACTION) % 1.0


def seconds_until_phase(now: float, phase: float) -> float:
    """How long to wait from wall-clock time `now` until the next instant at `phase` into a second."""
    return (phase - now % 1.0) % 1.0


def wait_for_clock_phase(phase: float) -> None:
    time.sleep(seconds_until_phase(time.time(), phase))


def client_command(client: Path, port: int, workload: Workload, seed: int) -> List[str]:
    (keys1, size1), (keys2, size2) = workload.phases
    return [str(client), "--port", str(port), "--batch", str(workload.pipeline),
            "--phase1", str(keys1), "--size1", str(size1), "--phase2", str(keys2), "--size2", str(size2),
            "--seed", str(seed)] + (["--reads", str(workload.reads)] if workload.reads else []) \
        + (["--rate", str(workload.rate)] if workload.rate else [])


class Conductor:
    """The client of a sampled server run (framework.Command.client): load, hold, shut down,
    everything into `run` (which it returns)."""

    def __init__(self, run: Run, port: int, workload: Workload, cli: Path, client: Path, served: Served):
        self.run_ = run
        self.port = port
        self.workload = workload
        self.cli_path = cli
        self.client = client
        self.served = served  # the time the server was started, and whether it has exited
        self.server_pid: Optional[int] = None

    def cli(self, *words: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
        return redis_cli(self.cli_path, self.port, *words, timeout=timeout)

    def since_start(self) -> float:
        return self.served.since_start()

    def client_command(self) -> List[str]:
        return client_command(self.client, self.port, self.workload, run_seed(self.workload, self.run_.repetition))

    def __call__(self) -> Run:
        try:
            if self.wait_for_server() and self.insert():
                self.hold()
        except Exception as error:  # reported with the run, never silent
            self.run_.problems.append(f"conductor: {type(error).__name__}: {error}")
        finally:
            self.shutdown()
        return self.run_

    def wait_for_server(self) -> bool:
        run = self.run_
        problem = wait_until_listening(self.port, self.served, "see server.log, stderr.txt")
        if problem:
            run.problems.append(problem)
            return False
        info = parse_info(self.cli("info", "server").stdout)
        self.server_pid = int(info["process_id"]) if "process_id" in info else None
        return True

    def insert(self) -> bool:
        run = self.run_
        wait_for_clock_phase(clock_phase(run.repetition))
        run.client_start_s = self.since_start()
        try:
            client = subprocess.run(self.client_command(), capture_output=True, text=True,
                                    timeout=CLIENT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            run.problems.append(f"the client did not finish within {CLIENT_TIMEOUT_S:g} s")
            return False
        run.client_end_s = self.since_start()
        (run.directory / "client.txt").write_text(client.stdout + client.stderr)
        if client.returncode != 0:
            run.problems.append(f"client exited with {client.returncode}: {client.stderr.strip()[-300:]}")
            return False
        run.client = dict(word.split("=", 1) for word in client.stdout.split() if "=" in word)
        if run.client.get("errors") != "0":
            run.problems.append(f"{run.client.get('errors')} error replies from the server")
        if run.config.activedefrag_after_insert:
            answer = self.cli("config", "set", "activedefrag", "yes")
            if answer.stdout.strip() != "OK":
                run.problems.append(f"CONFIG SET activedefrag yes: {answer.stdout.strip()} {answer.stderr.strip()}")
        return True

    def hold(self) -> None:
        run = self.run_
        hold_until = max(self.workload.hold_s, (run.client_end_s or 0.0) + self.workload.idle_after_s)
        while self.since_start() < hold_until and not self.served.gone.is_set():
            time.sleep(max(0.0, min(HOLD_SLICE_S, hold_until - self.since_start())))
        run.info = parse_info(self.cli("info", "everything").stdout)
        (run.directory / "info.txt").write_text("".join(f"{key}:{value}\n" for key, value in run.info.items()))

    def shutdown(self) -> None:
        """`shutdown nosave` (a clean exit: meshalloc prints its statistics); if the server does
        not go away, SIGTERM and then SIGKILL to its pid -- only ours."""
        if self.served.gone.is_set():
            return
        try:
            self.cli("shutdown", "nosave", timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.run_.problems.append("redis-cli shutdown nosave timed out")
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(HOLD_SLICE_S)
        if self.server_pid and port_open(self.port):
            self.run_.problems.append("the server ignored shutdown; sent SIGTERM/SIGKILL")
            for number in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(self.server_pid, number)
                except OSError:
                    break
                time.sleep(KILL_GRACE_S)


def wait_until_listening(port: int, served: Served, where: str) -> Optional[str]:
    """None once the server listens on `port`; else why it never will."""
    deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
    while not port_open(port):
        if served.gone.is_set():
            return f"the server exited before it listened ({where})"
        if time.monotonic() > deadline:
            return f"the server did not listen on port {port} within {SERVER_READY_TIMEOUT_S:g} s ({where})"
        time.sleep(POLL_S)
    return None


def server_environment(config: Config, base: Mapping[str, str]) -> Dict[str, str]:
    """The server's environment before the allocator's own settings: no MESHALLOC_* variables
    except, for meshalloc, the user's tuning ones (not those the configuration's name fixes)."""
    env = {key: value for key, value in base.items() if not key.startswith("MESHALLOC_")}
    if config.meshalloc:
        env.update({key: value for key, value in base.items()
                    if key.startswith("MESHALLOC_") and key not in MESHALLOC_CONFIG_OVERRIDES
                    and key not in CLI_ONLY_VARIABLES})
        # Statistics at exit, as JSON on the server's stderr (stderr.txt), not in a
        # MESHALLOC_STATS_FILE: the library keeps a pointer to that variable's value in the
        # environment block, and Redis reuses that block for its process title
        # (setproctitle), so by exit the path has been overwritten and no file is written.
        env.pop("MESHALLOC_STATS_FILE", None)
        env["MESHALLOC_STATS"] = "json"
    return env


def server_command(config: Config, port: int, workload: Workload, directory: Path, log_name: str) -> List[str]:
    return [str(config.server), "--port", str(port), "--maxmemory", workload.maxmemory, *SERVER_OPTIONS,
            "--dir", str(directory), "--logfile", str(directory / log_name), *config.extra_args]


def sampled_command(run: Run, workload: Workload, install: RedisInstall, client: Path) -> Command:
    """The sampled run of one server (the driver samples it while the Conductor loads, holds and
    stops it); what it finds lands in `run`, which sampled_record completes."""
    config = run.config
    port = free_port()
    env = server_environment(config, os.environ)
    command = server_command(config, port, workload, run.directory, "server.log")
    shown = {key: value for key, value in sorted(config.allocator.environment(env).items())
             if key == "LD_PRELOAD" or key.startswith("MESHALLOC_")}
    (run.directory / "command.txt").write_text(
        "".join(f"{key}={shlex.quote(value)} " for key, value in shown.items()) + shlex.join(command) + "\n")
    return Command(command, env=env, inherit_env=False, cwd=run.directory, interval_s=workload.interval_s,
                   timeout_s=CLIENT_TIMEOUT_S + CONDUCTOR_JOIN_SLACK_S, allocator=config.allocator,
                   client=lambda served: Conductor(run, port, workload, install.cli, client, served)())


def sampled_record(measured: Measured) -> Run:
    """The record of a sampled server run the driver made with sampled_command (the
    Conductor's, which the driver's run holds as its client), with the driver's measurement of
    the server: its samples, its exit, meshalloc's statistics at exit."""
    run = measured.client if isinstance(measured.client, Run) else Run(measured.allocator, measured.repetition,
                                                                      measured.order, measured.directory)
    run.result = measured.result
    if measured.result is None:
        run.problems.append(f"cannot run the server: {measured.status}")
    elif not measured.result.succeeded:
        run.problems.append(f"redis-server {measured.result.describe_exit()}")
    if measured.client_error:
        run.problems.append(measured.client_error)
    if run.config.meshalloc:
        run.mesh_stats = read_mesh_stats(run.directory / "stderr.txt", run.directory / "meshalloc-stats.json")
        if not run.mesh_stats:
            run.problems.append("no meshalloc statistics on the server's stderr (stderr.txt)")
    return run


# The server's main-thread CPU time over an unsampled insertion (Redis's INFO, read right after
# the client finished), added to the client's report: less noisy than the wall time, which also
# carries the client's scheduling on a shared machine.
MAIN_THREAD_CPU_KEY = "server_main_cpu_s"


def main_thread_cpu_s(info: Mapping[str, str]) -> Optional[float]:
    try:
        return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])
    except (KeyError, ValueError):
        return None


def timed_command(config: Config, workload: Workload, install: RedisInstall, client: Path, directory: Path,
                  index: int, prefix: str) -> Command:
    """One insertion without the sampler: a fresh server, the client (repetition or round
    `index`'s keys, started at its clock phase), a shutdown. The client returns the client's
    report and the problem that spoilt it, if any; the server's log and the client's output go
    to directory as PREFIX-server.log and PREFIX-client.txt.

    Reading /proc/PID/smaps_rollup 100 times a second walks every page table of the server under
    its mmap lock and takes one of this machine's two CPUs: every insertion was 11-20 % slower
    sampled (docs/redis-lru.md), which measures the machine's contention rather than the
    allocator. So the sampled run gives the memory figures and this one the speed; the sampled
    insertion time is kept as sampled_insertion_s."""
    port = free_port()
    env = server_environment(config, os.environ)
    env.pop("MESHALLOC_STATS", None)

    def insert(served: Served) -> Tuple[Dict[str, str], Optional[str]]:
        try:
            problem = wait_until_listening(port, served, f"see {prefix}-server.log")
            if problem:
                return {}, problem
            wait_for_clock_phase(clock_phase(index))
            try:
                done = subprocess.run(client_command(client, port, workload, run_seed(workload, index)),
                                      capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                return {}, f"the client did not finish within {CLIENT_TIMEOUT_S:g} s"
            (directory / f"{prefix}-client.txt").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                return {}, f"client exited with {done.returncode}: {done.stderr.strip()[-300:]}"
            report = dict(word.split("=", 1) for word in done.stdout.split() if "=" in word)
            if report.get("errors") != "0":
                return report, f"{report.get('errors')} error replies from the server"
            main_thread_cpu = main_thread_cpu_s(parse_info(redis_cli(install.cli, port, "info", "cpu").stdout))
            if main_thread_cpu is not None:
                report[MAIN_THREAD_CPU_KEY] = f"{main_thread_cpu:.6f}"
            return report, None
        finally:
            if not served.gone.is_set():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    redis_cli(install.cli, port, "shutdown", "nosave", timeout=SHUTDOWN_TIMEOUT_S)

    return Command(server_command(config, port, workload, directory, f"{prefix}-server.log"), env=env,
                   inherit_env=False, cwd=directory, measure=TIMED, timeout_s=CLIENT_TIMEOUT_S + CONDUCTOR_JOIN_SLACK_S,
                   allocator=config.allocator, client=insert)


def timed_report(measured: Measured) -> Tuple[Dict[str, str], Optional[str]]:
    """A timed run's client report and its problem (the server's own failure among them)."""
    report, problem = measured.client if measured.client is not None else ({}, None)
    if not measured.ok:
        problem = problem or measured.status
    return report, problem


@dataclass
class Insertion:
    """An unsampled insertion of a timing round (redis_lru.timing_rounds): configurations
    are compared within a round, never across rounds."""
    config: Config
    round: int
    report: Dict[str, str]
    problem: Optional[str]

    @property
    def seconds(self) -> Optional[float]:
        value = self.report.get("total_s")
        return float(value) if value is not None and self.problem is None else None

    @property
    def server_cpu_s(self) -> Optional[float]:
        value = self.report.get(MAIN_THREAD_CPU_KEY)
        return float(value) if value is not None and self.problem is None else None


def read_mesh_stats(stderr_file: Path, copy_to: Path) -> Dict[str, Any]:
    """meshalloc's JSON statistics from the last line of stderr that holds them; a copy of
    that document goes to copy_to. Empty when there is none (the server did not exit cleanly)."""
    try:
        lines = stderr_file.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        start = line.find('{"version"')
        if start < 0:
            continue
        try:
            document = json.loads(line[start:])
        except ValueError:
            continue
        copy_to.write_text(json.dumps(document, indent=1) + "\n")
        return document.get("stats", {})
    return {}


def describe_runs(runs: Sequence[Run]) -> List[str]:
    """One line per failed run, for Outcome.failures."""
    return [f"{run.config.name} #{run.repetition}: {'; '.join(run.problems) or 'no client result'}"
            for run in runs if not run.ok]
