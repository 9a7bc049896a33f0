"""Files a run or a comparison leaves behind: TSV time series, JSON summaries, and the
comparison table as TSV and Markdown. Figures are in plotting.py.

TSV files hold raw integers (bytes, counts) and seconds, one header line, no comments,
so that any tool (pandas, R, awk, gnuplot) reads them without options; the human units
live in the Markdown table and the printed summaries.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from .breakdown import COLUMNS as BREAKDOWN_COLUMNS
from .bench import report as bench_report
from .bench.stats import Stat
from .compare import Comparison, TableRow
from .errors import MeshallocError
from .measure import KIB, METRIC_LABELS, MIB, RunResult, Sample

SAMPLE_COLUMNS = ("time_s", "pss_bytes", "rss_bytes", "pte_bytes", "maps", "cgroup_bytes", "processes")
TIME_DECIMALS = 4  # 0.1 ms: finer than any sampling interval meshalloc uses
RATIO_DECIMALS = 3
MIB_DECIMALS = 1  # 0.1 MiB: finer than run-to-run noise of any real program
SECONDS_DECIMALS = 3  # shown in the table: 1 ms, well above the sampling jitter
NO_VALUE = "—"
RSS_NOTE = ("RSS counts a meshed page once per virtual mapping, so it overstates a meshing "
            "allocator's memory; compare PSS or the cgroup charge.")

BREAKDOWN_NOTE = ("live … page tables: meshalloc's own breakdown of its memory at the command's exit "
                 "(MESHALLOC_STATS=json, summed over the process tree; medians), see docs/memory.md. "
                 "Meshed saving is memory not used, not part of the total; — for other allocators.")

RUN_FILES = {"samples": "samples.tsv", "summary": "summary.json"}
COMPARE_FILES = {"samples": "samples.tsv", "runs": "runs.tsv", "table_tsv": "table.tsv",
                 "table_md": "table.md", "summary": "summary.json", "logs": "logs"}
FIGURE_STEM = "memory"


def prepare_output_directory(directory: Path) -> Path:
    """Create the directory and prove it is writable, before any command runs -- a
    measurement that cannot be saved should fail in a second, not after an hour."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".meshalloc-write-test-"):
            pass
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise MeshallocError(f"cannot write to output directory {directory}: {reason}") from None
    return directory


def _cell(value: Optional[float], decimals: int) -> str:
    return "" if value is None else f"{value:.{decimals}f}"


def _sample_cells(sample: Sample) -> List[str]:
    return [f"{sample.time:.{TIME_DECIMALS}f}", str(sample.pss), str(sample.rss), str(sample.pte),
            "" if sample.maps is None else str(sample.maps),
            "" if sample.cgroup is None else str(sample.cgroup), str(sample.processes)]


def _write_tsv(path: Path, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def _write_json(path: Path, data: Dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")


def run_summary(result: RunResult) -> Dict[str, Any]:
    """The JSON form of one run (also embedded in a comparison's summary)."""
    return {
        "command": result.command,
        "allocator": {"name": result.allocator.name,
                      "library": str(result.allocator.library) if result.allocator.library else None,
                      "environment": dict(result.allocator.set_env)},
        "started": result.started,
        "interval_s": result.interval,
        "achieved_hz": result.achieved_rate,
        "samples": len(result.samples),
        "wall_time_s": result.wall_time,
        "exit": {"returncode": result.returncode, "exit_code": result.exit_code, "signal": result.signal_name,
                 "interrupted": result.interrupted},
        "cgroup": {"available": result.cgroup.available, "version": result.cgroup.version,
                   "path": result.cgroup.path, "reason": result.cgroup.reason,
                   "kernel_peak_bytes": result.cgroup_kernel_peak},
        "metrics": {metric: {"label": METRIC_LABELS[metric], "mean": summary.mean, "peak": summary.peak,
                             "final": summary.final}
                    for metric, summary in result.summaries.items()},
        "units": {"pss": "bytes", "rss": "bytes", "pte": "bytes", "cgroup": "bytes", "maps": "count"},
        "breakdown": result.breakdown.to_json() if result.breakdown else None,
    }


def write_run(result: RunResult, directory: Path) -> Dict[str, Path]:
    """samples.tsv and summary.json for one run; returns what was written."""
    written = {key: directory / name for key, name in RUN_FILES.items()}
    _write_tsv(written["samples"], SAMPLE_COLUMNS, (_sample_cells(sample) for sample in result.samples))
    _write_json(written["summary"], run_summary(result))
    return written


# -- the comparison table -----------------------------------------------------------

def _stat_text(stat: Optional[Stat], scale: float, decimals: int, show_range: bool) -> str:
    if stat is None:
        return NO_VALUE
    text = f"{stat.median / scale:.{decimals}f}"
    if show_range and stat.low != stat.high:
        text += f" ({stat.low / scale:.{decimals}f}–{stat.high / scale:.{decimals}f})"
    return text


def _ratio_text(ratio: Optional[float]) -> str:
    return NO_VALUE if ratio is None else f"{ratio:.2f}"


def _has_cgroup(comparison: Comparison) -> bool:
    return any(row.peak_cgroup is not None for row in comparison.rows)


def _has_breakdown(comparison: Comparison) -> bool:
    return any(row.has_breakdown for row in comparison.rows)


def table_cells(comparison: Comparison) -> tuple:
    """(headers, rows) of the human table, shared by the terminal and Markdown renderers.
    With repeats, each median is followed by the (min–max) range over the runs."""
    show_range = comparison.repeat > 1
    with_cgroup = _has_cgroup(comparison)
    headers = ["allocator", "ok", "mean PSS MiB", "peak PSS MiB", "time s",
               "mean ×", "peak ×", "time ×"]
    if with_cgroup:
        headers.append("peak cgroup MiB")
    headers += ["page tables KiB", "mappings"]
    with_breakdown = _has_breakdown(comparison)
    if with_breakdown:
        headers += [f"{label} MiB" for _, label in BREAKDOWN_COLUMNS]
    rows = []
    for row in comparison.rows:
        name = row.allocator + (" (baseline)" if row.allocator == comparison.baseline else "")
        cells = [name, f"{row.succeeded}/{row.runs}",
                 _stat_text(row.mean_pss, MIB, MIB_DECIMALS, show_range),
                 _stat_text(row.peak_pss, MIB, MIB_DECIMALS, show_range),
                 _stat_text(row.time, 1, SECONDS_DECIMALS, show_range),
                 _ratio_text(row.mean_ratio), _ratio_text(row.peak_ratio), _ratio_text(row.time_ratio)]
        if with_cgroup:
            cells.append(_stat_text(row.peak_cgroup, MIB, MIB_DECIMALS, show_range))
        cells += [_stat_text(row.peak_pte, KIB, 0, False), _stat_text(row.peak_maps, 1, 0, False)]
        if with_breakdown:
            cells += [_stat_text(row.breakdown.get(group), MIB, MIB_DECIMALS, False) for group, _ in BREAKDOWN_COLUMNS]
        rows.append(cells)
    return headers, rows


def table_notes(comparison: Comparison) -> List[str]:
    notes = [f"Medians over {comparison.repeat} interleaved run(s) per allocator; ratios against "
             f"{comparison.baseline}. PSS from /proc/PID/smaps_rollup summed over the process tree, sampled "
             f"every {comparison.interval * 1000:g} ms; page tables and mappings are medians of the peaks."]
    if _has_cgroup(comparison):
        notes.append("peak cgroup: the kernel's high-water mark of the run's memory cgroup (anonymous memory, "
                     "page cache and kernel memory charged to it).")
    else:
        reasons = {run.result.cgroup.reason for run in comparison.runs if run.result.cgroup.reason}
        notes.append("No memory cgroup: " + ("; ".join(sorted(reasons)) or "none was created") + ".")
    if _has_breakdown(comparison):
        notes.append(BREAKDOWN_NOTE)
    failures = comparison.failed_runs
    if failures:
        notes.append("Failed runs (left out of the medians): " + ", ".join(
            f"{run.allocator} #{run.repetition} {run.result.describe_exit()}" for run in failures) + ".")
    if comparison.interrupted:
        notes.append("Interrupted: the table covers only the runs that finished.")
    notes.append(RSS_NOTE)
    return notes


def markdown_table(comparison: Comparison) -> str:
    headers, rows = table_cells(comparison)
    lines = [f"`{shlex.join(comparison.command)}`", "", bench_report.markdown_table(headers, rows)]
    lines += table_notes(comparison)
    return "\n".join(lines) + "\n"


TABLE_COLUMNS = ("allocator", "runs", "succeeded",
                 "mean_pss_mib", "mean_pss_min_mib", "mean_pss_max_mib",
                 "peak_pss_mib", "peak_pss_min_mib", "peak_pss_max_mib",
                 "time_s", "time_min_s", "time_max_s",
                 "mean_ratio", "peak_ratio", "time_ratio",
                 "peak_cgroup_mib", "peak_pte_kib", "peak_maps") + tuple(
                     f"exit_{group}_mib" for group, _ in BREAKDOWN_COLUMNS)


def _stat_cells(stat: Optional[Stat], scale: float, decimals: int) -> List[str]:
    if stat is None:
        return ["", "", ""]
    return [_cell(stat.median / scale, decimals), _cell(stat.low / scale, decimals), _cell(stat.high / scale, decimals)]


def _table_tsv_row(row: TableRow) -> List[str]:
    return ([row.allocator, str(row.runs), str(row.succeeded)]
            + _stat_cells(row.mean_pss, MIB, RATIO_DECIMALS)
            + _stat_cells(row.peak_pss, MIB, RATIO_DECIMALS)
            + _stat_cells(row.time, 1, TIME_DECIMALS)
            + [_cell(row.mean_ratio, RATIO_DECIMALS), _cell(row.peak_ratio, RATIO_DECIMALS),
               _cell(row.time_ratio, RATIO_DECIMALS)]
            + [_cell(row.peak_cgroup.median / MIB if row.peak_cgroup else None, RATIO_DECIMALS),
               _cell(row.peak_pte.median / KIB if row.peak_pte else None, 0),
               _cell(row.peak_maps.median if row.peak_maps else None, 0)]
            + [_cell(row.breakdown[group].median / MIB if row.breakdown.get(group) else None, RATIO_DECIMALS)
               for group, _ in BREAKDOWN_COLUMNS])


RUN_COLUMNS = ("order", "allocator", "repetition", "exit_code", "signal", "wall_time_s", "samples",
               "mean_pss_bytes", "peak_pss_bytes", "final_pss_bytes", "peak_rss_bytes",
               "peak_cgroup_bytes", "kernel_peak_cgroup_bytes", "peak_pte_bytes", "peak_maps", "log") + tuple(
                   f"exit_{group}_bytes" for group, _ in BREAKDOWN_COLUMNS)


def _run_row(run) -> List[str]:
    result = run.result

    def pick(metric: str, attribute: str) -> str:
        summary = result.summary(metric)
        return "" if summary is None else str(round(getattr(summary, attribute)))

    return [str(run.order), run.allocator, str(run.repetition), str(result.exit_code), result.signal_name or "",
            f"{result.wall_time:.{TIME_DECIMALS}f}", str(len(result.samples)),
            pick("pss", "mean"), pick("pss", "peak"), pick("pss", "final"), pick("rss", "peak"),
            pick("cgroup", "peak"), "" if result.cgroup_kernel_peak is None else str(result.cgroup_kernel_peak),
            pick("pte", "peak"), pick("maps", "peak"), run.log.name if run.log else ""] + [
                _breakdown_cell(result, group) for group, _ in BREAKDOWN_COLUMNS]


def _breakdown_cell(result: RunResult, group: str) -> str:
    value = result.breakdown.column(group) if result.breakdown else None
    return "" if value is None else str(value)


def write_comparison(comparison: Comparison, directory: Path) -> Dict[str, Path]:
    """samples.tsv (every sample of every run), runs.tsv (one line per run), table.tsv,
    table.md and summary.json; returns what was written.

    samples.tsv stacks the runs in the order they ran (that of runs.tsv), one contiguous
    block per (allocator, repetition). Its time_s is, as in `run`, seconds since that run's
    command started -- it restarts at 0 in each block, which is what lets the runs be laid
    over each other in a figure."""
    written = {key: directory / name for key, name in COMPARE_FILES.items() if key != "logs"}
    _write_tsv(written["samples"], ("allocator", "repetition") + SAMPLE_COLUMNS,
               ([run.allocator, str(run.repetition)] + _sample_cells(sample)
                for run in comparison.runs for sample in run.result.samples))
    _write_tsv(written["runs"], RUN_COLUMNS, (_run_row(run) for run in comparison.runs))
    _write_tsv(written["table_tsv"], TABLE_COLUMNS, (_table_tsv_row(row) for row in comparison.rows))
    written["table_md"].write_text(markdown_table(comparison))
    _write_json(written["summary"], {
        "command": comparison.command,
        "allocators": [{"name": a.name, "library": str(a.library) if a.library else None,
                        "environment": dict(a.set_env)} for a in comparison.allocators],
        "baseline": comparison.baseline,
        "repeat": comparison.repeat,
        "interval_s": comparison.interval,
        "interrupted": comparison.interrupted,
        "machine": {"kernel": platform.release(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "runs": [dict(run_summary(run.result), order=run.order, repetition=run.repetition) for run in comparison.runs],
    })
    return written

