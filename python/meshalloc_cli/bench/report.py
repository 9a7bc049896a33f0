"""How the experiments write what they measured: TSV files, Markdown tables, the text of a
median with its range, and grouped ratio bar charts (PNG and SVG). One definition each, so that
every table and figure of `meshalloc bench` reads the same way."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ..allocators import Allocator
from ..measure import KIB
from .framework import Claim
from .stats import Geomean, Stat

NO_VALUE = "—"
TIMES = "×"  # after a ratio


def range_text(median: Optional[float], low: Optional[float], high: Optional[float], decimals: int = 2,
               scale: float = 1.0, suffix: str = "", thousands: bool = False) -> str:
    """"1.23× (1.10–1.31)": the value, and its range unless both ends print the same at this
    precision; "—" when there is no value."""
    if median is None:
        return NO_VALUE
    form = f"{',' if thousands else ''}.{decimals}f"
    text = f"{median / scale:{form}}{suffix}"
    if low is not None and high is not None:
        ends = f"{low / scale:{form}}", f"{high / scale:{form}}"
        if ends[0] != ends[1]:
            text += f" ({ends[0]}–{ends[1]})"
    return text


def stat_text(stat: Optional[Stat], decimals: int = 2, scale: float = 1.0, suffix: str = "",
              show_range: bool = True, thousands: bool = False) -> str:
    """A Stat as "median (min–max)" (range_text)."""
    if stat is None:
        return NO_VALUE
    return range_text(stat.median, stat.low if show_range else None, stat.high if show_range else None,
                      decimals, scale, suffix, thousands)


def geomean_text(value: Geomean, decimals: int = 2) -> str:
    """A Geomean as "value (per-repetition low–high)"."""
    return range_text(value.value, value.low, value.high, decimals)


def notes_section(notes: Sequence[str], failures: Sequence[str] = ()) -> List[str]:
    """A table.md's "## Notes" lines: the caveats, then one "failed:" line per failed run."""
    return ["## Notes", "", *[f"- {note}" for note in list(notes) + [f"failed: {line}" for line in failures]], ""]


def number(value: Optional[float]) -> str:
    """A TSV cell: integers as integers, others with 6 significant digits, missing as empty."""
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def write_tsv(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> Path:
    """One header line, tab-separated, no quoting surprises: what pandas, R and awk read as is."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1) -> str:
    """The first `left` columns are text (left-aligned), the others numbers (right-aligned)."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if index < left else "---:" for index in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


@dataclass
class BarPanel:
    """One panel of a grouped bar chart of ratios: a group of bars per row (workload), one
    bar per series (allocator), whiskers from `low` to `high` where known."""

    title: str
    groups: List[str]
    series: Dict[str, List[Optional[float]]]
    low: Dict[str, List[Optional[float]]] = field(default_factory=dict)
    high: Dict[str, List[Optional[float]]] = field(default_factory=dict)


BAR_GROUP_WIDTH = 0.8  # of the space between two groups
FIGURE_WIDTH_PER_GROUP_IN = 0.75
FIGURE_MIN_WIDTH_IN = 7.0
PANEL_HEIGHT_IN = 3.6
RATIO_MARGIN = 1.15  # head room above the largest ratio (and below the smallest)
# Tick sets from fine to coarse; a panel uses the finest that puts at most MAX_TICKS in its range.
RATIO_TICK_SETS = (
    (0.8, 0.85, 0.9, 0.95, 1, 1.05, 1.1, 1.15, 1.2, 1.25),
    (0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2),
    (0.25, 0.5, 0.67, 0.8, 1, 1.25, 1.5, 2, 3, 4),
    (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50),
)
MAX_TICKS = 8
LEGEND_ROOM = 0.06  # of the figure's height, below the panels


def ratio_bar_chart(panels: Sequence[BarPanel], ylabel: str, title: str, stem: Path) -> List[Path]:
    """PNG and SVG of grouped ratio bars on a log scale (a 2× and a 0.5× are equally far from
    the line at 1). Returns the files written."""
    from ..plotting import load_pyplot, save_figure

    pyplot = load_pyplot()
    from matplotlib import ticker

    widest = max((len(panel.groups) for panel in panels), default=1)
    width = max(FIGURE_MIN_WIDTH_IN, FIGURE_WIDTH_PER_GROUP_IN * widest + 2)
    figure, axes = pyplot.subplots(len(panels), 1, figsize=(width, PANEL_HEIGHT_IN * len(panels) + 0.6),
                                   squeeze=False)
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, panel in zip(axes[:, 0], panels):
        count = max(len(panel.series), 1)
        extremes: List[float] = [1.0]
        bar = BAR_GROUP_WIDTH / count
        for index, (name, values) in enumerate(panel.series.items()):
            positions = [group + (index - (count - 1) / 2) * bar for group in range(len(panel.groups))]
            lows = panel.low.get(name, [None] * len(values))
            highs = panel.high.get(name, [None] * len(values))
            shown = [(x, v, lo, hi) for x, v, lo, hi in zip(positions, values, lows, highs) if v is not None and v > 0]
            if not shown:
                continue
            xs = [x for x, _, _, _ in shown]
            heights = [v for _, v, _, _ in shown]
            # Each bar runs from the line at 1 to its ratio: up for slower/larger, down for
            # faster/smaller (bars standing on the axis floor would make 0.5 look like "some").
            axis.bar(xs, [height - 1.0 for height in heights], bottom=1.0, width=bar,
                     color=colours[index % len(colours)], label=name)
            extremes += heights + [hi for _, _, _, hi in shown if hi] + [lo for _, _, lo, _ in shown if lo]
            whiskers = [(x, v, lo, hi) for x, v, lo, hi in shown if lo is not None and hi is not None and lo != hi]
            if whiskers:
                axis.errorbar([x for x, _, _, _ in whiskers], [v for _, v, _, _ in whiskers],
                              yerr=[[max(v - lo, 0) for _, v, lo, _ in whiskers],
                                    [max(hi - v, 0) for _, v, _, hi in whiskers]],
                              fmt="none", ecolor="black", elinewidth=0.7, capsize=1.5)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_yscale("log")
        # Symmetric about 1 on the log scale, labelled with plain ratios.
        low, high = min(extremes) / RATIO_MARGIN, max(extremes) * RATIO_MARGIN
        axis.set_ylim(low, high)
        for ticks in RATIO_TICK_SETS:
            inside = [tick for tick in ticks if low <= tick <= high]
            if min(ticks) <= low and max(ticks) >= high and len(inside) <= MAX_TICKS:
                break
        axis.yaxis.set_major_locator(ticker.FixedLocator(inside))
        axis.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        axis.yaxis.set_minor_locator(ticker.NullLocator())
        axis.set_xticks(range(len(panel.groups)))
        axis.set_xticklabels(panel.groups, rotation=20, ha="right")
        axis.set_ylabel(ylabel)
        axis.set_title(panel.title, fontsize=10)
        axis.grid(axis="y", which="both", alpha=0.3)
        handles, labels = axis.get_legend_handles_labels()
    # One legend for all panels, below them, where no bar can hide behind it.
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout(rect=(0, LEGEND_ROOM, 1, 1))
    written = save_figure(figure, stem)
    pyplot.close(figure)
    return written


def size_text(nbytes: int) -> str:
    """An object size as the workloads' descriptions give it: "16 KiB", "24 B"."""
    return f"{nbytes // KIB} KiB" if nbytes >= KIB and nbytes % KIB == 0 else f"{nbytes} B"




def geomean_claim_text(value: Geomean, rows: int) -> str:
    """A geomean as a claim states it: "0.976× (per repetition 0.95–0.99; geomean over 4 of 5
    programs)"; the count only when there is more than one row."""
    if value.value is None:
        return NO_VALUE
    details = []
    if value.low is not None and value.high is not None:
        details.append(f"per repetition {value.low:.3f}–{value.high:.3f}")
    if rows > 1:
        details.append(f"geomean over {value.rows} of {rows} programs")
    return f"{value.value:.3f}×" + (f" ({'; '.join(details)})" if details else "")


def allocator_json(allocator: Allocator) -> Dict[str, Any]:
    """An allocator as summary.json records it: its label, what was preloaded, its settings."""
    return {"name": allocator.name, "library": str(allocator.library or ""), "environment": dict(allocator.set_env)}


def write_summary_json(out: Path, experiment: str, mode: str, repetitions: int, claims: Sequence[Claim],
                       **details: Any) -> Path:
    """summary.json: what every experiment records (its name, mode, repetitions, the machine and
    its claims) and its own details (allocators, workloads, ...)."""
    path = out / "summary.json"
    path.write_text(json.dumps({
        "experiment": experiment, "mode": mode, "repetitions": repetitions,
        "machine": {"kernel": platform.release(), "machine": platform.machine(), "cpus": os.cpu_count()},
        **details,
        "claims": [dataclasses.asdict(claim) for claim in claims],
    }, indent=2, ensure_ascii=False) + "\n")
    return path
