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

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ..allocators import MESH_DEFAULT, MESH_OFF
from ..measure import MIB
from .claims import Claims, claims_table
from .common import ExperimentBase, names_from
from .framework import (FULL, QUICK, SMOKE, Claim, Column, Command, Declared, ExperimentUnavailable, Parameters,
                        Report, Results, Run, Session)
from .programs import PROGRAM_INTERVAL_S, available_programs, memory_figures, memory_progress, program_workloads
from .report import NO_VALUE, BarPanel, allocator_json, geomean_claim_text, geomean_text, markdown_table
from .report import notes_section, range_text, ratio_bar_chart, stat_text
from .stats import Stat, paired_ratios

NAME = "real-apps"
GLIBC = "glibc"  # the paper's reference for SPEC (and perlbench)
BASELINE = GLIBC  # the tables' reference, unless --baseline names another
JEMALLOC = "jemalloc"  # the paper's reference for Firefox and Redis
MESH_ON = MESH_DEFAULT  # what meshing itself saves is this against MESH_OFF
ALLOCATORS = (BASELINE, JEMALLOC, "mimalloc", "tcmalloc", MESH_OFF, MESH_ON)
SMOKE_ALLOCATORS = (BASELINE, MESH_ON)

PROGRAMS_VARIABLE = "REAL_APPS_PROGRAMS"
ALLOCATORS_VARIABLE = "REAL_APPS_ALLOCATORS"  # an alias of --allocators


@dataclass(frozen=True)
class RealAppsParameters(Parameters):
    timeout_s: float = 300.0  # a program's run is killed (and reported failed) after this


# The paper ran each allocator three times (Firefox, §6.2.1); full runs five, since our programs
# are short and a shared machine is noisy; quick keeps two, so that a spread can still be shown.
PARAMETERS = {SMOKE: RealAppsParameters(1, timeout_s=60.0), QUICK: RealAppsParameters(2),
              FULL: RealAppsParameters(5)}

# The paper's memory figures (§6.2.1 and §6.2.3; the artifact's README repeats them).
PAPER_SPEC_MEAN = 0.976  # SPECint2006 geomean of average memory, Mesh vs glibc: -2.4 %
PAPER_PERLBENCH_PEAK = 564 / 664  # 400.perlbench peak RSS, Mesh vs glibc: -15 %
PAPER_FIREFOX_MEAN = 530 / 632  # Firefox mean heap during Speedometer, Mesh vs mozjemalloc: -16 %
METRICS = ("mean_pss", "peak_pss")
METRIC_TITLES = {"mean_pss": "mean PSS", "peak_pss": "peak PSS"}


# ---------------------------------------------------------------------------------------------
# Tables

def ratio_table(programs: Sequence[str], names: Sequence[str], results: Results, metric: str,
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
        row = [program, stat_text(results.stat(program, baseline, metric), 1, MIB) if baseline in names else NO_VALUE]
        for name in others:
            row.append(_ratio_cell(results, program, name, metric, baseline))
        if with_meshing:
            row.append(geomean_text(results.geomean([program], MESH_ON, MESH_OFF, metric)))
        rows.append(row)
    geomean_row = ["**geomean**", ""] + [geomean_text(results.geomean(programs, name, baseline, metric))
                                         if baseline else NO_VALUE for name in others]
    if with_meshing:
        geomean_row.append(geomean_text(results.geomean(programs, MESH_ON, MESH_OFF, metric)))
    rows.append(geomean_row)
    return markdown_table(header, rows)


def _ratio_cell(results: Results, program: str, name: str, metric: str, baseline: Optional[str]) -> str:
    runs = results.cell(program, name)
    value = results.ratio(program, name, metric)
    if value is None:
        return "failed" if runs and not any(run.ok for run in runs) else NO_VALUE
    paired = list(paired_ratios(results.by_repetition(program, name, metric),
                                results.by_repetition(program, baseline, metric)).values()) if baseline else []
    spread = Stat.of(paired) if len(paired) > 1 else None
    return range_text(value, spread.low if spread else None, spread.high if spread else None)


def absolute_table(programs: Sequence[str], names: Sequence[str], results: Results, metric: str) -> str:
    header = ["program"] + [f"{name} MiB" for name in names]
    rows = []
    for program in programs:
        row = [program]
        for name in names:
            runs = results.cell(program, name)
            text = stat_text(results.stat(program, name, metric), 1, MIB)
            failed = sum(not run.ok for run in runs)
            if failed:
                text += f" ({failed} failed)"
            row.append(text)
        rows.append(row)
    return markdown_table(header, rows)


# ---------------------------------------------------------------------------------------------
# Claims

def claims(programs: Sequence[str], results: Results, checked: bool) -> List[Claim]:
    """The paper's memory statements, against glibc and jemalloc whatever the tables' baseline."""
    found = Claims(checked)
    direction = "in spirit ({}): holds when meshalloc 3y uses less than {} (the direction, not the size)"

    def add(claim: str, paper: str, rows: Sequence[str], theirs: str, metric: str, note: str) -> None:
        value = results.geomean(rows, MESH_ON, theirs, metric)
        found.add(claim, paper, geomean_claim_text(value, len(rows)),
                  value.value < 1.0 if value.value is not None else None, note)

    add("meshalloc 3y mean memory vs glibc, geomean of the real programs",
        f"{PAPER_SPEC_MEAN:.3f}× (SPECint2006 geomean, −2.4 %)", programs, GLIBC, "mean_pss",
        direction.format("Debian programs, not SPECint2006; PSS, not RSS", "glibc"))
    if "perl" in programs:
        add("meshalloc 3y peak memory vs glibc, perl", f"{PAPER_PERLBENCH_PEAK:.2f}× (400.perlbench peak RSS, "
            "564 vs 664 MB)", ["perl"], GLIBC, "peak_pss",
            direction.format("our mail-filtering script, not perlbench; peak PSS", "glibc"))
    add("meshalloc 3y mean memory vs jemalloc, geomean of the real programs",
        f"{PAPER_FIREFOX_MEAN:.2f}× (Firefox, Speedometer: 530 vs 632 MB)", programs, JEMALLOC, "mean_pss",
        direction.format("Debian programs, not Firefox", "jemalloc"))
    return found.found


def figure(out, programs: Sequence[str], names: Sequence[str], results: Results, repetitions: int,
           baseline: Optional[str]) -> List:
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
                value = results.geomean(rows, name, baseline, metric)
                values.append(value.value)
                lows.append(value.low)
                highs.append(value.high)
            panel.series[name], panel.low[name], panel.high[name] = values, lows, highs
        panels.append(panel)
    title = (f"Memory of real programs relative to {baseline} (lower is less)\nmedian of {repetitions} "
             "interleaved run(s), whiskers = per-repetition range")
    return ratio_bar_chart(panels, f"÷ {baseline}", title, out / "memory")


# ---------------------------------------------------------------------------------------------
# The experiment: what it declares


class RealApps(ExperimentBase, Declared):
    modes = PARAMETERS
    allocators = ALLOCATORS
    smoke_allocators = SMOKE_ALLOCATORS
    alias = ALLOCATORS_VARIABLE
    baselines = (BASELINE,)
    reference = BASELINE
    workload_heading = "program"
    run_directory = "memory"
    run_columns = (("mean_pss_bytes", "mean_pss"), ("peak_pss_bytes", "peak_pss"),
                   ("cgroup_peak_bytes", "cgroup_peak"), "wall_s", "samples", "hz", "samples_tsv")
    columns = (Column("mean_pss", "mean PSS MiB", 1, MIB, ratio=True, tsv="mean_pss_bytes"),
               Column("peak_pss", "peak PSS MiB", 1, MIB, ratio=True, tsv="peak_pss_bytes"))

    def workloads(self, session: Session) -> list:
        programs, missing = available_programs()
        wanted = names_from(PROGRAMS_VARIABLE)
        if wanted:
            unknown = [name for name in wanted if name not in [program.name for program in programs]]
            if unknown:
                raise ExperimentUnavailable(f"{PROGRAMS_VARIABLE}: unknown or missing program(s) {', '.join(unknown)}")
            programs = [program for program in programs if program.name in wanted]
        if not programs:
            raise ExperimentUnavailable("none of the programs is installed: " + "; ".join(missing))
        session.notes += [f"Skipped program {line}" for line in missing]
        if GLIBC not in session.selection.names:
            session.notes.append(f"{GLIBC} did not run: the claims against it cannot be checked.")
        workloads, failures = program_workloads(session.context, programs, session.scratch, session.params.timeout_s)
        if not workloads:
            raise ExperimentUnavailable("no program runs here: " + "; ".join(failures))
        session.failures += failures
        return workloads

    def command(self, session: Session, workload, allocator) -> Command:
        return Command(workload.command, workload.env, workload.cwd, interval_s=PROGRAM_INTERVAL_S,
                       timeout_s=session.params.timeout_s)

    def parse(self, session: Session, run: Run) -> Dict[str, Any]:
        return memory_figures(run, session.out)

    def progress(self, run: Run) -> str:
        return memory_progress(run)

    def claims(self, session: Session, results: Results) -> List[Claim]:
        return claims(results.rows, results, session.checked)

    def notes(self, session: Session, results: Results) -> List[str]:
        notes = []
        if session.context.mode == SMOKE:
            notes.append("Smoke mode: tiny inputs, one repetition — a check that everything runs, not a measurement.")
        elif session.context.mode == QUICK:
            notes.append("Quick mode: inputs a quarter to a third of the full size, so the programs' fixed start-up "
                         "memory (interpreter, libraries, each allocator's own metadata) weighs more than in a full "
                         "run, and runs of about half a second leave a background mesher little time to act.")
        rates = [run.metric("hz") for run in results.runs if run.metric("hz")]
        if rates:
            notes.append(f"Samples achieved {min(rates):.0f}–{max(rates):.0f} Hz.")
        return notes

    def report(self, session: Session, results: Results, found: Sequence[Claim]) -> Report:
        rows, names, baseline, repetitions = results.rows, results.names, results.baseline, results.repetitions
        caption = (f"Each allocator's PSS over {baseline}'s (median of {repetitions} interleaved repetition(s); in "
                   "brackets the range of the per-repetition ratios); lower is less memory. PSS of the whole process "
                   "tree sampled every 10 ms; mean = time-weighted over the run. 3y ÷ 0n: what meshing (with "
                   "randomisation) saves over meshalloc without it.")
        main = "\n".join([f"**Mean PSS** (× {baseline})", "", ratio_table(rows, names, results, "mean_pss", baseline),
                          f"**Peak PSS** (× {baseline})", "", ratio_table(rows, names, results, "peak_pss", baseline)])
        markdown = "\n".join([
            f"# Real programs' memory ({session.context.mode} mode)", "", caption, "", main,
            f"## Mean PSS, MiB (median, min–max over {repetitions} run(s))", "",
            absolute_table(rows, names, results, "mean_pss"),
            f"## Peak PSS, MiB (median, min–max over {repetitions} run(s))", "",
            absolute_table(rows, names, results, "peak_pss"),
            "## Claims", "",
            claims_table(found),
            "## Programs", "",
            markdown_table(["program", "models", "command"],
                           ([workload.name, workload.pattern, f"`{workload.shown}`"] for workload in results.workloads),
                           left=3),
            *notes_section(session.notes, session.failures),
        ])
        return Report(caption + "\n\n" + main, markdown)

    def figures(self, session: Session, results: Results) -> list:
        return figure(session.out, results.rows, results.names, results, results.repetitions, results.baseline)

    def summary_details(self, session: Session, results: Results) -> Dict[str, Any]:
        return {"allocators": [allocator_json(allocator) for allocator in results.allocators],
                "programs": [{"name": workload.name, "command": workload.command, "models": workload.pattern,
                              "reference_output": workload.reference} for workload in results.workloads]}


EXPERIMENT = RealApps(name=NAME, title="Real programs' memory",
                      paper="Mesh §6.2.3 in spirit (SPEC and Firefox replaced by Debian programs)")
