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

`meshalloc compare` runs on the same loop (run_schedule) and measurement (measure_run).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..allocators import Allocator
from ..errors import MeshallocError
from ..measure import RunResult
from ..output import write_run
from . import schedule
from .claims import claims_table
from .common import machine_notes
from .framework import (MEASUREMENTS, OK, STDERR, STDOUT, TIMED, Command, Context, Declared, ExperimentUnavailable,
                        Outcome, Pass, Report, Results, Run, RunFailed, Served, Session)
from .programs import PRELOAD_FAILURE, exit_status, kill_group, memory_run, timed_run
from .report import NO_VALUE, markdown_table, notes_section, number, stat_text, write_summary_json, write_tsv

RUNS_FILE, TABLE_TSV, TABLE_MD = "runs.tsv", "table.tsv", "table.md"
STDERR_EXCERPT = 300  # characters of a failed run's stderr (its end) kept in its failure line
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(name: str) -> str:
    """A name as a file or directory name."""
    return UNSAFE.sub("_", name)


# ---------------------------------------------------------------------------------------------
# One run


def measure_run(command: Command, allocator: Any, directory: Optional[Path], kind: str = "",
                log: Optional[Path] = None) -> Run:
    """Run `command` once under `allocator` (or the Command's own) into `directory` (created):
    stdout.txt and stderr.txt (prefixed with `kind` for a slot's later kinds), and for a sampled
    run samples.tsv and summary.json. With directory None nothing is written but `log`, stdout
    and stderr together (`meshalloc compare`'s log files), or nothing at all. A Command with a
    client runs it beside the program (run_client). The Run's status says why it failed."""
    preload = command.allocator or allocator
    run = Run(workload=None, workload_name="", allocator=allocator, repetition=0, order=0,
              directory=directory if directory is not None else (log.parent if log else Path(".")), kind=kind)
    prefix = f"{kind}-" if kind else ""
    out_name, err_name = prefix + STDOUT, prefix + STDERR
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    if command.measure == TIMED and command.client is None:
        timed = timed_run(command.argv, preload, command.cwd, command.env, command.timeout_s, command.inherit_env)
        if directory is not None:
            (directory / out_name).write_text(timed.stdout)
            (directory / err_name).write_text(timed.stderr_tail)
        run.status, run.seconds = timed.status, timed.seconds
        if not run.ok and timed.stderr_tail:
            run.status += ": " + " ".join(timed.stderr_tail.split())
        return run
    if command.measure not in MEASUREMENTS:
        raise ValueError(f"unknown measurement {command.measure!r}")
    with contextlib.ExitStack() as files:
        if directory is not None:
            output, errors = (files.enter_context(open(directory / name, "wb")) for name in (out_name, err_name))
        elif log is not None:
            output, errors = files.enter_context(open(log, "wb")), subprocess.STDOUT
        else:
            output, errors = subprocess.DEVNULL, subprocess.DEVNULL
        try:
            if command.measure == TIMED:
                run.status, run.seconds = served_timed_run(command, preload, run, output, errors)
            else:
                with run_client(command, run):
                    run.result = sample(command, preload, output, errors)
        except MeshallocError as error:
            run.status = f"cannot start: {error}"
            return run
    if run.result is None:
        return run
    if directory is not None:
        write_run(run.result, directory)
    run.seconds = run.result.wall_time
    text = (directory / err_name).read_text(errors="replace") if directory is not None else ""
    if not run.result.succeeded:
        excerpt = " ".join(text.split())[-STDERR_EXCERPT:]
        run.status = run.result.describe_exit() + (f": {excerpt}" if excerpt else "")
    elif PRELOAD_FAILURE in text:
        run.status = "the allocator was not preloaded"
    elif run.status == OK and run.client_error:
        run.status = run.client_error
    return run


@contextlib.contextmanager
def run_client(command: Command, run: Run) -> Iterator[Served]:
    """The Command's client in a thread for as long as the block runs the program (started
    just before it); once the program has exited, the client is told (Served.gone) and waited
    for. What it returns is run.client; an exception of its own is run.client_error."""
    served = Served(run.directory, time.monotonic())
    thread = None
    if command.client is not None:
        def conduct() -> None:
            try:
                run.client = command.client(served)
            except Exception as error:  # reported with the run, never silent
                run.client_error = f"client: {type(error).__name__}: {error}"

        thread = threading.Thread(target=conduct, daemon=True)
        thread.start()
    try:
        yield served
    finally:
        served.gone.set()
        if thread is not None:
            thread.join(timeout=command.timeout_s)


def served_timed_run(command: Command, allocator: Allocator, run: Run, stdout,
                     stderr) -> Tuple[str, Optional[float]]:
    """A timed run whose program is a server its client drives and stops: no sampler beside
    it; the wall time from start to exit; killed (with all it started) after timeout_s."""
    env = dict(os.environ, **command.env) if command.inherit_env else dict(command.env)
    with run_client(command, run) as served:
        try:
            process = subprocess.Popen(list(command.argv), cwd=command.cwd, env=allocator.environment(env),
                                       stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                       start_new_session=True)
        except OSError as error:
            raise MeshallocError(error.strerror or str(error)) from None
        try:
            status = exit_status(process.wait(timeout=command.timeout_s))
        except subprocess.TimeoutExpired:
            kill_group(process)
            process.wait()
            return "timeout", None
        except BaseException:
            kill_group(process)
            process.wait()
            raise
        seconds = served.since_start()
    if status != OK:
        return status, None
    return (run.client_error or OK), seconds


def sample(command: Command, allocator: Allocator, stdout, stderr) -> RunResult:
    """One sampled run of `command` (programs.memory_run), its output where subprocess is told
    (an open file, DEVNULL, STDOUT): what every sampled run is measured with."""
    return memory_run(command.argv, allocator, command.cwd, command.env, command.interval_s, command.timeout_s,
                      stdout, stderr, command.use_cgroup, command.inherit_env)


def interrupted(run: Run) -> bool:
    """Whether Ctrl-C reached the run's command (the schedule stops after it)."""
    return any(part.result is not None and part.result.interrupted for part in (run.parts or {"": run}).values())


def run_schedule(workloads: Sequence[Any], allocators: Sequence[Any], one: Pass,
                 command_of: Callable[[Run, str], Command], place: Callable[[schedule.Slot, str], Tuple[
                     Optional[Path], Optional[Path]]], kinds: Sequence[str] = ("",),
                 start: Optional[Callable[[schedule.Slot], None]] = None,
                 finish: Optional[Callable[[Run], None]] = None,
                 log: Optional[Callable[[str], None]] = None, describe: Optional[Callable[[Run], str]] = None,
                 group: Optional[Callable[[schedule.Slot], str]] = None, separator: str = " ",
                 each: bool = False) -> List[Run]:
    """The one loop of every declared experiment and of `meshalloc compare`: the pass's
    schedule of workloads × allocators × repetitions (schedule.plan, interleaved or rotated),
    and in each slot every kind's run one after the other: command_of(run, kind) the Command
    (the run as made so far: workload, allocator, repetition, order, directory), place(slot,
    kind) its directory or log file (measure_run). The slot's Run is its first kind's, with
    every part in `parts` and the first failed part's status (a later kind's named); start and
    finish are called around it (finish: parse it), describe for the progress line (with
`each`, a line per run). Each Run
    gets the load average as it started; the loop stops after a run Ctrl-C interrupted."""
    def execute(slot: schedule.Slot) -> Run:
        if start is not None:
            start(slot)
        parts: Dict[str, Run] = {}
        for index, kind in enumerate(kinds):
            directory, log_file = place(slot, kind)
            made = Run(slot.workload, "", slot.allocator, slot.repetition, slot.order,
                       directory if directory is not None else Path("."), pass_name=one.name, kind=kind)
            if directory is not None:
                directory.mkdir(parents=True, exist_ok=True)
            part = measure_run(command_of(made, kind), slot.allocator, directory, kind if index else "", log_file)
            part.workload, part.repetition, part.order, part.pass_name = slot.workload, slot.repetition, slot.order, \
                one.name
            parts[kind] = part
            if interrupted(part):
                break
        run = next(iter(parts.values()))
        run.parts = parts
        failed = next((part for part in parts.values() if not part.ok), None)
        if failed is not None and failed is not run:
            run.status = f"{failed.kind} run: {failed.status}"
        if finish is not None:
            finish(run)
        return run

    def word(done: schedule.Done[Run]) -> str:
        done.result.load = done.load
        return describe(done.result) if describe else getattr(done.slot.allocator, "name", str(done.slot.allocator))

    slots = schedule.plan(workloads, allocators, one.repetitions, one.order)
    done = schedule.run(slots, execute, log, word, group, stop=interrupted, separator=separator, each=each)
    for finished in done:
        finished.result.load = finished.load
    return [finished.result for finished in done]


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

    def place(slot: schedule.Slot, kind: str) -> Tuple[Path, None]:
        directory = context.out / (one.directory or experiment.run_directory)
        if experiment.workload_directories:
            directory /= slug(experiment.workload_name(slot.workload))
        # A row of the experiment's own may name its directory (redis-lru's configurations).
        name = getattr(slot.allocator, "slug", None) or slug(slot.allocator.name)
        return directory / f"{name}-r{slot.repetition}", None

    def command_of(run: Run, kind: str) -> Command:
        run.workload_name = experiment.workload_name(run.workload)
        session.current_run, session.current_kind = run, kind
        return experiment.command(session, run.workload, run.allocator)

    def finish(run: Run) -> None:
        run.workload_name = experiment.workload_name(run.workload)
        if interrupted(run):  # the pass stops here (KeyboardInterrupt below)
            return
        # Every run is parsed, a failed one too: what it printed before failing belongs in runs.tsv.
        try:
            run.figures = dict(experiment.parse(session, run))
        except RunFailed as failed:
            run.figures = dict(failed.figures)
            if run.ok:
                run.status = str(failed) or "the run's output is wrong"

    allocators = one.allocators(session) if one.allocators else session.selection.allocators
    runs = run_schedule(workloads, allocators, one, command_of, place,
                        one.kinds or experiment.kinds, finish=finish, log=context.log, describe=experiment.progress,
                        group=lambda slot: (f"{head}{experiment.workload_name(slot.workload)} "
                                            f"[{slot.repetition}/{one.repetitions}]"),
                        separator=experiment.progress_separator, each=experiment.progress_each_run)
    if runs and interrupted(runs[-1]):
        raise KeyboardInterrupt
    return runs


def prepared_workloads(experiment: Declared, session: Session, workloads: Sequence[Any]) -> List[Any]:
    """The workloads whose prepare() succeeded (its result in session.prepared); a failure
    line for each of the others."""
    kept = []
    for workload in workloads:
        name = experiment.workload_name(workload)
        try:
            session.prepared[name] = experiment.prepare(session, workload)
        except RunFailed as failed:
            session.failures.append(f"{name}: {failed}")
            continue
        kept.append(workload)
    return kept


def drive(experiment: Declared, context: Context) -> Outcome:
    """Run a declared experiment from its parameters to its Outcome."""
    # Absolute from here on: a run may start in a directory of its own (redis-lru's servers),
    # where a relative path would be read from there.
    context = replace(context, out=context.out.resolve())
    params = parameters(experiment, context)
    load_start = schedule.load_average()
    with tempfile.TemporaryDirectory(prefix=f"meshalloc-{slug(experiment.name)}-") as scratch:
        session = Session(context, params, None, Path(scratch), load_start=load_start)
        selection = session.selection = experiment.select(session)
        session.notes[:0] = selection.notes(experiment.reference)
        workloads = prepared_workloads(experiment, session, experiment.workloads(session))
        if not workloads:
            raise ExperimentUnavailable("nothing to run here: " + "; ".join(session.failures or session.notes))
        context.log(f"{len(workloads)} {experiment.workload_heading}(s) × {len(selection.allocators)} allocator(s) "
                    f"× {params.repetitions} repetition(s)")
        results = execute_all(experiment, session, workloads)
    found = experiment.claims(session, results)
    notes = session.notes + experiment.notes(session, results)
    if experiment.machine_note:
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
    # A pass's directory of runs, unless the experiment listed files of its runs itself.
    files += [out / directory for directory in run_directories(experiment, session) if (out / directory).is_dir()
              and not any(out / directory in path.parents for path in files)]
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
