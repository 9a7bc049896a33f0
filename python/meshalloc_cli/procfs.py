"""One sample of a process tree's memory, read from /proc.

PSS is the measure that matters: a page shared by n mappings counts 1/n in each, so a
page meshalloc has meshed (one physical page behind two or more virtual spans of the
same process) is counted once in total. RSS counts it once per mapping -- it overstates
a meshing allocator's memory and is recorded only to show that difference. Page-table
memory (VmPTE) and the number of mappings are recorded beside it because meshing costs
both: each meshed span is its own mapping, bounded by vm.max_map_count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

import psutil

KIB = 1024
PROC = "/proc"
STATUS_PAGE_TABLES = b"VmPTE:"
NEWLINE = b"\n"
# /proc/PID/maps of a process near vm.max_map_count is several MiB; read it in large
# chunks so counting lines costs few system calls.
MAPS_READ_CHUNK = 1 << 20


@dataclass
class ProcessMemory:
    """What one process contributes to a sample, in bytes (maps: a count)."""

    pss: int
    rss: int
    pte: int
    maps: int


@dataclass
class TreeMemory:
    """A whole process tree at one instant."""

    pss: int = 0
    rss: int = 0
    pte: int = 0
    maps: int = 0
    processes: int = 0

    def add(self, memory: ProcessMemory) -> None:
        self.pss += memory.pss
        self.rss += memory.rss
        self.pte += memory.pte
        self.maps += memory.maps
        self.processes += 1


def _page_table_bytes(pid: int) -> int:
    try:
        with open(f"{PROC}/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(STATUS_PAGE_TABLES):
                    return int(line.split()[1]) * KIB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _mapping_count(pid: int) -> int:
    count = 0
    try:
        with open(f"{PROC}/{pid}/maps", "rb", buffering=0) as maps:
            while True:
                chunk = maps.read(MAPS_READ_CHUNK)
                if not chunk:
                    break
                count += chunk.count(NEWLINE)
    except OSError:
        return 0
    return count


class ProcessReader:
    """Reads processes' memory, keeping psutil's Process objects between samples (psutil
    checks each one's start time, so a recycled pid is never mistaken for the old one)."""

    def __init__(self) -> None:
        self._processes: Dict[int, psutil.Process] = {}

    def _process(self, pid: int) -> Optional[psutil.Process]:
        process = self._processes.get(pid)
        if process is None:
            try:
                process = psutil.Process(pid)
            except psutil.Error:
                return None
            self._processes[pid] = process
        return process

    def read(self, pid: int) -> Optional[ProcessMemory]:
        """One process's memory; None once it has exited or become a zombie (a zombie
        has no address space left to measure)."""
        process = self._process(pid)
        if process is None:
            return None
        try:
            full = process.memory_full_info()  # PSS from /proc/PID/smaps_rollup
        except psutil.Error:
            self._processes.pop(pid, None)
            return None
        if full.rss == 0 and full.pss == 0:
            return None
        return ProcessMemory(pss=full.pss, rss=full.rss, pte=_page_table_bytes(pid), maps=_mapping_count(pid))

    def descendants(self, root_pid: int) -> List[int]:
        """root_pid and every process below it."""
        root = self._process(root_pid)
        if root is None:
            return []
        try:
            return [root_pid] + [child.pid for child in root.children(recursive=True)]
        except psutil.Error:
            return [root_pid]

    def read_tree(self, pids: Iterable[int]) -> TreeMemory:
        tree = TreeMemory()
        seen = set()
        for pid in pids:
            seen.add(pid)
            memory = self.read(pid)
            if memory is not None:
                tree.add(memory)
        for stale in set(self._processes) - seen:
            del self._processes[stale]
        return tree
