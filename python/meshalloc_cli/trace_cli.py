"""The command lines of `meshalloc trace replay` and `meshalloc trace analyze`: arguments and
printing only; the work is in trace_replay.py and trace_analyze.py. cli.py hooks these into
`meshalloc trace` (add_parsers, and the handler each parser sets)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional, Tuple

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import trace_replay
from .compare import DEFAULT_REPEAT
from .errors import EXIT_FAILURE, EXIT_OK, MeshallocError

REPLAY_EXIT = ("exit status: 0; 1 for a missing or corrupt trace; 2 for bad usage; else the first failed run's "
               "status (3: a block lost its contents or came back misaligned; its log names the address).")


def _warp(text: str):
    try:
        return trace_replay.parse_warp(text)
    except MeshallocError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parsers(actions) -> None:
    from .cli import (ALLOCATORS_HELP, BASELINE_HELP, DEFAULT_COMPARE_ALLOCATORS, _positive_int, _positive_ms,
                      _positive_number)
    from .measure import DEFAULT_INTERVAL_S

    replay = actions.add_parser(
        "replay", help="replay a trace under several allocators, side by side",
        description="Replay TRACE with the native replayer under each allocator (LD_PRELOAD), interleaved and "
        "repeated like `meshalloc compare`: PSS over time, mean and peak memory, and the time of every call "
        "(percentiles per call kind). Every block is written and checked before it is freed. "
        "See docs/trace.md.", epilog=REPLAY_EXIT)
    replay.add_argument("trace", type=Path, metavar="TRACE")
    replay.add_argument("--allocators", metavar="A,B,...",
                        help=f"{ALLOCATORS_HELP} (default: those of {','.join(DEFAULT_COMPARE_ALLOCATORS)} that are "
                        "present)")
    replay.add_argument("--repeat", type=_positive_int, default=DEFAULT_REPEAT, metavar="N",
                        help="runs per allocator (default %(default)s)")
    replay.add_argument("--baseline", metavar="A", help=f"{BASELINE_HELP} (default: the first)")
    replay.add_argument("--timing", choices=trace_replay.TIMINGS, default="fast",
                        help="fast: every call as soon as the previous one returned; recorded: keep the "
                        "recorded gaps, so timers and background threads see the program's pace (default %(default)s)")
    replay.add_argument("--speed", type=lambda text: _positive_number(text, "a number", "the speed"), default=1.0,
                        metavar="X",
                        help="with --timing recorded: replay X times faster than recorded (default 1)")
    replay.add_argument("--warp", type=_warp, default=(), metavar="R:P,...",
                        help="with --timing recorded: map the recorded clock onto the replay's through these "
                        "points (seconds since the start, recorded:replay), linearly between them, as recorded "
                        "after the last; replays a phase at another pace than the recording's")
    replay.add_argument("--touch", choices=trace_replay.TOUCHES, default="page",
                        help="what of each block is written and checked: one byte per page, the whole "
                        "block, or nothing (default %(default)s)")
    replay.add_argument("--interval", type=_positive_ms, default=DEFAULT_INTERVAL_S * 1000.0, metavar="MS",
                        help="PSS sampling interval in milliseconds (default %(default)g)")
    replay.add_argument("--heap-map", action="store_true",
                        help="under meshalloc: read its heap breakdown every "
                        f"{trace_replay.HEAP_MAP_MS} ms during the replay (heap-map.tsv; `trace analyze "
                        "--replay` draws it)")
    replay.add_argument("--out", type=Path, metavar="DIR", help="results directory (default out/replay-<time>)")
    replay.add_argument("--no-cgroup", action="store_true", help="do not put each run in a memory cgroup")
    replay.add_argument("--no-figure", action="store_true", help="skip the PNG/SVG figures")
    replay.set_defaults(trace_handler=cmd_replay)

    analyze = actions.add_parser(
        "analyze", help="what a trace allocates and how long it keeps it; allocators ranked on replays",
        description="Live bytes and blocks over time, lifetime histograms (operations, bytes, seconds; whole and "
        "zoomed like the STEVE thesis's figures 5.1-5.3), size histograms and the size classes they fall into, "
        "who frees what across threads; with --replay (results of `meshalloc trace replay`, one per trace): "
        "PSS over live bytes, and the thesis's ranking tables (§8.3.3). Text tables, TSV, analysis.md, PNG "
        "and SVG. See docs/trace.md.",
        epilog="exit status: 0; 1 for a missing or corrupt trace or replay directory; 2 for bad usage.")
    analyze.add_argument("trace", type=Path, metavar="TRACE")
    analyze.add_argument("--replay", type=Path, action="append", default=[], metavar="DIR",
                         help="a `meshalloc trace replay --out DIR` results directory; repeat it to rank the "
                         "allocators over several traces (the lifetime and size tables are TRACE's)")
    analyze.add_argument("--out", type=Path, metavar="DIR", help="results directory (default out/analyze-<time>)")
    analyze.add_argument("--no-figure", action="store_true", help="skip the PNG/SVG figures")
    analyze.set_defaults(trace_handler=cmd_analyze)


def _table(headers: List[str], rows: List[List[str]], title: str, left: int = 2) -> Table:
    """`left`: the leading columns that hold names (left-justified); numbers follow."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, title=Text(title), title_justify="left")
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index < left else "right")
    for cells in rows:
        table.add_row(*(Text(cell) for cell in cells))
    return table


def cmd_replay(args, out_console: Console, err: Console) -> int:
    from . import allocators as allocator_registry
    from .cli import (SIGINT_EXIT, _baseline, _compare_allocators, _default_out, _Progress, _user_allocators,
                      print_comparison)
    from .output import prepare_output_directory

    specs = _user_allocators(args.allocators)  # as `meshalloc compare` reads them
    chosen = _compare_allocators(specs)
    baseline = _baseline(args.baseline, specs)
    if baseline is not None and baseline not in [allocator.name for allocator in chosen]:
        chosen.insert(0, allocator_registry.resolve(args.baseline))  # not listed: the defaults lack it
    if not args.trace.is_file():
        raise MeshallocError(f"no such trace file: {args.trace}", EXIT_FAILURE)
    out = prepare_output_directory(args.out or _default_out("replay"))
    with _Progress(err) as progress:
        result = trace_replay.replay(args.trace, chosen, out, args.repeat, baseline, args.timing, args.touch,
                                     args.speed, args.interval / 1000.0, not args.no_cgroup,
                                     on_start=progress.start, on_finish=progress.finish, heap_map=args.heap_map,
                                     warp=args.warp)
    comparison = result.comparison
    files, figure = trace_replay.write_results(result, out, figures=not args.no_figure)
    headers, rows = trace_replay.time_table(result)
    print_comparison(comparison, files, figure, out_console)
    out_console.print(_table(headers, rows, "time per call"))
    for run in comparison.failed_runs:
        line = trace_replay.failure_line(run)
        if line:
            err.print(f"{run.allocator} #{run.repetition}: {line}", highlight=False, markup=False, soft_wrap=True)
    if comparison.interrupted:
        return SIGINT_EXIT
    failed = comparison.failed_runs
    return failed[0].result.exit_code if failed else EXIT_OK


def cmd_analyze(args, out_console: Console, err: Console) -> int:
    from . import trace_analyze
    from .cli import _default_out
    from .output import prepare_output_directory

    if not args.trace.is_file():
        raise MeshallocError(f"no such trace file: {args.trace}", EXIT_FAILURE)
    for directory in args.replay:
        if not directory.is_dir():
            raise MeshallocError(f"no such replay results directory: {directory}", EXIT_FAILURE)
    out = prepare_output_directory(args.out or _default_out("analyze"))
    tables, files, _ = trace_analyze.analyze(args.trace, out, args.replay, figures=not args.no_figure)
    for table in tables:
        out_console.print(_table(table.headers, table.rows, table.title, table.left))
    out_console.print("files: " + " ".join(str(path) for path in files), highlight=False, markup=False,
                      soft_wrap=True)
    return EXIT_OK
