"""A memory cgroup of its own for each measured command, as the paper's mstat did.

The cgroup's charge counts every page the command's processes fault in -- anonymous
memory once, however many times it is mapped, plus page cache they bring in and kernel
memory on their behalf -- and the kernel keeps a high-water mark between our samples.

cgroup v1 (a `memory` hierarchy): the child cgroup is created *inside* the cgroup
meshalloc itself runs in, so limits set on it (a container's, a CI job's) still apply.

cgroup v2 (the unified hierarchy with the `memory` controller): v2 only lets a cgroup
hand controllers to its children while it has no processes of its own, and meshalloc is a
process of its own cgroup; so the child is created under `<root>/meshalloc/`, with the
memory controller enabled on the way down (the root is exempt from that rule).

When neither works (no permission, read-only cgroupfs, no memory controller) the run goes
on without a cgroup and the reason is reported.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

MOUNTINFO = "/proc/self/mountinfo"
PROC_SELF_CGROUP = "/proc/self/cgroup"
MOUNTINFO_SEPARATOR = "-"
MOUNT_ROOT_FIELD = 3
MOUNT_POINT_FIELD = 4
MEMORY_CONTROLLER = "memory"
V2_PARENT_NAME = "meshalloc"
CHILD_PREFIX = "meshalloc"
PROCS_FILE = "cgroup.procs"
SUBTREE_CONTROL = "cgroup.subtree_control"
CONTROLLERS = "cgroup.controllers"
ENABLE_MEMORY = "+memory"
# Writing 0 to cgroup.procs moves the writing process itself (v1 and v2 alike), so the
# forked child can join without knowing its own pid.
SELF_PID = b"0"
OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")

# Per-version file names: (current charge, kernel high-water mark).
CHARGE_FILES = {1: ("memory.usage_in_bytes", "memory.max_usage_in_bytes"), 2: ("memory.current", "memory.peak")}
# Per-version file of the hard limit (beyond it the kernel reclaims, then kills).
LIMIT_FILES = {1: "memory.limit_in_bytes", 2: "memory.max"}

_child_numbers = itertools.count()


class CgroupUnavailable(Exception):
    """Why no memory cgroup could be created; shown to the user as is."""


@dataclass
class CgroupStatus:
    """What a run reports about its cgroup."""

    available: bool
    version: Optional[int] = None
    path: Optional[str] = None
    reason: str = ""


def _unescape_mount_path(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as three octal digits (\040).
    return OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), text)


def _mounts(mountinfo: str) -> List[Tuple[str, str, str, List[str]]]:
    """(fstype, mount root, mount point, super options) of every mount."""
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if MOUNTINFO_SEPARATOR not in fields:
            continue
        tail = fields[fields.index(MOUNTINFO_SEPARATOR) + 1:]
        if len(tail) < 3 or len(fields) <= MOUNT_POINT_FIELD:
            continue
        fstype, super_options = tail[0], tail[2].split(",")
        mounts.append((fstype, _unescape_mount_path(fields[MOUNT_ROOT_FIELD]),
                       _unescape_mount_path(fields[MOUNT_POINT_FIELD]), super_options))
    return mounts


def _own_cgroups(proc_cgroup: str) -> Dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    own: Dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            own[""] = path
        for controller in controllers.split(","):
            if controller:
                own[controller] = path
    return own


def _inside(mount_point: str, mount_root: str, cgroup_path: str) -> Path:
    """Where a cgroup path appears under a mount whose root may itself be a sub-cgroup
    (a container that bind-mounts only its own part of the hierarchy)."""
    if mount_root != "/" and (cgroup_path == mount_root or cgroup_path.startswith(mount_root + "/")):
        cgroup_path = cgroup_path[len(mount_root):]
    return Path(mount_point) / cgroup_path.lstrip("/")


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _describe(error: OSError) -> str:
    text = os.strerror(error.errno) if error.errno else str(error)
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        text += " (creating a cgroup needs root or a delegated cgroup)"
    return text


class MemoryCgroup:
    """One child memory cgroup; remove() it when the command is done."""

    def __init__(self, directory: Path, version: int):
        self.directory = directory
        self.version = version
        charge, peak = CHARGE_FILES[version]
        self._charge_path = str(directory / charge)
        self._peak_path = str(directory / peak)
        self._procs_path = str(directory / PROCS_FILE)
        self._procs_bytes = os.fsencode(self._procs_path)

    # -- creation -------------------------------------------------------------------

    @classmethod
    def create(cls, mountinfo: Optional[str] = None, proc_cgroup: Optional[str] = None) -> "MemoryCgroup":
        """A fresh child cgroup, v2 preferred; CgroupUnavailable says why not."""
        mounts = _mounts(mountinfo if mountinfo is not None else _read_text(Path(MOUNTINFO)))
        own = _own_cgroups(proc_cgroup if proc_cgroup is not None else _read_text(Path(PROC_SELF_CGROUP)))
        name = f"{CHILD_PREFIX}-{os.getpid()}-{next(_child_numbers)}"
        reasons = []
        for fstype, root, point, options in mounts:
            if fstype == "cgroup2" and MEMORY_CONTROLLER in _read_text(Path(point) / CONTROLLERS).split():
                try:
                    return cls._create_v2(Path(point), name)
                except CgroupUnavailable as why:
                    reasons.append(str(why))
        for fstype, root, point, options in mounts:
            if fstype == "cgroup" and MEMORY_CONTROLLER in options:
                parent = _inside(point, root, own.get(MEMORY_CONTROLLER, "/"))
                try:
                    return cls._create_v1(parent, name)
                except CgroupUnavailable as why:
                    reasons.append(str(why))
        if not reasons:
            reasons.append("no memory cgroup hierarchy is mounted (neither cgroup v1 `memory` nor v2 with `memory`)")
        raise CgroupUnavailable("; ".join(reasons))

    @classmethod
    def _create_v1(cls, parent: Path, name: str) -> "MemoryCgroup":
        directory = parent / name
        try:
            directory.mkdir()
        except OSError as error:
            raise CgroupUnavailable(f"cgroup v1: cannot create {directory}: {_describe(error)}") from None
        cgroup = cls(directory, 1)
        if not Path(cgroup._charge_path).exists():
            cgroup.remove()
            raise CgroupUnavailable(f"cgroup v1: {directory} has no memory accounting")
        return cgroup

    @classmethod
    def _create_v2(cls, root: Path, name: str) -> "MemoryCgroup":
        parent = root / V2_PARENT_NAME
        try:
            if MEMORY_CONTROLLER not in _read_text(root / SUBTREE_CONTROL).split():
                _write(root / SUBTREE_CONTROL, ENABLE_MEMORY)
            parent.mkdir(exist_ok=True)
            if MEMORY_CONTROLLER not in _read_text(parent / SUBTREE_CONTROL).split():
                _write(parent / SUBTREE_CONTROL, ENABLE_MEMORY)
            (parent / name).mkdir()
        except OSError as error:
            where = error.filename or parent
            raise CgroupUnavailable(f"cgroup v2: cannot set up {where}: {_describe(error)}") from None
        cgroup = cls(parent / name, 2)
        if not Path(cgroup._charge_path).exists():
            cgroup.remove()
            raise CgroupUnavailable(f"cgroup v2: {parent / name} has no memory accounting")
        return cgroup

    # -- use ------------------------------------------------------------------------

    def joiner(self) -> Callable[[], None]:
        """A function for subprocess's preexec_fn: runs in the forked child before exec,
        so the command is in the cgroup from its first instruction. It only makes raw
        system calls (no allocation-heavy Python, no locks), which is what is safe
        between fork and exec. A failure is swallowed: the parent notices the command is
        not in the cgroup and reports that instead of losing the run."""
        procs = self._procs_bytes

        def join() -> None:
            try:
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, SELF_PID)
                finally:
                    os.close(fd)
            except OSError:
                pass

        return join

    def pids(self) -> List[int]:
        try:
            with open(self._procs_path, "rb") as procs:
                # v1 does not promise a list free of duplicates; keep the first of each.
                return list(dict.fromkeys(int(line) for line in procs.read().split()))
        except (OSError, ValueError):
            return []

    def _read_int(self, path: str) -> Optional[int]:
        try:
            with open(path, "rb") as handle:
                return int(handle.read())
        except (OSError, ValueError):
            return None

    def charge(self) -> Optional[int]:
        """Bytes charged to the cgroup now."""
        return self._read_int(self._charge_path)

    def limit(self, size: int) -> None:
        """Caps the charge at `size` bytes: past it the kernel reclaims what it can (the
        arena's pages are shared memory: without swap, nothing), then kills the process."""
        try:
            _write(self.directory / LIMIT_FILES[self.version], str(size))
        except OSError as error:
            raise CgroupUnavailable(f"cannot limit {self.directory}: {_describe(error)}") from None

    def kernel_peak(self) -> Optional[int]:
        """The kernel's own high-water mark of the charge (catches peaks between samples);
        None where the kernel has none (cgroup v2 before Linux 5.19)."""
        return self._read_int(self._peak_path)

    def remove(self) -> None:
        """Delete the cgroup. Processes the command left behind are moved to the parent
        first (they keep running; only the cgroup goes). In v2 that is the root, since
        the parent, which hands controllers down, may not hold processes itself."""
        refuge = self.directory.parent if self.version == 1 else self.directory.parent.parent
        for _ in range(2):
            try:
                self.directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                leftover = self.pids()
                if not leftover:
                    break
                for pid in leftover:
                    try:
                        _write(refuge / PROCS_FILE, str(pid))
                    except OSError:
                        pass
        if self.version == 2:
            try:
                self.directory.parent.rmdir()  # fails harmlessly while other runs use it
            except OSError:
                pass
