"""`meshalloc bench speed`: how fast is meshalloc next to the allocators people would otherwise
use? Seventeen microbenchmarks (bench/*.cc), each modelled on a well-known allocator stress
pattern, and five real programs from Debian (programs.py), under glibc, jemalloc, mimalloc,
tcmalloc and meshalloc in 1n (meshing off, slots shuffled at each refill: the configuration
issue 2's speed targets are about) and 3y (the defaults); `--allocators` replaces the list. The paper's §6.2 runtime-overhead statements are set beside
the real programs' numbers. See docs/speed.md.

Time and memory come from separate passes. The timing pass runs every workload under every
allocator, interleaved (A B C ..., A B C ...), with nothing else watching: the microbenchmarks
report the wall time of their own measured work, the programs are timed from fork to exit. The
memory pass then runs each (workload, allocator) again under measure() for peak PSS. Sampling
during the timing pass would read /proc/PID/smaps_rollup, which takes the program's mmap lock
against the very mmap/munmap/madvise calls that distinguish allocators, and on a 2-CPU machine
the sampler also takes CPU from the two-thread workloads: the slowdown would differ by
allocator, a bias rather than noise, on runs of a tenth of a second. Both passes run on the
driver (driver.py) as two passes of the one scheduler, interleaved.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..allocators import Allocator
from ..allocators import MESH_DEFAULT
from ..measure import MIB
from .claims import Claims, claims_table
from .common import KEY_VALUE, ExperimentBase, check_configurations, names_from
from .framework import (FULL, QUICK, SMOKE, STDERR, TIMED, Claim, Command, Context, Declared,
                        ExperimentUnavailable, Parameters, Pass, Report, Results, Run, RunFailed, Session)
from .report import (NO_VALUE, BarPanel, allocator_json, geomean_claim_text, geomean_text, markdown_table,
                     notes_section, number, ratio_bar_chart, stat_text, write_tsv)
from .schedule import BALANCED
from .stats import Geomean, Stat, geomean_of, paired_ratios, ratio
from .programs import (MICRO_INTERVAL_S, PROGRAM, PROGRAM_INTERVAL_S, Workload, available_programs, memory_figures,
                       memory_progress, program_workloads, shown_command)

NAME = "speed"
ST, MT = "st", "mt"  # the microbenchmarks' kinds; programs.PROGRAM is the real programs'
KIND_TITLES = {ST: "single-threaded microbenchmarks", MT: "multi-threaded microbenchmarks", PROGRAM: "real programs"}

BASELINE = "mimalloc"
# Issue 2's speed targets are stated for this configuration (meshing off, randomisation 1), not
# for the experiments' "meshing off" reference (allocators.MESH_OFF, 0n): they name it as it is.
TARGET_CONFIG = "meshalloc:1n"
MESH_ON = MESH_DEFAULT  # what a user gets
GLIBC, JEMALLOC = "glibc", "jemalloc"
ALLOCATORS = (GLIBC, JEMALLOC, BASELINE, "tcmalloc", TARGET_CONFIG, MESH_ON)
SMOKE_ALLOCATORS = (BASELINE, TARGET_CONFIG)

# Environment variables that narrow a run (comma- or space-separated names); SPEED_ALLOCATORS
# is an alias of --allocators.
WORKLOADS_VARIABLE = "SPEED_WORKLOADS"
ALLOCATORS_VARIABLE = "SPEED_ALLOCATORS"
THREADS_VARIABLE = "SPEED_THREADS"

# Multi-threaded workloads use one thread per CPU, at least 2 (else nothing is shared) and at
# most 8 (beyond that a small machine measures its scheduler).
MIN_THREADS, MAX_THREADS = 2, 8

# The real programs' times spread by 10-50 % between runs on a shared 2-CPU machine, so even
# quick mode takes five.
TIME_REPETITIONS = {SMOKE: 1, QUICK: 5, FULL: 7}
# The memory pass: peak memory of a deterministic workload varies far less between runs
# than its time does, so fewer runs suffice.
MEMORY_REPETITIONS = {SMOKE: 1, QUICK: 1, FULL: 2}
TIMEOUT_S = {SMOKE: 60.0, QUICK: 300.0, FULL: 300.0}

# Issue 2's targets for meshalloc 1n against mimalloc.
TARGETS = {ST: 1.3, MT: 1.5}
# The paper's runtime overheads (§6.2.1, §6.2.3; the artifact's README repeats them) and what
# its README expects of Mesh "on different machines": ~10 % slowdown or less.
PAPER_SPEC_TIME = 1.007  # SPECint2006 geomean, Mesh vs glibc
PAPER_PERLBENCH_TIME = 1.039  # 400.perlbench, Mesh vs glibc
PAPER_REDIS_TIME = (1.76, 1.72)  # insertion seconds, Mesh vs jemalloc (§6.2.2)
OVERHEAD_TOLERANCE = 1.10


@dataclass(frozen=True)
class Microbenchmark:
    name: str
    kind: str
    binary: str
    arguments: Tuple[str, ...]  # "{threads}" and "{pairs}" are filled in
    work_option: str  # the option that sets how much work a run does
    work: Tuple[int, int, int]  # its value in smoke, quick, full
    pattern: str  # the well-known stress pattern it is modelled on

    def command(self, binary_dir: Path, context: Context, threads: int) -> List[str]:
        pairs = max(2, threads // 2 * 2)
        arguments = [argument.format(threads=threads, pairs=pairs) for argument in self.arguments]
        return [str(binary_dir / self.binary), *arguments, f"{self.work_option}={context.pick(*self.work)}"]


# Full sizes are the programs' defaults (about 0.15-0.5 s under mimalloc on 2 CPUs; churn-mt
# halves churn's work per thread); quick does a quarter of the work, smoke 10-50 ms' (long enough
# for the memory pass to take a few samples). The rows from tight-loop on expose the fast path:
# small blocks, short lives, only a block's first word touched (larson and prodcons with
# --light=1), so the time is the allocator's own rather than the benchmark's memory traffic.
# In full they take 0.25-0.4 s under mimalloc (larson-small and prodcons-64 through the work
# option given here, not the programs' defaults).
MICROBENCHMARKS: Tuple[Microbenchmark, ...] = (
    Microbenchmark("churn", ST, "churn", (), "--iterations", (40_000, 1_000_000, 4_000_000),
                   "random-size churn (8 B-16 KiB) over a working set"),
    Microbenchmark("mixlife", ST, "mixlife", (), "--iterations", (50_000, 250_000, 1_000_000),
                   "long-lived objects amid short-lived temporaries"),
    Microbenchmark("bigmix", ST, "bigmix", (), "--iterations", (3_000, 150_000, 600_000),
                   "small, medium and large blocks in one working set"),
    Microbenchmark("large", ST, "large", (), "--iterations", (30, 1_250, 5_000), "large blocks, 64 KiB-4 MiB"),
    Microbenchmark("realloc", ST, "realloc", (), "--iterations", (10_000, 500_000, 2_000_000),
                   "realloc growth: string builders and doubling arrays"),
    Microbenchmark("tight-loop", ST, "tightloop", (), "--iterations", (1_500_000, 6_250_000, 25_000_000),
                   "glibc's simple malloc benchmark: malloc, write a word, free; 16-128 B"),
    Microbenchmark("tight-loop-batch", ST, "tightloop", ("--batch=10",), "--iterations",
                   (1_500_000, 6_250_000, 25_000_000), "the same, 10 blocks allocated then freed in order"),
    Microbenchmark("turnover", ST, "turnover", (), "--iterations", (2_500_000, 10_000_000, 40_000_000),
                   "espresso: 4096 blocks of 8-512 B turning over, random replacement in a moving window"),
    Microbenchmark("old-free", ST, "turnover", ("--slots=65536", "--window=65536", "--min=16", "--max=128"),
                   "--iterations", (100_000, 4_000_000, 16_000_000),
                   "an LRU cache's frees: 65536 blocks of 16-128 B replaced at random, mostly in spans no longer held"),
    Microbenchmark("bignum", ST, "bignum", (), "--rounds", (80_000, 300_000, 1_200_000),
                   "cfrac: big-integer products, divisions and sums, every result a fresh small block"),
    Microbenchmark("churn-mt", MT, "churn", ("--threads={threads}",), "--iterations", (10_000, 500_000, 2_000_000),
                   "threadtest: churn on every thread, nothing shared"),
    Microbenchmark("larson", MT, "larson", ("--threads={threads}", "--iterations=30000"), "--generations",
                   (5, 30, 100), "Larson & Krishnan: server-style exchange of blocks between threads"),
    Microbenchmark("prodcons", MT, "prodcons", ("--threads={pairs}",), "--iterations",
                   (100_000, 1_000_000, 4_000_000), "xmalloc-test: producer/consumer, every free on another thread"),
    Microbenchmark("cache-scratch", MT, "cachescratch", ("--threads={threads}", "--repetitions=20000"),
                   "--iterations", (50, 250, 1_000), "Hoard's cache-scratch: passive false sharing"),
    Microbenchmark("cache-thrash", MT, "cachescratch", ("--threads={threads}", "--repetitions=20000", "--thrash=1"),
                   "--iterations", (50, 250, 1_000), "Hoard's cache-thrash: active false sharing"),
    Microbenchmark("larson-small", MT, "larson", ("--threads={threads}", "--iterations=30000", "--light=1"),
                   "--generations", (25, 150, 600), "larson touching only a block's first word: remote frees"),
    Microbenchmark("prodcons-64", MT, "prodcons", ("--threads=2", "--min=64", "--max=64", "--light=1"),
                   "--iterations", (500_000, 2_000_000, 8_000_000),
                   "xmalloc-test, one pair, 64 B blocks lightly touched: the remote-free path"),
    Microbenchmark("thread-loop", MT, "threadloop", ("--threads={threads}",), "--iterations",
                   (2_500_000, 10_000_000, 40_000_000),
                   "glibc's thread benchmark: a malloc/free loop of 16-256 B per thread, nothing shared"),
)


@dataclass
class TimeRecord:
    workload: str
    allocator: str
    repetition: int
    order: int
    status: str
    seconds: Optional[float]
    maxrss_kb: Optional[float] = None
    checksum: str = ""
    detail: str = ""  # the microbenchmark's line, or a failed run's stderr

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Cell:
    """One (workload, allocator): time and peak PSS over its successful runs, time over the
    baseline's, and the per-repetition ratios (rep r against the baseline's rep r: the two
    ran seconds apart, so a slow phase of the machine hits both)."""

    time: Optional[Stat] = None
    seconds: Dict[int, float] = field(default_factory=dict)  # repetition -> seconds, successful runs
    ratio: Optional[float] = None
    paired: Dict[int, float] = field(default_factory=dict)
    peak_pss: Optional[Stat] = None
    peak_ratio: Optional[float] = None
    runs: int = 0
    succeeded: int = 0

    @property
    def ratio_range(self) -> Optional[Tuple[float, float]]:
        if not self.paired:
            return None
        return min(self.paired.values()), max(self.paired.values())

    @property
    def row(self) -> Tuple[Optional[float], Dict[int, float]]:
        """What a geomean over workloads takes (stats.geomean_of)."""
        return self.ratio, self.paired


Table = Dict[str, Dict[str, Cell]]  # workload -> allocator -> cell


# ---------------------------------------------------------------------------------------------
# What to run

def thread_count() -> int:
    chosen = os.environ.get(THREADS_VARIABLE)
    if chosen:
        try:
            return max(1, int(chosen))
        except ValueError:
            raise ExperimentUnavailable(f"{THREADS_VARIABLE} must be a number, not '{chosen}'") from None
    return max(MIN_THREADS, min(MAX_THREADS, os.cpu_count() or MIN_THREADS))


def microbenchmark_workloads(context: Context, threads: int) -> List[Workload]:
    binaries = context.build_dir / "bench"
    missing = sorted({bench.binary for bench in MICROBENCHMARKS if not (binaries / bench.binary).is_file()})
    if missing:
        raise ExperimentUnavailable(f"the microbenchmarks are not built ({', '.join(missing)} missing in {binaries}; "
                                    "run `make release`)")
    workloads = []
    for bench in MICROBENCHMARKS:
        command = bench.command(binaries, context, threads)
        workloads.append(Workload(bench.name, bench.kind, command, None, {}, bench.pattern,
                                  shown_command(command, context.root, None)))
    return workloads


# ---------------------------------------------------------------------------------------------
# The two passes

def parse_line(text: str) -> Dict[str, str]:
    """The microbenchmarks' one line: `workload=churn threads=1 seconds=0.22 ... checksum=...`."""
    for line in text.splitlines():
        if "seconds=" in line:
            return dict(KEY_VALUE.findall(line))
    return {}


def time_figures(session: Session, run: Run) -> Dict[str, Any]:
    """A timed run's figures: a microbenchmark's own seconds (its checksum held to the first
    good run's, session.state["checksums"]), a program's fork-to-exit seconds (its output held
    to its output without preload)."""
    workload = run.workload
    if not run.ok:
        return {"detail": run.output(STDERR)}
    if not workload.reports_time:
        if run.stdout.strip() != workload.reference:
            raise RunFailed("output differs from a run without preload")
        return {"seconds": run.seconds}
    fields = parse_line(run.stdout)
    figures = {"detail": " ".join(f"{key}={value}" for key, value in fields.items()),
               "checksum": fields.get("checksum", ""), "maxrss_kb": _float(fields.get("maxrss_kb"))}
    seconds = _float(fields.get("seconds"))
    if seconds is None:
        raise RunFailed("no seconds= in its output", figures)
    checksums: Dict[str, str] = session.state.setdefault("checksums", {})
    if checksums.setdefault(workload.name, figures["checksum"]) != figures["checksum"]:
        raise RunFailed(f"checksum {figures['checksum']} differs from the first run's", figures)
    return dict(figures, seconds=seconds)


def time_record(run: Run) -> TimeRecord:
    """A timed run as the tables take it."""
    return TimeRecord(run.workload_name, run.allocator.name, run.repetition, run.order, run.status,
                      run.metric("seconds") if run.ok else None, run.metric("maxrss_kb"),
                      str(run.figures.get("checksum", "")), str(run.figures.get("detail", "")))


def _float(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# Numbers

def build_table(workloads: Sequence[Workload], allocators: Sequence[str], baseline: Optional[str],
                times: Sequence[TimeRecord], memory: Sequence[Run]) -> Table:
    table: Table = {}
    for workload in workloads:
        row: Dict[str, Cell] = {}
        for name in allocators:
            mine = [record for record in times if record.workload == workload.name and record.allocator == name]
            good = [record for record in mine if record.ok]
            peaks = [run.metric("peak_pss") for run in memory
                     if run.workload_name == workload.name and run.allocator.name == name and run.ok]
            row[name] = Cell(time=Stat.of([record.seconds for record in good]),
                             seconds={record.repetition: record.seconds for record in good},
                             peak_pss=Stat.of(peaks), runs=len(mine), succeeded=len(good))
        base = row.get(baseline) if baseline else None
        for cell in row.values():
            if base is not None:
                cell.ratio = ratio(cell.time, base.time)
                cell.paired = paired_ratios(cell.seconds, base.seconds) if cell.ratio is not None else {}
                cell.peak_ratio = ratio(cell.peak_pss, base.peak_pss)
        table[workload.name] = row
    return table


def geomean_over(table: Table, rows: Sequence[str], allocator: str, attribute: str = "ratio") -> Geomean:
    """Geometric mean over rows of an allocator's time ratio to the baseline (with the spread of
    the per-repetition geomeans), or of another of its ratios (peak_ratio)."""
    cells = [table[row][allocator] for row in rows if allocator in table.get(row, {})]
    if attribute == "ratio":
        return geomean_of([cell.row for cell in cells])
    return geomean_of([(getattr(cell, attribute), {}) for cell in cells if getattr(cell, attribute) is not None])


def ratio_cell(cell: Optional[Cell], bold_above: Optional[float] = None) -> str:
    if cell is None or cell.ratio is None:
        return "—" if cell is None or cell.succeeded else "failed"
    text = f"{cell.ratio:.2f}"
    if bold_above is not None and cell.ratio > bold_above:
        text = f"**{text}**"
    spread = cell.ratio_range
    if spread and len(cell.paired) > 1 and f"{spread[0]:.2f}" != f"{spread[1]:.2f}":
        text += f" ({spread[0]:.2f}–{spread[1]:.2f})"
    return text


def target_verdict(kind: str, cell: Optional[Cell]) -> str:
    limit = TARGETS.get(kind)
    if limit is None:
        return ""
    if cell is None:
        return "—"
    if cell.ratio is None:
        return "failed" if cell.runs and not cell.succeeded else "—"
    return f"ok (≤ {limit})" if cell.ratio <= limit else f"MISS (≤ {limit})"


def groups_present(workloads: Sequence[Workload]) -> List[Tuple[str, List[str]]]:
    groups = []
    for kind in (ST, MT, PROGRAM):
        rows = [workload.name for workload in workloads if workload.kind == kind]
        if rows:
            groups.append((kind, rows))
    return groups


def ratio_table(workloads: Sequence[Workload], names: Sequence[str], baseline: Optional[str], table: Table) -> str:
    """The main table: each allocator's median time over the baseline's, per workload, with
    the range of the per-repetition ratios; geometric means per group and overall."""
    shown = [name for name in names if name != baseline]
    header = ["workload", "kind", f"{baseline} s" if baseline else "time s"] + [f"{name} ×" for name in shown]
    if TARGET_CONFIG in shown:
        header.append("1n target")
    rows = []
    for workload in workloads:
        cells = table[workload.name]
        base = cells.get(baseline) if baseline else None
        row = [workload.name, workload.kind, stat_text(base.time, 3) if base else NO_VALUE]
        row += [ratio_cell(cells.get(name), TARGETS.get(workload.kind) if name == TARGET_CONFIG else None) for name in shown]
        if TARGET_CONFIG in shown:
            row.append(target_verdict(workload.kind, cells.get(TARGET_CONFIG)))
        rows.append(row)
    groups = groups_present(workloads)
    every = [workload.name for workload in workloads]
    summaries = [(f"geomean {kind}", members) for kind, members in groups] + [("geomean all", every)]
    for label, members in summaries:
        row = [f"**{label}**", "", ""] + [geomean_text(geomean_over(table, members, name)) for name in shown]
        if TARGET_CONFIG in shown:
            row.append("")
        rows.append(row)
    return markdown_table(header, rows, left=2)


def seconds_table(workloads: Sequence[Workload], names: Sequence[str], table: Table) -> str:
    header = ["workload", "kind"] + names
    rows = []
    for workload in workloads:
        row = [workload.name, workload.kind]
        for name in names:
            cell = table[workload.name].get(name)
            text = stat_text(cell.time, 3) if cell else NO_VALUE
            if cell and cell.runs > cell.succeeded:
                text += f" ({cell.runs - cell.succeeded} failed)"
            row.append(text)
        rows.append(row)
    return markdown_table(header, rows, left=2)


def memory_table(workloads: Sequence[Workload], names: Sequence[str], baseline: Optional[str], table: Table) -> str:
    header = ["workload", "kind"] + [f"{name} MiB" for name in names]
    rows = []
    for workload in workloads:
        rows.append([workload.name, workload.kind] + [stat_text(table[workload.name][name].peak_pss, 1, MIB)
                                                      if name in table[workload.name] else "—" for name in names])
    every = [workload.name for workload in workloads]
    if baseline:
        rows.append([f"**geomean × {baseline}**", ""] + [
            f"{value:.2f}" if (value := geomean_over(table, every, name, "peak_ratio").value) is not None else "—"
            for name in names])
    return markdown_table(header, rows, left=2)


def workloads_table(workloads: Sequence[Workload]) -> str:
    return markdown_table(["workload", "kind", "models", "command"],
                          ([workload.name, workload.kind, workload.pattern, f"`{workload.shown}`"]
                           for workload in workloads), left=4)


# ---------------------------------------------------------------------------------------------
# Claims

def claims(workloads: Sequence[Workload], table: Table, baseline: Optional[str], checked: bool) -> List[Claim]:
    result = Claims(checked)
    add = result.add

    for kind, rows in groups_present(workloads):
        if kind not in TARGETS:
            continue
        limit = TARGETS[kind]
        cells = [(row, table[row].get(TARGET_CONFIG)) for row in rows]
        measured = [(row, cell) for row, cell in cells if cell is not None and cell.ratio is not None]
        claim = f"meshalloc 1n time vs mimalloc, each {KIND_TITLES[kind][:-1]} ({len(rows)})"
        paper = f"≤ {limit:.1f}× on every one (issue 2's target)"
        if baseline != BASELINE or not measured:
            add(claim, paper, "—", None)
            continue
        worst_row, worst = max(measured, key=lambda item: item[1].ratio)
        spread = worst.ratio_range
        ours = f"worst {worst.ratio:.2f}× ({worst_row}"
        ours += f", {spread[0]:.2f}–{spread[1]:.2f} over {len(worst.paired)} runs)" if spread and len(
            worst.paired) > 1 else ")"
        misses = [row for row, cell in measured if cell.ratio > limit]
        ours += f"; {len(misses)} of {len(rows)} over" + (f": {', '.join(misses)}" if misses else "")
        complete = len(measured) == len(rows)
        add(claim, paper, ours, (not misses) if complete else (False if misses else None),
            "" if complete else f"{len(rows) - len(measured)} workload(s) not measured")

    programs = [workload.name for workload in workloads if workload.kind == PROGRAM]
    if programs:
        spirit = "in spirit: Debian programs here, SPECint2006 in the paper; holds when within the artifact's " \
                 f"expected ~10 % (≤ {OVERHEAD_TOLERANCE:.2f}×)"
        mesh_vs_glibc = _geomean_between(table, programs, MESH_ON, GLIBC)
        ours = geomean_claim_text(mesh_vs_glibc, len(programs))
        add("meshalloc 3y time vs glibc, geomean of the real programs",
            f"{PAPER_SPEC_TIME:.3f}× (SPECint2006, +0.7 %)", ours,
            mesh_vs_glibc.value <= OVERHEAD_TOLERANCE if mesh_vs_glibc.value else None, spirit)
        if "perl" in programs:
            perl = _geomean_between(table, ["perl"], MESH_ON, GLIBC)
            add("meshalloc 3y time vs glibc, perl", f"{PAPER_PERLBENCH_TIME:.3f}× (400.perlbench, +3.9 %)",
                geomean_claim_text(perl, 1), perl.value <= OVERHEAD_TOLERANCE if perl.value else None,
                f"in spirit: our mail-filtering Perl script, not perlbench; holds when ≤ {OVERHEAD_TOLERANCE:.2f}×")
        mesh_vs_je = _geomean_between(table, programs, MESH_ON, JEMALLOC)
        mesh_s, je_s = PAPER_REDIS_TIME
        add("meshalloc 3y time vs jemalloc, geomean of the real programs",
            f"≈1.00–1.02× (Firefox: < 1 % Speedometer; Redis insertion {mesh_s} s vs {je_s} s)",
            geomean_claim_text(mesh_vs_je, len(programs)),
            mesh_vs_je.value <= OVERHEAD_TOLERANCE if mesh_vs_je.value else None,
            f"in spirit: Debian programs, not Firefox or Redis; holds when ≤ {OVERHEAD_TOLERANCE:.2f}×")
    return result.found


def _geomean_between(table: Table, rows: Sequence[str], mine: str, theirs: str) -> Geomean:
    """Geometric mean over rows of mine's median time over theirs, with the range of the
    per-repetition geomeans (rep r against rep r) where every row has both."""
    pairs = []
    for row in rows:
        a, b = table.get(row, {}).get(mine), table.get(row, {}).get(theirs)
        value = ratio(a.time, b.time) if a and b else None
        pairs.append((value, paired_ratios(a.seconds, b.seconds) if value is not None else {}))
    return geomean_of(pairs)


# ---------------------------------------------------------------------------------------------
# Files

def write_runs(out: Path, times: Sequence[TimeRecord], memory: Sequence[Run]) -> List[Path]:
    time_tsv = write_tsv(out / "runs.tsv", ["workload", "allocator", "repetition", "order", "status", "seconds",
                                           "maxrss_kb", "checksum", "detail"],
                         ([record.workload, record.allocator, str(record.repetition), str(record.order),
                           record.status, number(record.seconds), number(record.maxrss_kb), record.checksum,
                           " ".join(record.detail.split())] for record in times))
    memory_tsv = write_tsv(out / "memory-runs.tsv", ["workload", "allocator", "repetition", "order", "status",
                                                     "peak_pss_bytes", "mean_pss_bytes", "cgroup_peak_bytes",
                                                     "wall_s", "samples", "hz", "samples_tsv"],
                           ([run.workload_name, run.allocator.name, str(run.repetition), str(run.order), run.status,
                             *(number(run.metric(key)) for key in ("peak_pss", "mean_pss", "cgroup_peak", "wall_s")),
                             str(run.figures.get("samples", "")), number(run.metric("hz")),
                             str(run.figures.get("samples_tsv", ""))]
                            for run in memory))
    return [time_tsv, memory_tsv]


def write_table_tsv(out: Path, workloads: Sequence[Workload], names: Sequence[str], table: Table) -> Path:
    rows = []
    for workload in workloads:
        for name in names:
            cell = table[workload.name].get(name)
            if cell is None:
                continue
            spread = cell.ratio_range or (None, None)
            rows.append([workload.name, workload.kind, name, str(cell.runs), str(cell.succeeded),
                         *(number(getattr(cell.time, key)) if cell.time else "" for key in ("median", "low", "high")),
                         number(cell.ratio), number(spread[0]), number(spread[1]),
                         *(number(getattr(cell.peak_pss, key)) if cell.peak_pss else ""
                           for key in ("median", "low", "high")), number(cell.peak_ratio)])
    return write_tsv(out / "table.tsv", ["workload", "kind", "allocator", "runs", "succeeded", "seconds",
                                         "seconds_min", "seconds_max", "time_ratio", "time_ratio_min",
                                         "time_ratio_max", "peak_pss_bytes", "peak_pss_min", "peak_pss_max",
                                         "peak_ratio"], rows)


def figure(out: Path, workloads: Sequence[Workload], names: Sequence[str], baseline: Optional[str],
           table: Table, repetitions: int) -> List[Path]:
    shown = [name for name in names if name != baseline]
    panels = []
    for title, kinds in (("microbenchmarks", (ST, MT)), ("real programs", (PROGRAM,))):
        rows = [workload.name for workload in workloads if workload.kind in kinds]
        if not rows:
            continue
        panel = BarPanel(title, rows + ["geomean"], {})
        for name in shown:
            cells = [table[row].get(name) for row in rows]
            mean = geomean_over(table, rows, name)
            panel.series[name] = [cell.ratio if cell else None for cell in cells] + [mean.value]
            panel.low[name] = [(cell.ratio_range or (None, None))[0] if cell else None for cell in cells] + [mean.low]
            panel.high[name] = [(cell.ratio_range or (None, None))[1] if cell else None for cell in cells] + [mean.high]
        panels.append(panel)
    if not panels or not baseline:
        return []
    title = (f"Time relative to {baseline} (lower is faster)\nmedian of {repetitions} interleaved run(s), "
             "whiskers = per-repetition range")
    return ratio_bar_chart(panels, f"time ÷ {baseline}", title, out / "speed")


# ---------------------------------------------------------------------------------------------
# The experiment

@dataclass(frozen=True)
class SpeedParameters(Parameters):
    memory_repetitions: int = 1  # the memory pass's, at most the timing pass's
    timeout_s: float = 300.0


PARAMETERS = {mode: SpeedParameters(TIME_REPETITIONS[mode], memory_repetitions=MEMORY_REPETITIONS[mode],
                                    timeout_s=TIMEOUT_S[mode]) for mode in TIME_REPETITIONS}
TIME, MEMORY = "time", "memory"  # the passes


class Speed(ExperimentBase, Declared):
    modes = PARAMETERS
    allocators = ALLOCATORS
    smoke_allocators = SMOKE_ALLOCATORS
    alias = ALLOCATORS_VARIABLE
    baselines = (BASELINE,)
    reference = BASELINE

    def passes(self, params: SpeedParameters) -> List[Pass]:
        """Time first, with nothing watching, in balanced order: with the same neighbours every
        repetition, whichever of two meshalloc builds ran right after glibc came out behind the
        other on old-free and turnover, by more than the changes being measured (docs/speed.md).
        Then memory, sampled, in a pass of its own."""
        return [Pass(TIME, params.repetitions, BALANCED, directory=TIME),
                Pass(MEMORY, min(params.repetitions, params.memory_repetitions), directory=MEMORY)]

    def workloads(self, session: Session) -> List[Workload]:
        context, threads = session.context, thread_count()
        workloads = microbenchmark_workloads(context, threads)
        programs, missing_programs = available_programs()
        wanted = names_from(WORKLOADS_VARIABLE)
        if wanted:
            known = [bench.name for bench in MICROBENCHMARKS] + [program.name for program in programs]
            unknown = [name for name in wanted if name not in known]
            if unknown:
                raise ExperimentUnavailable(f"{WORKLOADS_VARIABLE}: unknown workload(s) {', '.join(unknown)} "
                                            f"(known here: {', '.join(known)})")
            workloads = [workload for workload in workloads if workload.name in wanted]
            programs = [program for program in programs if program.name in wanted]
        session.notes += [f"Skipped program {line}" for line in missing_programs]
        session.notes += check_configurations(session.selection.allocators)
        program_rows, program_failures = program_workloads(context, programs, session.scratch,
                                                           session.params.timeout_s)
        session.failures += program_failures
        workloads += program_rows
        if not workloads:
            raise ExperimentUnavailable("nothing to run: " + "; ".join(program_failures or ["no workloads"]))
        return workloads

    def command(self, session: Session, workload: Workload, allocator: Allocator) -> Command:
        if session.current_pass.name == TIME:
            return Command(workload.command, workload.env, workload.cwd, measure=TIMED,
                           timeout_s=session.params.timeout_s)
        interval = PROGRAM_INTERVAL_S if workload.kind == PROGRAM else MICRO_INTERVAL_S
        return Command(workload.command, workload.env, workload.cwd, interval_s=interval,
                       timeout_s=session.params.timeout_s)

    def parse(self, session: Session, run: Run) -> Dict[str, Any]:
        if run.pass_name == TIME:
            return time_figures(session, run)
        return memory_figures(run, session.out)

    def progress(self, run: Run) -> str:
        if run.pass_name == TIME:
            seconds = run.metric("seconds")
            return f"{run.allocator.name}={seconds:.3f}" if run.ok and seconds is not None else \
                f"{run.allocator.name}={run.status}"
        return memory_progress(run)

    def machine_threads(self, session: Session) -> int:
        return thread_count()

    def records(self, results: Results) -> Tuple[List[TimeRecord], List[Run]]:
        """The timing pass's runs as the tables take them, and the memory pass's runs."""
        return ([time_record(run) for run in results.runs if run.pass_name == TIME],
                [run for run in results.runs if run.pass_name == MEMORY])

    def table(self, results: Results) -> Table:
        return build_table(results.workloads, results.names, results.baseline, *self.records(results))

    def claims(self, session: Session, results: Results) -> List[Claim]:
        return claims(results.workloads, self.table(results), results.baseline, checked=session.checked)

    def notes(self, session: Session, results: Results) -> List[str]:
        notes = []
        unsampled = [f"{run.workload_name} under {run.allocator.name}" for run in self.records(results)[1]
                     if run.ok and run.metric("peak_pss") is None]
        if unsampled:
            notes.append("Ended before the memory sampler's first sample (no peak PSS): " + ", ".join(unsampled))
        if session.context.mode == QUICK:
            notes.append("Quick mode: the microbenchmarks do a quarter of their full work and the programs a quarter "
                         "to a third, so start-up and first-touch page faults weigh more than in a full run.")
        if session.context.mode == SMOKE:
            notes.append("Smoke mode: tiny parameters, one repetition — a check that everything runs, not a "
                         "measurement.")
        memory_repetitions = self.passes(session.params)[1].repetitions
        notes.append(f"Memory: peak PSS from a separate pass of {memory_repetitions} run(s) per workload and "
                     f"allocator, sampled every {MICRO_INTERVAL_S * 1000:g} ms (microbenchmarks) or "
                     f"{PROGRAM_INTERVAL_S * 1000:g} ms (programs); the timing pass is not sampled (docs/speed.md).")
        return notes

    def report(self, session: Session, results: Results, found: Sequence[Claim]) -> Report:
        out, workloads, names, baseline = session.out, results.workloads, results.names, results.baseline
        repetitions, memory_repetitions = results.repetitions, self.passes(session.params)[1].repetitions
        table = self.table(results)
        main = ratio_table(workloads, names, baseline, table)
        caption = (f"Time of each allocator over {baseline}'s (median of {repetitions} interleaved repetition(s); "
                   "in brackets the range of the per-repetition ratios); lower is faster. Microbenchmarks: the "
                   "wall time of their measured work; programs: fork to exit. Geomeans are over the rows each "
                   "allocator completed.") if baseline else "No baseline ran: no ratios."
        files = write_runs(out, *self.records(results))
        files.append(write_table_tsv(out, workloads, names, table))
        markdown = "\n".join([
            f"# Allocator speed ({session.context.mode} mode)", "",
            caption, "", main,
            f"## Median seconds (min–max over {repetitions} run(s))", "", seconds_table(workloads, names, table),
            f"## Peak PSS, MiB (median, min–max over {memory_repetitions} run(s) of the memory pass)", "",
            memory_table(workloads, names, baseline, table),
            "## Claims", "",
            claims_table(found, "paper / target"),
            "## Workloads", "", workloads_table(workloads),
            *notes_section(session.notes, session.failures),
        ])
        return Report(caption + "\n\n" + main, markdown, files)

    def figures(self, session: Session, results: Results) -> List[Path]:
        return figure(session.out, results.workloads, results.names, results.baseline, self.table(results),
                      results.repetitions)

    def summary_details(self, session: Session, results: Results) -> Dict[str, Any]:
        return {"memory_repetitions": self.passes(session.params)[1].repetitions, "threads": thread_count(),
                "allocators": [allocator_json(allocator) for allocator in results.allocators],
                "workloads": [{"name": workload.name, "kind": workload.kind, "command": workload.command,
                               "pattern": workload.pattern, "reference_output": workload.reference}
                              for workload in results.workloads]}


EXPERIMENT = Speed(name=NAME, title="Allocator speed: microbenchmarks and real programs",
                   paper="Mesh §6.2 (runtime overhead); issue 2's speed targets")
