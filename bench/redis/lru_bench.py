"""The Redis LRU experiment (paper section 6.2.2), driven from bench/redis/run.sh.

For every configuration (allocator, or allocator plus Redis option) and repetition, in
interleaved order (A B C ..., A B C ...):

  1. start redis-server as an LRU cache (`maxmemory 100mb`, `allkeys-lru`, no persistence)
     on a free loopback port, under the configuration's allocator, and sample its memory with
     the project's own sampler (meshalloc_cli.measure: PSS from /proc/PID/smaps_rollup, page
     tables, mappings, the memory-cgroup charge) for as long as it lives;
  2. meanwhile, from a second thread: wait for the port, run the native client
     (lru_client: 700,000 keys with 240-byte values, then 170,000 keys with 492-byte values,
     pipelined), switch `activedefrag` on for the configuration that uses it (the paper
     enables it once all keys are in), keep the server idle until the hold time is over (so
     that background compaction has time: the figure is memory over time), read INFO, and
     shut the server down cleanly (`redis-cli shutdown nosave`) so that meshalloc writes its
     statistics at exit (MESHALLOC_STATS=json, MESHALLOC_STATS_FILE);
  3. keep the samples, the client's timings, Redis's INFO and meshalloc's statistics.

Then a table of medians (with min-max over the repetitions) and ratios against jemalloc,
Redis's default allocator, a figure of PSS over time for every configuration, and the checks
of meshalloc against the targets.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from meshalloc_cli import allocators as allocator_registry
from meshalloc_cli.allocators import Allocator
from meshalloc_cli.compare import Stat
from meshalloc_cli.errors import MeshallocError
from meshalloc_cli.measure import KIB, MIB, RunResult, measure, summarize
from meshalloc_cli.output import write_run

# The experiment, as the paper describes it (and as Redis's own "Active defrag" test in
# tests/unit/memefficiency.tcl sets it up, with the paper's larger values).
MAXMEMORY = "100mb"
PHASES = ((700_000, 240), (170_000, 492))
PIPELINE = 256
# redis-server options every configuration gets: an LRU cache with no persistence, quiet.
SERVER_OPTIONS = ["--maxmemory", MAXMEMORY, "--maxmemory-policy", "allkeys-lru", "--save", "", "--appendonly", "no",
                  "--daemonize", "no", "--protected-mode", "yes", "--bind", "127.0.0.1"]
# Redis's own defrag test's tuning (memefficiency.tcl): a defrag cycle may start as soon as
# fragmentation passes 5 % and 2 MB, and may take 65-75 % of the main thread, 100 times a
# second. `activedefrag yes` itself is set only after the insertion, as in the paper.
ACTIVEDEFRAG_OPTIONS = ["--hz", "100", "--active-defrag-threshold-lower", "5", "--active-defrag-cycle-min", "65",
                        "--active-defrag-cycle-max", "75", "--active-defrag-ignore-bytes", "2mb"]
BASELINE = "jemalloc"
# The configurations, in the order they run within a repetition and appear in the table.
CONFIG_ORDER = ("jemalloc", "jemalloc+activedefrag", "glibc", "mimalloc", "tcmalloc", "meshalloc:2y", "meshalloc:0n")
MESHALLOC_TARGET = "meshalloc:2y"
# The targets meshalloc 2y is checked against (ratios to jemalloc; the pause in ms).
TARGET_MEAN_PSS_RATIO = 0.80
TARGET_INSERTION_RATIO = 1.10
TARGET_PAUSE_MS = 5.0
MIN_SAMPLE_HZ = 20.0
# The meshalloc command's own variables (where the build is), not options of the library.
CLI_ONLY_VARIABLES = ("MESHALLOC_BUILD_DIR", "MESHALLOC_ROOT")

SERVER_READY_TIMEOUT_S = 15.0
CLIENT_TIMEOUT_S = 600.0
SHUTDOWN_TIMEOUT_S = 30.0
AFTER_INSERTION_MIN_S = 2.0  # the hold is stretched so that at least this much idle time follows
NS_PER_MS = 1e6
NS_PER_S = 1e9


@dataclass
class Config:
    name: str
    server: Path
    allocator: Allocator
    extra_args: List[str] = field(default_factory=list)
    activedefrag_after_insert: bool = False
    meshalloc: bool = False

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name)


@dataclass
class Run:
    config: Config
    repetition: int
    order: int
    directory: Path
    result: Optional[RunResult] = None
    client: Dict[str, str] = field(default_factory=dict)
    client_start_s: Optional[float] = None  # seconds since the server was started
    client_end_s: Optional[float] = None
    info: Dict[str, str] = field(default_factory=dict)
    mesh_stats: Dict[str, Any] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)
    load_before: Optional[float] = None  # the 1-minute load average when the run started

    @property
    def insertion_s(self) -> Optional[float]:
        value = self.client.get("total_s")
        return float(value) if value is not None else None

    @property
    def ok(self) -> bool:
        return (self.result is not None and self.result.succeeded and self.insertion_s is not None
                and not self.problems and self.client.get("errors") == "0")

    def metric(self, name: str) -> Optional[float]:
        """One number of this run by name, for the table, the TSV files and the checks."""
        r = self.result
        summary = lambda metric: r.summary(metric) if r else None  # noqa: E731
        stats = self.mesh_stats
        if name == "mean_pss":
            return summary("pss").mean if summary("pss") else None
        if name == "final_pss":
            return summary("pss").final if summary("pss") else None
        if name == "peak_pss":
            return summary("pss").peak if summary("pss") else None
        if name == "mean_pss_after_insertion":
            if not r or self.client_end_s is None:
                return None
            after = [s for s in r.samples if s.time >= self.client_end_s]
            if not after:
                return None
            shifted = summarize(after, "pss", r.wall_time)
            return shifted.mean if shifted else None
        if name == "peak_pte":
            return summary("pte").peak if summary("pte") else None
        if name == "peak_maps":
            return summary("maps").peak if summary("maps") else None
        if name == "peak_cgroup":
            return r.cgroup_kernel_peak if r and r.cgroup_kernel_peak is not None else (
                summary("cgroup").peak if summary("cgroup") else None)
        if name == "insertion_s":
            return self.insertion_s
        if name in ("phase1_s", "phase2_s"):
            value = self.client.get(name)
            return float(value) if value is not None else None
        if name == "load":
            return self.load_before
        if name == "hz":
            return r.achieved_rate if r else None
        if name == "server_cpu_s":
            try:
                return float(self.info["used_cpu_user"]) + float(self.info["used_cpu_sys"])
            except (KeyError, ValueError):
                return None
        if name == "defrag_s":
            if not self.config.activedefrag_after_insert:
                return None
            value = self.info.get("total_active_defrag_time")
            return float(value) / 1000 if value is not None else None
        if name == "keys":
            match = re.match(r"keys=(\d+)", self.info.get("db0", ""))
            return float(match.group(1)) if match else None
        if name == "evicted_keys":
            value = self.info.get("evicted_keys")
            return float(value) if value is not None else None
        if name == "used_memory":
            value = self.info.get("used_memory")
            return float(value) if value is not None else None
        # meshalloc's own statistics
        if name in ("mesh_count", "mesh_released", "mesh_released_peak", "mappings", "mesh_passes", "mesh_pauses"):
            return float(stats[name]) if name in stats else None
        if name == "mesh_pause_max_ms":
            return stats["mesh_pause_max_ns"] / NS_PER_MS if "mesh_pause_max_ns" in stats else None
        if name == "mesh_pause_total_s":
            return stats["mesh_pause_total_ns"] / NS_PER_S if "mesh_pause_total_ns" in stats else None
        if name == "mesh_cpu_s":
            return stats["mesh_cpu_ns"] / NS_PER_S if "mesh_cpu_ns" in stats else None
        raise KeyError(name)


# ---------------------------------------------------------------------------------------------
# Configurations

def build_configs(args) -> List[Config]:
    bin_dir = Path(args.redis_bin)
    server_jemalloc = bin_dir / "redis-server-jemalloc"
    server_libc = bin_dir / "redis-server-libc"
    wanted = set(args.configs.split(",")) if args.configs else set(CONFIG_ORDER)
    unknown = wanted - set(CONFIG_ORDER)
    if unknown:
        raise SystemExit(f"lru_bench: unknown configuration(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(CONFIG_ORDER)}")
    as_linked = lambda name, what: Allocator(name=name, library=None, description=what)  # noqa: E731
    configs: List[Config] = []
    for name in CONFIG_ORDER:
        if name not in wanted:
            continue
        try:
            if name == "jemalloc":
                configs.append(Config(name, server_jemalloc, as_linked(name, "Redis's bundled jemalloc")))
            elif name == "jemalloc+activedefrag":
                configs.append(Config(name, server_jemalloc, as_linked(name, "bundled jemalloc, activedefrag"),
                                      extra_args=list(ACTIVEDEFRAG_OPTIONS), activedefrag_after_insert=True))
            elif name == "glibc":
                configs.append(Config(name, server_libc, as_linked(name, "glibc malloc (MALLOC=libc)")))
            elif name.startswith("meshalloc"):
                allocator = allocator_registry.resolve(name)
                if args.meshalloc_lib:
                    allocator = Allocator(name=allocator.name, library=Path(args.meshalloc_lib).resolve(),
                                          description=allocator.description, set_env=allocator.set_env,
                                          unset_env=allocator.unset_env)
                configs.append(Config(name, server_libc, allocator, meshalloc=True))
            else:  # mimalloc, tcmalloc: Debian's libraries preloaded into the libc build
                configs.append(Config(name, server_libc, allocator_registry.resolve(name)))
        except MeshallocError as error:
            print(f"lru_bench: skipping {name}: {error}", file=sys.stderr)
    for config in configs:
        if not os.access(config.server, os.X_OK):
            raise SystemExit(f"lru_bench: {config.server} is missing; run scripts/redis/build.sh")
    if not configs:
        raise SystemExit("lru_bench: no configuration to run")
    return configs


# ---------------------------------------------------------------------------------------------
# One run

def load_average() -> Optional[float]:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
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


class Conductor(threading.Thread):
    """The part of a run that happens while the server is sampled: load, hold, shut down."""

    def __init__(self, run: Run, port: int, args, started: float):
        super().__init__(daemon=True)
        self.run_ = run
        self.port = port
        self.args = args
        self.started = started  # time.monotonic() just before the server was started
        self.server_pid: Optional[int] = None

    def cli(self, *words: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
        return subprocess.run([self.args.redis_cli, "-h", "127.0.0.1", "-p", str(self.port), *words],
                              capture_output=True, text=True, timeout=timeout, check=False)

    def since_start(self) -> float:
        return time.monotonic() - self.started

    def run(self) -> None:  # noqa: C901 - one straight sequence of steps
        run = self.run_
        try:
            deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
            while not port_open(self.port):
                if self.args.stop_event.is_set():
                    run.problems.append("the server exited before it listened (see server.log, stderr.txt)")
                    return
                if time.monotonic() > deadline:
                    run.problems.append(f"the server did not listen on port {self.port} within "
                                        f"{SERVER_READY_TIMEOUT_S:g} s")
                    return
                time.sleep(0.01)
            info = parse_info(self.cli("info", "server").stdout)
            self.server_pid = int(info["process_id"]) if "process_id" in info else None

            client_cmd = [self.args.client, "--port", str(self.port), "--batch", str(PIPELINE),
                          "--phase1", str(PHASES[0][0]), "--size1", str(PHASES[0][1]),
                          "--phase2", str(PHASES[1][0]), "--size2", str(PHASES[1][1]),
                          "--seed", str(self.args.seed + run.repetition)]
            run.client_start_s = self.since_start()
            try:
                client = subprocess.run(client_cmd, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
                                        check=False)
            except subprocess.TimeoutExpired:
                run.problems.append(f"the client did not finish within {CLIENT_TIMEOUT_S:g} s")
                return
            run.client_end_s = self.since_start()
            (run.directory / "client.txt").write_text(client.stdout + client.stderr)
            if client.returncode != 0:
                run.problems.append(f"client exited with {client.returncode}: {client.stderr.strip()[-300:]}")
                return
            fields = client.stdout.split()
            run.client = dict(word.split("=", 1) for word in fields if "=" in word)
            if run.client.get("errors") != "0":
                run.problems.append(f"{run.client.get('errors')} error replies from the server")

            if run.config.activedefrag_after_insert:
                answer = self.cli("config", "set", "activedefrag", "yes")
                if answer.stdout.strip() != "OK":
                    run.problems.append(f"CONFIG SET activedefrag yes: {answer.stdout.strip()} {answer.stderr.strip()}")

            hold_until = max(self.args.hold, run.client_end_s + AFTER_INSERTION_MIN_S)
            while self.since_start() < hold_until and not self.args.stop_event.is_set():
                time.sleep(min(0.05, hold_until - self.since_start()))

            run.info = parse_info(self.cli("info", "everything").stdout)
            (run.directory / "info.txt").write_text("\n".join(f"{k}:{v}" for k, v in run.info.items()) + "\n")
        except Exception as error:  # pragma: no cover - reported, never silent
            run.problems.append(f"conductor: {type(error).__name__}: {error}")
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """`shutdown nosave` (a clean exit: meshalloc writes its statistics); if the server does
        not go away, SIGTERM and then SIGKILL to its pid -- only ours."""
        try:
            self.cli("shutdown", "nosave", timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.run_.problems.append("redis-cli shutdown nosave timed out")
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.server_pid and port_open(self.port):
            self.run_.problems.append("the server ignored shutdown; sent SIGTERM/SIGKILL")
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(self.server_pid, sig)
                except OSError:
                    break
                time.sleep(2)


def one_run(run: Run, args) -> None:
    config = run.config
    run.directory.mkdir(parents=True, exist_ok=True)
    run.load_before = load_average()
    port = free_port()
    stats_file = run.directory / "meshalloc-stats.json"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MESHALLOC_")}
    if config.meshalloc:
        env.update({key: value for key, value in os.environ.items()
                    if key.startswith("MESHALLOC_") and key not in allocator_registry.MESHALLOC_CONFIG_OVERRIDES
                    and key not in CLI_ONLY_VARIABLES})
        # Statistics at exit, as JSON on the server's stderr (stderr.txt), not in a
        # MESHALLOC_STATS_FILE: the library keeps a pointer to that variable's value in the
        # environment block, and Redis reuses that block for its process title (setproctitle),
        # so by exit the path has been overwritten and no file is written.
        env.pop("MESHALLOC_STATS_FILE", None)
        env["MESHALLOC_STATS"] = "json"
    command = [str(config.server), "--port", str(port), *SERVER_OPTIONS, "--dir", str(run.directory),
               "--logfile", str(run.directory / "server.log"), *config.extra_args]
    (run.directory / "command.txt").write_text(
        " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(config.allocator.environment(env).items())
                 if k == "LD_PRELOAD" or k.startswith("MESHALLOC_")) + " " + shlex.join(command) + "\n")

    started = time.monotonic()
    conductor = Conductor(run, port, args, started)
    conductor.start()
    with open(run.directory / "stderr.txt", "wb") as stderr, open(run.directory / "stdout.txt", "wb") as stdout:
        try:
            run.result = measure(command, config.allocator, interval=args.interval, env=env, cwd=run.directory,
                                 stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
        except MeshallocError as error:
            run.problems.append(f"cannot run the server: {error}")
        args.stop_event.set()  # the server is gone: the conductor must not wait or hold any longer
    conductor.join(timeout=CLIENT_TIMEOUT_S + 120)
    args.stop_event.clear()
    if run.result is not None:
        write_run(run.result, run.directory)
        if not run.result.succeeded:
            run.problems.append(f"redis-server {run.result.describe_exit()}")
    if config.meshalloc:
        run.mesh_stats = read_mesh_stats(run.directory / "stderr.txt", stats_file)
        if not run.mesh_stats:
            run.problems.append("no meshalloc statistics on the server's stderr (stderr.txt)")


def read_mesh_stats(stderr_file: Path, copy_to: Path) -> Dict[str, Any]:
    """meshalloc's JSON statistics from the last line of stderr that holds them; a copy of
    that line goes to copy_to. Empty when there is none (the server did not exit cleanly)."""
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


# ---------------------------------------------------------------------------------------------
# Table, files, figure, checks

# (key, header, scale, decimals) of the Markdown table's numeric columns.
TABLE_COLUMNS = [
    ("mean_pss", "mean PSS MiB", MIB, 1),
    ("final_pss", "final PSS MiB", MIB, 1),
    ("mean_pss_after_insertion", "mean PSS after insertion MiB", MIB, 1),
    ("peak_pss", "peak PSS MiB", MIB, 1),
    ("insertion_s", "insertion s", 1, 3),
    ("mean_ratio", "mean PSS ×", None, 2),
    ("after_ratio", "after-insertion ×", None, 2),
    ("insertion_ratio", "insertion ×", None, 2),
    ("mesh_count", "mesh count", 1, 0),
    ("mesh_pause_max_ms", "longest pause ms", 1, 2),
    ("mesh_cpu_s", "meshing CPU s", 1, 3),
    ("defrag_s", "active defrag s", 1, 2),
    ("server_cpu_s", "server CPU s", 1, 2),
    ("peak_maps", "peak mappings", 1, 0),
    ("peak_pte", "peak page tables KiB", KIB, 0),
]
# Every per-run quantity written to runs.tsv (and summarised in table.tsv).
RUN_METRICS = ["mean_pss", "final_pss", "peak_pss", "mean_pss_after_insertion", "peak_cgroup", "peak_pte",
               "peak_maps", "phase1_s", "phase2_s", "insertion_s", "hz", "load", "server_cpu_s", "defrag_s", "keys",
               "evicted_keys", "used_memory", "mesh_count", "mesh_released", "mesh_released_peak", "mappings",
               "mesh_passes", "mesh_pauses", "mesh_pause_max_ms", "mesh_pause_total_s", "mesh_cpu_s"]


RATIOS = ["mean_ratio", "after_ratio", "insertion_ratio"]


def stats_by_config(runs: Sequence[Run], configs: Sequence[Config]) -> Dict[str, Dict[str, Optional[Stat]]]:
    table: Dict[str, Dict[str, Optional[Stat]]] = {}
    for config in configs:
        good = [run for run in runs if run.config is config and run.ok]
        table[config.name] = {metric: Stat.of([run.metric(metric) for run in good]) for metric in RUN_METRICS}
    base = table.get(BASELINE, {})
    for name, row in table.items():
        for metric, ratio_name in (("mean_pss", "mean_ratio"), ("mean_pss_after_insertion", "after_ratio"),
                                   ("insertion_s", "insertion_ratio")):
            mine, theirs = row.get(metric), base.get(metric)
            row[ratio_name] = (Stat(mine.median / theirs.median, mine.low / theirs.median, mine.high / theirs.median)
                               if mine and theirs and theirs.median else None)
    return table


def stat_text(stat: Optional[Stat], scale: Optional[float], decimals: int, show_range: bool) -> str:
    if stat is None:
        return "—"
    if scale is None:  # ratios: the ratio of medians, no range
        return f"{stat.median:.{decimals}f}"
    text = f"{stat.median / scale:.{decimals}f}"
    if show_range and round(stat.low / scale, decimals) != round(stat.high / scale, decimals):
        text += f" ({stat.low / scale:.{decimals}f}–{stat.high / scale:.{decimals}f})"
    return text


def markdown_table(runs: Sequence[Run], configs: Sequence[Config], table, repeat: int, interval: float,
                   hold: float) -> str:
    show_range = repeat > 1
    headers = ["config", "ok"] + [header for _, header, _, _ in TABLE_COLUMNS]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    for config in configs:
        row = table[config.name]
        mine = [run for run in runs if run.config is config]
        name = config.name + (" (baseline)" if config.name == BASELINE else "")
        cells = [name, f"{sum(run.ok for run in mine)}/{len(mine)}"]
        cells += [stat_text(row.get(key), scale, decimals, show_range and scale is not None)
                  for key, _, scale, decimals in TABLE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    rates = [run.metric("hz") for run in runs if run.metric("hz")]
    notes = [
        "",
        f"Redis {redis_version(configs)}, `maxmemory {MAXMEMORY}`, `allkeys-lru`; {PHASES[0][0]:,} keys with "
        f"{PHASES[0][1]}-byte values, then {PHASES[1][0]:,} keys with {PHASES[1][1]}-byte values, pipelined "
        f"{PIPELINE} at a time; the server is kept {hold:g} s in all (at least {AFTER_INSERTION_MIN_S:g} s after "
        f"the insertion) and then shut down.",
        f"Medians over {repeat} interleaved repetition(s){' with (min–max)' if show_range else ''}; ratios are "
        f"medians over jemalloc's median (jemalloc = Redis's default build, MALLOC=jemalloc).",
        f"PSS of the server from /proc/PID/smaps_rollup, sampled every {interval * 1000:g} ms (achieved "
        f"{min(rates):.0f}–{max(rates):.0f} Hz); mean = time-weighted over the server's whole life; peak "
        "mappings and page tables are maxima over the run." if rates else "",
        "insertion: the client's phase 1 + phase 2 wall time. mesh count, longest pause, meshing CPU: meshalloc's "
        "statistics at exit (mesh_count, mesh_pause_max_ns, mesh_cpu_ns). active defrag s: Redis's "
        "total_active_defrag_time (the time defrag cycles were running; `activedefrag yes` is set after the "
        "insertion). server CPU: Redis's used_cpu_user + used_cpu_sys at the end (all threads, meshing included).",
    ]
    loads = [run.load_before for run in runs if run.load_before is not None]
    cpus = os.cpu_count() or 1
    if loads:
        notes.append(f"1-minute load average when the runs started: {min(loads):.1f}–{max(loads):.1f} on {cpus} CPUs"
                     + (" — the machine was busy with other work, so times (and, through them, means) are noisy."
                        if max(loads) > cpus else "."))
    notes.append("mean PSS after insertion: time-weighted mean from the end of the insertion to the shutdown "
                 "(the cache is full; what is left is fragmentation and what the allocator gives back). The "
                 "whole-run mean also rewards a slow insertion (the cache fills later, so less memory is held "
                 "during the window): compare it only between configurations with similar insertion times.")
    failed = [run for run in runs if not run.ok]
    if failed:
        notes.append("Failed runs (left out of the medians): " + "; ".join(
            f"{run.config.name} #{run.repetition}: {', '.join(run.problems) or 'no client result'}" for run in failed))
    return "\n".join(lines + notes) + "\n"


def redis_version(configs: Sequence[Config]) -> str:
    try:
        text = subprocess.run([str(configs[0].server), "--version"], capture_output=True, text=True).stdout
        match = re.search(r"v=(\S+)", text)
        return match.group(1) if match else "?"
    except OSError:
        return "?"


def write_tsv(path: Path, header: Sequence[str], rows) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def number(value: Optional[float]) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def write_files(out: Path, runs: Sequence[Run], configs: Sequence[Config], table, md: str, args) -> List[Path]:
    runs_tsv, table_tsv, md_file, summary = out / "runs.tsv", out / "table.tsv", out / "table.md", out / "summary.json"
    write_tsv(runs_tsv, ["order", "config", "repetition", "ok", "exit", "client_start_s", "client_end_s",
                         *RUN_METRICS, "samples_tsv", "problems"],
              ([str(run.order), run.config.name, str(run.repetition), str(int(run.ok)),
                run.result.describe_exit() if run.result else "not started", number(run.client_start_s),
                number(run.client_end_s), *(number(run.metric(metric)) for metric in RUN_METRICS),
                str((run.directory / "samples.tsv").relative_to(out)), "; ".join(run.problems)] for run in runs))
    header = ["config"]
    for metric in RUN_METRICS + RATIOS:
        header += [metric, metric + "_min", metric + "_max"]
    rows = []
    for config in configs:
        cells = [config.name]
        for metric in RUN_METRICS + RATIOS:
            stat = table[config.name].get(metric)
            cells += [number(stat.median), number(stat.low), number(stat.high)] if stat else ["", "", ""]
        rows.append(cells)
    write_tsv(table_tsv, header, rows)
    md_file.write_text(md)
    summary.write_text(json.dumps({
        "experiment": "redis-lru",
        "started": args.stamp,
        "repeat": args.repeat, "quick": args.quick, "hold_s": args.hold, "interval_s": args.interval,
        "phases": [{"keys": keys, "value_bytes": size} for keys, size in PHASES], "pipeline": PIPELINE,
        "server_options": SERVER_OPTIONS, "activedefrag_options": ACTIVEDEFRAG_OPTIONS,
        "machine": {"kernel": platform.release(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "configs": [{"name": c.name, "server": str(c.server), "preload": str(c.allocator.library or ""),
                     "environment": dict(c.allocator.set_env), "extra_args": c.extra_args} for c in configs],
        "runs": [{"order": run.order, "config": run.config.name, "repetition": run.repetition, "ok": run.ok,
                  "problems": run.problems, "client": run.client, "client_start_s": run.client_start_s,
                  "client_end_s": run.client_end_s,
                  "metrics": {metric: run.metric(metric) for metric in RUN_METRICS},
                  "directory": str(run.directory.relative_to(out))} for run in runs],
        "checks": [dict(zip(("what", "value", "target", "holds"), check)) for check in checks(table, runs)],
    }, indent=2) + "\n")
    return [runs_tsv, table_tsv, md_file, summary]


def plot(out: Path, runs: Sequence[Run], configs: Sequence[Config], hold: float) -> List[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    figure, (memory, maps) = pyplot.subplots(2, 1, sharex=True, figsize=(10, 7), gridspec_kw={"height_ratios": (3, 1)})
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, config in enumerate(configs):
        colour = colours[index % len(colours)]
        mine = [run for run in runs if run.config is config and run.result and run.result.samples]
        if not mine:
            continue
        good = sorted((run for run in mine if run.ok), key=lambda run: run.metric("mean_pss") or 0) or mine
        main = good[(len(good) - 1) // 2]  # the median run (by mean PSS), drawn bold
        for run in mine:
            samples = run.result.samples
            times = [s.time for s in samples]
            bold = run is main
            memory.plot(times, [s.pss / MIB for s in samples], color=colour, linewidth=1.6 if bold else 0.7,
                        alpha=1.0 if bold else 0.3,
                        label=f"{config.name} (mean {main.metric('mean_pss') / MIB:.0f} MiB)" if bold else None)
            if bold:
                with_maps = [(s.time, s.maps) for s in samples if s.maps is not None]
                maps.plot([t for t, _ in with_maps], [m for _, m in with_maps], color=colour, linewidth=1.2)
                if run.client_end_s is not None:  # the end of the insertion
                    end_pss = min(samples, key=lambda s: abs(s.time - run.client_end_s)).pss / MIB
                    memory.plot([run.client_end_s], [end_pss], marker="o", color=colour, markersize=4)
    # Redis reads "100mb" as 100 MiB; it counts what it asked malloc for (with usable sizes).
    memory.axhline(100, color="grey", linestyle=":", linewidth=0.8)
    memory.text(hold + 0.9, 100, "maxmemory 100mb (Redis's own count) ", color="grey", fontsize=8, va="bottom",
                ha="right")
    memory.set_ylabel("PSS MiB")
    memory.set_ylim(bottom=0)
    memory.legend(loc="lower right", fontsize=8)
    memory.set_title("Redis as an LRU cache (paper §6.2.2): server PSS over time\n"
                     "median run bold, dot = end of insertion")
    maps.set_ylabel("mappings")
    maps.set_yscale("log")
    maps.set_xlabel("seconds since the server started")
    maps.set_xlim(0, hold + 1)
    figure.tight_layout()
    written = []
    for extension in ("png", "svg"):
        path = out / f"memory.{extension}"
        figure.savefig(path, dpi=120, metadata={"Date": None} if extension == "svg" else None)
        written.append(path)
    pyplot.close(figure)
    return written


def checks(table, runs: Sequence[Run]) -> List[tuple]:
    """(what, value, target, holds) for meshalloc 2y; holds is None when it cannot be told."""
    row = table.get(MESHALLOC_TARGET)
    if row is None:
        return []
    results = []
    mean_ratio = row.get("mean_ratio")
    results.append((f"{MESHALLOC_TARGET} mean PSS vs jemalloc", f"{mean_ratio.median:.2f}x" if mean_ratio else "—",
                    f"<= {TARGET_MEAN_PSS_RATIO:.2f}x",
                    mean_ratio.median <= TARGET_MEAN_PSS_RATIO if mean_ratio else None))
    insertion = row.get("insertion_ratio")
    results.append((f"{MESHALLOC_TARGET} insertion time vs jemalloc",
                    f"{insertion.median:.2f}x" if insertion else "—", f"<= {TARGET_INSERTION_RATIO:.2f}x",
                    insertion.median <= TARGET_INSERTION_RATIO if insertion else None))
    after = row.get("after_ratio")
    results.append((f"{MESHALLOC_TARGET} mean PSS after insertion vs jemalloc (no target; not confounded by "
                    "insertion speed)", f"{after.median:.2f}x" if after else "—", "for information", None))
    pauses = [run.metric("mesh_pause_max_ms") for run in runs
              if run.config.name == MESHALLOC_TARGET and run.ok and run.metric("mesh_pause_max_ms") is not None]
    worst = max(pauses) if pauses else None
    results.append((f"{MESHALLOC_TARGET} longest mesh pause (worst run)",
                    f"{worst:.2f} ms" if worst is not None else "—", f"<= {TARGET_PAUSE_MS:g} ms",
                    worst <= TARGET_PAUSE_MS if worst is not None else None))
    return results


# ---------------------------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="lru_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hold", type=float, help="seconds the server lives (default 15; quick 10)")
    parser.add_argument("--interval", type=float, default=0.010, help="sampling interval in seconds")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--redis-bin", required=True, help="directory with redis-server-libc/-jemalloc")
    parser.add_argument("--redis-cli", required=True)
    parser.add_argument("--client", required=True, help="the lru_client binary")
    parser.add_argument("--configs", help="comma-separated subset of " + ",".join(CONFIG_ORDER))
    parser.add_argument("--meshalloc-lib", help="libmeshalloc.so to preload (default: the project's build)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.hold is None:
        args.hold = 10.0 if args.quick else 15.0
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if not 0 < args.interval <= 1 / MIN_SAMPLE_HZ:
        parser.error(f"--interval must be at most {1 / MIN_SAMPLE_HZ:g} s (>= {MIN_SAMPLE_HZ:g} Hz)")
    args.stop_event = threading.Event()
    args.stamp = datetime.now().isoformat(timespec="seconds")

    configs = build_configs(args)
    out: Path = args.out.resolve()  # the server runs in its run directory: no relative paths
    out.mkdir(parents=True, exist_ok=True)
    schedule = [(rep, config) for rep in range(1, args.repeat + 1) for config in configs]
    print(f"redis-lru: {len(configs)} configurations × {args.repeat} repetition(s), {args.hold:g} s each; "
          f"results in {out}", file=sys.stderr)
    runs: List[Run] = []
    for order, (rep, config) in enumerate(schedule, 1):
        run = Run(config, rep, order, out / "runs" / f"{config.slug}-r{rep}")
        one_run(run, args)
        runs.append(run)
        pss = run.metric("mean_pss")
        extra = ""
        if config.meshalloc and run.mesh_stats:
            extra = (f", {run.metric('mesh_count'):.0f} meshes, longest pause {run.metric('mesh_pause_max_ms'):.2f} ms,"
                     f" meshing CPU {run.metric('mesh_cpu_s'):.3f} s")
        status = "ok" if run.ok else "FAILED: " + "; ".join(run.problems)
        hz = run.metric("hz")
        print(f"[{order}/{len(schedule)}] {config.name} #{rep}: {status}; insertion "
              f"{run.insertion_s if run.insertion_s is not None else float('nan'):.3f} s, mean PSS "
              f"{(pss or 0) / MIB:.1f} MiB, peak {(run.metric('peak_pss') or 0) / MIB:.1f} MiB"
              f"{extra}{f', {hz:.0f} Hz' if hz else ''}", file=sys.stderr, flush=True)
        if hz and hz < MIN_SAMPLE_HZ:
            print(f"  warning: only {hz:.1f} samples per second (want >= {MIN_SAMPLE_HZ:g})", file=sys.stderr)

    table = stats_by_config(runs, configs)
    md = markdown_table(runs, configs, table, args.repeat, args.interval, args.hold)
    files = write_files(out, runs, configs, table, md, args)
    try:
        files += plot(out, runs, configs, args.hold)
    except Exception as error:  # a figure is not worth losing the table over
        print(f"redis-lru: no figure: {type(error).__name__}: {error}", file=sys.stderr)
    print(md)
    print("Targets (meshalloc 2y):")
    for what, value, target, holds in checks(table, runs):
        if target == "for information":
            print(f"  {what}: {value}")
            continue
        verdict = "cannot tell" if holds is None else ("holds" if holds else "does not hold")
        print(f"  {what}: {value} (target {target}): {verdict}")
    print("files: " + " ".join(str(path) for path in files) + f" and {out}/runs/*/ (samples.tsv, server.log, ...)")
    return 0 if all(run.ok for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
