"""`meshalloc trace analyze TRACE [--replay DIR ...]` (docs/trace.md, Analysis).

Everything here works on the tables meshalloc-replay-prepare writes (one 80-byte record per
block, replay_ops.h BlockRecord; a live-bytes timeline), read with numpy, so a trace of millions
of blocks is summarised in seconds. With the results of `meshalloc trace replay` it also sets
each allocator's PSS against the live bytes (fragmentation) and ranks the allocators the way
the STEVE thesis does (§8.3.3).
"""

from __future__ import annotations

import csv
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy

from . import trace_replay
from .bench.report import write_tsv
from .errors import EXIT_FAILURE, MeshallocError

# replay_ops.h, BlockRecord.
BLOCK_DTYPE = numpy.dtype([
    ("id", "<u8"), ("bytes", "<u8"), ("alloc_ns", "<u8"), ("free_ns", "<u8"), ("alloc_op", "<u8"),
    ("free_op", "<u8"), ("alloc_bytes", "<u8"), ("free_bytes", "<u8"), ("alloc_thread", "<u4"),
    ("free_thread", "<u4"), ("kind", "u1"), ("realloc", "u1"), ("reserved", "V6")])
assert BLOCK_DTYPE.itemsize == 80
NEVER = numpy.uint64(2**64 - 1)

# Lifetimes are measured three ways (the thesis's operations, plus bytes allocated meanwhile and
# seconds), each shown whole and in the thesis's two zoomed panels (figures 5.1-5.3), as a share
# of the trace's total operations / bytes / duration.
MEASURES = (("ops", "operations"), ("bytes", "bytes allocated"), ("seconds", "seconds"))
PANELS = (("all", 0.0, 100.0), ("1-100%", 1.0, 100.0), ("0-2%", 0.0, 2.0))
LIFETIME_BINS = 50
SHORT_LIVED_PERCENT = 1.0  # "short-lived": dead within 1 % of the run (the thesis's panel edge)
# The thesis ranks allocators at every operation; a replay has PSS samples, so the space ranking
# is taken at this many points of each run (its progress from start to end), and the speed
# ranking at the percentiles 1..99 of each allocator's call times.
RANK_POINTS = 200
SPEED_PERCENTILES = tuple(range(1, 100))
# The allocators whose size classes `meshalloc-replay --size-classes` can read (mallctl).
CLASS_ALLOCATORS = ("meshalloc", "jemalloc")
FILES = {"live": "live.tsv", "lifetimes": "lifetimes.tsv", "sizes": "sizes.tsv", "classes": "size-classes.tsv",
         "threads": "threads.tsv", "fragmentation": "fragmentation.tsv", "rankings": "rankings.tsv",
         "report": "analysis.md"}


@dataclass
class Blocks:
    """A trace's blocks and clocks, from meshalloc-replay-prepare."""

    prepared: trace_replay.Prepared
    records: numpy.ndarray
    timeline: numpy.ndarray  # columns: ns, op, live_bytes, live_blocks, window_peak_bytes

    @property
    def total_ops(self) -> int:
        return int(self.prepared.summary["ops"])

    @property
    def duration_ns(self) -> int:
        return int(self.prepared.summary["duration_ns"])

    @property
    def total_bytes(self) -> int:
        return int(self.records["bytes"].sum())

    def lifetimes(self, measure: str) -> numpy.ndarray:
        """Per block; a block never freed lives until the end of the trace."""
        records = self.records
        freed = records["free_ns"] != NEVER
        if measure == "ops":
            end = numpy.where(freed, records["free_op"], numpy.uint64(self.total_ops))
            return (end - records["alloc_op"]).astype(numpy.float64)
        if measure == "bytes":
            end = numpy.where(freed, records["free_bytes"], numpy.uint64(self.total_bytes))
            return (end.astype(numpy.int64) - records["alloc_bytes"].astype(numpy.int64)).clip(0).astype(numpy.float64)
        end = numpy.where(freed, records["free_ns"], numpy.uint64(self.duration_ns))
        return (end - records["alloc_ns"]).astype(numpy.float64) / 1e9

    def total(self, measure: str) -> float:
        return {"ops": float(self.total_ops), "bytes": float(self.total_bytes),
                "seconds": self.duration_ns / 1e9}[measure]


def load(trace: Path, directory: Path) -> Blocks:
    prepared = trace_replay.prepare(trace, directory)
    records = numpy.fromfile(prepared.file("blocks"), dtype=BLOCK_DTYPE)
    timeline = numpy.loadtxt(prepared.file("timeline"), delimiter="\t", skiprows=1, ndmin=2, dtype=numpy.float64)
    return Blocks(prepared, records, timeline)


# ----------------------------------------------------------------------------- lifetimes

def lifetime_histograms(blocks: Blocks) -> List[Tuple[str, str, float, float, int]]:
    """(measure, panel, low, high, blocks) rows: LIFETIME_BINS equal bins over each panel."""
    rows = []
    for measure, _ in MEASURES:
        values = blocks.lifetimes(measure)
        total = blocks.total(measure) or 1.0
        for panel, low_percent, high_percent in PANELS:
            low, high = total * low_percent / 100.0, total * high_percent / 100.0
            inside = values[(values >= low) & (values <= high)]
            counts, edges = numpy.histogram(inside, bins=LIFETIME_BINS, range=(low, high))
            rows += [(measure, panel, float(edges[i]), float(edges[i + 1]), int(counts[i]))
                     for i in range(LIFETIME_BINS)]
    return rows


def short_lived_share(blocks: Blocks, measure: str = "ops") -> float:
    if len(blocks.records) == 0:
        return 0.0
    limit = blocks.total(measure) * SHORT_LIVED_PERCENT / 100.0
    return float((blocks.lifetimes(measure) < limit).mean() * 100.0)


def plot_lifetimes(blocks: Blocks, rows, stem: Path) -> List[Path]:
    from .plotting import load_pyplot, save_figure

    pyplot = load_pyplot()
    figure, axes = pyplot.subplots(len(MEASURES), len(PANELS), figsize=(13.0, 9.0), squeeze=False)
    for row, (measure, label) in enumerate(MEASURES):
        for column, (panel, _, _) in enumerate(PANELS):
            bins = [(low, high, count) for m, p, low, high, count in rows if m == measure and p == panel]
            axis = axes[row][column]
            axis.bar([low for low, _, _ in bins], [count for _, _, count in bins],
                     width=[high - low for low, high, _ in bins], align="edge")
            axis.set_title(f"{panel} of the run", fontsize=9)
            axis.set_xlabel(f"lifetime ({label})", fontsize=8)
            axis.set_ylabel("blocks", fontsize=8)
            axis.tick_params(labelsize=7)
    figure.suptitle(f"{blocks.prepared.trace.name}: block lifetimes (thesis figures 5.1-5.3)")
    figure.tight_layout()
    written = save_figure(figure, stem)
    pyplot.close(figure)  # a bench run draws dozens
    return written


# ----------------------------------------------------------------------------- sizes

def size_histogram(blocks: Blocks) -> List[Tuple[int, int, int, int]]:
    """(low, high, blocks, bytes) over power-of-two bins: (0, 8], (8, 16], ..."""
    sizes = blocks.records["bytes"].astype(numpy.float64)
    if len(sizes) == 0:
        return []
    top = max(3, int(numpy.ceil(numpy.log2(max(sizes.max(), 1)))))
    rows = []
    for power in range(3, top + 1):
        low, high = (0 if power == 3 else 2 ** (power - 1)), 2 ** power
        chosen = sizes[(sizes > low) & (sizes <= high)] if power > 3 else sizes[sizes <= high]
        rows.append((low, high, int(len(chosen)), int(chosen.sum())))
    return rows


def size_classes(allocator_name: str) -> Optional[List[int]]:
    """The allocator's small size classes, read through its mallctl under the replayer; None
    when it is not available or has no mallctl."""
    from . import allocators as registry

    try:
        allocator = registry.resolve(allocator_name)
        completed = subprocess.run([str(trace_replay.replayer()), "--size-classes"], env=allocator.environment(),
                                   capture_output=True, text=True, timeout=30)
    except (MeshallocError, OSError, subprocess.TimeoutExpired):
        return None
    if completed.returncode != 0:
        return None
    return [int(line) for line in completed.stdout.split()]


def class_histogram(blocks: Blocks, classes: List[int]) -> List[Tuple[str, int, int, int]]:
    """(class, blocks, requested bytes, bytes the class rounds up to) per class; blocks above the
    largest class are `large`."""
    sizes = blocks.records["bytes"]
    bounds = numpy.array(classes, dtype=numpy.uint64)
    index = numpy.searchsorted(bounds, sizes, side="left")
    rows = []
    for position, size in enumerate(classes):
        chosen = sizes[index == position]
        if len(chosen):
            rows.append((str(size), int(len(chosen)), int(chosen.sum()), int(len(chosen)) * size))
    large = sizes[index >= len(classes)]
    if len(large):
        rows.append(("large", int(len(large)), int(large.sum()), int(large.sum())))
    return rows


# ----------------------------------------------------------------------------- threads

def thread_matrix(blocks: Blocks) -> Tuple[List[int], Dict[Tuple[int, int], int]]:
    """(threads, {(allocating, freeing): blocks}); freeing thread -1: never freed."""
    records = blocks.records
    freeing = numpy.where(records["free_ns"] != NEVER, records["free_thread"].astype(numpy.int64), -1)
    pairs, counts = numpy.unique(numpy.stack([records["alloc_thread"].astype(numpy.int64), freeing]),
                                 axis=1, return_counts=True)
    matrix = {(int(a), int(f)): int(c) for (a, f), c in zip(pairs.T, counts)} if len(records) else {}
    threads = sorted({a for a, _ in matrix} | {f for _, f in matrix if f >= 0})
    return threads, matrix


# ----------------------------------------------------------------------------- replays

@dataclass
class ReplayRuns:
    """What `meshalloc trace replay --out DIR` left: PSS samples and call times per allocator."""

    directory: Path
    trace_name: str
    allocators: List[str]
    samples: Dict[str, numpy.ndarray]  # allocator -> (time_s, pss_bytes) of its median run
    repetition: Dict[str, str]  # allocator -> which run that is
    wall: Dict[str, float]
    times: Dict[str, trace_replay.Histogram]  # allocator -> every call of every run


def _read_tsv(path: Path) -> List[Dict[str, str]]:
    if not path.is_file():
        raise MeshallocError(f"{path.parent} is not a `meshalloc trace replay` results directory "
                             f"({path.name} is missing)", EXIT_FAILURE)
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def load_replay(directory: Path) -> ReplayRuns:
    runs = [row for row in _read_tsv(directory / "runs.tsv") if row["exit_code"] == "0"]
    samples = _read_tsv(directory / "samples.tsv")
    histogram_rows = _read_tsv(directory / trace_replay.OP_TIME_FILES["histogram"])
    allocators: List[str] = []
    for row in runs:
        if row["allocator"] not in allocators:
            allocators.append(row["allocator"])
    chosen: Dict[str, numpy.ndarray] = {}
    chosen_repetition: Dict[str, str] = {}
    wall: Dict[str, float] = {}
    for allocator in allocators:
        mine = sorted((float(row["mean_pss_bytes"] or 0), row["repetition"], float(row["wall_time_s"]))
                      for row in runs if row["allocator"] == allocator)
        _, repetition, wall[allocator] = mine[len(mine) // 2]  # the median run by mean PSS
        chosen_repetition[allocator] = repetition
        chosen[allocator] = numpy.array([(float(row["time_s"]), float(row["pss_bytes"])) for row in samples
                                         if row["allocator"] == allocator and row["repetition"] == repetition])
    times: Dict[str, trace_replay.Histogram] = {}
    for allocator in allocators:
        buckets: Dict[Tuple[float, float], int] = {}
        for row in histogram_rows:
            if row["allocator"] == allocator:
                key = (float(row["low_ns"]), float(row["high_ns"]))
                buckets[key] = buckets.get(key, 0) + int(row["calls"])
        calls = sum(buckets.values())
        ordered = sorted((low, high, count) for (low, high), count in buckets.items())
        mean = sum((low + high) / 2 * count for low, high, count in ordered) / calls if calls else 0.0
        times[allocator] = trace_replay.Histogram(calls, mean * calls, ordered[-1][1] if ordered else 0.0, ordered)
    return ReplayRuns(directory, directory.name, allocators, chosen, chosen_repetition, wall, times)


def live_at(blocks: Blocks, fractions: numpy.ndarray) -> numpy.ndarray:
    """Live bytes at these fractions of the trace's duration (the replay's progress)."""
    ns, live = blocks.timeline[:, 0], blocks.timeline[:, 2]
    return numpy.interp(fractions * max(blocks.duration_ns, 1), ns, live)


def fragmentation(blocks: Blocks, runs: ReplayRuns) -> List[Tuple[str, float, float, float, float]]:
    """Per allocator: (name, mean PSS, mean live bytes, peak PSS, peak live bytes), live bytes
    taken at the same fraction of the run as each PSS sample."""
    rows = []
    for allocator, series in runs.samples.items():
        if len(series) == 0:
            continue
        fractions = series[:, 0] / max(runs.wall[allocator], 1e-9)
        live = live_at(blocks, numpy.clip(fractions, 0.0, 1.0))
        rows.append((allocator, float(series[:, 1].mean()), float(live.mean()), float(series[:, 1].max()),
                     float(blocks.timeline[:, 4].max())))
    return rows


def rank_scores(values: numpy.ndarray) -> Dict[str, numpy.ndarray]:
    """values: allocators × operations, lower is better. The thesis's §8.3.3 scores: rank
    (0 best .. n-1), and the distance to the best (S - S_best) / S_best."""
    order = values.argsort(axis=0, kind="stable")
    ranks = numpy.empty_like(order)
    columns = numpy.arange(values.shape[1])
    ranks[order, columns] = numpy.arange(values.shape[0])[:, None]
    best = values.min(axis=0)
    worst = values.max(axis=0)
    distance = (values - best) / numpy.where(best > 0, best, 1.0)
    return {"rank": ranks, "distance": distance, "best": values == best, "worst": values == worst}


def ranking(names: List[str], values: numpy.ndarray) -> Dict[str, Dict[str, float]]:
    """Penalty (c) = mean rank / n, penalty (w) = mean distance to the best, best/worst = the
    share of operations where the allocator was best / worst (ties count for all of them)."""
    scores = rank_scores(values)
    n = len(names)
    return {name: {"penalty_c": float(scores["rank"][i].mean() / n), "penalty_w": float(scores["distance"][i].mean()),
                   "best": float(scores["best"][i].mean()), "worst": float(scores["worst"][i].mean())}
            for i, name in enumerate(names)}


def space_values(runs: ReplayRuns, names: List[str]) -> numpy.ndarray:
    grid = numpy.linspace(0.0, 1.0, RANK_POINTS)
    rows = []
    for name in names:
        series = runs.samples[name]
        rows.append(numpy.interp(grid, series[:, 0] / max(runs.wall[name], 1e-9), series[:, 1]))
    return numpy.array(rows)


def speed_values(runs: ReplayRuns, names: List[str]) -> numpy.ndarray:
    return numpy.array([[runs.times[name].percentile(p) for p in SPEED_PERCENTILES] for name in names])


def rankings(all_runs: Sequence[ReplayRuns]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """{"space"|"speed": {allocator: scores averaged over the traces}}, each table over the
    allocators every replay has data for (PSS samples; call times), with the mean and median
    call time added to the speed table. A table of fewer than two allocators is left out."""
    def ranked(names, values_of):
        per_trace = [ranking(names, values_of(runs, names)) for runs in all_runs]
        return {name: {key: statistics.mean(scores[name][key] for scores in per_trace) for key in per_trace[0][name]}
                for name in names}

    def having(present) -> List[str]:
        return [name for name in all_runs[0].allocators if all(present(runs, name) for runs in all_runs)]

    tables: Dict[str, Dict[str, Dict[str, float]]] = {}
    space = having(lambda runs, name: len(runs.samples.get(name, [])) > 0)
    if len(space) >= 2:
        tables["space"] = ranked(space, space_values)
    speed = having(lambda runs, name: name in runs.times and runs.times[name].calls > 0)
    if len(speed) >= 2:
        tables["speed"] = ranked(speed, speed_values)
        for name in speed:
            tables["speed"][name]["mean_ns"] = statistics.mean(runs.times[name].mean_ns for runs in all_runs)
            tables["speed"][name]["median_ns"] = statistics.mean(runs.times[name].percentile(50.0) for runs in all_runs)
    for table in tables.values():  # sorted by penalty (c), as the thesis's tables
        ordered = sorted(table.items(), key=lambda item: (item[1]["penalty_c"], item[1]["penalty_w"]))
        table.clear()
        table.update(ordered)
    return tables


def ranking_rows(tables) -> Tuple[List[str], List[List[str]]]:
    headers = ["table", "allocator", "penalty (c)", "penalty (w)", "best", "worst", "mean ns", "median ns"]
    rows = []
    for table, scores in tables.items():
        for name, score in scores.items():
            rows.append([table, name, f"{score['penalty_c'] * 100:.0f}%", f"{score['penalty_w'] * 100:.2f}%",
                         f"{score['best'] * 100:.2f}%", f"{score['worst'] * 100:.2f}%",
                         f"{score['mean_ns']:.0f}" if "mean_ns" in score else "",
                         f"{score['median_ns']:.0f}" if "median_ns" in score else ""])
    return headers, rows


# ----------------------------------------------------------------------------- the report

MIB = 1 << 20


@dataclass
class Table:
    title: str
    headers: List[str]
    rows: List[List[str]]
    left: int = 1  # columns of names (left-justified); the rest are numbers


def _mib(value: float) -> str:
    return f"{value / MIB:.1f}"


def plot_live(blocks: Blocks, fragmentation_runs: Sequence[ReplayRuns], stem: Path) -> List[Path]:
    from .plotting import FIGURE_SIZE_IN, load_pyplot, save_figure

    pyplot = load_pyplot()
    figure, axis = pyplot.subplots(figsize=FIGURE_SIZE_IN)
    seconds = blocks.timeline[:, 0] / 1e9
    axis.plot(seconds, blocks.timeline[:, 2] / MIB, label="live bytes (requested)", color="black")
    for runs in fragmentation_runs:
        for allocator, series in runs.samples.items():
            if len(series):
                scale = blocks.duration_ns / 1e9 / max(runs.wall[allocator], 1e-9)
                axis.plot(series[:, 0] * scale, series[:, 1] / MIB, label=f"PSS, {allocator} ({runs.trace_name})",
                          linewidth=0.9)
    axis.set_xlabel("trace time (s); replays scaled to it")
    axis.set_ylabel("MiB")
    axis.set_title(f"{blocks.prepared.trace.name}: live bytes over time")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    written = save_figure(figure, stem)
    pyplot.close(figure)  # a bench run draws dozens
    return written


def plot_heap_map(runs: ReplayRuns, stem: Path) -> List[Path]:
    """meshalloc's breakdown of its heap over the time of each meshalloc run of the replay
    (`trace replay --heap-map`), stacked, with the run's PSS over it."""
    from .breakdown import COLUMNS as BREAKDOWN_COLUMNS
    from .plotting import FIGURE_SIZE_IN, load_pyplot, save_figure

    path = runs.directory / trace_replay.HEAP_MAP_FILE
    if not path.is_file():
        return []
    rows = _read_tsv(path)
    allocators = sorted({row["allocator"] for row in rows})
    pyplot = load_pyplot()
    figure, axes = pyplot.subplots(len(allocators), 1, figsize=FIGURE_SIZE_IN, squeeze=False)
    for axis, allocator in zip(axes[:, 0], allocators):
        repetition = runs.repetition.get(allocator)  # the median run, whose PSS is drawn over it
        mine = [row for row in rows if row["allocator"] == allocator and row["repetition"] == repetition]
        if not mine:
            continue
        times = [float(row["time_s"]) for row in mine]
        stacks = [[int(row[f"{group}_bytes"]) / MIB for row in mine] for group, _ in BREAKDOWN_COLUMNS
                  if group != "mesh_saving"]  # memory not used: not part of the heap
        labels = [label for group, label in BREAKDOWN_COLUMNS if group != "mesh_saving"]
        axis.stackplot(times, stacks, labels=labels)
        series = runs.samples.get(allocator)
        if series is not None and len(series):
            axis.plot(series[:, 0], series[:, 1] / MIB, color="black", linewidth=1.0, label="PSS")
        axis.set_title(f"{allocator} ({runs.trace_name}, run {repetition})", fontsize=9)
        axis.set_ylabel("MiB")
        axis.legend(fontsize=7, loc="upper right")
    axes[-1][0].set_xlabel("replay time (s)")
    figure.suptitle("meshalloc's heap over the replay (its statistics every "
                    f"{trace_replay.HEAP_MAP_MS} ms)")
    figure.tight_layout()
    written = save_figure(figure, stem)
    pyplot.close(figure)  # a bench run draws dozens
    return written


def analyze(trace: Path, out: Path, replays: Sequence[Path] = (),
            figures: bool = True) -> Tuple[List[Table], List[Path], Blocks]:
    """Writes every table as TSV (raw numbers) and analysis.md, and the figures; returns the
    human tables for the console, the files written and the blocks."""
    blocks = load(trace, out / trace_replay.PREPARED_DIRECTORY)
    all_runs = [load_replay(directory) for directory in replays]
    files: List[Path] = []
    tables: List[Table] = []
    summary = blocks.prepared.summary
    timeline = blocks.timeline
    files.append(write_tsv(out / FILES["live"], ["ns", "op", "live_bytes", "live_blocks", "window_peak_bytes"],
                            ([f"{v:.0f}" for v in row] for row in timeline)))
    never = int((blocks.records["free_ns"] == NEVER).sum())
    tables.append(Table("trace", ["quantity", "value"], [
        ["blocks", f"{len(blocks.records):,}"],
        ["bytes requested", f"{blocks.total_bytes:,}"],
        ["operations replayed", f"{blocks.total_ops:,}"],
        ["duration s", f"{blocks.duration_ns / 1e9:.3f}"],
        ["peak live", f"{summary['peak_live_bytes'] / MIB:.1f} MiB, {summary['peak_live_blocks']:,} blocks"],
        ["mean live MiB", _mib(float(numpy.interp(numpy.linspace(0, blocks.duration_ns, 1000), timeline[:, 0],
                                                       timeline[:, 2]).mean()) if len(timeline) else 0.0)],
        ["never freed", f"{never:,} blocks"],
        [f"short-lived (< {SHORT_LIVED_PERCENT:g} % of the ops)", f"{short_lived_share(blocks):.1f} % of blocks"],
        [f"short-lived (< {SHORT_LIVED_PERCENT:g} % of the bytes)", f"{short_lived_share(blocks, 'bytes'):.1f} % of blocks"],
    ]))
    lifetime_rows = lifetime_histograms(blocks)
    files.append(write_tsv(out / FILES["lifetimes"], ["measure", "panel", "low", "high", "blocks"],
                            ([m, p, f"{low:.9g}", f"{high:.9g}", str(c)] for m, p, low, high, c in lifetime_rows)))
    sizes = size_histogram(blocks)
    files.append(write_tsv(out / FILES["sizes"], ["low_bytes", "high_bytes", "blocks", "bytes"],
                            ([str(v) for v in row] for row in sizes)))
    tables.append(Table("sizes requested", ["size (bytes)", "blocks", "MiB"],
                        [[f"{low + 1}–{high}", f"{count:,}", _mib(total)] for low, high, count, total in sizes if count]))
    class_rows = []
    for allocator in CLASS_ALLOCATORS:
        classes = size_classes(allocator)
        if classes:
            class_rows += [[allocator, *map(str, row)] for row in class_histogram(blocks, classes)]
    files.append(write_tsv(out / FILES["classes"], ["allocator", "class_bytes", "blocks", "requested_bytes",
                                                     "class_total_bytes"], class_rows))
    for allocator in CLASS_ALLOCATORS:
        mine = [row for row in class_rows if row[0] == allocator]
        if mine:
            tables.append(Table(f"size classes of {allocator} (rounding: class bytes over requested bytes)",
                                ["class", "blocks", "requested MiB", "class MiB"],
                                [[row[1], f"{int(row[2]):,}", _mib(int(row[3])), _mib(int(row[4]))] for row in mine]))
    threads, matrix = thread_matrix(blocks)
    files.append(write_tsv(out / FILES["threads"], ["alloc_thread", "free_thread", "blocks"],
                            ([str(a), "never" if f < 0 else str(f), str(c)] for (a, f), c in sorted(matrix.items()))))
    tables.append(Table("who frees what (blocks allocated by the row's thread, freed by the column's)",
                        ["allocated by", *[f"freed by {t}" for t in threads], "never freed"],
                        [[str(a), *[f"{matrix.get((a, f), 0):,}" for f in threads], f"{matrix.get((a, -1), 0):,}"]
                         for a in threads]))
    if all_runs:
        rows = []
        for runs in all_runs:
            for allocator, mean_pss, mean_live, peak_pss, peak_live in fragmentation(blocks, runs):
                rows.append([runs.trace_name, allocator, _mib(mean_pss), _mib(mean_live),
                             f"{mean_pss / mean_live:.2f}" if mean_live else "", _mib(peak_pss), _mib(peak_live),
                             f"{peak_pss / peak_live:.2f}" if peak_live else ""])
        headers = ["replay", "allocator", "mean PSS MiB", "mean live MiB", "mean PSS/live", "peak PSS MiB",
                   "peak live MiB", "peak PSS/live"]
        files.append(write_tsv(out / FILES["fragmentation"], headers, rows))
        tables.append(Table("fragmentation: PSS over live bytes (live bytes at the same point of the run)",
                            headers, rows, left=2))
        ranked = rankings(all_runs)
        if ranked:
            headers, rows = ranking_rows(ranked)
            files.append(write_tsv(out / FILES["rankings"], headers, rows))
            tables.append(Table(f"rankings (STEVE thesis §8.3.3) over {len(all_runs)} replay(s), sorted by "
                                "penalty (c)", headers, rows, left=2))
    if figures:
        files += plot_lifetimes(blocks, lifetime_rows, out / "lifetimes")
        files += plot_live(blocks, all_runs, out / "live")
        for index, runs in enumerate(all_runs):
            files += plot_heap_map(runs, out / ("heap-map" if len(all_runs) == 1 else f"heap-map-{index + 1}"))
    report = out / FILES["report"]
    report.write_text("".join(f"### {table.title}\n\n" + _markdown(table) + "\n" for table in tables))
    files.append(report)
    return tables, files, blocks


def _markdown(table: Table) -> str:
    from .bench.report import markdown_table

    return markdown_table(table.headers, table.rows, table.left)
