"""One sample of a process tree's memory, read from /proc.

PSS is the measure that matters: a page shared by n mappings counts 1/n in each, so a
page meshalloc has meshed (one physical page behind two or more virtual spans of the
same process) is counted once in total. RSS counts it once per mapping -- it overstates
a meshing allocator's memory and is recorded only to show that difference. Page-table
memory (VmPTE) and the number of mappings are recorded beside it because meshing costs
both: each meshed span is its own mapping, bounded by vm.max_map_count.

Counting mappings is the one expensive read: the kernel prints every mapping into
/proc/PID/maps, a few microseconds each -- tens of milliseconds once meshing has made
tens of thousands of them, several sampling intervals. The count is therefore refreshed
only as often as keeps its cost under MAPS_TIME_SHARE of the wall time, and samples in
between leave it unset (an empty TSV cell) rather than repeat a stale value. Small
processes are counted in every sample.
"""

from __future__ import annotations

import time
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
# /proc/PID/stat after the ')' closing the command name: state, then ppid, pgrp, session,
# tty_nr, tpgid, flags (proc(5) fields 3 and 9).
STAT_STATE = 0
STAT_FLAGS = 6
EXITED_STATES = (b"Z", b"X", b"x")
PF_EXITING = 0x00000004  # include/linux/sched.h
# At most this share of the wall time goes to counting mappings (see above).
MAPS_TIME_SHARE = 0.1


@dataclass
class ProcessMemory:
    """What one process contributes to a sample, in bytes (maps: a count, None when not
    counted in this sample)."""

    pss: int
    rss: int
    pte: int
    maps: Optional[int]


@dataclass
class TreeMemory:
    """A whole process tree at one instant."""

    pss: int = 0
    rss: int = 0
    pte: int = 0
    maps: Optional[int] = None  # None: mappings were not counted in this sample
    processes: int = 0

    def add(self, memory: ProcessMemory) -> None:
        self.pss += memory.pss
        self.rss += memory.rss
        self.pte += memory.pte
        if memory.maps is not None:
            self.maps = (self.maps or 0) + memory.maps
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


def exiting(pid: int) -> bool:
    """True once `pid` has begun to exit (or is gone): the kernel sets PF_EXITING before
    it tears the address space down, so a sample read after that may have caught the
    memory half released -- or, in a cgroup, the charge after the tear-down and the PSS
    before it -- and says nothing about the program's own use of memory."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return True
    # The command name (field 2) may hold spaces and parentheses; fields after the last
    # ')' are plain numbers.
    fields = text[text.rfind(b")") + 2:].split()
    try:
        state, flags = fields[STAT_STATE], int(fields[STAT_FLAGS])
    except (IndexError, ValueError):
        return True
    return state in EXITED_STATES or bool(flags & PF_EXITING)


class ProcessReader:
    """Reads processes' memory, keeping psutil's Process objects between samples (psutil
    checks each one's start time, so a recycled pid is never mistaken for the old one)."""

    def __init__(self) -> None:
        self._processes: Dict[int, psutil.Process] = {}
        self._maps_counted_at = float("-inf")  # time.monotonic() of the last count
        self._maps_cost = 0.0  # seconds the last count took, over the whole tree
        self._maps_seconds = 0.0  # time spent counting in the current sample

    def _process(self, pid: int) -> Optional[psutil.Process]:
        process = self._processes.get(pid)
        if process is None:
            try:
                process = psutil.Process(pid)
            except psutil.Error:
                return None
            self._processes[pid] = process
        return process

    def read(self, pid: int, count_maps: bool = True) -> Optional[ProcessMemory]:
        """One process's memory; None once it has exited or become a zombie (a zombie
        has no address space left to measure). Mappings are counted if `count_maps`."""
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
        maps = None
        if count_maps:
            started = time.monotonic()
            maps = _mapping_count(pid)
            self._maps_seconds += time.monotonic() - started
        return ProcessMemory(pss=full.pss, rss=full.rss, pte=_page_table_bytes(pid), maps=maps)

    def descendants(self, root_pid: int) -> List[int]:
        """root_pid and every process below it."""
        root = self._process(root_pid)
        if root is None:
            return []
        try:
            return [root_pid] + [child.pid for child in root.children(recursive=True)]
        except psutil.Error:
            return [root_pid]

    def _maps_due(self, now: float) -> bool:
        return (now - self._maps_counted_at) * MAPS_TIME_SHARE >= self._maps_cost

    def read_tree(self, pids: Iterable[int]) -> TreeMemory:
        """The tree's memory; its mappings are counted when that is due (see above)."""
        tree = TreeMemory()
        seen = set()
        now = time.monotonic()
        count_maps = self._maps_due(now)
        self._maps_seconds = 0.0
        for pid in pids:
            seen.add(pid)
            memory = self.read(pid, count_maps)
            if memory is not None:
                tree.add(memory)
        if count_maps:
            self._maps_counted_at = now
            self._maps_cost = self._maps_seconds
        for stale in set(self._processes) - seen:
            del self._processes[stale]
        return tree
