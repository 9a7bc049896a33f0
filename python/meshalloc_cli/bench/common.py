"""What the experiments share: their common shape (ExperimentBase), the environment variables
that narrow a run, the private copy of libmeshalloc.so they preload, the machine's load, and
the numbers, files and figures they write. One definition each, so that every experiment reads
its settings and writes its TSV cells, tables and figures the same way."""

from __future__ import annotations

import csv
import math
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from .. import paths
from ..allocators import Allocator
from ..measure import KIB
from .framework import Claim, Context, ExperimentUnavailable

# The `key=value` fields of the one result line each benchmark program prints (bench/*.cc,
# bench/thread_scaling, bench/ruby/strings.rb).
KEY_VALUE = re.compile(r"(\w+)=(\S+)")
LOADAVG = Path("/proc/loadavg")
HOLDS_WORD = {True: "yes", False: "no", None: "—"}  # a claim's verdict in a Markdown table


# ---------------------------------------------------------------------------------------------
# The experiment

@dataclass(frozen=True)
class ExperimentBase:
    """What every experiment says of itself (framework.Experiment); a subclass adds run()."""

    name: str  # the command-line name: "redis-lru"
    title: str  # "Redis LRU cache"
    paper: str  # "Mesh §6.2.2, figure 7"


def checked_repetitions(context: Context, counts: Mapping[str, int]) -> int:
    """The mode's repetition count (or --repeat's); fewer than one is no run at all."""
    repetitions = context.repetitions(**counts)
    if repetitions < 1:
        raise ExperimentUnavailable("the repetition count must be at least 1")
    return repetitions


def names_from(variable: str) -> Optional[List[str]]:
    """The names an environment variable narrows a run to (comma- or space-separated), or None."""
    text = os.environ.get(variable, "")
    names = [name for name in re.split(r"[,\s]+", text) if name]
    return names or None


# ---------------------------------------------------------------------------------------------
# The library and the machine

def quiet(command: Sequence[str], cwd: Optional[Path] = None) -> str:
    """A command's standard output, stripped; "" when it cannot run."""
    try:
        return subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def private_library_copy(library: Path, directory: Path) -> Path:
    """libmeshalloc.so copied aside for the whole experiment, so that a `make release` in
    the middle of it cannot put two versions of the library in one table."""
    copy = directory / library.name
    shutil.copy2(library, copy)
    return copy


def private_meshalloc_copy(context: Context) -> Optional[Path]:
    """A copy of libmeshalloc.so in the output directory, which every meshalloc run preloads:
    a `make release` elsewhere during the experiment must not mix two builds in one table.
    meshalloc-version.txt says which build it was."""
    library = context.meshalloc_lib
    if not library.is_file():
        return None
    copy = private_library_copy(library, context.out)
    commit = quiet(["git", "rev-parse", "HEAD"], context.root)
    changed = len([line for line in quiet(["git", "status", "--porcelain", "--", "src"], context.root).splitlines()
                   if line.strip()])
    built = datetime.fromtimestamp(library.stat().st_mtime).isoformat(sep=" ", timespec="seconds")
    (context.out / "meshalloc-version.txt").write_text(
        f"library: {library} ({built})\ncommit: {commit or 'unknown'}\n"
        f"uncommitted changes under src/: {changed} file(s)\n")
    return copy


def glibc_shim(context: Context, name: str, skipped: List[str]) -> Optional[Allocator]:
    """glibc's malloc through the project's shim (tools/glibc-shim), so that glibc runs with an
    LD_PRELOAD like every other allocator; None, with a note in `skipped`, when `make release`
    has not built the shim."""
    shim = context.build_dir / paths.GLIBC_SHIM_LIBRARY
    if not shim.is_file():
        skipped.append(f"{name}: {shim} is not built (`make release`)")
        return None
    return Allocator(name=name, library=shim, description="glibc malloc through the project's shim")


def machine_json() -> Dict[str, object]:
    """The machine, as every experiment's summary.json records it."""
    return {"kernel": platform.release(), "machine": platform.machine(), "cpus": os.cpu_count()}


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as the notes show them ("?" when unreadable)."""
    try:
        return " ".join(LOADAVG.read_text().split()[:3])
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------------
# Numbers, files and figures

def geomean(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [value for value in values if value is not None and value > 0]
    if not present:
        return None
    return math.exp(sum(math.log(value) for value in present) / len(present))


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
PNG_DPI = 120
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
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display
    import matplotlib.pyplot as pyplot
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
    written = []
    for extension in ("png", "svg"):
        path = stem.with_suffix("." + extension)
        # No date in the SVG: identical data gives identical files.
        figure.savefig(path, dpi=PNG_DPI, metadata={"Date": None} if extension == "svg" else None)
        written.append(path)
    pyplot.close(figure)
    return written


def size_text(nbytes: int) -> str:
    """An object size as the workloads' descriptions give it: "16 KiB", "24 B"."""
    return f"{nbytes // KIB} KiB" if nbytes >= KIB and nbytes % KIB == 0 else f"{nbytes} B"


def claims_table(found: Sequence[Claim], paper_heading: str = "paper") -> str:
    """The claims as a Markdown table: claim, paper, ours, holds (yes/no/—), note."""
    return markdown_table(["claim", paper_heading, "ours", "holds", "note"],
                          ([claim.claim, claim.paper, claim.ours, HOLDS_WORD[claim.holds], claim.note]
                           for claim in found), left=5)
