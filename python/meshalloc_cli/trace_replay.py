"""`meshalloc trace replay TRACE --allocators LIST` (docs/trace.md, Replay).

The trace is prepared once (tools/trace/meshalloc-replay-prepare: addresses resolved into
slots, in a process of its own), then the native replayer (tools/trace/meshalloc-replay) is the
command `meshalloc compare` measures under each allocator: interleaved, repeated, PSS sampled
over time, the same table, files and figure. Each run's replayer prints its per-call time
histograms on its last output line, which compare keeps in the run's log; this module reads
them back and summarises them (percentiles per call kind, interleaved medians).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import paths, top
from .allocators import Allocator
from .bench.report import write_tsv
from .breakdown import COLUMNS as BREAKDOWN_COLUMNS, is_meshalloc, parse_report
from .compare import Comparison, RunRecord, compare
from .errors import EXIT_FAILURE, MeshallocError
from .measure import DEFAULT_INTERVAL_S
from .trace import _build_product

TIMINGS = ("fast", "recorded")
TOUCHES = ("none", "page", "block")
# Written by meshalloc-replay before its JSON statistics line (kStatsPrefix in replay.cc).
STATS_PREFIX = "meshalloc-replay-stats: "
PREPARED_DIRECTORY = "prepared"
PREPARED_FILES = {"ops": "trace.ops", "blocks": "blocks.bin", "timeline": "timeline.tsv",
                  "summary": "prepare.json"}
# All call kinds together, as a row of the time tables.
ALL_KINDS = "all"
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
OP_TIME_FILES = {"times": "op-times.tsv", "histogram": "op-histogram.tsv"}
# --heap-map: meshalloc publishes its statistics this often during the replay (live_stats_ms),
# and they are read as often, into this file.
HEAP_MAP_MS = 100
HEAP_MAP_FILE = "heap-map.tsv"
REPLAYER_NAME = "meshalloc-replay"


def replayer() -> Path:
    return _build_product(paths.TRACE_REPLAYER)


def _one_line_error(completed: subprocess.CompletedProcess, tool: Path) -> MeshallocError:
    lines = [line for line in (completed.stderr or "").splitlines() if line.strip()]
    message = lines[0] if lines else f"{tool.name} failed with status {completed.returncode}"
    prefix = tool.name + ": "
    return MeshallocError(message[len(prefix):] if message.startswith(prefix) else message, EXIT_FAILURE)


@dataclass
class Prepared:
    """A trace made ready for replay and analysis (replay_ops.h)."""

    trace: Path
    directory: Path
    summary: Dict[str, float]

    def file(self, name: str) -> Path:
        return self.directory / PREPARED_FILES[name]


def prepare(trace: Path, directory: Path) -> Prepared:
    if not trace.is_file():
        raise MeshallocError(f"no such trace file: {trace}", EXIT_FAILURE)
    directory.mkdir(parents=True, exist_ok=True)
    tool = _build_product(paths.TRACE_REPLAY_PREPARE)
    files = {name: directory / file for name, file in PREPARED_FILES.items()}
    try:
        completed = subprocess.run([str(tool), str(trace), "--ops", str(files["ops"]), "--blocks",
                                    str(files["blocks"]), "--timeline", str(files["timeline"])],
                                   capture_output=True, text=True)
    except OSError as error:
        raise MeshallocError(f"cannot run {tool}: {error.strerror}", EXIT_FAILURE) from None
    if completed.returncode != 0:
        raise _one_line_error(completed, tool)
    summary = json.loads(completed.stdout.strip().splitlines()[-1])
    files["summary"].write_text(json.dumps(summary, indent=2) + "\n")
    return Prepared(trace, directory, summary)


# --warp: points (recorded s, replay s) through which the recorded clock is mapped onto the
# replay's (replay.cc, Warp); at most this many.
MAX_WARP_POINTS = 32
Warp = Sequence[Tuple[float, float]]


def parse_warp(text: str) -> List[Tuple[float, float]]:
    """"R1:P1,R2:P2,...", each point later than the one before (and than 0) on both clocks."""
    points: List[Tuple[float, float]] = []
    for part in text.split(","):
        recorded, colon, replayed = part.partition(":")
        try:
            point = (float(recorded), float(replayed))
        except ValueError:
            point = None
        last = points[-1] if points else (0.0, 0.0)
        if not colon or point is None or not (point[0] > last[0] and point[1] > last[1]):
            raise MeshallocError(f"{part!r} is not RECORDED_S:REPLAY_S after {last[0]:g}:{last[1]:g}")
        points.append(point)
    if len(points) > MAX_WARP_POINTS:
        raise MeshallocError(f"at most {MAX_WARP_POINTS} points")
    return points


def replay_command(prepared: Prepared, timing: str, touch: str, speed: float, warp: Warp = ()) -> List[str]:
    return [str(replayer()), str(prepared.file("ops")), "--timing", timing, "--touch", touch,
            "--speed", f"{speed:g}", "--stats", "-"] + \
        (["--warp", ",".join(f"{recorded:.6f}:{replayed:.6f}" for recorded, replayed in warp)] if warp else [])


@dataclass
class Histogram:
    """Call times of one kind: log buckets (low_ns, high_ns, calls), as the replayer counts."""

    calls: int
    sum_ns: float
    max_ns: float
    buckets: List[Tuple[float, float, int]]

    @classmethod
    def from_json(cls, data: dict) -> "Histogram":
        return cls(int(data["calls"]), float(data["sum_ns"]), float(data["max_ns"]),
                   [(float(low), float(high), int(count)) for low, high, count in data["buckets"]])

    @property
    def mean_ns(self) -> float:
        return self.sum_ns / self.calls if self.calls else 0.0

    def percentile(self, percent: float) -> float:
        """Interpolated inside the bucket the rank falls in (the buckets are 19 % wide)."""
        if not self.calls:
            return 0.0
        rank = percent / 100.0 * self.calls
        seen = 0
        for low, high, count in self.buckets:
            if seen + count >= rank:
                return min(low + (high - low) * max(rank - seen, 0) / count, self.max_ns)
            seen += count
        return self.max_ns

    def merged(self, other: "Histogram") -> "Histogram":
        counts: Dict[Tuple[float, float], int] = {}
        for low, high, count in self.buckets + other.buckets:
            counts[(low, high)] = counts.get((low, high), 0) + count
        return Histogram(self.calls + other.calls, self.sum_ns + other.sum_ns, max(self.max_ns, other.max_ns),
                         sorted((low, high, count) for (low, high), count in counts.items()))


EMPTY = Histogram(0, 0.0, 0.0, [])


@dataclass
class RunTimes:
    """What one replay run reported about itself."""

    wall_ns: int
    ops: int
    waits: int
    failed_allocations: int
    own_bytes: int  # the replayer's own tables (slot table, buffers): its share of the PSS
    kinds: Dict[str, Histogram]

    @property
    def all(self) -> Histogram:
        total = EMPTY
        for histogram in self.kinds.values():
            total = total.merged(histogram)
        return total


def read_run_times(log: Optional[Path]) -> Optional[RunTimes]:
    if log is None or not log.is_file():
        return None
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith(STATS_PREFIX):
            data = json.loads(line[len(STATS_PREFIX):])
            return RunTimes(int(data["wall_ns"]), int(data["ops"]), int(data["waits"]),
                            int(data["failed_allocations"]), int(data.get("own_bytes", 0)),
                            {kind: Histogram.from_json(value) for kind, value in data["kinds"].items()})
    return None


def failure_line(run: RunRecord) -> Optional[str]:
    """The replayer's own explanation of a failed run (a lost write, an unreadable file)."""
    if run.result.succeeded or run.log is None or not run.log.is_file():
        return None
    for line in run.log.read_text(errors="replace").splitlines():
        if line.startswith("meshalloc-replay: "):
            return line
    return None


@dataclass
class Replay:
    prepared: Prepared
    comparison: Comparison
    timing: str
    touch: str
    times: Dict[Tuple[str, int], RunTimes] = field(default_factory=dict)  # (allocator, repetition)

    def kinds(self) -> List[str]:
        seen: List[str] = []
        for times in self.times.values():
            seen += [kind for kind in times.kinds if kind not in seen]
        return seen

    def histogram(self, allocator: str, kind: str) -> Histogram:
        """Every successful run of the allocator together."""
        total = EMPTY
        for (name, _), times in self.times.items():
            if name == allocator:
                total = total.merged(times.all if kind == ALL_KINDS else times.kinds.get(kind, EMPTY))
        return total


class HeapMap:
    """meshalloc's own breakdown of its heap (docs/memory.md) over the time of each meshalloc
    run: the replayer's meshalloc publishes its statistics report every HEAP_MAP_MS (the file
    `meshalloc top` reads) and a thread here reads it as often."""

    def __init__(self) -> None:
        self.rows: List[List[str]] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @staticmethod
    def allocator(allocator: Allocator) -> Allocator:
        if not is_meshalloc(allocator):
            return allocator
        return dataclasses.replace(allocator, set_env={**allocator.set_env, top.OPTION_VARIABLE: str(HEAP_MAP_MS)})

    def start(self, allocator: str, repetition: int, meshalloc: bool) -> None:
        if meshalloc:
            self._stop.clear()
            self._thread = threading.Thread(target=self._poll, args=(allocator, repetition, time.monotonic()),
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _poll(self, allocator: str, repetition: int, started: float) -> None:
        while not self._stop.wait(HEAP_MAP_MS / 1000.0):
            for pid in top.publishing_pids():
                try:
                    if REPLAYER_NAME not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                        continue
                    live = json.loads(top.live_path(pid).read_text())
                except (OSError, ValueError):
                    continue
                report = parse_report(json.dumps(live.get("report")))
                if report is not None:
                    groups = report.groups()
                    self.rows.append([allocator, str(repetition), f"{time.monotonic() - started:.3f}"] +
                                     [str(groups.get(group, 0)) for group, _ in BREAKDOWN_COLUMNS])

    def write(self, directory: Path) -> Optional[Path]:
        if not self.rows:
            return None
        path = directory / HEAP_MAP_FILE
        write_tsv(path, ["allocator", "repetition", "time_s"] + [f"{group}_bytes" for group, _ in BREAKDOWN_COLUMNS],
                   self.rows)
        return path


def replay(trace: Path, allocators: Sequence[Allocator], out: Path, repeat: int, baseline: Optional[str] = None,
           timing: str = "fast", touch: str = "page", speed: float = 1.0, interval: float = DEFAULT_INTERVAL_S,
           use_cgroup: bool = True, on_start: Optional[Callable] = None,
           on_finish: Optional[Callable] = None, heap_map: bool = False, warp: Warp = ()) -> Replay:
    if timing not in TIMINGS:
        raise MeshallocError(f"--timing must be one of {', '.join(TIMINGS)}")
    if touch not in TOUCHES:
        raise MeshallocError(f"--touch must be one of {', '.join(TOUCHES)}")
    if not speed > 0:
        raise MeshallocError("--speed must be positive")
    prepared = prepare(trace, out / PREPARED_DIRECTORY)
    mapper = HeapMap() if heap_map else None
    if mapper:
        allocators = [HeapMap.allocator(allocator) for allocator in allocators]
    meshalloc_names = {allocator.name for allocator in allocators if is_meshalloc(allocator)}

    def started(order: int, total: int, allocator: str, repetition: int) -> None:
        if mapper:
            mapper.start(allocator, repetition, allocator in meshalloc_names)
        if on_start:
            on_start(order, total, allocator, repetition)

    def finished(record: RunRecord, total: int) -> None:
        if mapper:
            mapper.stop()
        if on_finish:
            on_finish(record, total)

    comparison = compare(replay_command(prepared, timing, touch, speed, warp), allocators, repeat=repeat,
                         baseline=baseline, interval=interval, use_cgroup=use_cgroup, log_dir=out / "logs",
                         on_start=started, on_finish=finished)
    if mapper:
        mapper.write(out)
    return replay_result(prepared, comparison, timing, touch)


def replay_result(prepared: Prepared, comparison: Comparison, timing: str, touch: str) -> Replay:
    """A Replay of runs already made, with the call times each successful run printed (its
    RunRecord's log: the replayer's stdout)."""
    result = Replay(prepared, comparison, timing, touch)
    for run in comparison.runs:
        times = read_run_times(run.log) if run.result.succeeded else None
        if times is not None:
            result.times[(run.allocator, run.repetition)] = times
    return result


def time_table(result: Replay) -> Tuple[List[str], List[List[str]]]:
    """Per allocator and call kind: calls per run, mean and percentiles of every call of every
    run; the mean's median and range over the runs show how stable it is."""
    headers = ["allocator", "call", "calls/run", "mean ns (runs' min–max)"] + \
        [f"p{percent:g} ns" for percent in PERCENTILES] + ["max ns"]
    rows = []
    for allocator in [allocator.name for allocator in result.comparison.allocators]:
        for kind in [ALL_KINDS, *result.kinds()]:
            per_run = [times.all if kind == ALL_KINDS else times.kinds.get(kind, EMPTY)
                       for (name, _), times in result.times.items() if name == allocator]
            if not per_run or not any(histogram.calls for histogram in per_run):
                continue
            merged = result.histogram(allocator, kind)
            means = [histogram.mean_ns for histogram in per_run]
            rows.append([allocator, kind, f"{merged.calls // len(per_run):,}",
                         f"{statistics.median(means):.1f} ({min(means):.1f}–{max(means):.1f})"] +
                        [f"{merged.percentile(percent):.0f}" for percent in PERCENTILES] + [f"{merged.max_ns:.0f}"])
    return headers, rows


def write_times(result: Replay, directory: Path) -> Dict[str, Path]:
    written = {name: directory / file for name, file in OP_TIME_FILES.items()}
    rows = []
    for (allocator, repetition), times in sorted(result.times.items()):
        for kind, histogram in [(ALL_KINDS, times.all), *times.kinds.items()]:
            rows.append([allocator, str(repetition), kind, str(histogram.calls), f"{histogram.mean_ns:.1f}"] +
                        [f"{histogram.percentile(percent):.1f}" for percent in PERCENTILES] +
                        [f"{histogram.max_ns:.1f}", str(times.waits), str(times.failed_allocations),
                         str(times.own_bytes)])
    write_tsv(written["times"], ["allocator", "repetition", "call", "calls", "mean_ns"] +
               [f"p{percent:g}_ns" for percent in PERCENTILES] + ["max_ns", "waits", "failed_allocations", "own_bytes"],
              rows)
    histogram_rows = []
    for allocator in [allocator.name for allocator in result.comparison.allocators]:
        for kind in result.kinds():
            for low, high, count in result.histogram(allocator, kind).buckets:
                histogram_rows.append([allocator, kind, f"{low:.1f}", f"{high:.1f}", str(count)])
    write_tsv(written["histogram"], ["allocator", "call", "low_ns", "high_ns", "calls"], histogram_rows)
    return written


def plot_times(result: Replay, stem: Path) -> List[Path]:
    """The share of calls that took at most x ns, per allocator, every call kind together."""
    from .plotting import FIGURE_SIZE_IN, load_pyplot, save_figure

    pyplot = load_pyplot()
    figure, axes = pyplot.subplots(figsize=FIGURE_SIZE_IN)
    for allocator in [allocator.name for allocator in result.comparison.allocators]:
        histogram = result.histogram(allocator, ALL_KINDS)
        if not histogram.calls:
            continue
        xs, ys, seen = [], [], 0
        for _, high, count in histogram.buckets:
            seen += count
            xs.append(high)
            ys.append(100.0 * seen / histogram.calls)
        axes.step(xs, ys, where="post", label=allocator)
    axes.set_xscale("log")
    axes.set_xlabel("time per call (ns, log scale)")
    axes.set_ylabel("calls at most this long (%)")
    axes.set_title(f"replay of {result.prepared.trace.name} ({result.timing} timing): time per call")
    axes.grid(True, alpha=0.3)
    axes.legend()
    written = save_figure(figure, stem)
    pyplot.close(figure)  # a bench run draws dozens
    return written


def write_results(result: Replay, out: Path, figures: bool = True) -> Tuple[List[Path], Optional[Path]]:
    """Everything a replay leaves in its directory: compare's files (table, samples, runs, the
    memory figure) and the call times (TSV, Markdown, figure). Returns the files and the memory
    figure (None when none was drawn)."""
    from .bench.report import markdown_table
    from .output import FIGURE_STEM, write_comparison

    comparison = result.comparison
    files = list(write_comparison(comparison, out).values()) + list(write_times(result, out).values())
    headers, rows = time_table(result)
    files.append(out / "op-times.md")
    files[-1].write_text(markdown_table(headers, rows, left=2))
    figure = None
    if figures and any(run.result.samples for run in comparison.runs):
        from .plotting import plot_comparison

        drawn = plot_comparison(comparison, out / FIGURE_STEM)
        figure = drawn[0]
        files += drawn
        if result.times:
            files += plot_times(result, out / "op-times")
    return files, figure
