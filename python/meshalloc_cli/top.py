"""`meshalloc top`: a running process's memory and meshalloc's own account of it, live.

A process started with MESHALLOC_LIVE_STATS_MS=N (the library option live_stats_ms) has its
background thread write the JSON statistics report -- the one MESHALLOC_STATS=json writes at
exit, with the memory breakdown, the meshing counters and pauses -- to
/dev/shm/meshalloc-live.PID.json at most every N milliseconds, through a temporary file renamed
over the last one (src/api/live_stats.cc). Reading it never stops or signals the process. This
module reads that file and, from /proc/PID, what the kernel says: PSS, page tables, threads,
mappings. The kernel's numbers are read now; the library's are as old as the file (`age_s`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from .breakdown import Breakdown
from .errors import EXIT_FAILURE, MeshallocError

KIB = 1024
LIVE_DIRECTORY = Path("/dev/shm")
LIVE_PREFIX = "meshalloc-live."
LIVE_SUFFIX = ".json"
LIVE_FORMAT = "meshalloc-live"
LIVE_VERSION = 1
OPTION_VARIABLE = "MESHALLOC_LIVE_STATS_MS"
SUGGESTED_MS = 1000
LIBRARY_NAME = "libmeshalloc"
# A file not rewritten for this many of its intervals (and at least STALE_MIN_S) is stale: the
# process exec'd another program, or its background thread is stuck in a long pass.
STALE_INTERVALS = 3
STALE_MIN_S = 3.0
# A report caught while the file is replaced, or unreadable: tried again this often.
READ_ATTEMPTS = 3
READ_RETRY_S = 0.05
# The report's counters shown as the mesh statistics, with their JSON names here.
MESH_FIELDS = (
    ("meshes", "mesh_count"),
    ("passes", "mesh_passes"),
    ("pauses", "mesh_pauses"),
    ("pause_total_ns", "mesh_pause_total_ns"),
    ("pause_max_ns", "mesh_pause_max_ns"),
    ("saving", "mesh_released"),
    ("saving_peak", "mesh_released_peak"),
    ("cpu_ns", "mesh_cpu_ns"),
)


def live_path(pid: int) -> Path:
    return LIVE_DIRECTORY / f"{LIVE_PREFIX}{pid}{LIVE_SUFFIX}"


def publishing_pids() -> List[int]:
    """The processes that have a live statistics file, alive or not (the caller checks)."""
    pids = []
    for path in LIVE_DIRECTORY.glob(f"{LIVE_PREFIX}*{LIVE_SUFFIX}"):
        middle = path.name[len(LIVE_PREFIX):-len(LIVE_SUFFIX)]
        if middle.isdigit():
            pids.append(int(middle))
    return sorted(pids)


class ProcessGone(MeshallocError):
    def __init__(self, pid: int):
        super().__init__(f"no process {pid} (it does not exist or has exited)", EXIT_FAILURE)


def _fail(message: str) -> MeshallocError:
    return MeshallocError(message, EXIT_FAILURE)


def _read_proc(pid: int, name: str, binary: bool = False):
    path = f"/proc/{pid}/{name}"
    try:
        with open(path, "rb" if binary else "r") as handle:
            return handle.read()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(pid) from None
    except PermissionError:
        raise _fail(f"permission denied reading {path}: process {pid} belongs to another user or is "
                    "protected (run as its user or as root)") from None
    except OSError as error:
        if not os.path.exists(f"/proc/{pid}"):
            raise ProcessGone(pid) from None
        raise _fail(f"cannot read {path}: {error.strerror}") from None


def _kib_fields(text: str, names) -> Dict[str, int]:
    found = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            parts = rest.split()
            if parts and parts[0].isdigit():
                found[key] = int(parts[0]) * KIB
    return found


@dataclass
class Kernel:
    """What /proc says about the process now, in bytes (threads, mappings: counts)."""

    name: str
    uid: int
    pss: int
    rss: int
    page_tables: int
    threads: int
    mappings: int
    maps_meshalloc: bool
    start_unix: float


def _boot_time() -> float:
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def read_kernel(pid: int) -> Kernel:
    if not os.path.exists(f"/proc/{pid}"):
        raise ProcessGone(pid)
    status = _read_proc(pid, "status")
    fields: Dict[str, str] = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        fields[key] = rest.strip()
    stat = _read_proc(pid, "stat", binary=True)
    after_name = stat[stat.rfind(b")") + 2:].split()
    start_ticks = int(after_name[19])  # proc(5) field 22, starttime
    rollup = _kib_fields(_read_proc(pid, "smaps_rollup"), ("Pss", "Rss"))
    maps = _read_proc(pid, "maps", binary=True)
    if fields.get("State", "").startswith(("Z", "X")) or not rollup:
        raise ProcessGone(pid)  # a zombie has no memory left to show
    return Kernel(name=fields.get("Name", "?"), uid=int(fields.get("Uid", "0").split()[0]),
                  pss=rollup.get("Pss", 0), rss=rollup.get("Rss", 0),
                  page_tables=_kib_fields(status, ("VmPTE",)).get("VmPTE", 0),
                  threads=int(fields.get("Threads", "0")), mappings=maps.count(b"\n"),
                  maps_meshalloc=LIBRARY_NAME.encode() in maps,
                  start_unix=_boot_time() + start_ticks / os.sysconf("SC_CLK_TCK"))


def _not_publishing(pid: int, kernel: Kernel, why: str = "") -> MeshallocError:
    if kernel.maps_meshalloc:
        return _fail(f"process {pid} ({kernel.name}) runs meshalloc but publishes no live statistics{why}: "
                     f"start it with {OPTION_VARIABLE}={SUGGESTED_MS}")
    return _fail(f"process {pid} ({kernel.name}) does not run meshalloc (no {LIBRARY_NAME} in its mappings, "
                 f"no current {live_path(pid)})")


def read_live_file(pid: int, kernel: Kernel) -> dict:
    """The process's last report, checked: one of ours, this process's, of this version."""
    path = live_path(pid)
    last_error = ""
    for attempt in range(READ_ATTEMPTS):
        if attempt:
            time.sleep(READ_RETRY_S)
        try:
            with open(path, "rb") as handle:
                owner = os.fstat(handle.fileno()).st_uid
                text = handle.read()
        except FileNotFoundError:
            raise _not_publishing(pid, kernel) from None
        except PermissionError:
            raise _fail(f"permission denied reading {path} (written by another user)") from None
        if owner != kernel.uid:
            raise _fail(f"{path} belongs to uid {owner}, not to process {pid}'s uid {kernel.uid}: ignored")
        try:
            live = json.loads(text)
        except ValueError:
            last_error = "not valid JSON"
            continue
        if not isinstance(live, dict) or live.get("format") != LIVE_FORMAT:
            raise _fail(f"{path} is not a meshalloc live statistics file")
        if live.get("version") != LIVE_VERSION:
            raise _fail(f"{path} has format version {live.get('version')}, this meshalloc reads {LIVE_VERSION}")
        if live.get("pid") != pid or not isinstance(live.get("report"), dict):
            last_error = "written for another process"
            continue
        return live
    raise _fail(f"cannot read {path}: {last_error}")


def snapshot(pid: int) -> dict:
    """Everything `top` shows about one process, as the JSON object `--json` prints."""
    kernel = read_kernel(pid)
    live = read_live_file(pid, kernel)
    now = time.time()
    written = live.get("unix_ms", 0) / 1000.0
    if written + 1.0 < kernel.start_unix:  # left by an earlier process with the same pid
        raise _not_publishing(pid, kernel, " (the file there is an earlier process's)")
    interval_ms = live.get("interval_ms", SUGGESTED_MS)
    age = max(0.0, now - written)
    stale = age > max(STALE_MIN_S, STALE_INTERVALS * interval_ms / 1000.0)
    if stale and not kernel.maps_meshalloc:
        raise _not_publishing(pid, kernel, f" (its file is {age:.0f} s old)")
    report = live["report"]
    stats = report.get("stats", {}) if isinstance(report.get("stats"), dict) else {}
    values = report.get("breakdown", {}) if isinstance(report.get("breakdown"), dict) else {}
    components = {name: int(value) for name, value in values.items() if isinstance(value, int)}
    info = [item for item in report.get("breakdown_components", []) if isinstance(item, dict)]
    breakdown = Breakdown(components, info, 1)
    classes = [c for c in report.get("classes", []) if isinstance(c, dict) and c.get("spans")]
    return {
        "pid": pid,
        "name": kernel.name,
        "time": now,
        "age_s": round(age, 3),
        "stale": stale,
        "sequence": live.get("sequence"),
        "interval_ms": interval_ms,
        "kernel": {"pss": kernel.pss, "rss": kernel.rss, "page_tables": kernel.page_tables,
                   "threads": kernel.threads, "mappings": kernel.mappings},
        "breakdown": components,
        "groups": breakdown.groups(),
        "mesh": {name: stats.get(key) for name, key in MESH_FIELDS},
        "stats": stats,
        "classes": classes,
    }


def mesh_rate(previous: Optional[dict], current: dict) -> Optional[float]:
    """Meshes per second between two snapshots of one process (None for the first)."""
    if not previous or previous.get("pid") != current.get("pid"):
        return None
    seconds = current["time"] - previous["time"]
    before, after = previous["mesh"].get("meshes"), current["mesh"].get("meshes")
    if seconds <= 0 or before is None or after is None:
        return None
    return (after - before) / seconds


# The table's rows: (label, how to get the value from a snapshot, kind).
def _group(name):
    return lambda s: s["groups"].get(name)


def _component(name):
    return lambda s: s["breakdown"].get(name)


ROWS = (
    ("PSS", lambda s: s["kernel"]["pss"], "bytes"),
    ("page tables", lambda s: s["kernel"]["page_tables"], "bytes"),
    ("heap total", _component("heap_total"), "bytes"),
    ("  live", _group("live"), "bytes"),
    ("  large", _group("large"), "bytes"),
    ("  attached free", _group("attached_free"), "bytes"),
    ("  detached free <25%", _component("detached_free_0"), "bytes"),
    ("  detached free 25-50%", _component("detached_free_1"), "bytes"),
    ("  detached free 50-75%", _component("detached_free_2"), "bytes"),
    ("  detached free >75%", _component("detached_free_3"), "bytes"),
    ("  dirty cache", _group("dirty"), "bytes"),
    ("  metadata", _group("metadata"), "bytes"),
    ("  other", _group("other"), "bytes"),
    ("mesh saving", _group("mesh_saving"), "bytes"),
    ("meshes", lambda s: s["mesh"].get("meshes"), "count"),
    ("mesh rate /s", lambda s: s.get("mesh_rate_per_s"), "rate"),
    ("mesh passes", lambda s: s["mesh"].get("passes"), "count"),
    ("pauses", lambda s: s["mesh"].get("pauses"), "count"),
    ("pause max", lambda s: s["mesh"].get("pause_max_ns"), "ns"),
    ("threads", lambda s: s["kernel"]["threads"], "count"),
    ("mappings", lambda s: s["kernel"]["mappings"], "count"),
    ("stats age", lambda s: s["age_s"], "seconds"),
)


def format_value(value, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "bytes":
        return f"{value / (1 << 20):,.1f} MiB"
    if kind == "ns":
        return f"{value / 1e6:,.2f} ms"
    if kind == "rate":
        return f"{value:,.1f}"
    if kind == "seconds":
        return f"{value:.1f} s"
    return f"{value:,}"


def table_rows(snapshots: List[dict]) -> List[List[str]]:
    """One row per quantity, one column per process (after the label)."""
    rows = []
    for label, get, kind in ROWS:
        rows.append([label] + [format_value(get(s), kind) for s in snapshots])
    return rows
