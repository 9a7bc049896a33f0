"""`meshalloc bench real-apps`: mean and peak memory of real programs under every allocator,
and their geometric mean against glibc -- the Mesh paper's §6.2 in spirit.

The paper measured Firefox (Speedometer), Redis and SPECint2006; Firefox needs a build without
its own allocator and SPEC a licence, so neither can run here. This experiment takes the five
Debian programs of the speed experiment (programs.py: python3, ruby, perl, sqlite3, git), runs
each under glibc, jemalloc, mimalloc, tcmalloc and meshalloc with meshing off (0n) and on (3y, the defaults),
interleaved (`--allocators` replaces the list, `--baseline` the reference of the tables), and
samples the PSS of the whole process tree every 10 ms (the paper's mstat rate).
The claims set the paper's memory figures beside ours and are judged only on their direction:
does meshalloc 3y use less memory than the reference allocator? See docs/real-apps.md.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..allocators import MESH_DEFAULT, MESH_OFF, Allocator
from ..measure import MIB
from . import schedule
from .claims import Claims, claims_table
from .common import ExperimentBase, checked_repetitions, choose_allocators, machine_notes, names_from
from .framework import FULL, QUICK, SMOKE, Claim, Context, ExperimentUnavailable, Outcome
from .programs import MemoryRecord, Workload, available_programs, memory_pass, program_workloads
from .report import NO_VALUE, BarPanel, geomean_claim_text, geomean_text, markdown_table, number, ratio_bar_chart
from .report import allocator_json, notes_section, range_text, stat_text, write_summary_json, write_tsv
from .stats import Geomean, Stat, geomean_of, paired_ratios, ratio

NAME = "real-apps"
GLIBC = "glibc"  # the paper's reference for SPEC (and perlbench)
BASELINE = GLIBC  # the tables' reference, unless --baseline names another
JEMALLOC = "jemalloc"  # the paper's reference for Firefox and Redis
MESH_ON = MESH_DEFAULT  # what meshing itself saves is this against MESH_OFF
ALLOCATORS = (BASELINE, JEMALLOC, "mimalloc", "tcmalloc", MESH_OFF, MESH_ON)
SMOKE_ALLOCATORS = (BASELINE, MESH_ON)

PROGRAMS_VARIABLE = "REAL_APPS_PROGRAMS"
ALLOCATORS_VARIABLE = "REAL_APPS_ALLOCATORS"  # an alias of --allocators

# The paper ran each allocator three times (Firefox, §6.2.1); full runs five, since our programs
# are short and a shared machine is noisy; quick keeps two, so that a spread can still be shown.
REPETITIONS = {SMOKE: 1, QUICK: 2, FULL: 5}
TIMEOUT_S = {SMOKE: 60.0, QUICK: 300.0, FULL: 300.0}

# The paper's memory figures (§6.2.1 and §6.2.3; the artifact's README repeats them).
PAPER_SPEC_MEAN = 0.976  # SPECint2006 geomean of average memory, Mesh vs glibc: -2.4 %
PAPER_PERLBENCH_PEAK = 564 / 664  # 400.perlbench peak RSS, Mesh vs glibc: -15 %
PAPER_FIREFOX_MEAN = 530 / 632  # Firefox mean heap during Speedometer, Mesh vs mozjemalloc: -16 %
METRICS = ("mean_pss", "peak_pss")
METRIC_TITLES = {"mean_pss": "mean PSS", "peak_pss": "peak PSS"}


@dataclass
class AppCell:
    """One (program, allocator): mean and peak PSS over its successful runs, per repetition
    too, and the ratios to the baseline's medians."""

    stats: Dict[str, Optional[Stat]] = field(default_factory=dict)
    by_repetition: Dict[str, Dict[int, float]] = field(default_factory=dict)
    ratios: Dict[str, Optional[float]] = field(default_factory=dict)
    runs: int = 0
    succeeded: int = 0


Table = Dict[str, Dict[str, AppCell]]  # program -> allocator -> cell


def build_table(programs: Sequence[str], allocators: Sequence[str], records: Sequence[MemoryRecord],
                baseline: Optional[str]) -> Table:
    table: Table = {}
    for program in programs:
        row: Dict[str, AppCell] = {}
        for name in allocators:
            mine = [record for record in records if record.workload == program and record.allocator == name]
            good = [record for record in mine if record.ok]
            cell = AppCell(runs=len(mine), succeeded=len(good))
            for metric in METRICS:
                cell.stats[metric] = Stat.of([record.metric(metric) for record in good])
                cell.by_repetition[metric] = {record.repetition: record.metric(metric) for record in good
                                              if record.metric(metric)}
            row[name] = cell
        base = row.get(baseline) if baseline else None
        for cell in row.values():
            for metric in METRICS:
                cell.ratios[metric] = ratio(cell.stats.get(metric), base.stats.get(metric) if base else None)
        table[program] = row
    return table


def between(table: Table, programs: Sequence[str], mine: str, theirs: str, metric: str) -> Geomean:
    """Geometric mean over the programs of mine's median over theirs; low/high are the
    extremes of the per-repetition geomeans (rep r against rep r, every program)."""
    pairs = []
    for program in programs:
        a, b = table.get(program, {}).get(mine), table.get(program, {}).get(theirs)
        value = ratio(a.stats.get(metric), b.stats.get(metric)) if a and b else None
        pairs.append((value, paired_ratios(a.by_repetition[metric], b.by_repetition[metric]) if value else {}))
    return geomean_of(pairs)


# ---------------------------------------------------------------------------------------------
# Tables

def ratio_table(programs: Sequence[str], names: Sequence[str], table: Table, metric: str,
                baseline: Optional[str]) -> str:
    """One metric: the baseline's MiB, every other allocator over it, meshing's own effect
    (3y over 0n), geometric means with the range of the per-repetition geomeans."""
    others = [name for name in names if name != baseline]
    with_meshing = MESH_ON in names and MESH_OFF in names
    header = ["program", f"{baseline} MiB" if baseline in names else "MiB"] + [f"{name} ×" for name in others]
    if with_meshing:
        header.append("3y ÷ 0n")
    rows = []
    for program in programs:
        cells = table[program]
        base = cells.get(baseline)
        row = [program, stat_text(base.stats.get(metric), 1, MIB) if base else NO_VALUE]
        for name in others:
            row.append(_ratio_cell(cells.get(name), metric, base))
        if with_meshing:
            row.append(geomean_text(between(table, [program], MESH_ON, MESH_OFF, metric)))
        rows.append(row)
    geomean_row = ["**geomean**", ""] + [geomean_text(between(table, programs, name, baseline, metric))
                                         if baseline else NO_VALUE for name in others]
    if with_meshing:
        geomean_row.append(geomean_text(between(table, programs, MESH_ON, MESH_OFF, metric)))
    rows.append(geomean_row)
    return markdown_table(header, rows)


def _ratio_cell(cell: Optional[AppCell], metric: str, base: Optional[AppCell]) -> str:
    if cell is None:
        return NO_VALUE
    if cell.ratios.get(metric) is None:
        return "failed" if cell.runs and not cell.succeeded else NO_VALUE
    paired = list(paired_ratios(cell.by_repetition[metric], base.by_repetition[metric]).values()) if base else []
    spread = Stat.of(paired) if len(paired) > 1 else None
    return range_text(cell.ratios[metric], spread.low if spread else None, spread.high if spread else None)


def absolute_table(programs: Sequence[str], names: Sequence[str], table: Table, metric: str) -> str:
    header = ["program"] + [f"{name} MiB" for name in names]
    rows = []
    for program in programs:
        row = [program]
        for name in names:
            cell = table[program].get(name)
            text = stat_text(cell.stats.get(metric), 1, MIB) if cell else NO_VALUE
            if cell and cell.runs > cell.succeeded:
                text += f" ({cell.runs - cell.succeeded} failed)"
            row.append(text)
        rows.append(row)
    return markdown_table(header, rows)


# ---------------------------------------------------------------------------------------------
# Claims

def claims(programs: Sequence[str], table: Table, checked: bool) -> List[Claim]:
    """The paper's memory statements, against glibc and jemalloc whatever the tables' baseline."""
    result = Claims(checked)
    direction = "in spirit ({}): holds when meshalloc 3y uses less than {} (the direction, not the size)"

    def add(claim: str, paper: str, value: Geomean, rows: int, note: str) -> None:
        result.add(claim, paper, geomean_claim_text(value, rows),
                   value.value < 1.0 if value.value is not None else None, note)

    add("meshalloc 3y mean memory vs glibc, geomean of the real programs",
        f"{PAPER_SPEC_MEAN:.3f}× (SPECint2006 geomean, −2.4 %)",
        between(table, programs, MESH_ON, GLIBC, "mean_pss"),
        len(programs), direction.format("Debian programs, not SPECint2006; PSS, not RSS", "glibc"))
    if "perl" in programs:
        add("meshalloc 3y peak memory vs glibc, perl", f"{PAPER_PERLBENCH_PEAK:.2f}× (400.perlbench peak RSS, "
            "564 vs 664 MB)", between(table, ["perl"], MESH_ON, GLIBC, "peak_pss"), 1,
            direction.format("our mail-filtering script, not perlbench; peak PSS", "glibc"))
    add("meshalloc 3y mean memory vs jemalloc, geomean of the real programs",
        f"{PAPER_FIREFOX_MEAN:.2f}× (Firefox, Speedometer: 530 vs 632 MB)",
        between(table, programs, MESH_ON, JEMALLOC, "mean_pss"), len(programs),
        direction.format("Debian programs, not Firefox", "jemalloc"))
    return result.found


# ---------------------------------------------------------------------------------------------
# Files

def write_runs(out: Path, records: Sequence[MemoryRecord]) -> Path:
    return write_tsv(out / "runs.tsv", ["program", "allocator", "repetition", "order", "status", "mean_pss_bytes",
                                        "peak_pss_bytes", "cgroup_peak_bytes", "wall_s", "samples", "hz",
                                        "samples_tsv"],
                     ([record.workload, record.allocator, str(record.repetition), str(record.order), record.status,
                       number(record.metric("mean_pss")), number(record.metric("peak_pss")),
                       number(record.metric("cgroup_peak")),
                       number(record.result.wall_time if record.result else None),
                       str(len(record.result.samples)) if record.result else "", number(record.metric("hz")),
                       str((record.directory / "samples.tsv").relative_to(out)) if record.result else ""]
                      for record in records))


def write_table_tsv(out: Path, programs: Sequence[str], names: Sequence[str], table: Table,
                    baseline: Optional[str]) -> Path:
    rows = []
    for program in programs:
        for name in names:
            cell = table[program].get(name)
            if cell is None:
                continue
            row = [program, name, str(cell.runs), str(cell.succeeded)]
            for metric in METRICS:
                stat = cell.stats.get(metric)
                row += [number(stat.median), number(stat.low), number(stat.high)] if stat else ["", "", ""]
                row.append(number(cell.ratios.get(metric)))
            rows.append(row)
    header = ["program", "allocator", "runs", "succeeded"]
    for metric in METRICS:
        header += [f"{metric}_bytes", f"{metric}_min", f"{metric}_max", f"{metric}_ratio_to_{baseline or 'none'}"]
    return write_tsv(out / "table.tsv", header, rows)


def figure(out: Path, programs: Sequence[str], names: Sequence[str], table: Table, repetitions: int,
           baseline: Optional[str]) -> List[Path]:
    """The paper's "memory vs glibc" bars for our set: each allocator's mean and peak PSS over
    glibc's per program, and their geometric mean."""
    if baseline is None or baseline not in names:
        return []
    shown = [name for name in names if name != baseline]
    panels = []
    for metric in METRICS:
        panel = BarPanel(f"{METRIC_TITLES[metric]} ÷ {baseline}", list(programs) + ["geomean"], {})
        for name in shown:
            values, lows, highs = [], [], []
            for rows in [[program] for program in programs] + [list(programs)]:
                value = between(table, rows, name, baseline, metric)
                values.append(value.value)
                lows.append(value.low)
                highs.append(value.high)
            panel.series[name], panel.low[name], panel.high[name] = values, lows, highs
        panels.append(panel)
    title = (f"Memory of real programs relative to {baseline} (lower is less)\nmedian of {repetitions} "
             "interleaved run(s), whiskers = per-repetition range")
    return ratio_bar_chart(panels, f"÷ {baseline}", title, out / "memory")


def write_summary(out: Path, context: Context, workloads: Sequence[Workload], allocators: Sequence[Allocator],
                  repetitions: int, found: Sequence[Claim]) -> Path:
    return write_summary_json(
        out, NAME, context.mode, repetitions, found, allocators=[allocator_json(allocator) for allocator in allocators],
        programs=[{"name": workload.name, "command": workload.command, "models": workload.pattern,
                   "reference_output": workload.reference} for workload in workloads])


# ---------------------------------------------------------------------------------------------
# The experiment

class RealApps(ExperimentBase):
    def run(self, context: Context) -> Outcome:
        repetitions = checked_repetitions(context, REPETITIONS)
        timeout = TIMEOUT_S[context.mode]
        load_start = schedule.load_average()
        programs, missing = available_programs()
        wanted = names_from(PROGRAMS_VARIABLE)
        if wanted:
            unknown = [name for name in wanted if name not in [program.name for program in programs]]
            if unknown:
                raise ExperimentUnavailable(f"{PROGRAMS_VARIABLE}: unknown or missing program(s) {', '.join(unknown)}")
            programs = [program for program in programs if program.name in wanted]
        if not programs:
            raise ExperimentUnavailable("none of the programs is installed: " + "; ".join(missing))

        selection = choose_allocators(context, ALLOCATORS, SMOKE_ALLOCATORS, ALLOCATORS_VARIABLE, (BASELINE,))
        allocators, allocator_names, baseline = selection.allocators, selection.names, selection.baseline
        notes = selection.notes(BASELINE) + [f"Skipped program {line}" for line in missing]
        if GLIBC not in allocator_names:
            notes.append(f"{GLIBC} did not run: the claims against it cannot be checked.")

        with tempfile.TemporaryDirectory(prefix="meshalloc-real-apps-") as scratch:
            workloads, failures = program_workloads(context, programs, Path(scratch), timeout)
            if not workloads:
                raise ExperimentUnavailable("no program runs here: " + "; ".join(failures))
            context.log(f"{len(workloads)} programs × {len(allocators)} allocators × {repetitions} repetition(s)")
            records = memory_pass(context, workloads, allocators, repetitions, timeout)
        failures += [f"{record.workload} under {record.allocator} (repetition {record.repetition}): {record.status}"
                     for record in records if not record.ok]

        rows = [workload.name for workload in workloads]
        table = build_table(rows, allocator_names, records, baseline)
        found = claims(rows, table, checked=context.mode != SMOKE)

        rates = [record.metric("hz") for record in records if record.metric("hz")]
        caption = (f"Each allocator's PSS over {baseline}'s (median of {repetitions} interleaved repetition(s); in "
                   "brackets the range of the per-repetition ratios); lower is less memory. PSS of the whole process "
                   "tree sampled every 10 ms; mean = time-weighted over the run. 3y ÷ 0n: what meshing (with "
                   "randomisation) saves over meshalloc without it.")
        main = "\n".join([f"**Mean PSS** (× {baseline})", "",
                          ratio_table(rows, allocator_names, table, "mean_pss", baseline),
                          f"**Peak PSS** (× {baseline})", "",
                          ratio_table(rows, allocator_names, table, "peak_pss", baseline)])
        if context.mode == SMOKE:
            notes.append("Smoke mode: tiny inputs, one repetition — a check that everything runs, not a measurement.")
        elif context.mode == QUICK:
            notes.append("Quick mode: inputs a quarter to a third of the full size, so the programs' fixed start-up "
                         "memory (interpreter, libraries, each allocator's own metadata) weighs more than in a full run, "
                         "and runs of about half a second leave a background mesher little time to act.")
        if rates:
            notes.append(f"Samples achieved {min(rates):.0f}–{max(rates):.0f} Hz.")
        notes += machine_notes(allocators, None, load_start)

        out = context.out
        files = [write_runs(out, records), write_table_tsv(out, rows, allocator_names, table, baseline)]
        markdown = "\n".join([
            f"# Real programs' memory ({context.mode} mode)", "", caption, "", main,
            f"## Mean PSS, MiB (median, min–max over {repetitions} run(s))", "",
            absolute_table(rows, allocator_names, table, "mean_pss"),
            f"## Peak PSS, MiB (median, min–max over {repetitions} run(s))", "",
            absolute_table(rows, allocator_names, table, "peak_pss"),
            "## Claims", "",
            claims_table(found),
            "## Programs", "",
            markdown_table(["program", "models", "command"],
                           ([workload.name, workload.pattern, f"`{workload.shown}`"] for workload in workloads),
                           left=3),
            *notes_section(notes, failures),
        ])
        table_md = out / "table.md"
        table_md.write_text(markdown)
        files.append(table_md)
        files += figure(out, rows, allocator_names, table, repetitions, baseline)
        files.append(write_summary(out, context, workloads, allocators, repetitions, found))
        files.append(out / "memory")
        return Outcome(repetitions=repetitions, claims=found, table_md=caption + "\n\n" + main, files=files,
                       failures=failures, notes=notes)


EXPERIMENT = RealApps(name=NAME, title="Real programs' memory",
                      paper="Mesh §6.2.3 in spirit (SPEC and Firefox replaced by Debian programs)")
