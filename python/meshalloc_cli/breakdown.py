"""meshalloc's own account of where a run's memory went, read from the library's statistics at
exit (MESHALLOC_STATS=json written to MESHALLOC_STATS_FILE, one file per process).

The components and what each means come from the report itself ("breakdown" and
"breakdown_components", generated in the library from its one list, src/api/stats.h); this
module only sums them over the processes of a run and groups them into the columns the
tables show. See docs/memory.md.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from . import paths
from .allocators import Allocator

# The library's variables; a user who set either keeps their own report and gets no breakdown.
STATS_VARIABLE = "MESHALLOC_STATS"
STATS_FILE_VARIABLE = "MESHALLOC_STATS_FILE"
# "%p" is the process id: each process of a preloaded tree writes its own report.
REPORT_PATTERN = "stats.%p.json"
REPORT_GLOB = "stats.*.json"

# The column set of the tables: the library's component groups, in display order, with their
# labels. A group the library reports but that is not here ("other", "total") is still in the
# JSON and TSV files' per-component data.
COLUMNS: Tuple[Tuple[str, str], ...] = (
    ("live", "live"),
    ("attached_free", "attached free"),
    ("detached_free", "detached free"),
    ("dirty", "dirty"),
    ("mesh_saving", "meshed saving"),
    ("large", "large"),
    ("metadata", "metadata"),
    ("page_tables", "page tables"),
)


@dataclass
class Breakdown:
    """The components summed over every process that wrote a report, in bytes."""

    components: Dict[str, int]
    info: List[dict] = field(default_factory=list)  # name, group, in_heap_total, basis, description
    processes: int = 0

    def groups(self) -> Dict[str, int]:
        totals: Dict[str, int] = {}
        for item in self.info:
            name, group = item.get("name"), item.get("group")
            if name in self.components and group:
                totals[group] = totals.get(group, 0) + self.components[name]
        return totals

    def column(self, group: str) -> Optional[int]:
        return self.groups().get(group)

    def to_json(self) -> dict:
        return {"at": "exit", "processes": self.processes, "components": dict(self.components),
                "groups": self.groups(), "component_info": list(self.info)}


def is_meshalloc(allocator: Allocator) -> bool:
    library = allocator.library
    return library is not None and Path(library).name == paths.MESHALLOC_LIBRARY.name


def parse_report(text: str) -> Optional[Breakdown]:
    """One process's report; None if it holds no breakdown (an older library, a text report)."""
    try:
        report = json.loads(text)
    except ValueError:
        return None
    values = report.get("breakdown") if isinstance(report, dict) else None
    if not isinstance(values, dict):
        return None
    components = {name: int(value) for name, value in values.items() if isinstance(value, int)}
    info = [item for item in report.get("breakdown_components", []) if isinstance(item, dict)]
    return Breakdown(components, info, 1)


def combine(reports: List[Breakdown]) -> Optional[Breakdown]:
    """Sums over the processes of a tree, as PSS is summed over it."""
    if not reports:
        return None
    total: Dict[str, int] = {}
    for report in reports:
        for name, value in report.components.items():
            total[name] = total.get(name, 0) + value
    return Breakdown(total, reports[0].info, len(reports))


class Collector:
    """Asks the library for its report at exit when the run's allocator is meshalloc and the
    user has not set up reports of their own; reads and removes them afterwards."""

    def __init__(self, allocator: Allocator, env: Mapping[str, str]):
        self.directory: Optional[Path] = None
        if is_meshalloc(allocator) and STATS_VARIABLE not in env and STATS_FILE_VARIABLE not in env:
            self.directory = Path(tempfile.mkdtemp(prefix="meshalloc-stats-"))

    def environment(self, env: Dict[str, str]) -> Dict[str, str]:
        if self.directory is not None:
            env = dict(env)
            env[STATS_VARIABLE] = "json"
            env[STATS_FILE_VARIABLE] = str(self.directory / REPORT_PATTERN)
        return env

    def collect(self) -> Optional[Breakdown]:
        if self.directory is None:
            return None
        reports = []
        for path in sorted(self.directory.glob(REPORT_GLOB)):
            try:
                parsed = parse_report(path.read_text())
            except OSError:
                continue
            if parsed is not None:
                reports.append(parsed)
        return combine(reports)

    def close(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
