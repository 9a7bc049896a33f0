"""What recording costs (docs/trace.md, Measurements): wall time and CPU time (user + system,
the whole process tree) of each program recorded and not recorded (both on glibc), interleaved,
as medians with min–max, and the trace's bytes per event, as recorded and compressed. On a
loaded machine the CPU time is the steadier measure of what the recorder adds. The programs:
the fragmentation workload of `make demo` and the real programs of `meshalloc bench
real-apps`, at its quick scale (--full: its full scale, runs of seconds,
which a loaded machine's noise disturbs less).

    python -m meshalloc_cli.trace_overhead [--repeat N] [--full] [--programs fragmentation,perl,...]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

from . import paths, trace as tracing
from .allocators import Allocator
from .bench.programs import Prepared, available_programs, timed_run

TIMEOUT_S = 600
QUICK, FULL = 1, 2  # indices of the quick and full scales in Program.scales


def _fragmentation() -> Prepared:
    build = paths.build_directory()
    program = build / "tools" / "workloads" / "fragmentation" if build else None
    if program is None or not program.is_file():
        raise SystemExit("tools/workloads/fragmentation is not built (make release)")
    return Prepared([str(program)], Path.cwd())


def _trace_size(trace: Path) -> Tuple[int, int, int]:
    """(bytes, bytes once compressed, events) over the trace and its children's."""
    total_bytes = total_compressed = total_events = 0
    for file in [trace, *tracing.child_traces(trace)]:
        summary = subprocess.run([str(tracing.decoder_tool()), "stats", "--json", str(file)], capture_output=True,
                                 text=True, check=True)
        total_events += json.loads(summary.stdout)["events"]
        before, after = tracing.compress(file, file.with_name(file.name + ".z"))
        total_bytes += before
        total_compressed += after
        file.with_name(file.name + ".z").unlink()
    return total_bytes, total_compressed, total_events


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _range(values: List[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshalloc_cli.trace_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="the real programs at bench's full scale")
    parser.add_argument("--programs", help="comma-separated subset (default: fragmentation and every real program)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="meshalloc-trace-overhead."))
    try:
        return _measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the programs' inputs and the last traces


def _measure(args: argparse.Namespace, work: Path) -> int:
    root = paths.repository_root()
    programs: Dict[str, Prepared] = {"fragmentation": _fragmentation()}
    found, _ = available_programs()
    for program in found:
        (work / program.name).mkdir(parents=True)
        scale = program.scales[FULL if args.full else QUICK]
        programs[program.name] = program.prepare(root, work / program.name, scale)
    if args.programs:
        programs = {name: programs[name] for name in args.programs.split(",")}
    trace = work / "run.trace"
    plain = Allocator("glibc", None, "the program as linked")
    recorded = Allocator("recorded", tracing.recorder_library(), "the trace recorder on glibc",
                         set_env={tracing.ENV_FILE: str(trace)})
    times: Dict[str, Dict[str, List[float]]] = {name: {"plain": [], "recorded": []} for name in programs}
    cpu: Dict[str, Dict[str, List[float]]] = {name: {"plain": [], "recorded": []} for name in programs}
    sizes: Dict[str, Tuple[int, int, int]] = {}
    for repetition in range(args.repeat):
        for name, prepared in programs.items():
            for label, allocator in (("plain", plain), ("recorded", recorded)):
                for old in [trace, *tracing.child_traces(trace)]:
                    old.unlink(missing_ok=True)
                before = _children_cpu()
                run = timed_run(prepared.command, allocator, prepared.cwd, prepared.env, TIMEOUT_S)
                cpu[name][label].append(_children_cpu() - before)
                if not run.ok:
                    raise SystemExit(f"{name} ({label}) failed: {run.status} {run.stderr_tail}")
                times[name][label].append(run.seconds)
                if label == "recorded" and name not in sizes:  # the first recording's (compressing costs seconds)
                    sizes[name] = _trace_size(trace)
                print(f"r{repetition + 1} {name} {label}: {run.seconds:.3f} s", file=sys.stderr, flush=True)
    print("| program | wall s, unrecorded | wall s, recorded | wall × | CPU s, unrecorded | CPU s, recorded | CPU × "
          "| events | trace MB | bytes/event | compressed MB | bytes/event compressed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in programs:
        cells = []
        for measure in (times, cpu):
            plain_values, recorded_values = measure[name]["plain"], measure[name]["recorded"]
            ratios = [r / p for p, r in zip(plain_values, recorded_values)]
            cells += [_range(plain_values), _range(recorded_values),
                      f"{statistics.median(recorded_values) / statistics.median(plain_values):.2f} "
                      f"({min(ratios):.2f}–{max(ratios):.2f})"]
        size, compressed, events = sizes[name]
        print(f"| {name} | {' | '.join(cells)} | {events:,} | {size / 1e6:.1f} | {size / max(events, 1):.2f} "
              f"| {compressed / 1e6:.1f} | {compressed / max(events, 1):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
