"""Figures: memory over time for one run, and every allocator's memory over time for a
comparison. Each figure is saved as PNG (to look at) and SVG (to put in a paper).

matplotlib is imported only here and only when a figure is drawn: it is the slowest
import of the package, and `meshalloc` commands that draw nothing should start quickly.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, List, Sequence

from .compare import Comparison, RunRecord
from .measure import KIB, MIB, RunResult

FIGURE_SIZE_IN = (9.0, 6.0)
HEIGHT_RATIOS = (3, 1)  # memory on top, the page-table/mapping cost of it below
PNG_DPI = 120
TITLE_CHARACTERS = 90  # longer commands are cut with an ellipsis
FAINT_ALPHA = 0.3  # repetitions other than the median one
MAIN_LINE_WIDTH = 1.6
THIN_LINE_WIDTH = 0.8
FORMATS = ("png", "svg")


def load_pyplot():
    """matplotlib's pyplot for files only (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display
    import matplotlib.pyplot as pyplot

    return pyplot


def _title(command: Sequence[str]) -> str:
    text = shlex.join(command)
    return text if len(text) <= TITLE_CHARACTERS else text[:TITLE_CHARACTERS - 1] + "…"


def save_figure(figure, stem: Path) -> List[Path]:
    """stem.png and stem.svg; every figure of the command is written here."""
    written = []
    for extension in FORMATS:
        path = stem.with_suffix("." + extension)
        # No date in the SVG metadata, so identical data gives identical files.
        metadata = {"Date": None} if extension == "svg" else None
        figure.savefig(path, dpi=PNG_DPI, metadata=metadata)
        written.append(path)
    return written


def _series(result: RunResult, metric: str, scale: float):
    points = [(s.time, getattr(s, metric) / scale) for s in result.samples if getattr(s, metric) is not None]
    return [t for t, _ in points], [v for _, v in points]


def plot_run(result: RunResult, stem: Path) -> List[Path]:
    """memory.png/.svg for one run; returns the files written."""
    pyplot = load_pyplot()
    figure, (memory, cost) = pyplot.subplots(2, 1, sharex=True, figsize=FIGURE_SIZE_IN,
                                             gridspec_kw={"height_ratios": HEIGHT_RATIOS})
    times, pss = _series(result, "pss", MIB)
    memory.plot(times, pss, label="PSS", linewidth=MAIN_LINE_WIDTH)
    if result.summary("cgroup"):
        memory.plot(*_series(result, "cgroup", MIB), label="cgroup charge", linestyle="--")
    memory.plot(*_series(result, "rss", MIB), label="RSS (double-counts meshed pages)", linestyle=":",
                color="grey")
    memory.set_ylabel("MiB")
    memory.set_ylim(bottom=0)
    memory.legend(loc="best")
    status = "" if result.succeeded else f" — {result.describe_exit()}"
    memory.set_title(f"{_title(result.command)}\nunder {result.allocator.name}{status}")

    cost.plot(*_series(result, "pte", KIB), label="page tables (KiB)", color="tab:purple")
    cost.set_ylabel("page tables KiB")
    cost.set_ylim(bottom=0)
    mappings = cost.twinx()
    mappings.plot(*_series(result, "maps", 1), label="mappings", color="tab:brown", linestyle="--")
    mappings.set_ylabel("mappings")
    mappings.set_ylim(bottom=0)
    handles = cost.get_legend_handles_labels()[0] + mappings.get_legend_handles_labels()[0]
    cost.legend(handles, [h.get_label() for h in handles], loc="best")
    cost.set_xlabel("seconds")
    figure.tight_layout()
    written = save_figure(figure, stem)
    pyplot.close(figure)
    return written


def _representative(runs: Sequence[RunRecord]) -> RunRecord:
    """The run whose mean PSS is the median of its allocator's runs: drawn bold, the
    others faint, so the figure shows both the typical curve and the spread."""
    def mean_pss(run: RunRecord) -> float:
        summary = run.result.summary("pss")
        return summary.mean if summary else 0.0

    good = [run for run in runs if run.result.succeeded] or list(runs)
    ordered = sorted(good, key=mean_pss)
    return ordered[(len(ordered) - 1) // 2]


def plot_comparison(comparison: Comparison, stem: Path) -> List[Path]:
    """memory.png/.svg with every allocator's PSS over time; returns the files written."""
    pyplot = load_pyplot()
    figure, (memory, cost) = pyplot.subplots(2, 1, sharex=True, figsize=FIGURE_SIZE_IN,
                                             gridspec_kw={"height_ratios": HEIGHT_RATIOS})
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    by_allocator: Dict[str, List[RunRecord]] = {}
    for run in comparison.runs:
        by_allocator.setdefault(run.allocator, []).append(run)
    for index, (name, runs) in enumerate(by_allocator.items()):
        colour = colours[index % len(colours)]
        main = _representative(runs)
        for run in runs:
            if run is main:
                continue
            memory.plot(*_series(run.result, "pss", MIB), color=colour, alpha=FAINT_ALPHA, linewidth=THIN_LINE_WIDTH)
        row = comparison.row(name)
        label = name
        if row and row.peak_pss:
            label += f" (peak {row.peak_pss.median / MIB:.1f} MiB)"
        memory.plot(*_series(main.result, "pss", MIB), color=colour, linewidth=MAIN_LINE_WIDTH, label=label)
        cost.plot(*_series(main.result, "maps", 1), color=colour, linewidth=THIN_LINE_WIDTH, label=name)
    memory.set_ylabel("PSS MiB")
    memory.set_ylim(bottom=0)
    memory.legend(loc="best")
    repeats = f", median run bold of {comparison.repeat}" if comparison.repeat > 1 else ""
    memory.set_title(f"{_title(comparison.command)}\nPSS of the process tree over time{repeats}")
    cost.set_ylabel("mappings")
    cost.set_ylim(bottom=0)
    cost.set_xlabel("seconds")
    figure.tight_layout()
    written = save_figure(figure, stem)
    pyplot.close(figure)
    return written
