"""Run one command under one allocator and sample its memory at a fixed rate.

This is the library form of `meshalloc run`: `measure()` returns the samples and a
summary, so `meshalloc compare` (and later `meshalloc bench`) reuse it unchanged.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

from .allocators import Allocator
from .breakdown import Breakdown, Collector
from .cgroup import CgroupStatus, CgroupUnavailable, MemoryCgroup
from .errors import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SIGNAL_BASE, MeshallocError
from .procfs import ProcessReader, exiting

# 10 ms: the 100 Hz the paper's mstat sampled at, the slowest rate the issue allows.
DEFAULT_INTERVAL_S = 0.010
# The sampler is busy at most this share of the wall time. Reading smaps_rollup makes the
# kernel walk the whole address space under the command's mmap lock; for a meshing
# allocator with tens of thousands of mappings one read takes longer than the interval,
# and reading back to back slowed such a command down by more than 2x on a 2-CPU machine
# (with this cap: about 10 %). Cheap samples (a few ms at 10 ms) are not affected.
SAMPLER_MAX_SHARE = 0.5
MIB = 1 << 20
KIB = 1 << 10

# The metrics every sample holds, in TSV column order after the time.
METRICS = ("pss", "rss", "pte", "maps", "cgroup")
METRIC_LABELS = {
    "pss": "PSS",
    "rss": "RSS (double-counts meshed pages)",
    "pte": "page tables",
    "maps": "mappings",
    "cgroup": "cgroup charge",
}


@dataclass
class Sample:
    """The process tree's memory at one instant; bytes, except maps (a count)."""

    time: float  # seconds since the command was started
    pss: int
    rss: int
    pte: int
    maps: Optional[int]  # None when mappings were not counted in this sample (see procfs)
    cgroup: Optional[int]  # None when the run has no memory cgroup
    processes: int


@dataclass
class MetricSummary:
    mean: float  # time-weighted: each sample stands until the next one
    peak: int
    final: int


@dataclass
class RunResult:
    """Everything one measured run produced."""

    command: List[str]
    allocator: Allocator
    interval: float
    samples: List[Sample]
    wall_time: float
    returncode: int  # as subprocess reports it: negative for "killed by signal -returncode"
    cgroup: CgroupStatus
    cgroup_kernel_peak: Optional[int] = None
    started: str = ""
    interrupted: bool = False  # meshalloc received SIGINT while the command ran
    summaries: Dict[str, MetricSummary] = field(default_factory=dict)
    # meshalloc's own account of the memory at the command's exit (docs/memory.md); None for
    # other allocators, or when the user set MESHALLOC_STATS/MESHALLOC_STATS_FILE themselves.
    breakdown: Optional[Breakdown] = None

    @property
    def signal_number(self) -> Optional[int]:
        return -self.returncode if self.returncode < 0 else None

    @property
    def signal_name(self) -> Optional[str]:
        number = self.signal_number
        if number is None:
            return None
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"

    @property
    def exit_code(self) -> int:
        """What meshalloc exits with: the command's status, or 128 + N for signal N."""
        number = self.signal_number
        return EXIT_SIGNAL_BASE + number if number is not None else self.returncode

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0

    def describe_exit(self) -> str:
        if self.signal_name:
            return f"killed by {self.signal_name}"
        return f"exited with status {self.returncode}"

    @property
    def achieved_rate(self) -> Optional[float]:
        if len(self.samples) < 2:
            return None
        span = self.samples[-1].time - self.samples[0].time
        return (len(self.samples) - 1) / span if span > 0 else None

    def summary(self, metric: str) -> Optional[MetricSummary]:
        return self.summaries.get(metric)


def summarize(samples: Sequence[Sample], metric: str, end_time: float) -> Optional[MetricSummary]:
    """Mean / peak / final of one metric; None when no sample carries it."""
    points = [(sample.time, getattr(sample, metric)) for sample in samples if getattr(sample, metric) is not None]
    if not points:
        return None
    values = [value for _, value in points]
    # Each sample stands until the next; the last until the command ended. A skipped tick
    # (a slow sample) therefore does not bias the mean toward the neighbouring samples.
    weights = [later[0] - earlier[0] for earlier, later in zip(points, points[1:])]
    weights.append(max(end_time - points[-1][0], 0.0))
    total = sum(weights)
    mean = sum(w * v for w, v in zip(weights, values)) / total if total > 0 else sum(values) / len(values)
    return MetricSummary(mean=mean, peak=max(values), final=values[-1])


def check_command(command: Sequence[str], env: Mapping[str, str]) -> None:
    """Fail early, with the shell's exit codes, on a command that cannot run at all."""
    if not command:
        raise MeshallocError("missing command: put it after --, e.g. `meshalloc run -- ls -l`")
    program = command[0]
    if "/" in program:
        path = Path(program)
        if not path.exists():
            raise MeshallocError(f"command not found: {program}", EXIT_NOT_FOUND)
        if path.is_dir() or not os.access(path, os.X_OK):
            raise MeshallocError(f"command is not executable: {program}", EXIT_CANNOT_EXECUTE)
        return
    search_path = env.get("PATH", os.defpath)
    if shutil.which(program, path=search_path):
        return
    for directory in search_path.split(os.pathsep):
        candidate = Path(directory or ".") / program
        if candidate.is_file():
            raise MeshallocError(f"command is not executable: {candidate}", EXIT_CANNOT_EXECUTE)
    raise MeshallocError(f"command not found: {program}", EXIT_NOT_FOUND)


class _ExitWatcher:
    """Sleeps until the next sampling tick or the command's exit, whichever is first.
    A pidfd (Linux 5.3+) wakes us the moment the command exits; without one we fall back
    to sleeping in slices and polling."""

    POLL_SLICE_S = 0.001

    def __init__(self, process: subprocess.Popen):
        self._process = process
        try:
            self._pidfd: Optional[int] = os.pidfd_open(process.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def wait(self, timeout: float) -> bool:
        """True once the command has exited (not yet reaped)."""
        timeout = max(timeout, 0.0)
        if self._pidfd is not None:
            readable, _, _ = select.select([self._pidfd], [], [], timeout)
            return bool(readable)
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(remaining, self.POLL_SLICE_S))

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class _SignalState:
    def __init__(self) -> None:
        self.interrupts = 0
        self.process: Optional[subprocess.Popen] = None


@contextlib.contextmanager
def _relay_signals(kill_tree) -> Iterator[_SignalState]:
    """While the command runs: SIGTERM and SIGHUP sent to meshalloc are passed on to the
    command. SIGINT (Ctrl-C) already reaches the command through the terminal's process
    group, so the first one only records the interruption -- meshalloc keeps sampling
    until the command reacts, and the partial samples are written; a second Ctrl-C kills
    the command. Handlers are Python functions, not SIG_IGN, because exec resets caught
    signals to their defaults while ignored ones would stay ignored in the command."""
    state = _SignalState()
    if threading.current_thread() is not threading.main_thread():
        yield state  # signal handlers can only be installed from the main thread
        return
    def relay(signum, _frame):
        process = state.process
        if process is not None and process.poll() is None:
            process.send_signal(signum)

    def interrupt(_signum, _frame):
        state.interrupts += 1
        if state.interrupts > 1:
            kill_tree()

    previous = {number: signal.signal(number, relay) for number in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, interrupt)
    try:
        yield state
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def measure(
    command: Sequence[str],
    allocator: Allocator,
    interval: float = DEFAULT_INTERVAL_S,
    use_cgroup: bool = True,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[os.PathLike] = None,
    stdin=None,
    stdout=None,
    stderr=None,
) -> RunResult:
    """Run `command` under `allocator`, sampling the whole process tree every `interval`
    seconds until the command exits. stdin/stdout/stderr are passed to subprocess.Popen
    (None: inherit). Raises MeshallocError if the command cannot be started."""
    if interval <= 0:
        raise MeshallocError("the sampling interval must be positive")
    command = list(command)
    child_env = allocator.environment(env)
    check_command(command, child_env)
    collector = Collector(allocator, child_env)
    child_env = collector.environment(child_env)

    cgroup: Optional[MemoryCgroup] = None
    if use_cgroup:
        try:
            cgroup = MemoryCgroup.create()
            status = CgroupStatus(True, cgroup.version, str(cgroup.directory))
        except CgroupUnavailable as why:
            status = CgroupStatus(False, reason=str(why))
    else:
        status = CgroupStatus(False, reason="disabled (--no-cgroup)")

    reader = ProcessReader()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    process: Optional[subprocess.Popen] = None

    def kill_tree() -> None:
        victims = cgroup.pids() if cgroup else (reader.descendants(process.pid) if process else [])
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    try:
        with _relay_signals(kill_tree) as signals:
            start = time.monotonic()
            try:
                process = subprocess.Popen(
                    command, env=child_env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                    preexec_fn=cgroup.joiner() if cgroup else None,
                )
            except OSError as error:
                code = EXIT_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_CANNOT_EXECUTE
                raise MeshallocError(f"cannot execute {command[0]}: {os.strerror(error.errno or 0)}", code) from None
            signals.process = process
            watcher = _ExitWatcher(process)
            if cgroup and process.pid not in cgroup.pids() and process.poll() is None:
                status = CgroupStatus(False, reason=f"could not move the command into {cgroup.directory}")
                cgroup.remove()
                cgroup = None
            samples = _sample_until_exit(process, watcher, reader, cgroup, start, interval)
            end = time.monotonic()
            watcher.close()
            returncode = process.wait()
        kernel_peak = cgroup.kernel_peak() if cgroup else None
        breakdown = collector.collect()
    finally:
        if process is not None and process.poll() is None:
            kill_tree()  # only reached when meshalloc itself failed mid-run
            process.wait()
        if cgroup is not None:
            cgroup.remove()
        collector.close()

    wall = end - start
    result = RunResult(
        command=command, allocator=allocator, interval=interval, samples=samples, wall_time=wall,
        returncode=returncode, cgroup=status, cgroup_kernel_peak=kernel_peak, started=started,
        interrupted=signals.interrupts > 0, breakdown=breakdown,
    )
    for metric in METRICS:
        summary = summarize(samples, metric, wall)
        if summary is not None:
            result.summaries[metric] = summary
    return result


def _sample_until_exit(process, watcher, reader, cgroup, start, interval) -> List[Sample]:
    """Sample on a grid of ticks `interval` apart until the command exits.

    Small delays in waking up do not accumulate (the grid stays put). A sample that
    overruns the next tick (a large process's smaps_rollup, a busy machine), or that
    started more than half an interval late, re-anchors the grid: the next sample comes
    `interval` after this one began, or at once if this one took longer than that. So a
    slow sample costs only its own overrun instead of whole skipped ticks, the rate never
    exceeds the requested one, and no two samples are closer than half an interval. And
    however slow the samples get, the sampler rests between them at least as long as each
    took (SAMPLER_MAX_SHARE), so that measuring does not starve the command. The
    timestamps say when each sample was really taken, and the mean is time-weighted, so an
    uneven spacing does not bias it.

    A sample that straddles the command's exit is dropped: the kernel releases the address
    space before the command becomes a zombie, so such a sample can hold PSS from before
    the tear-down and a cgroup charge from after it."""
    samples: List[Sample] = []
    tick = start
    while True:
        taken = time.monotonic()
        pids = cgroup.pids() if cgroup else reader.descendants(process.pid)
        tree = reader.read_tree(pids)
        charge = cgroup.charge() if cgroup else None
        # Nothing left to measure once the command is exiting or a zombie.
        if tree.processes and not exiting(process.pid):
            samples.append(Sample(taken - start, tree.pss, tree.rss, tree.pte, tree.maps, charge, tree.processes))
        now = time.monotonic()
        late = taken - tick
        tick += interval
        if tick <= now or late > interval / 2:
            tick = max(now, taken + interval)
        # Rest so that sampling takes at most SAMPLER_MAX_SHARE of the time (at one half:
        # rest at least as long as this sample took).
        tick = max(tick, now + (now - taken) * (1 / SAMPLER_MAX_SHARE - 1))
        if watcher.wait(tick - now):
            return samples
