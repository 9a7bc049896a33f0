"""`meshalloc top` (docs/cli.md): a process started with MESHALLOC_LIVE_STATS_MS publishes its
statistics; `top --once --json` reads them and /proc, and the numbers follow what the process
does. The error cases give one line on stderr and exit status 1."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import HELPERS, MIB, compile_helper, meshalloc_library, run_meshalloc, stderr_lines

from meshalloc_cli import top

INTERVAL_MS = 100
OBJECT_SIZE = 256  # a size class of its own: live bytes grow by exactly count x size
GROW_OBJECTS = 64 * 1024  # 16 MiB
WAIT_S = 20.0


@pytest.fixture(scope="module")
def live_heap(tmp_path_factory) -> Path:
    return compile_helper(HELPERS / "live_heap.c", tmp_path_factory.mktemp("top") / "live_heap")


@pytest.fixture
def library() -> Path:
    found = meshalloc_library()
    if found is None:
        pytest.skip("libmeshalloc.so is not built (cmake --build --preset release)")
    return found


class Child:
    """The helper under meshalloc, driven line by line."""

    def __init__(self, program: Path, env: dict):
        self.process = subprocess.Popen([str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, **env})
        self.pid = self.process.pid

    def command(self, line: str) -> int:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


@pytest.fixture
def child(live_heap, library):
    started = Child(live_heap, {"LD_PRELOAD": str(library), top.OPTION_VARIABLE: str(INTERVAL_MS)})
    yield started
    started.close()


def read_top(pid: int) -> dict:
    completed = run_meshalloc("top", "--once", "--json", str(pid))
    assert completed.returncode == 0, completed.stderr
    processes = json.loads(completed.stdout)["processes"]
    assert len(processes) == 1 and processes[0]["pid"] == pid
    return processes[0]


def settled(pid: int, after_sequence: int = 0) -> dict:
    """A reading taken from a report written after the one numbered `after_sequence`, and the
    next one (so the report reflects a state that held for a whole interval)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        reading = read_top(pid)
        if reading["sequence"] > after_sequence + 1:
            return reading
        assert time.monotonic() < deadline, f"the statistics stayed at sequence {reading['sequence']}"
        time.sleep(INTERVAL_MS / 1000)


def wait_for_file(pid: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while not top.live_path(pid).exists():
        assert time.monotonic() < deadline, "the process never published its statistics"
        time.sleep(0.02)


def test_top_reads_a_live_process_and_follows_its_allocations(child):
    own = child.command("allocated")
    wait_for_file(child.pid)
    before = settled(child.pid)
    assert before["name"] == "live_heap" and not before["stale"]
    assert before["interval_ms"] == INTERVAL_MS
    kernel = before["kernel"]
    assert 0 < kernel["pss"] <= kernel["rss"]
    assert kernel["threads"] >= 2  # the program and meshalloc's background thread
    assert kernel["mappings"] > 10 and kernel["page_tables"] > 0
    # The library's own reading, through mallctl in the child, while it stands still.
    assert abs(before["stats"]["allocated"] - own) <= 64 * 1024
    for name in ("small_live", "attached_free", "detached_free_0", "dirty_cache", "large_live", "heap_total",
                 "mesh_saving", "page_tables", "pss"):
        assert name in before["breakdown"]
    assert set(before["mesh"]) >= {"meshes", "passes", "pauses", "saving"}
    assert before["groups"]["live"] >= before["breakdown"]["small_live"]

    own_after = child.command(f"alloc {GROW_OBJECTS} {OBJECT_SIZE}")
    grown = GROW_OBJECTS * OBJECT_SIZE
    assert abs(own_after - own - grown) <= grown * 0.02
    # A report numbered after the one current when the command returned: reports written while
    # the child was still allocating (a loaded machine) would not show all of it.
    after = settled(child.pid, read_top(child.pid)["sequence"])
    live_growth = after["breakdown"]["small_live"] - before["breakdown"]["small_live"]
    assert abs(live_growth - grown) <= grown * 0.05, (live_growth, grown)
    assert abs(after["stats"]["allocated"] - own_after) <= 64 * 1024
    # Every byte was written: the kernel sees it too.
    assert after["kernel"]["pss"] - kernel["pss"] >= grown * 0.9
    assert after["breakdown"]["heap_total"] - before["breakdown"]["heap_total"] >= grown * 0.95

    child.command("free")
    freed = settled(child.pid, read_top(child.pid)["sequence"])
    assert freed["breakdown"]["small_live"] <= before["breakdown"]["small_live"] + grown * 0.05


def test_table_view_shows_the_process(child):
    wait_for_file(child.pid)
    completed = run_meshalloc("top", "--once", str(child.pid))
    assert completed.returncode == 0, completed.stderr
    for label in ("PSS", "live", "detached free <25%", "dirty cache", "mesh saving", "pauses", "mappings"):
        assert label in completed.stdout
    assert f"{child.pid} live_heap" in completed.stdout


def test_without_pids_top_finds_publishing_processes(child):
    wait_for_file(child.pid)
    completed = run_meshalloc("top", "--once", "--json")
    assert completed.returncode == 0, completed.stderr
    assert child.pid in [p["pid"] for p in json.loads(completed.stdout)["processes"]]


def test_the_file_goes_when_the_process_exits(child):
    wait_for_file(child.pid)
    child.close()
    assert not top.live_path(child.pid).exists()
    completed = run_meshalloc("top", "--once", "--json", str(child.pid))
    assert completed.returncode == 1
    assert stderr_lines(completed) == [f"meshalloc: no process {child.pid} (it does not exist or has exited)"]


def test_live_mode_refreshes_and_ends_when_the_process_exits(child):
    wait_for_file(child.pid)
    watcher = subprocess.Popen([*run_command(), "top", "--json", "--interval", "0.2", str(child.pid)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = json.loads(watcher.stdout.readline())["processes"][0]
    second = json.loads(watcher.stdout.readline())["processes"][0]
    assert second["time"] > first["time"]
    child.close()  # exits while being read
    _, errors = watcher.communicate(timeout=30)
    assert watcher.returncode == 0
    assert "Traceback" not in errors


def run_command():
    import sys
    return [sys.executable, "-m", "meshalloc_cli"]


def test_a_missing_process_is_one_line_and_status_1():
    pid = 4_000_000  # above pid_max's largest value
    completed = run_meshalloc("top", "--once", "--json", str(pid))
    assert completed.returncode == 1
    assert stderr_lines(completed) == [f"meshalloc: no process {pid} (it does not exist or has exited)"]
    assert completed.stdout == ""


def test_a_process_not_on_meshalloc_is_refused():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        completed = run_meshalloc("top", "--once", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert completed.returncode == 1
    lines = stderr_lines(completed)
    assert len(lines) == 1 and f"process {sleeper.pid} (sleep) does not run meshalloc" in lines[0]


def test_meshalloc_without_the_option_is_told_how_to_publish(live_heap, library):
    plain = Child(live_heap, {"LD_PRELOAD": str(library)})
    try:
        plain.command(f"alloc 1000 {OBJECT_SIZE}")
        completed = run_meshalloc("top", "--once", str(plain.pid))
    finally:
        plain.close()
    assert completed.returncode == 1
    lines = stderr_lines(completed)
    assert len(lines) == 1 and "runs meshalloc but publishes no live statistics" in lines[0]
    assert f"{top.OPTION_VARIABLE}=" in lines[0]


def test_permission_denied_is_one_line(monkeypatch):
    real_open = open

    def refuse(path, *args, **kwargs):
        if str(path).startswith(f"/proc/{os.getpid()}/smaps_rollup"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refuse)
    with pytest.raises(top.MeshallocError) as raised:
        top.read_kernel(os.getpid())
    assert raised.value.exit_code == 1
    assert str(raised.value).startswith(f"permission denied reading /proc/{os.getpid()}/smaps_rollup")


def test_permission_denied_through_the_command():
    if os.access("/proc/1/smaps_rollup", os.R_OK):
        try:
            with open("/proc/1/smaps_rollup"):
                pytest.skip("this user may read every process")
        except PermissionError:
            pass
    completed = run_meshalloc("top", "--once", "1")
    assert completed.returncode == 1
    lines = stderr_lines(completed)
    assert len(lines) == 1 and lines[0].startswith("meshalloc: permission denied reading /proc/1/")


def test_a_foreign_or_torn_file_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setattr(top, "LIVE_DIRECTORY", tmp_path)
    monkeypatch.setattr(top, "READ_RETRY_S", 0)
    kernel = top.read_kernel(os.getpid())
    path = top.live_path(os.getpid())
    path.write_text('{"format":"meshalloc-live","version":1,"pid":')
    with pytest.raises(top.MeshallocError, match="not valid JSON"):
        top.read_live_file(os.getpid(), kernel)
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(top.MeshallocError, match="not a meshalloc live statistics file"):
        top.read_live_file(os.getpid(), kernel)
    path.write_text(json.dumps({"format": top.LIVE_FORMAT, "version": 99, "pid": os.getpid(), "report": {}}))
    with pytest.raises(top.MeshallocError, match="format version 99"):
        top.read_live_file(os.getpid(), kernel)
    # A file older than the process: left by an earlier process with the same pid.
    path.write_text(json.dumps({"format": top.LIVE_FORMAT, "version": 1, "pid": os.getpid(), "unix_ms": 1000,
                                "interval_ms": 1000, "report": {}}))
    with pytest.raises(top.MeshallocError, match="does not run meshalloc|earlier process"):
        top.snapshot(os.getpid())


def test_bad_usage_is_status_2():
    completed = run_meshalloc("top", "--interval", "0", "--once", "1")
    assert completed.returncode == 2
    completed = run_meshalloc("top", "--once", "x")
    assert completed.returncode == 2 and "not a process id" in completed.stderr
