"""The one driver of declared experiments (framework.Declared): everything an experiment does
not declare.

drive() takes the mode's parameters (--repeat replacing their repetition count), chooses the
allocators (--allocators, --baseline, the alias variable), asks the experiment for its
workloads, runs every workload × allocator × repetition through the scheduler (interleaved or
rotated, as the parameters say), measures each run as its Command says (sampled or timed),
hands a run that exited cleanly to parse(), turns every run that did not into one failure line
while the others go on, and writes what every experiment writes: runs.tsv (the declared
run_columns), table.tsv (the declared columns: median, min, max, ratio), table.md, the
figures, summary.json and the Outcome whose table, claims, notes and failures SUMMARY.md shows.

`meshalloc compare` measures its runs with measure_run() too.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, List, Sequence

from ..allocators import Allocator
from ..errors import MeshallocError
from ..measure import RunResult
from ..output import write_run
from . import schedule
from .claims import claims_table
from .common import choose_allocators, machine_notes
from .framework import (SAMPLED, STDERR, STDOUT, TIMED, Command, Context, Declared, ExperimentUnavailable, Outcome,
                        Pass, Report, Results, Run, RunFailed, Session)
from .programs import PRELOAD_FAILURE, memory_run, timed_run
from .report import NO_VALUE, markdown_table, notes_section, number, stat_text, write_summary_json, write_tsv

RUNS_FILE, TABLE_TSV, TABLE_MD = "runs.tsv", "table.tsv", "table.md"
STDERR_EXCERPT = 300  # characters of a failed run's stderr (its end) kept in its failure line
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(name: str) -> str:
    """A name as a file or directory name."""
    return UNSAFE.sub("_", name)


# ---------------------------------------------------------------------------------------------
# One run


def measure_run(command: Command, allocator: Allocator, directory: Path) -> Run:
    """Run `command` once under `allocator` into `directory` (created): stdout.txt and
    stderr.txt, and for a sampled run samples.tsv and summary.json. The Run's status says why
    it failed, if it did; a Ctrl-C that reached the command raises KeyboardInterrupt."""
    directory.mkdir(parents=True, exist_ok=True)
    run = Run(workload=None, workload_name="", allocator=allocator, repetition=0, order=0, directory=directory)
    if command.measure == TIMED:
        timed = timed_run(command.argv, allocator, command.cwd, command.env, command.timeout_s)
        (directory / STDOUT).write_text(timed.stdout)
        (directory / STDERR).write_text(timed.stderr_tail)
        run.status, run.seconds = timed.status, timed.seconds
        if not run.ok and timed.stderr_tail:
            run.status += ": " + " ".join(timed.stderr_tail.split())
        return run
    if command.measure != SAMPLED:
        raise ValueError(f"unknown measurement {command.measure!r}")
    try:
        with open(directory / STDOUT, "wb") as output, open(directory / STDERR, "wb") as errors:
            run.result = sample(command, allocator, output, errors)
    except MeshallocError as error:
        run.status = f"cannot start: {error}"
        return run
    write_run(run.result, directory)
    if run.result.interrupted:  # Ctrl-C reached the command: stop here
        raise KeyboardInterrupt
    run.seconds = run.result.wall_time
    errors = (directory / STDERR).read_text(errors="replace")
    if not run.result.succeeded:
        excerpt = " ".join(errors.split())[-STDERR_EXCERPT:]
        run.status = run.result.describe_exit() + (f": {excerpt}" if excerpt else "")
    elif PRELOAD_FAILURE in errors:
        run.status = "the allocator was not preloaded"
    return run


def sample(command: Command, allocator: Allocator, stdout, stderr) -> RunResult:
    """One sampled run of `command` (programs.memory_run), its output where subprocess is told
    (an open file, DEVNULL, STDOUT): what measure_run and `meshalloc compare` both measure with."""
    return memory_run(command.argv, allocator, command.cwd, command.env, command.interval_s, command.timeout_s,
                      stdout, stderr, command.use_cgroup)


def failure_line(run: Run) -> str:
    head = f"{run.pass_name}: " if run.pass_name else ""
    return f"{head}{run.workload_name} under {run.allocator.name} (repetition {run.repetition}): {run.status}"


# ---------------------------------------------------------------------------------------------
# The experiment


def parameters(experiment: Declared, context: Context) -> Any:
    """The mode's parameters, with --repeat's repetition count when given."""
    params = experiment.parameters(context.mode)
    if context.repeat is not None:
        params = replace(params, repetitions=context.repeat)
    if params.repetitions < 1:
        raise ExperimentUnavailable("the repetition count must be at least 1")
    return params


def execute_all(experiment: Declared, session: Session, workloads: Sequence[Any]) -> Results:
    """Every run of every pass, each parsed; failures go to session.failures."""
    allocators = session.selection.allocators
    results = Results(list(workloads), [experiment.workload_name(workload) for workload in workloads],
                      list(allocators), session.baseline, session.params.repetitions)
    for one in experiment.passes(session.params):
        session.current_pass = one
        results.runs += execute_pass(experiment, session, workloads, one)
    session.failures += [failure_line(run) for run in results.runs if not run.ok]
    return results


def run_directories(experiment: Declared, session: Session) -> List[str]:
    """Where each pass keeps its runs' directories (under the output directory)."""
    return list(dict.fromkeys(one.directory or experiment.run_directory
                              for one in experiment.passes(session.params)))


def execute_pass(experiment: Declared, session: Session, workloads: Sequence[Any], one: Pass) -> List[Run]:
    context = session.context
    head = f"{one.name} " if one.name else ""

    def execute(slot: schedule.Slot) -> Run:
        name = experiment.workload_name(slot.workload)
        directory = (context.out / (one.directory or experiment.run_directory) / slug(name)
                     / f"{slug(slot.allocator.name)}-r{slot.repetition}")
        run = measure_run(experiment.command(session, slot.workload, slot.allocator), slot.allocator, directory)
        run.workload, run.workload_name, run.repetition, run.order = slot.workload, name, slot.repetition, slot.order
        run.pass_name = one.name
        # Every run is parsed, a failed one too: what it printed before failing belongs in runs.tsv.
        try:
            run.figures = dict(experiment.parse(session, run))
        except RunFailed as failed:
            run.figures = dict(failed.figures)
            if run.ok:
                run.status = str(failed) or "the run's output is wrong"
        return run

    def describe(done: schedule.Done[Run]) -> str:
        done.result.load = done.load
        return experiment.progress(done.result)

    slots = schedule.plan(workloads, session.selection.allocators, one.repetitions, one.order)
    done = schedule.run(slots, execute, context.log, describe,
                        group=lambda slot: (f"{head}{experiment.workload_name(slot.workload)} "
                                            f"[{slot.repetition}/{one.repetitions}]"),
                        separator=experiment.progress_separator)
    for finished in done:
        finished.result.load = finished.load
    return [finished.result for finished in done]


def drive(experiment: Declared, context: Context) -> Outcome:
    """Run a declared experiment from its parameters to its Outcome."""
    params = parameters(experiment, context)
    load_start = schedule.load_average()
    selection = choose_allocators(context, experiment.allocators, experiment.smoke_allocators, experiment.alias,
                                  experiment.baselines)
    with tempfile.TemporaryDirectory(prefix=f"meshalloc-{slug(experiment.name)}-") as scratch:
        session = Session(context, params, selection, Path(scratch), notes=selection.notes(experiment.reference),
                          load_start=load_start)
        workloads = list(experiment.workloads(session))
        if not workloads:
            raise ExperimentUnavailable("nothing to run here: " + "; ".join(session.failures or session.notes))
        context.log(f"{len(workloads)} {experiment.workload_heading}(s) × {len(selection.allocators)} allocator(s) "
                    f"× {params.repetitions} repetition(s)")
        results = execute_all(experiment, session, workloads)
    found = experiment.claims(session, results)
    notes = session.notes + experiment.notes(session, results)
    notes += machine_notes(selection.allocators, experiment.machine_threads(session), load_start)
    session.notes = notes

    out = context.out
    files: List[Path] = []
    if experiment.run_columns:
        files.append(write_runs(experiment, results, out / RUNS_FILE))
    if experiment.columns:
        files.append(write_table_tsv(experiment, results, out / TABLE_TSV))
    report = experiment.report(session, results, found) or default_report(experiment, session, results, found)
    files += report.files
    if report.markdown is not None:
        (out / TABLE_MD).write_text(report.markdown)
        files.append(out / TABLE_MD)
    files += experiment.figures(session, results)
    details = experiment.summary_details(session, results)
    if details is not None:
        files.append(write_summary_json(out, experiment.name, context.mode, params.repetitions, found, **details))
    files += [out / directory for directory in run_directories(experiment, session) if (out / directory).is_dir()]
    return Outcome(repetitions=params.repetitions, claims=found, table_md=report.table_md, files=files,
                   failures=list(session.failures), notes=notes)


# ---------------------------------------------------------------------------------------------
# What every declared experiment writes


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return number(value)
    return str(value)


def write_runs(experiment: Declared, results: Results, path: Path) -> Path:
    """Every run: its place in the schedule, its status and its declared figures."""
    pairs = [(column, column) if isinstance(column, str) else tuple(column) for column in experiment.run_columns]
    header = [experiment.workload_heading, "allocator", "repetition", "order", "status"] + [name for name, _ in pairs]
    return write_tsv(path, header, ([run.workload_name, run.allocator.name, str(run.repetition), str(run.order),
                                     run.status, *(_cell_text(run.figures.get(key)) for _, key in pairs)]
                                    for run in results.runs))


def write_table_tsv(experiment: Declared, results: Results, path: Path) -> Path:
    """One row per (workload, allocator): runs, successful runs, and each column's median,
    min, max (and ratio to the baseline's median where the column has one)."""
    header = [experiment.workload_heading, "allocator", "runs", "succeeded"]
    for column in experiment.columns:
        header += [column.tsv or column.key, f"{column.key}_min", f"{column.key}_max"]
        if column.ratio:
            header.append(f"{column.key}_ratio_to_{results.baseline or 'none'}")
    rows = []
    for row in results.rows:
        for name in results.names:
            runs = results.cell(row, name)
            cells = [row, name, str(len(runs)), str(sum(run.ok for run in runs))]
            for column in experiment.columns:
                stat = results.stat(row, name, column.key)
                cells += [number(stat.median), number(stat.low), number(stat.high)] if stat else ["", "", ""]
                if column.ratio:
                    cells.append(number(results.ratio(row, name, column.key)))
            rows.append(cells)
    return write_tsv(path, header, rows)


def default_table(experiment: Declared, results: Results) -> str:
    """The declared columns as Markdown: median (min–max) of each cell's successful runs."""
    header = [experiment.workload_heading, "allocator", "succeeded"] + [column.heading for column in experiment.columns]
    rows = []
    for row in results.rows:
        for name in results.names:
            runs = results.cell(row, name)
            rows.append([row, name, f"{sum(run.ok for run in runs)}/{len(runs)}"]
                        + [stat_text(results.stat(row, name, column.key), column.decimals, column.scale)
                           for column in experiment.columns])
    return markdown_table(header, rows, left=2)


def default_report(experiment: Declared, session: Session, results: Results, found: Sequence[Any]) -> Report:
    caption = (f"Median (min–max) over {results.repetitions} {session.params.order} repetition(s) of each "
               f"{experiment.workload_heading} under each allocator.")
    table = caption + "\n\n" + (default_table(experiment, results) if experiment.columns else NO_VALUE + "\n")
    markdown = "\n".join([f"# {experiment.title} ({session.context.mode} mode)", "", table, "## Claims", "",
                          claims_table(found), *notes_section(session.notes, session.failures)])
    return Report(table_md=table, markdown=markdown)
