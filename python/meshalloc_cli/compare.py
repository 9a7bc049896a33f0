"""The same command under several allocators, interleaved and repeated, summarised in a
table of medians and ratios against a baseline. The library form of `meshalloc compare`.

Runs go through the benchmarks' one loop (bench/driver.run_schedule), interleaved (A B C,
A B C, ...), measured as the experiments' sampled runs are, and their medians and ratios go
through the one statistics module (bench/stats.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .allocators import Allocator
from .bench import schedule
from .bench.framework import Command, Pass, Run
from .bench.stats import Stat, ratio
from .breakdown import COLUMNS as BREAKDOWN_COLUMNS
from .errors import MeshallocError
from .measure import DEFAULT_INTERVAL_S, RunResult

DEFAULT_REPEAT = 3
UNSAFE_FILE_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class RunRecord:
    allocator: str
    repetition: int  # 1-based
    order: int  # 1-based position in the interleaved schedule
    result: RunResult
    log: Optional[Path] = None


@dataclass
class TableRow:
    allocator: str
    runs: int
    succeeded: int
    mean_pss: Optional[Stat]
    peak_pss: Optional[Stat]
    time: Optional[Stat]
    peak_cgroup: Optional[Stat]  # the kernel's high-water mark where it keeps one
    peak_pte: Optional[Stat]
    peak_maps: Optional[Stat]
    mean_ratio: Optional[float] = None  # median mean PSS / the baseline's
    peak_ratio: Optional[float] = None
    time_ratio: Optional[float] = None
    # meshalloc's breakdown at exit, per column group (breakdown.COLUMNS); empty for others.
    breakdown: Dict[str, Optional[Stat]] = field(default_factory=dict)

    @property
    def has_breakdown(self) -> bool:
        return any(stat is not None for stat in self.breakdown.values())


@dataclass
class Comparison:
    command: List[str]
    allocators: List[Allocator]
    baseline: str
    repeat: int
    interval: float
    runs: List[RunRecord] = field(default_factory=list)
    rows: List[TableRow] = field(default_factory=list)
    interrupted: bool = False

    def row(self, allocator: str) -> Optional[TableRow]:
        return next((row for row in self.rows if row.allocator == allocator), None)

    @property
    def failed_runs(self) -> List[RunRecord]:
        return [run for run in self.runs if not run.result.succeeded]


def _peak(result: RunResult, metric: str) -> Optional[float]:
    summary = result.summary(metric)
    return float(summary.peak) if summary else None


def _cgroup_peak(result: RunResult) -> Optional[float]:
    if result.cgroup_kernel_peak is not None:
        return float(result.cgroup_kernel_peak)
    return _peak(result, "cgroup")


def build_table(runs: Sequence[RunRecord], allocator_names: Sequence[str], baseline: str) -> List[TableRow]:
    """One row per allocator, from its successful runs only: a crashed run's memory says
    nothing about the allocator's steady state, and is counted in `succeeded` instead."""
    rows = []
    for name in allocator_names:
        mine = [run.result for run in runs if run.allocator == name]
        good = [result for result in mine if result.succeeded]
        mean_pss = Stat.of([result.summary("pss").mean if result.summary("pss") else None for result in good])
        rows.append(TableRow(
            allocator=name,
            runs=len(mine),
            succeeded=len(good),
            mean_pss=mean_pss,
            peak_pss=Stat.of([_peak(result, "pss") for result in good]),
            time=Stat.of([result.wall_time for result in good]),
            peak_cgroup=Stat.of([_cgroup_peak(result) for result in good]),
            peak_pte=Stat.of([_peak(result, "pte") for result in good]),
            peak_maps=Stat.of([_peak(result, "maps") for result in good]),
            breakdown={group: Stat.of([result.breakdown.column(group) if result.breakdown else None
                                       for result in good])
                       for group, _ in BREAKDOWN_COLUMNS},
        ))
    base = next((row for row in rows if row.allocator == baseline), None)
    for row in rows:
        row.mean_ratio = ratio(row.mean_pss, base.mean_pss if base else None)
        row.peak_ratio = ratio(row.peak_pss, base.peak_pss if base else None)
        row.time_ratio = ratio(row.time, base.time if base else None)
    return rows


def _log_path(log_dir: Path, order: int, allocator: str, repetition: int) -> Path:
    return log_dir / f"{order:03d}-{UNSAFE_FILE_CHARACTERS.sub('_', allocator)}-{repetition}.log"


def compare(
    command: Sequence[str],
    allocators: Sequence[Allocator],
    repeat: int = DEFAULT_REPEAT,
    baseline: Optional[str] = None,
    interval: float = DEFAULT_INTERVAL_S,
    use_cgroup: bool = True,
    log_dir: Optional[Path] = None,
    on_start: Optional[Callable[[int, int, str, int], None]] = None,
    on_finish: Optional[Callable[[RunRecord, int], None]] = None,
) -> Comparison:
    """Run `command` `repeat` times under each allocator, interleaved. Each run's output
    goes to a log file under `log_dir` (discarded when None). on_start(order, total,
    allocator, repetition) and on_finish(record, total) report progress. A Ctrl-C stops
    after the current run and returns what was measured, with `interrupted` set."""
    if repeat < 1:
        raise MeshallocError("--repeat must be at least 1")
    if not allocators:
        raise MeshallocError("no allocators to compare")
    names = [allocator.name for allocator in allocators]
    baseline = baseline if baseline is not None else names[0]
    if baseline not in names:
        raise MeshallocError(f"baseline '{baseline}' is not one of the compared allocators ({', '.join(names)})")
    from .bench import driver  # at call time: the driver writes through output.py, which imports this module

    run = Command(list(command), interval_s=interval, timeout_s=None, use_cgroup=use_cgroup)
    total = len(allocators) * repeat
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)

    def place(slot: schedule.Slot, kind: str) -> Tuple[None, Optional[Path]]:
        return None, _log_path(log_dir, slot.order, slot.allocator.name, slot.repetition) if log_dir else None

    def record(done: Run) -> RunRecord:
        return RunRecord(done.allocator.name, done.repetition, done.order, done.result,
                         _log_path(log_dir, done.order, done.allocator.name, done.repetition) if log_dir else None)

    def start(slot: schedule.Slot) -> None:
        if on_start:
            on_start(slot.order, total, slot.allocator.name, slot.repetition)

    def finish(done: Run) -> None:
        if done.result is None:  # measure() refused to start the command (a missing program): stop here
            raise MeshallocError(done.status.removeprefix("cannot start: "))
        if on_finish:
            on_finish(record(done), total)

    runs = driver.run_schedule([None], allocators, Pass("", repeat), lambda made, kind: run, place, start=start,
                               finish=finish)
    return comparison_of(command, allocators, repeat, interval, [record(done) for done in runs], baseline)


def comparison_of(command: Sequence[str], allocators: Sequence[Allocator], repeat: int, interval: float,
                  records: Sequence[RunRecord], baseline: Optional[str] = None) -> Comparison:
    """The Comparison of runs already made (by compare(), or by an experiment's schedule: bench
    traces): the table of medians and ratios against `baseline` (default: the first allocator)."""
    names = [allocator.name for allocator in allocators]
    baseline = baseline if baseline is not None else names[0]
    comparison = Comparison(list(command), list(allocators), baseline, repeat, interval, list(records))
    comparison.interrupted = any(record.result.interrupted for record in records)
    comparison.rows = build_table(comparison.runs, names, baseline)
    return comparison
