"""`meshalloc bench ruby-strings`: the Mesh paper's Ruby microbenchmark (§6.3, figure 8).

bench/ruby/strings.rb, run on Debian's `ruby`, allocates rounds of equally long strings,
keeps every fourth one and drops the rest, doubling the length each round. MRI mallocs every
string's contents, so each round leaves the pages of one size class a quarter full. Only a
meshing allocator can give those pages back, and only if the survivors sit at different
offsets on different pages -- which randomised placement gives and address-ordered placement
does not. The paper runs Mesh with meshing off (0n), with meshing but no randomisation (0y)
and with both (2y) against jemalloc and glibc; so does this module, interleaved and repeated
through the driver (driver.py), and checks every run's printed result. See docs/ruby-strings.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import allocators as allocator_registry
from ..compare import Comparison, RunRecord, build_table
from ..measure import DEFAULT_INTERVAL_S
from ..output import markdown_table, write_comparison
from ..plotting import plot_comparison
from . import report
from .claims import claims_table
from .common import KEY_VALUE, ExperimentBase
from .framework import (FULL, QUICK, SMOKE, STDOUT, Claim, Command, Declared, ExperimentUnavailable, Parameters,
                        Report, Results, Run, RunFailed, Session)
from .report import size_text, stat_text, write_tsv
from .stats import Stat

NAME = "ruby-strings"
SCRIPT = Path("bench") / "ruby" / "strings.rb"
RUBY = "ruby"
SETUP_HINT = "scripts/setup.sh installs Debian's ruby"

# The workload's parameters. The paper's: strings from 512 bytes up, a 128 MB first batch,
# one string in four kept, 0.2 s of "work" after each round (the artifact's frag.rb).
PAPER_BUDGET_MB = 128.0
PAPER_FIRST_SIZE = 512
PAPER_KEEP_EVERY = 4
PAPER_PAUSE_MS = 200
# Smoke: the same rounds on a budget small enough to finish in a fraction of a second.
SMOKE_BUDGET_MB = 4.0
SMOKE_PAUSE_MS = 20

# The configurations, in the order they run within a repetition and appear in the table.
JEMALLOC = "jemalloc"
GLIBC = "glibc"
MESH_OFF = allocator_registry.MESH_OFF
MESH_NO_RANDOM = "meshalloc:0y"
MESH_FULL = "meshalloc:2y"
PAPER_CONFIGS = (JEMALLOC, GLIBC, MESH_OFF, MESH_NO_RANDOM, MESH_FULL)
# Not a paper configuration: meshalloc's defaults, whose rotated runs (docs/heap.md) leave
# each span a shifted copy of the one-in-four pattern, which meshes with the other shifts.
MESH_DEFAULT = allocator_registry.MESH_DEFAULT
# Not a paper configuration: meshalloc 2y with a larger share of a core for meshing.
# meshalloc caps meshing at mesh_budget_permille (20: 2 %) of a core; this run at 20 %
# shows how much of any gap to the paper that cap explains, i.e. whether the pages are
# meshable at all. Quick and full only: smoke runs are too short for a second pass.
GENEROUS_BUDGET_PERMILLE = 200
MESH_GENEROUS = f"meshalloc:2y+mesh_budget_permille={GENEROUS_BUDGET_PERMILLE}"
ALLOCATORS = PAPER_CONFIGS + (MESH_DEFAULT, MESH_GENEROUS)
SMOKE_ALLOCATORS = PAPER_CONFIGS + (MESH_DEFAULT,)
# The reference for ratios: the paper's figure 8 is against jemalloc ("for this benchmark,
# jemalloc and glibc are essentially indistinguishable"); glibc stands in when it is missing.
BASELINES = (JEMALLOC, GLIBC)

# A run that takes longer than this is killed and reported failed (full takes a few seconds).
TIMEOUT_S = 600.0

# What the paper reports (§6.3 and the caption of figure 8). The artifact's reference run
# (mesh-testsuite reference-results/3-ruby) had 2y at 0.835x and 0y at 1.007x jemalloc's mean
# heap, 1.06x its time for 2y and 1.03x for 0y.
PAPER_2Y_HEAP = 0.81  # "a 19% reduction" of the mean heap vs jemalloc
PAPER_2Y_VS_0Y_HEAP = 0.82  # caption: "decrease mean heap size by 18% compared to Mesh with randomization disabled"
PAPER_0Y_HEAP = 0.97  # "only a modest 3% reduction in heap size"
PAPER_SIMILAR = 1.00  # 0n vs jemalloc, glibc vs jemalloc: "similar", "essentially indistinguishable"
PAPER_2Y_TIME = 1.107  # "increases the time overhead to 10.7% compared to jemalloc"
PAPER_0Y_TIME = 1.04  # "imposes a 4% runtime overhead"
# How each kind of claim is judged. A reduction is reproduced when at least this share of
# it is measured; "similar" means within this much of the paper's ratio; a time overhead
# holds up to the paper's plus this much (run-to-run noise on a shared 2-CPU machine).
REDUCTION_SHARE = 0.5
SIMILAR_TOLERANCE = 0.10
TIME_SLACK = 0.05

# The workload's last line: `strings key=value ...`.
RESULT_LINE = re.compile(r"^strings (?P<fields>.*)$", re.MULTILINE)
WORKLOAD_COLUMNS = ("order", "allocator", "repetition", "exit_code", "checked", "rounds", "allocated_bytes",
                    "retained_strings", "retained_bytes", "checksum", "expected_checksum", "work_s", "paused_s",
                    "total_s", "problem")


@dataclass(frozen=True)
class Workload:
    """The parameters of bench/ruby/strings.rb, and what it must print for them."""

    budget_mb: float
    first_size: int
    keep_every: int
    pause_ms: int

    @property
    def budget_bytes(self) -> int:
        return int(self.budget_mb * (1 << 20))

    def arguments(self) -> List[str]:
        return ["--budget-mb", f"{self.budget_mb:g}", "--first-size", str(self.first_size),
                "--keep-every", str(self.keep_every), "--pause-ms", str(self.pause_ms)]

    def rounds(self) -> List[Tuple[int, int]]:
        """(size, count) of each round, computed here independently of the Ruby script: the
        batch halves and the size doubles until the batch is smaller than one string."""
        plan = []
        size = self.first_size
        while (self.budget_bytes >> len(plan)) >= size:
            plan.append((size, (self.budget_bytes >> len(plan)) // size))
            size *= 2
        return plan

    def expected(self) -> Dict[str, int]:
        plan = self.rounds()
        kept = [(size, -(-count // self.keep_every)) for size, count in plan]  # every keep_every-th from 0
        return {
            "rounds": len(plan),
            "allocated_bytes": sum(size * count for size, count in plan),
            "retained_strings": sum(count for _, count in kept),
            "retained_bytes": sum(size * count for size, count in kept),
        }

    def describe(self) -> str:
        plan = self.rounds()
        last = plan[-1][0] if plan else self.first_size
        return (f"{len(plan)} rounds of strings from {size_text(self.first_size)} to {size_text(last)}, first batch "
                f"{self.budget_mb:g} MiB and each later one half the one before, one string in {self.keep_every} "
                f"kept, {self.pause_ms} ms pause after each round")


@dataclass(frozen=True)
class RubyParameters(Parameters):
    budget_mb: float = PAPER_BUDGET_MB
    pause_ms: int = PAPER_PAUSE_MS

    def workload(self) -> Workload:
        return Workload(self.budget_mb, PAPER_FIRST_SIZE, PAPER_KEEP_EVERY, self.pause_ms)


# full: the artifact's own default (--runs 5).
PARAMETERS = {SMOKE: RubyParameters(1, budget_mb=SMOKE_BUDGET_MB, pause_ms=SMOKE_PAUSE_MS), QUICK: RubyParameters(2),
              FULL: RubyParameters(5)}


def ruby_version(ruby: str) -> str:
    try:
        return subprocess.run([ruby, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Checking what each run printed

@dataclass
class Check:
    """One run's printed result against what the parameters imply."""

    run: Run
    fields: Dict[str, str]
    problem: str  # empty when the run is good

    @property
    def ok(self) -> bool:
        return not self.problem

    def number(self, key: str) -> Optional[float]:
        try:
            return float(self.fields[key])
        except (KeyError, ValueError):
            return None


def check_output(text: str, load: Workload) -> Tuple[Dict[str, str], str]:
    """The fields of the run's `strings ...` line, and what is wrong with them ("" if nothing)."""
    found = RESULT_LINE.findall(text)
    if not found:
        return {}, "no `strings ...` result line in the output"
    fields = dict(KEY_VALUE.findall(found[-1]))
    problems = []
    if fields.get("ok") != "1" or fields.get("checksum") != fields.get("expected"):
        problems.append(f"survivors' checksum {fields.get('checksum')} != expected {fields.get('expected')}")
    for key, value in load.expected().items():
        if fields.get(key) != str(value):
            problems.append(f"{key}={fields.get(key)} (expected {value})")
    return fields, "; ".join(problems)


def write_checks(checks: Sequence[Check], path: Path) -> Path:
    def row(check: Check) -> List[Any]:
        fields, result = check.fields, check.run.result
        return [check.run.order, check.run.allocator.name, check.run.repetition, result.exit_code if result else "",
                int(check.ok), fields.get("rounds", ""), fields.get("allocated_bytes", ""),
                fields.get("retained_strings", ""), fields.get("retained_bytes", ""), fields.get("checksum", ""),
                fields.get("expected", ""), fields.get("work_s", ""), fields.get("paused_s", ""),
                fields.get("total_s", ""), check.problem]

    return write_tsv(path, WORKLOAD_COLUMNS, (row(check) for check in checks))


def comparison_of(results: Results, command: Sequence[str]) -> Comparison:
    """The runs as `meshalloc compare` tabulates them (output.write_comparison, the figure)."""
    comparison = Comparison(list(command), list(results.allocators), results.baseline or results.names[0],
                            results.repetitions, DEFAULT_INTERVAL_S)
    comparison.runs = [RunRecord(run.allocator.name, run.repetition, run.order, run.result,
                                 run.directory / STDOUT) for run in results.runs if run.result is not None]
    comparison.rows = build_table(comparison.runs, results.names, comparison.baseline)
    return comparison


# ---------------------------------------------------------------------------------------------
# Numbers

def per_run(comparison: Comparison, name: str, metric: str) -> Dict[int, float]:
    """repetition -> one successful run's value: mean_pss (bytes) or time (seconds)."""
    values = {}
    for run in comparison.runs:
        if run.allocator != name or not run.result.succeeded:
            continue
        if metric == "time":
            values[run.repetition] = run.result.wall_time
        else:
            summary = run.result.summary("pss")
            if summary is not None:
                values[run.repetition] = summary.mean
    return values


@dataclass
class Ratio:
    """mine / theirs: the ratio of the medians (as in the table), and the spread of the
    ratios of runs of the same repetition -- interleaved, so they ran side by side."""

    median: float
    paired: Stat
    pairs: int

    def text(self) -> str:
        spread = (f" ({self.paired.low:.2f}–{self.paired.high:.2f} per repetition, {self.pairs} runs)"
                  if self.pairs > 1 else f" ({self.pairs} run)")
        return f"{self.median:.2f}×{spread}"


def ratio(comparison: Comparison, mine: str, theirs: str, metric: str) -> Optional[Ratio]:
    mine_runs, their_runs = per_run(comparison, mine, metric), per_run(comparison, theirs, metric)
    top, bottom = Stat.of(list(mine_runs.values())), Stat.of(list(their_runs.values()))
    paired = Stat.of([mine_runs[rep] / their_runs[rep] for rep in mine_runs if their_runs.get(rep)])
    if top is None or bottom is None or not bottom.median or paired is None:
        return None
    return Ratio(top.median / bottom.median, paired, sum(1 for rep in mine_runs if their_runs.get(rep)))


def work_table(comparison: Comparison, checks: Sequence[Check], baseline: str) -> str:
    """The workload's own timing: work_s excludes the pauses, which every allocator sleeps
    alike, so the allocator's share of the run shows better than in the wall time."""
    show_range = comparison.repeat > 1
    rows = []
    work: Dict[str, Optional[Stat]] = {}
    for allocator in comparison.allocators:
        mine = [check for check in checks if check.run.allocator.name == allocator.name]
        work[allocator.name] = Stat.of([check.number("work_s") for check in mine if check.ok])
    base = work.get(baseline)
    for allocator in comparison.allocators:
        mine = [check for check in checks if check.run.allocator.name == allocator.name]
        stat = work[allocator.name]
        row = comparison.row(allocator.name)
        rows.append([allocator.name + (" (baseline)" if allocator.name == baseline else ""),
                     f"{sum(check.ok for check in mine)}/{len(mine)}", stat_text(stat, 3, show_range=show_range),
                     f"{stat.median / base.median:.2f}" if stat and base and base.median else "—",
                     stat_text(row.time if row else None, 3, show_range=show_range)])
    return report.markdown_table(["allocator", "checked", "work s", "work ×", "wall s"], rows)


# ---------------------------------------------------------------------------------------------
# Claims

def claims(comparison: Comparison, baseline: str, checked: bool) -> List[Claim]:
    """Figure 8's statements, each with this machine's ratio and spread. With checked False
    (smoke: a few MiB, no time to mesh), every verdict is None."""
    present = {allocator.name for allocator in comparison.allocators}
    result: List[Claim] = []
    stand_in = ("" if baseline == JEMALLOC
                else f"; jemalloc is missing, so against {baseline} (the paper: the two are indistinguishable here)")

    def add(claim: str, paper: str, mine: str, theirs: str, metric: str, judge, rule: str, note: str = "") -> None:
        found = ratio(comparison, mine, theirs, metric) if mine in present and theirs in present else None
        ours = found.text() if found else "—"
        holds = judge(found.median) if found else None
        text = "; ".join(part for part in (rule, note) if part)
        if found is None:
            missing = [name for name in (mine, theirs) if name not in present]
            text = (f"not measured: {', '.join(missing)} not available" if missing
                    else "not measured: no successful pair of runs") + (f"; {note}" if note else "")
        if not checked:
            holds = None
            text = "smoke run (tiny parameters): not checked"
        result.append(Claim(claim, paper, ours, holds, text))

    def reduction(paper: float):
        bound = 1 - (1 - paper) * REDUCTION_SHARE
        return (lambda value: value <= bound), f"holds at ≤ {bound:.3f}× (at least half the paper's reduction)"

    def similar(paper: float):
        return ((lambda value: abs(value - paper) <= SIMILAR_TOLERANCE),
                f"holds within ±{SIMILAR_TOLERANCE:.2f} of {paper:.2f}×")

    def overhead(paper: float):
        bound = paper + TIME_SLACK
        return (lambda value: value <= bound), f"holds at ≤ {bound:.3f}× (the paper's + {TIME_SLACK:.2f})"

    judge, rule = reduction(PAPER_2Y_HEAP)
    add(f"meshalloc 2y mean heap (PSS) vs {baseline}", f"{PAPER_2Y_HEAP:.2f}× (19 % less)", MESH_FULL, baseline,
        "mean_pss", judge, rule, "artifact's reference run: 0.835×" + stand_in)
    if baseline != GLIBC:
        add("meshalloc 2y mean heap (PSS) vs glibc", f"{PAPER_2Y_HEAP:.2f}× (glibc ≈ jemalloc)", MESH_FULL, GLIBC,
            "mean_pss", judge, rule, "artifact's reference run: 0.835× glibc")
    judge, rule = reduction(PAPER_2Y_VS_0Y_HEAP)
    add("randomisation's value: meshalloc 2y mean heap vs 0y", f"{PAPER_2Y_VS_0Y_HEAP:.2f}× (18 % less)", MESH_FULL,
        MESH_NO_RANDOM, "mean_pss", judge, rule, "artifact's reference run: 0.83×")
    judge, rule = similar(PAPER_0Y_HEAP)
    add(f"meshing without randomisation: meshalloc 0y mean heap vs {baseline}",
        f"{PAPER_0Y_HEAP:.2f}× (only 3 % less)", MESH_NO_RANDOM, baseline, "mean_pss", judge, rule,
        "artifact's reference run: 1.007×" + stand_in)
    judge, rule = similar(PAPER_SIMILAR)
    add(f"meshing off: meshalloc 0n mean heap vs {baseline}", "≈1.00× (similar)", MESH_OFF, baseline, "mean_pss",
        judge, rule, "artifact's reference run: 1.020×" + stand_in)
    if baseline != GLIBC:
        add("glibc mean heap vs jemalloc", "≈1.00× (essentially indistinguishable)", GLIBC, JEMALLOC, "mean_pss",
            judge, rule, "artifact's reference run: 1.000×")
    judge, rule = overhead(PAPER_SIMILAR)
    add(f"meshalloc 0n time vs {baseline}", "≈1.00× (similar runtime)", MESH_OFF, baseline, "time", judge, rule,
        "wall time, pauses included, as in the paper" + stand_in)
    judge, rule = overhead(PAPER_0Y_TIME)
    add(f"meshalloc 0y time vs {baseline}", f"{PAPER_0Y_TIME:.2f}× (4 % overhead)", MESH_NO_RANDOM, baseline,
        "time", judge, rule, "wall time, pauses included, as in the paper" + stand_in)
    judge, rule = overhead(PAPER_2Y_TIME)
    add(f"meshalloc 2y time vs {baseline}", f"{PAPER_2Y_TIME:.3f}× (10.7 % overhead)", MESH_FULL, baseline,
        "time", judge, rule, "wall time, pauses included, as in the paper" + stand_in)
    if MESH_DEFAULT in present:
        judge, rule = reduction(PAPER_2Y_HEAP)
        add(f"not a paper configuration: meshalloc 3y (the defaults: rotated runs) mean heap vs {baseline}",
            f"{PAPER_2Y_HEAP:.2f}× (Mesh 2y)", MESH_DEFAULT, baseline, "mean_pss", judge, rule,
            "each span's slots in address order from a random one, instead of every object placed "
            "independently" + stand_in)
    if MESH_GENEROUS in present:
        judge, rule = reduction(PAPER_2Y_HEAP)
        add(f"not a paper configuration: meshalloc 2y with a {GENEROUS_BUDGET_PERMILLE / 10:g} % meshing CPU "
            f"budget, mean heap vs {baseline}", f"{PAPER_2Y_HEAP:.2f}× (Mesh 2y)", MESH_GENEROUS, baseline,
            "mean_pss", judge, rule,
            f"mesh_budget_permille={GENEROUS_BUDGET_PERMILLE} instead of the default 20 (2 % of a core): "
            "how much of the 2y result the CPU cap explains" + stand_in)
    return result


# ---------------------------------------------------------------------------------------------
# The experiment

class RubyStrings(ExperimentBase, Declared):
    modes = PARAMETERS
    allocators = ALLOCATORS
    smoke_allocators = SMOKE_ALLOCATORS
    baselines = BASELINES
    run_directory = "logs"

    def workloads(self, session: Session) -> List[Workload]:
        if shutil.which(RUBY) is None:
            raise ExperimentUnavailable(f"`{RUBY}` is not installed ({SETUP_HINT})")
        if not (session.context.root / SCRIPT).is_file():
            raise ExperimentUnavailable(f"{session.context.root / SCRIPT} is missing")
        if session.baseline is None:
            raise ExperimentUnavailable("neither jemalloc nor glibc can run here: "
                                        + "; ".join(session.selection.skipped))
        load = session.params.workload()
        session.context.log(f"{load.describe()}; baseline {session.baseline}")
        return [load]

    def workload_name(self, workload: Workload) -> str:
        return "strings"

    def command(self, session: Session, workload: Workload, allocator) -> Command:
        return Command([shutil.which(RUBY) or RUBY, str(session.context.root / SCRIPT), *workload.arguments()],
                       interval_s=DEFAULT_INTERVAL_S, timeout_s=TIMEOUT_S)

    def parse(self, session: Session, run: Run) -> Dict[str, Any]:
        fields, problem = check_output(run.stdout, run.workload)
        if problem:
            raise RunFailed(problem, fields)
        return fields

    def claims(self, session: Session, results: Results) -> List[Claim]:
        return claims(comparison_of(results, []), results.baseline, checked=session.checked)

    def notes(self, session: Session, results: Results) -> List[str]:
        notes = [f"{ruby_version(RUBY)}; the workload's printed sizes and checksum are checked after every run "
                 "(workload.tsv)."]
        if MESH_GENEROUS in results.names:
            notes.append(f"{MESH_GENEROUS} is not one of the paper's configurations: meshalloc 2y with "
                         f"mesh_budget_permille={GENEROUS_BUDGET_PERMILLE} (20 % of a core for meshing instead of "
                         "2 %).")
        return notes

    def report(self, session: Session, results: Results, found: Sequence[Claim]) -> Report:
        out, load = session.out, results.workloads[0]
        comparison = comparison_of(results, self.command(session, load, results.allocators[0]).argv)
        files = list(write_comparison(comparison, out).values())
        checks = [Check(run, {key: str(value) for key, value in run.figures.items()},
                        "" if run.ok else run.status) for run in results.runs]
        files.append(write_checks(checks, out / "workload.tsv"))
        files += plot_comparison(comparison, out / "memory")
        heading = (f"{load.describe()}. {results.repetitions} interleaved repetition(s) per "
                   f"configuration; ratios against {comparison.baseline}.")
        table_md = (heading + "\n\n" + markdown_table(comparison) + "\nThe workload's own timing (work: the rounds "
                    "without their pauses; checked: runs whose printed sizes and checksum matched):\n\n"
                    + work_table(comparison, checks, comparison.baseline))
        written = out / "report.md"
        written.write_text(f"# {self.title} ({self.paper})\n\n{datetime.now().isoformat(timespec='seconds')}, "
                           f"mode {session.context.mode}\n\n" + table_md + "\n## Claims\n\n" + claims_table(found)
                           + ("\n## Notes\n\n" + "\n".join(f"- {note}" for note in session.notes) + "\n")
                           + ("\n## Failures\n\n" + "\n".join(f"- {line}" for line in session.failures) + "\n"
                              if session.failures else "")
                           + "\n![PSS over time](memory.svg)\n")
        return Report(table_md, files=files + [written])


EXPERIMENT = RubyStrings(name=NAME, title="Ruby string retention", paper="Mesh §6.3, figure 8")
