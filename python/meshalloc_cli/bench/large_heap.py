"""`meshalloc bench large-heap`: a large heap of small objects, three quarters freed at random,
then left alone -- the case meshing was invented for (issue 22).

bench/large_heap.cc fills a heap with 256 B objects on one thread, frees 75 % of them at
random (every span keeps about a quarter of its slots, scattered), and then allocates nothing
more while it watches its own memory once a second. Address-ordered reuse cannot help, because
nothing is allocated again; returning whole empty pages cannot help either, because a 4 KiB
page of 16 objects is almost never entirely free. Only an allocator that moves objects
without moving their addresses -- meshing -- can give those pages back. Issue 22's targets: PSS at
most 2x the live bytes within 60 s at 2 GiB and 8 GiB, with the meshing CPU reported, and the
number of mappings never inside the safety margin below vm.max_map_count (each mesh costs
mappings; docs/large-heap.md has the arithmetic). The program reads its own PSS, page tables
and mappings: no sampler from outside takes the process's mmap lock against the mesher.
See docs/large-heap.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..allocators import MESH_DEFAULT
from ..measure import KIB, MIB
from .claims import Claims, claims_table
from .common import KEY_VALUE, ExperimentBase, built
from .framework import (FULL, QUICK, SMOKE, TIMED, Claim, Command, Declared, ExperimentUnavailable, Parameters,
                        Report, Results, Run, RunFailed, Session)
from .report import TIMES, allocator_json, markdown_table, notes_section, number, stat_text, write_tsv
from .stats import Stat

NAME = "large-heap"
BINARY = Path("bench") / "large_heap"  # inside the build directory
GIB = 1 << 30

# The allocators, in table order and in the order they run within a repetition; meshalloc 3y is
# its defaults, as in the other experiments. Smoke keeps one rival, to exercise the comparison.
GLIBC, JEMALLOC, MIMALLOC, MESH_ON = "glibc", "jemalloc", "mimalloc", MESH_DEFAULT
ALLOCATORS = (GLIBC, JEMALLOC, MIMALLOC, MESH_ON)
SMOKE_ALLOCATORS = (GLIBC, MESH_ON)
ALLOCATORS_VARIABLE = "LARGE_HEAP_ALLOCATORS"  # an alias of --allocators (its tables have no baseline)

# The workload of issue 22: 256 B objects, 75 % freed, the same random subset under every
# allocator (one seed), so that every allocator keeps the very same objects.
OBJECT_SIZE = 256
FREE_PERCENT = 75
SEED = 1


@dataclass(frozen=True)
class Setting:
    """What one mode runs: the heap sizes and how long each heap is watched after the frees."""

    heaps: Tuple[int, ...]  # bytes allocated before the frees
    idle_s: int
    sample_ms: int


# Full: issue 22's sizes and its 60 s. Quick: a heap small enough to fill in a second or two
# and 10 s of watching (the first checkpoint). Smoke: proves the pipeline, says nothing.
SETTINGS = {
    SMOKE: Setting(heaps=(16 * MIB,), idle_s=1, sample_ms=250),
    QUICK: Setting(heaps=(256 * MIB,), idle_s=10, sample_ms=1000),
    FULL: Setting(heaps=(2 * GIB, 8 * GIB), idle_s=60, sample_ms=1000),
}
REPETITIONS = {SMOKE: 1, QUICK: 1, FULL: 3}


@dataclass(frozen=True)
class LargeHeapParameters(Parameters):
    setting: Setting = SETTINGS[FULL]


PARAMETERS = {mode: LargeHeapParameters(REPETITIONS[mode], setting=SETTINGS[mode]) for mode in SETTINGS}

# The program ends itself with SIGALRM after its time limit, so a hang becomes a failed run
# instead of a stuck benchmark: the idle time plus a generous allowance for filling, freeing
# and sampling (8 GiB is 33.5 million mallocs, and reading smaps_rollup of a large heap takes
# a while on a loaded machine). The harness waits a little longer than the program.
TIME_LIMIT_BASE_S = 60
TIME_LIMIT_PER_GIB_S = 60
HARNESS_GRACE_S = 30

# A heap size is run only where the machine has room for it: the objects with their headers,
# the benchmark's table of pointers, and some slack for everything else on the machine.
# Swapping would measure the disk, not the allocator.
MEMORY_HEADROOM = 1.25
MEMINFO = Path("/proc/meminfo")

# Issue 22's targets.
TARGET_RATIO = 2.0  # PSS at most this many times the live bytes...
TARGET_WINDOW_S = 60  # ...within this many seconds after the frees
CHECKPOINTS_S = (10, 30, 60)  # the moments the table shows, where the run watched that long
# The program sleeps a whole period after each reading, so its readings slip later by the time
# each takes (0.07 s at 256 MiB with 16,000 mappings): its "10 s" reading came at 10.7 s. A run
# counts as having watched until a checkpoint when its last reading is at most this early.
READING_DRIFT_S = 0.5
# meshalloc's own mapping budget (src/mesh/mesher.h, kMappingMarginMin and
# kMappingMarginDivisor): it stays the larger of 1/8 of vm.max_map_count and 1024 mappings
# below the limit. Issue 22 asks that the process never enter that margin.
MAP_COUNT = Path("/proc/sys/vm/max_map_count")
MAPPING_MARGIN_MIN = 1024
MAPPING_MARGIN_DIVISOR = 8

SAMPLE_PREFIX = "sample "
SUMMARY_PREFIX = "workload=large_heap "
# Everything the program prints is a number except the checksum (hex), kept as text.
FLOAT_FIELDS = ("t_s", "fill_s", "free_s", "ratio_end", "seconds_to_2x")
TEXT_FIELDS = ("workload", "checksum")
NEVER = -1  # the program's seconds_to_2x (and mesh_cpu_ns) when there is nothing to report

RUN_COLUMNS = ("heap_bytes", "allocator", "repetition", "order", "status", "live_bytes", "objects", "fill_s",
               "free_s", "pss_after_free", "pss_end", "ratio_end", "seconds_to_2x", "pte_end", "mappings_end",
               "peak_mappings", "peak_pte_bytes", "mesh_cpu_ns", "checksum", "wall_s", "line")
SAMPLE_COLUMNS = ("heap_bytes", "allocator", "repetition", "t_s", "pss_bytes", "pss_per_live", "pte_bytes",
                  "mappings", "mesh_cpu_ns")
SUMMARY_COLUMNS = ("heap_bytes", "allocator", "runs", "succeeded", "live_bytes", "ratio_after_free",
                   *(f"ratio_at_{seconds}s" for seconds in CHECKPOINTS_S), "ratio_end", "ratio_end_min",
                   "ratio_end_max", "pss_end_bytes", "seconds_to_2x", "never_2x", "pte_end_bytes", "mappings_end",
                   "peak_mappings", "mesh_cpu_s")
FIGURE_STEM = "pss-over-time"
PANEL_SIZE_IN = (5.5, 3.4)


# ---------------------------------------------------------------------------------------------
# The workload


@dataclass(frozen=True)
class Workload:
    """The arguments of bench/large_heap.cc for one heap size."""

    heap_bytes: int
    idle_s: int
    sample_ms: int

    @property
    def time_limit_s(self) -> int:
        return self.idle_s + TIME_LIMIT_BASE_S + TIME_LIMIT_PER_GIB_S * math.ceil(self.heap_bytes / GIB)

    @property
    def live_bytes(self) -> int:
        """What the program keeps: it frees exactly FREE_PERCENT of the objects, rounded down."""
        objects = self.heap_bytes // OBJECT_SIZE
        return (objects - objects * FREE_PERCENT // 100) * OBJECT_SIZE

    def arguments(self) -> List[str]:
        return ["--bytes", str(self.heap_bytes), "--size", str(OBJECT_SIZE), "--free-percent", str(FREE_PERCENT),
                "--idle-ms", str(self.idle_s * 1000), "--sample-ms", str(self.sample_ms), "--seed", str(SEED),
                "--time-limit", str(self.time_limit_s)]

    def memory_needed(self) -> int:
        """Bytes the run may need at its peak (before the frees): the objects, a pointer each
        in the program's table, and the headroom."""
        return int((self.heap_bytes + self.heap_bytes // OBJECT_SIZE * 8) * MEMORY_HEADROOM)


def heap_text(nbytes: int) -> str:
    """A heap size as the tables name it: "2 GiB", "256 MiB"."""
    if nbytes >= GIB and nbytes % GIB == 0:
        return f"{nbytes // GIB} GiB"
    if nbytes >= MIB and nbytes % MIB == 0:
        return f"{nbytes // MIB} MiB"
    return f"{nbytes // KIB} KiB"


def describe(setting: Setting) -> str:
    sizes = " and ".join(heap_text(heap) for heap in setting.heaps)
    return (f"{sizes} of {OBJECT_SIZE} B objects allocated on one thread, {FREE_PERCENT} % of them freed at "
            f"random (seed {SEED}), then {setting.idle_s} s idle with the thread alive, the program reading its own "
            f"PSS, page tables and mappings every {setting.sample_ms} ms")


# ---------------------------------------------------------------------------------------------
# What the program prints


@dataclass
class Sample:
    t_s: float  # seconds since the frees ended
    pss_bytes: int
    pte_bytes: int
    mappings: int
    mesh_cpu_ns: int  # -1: the allocator does not report it


def _fields(line: str) -> Dict[str, object]:
    fields: Dict[str, object] = {}
    for key, text in KEY_VALUE.findall(line):
        if key in TEXT_FIELDS:
            fields[key] = text
            continue
        try:
            fields[key] = float(text) if key in FLOAT_FIELDS else int(text)
        except ValueError:
            continue  # a field this version does not know how to read: left out, not fatal
    return fields


def parse_sample(line: str) -> Optional[Sample]:
    """One `sample t_s=... pss_bytes=... pte_bytes=... mappings=... mesh_cpu_ns=...` line, or
    None when the line is not a complete sample."""
    if not line.startswith(SAMPLE_PREFIX):
        return None
    fields = _fields(line)
    try:
        return Sample(float(fields["t_s"]), int(fields["pss_bytes"]), int(fields["pte_bytes"]),
                      int(fields["mappings"]), int(fields.get("mesh_cpu_ns", NEVER)))
    except KeyError:
        return None


def parse_output(text: str) -> Tuple[List[Sample], Dict[str, object], str]:
    """The samples in order, the fields of the summary line (empty without one) and that line."""
    samples: List[Sample] = []
    summary: Dict[str, object] = {}
    summary_line = ""
    for raw in text.splitlines():
        line = raw.strip()
        sample = parse_sample(line)
        if sample is not None:
            samples.append(sample)
        elif line.startswith(SUMMARY_PREFIX):
            summary, summary_line = _fields(line), line
    return samples, summary, summary_line


# ---------------------------------------------------------------------------------------------
# Runs


@dataclass
class HeapRun:
    heap_bytes: int
    allocator: str
    repetition: int
    order: int
    status: str  # "ok", or why the run does not count
    samples: List[Sample] = field(default_factory=list)
    summary: Dict[str, object] = field(default_factory=dict)
    line: str = ""
    wall_s: Optional[float] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def value(self, name: str) -> Optional[float]:
        value = self.summary.get(name)
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def live(self) -> Optional[float]:
        return self.value("live_bytes") or None

    def ratio(self, pss: Optional[float]) -> Optional[float]:
        live = self.live
        return pss / live if pss is not None and live else None

    def pss_at(self, seconds: float) -> Optional[float]:
        """PSS of the reading nearest to `seconds` after the frees; None when the run stopped
        watching before then. Nearest, not "within half a period": each reading of a heap with
        tens of thousands of mappings takes tens of milliseconds, so the readings slip later and
        later behind the nominal period."""
        if not self.samples or self.watched_s + READING_DRIFT_S < seconds:
            return None
        nearest = min(self.samples, key=lambda sample: abs(sample.t_s - seconds))
        return float(nearest.pss_bytes)

    @property
    def seconds_to_2x(self) -> Optional[float]:
        """When PSS first was at most 2x live, None if never (the program says -1)."""
        value = self.value("seconds_to_2x")
        return value if value is not None and value >= 0 else None

    @property
    def watched_s(self) -> float:
        return self.samples[-1].t_s if self.samples else 0.0

    @property
    def peak_mappings(self) -> Optional[float]:
        """The most mappings any reading saw: the target is about every moment, not the end."""
        seen = [sample.mappings for sample in self.samples] + [self.value("mappings_end") or 0]
        return float(max(seen)) if seen else None

    @property
    def peak_pte(self) -> Optional[float]:
        seen = [sample.pte_bytes for sample in self.samples] + [self.value("pte_end") or 0]
        return float(max(seen)) if seen else None

    @property
    def mesh_cpu_s(self) -> Optional[float]:
        value = self.value("mesh_cpu_ns")
        return value / 1e9 if value is not None and value >= 0 else None


def check_run(run: HeapRun, workload: Workload, reference_checksum: Optional[str]) -> str:
    """"ok", or what is wrong with a finished run's output."""
    if not run.summary:
        return "no `workload=large_heap` summary line"
    if not run.samples:
        return "no sample line"
    if run.value("live_bytes") != workload.live_bytes:
        return f"live_bytes={run.summary.get('live_bytes')} (expected {workload.live_bytes})"
    checksum = run.summary.get("checksum")
    if reference_checksum is not None and checksum != reference_checksum:
        # The same seed frees the same objects under every allocator; another checksum means
        # a surviving object was corrupted.
        return f"checksum {checksum} differs from the first run's {reference_checksum}"
    return "ok"


def heap_run(run: Run) -> HeapRun:
    """A driver's run as the analysis takes it."""
    return HeapRun(run.workload.heap_bytes, run.allocator.name, run.repetition, run.order, run.status,
                   run.figures.get("samples", []), run.figures.get("summary", {}), run.figures.get("line", ""),
                   run.seconds)


# ---------------------------------------------------------------------------------------------
# Analysis


@dataclass
class Cell:
    """One allocator at one heap size, over its successful repetitions."""

    runs: int
    succeeded: int
    live: Optional[float] = None
    after_free: Optional[Stat] = None  # PSS ÷ live right after the frees
    at: Dict[int, Optional[Stat]] = field(default_factory=dict)  # checkpoint s -> PSS ÷ live
    end: Optional[Stat] = None  # PSS ÷ live at the last reading
    pss_end: Optional[Stat] = None  # bytes
    to_2x: List[Optional[float]] = field(default_factory=list)  # per run; None: never
    watched_s: float = 0.0  # the shortest time any of its runs watched
    pte_end: Optional[Stat] = None
    mappings_end: Optional[Stat] = None
    peak_mappings: Optional[float] = None  # the highest over every run: "never" is about every run
    mesh_cpu_s: Optional[Stat] = None

    @property
    def to_2x_median(self) -> Optional[float]:
        """Median time to 2x with "never" counted as infinitely late; None when it is "never"."""
        if not self.to_2x:
            return None
        median = statistics.median([math.inf if value is None else value for value in self.to_2x])
        return None if math.isinf(median) else median


Table = Dict[Tuple[int, str], Cell]  # (heap bytes, allocator) -> cell


def build_table(runs: Sequence[HeapRun], heaps: Sequence[int], names: Sequence[str]) -> Table:
    table: Table = {}
    for heap in heaps:
        for name in names:
            mine = [run for run in runs if run.heap_bytes == heap and run.allocator == name]
            good = [run for run in mine if run.ok]
            cell = Cell(runs=len(mine), succeeded=len(good))
            if good:
                cell.live = good[0].live
                cell.after_free = Stat.of([run.ratio(run.value("pss_after_free")) for run in good])
                cell.at = {seconds: Stat.of([run.ratio(run.pss_at(seconds)) for run in good])
                           for seconds in CHECKPOINTS_S}
                cell.end = Stat.of([run.ratio(run.value("pss_end")) for run in good])
                cell.pss_end = Stat.of([run.value("pss_end") for run in good])
                cell.to_2x = [run.seconds_to_2x for run in good]
                cell.watched_s = min(run.watched_s for run in good)
                cell.pte_end = Stat.of([run.value("pte_end") for run in good])
                cell.mappings_end = Stat.of([run.value("mappings_end") for run in good])
                cell.peak_mappings = max(run.peak_mappings or 0 for run in good)
                cell.mesh_cpu_s = Stat.of([run.mesh_cpu_s for run in good])
            table[(heap, name)] = cell
    return table


def mapping_threshold(limit: int) -> int:
    """The highest mapping count outside meshalloc's safety margin below `limit`."""
    return limit - max(limit // MAPPING_MARGIN_DIVISOR, MAPPING_MARGIN_MIN)


def read_max_map_count() -> Optional[int]:
    try:
        return int(MAP_COUNT.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def available_memory() -> Optional[int]:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * KIB
    except (OSError, ValueError, IndexError):
        pass
    return None


# ---------------------------------------------------------------------------------------------
# Text


def to_2x_text(cell: Cell) -> str:
    if not cell.to_2x:
        return "—"
    reached = [value for value in cell.to_2x if value is not None]
    never = len(cell.to_2x) - len(reached)
    if not reached:
        return f"never in {int(cell.watched_s)} s"
    text = stat_text(Stat.of(reached)) + " s"
    return text + (f"; {never} of {len(cell.to_2x)} runs never" if never else "")


def checkpoints_shown(idle_s: int) -> List[int]:
    """The checkpoints a run of this length reaches."""
    return [seconds for seconds in CHECKPOINTS_S if seconds <= idle_s]


def table_md(table: Table, heaps: Sequence[int], names: Sequence[str], idle_s: int) -> str:
    shown = checkpoints_shown(idle_s)
    header = (["heap", "allocator", "runs", "live MiB", "after frees"] + [f"at {seconds} s" for seconds in shown]
              + ["at end", "end MiB", "≤ 2× live at", "page tables MiB", "mappings end", "mappings peak",
                 "meshing CPU s"])
    rows = []
    for heap in heaps:
        for name in names:
            cell = table.get((heap, name))
            if cell is None or cell.runs == 0:
                continue
            runs = f"{cell.succeeded}/{cell.runs}"
            if not cell.succeeded:
                rows.append([heap_text(heap), name, runs] + ["—"] * (len(header) - 3))
                continue
            rows.append([heap_text(heap), name, runs, f"{cell.live / MIB:,.0f}", stat_text(cell.after_free, suffix=TIMES)]
                        + [stat_text(cell.at.get(seconds), suffix=TIMES) for seconds in shown]
                        + [stat_text(cell.end, suffix=TIMES), stat_text(cell.pss_end, 0, MIB, thousands=True), to_2x_text(cell),
                           stat_text(cell.pte_end, 1, MIB, thousands=True), stat_text(cell.mappings_end, 0, thousands=True),
                           f"{cell.peak_mappings:,.0f}" if cell.peak_mappings is not None else "—",
                           stat_text(cell.mesh_cpu_s)])
    return markdown_table(header, rows, left=2)


def caption(setting: Setting, repetitions: int, limit: Optional[int]) -> str:
    limit_text = (f"vm.max_map_count here: {limit:,}, safety margin down to {mapping_threshold(limit):,} mappings"
                  if limit else "vm.max_map_count could not be read")
    return (f"Workload: {describe(setting)}. {repetitions} repetition(s), allocators interleaved within each. "
            "PSS columns: PSS ÷ live bytes (median, min–max over the runs) right after the frees, at each "
            "checkpoint and at the last reading; ≤ 2× live at: the first reading at or below twice the live bytes, "
            f"in seconds after the frees. Page tables and mappings at the end; mappings peak: the highest any reading "
            f"of any run saw ({limit_text}). Meshing CPU: meshalloc's mesh.cpu_ns at the end.")


# ---------------------------------------------------------------------------------------------
# Claims


def claims(table: Table, heaps: Sequence[int], names: Sequence[str], limit: Optional[int], checked: bool,
           not_run: Optional[Dict[int, str]] = None) -> List[Claim]:
    """Issue 22's three targets for meshalloc, per heap size. With checked False (smoke: a tiny
    heap, one second), every verdict is None."""
    not_run = not_run or {}
    result = Claims(checked, "smoke run (tiny heap, 1 s): not checked")
    add = result.add
    others = [name for name in names if name != MESH_ON]

    for heap in heaps:
        size = heap_text(heap)
        cell = table.get((heap, MESH_ON))
        missing = not_run.get(heap) or (f"{MESH_ON} did not run" if MESH_ON not in names
                                        else f"no successful {MESH_ON} run")
        ran = cell is not None and cell.succeeded > 0

        # 1. PSS ≤ 2x live within 60 s.
        claim = f"{MESH_ON} PSS ≤ {TARGET_RATIO:g}× live within {TARGET_WINDOW_S} s, {size} heap"
        paper = f"target: ≤ {TARGET_RATIO:g}× within {TARGET_WINDOW_S} s of the frees (issue 22)"
        if not ran:
            add(claim, paper, "—", None, f"not measured: {missing}")
        else:
            median = cell.to_2x_median
            ours = (f"≤ {TARGET_RATIO:g}× at: {to_2x_text(cell)}; {stat_text(cell.end, suffix=TIMES)} at the end "
                    f"({cell.watched_s:.1f} s), {cell.succeeded} run(s)")
            if median is not None:
                add(claim, paper, ours, median <= TARGET_WINDOW_S + READING_DRIFT_S)
            elif cell.watched_s + READING_DRIFT_S >= TARGET_WINDOW_S:
                add(claim, paper, ours, False, f"never within the {TARGET_WINDOW_S} s watched")
            else:
                add(claim, paper, ours, None, f"not reached in the {cell.watched_s:.1f} s watched, which is less "
                                              f"than the target's {TARGET_WINDOW_S} s")

        # 2. Mappings never within the safety margin below vm.max_map_count.
        claim = f"{MESH_ON} mappings never within vm.max_map_count's safety margin, {size} heap"
        if limit:
            threshold = mapping_threshold(limit)
            paper = (f"target: never above {threshold:,} (vm.max_map_count {limit:,} minus the larger of 1/8 of it "
                     f"and {MAPPING_MARGIN_MIN:,}; issue 22)")
        else:
            threshold, paper = None, "target: never within the margin below vm.max_map_count (issue 22)"
        if not ran:
            add(claim, paper, "—", None, f"not measured: {missing}")
        elif threshold is None:
            add(claim, paper, f"peak {cell.peak_mappings:,.0f}", None, "vm.max_map_count could not be read")
        else:
            ours = (f"peak {cell.peak_mappings:,.0f} ({cell.peak_mappings / limit:.0%} of the limit), "
                    f"end {stat_text(cell.mappings_end, 0, thousands=True)}, over {cell.succeeded} run(s)")
            add(claim, paper, ours, cell.peak_mappings <= threshold,
                "the highest reading, taken once per sampling period: a peak between two readings is not seen")

        # 3. Below every other allocator at the end.
        claim = f"{MESH_ON} PSS at the end below every other allocator's, {size} heap"
        paper = "target: meshalloc holds the least memory after the idle time (issue 22)"
        rivals = {name: table[(heap, name)] for name in others
                  if (heap, name) in table and table[(heap, name)].succeeded and table[(heap, name)].end}
        if not ran:
            add(claim, paper, "—", None, f"not measured: {missing}")
        elif not rivals:
            add(claim, paper, stat_text(cell.end, suffix=TIMES), None, "no other allocator ran successfully")
        else:
            ours = f"{stat_text(cell.end, suffix=TIMES)} vs " + ", ".join(f"{name} {stat_text(rival.end, suffix=TIMES)}"
                                                             for name, rival in rivals.items())
            lowest = min(rival.pss_end.median for rival in rivals.values())
            missing_rivals = [name for name in others if name not in rivals]
            add(claim, paper, ours + " (PSS ÷ live)", cell.pss_end.median < lowest,
                f"not run here: {', '.join(missing_rivals)}" if missing_rivals else "")
    return result.found


# ---------------------------------------------------------------------------------------------
# Files


def write_runs(out: Path, runs: Sequence[HeapRun]) -> List[Path]:
    run_rows, sample_rows = [], []
    for run in runs:
        run_rows.append([run.heap_bytes, run.allocator, run.repetition, run.order, run.status,
                         *(number(run.value(key)) for key in ("live_bytes", "objects", "fill_s", "free_s",
                                                               "pss_after_free", "pss_end", "ratio_end",
                                                               "seconds_to_2x", "pte_end", "mappings_end")),
                         number(run.peak_mappings), number(run.peak_pte), number(run.value("mesh_cpu_ns")),
                         run.summary.get("checksum", ""), number(run.wall_s), run.line])
        for sample in run.samples:
            sample_rows.append([run.heap_bytes, run.allocator, run.repetition, number(sample.t_s), sample.pss_bytes,
                                number(run.ratio(sample.pss_bytes)), sample.pte_bytes, sample.mappings,
                                sample.mesh_cpu_ns])
    return [write_tsv(out / "runs.tsv", RUN_COLUMNS, run_rows),
            write_tsv(out / "samples.tsv", SAMPLE_COLUMNS, sample_rows)]


def write_summary_tsv(out: Path, table: Table, heaps: Sequence[int], names: Sequence[str]) -> Path:
    rows = []
    for heap in heaps:
        for name in names:
            cell = table.get((heap, name))
            if cell is None or not cell.runs:
                continue

            def median(stat: Optional[Stat]) -> str:
                return number(stat.median if stat else None)

            never = sum(1 for value in cell.to_2x if value is None)
            rows.append([heap, name, cell.runs, cell.succeeded, number(cell.live), median(cell.after_free),
                         *(median(cell.at.get(seconds)) for seconds in CHECKPOINTS_S), median(cell.end),
                         number(cell.end.low if cell.end else None), number(cell.end.high if cell.end else None),
                         median(cell.pss_end), number(cell.to_2x_median), never, median(cell.pte_end),
                         median(cell.mappings_end), number(cell.peak_mappings), median(cell.mesh_cpu_s)])
    return write_tsv(out / "summary.tsv", SUMMARY_COLUMNS, rows)


def plot(out: Path, runs: Sequence[HeapRun], heaps: Sequence[int], names: Sequence[str],
         limit: Optional[int]) -> List[Path]:
    """One column per heap size: PSS ÷ live against the seconds since the frees (top, with the
    2× target) and the mapping count (bottom, with the safety margin and the limit); one colour
    per allocator, one line per repetition."""
    from ..plotting import load_pyplot, save_figure

    pyplot = load_pyplot()
    figure, axes = pyplot.subplots(2, len(heaps), figsize=(PANEL_SIZE_IN[0] * len(heaps), PANEL_SIZE_IN[1] * 2),
                                   squeeze=False)
    for column, heap in enumerate(heaps):
        ratio_axis, maps_axis = axes[0][column], axes[1][column]
        for index, name in enumerate(names):
            colour = f"C{index % 10}"
            labelled = False
            for run in runs:
                if run.heap_bytes != heap or run.allocator != name or not run.ok:
                    continue
                times = [sample.t_s for sample in run.samples]
                label = None if labelled else name
                labelled = True
                ratio_axis.plot(times, [run.ratio(sample.pss_bytes) for sample in run.samples], color=colour,
                                label=label, linewidth=1.2)
                maps_axis.plot(times, [sample.mappings for sample in run.samples], color=colour, label=label,
                               linewidth=1.2)
        ratio_axis.axhline(TARGET_RATIO, color="grey", linestyle="--", linewidth=1,
                           label=f"{TARGET_RATIO:g}× live (target)")
        ratio_axis.set_title(f"{heap_text(heap)} heap: PSS ÷ live bytes", fontsize=9)
        ratio_axis.set_ylabel("PSS ÷ live")
        ratio_axis.set_ylim(bottom=0)
        if limit:
            maps_axis.axhline(mapping_threshold(limit), color="grey", linestyle="--", linewidth=1,
                              label=f"safety margin ({mapping_threshold(limit):,})")
            maps_axis.axhline(limit, color="black", linestyle=":", linewidth=1,
                              label=f"vm.max_map_count ({limit:,})")
        maps_axis.set_title(f"{heap_text(heap)} heap: mappings", fontsize=9)
        maps_axis.set_ylabel("mappings")
        maps_axis.set_ylim(bottom=0)
        for axis in (ratio_axis, maps_axis):
            axis.set_xlabel("seconds since the frees")
            axis.set_xlim(left=0)
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=7)
    figure.suptitle(f"Large heap: {OBJECT_SIZE} B objects, {FREE_PERCENT} % freed at random, then idle", fontsize=10)
    figure.tight_layout()
    written = save_figure(figure, out / FIGURE_STEM)
    pyplot.close(figure)
    return written


# ---------------------------------------------------------------------------------------------
# The experiment


class LargeHeap(ExperimentBase, Declared):
    modes = PARAMETERS
    allocators = ALLOCATORS
    smoke_allocators = SMOKE_ALLOCATORS
    alias = ALLOCATORS_VARIABLE
    workload_heading = "heap"
    progress_separator = "; "  # each run's word has spaces and commas of its own

    def workloads(self, session: Session) -> List[Workload]:
        """The heap sizes that fit in memory: one that does not would measure swapping, and is
        left out, saying so (session.state["not_run"]: heap -> why)."""
        built(session.context, BINARY)
        setting, repetitions = session.params.setting, session.params.repetitions
        session.notes[:0] = [f"workload: {describe(setting)}",
                             f"{repetitions} repetition(s); allocators interleaved within each"]
        not_run: Dict[int, str] = session.state.setdefault("not_run", {})
        workloads = []
        free = available_memory()
        for heap in setting.heaps:
            workload = Workload(heap, setting.idle_s, setting.sample_ms)
            need = workload.memory_needed()
            if free is not None and need > free:
                not_run[heap] = (f"the {heap_text(heap)} heap needs about {need / GIB:.1f} GiB and only "
                                 f"{free / GIB:.1f} GiB is available")
                session.notes.append(f"not run: {not_run[heap]}")
                session.context.log(f"skipping {heap_text(heap)}: {not_run[heap]}")
            else:
                workloads.append(workload)
        if not workloads:
            raise ExperimentUnavailable("no heap fits in memory here: " + "; ".join(not_run.values()))
        return workloads

    def workload_name(self, workload: Workload) -> str:
        return heap_text(workload.heap_bytes)

    def command(self, session: Session, workload: Workload, allocator) -> Command:
        return Command([str(session.context.build_dir / BINARY), *workload.arguments()], measure=TIMED,
                       timeout_s=float(workload.time_limit_s + HARNESS_GRACE_S))

    def parse(self, session: Session, run: Run) -> Dict[str, Any]:
        """The program's samples and summary; a good run's checksum must be the first good
        run's of the same heap (session.state["checksums"])."""
        samples, summary, line = parse_output(run.stdout)
        figures = {"samples": samples, "summary": summary, "line": line}
        if not run.ok:
            return figures
        references: Dict[int, str] = session.state.setdefault("checksums", {})
        heap = run.workload.heap_bytes
        problem = check_run(heap_run(replace(run, figures=figures)), run.workload, references.get(heap))
        if problem != "ok":
            raise RunFailed(problem, figures)
        references.setdefault(heap, str(summary.get("checksum")))
        return figures

    def progress(self, run: Run) -> str:
        if not run.ok:
            return f"{run.allocator.name}: FAILED ({run.status})"
        heap = heap_run(run)
        reached = heap.seconds_to_2x
        return (f"{heap.allocator}: {heap.ratio(heap.value('pss_after_free')):.2f}× live after the frees, "
                f"{heap.ratio(heap.value('pss_end')):.2f}× at the end, ≤ 2× "
                f"{'never' if reached is None else f'at {reached:.1f} s'}, mappings {heap.peak_mappings:,.0f}")

    def table(self, results: Results) -> Table:
        return build_table([heap_run(run) for run in results.runs],
                           [workload.heap_bytes for workload in results.workloads], results.names)

    def claims(self, session: Session, results: Results) -> List[Claim]:
        return claims(self.table(results), list(session.params.setting.heaps), results.names, read_max_map_count(),
                      checked=session.checked, not_run=session.state.get("not_run", {}))

    def notes(self, session: Session, results: Results) -> List[str]:
        if session.context.mode == SMOKE:
            return ["Smoke mode: a 16 MiB heap watched for 1 s — a check that everything runs, not a measurement."]
        if session.context.mode == QUICK:
            return ["Quick mode: a 256 MiB heap watched for 10 s; issue 22's targets are stated for 2 GiB and "
                    "8 GiB over 60 s (the full mode), where the mapping limit binds."]
        return []

    def report(self, session: Session, results: Results, found: Sequence[Claim]) -> Report:
        heaps = [workload.heap_bytes for workload in results.workloads]
        heading = caption(session.params.setting, results.repetitions, read_max_map_count())
        main = table_md(self.table(results), heaps, results.names, session.params.setting.idle_s)
        files = write_runs(session.out, [heap_run(run) for run in results.runs])
        files.append(write_summary_tsv(session.out, self.table(results), heaps, results.names))
        markdown = "\n".join([f"# Large fragmented heap ({session.context.mode} mode)", "", heading, "", main,
                              "## Claims", "", claims_table(found), *notes_section(session.notes, session.failures)])
        return Report(heading + "\n\n" + main, markdown, files)

    def figures(self, session: Session, results: Results) -> List[Path]:
        if not any(run.ok for run in results.runs):
            return []
        return plot(session.out, [heap_run(run) for run in results.runs],
                    [workload.heap_bytes for workload in results.workloads], results.names, read_max_map_count())

    def summary_details(self, session: Session, results: Results) -> Dict[str, Any]:
        limit = read_max_map_count()
        return {"max_map_count": limit, "mapping_threshold": mapping_threshold(limit) if limit else None,
                "heaps": [workload.heap_bytes for workload in results.workloads],
                "not_run": {str(heap): why for heap, why in session.state.get("not_run", {}).items()},
                "allocators": [allocator_json(allocator) for allocator in results.allocators]}


EXPERIMENT = LargeHeap(name=NAME, title="Large fragmented heap: PSS after random frees, then idle",
                       paper="issue 22's targets (the case meshing was invented for: Mesh §1, §2)")
