"""The `meshalloc` command line: run, compare, allocators, bench, top, trace.

Everything the commands do lives in the library modules (measure, compare, output,
plotting); this file only parses arguments and prints.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import List, Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich import box

from . import __version__, allocators as allocator_registry, trace as tracing, trace_cli
from .breakdown import COLUMNS as BREAKDOWN_COLUMNS
from .compare import DEFAULT_REPEAT, Comparison, RunRecord, compare
from .errors import EXIT_FAILURE, EXIT_OK, EXIT_SIGNAL_BASE, EXIT_USAGE, MeshallocError
from .measure import DEFAULT_INTERVAL_S, KIB, MIB, RunResult, check_command, measure
from .output import (FIGURE_STEM, RSS_NOTE, prepare_output_directory, table_cells, table_notes, write_comparison,
                     write_run)

PROGRAM = "meshalloc"
COMMAND_SEPARATOR = "--"
MS_PER_S = 1000.0
DEFAULT_OUT_ROOT = Path("out")
DEFAULT_BENCH_OUT = Path("results")
TIMESTAMP_FORMAT = "%Y%m%d-%H%M%S"
# What --allocators and --baseline take, in both commands that have them.
ALLOCATORS_HELP = ("comma-separated allocators: names from `meshalloc allocators`, meshalloc configurations "
                   "with option overrides (meshalloc:3y+mesh_budget_permille=200), or paths to .so files")
BASELINE_HELP = "allocator the ratios are against, in the same forms; with --allocators, one of them"
# The allocators `compare` uses when --allocators is not given (those that are present).
DEFAULT_COMPARE_ALLOCATORS = ("glibc", "jemalloc", "mimalloc", "tcmalloc", "meshalloc")
# Wide enough for the comparison table with its (min–max) ranges and meshalloc's breakdown
# columns on one line per allocator.
NON_TERMINAL_WIDTH = 340
SIGINT_EXIT = EXIT_SIGNAL_BASE + 2  # what a shell reports for a command stopped by Ctrl-C

EPILOG = """exit status: the command's own (run), or 128+N when it was killed by signal N;
2 for bad usage, 126 when the command cannot be executed, 127 when it is not found."""


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage before an error; the issue asks for one line."""

    def error(self, message: str):  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: {message} (see `{self.prog} --help`)\n")
        sys.exit(EXIT_USAGE)


def _positive_number(text: str, what: str, subject: str) -> float:
    """A float above 0 for an option whose value is `what` ("a number of seconds")."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{subject} must be positive, not {text}")
    return value


def _positive_interval(text: str, unit: str) -> float:
    return _positive_number(text, f"a number of {unit}", "the interval")


def _positive_ms(text: str) -> float:
    return _positive_interval(text, "milliseconds")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _positive_seconds(text: str) -> float:
    return _positive_interval(text, "seconds")


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def _add_measurement_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=_positive_ms, default=DEFAULT_INTERVAL_S * MS_PER_S, metavar="MS",
                        help="sampling interval in milliseconds (default %(default)g, i.e. 100 Hz)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="directory for the TSV, JSON and figure files "
                        "(default out/run-<time> or out/compare-<time>)")
    parser.add_argument("--no-cgroup", action="store_true",
                        help="do not put the command in a memory cgroup of its own")
    parser.add_argument("--no-figure", action="store_true", help="skip the PNG/SVG figure")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                        help="the command to run, after --")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROGRAM, description="Measure a program's memory the right way (PSS, page tables, "
                           "memory-cgroup charge) and compare allocators on it.", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    commands.required = True

    run = commands.add_parser("run", help="run a command under one allocator and sample its memory",
                              description="Run CMD under an allocator, sample the whole process tree's memory at a "
                              "fixed rate until it exits, print mean/peak/final and wall time, and write a TSV time "
                              "series and a figure. The exit status of CMD is passed through.", epilog=EPILOG)
    run.add_argument("--allocator", "-a", default="system", metavar="A",
                     help="allocator name or .so path (default: system, i.e. no LD_PRELOAD); "
                     "see `meshalloc allocators`")
    _add_measurement_options(run)

    comparison = commands.add_parser("compare", help="the same command under several allocators, side by side",
                                     description="Run CMD under each allocator, interleaved and repeated, and "
                                     "print a table of medians and ratios against a baseline, with one figure "
                                     "of every allocator's memory over time.", epilog=EPILOG)
    comparison.add_argument("--allocators", metavar="A,B,...",
                            help=f"{ALLOCATORS_HELP} (default: those of {','.join(DEFAULT_COMPARE_ALLOCATORS)} "
                            "that are present)")
    comparison.add_argument("--repeat", type=_positive_int, default=DEFAULT_REPEAT, metavar="N",
                            help="runs per allocator (default %(default)s)")
    comparison.add_argument("--baseline", metavar="A", help=f"{BASELINE_HELP} (default: the first)")
    _add_measurement_options(comparison)

    listing = commands.add_parser("allocators", help="list the allocators available on this machine",
                                  description="List every allocator name, whether it is available here and "
                                  "which library it loads.")
    listing.add_argument("--install", action="store_true",
                         help="apt-get install the comparison allocators first (needs root)")

    bench = commands.add_parser("bench", help="reproduce the paper's experiments; results/SUMMARY.md",
                                description="Run the paper's experiments (all, or those named), each into "
                                "DIR/<experiment>/, and rebuild DIR/SUMMARY.md, which sets every claim of the "
                                "paper beside what this machine measured. See docs/bench.md.",
                                epilog="exit status: 0 when every experiment ran (claims that do not hold are "
                                "reported, not errors), 1 when one failed or an experiment named on the command "
                                "line was skipped, 2 for bad usage.")
    size = bench.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="a reduced version of every experiment (the whole run in under 10 minutes)")
    size.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                      help="tiny parameters, seconds per experiment: checks that everything runs")
    bench.set_defaults(mode="full")
    bench.add_argument("--repeat", type=_positive_int, metavar="N",
                       help="repetitions of every configuration (default: the mode's)")
    bench.add_argument("--out", type=Path, default=DEFAULT_BENCH_OUT, metavar="DIR",
                       help="results directory (default %(default)s)")
    bench.add_argument("--allocators", metavar="A,B,...",
                       help=f"{ALLOCATORS_HELP}, instead of each experiment's own (see docs/bench.md for what "
                       "each does with them)")
    bench.add_argument("--baseline", metavar="A", help=f"{BASELINE_HELP} (default: each experiment's own)")
    bench.add_argument("--list", action="store_true", help="list the experiments and exit")
    bench.add_argument("experiments", nargs="*", metavar="EXPERIMENT",
                       help="experiments to run (default: all, in the order --list shows)")

    top = commands.add_parser("top", help="watch running meshalloc processes' memory, live",
                              description="Show the memory of processes running on meshalloc, refreshed every "
                              "interval: PSS, page tables, threads and mappings from /proc, and the allocator's "
                              "own breakdown (live, free, dirty cache, large, metadata, mesh saving) and mesh "
                              "statistics from the statistics the process publishes when started with "
                              "MESHALLOC_LIVE_STATS_MS=1000. Without PIDs: every process that publishes them.",
                              epilog="exit status: 0, or 1 when a process does not exist, does not run meshalloc "
                              "(or does not publish statistics) or cannot be read; 2 for bad usage.")
    top.add_argument("pids", nargs="*", type=_pid, metavar="PID", help="processes to watch (default: all)")
    top.add_argument("--interval", type=_positive_seconds, default=1.0, metavar="SECONDS",
                     help="refresh period in seconds (default %(default)g)")
    top.add_argument("--once", action="store_true", help="print one reading and exit")
    top.add_argument("--json", action="store_true",
                     help="JSON instead of a table: one object per reading, {\"processes\": [...]}")
    _add_trace_parser(commands)
    return parser


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)


def _add_trace_parser(commands) -> None:
    trace = commands.add_parser("trace", help="record allocation traces and read them (docs/trace.md)",
                                description="Record every malloc-family call and C++ new/delete of a program into "
                                "a compact binary trace, and print or summarise a trace. See docs/trace.md.")
    actions = trace.add_subparsers(dest="trace_command", metavar="ACTION")
    actions.required = True
    record = actions.add_parser("record", help="run CMD with the recorder preloaded",
                                description="Run CMD with libmeshalloc-trace.so preloaded in front of the "
                                "allocator. The trace goes to FILE; a forked child's to FILE.<pid>. The exit status "
                                "of CMD is passed through.", epilog=EPILOG)
    record.add_argument("--out", "-o", type=Path, default=tracing.DEFAULT_TRACE, metavar="FILE",
                        help="trace file (default %(default)s); an earlier FILE and FILE.<pid> are replaced")
    record.add_argument("--allocator", "-a", metavar="A",
                        help="allocator underneath the recorder (default: the program's own); "
                        "see `meshalloc allocators`")
    record.add_argument("--callsites", type=_non_negative_int, default=0, metavar="N",
                        help="record a call-site hash on every N-th event of each thread (default 0: none)")
    record.add_argument("--compress", action="store_true",
                        help="compress the trace (and each child's) once the command has exited")
    record.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                        help="the command to run, after --")
    dump = actions.add_parser("dump", help="print a trace's events as text",
                              description="Print the events of TRACE, one per line, all threads merged in time "
                              "order with object ids (or one thread's, in its order, with --thread).",
                              epilog="exit status: 0; 1 for a missing, corrupt or truncated trace; 2 for bad usage.")
    dump.add_argument("trace", type=Path, metavar="TRACE")
    dump.add_argument("--head", type=_non_negative_int, metavar="N", help="print the first N events only")
    dump.add_argument("--thread", type=_non_negative_int, metavar="T", help="only thread T (the index `stats` counts)")
    stats = actions.add_parser("stats", help="summarise a trace",
                               description="Events by kind, threads, objects, peak live bytes, bytes per event.",
                               epilog="exit status: 0; 1 for a missing, corrupt or truncated trace; 2 for bad usage.")
    stats.add_argument("trace", type=Path, metavar="TRACE")
    stats.add_argument("--json", action="store_true", help="one JSON object instead of text")
    compress = actions.add_parser("compress", help="deflate a trace's chunks (every reader takes either form)",
                                  description="Rewrite TRACE with every chunk's payload compressed (zlib), after "
                                  "checking that every event decodes. The recorder never compresses: it only "
                                  "appends, so that recording costs the program as little as it can.",
                                  epilog="exit status: 0; 1 for a missing, corrupt, truncated or already "
                                  "compressed trace; 2 for bad usage.")
    compress.add_argument("trace", type=Path, metavar="TRACE")
    compress.add_argument("--out", "-o", type=Path, metavar="FILE", help="write FILE instead of replacing TRACE")
    trace_cli.add_parsers(actions)  # replay, analyze


def cmd_trace(args, command: Optional[List[str]], err: Console) -> int:
    if getattr(args, "trace_handler", None):  # replay, analyze (trace_cli.py)
        if command:
            raise MeshallocError(f"`meshalloc trace {args.trace_command}` takes no command")
        return args.trace_handler(args, _console(stderr=False), err)
    if args.trace_command == "record":
        command = _command_or_error(command, args.command)
        allocator = allocator_registry.resolve(args.allocator) if args.allocator else None
        status = tracing.record(command, args.out, allocator, args.callsites)
        children = tracing.child_traces(args.out)
        if args.compress:
            for trace in [args.out, *children]:
                tracing.compress(trace)
        more = f" and {len(children)} child trace{'s' if len(children) != 1 else ''} ({args.out}.<pid>)" if children else ""
        err.print(f"{PROGRAM}: trace in {args.out}{more}; `{PROGRAM} trace stats {args.out}` summarises it",
                  highlight=False)
        return status
    if command:
        raise MeshallocError(f"`meshalloc trace {args.trace_command}` takes no command")
    if args.trace_command == "dump":
        return tracing.dump(args.trace, args.head, args.thread)
    if args.trace_command == "compress":
        before, after = tracing.compress(args.trace, args.out)
        err.print(f"{PROGRAM}: {args.out or args.trace}: {before:,} bytes compressed to {after:,} "
                  f"({after / before:.1%})", highlight=False)
        return 0
    return tracing.stats(args.trace, args.json)


def _split_command(argv: Sequence[str]):
    """Everything after the first `--` is the command, untouched by argparse (which
    would otherwise take options of the command, like `ls --all`, for its own)."""
    argv = list(argv)
    if COMMAND_SEPARATOR in argv:
        index = argv.index(COMMAND_SEPARATOR)
        return argv[:index], argv[index + 1:]
    return argv, None


def _default_out(kind: str) -> Path:
    stamp = datetime.now().strftime(TIMESTAMP_FORMAT)
    candidate = DEFAULT_OUT_ROOT / f"{kind}-{stamp}"
    suffix = 1
    while candidate.exists():
        suffix += 1
        candidate = DEFAULT_OUT_ROOT / f"{kind}-{stamp}-{suffix}"
    return candidate


def _mib(value: Optional[float]) -> str:
    return "—" if value is None else f"{value / MIB:.1f} MiB"


def _kib(value: Optional[float]) -> str:
    return "—" if value is None else f"{value / KIB:.0f} KiB"


def _count(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.0f}"


def _cgroup_line(result: RunResult) -> str:
    status = result.cgroup
    if status.available:
        return f"memory cgroup v{status.version}: {status.path} (removed after the run)"
    return f"memory cgroup: not available — {status.reason}"


def print_run_report(result: RunResult, files: List[Path], console: Console) -> None:
    """The summary `meshalloc run` prints (to stderr, like time(1), so the command's own
    stdout stays clean for pipes)."""
    command = escape(shlex.join(result.command))
    console.print(f"[bold]meshalloc run[/bold]: {command} under [bold]{escape(result.allocator.name)}[/bold] — "
                  f"{result.describe_exit()}", highlight=False, soft_wrap=True)
    rate = result.achieved_rate
    rate_text = f" at {rate:.0f} Hz" if rate else ""
    console.print(f"wall time {result.wall_time:.3f} s · {len(result.samples)} samples{rate_text} "
                  f"(every {result.interval * MS_PER_S:g} ms)", highlight=False)
    console.print(_cgroup_line(result), highlight=False, markup=False, soft_wrap=True)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("metric")
    for column in ("mean", "peak", "final"):
        table.add_column(column, justify="right")
    rows = [("PSS", "pss", _mib), ("cgroup charge", "cgroup", _mib), ("RSS*", "rss", _mib),
            ("page tables", "pte", _kib), ("mappings", "maps", _count)]
    for label, metric, formatter in rows:
        summary = result.summary(metric)
        if summary is None:
            if metric == "cgroup":
                continue
            table.add_row(label, "—", "—", "—")
            continue
        table.add_row(label, formatter(summary.mean), formatter(summary.peak), formatter(summary.final))
    if result.cgroup_kernel_peak is not None:
        table.add_row("cgroup peak (kernel)", "", _mib(result.cgroup_kernel_peak), "")
    if result.samples:
        console.print(table)
    else:
        console.print("no samples: the command exited before the first one could be taken", highlight=False)
    console.print(f"* {RSS_NOTE}", highlight=False, soft_wrap=True)
    if result.breakdown is not None:
        print_breakdown(result, console)
    if result.signal_name:
        console.print(f"[bold red]the command was killed by {result.signal_name}[/bold red]; "
                      f"its partial samples were written", highlight=False)
    console.print("files: " + " ".join(str(path) for path in files), highlight=False, markup=False, soft_wrap=True)


def print_breakdown(result: RunResult, console: Console) -> None:
    """meshalloc's own account of its memory at the command's exit, as the column set of the
    comparison table plus the totals it adds up to."""
    breakdown = result.breakdown
    processes = f"{breakdown.processes} process{'es' if breakdown.processes != 1 else ''}"
    console.print(f"meshalloc's breakdown at exit, MiB ({processes}; docs/memory.md):", highlight=False)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    values = [breakdown.column(group) for group, _ in BREAKDOWN_COLUMNS]
    totals = [breakdown.components.get(name) for name in ("heap_total", "outside_heap", "pss")]
    for header in [label for _, label in BREAKDOWN_COLUMNS] + ["heap total", "outside heap", "PSS"]:
        table.add_column(header, justify="right")
    table.add_row(*("—" if value is None else f"{value / MIB:.1f}" for value in values + totals))
    console.print(table)


def _command_or_error(command: Optional[List[str]], remainder: List[str]) -> List[str]:
    if command is None:
        command = remainder
    elif remainder:
        raise MeshallocError(f"unexpected arguments before --: {' '.join(remainder)}")
    if not command:
        raise MeshallocError("missing command: put it after --, e.g. `meshalloc run -- ls -l`")
    return command


def cmd_run(args, command: List[str], err: Console) -> int:
    allocator = allocator_registry.resolve(args.allocator)
    check_command(command, allocator.environment())
    out = prepare_output_directory(args.out or _default_out("run"))
    result = measure(command, allocator, interval=args.interval / MS_PER_S, use_cgroup=not args.no_cgroup)
    files = list(write_run(result, out).values())
    if not args.no_figure and result.samples:
        from .plotting import plot_run

        files += plot_run(result, out / FIGURE_STEM)
    print_run_report(result, files, err)
    return result.exit_code


def _user_allocators(text: Optional[str]) -> List[str]:
    """--allocators' specs (comma- or space-separated)."""
    if text is None:
        return []
    specs = allocator_registry.split_list(text)
    if not specs:
        raise MeshallocError("--allocators is empty")
    return specs


def _label(spec: str) -> str:
    """The name a spec is shown under: resolve()'s, or the spec itself for a name an
    experiment builds (checked by then)."""
    try:
        return allocator_registry.resolve(spec).name
    except MeshallocError:
        return spec


def _baseline(text: Optional[str], chosen: Sequence[str]) -> Optional[str]:
    """--baseline's allocator name; with --allocators it must be one of them."""
    if text is None:
        return None
    name = allocator_registry.resolve(text).name
    names = [_label(spec) for spec in chosen]
    if chosen and name not in names:
        raise MeshallocError(f"baseline '{text}' is not one of the compared allocators ({', '.join(names)})")
    return name


def _compare_allocators(specs: Sequence[str]):
    if specs:
        return allocator_registry.resolve_all(specs)
    present = []
    for name in DEFAULT_COMPARE_ALLOCATORS:
        try:
            present.append(allocator_registry.resolve(name))
        except MeshallocError:
            continue
    if not present:
        raise MeshallocError("none of the default allocators is available; see `meshalloc allocators`")
    return present


class _Progress:
    """A rich progress bar on a terminal; one plain line per run otherwise (CI logs, pipes,
    `make demo` output), where a redrawn bar would leave only noise."""

    def __init__(self, console: Console):
        self._console = console
        self._bar = None
        self._task = None
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console)

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()

    def start(self, order: int, total: int, allocator: str, repetition: int) -> None:
        description = f"{allocator} (run {repetition})"
        if self._bar is not None:
            if self._task is None:
                self._task = self._bar.add_task(description, total=total)
            self._bar.update(self._task, description=description)

    def finish(self, record: RunRecord, total: int) -> None:
        result = record.result
        pss = result.summary("pss")
        line = (f"[{record.order}/{total}] {record.allocator} #{record.repetition}: {result.wall_time:.3f} s, "
                f"peak PSS {_mib(pss.peak if pss else None)}")
        if not result.succeeded:
            line += f", {result.describe_exit()}" + (f" (log: {record.log})" if record.log else "")
        if self._bar is not None:
            self._bar.advance(self._task)
            if not result.succeeded:
                self._bar.console.print(line, highlight=False, markup=False)
        else:
            self._console.print(line, highlight=False, markup=False, soft_wrap=True)


def print_comparison(comparison: Comparison, files: List[Path], figure: Optional[Path], console: Console) -> None:
    headers, rows = table_cells(comparison)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, title=Text(shlex.join(comparison.command)),
                  title_justify="left")
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index == 0 else "right")
    for cells in rows:
        table.add_row(*(Text(cell) for cell in cells))  # names and paths are not markup
    console.print(table)
    for note in table_notes(comparison):
        console.print(note, highlight=False, markup=False, soft_wrap=True)
    if figure is not None:
        console.print(f"figure: {figure}", highlight=False, markup=False, soft_wrap=True)
    console.print("files: " + " ".join(str(path) for path in files), highlight=False, markup=False, soft_wrap=True)


def cmd_compare(args, command: List[str], out_console: Console, err: Console) -> int:
    specs = _user_allocators(args.allocators)
    chosen = _compare_allocators(specs)
    baseline = _baseline(args.baseline, specs)
    if baseline is not None and baseline not in [allocator.name for allocator in chosen]:
        chosen.insert(0, allocator_registry.resolve(args.baseline))  # not listed: the defaults lack it
    check_command(command, chosen[0].environment())
    out = prepare_output_directory(args.out or _default_out("compare"))
    with _Progress(err) as progress:
        comparison = compare(command, chosen, repeat=args.repeat, baseline=baseline,
                             interval=args.interval / MS_PER_S, use_cgroup=not args.no_cgroup,
                             log_dir=out / "logs", on_start=progress.start, on_finish=progress.finish)
    files = list(write_comparison(comparison, out).values())
    figure = None
    if not args.no_figure and any(run.result.samples for run in comparison.runs):
        from .plotting import plot_comparison

        figures = plot_comparison(comparison, out / FIGURE_STEM)
        files += figures
        figure = figures[0]
    print_comparison(comparison, files, figure, out_console)
    if comparison.interrupted:
        return SIGINT_EXIT
    failed = comparison.failed_runs
    return failed[0].result.exit_code if failed else EXIT_OK


def cmd_allocators(args, out_console: Console, err: Console) -> int:
    if args.install:
        allocator_registry.install_debian_packages()
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for header in ("allocator", "available", "library", "notes"):
        table.add_column(header, overflow="fold")
    for row in allocator_registry.availability():
        cells = (row.name, "yes" if row.available else "no", str(row.library) if row.library else "—", row.note)
        table.add_row(*(Text(cell) for cell in cells))  # names and paths are not markup
    out_console.print(table)
    return EXIT_OK


def cmd_bench(args, out_console: Console) -> int:
    from .bench import runner

    runner.check_names(args.experiments)
    if args.list:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False)
        for header in ("experiment", "title", "reproduces"):
            table.add_column(header, overflow="fold")
        for row in runner.list_experiments():
            title = row.title if row.available else f"(not available: {row.note})"
            table.add_row(*(Text(cell) for cell in (row.name, title, row.paper)))
        out_console.print(table)
        return EXIT_OK

    def progress(line: str) -> None:
        # Plain lines, flushed at once: a long run is followed with `tail -f` or in CI logs.
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    specs = _user_allocators(args.allocators)
    runner.check_allocators(args.experiments, specs)  # before anything runs
    baseline = args.baseline.strip() if args.baseline is not None else None
    _baseline(baseline, specs)
    report = runner.run_bench(args.experiments, args.mode, args.out, repeat=args.repeat, log=progress,
                              allocators=specs, baseline=baseline)
    counts = ", ".join(f"{count} {status}" for status, count in report.counts.items())
    out_console.print(f"summary: {report.summary} — {report.tally.text()} ({counts})", highlight=False,
                      markup=False, soft_wrap=True)
    return report.exit_code


def cmd_top(args, out_console: Console) -> int:
    import json

    from rich.live import Live

    from . import top as live_top

    explicit = bool(args.pids)
    pids = list(dict.fromkeys(args.pids)) if explicit else live_top.publishing_pids()

    def read_all(previous: dict) -> tuple:
        """Snapshots of the processes still watched, and whether any failed."""
        snapshots, failed = [], False
        for pid in list(pids):
            try:
                snap = live_top.snapshot(pid)
            except MeshallocError as error:
                if explicit:
                    sys.stderr.write(f"{PROGRAM}: {error}\n")
                    failed = True
                pids.remove(pid)
                continue
            snap["mesh_rate_per_s"] = live_top.mesh_rate(previous.get(pid), snap)
            previous[pid] = snap
            snapshots.append(snap)
        return snapshots, failed

    def table(snapshots: List[dict]) -> Table:
        view = Table(box=box.SIMPLE_HEAD, show_edge=False,
                     title=f"meshalloc top — {datetime.now().strftime('%H:%M:%S')}, every {args.interval:g} s")
        view.add_column("")
        for snap in snapshots:
            view.add_column(Text(f"{snap['pid']} {snap['name']}" + (" (stale)" if snap["stale"] else "")),
                            justify="right")
        for row in live_top.table_rows(snapshots):
            view.add_row(*(Text(cell) for cell in row))
        return view

    def emit_json(snapshots: List[dict]) -> None:
        sys.stdout.write(json.dumps({"processes": snapshots}) + "\n")
        sys.stdout.flush()

    previous: dict = {}
    snapshots, failed = read_all(previous)
    if failed:
        return EXIT_FAILURE
    if not snapshots:
        raise MeshallocError("no running process publishes meshalloc live statistics (start one with "
                             f"{live_top.OPTION_VARIABLE}={live_top.SUGGESTED_MS})", EXIT_FAILURE)
    if args.once:
        if args.json:
            emit_json(snapshots)
        else:
            out_console.print(table(snapshots))
        return EXIT_OK
    try:
        if args.json:
            while snapshots:
                emit_json(snapshots)
                time.sleep(args.interval)
                snapshots, _ = read_all(previous)
        else:
            with Live(table(snapshots), console=out_console, auto_refresh=False) as view:
                while snapshots:
                    time.sleep(args.interval)
                    snapshots, _ = read_all(previous)
                    if snapshots:
                        view.update(table(snapshots), refresh=True)
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK


def _console(stderr: bool) -> Console:
    """Rich wraps at 80 columns when it is not writing to a terminal; tables in logs and
    captured output read better unwrapped, unless COLUMNS says otherwise."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=NON_TERMINAL_WIDTH)
    return console


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    options, command = _split_command(argv)
    parser = build_parser()
    args = parser.parse_args(options)
    out_console = _console(stderr=False)
    err = _console(stderr=True)
    try:
        if args.subcommand == "allocators":
            if command:
                raise MeshallocError("`meshalloc allocators` takes no command")
            return cmd_allocators(args, out_console, err)
        if args.subcommand == "bench":
            if command:
                raise MeshallocError("`meshalloc bench` takes no command")
            return cmd_bench(args, out_console)
        if args.subcommand == "top":
            if command:
                raise MeshallocError("`meshalloc top` takes no command")
            return cmd_top(args, out_console)
        if args.subcommand == "trace":
            return cmd_trace(args, command, err)
        command = _command_or_error(command, args.command)
        if args.subcommand == "run":
            return cmd_run(args, command, err)
        return cmd_compare(args, command, out_console, err)
    except MeshallocError as error:
        sys.stderr.write(f"{PROGRAM}: {error}\n")
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
