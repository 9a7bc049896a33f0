"""`meshalloc trace record | dump | stats` as a user runs them (docs/trace.md): the recorded
program's output and exit status are untouched, and a bad trace or invocation gives one line."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import run_meshalloc, stderr_lines

from meshalloc_cli import paths
from meshalloc_cli.errors import EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_USAGE


@pytest.fixture(scope="module")
def built():
    build = paths.build_directory()
    for product in (paths.TRACE_RECORDER_LIBRARY, paths.TRACE_TOOL):
        if build is None or not (build / product).is_file():
            pytest.skip(f"{product} is not built (make release)")
    return build


@pytest.fixture(scope="module")
def recorded(built, tmp_path_factory):
    trace = tmp_path_factory.mktemp("trace") / "sh.trace"
    completed = run_meshalloc("trace", "record", "--out", str(trace), "--", "sh", "-c", "echo hello; exit 3")
    return trace, completed


def _stats(trace):
    completed = run_meshalloc("trace", "stats", "--json", str(trace))
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_record_keeps_output_and_exit_status(recorded):
    trace, completed = recorded
    assert completed.stdout == "hello\n"
    assert completed.returncode == 3
    summary = _stats(trace)
    assert summary["complete"] is True
    assert summary["events"] > 0
    assert summary["by_kind"]["thread_start"] == 1


def test_record_on_meshalloc(built, tmp_path):
    if not (built / paths.MESHALLOC_LIBRARY).is_file():
        pytest.skip("libmeshalloc.so is not built")
    trace = tmp_path / "t"
    completed = run_meshalloc("trace", "record", "-a", "meshalloc", "--out", str(trace), "--callsites", "1", "--",
                              "sh", "-c", "echo on-meshalloc")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "on-meshalloc\n"
    dump = run_meshalloc("trace", "dump", "--head", "5", str(trace))
    lines = dump.stdout.splitlines()
    assert len(lines) == 5
    # --callsites 1: every event but the recorder's own thread_start carries a call-site hash
    assert all(" site " in line for line in lines if "thread_start" not in line)


def test_dump_head_and_thread(recorded):
    trace, _ = recorded
    completed = run_meshalloc("trace", "dump", "--head", "4", "--thread", "0", str(trace))
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert len(lines) == 4
    assert all(" t0 #" in line for line in lines)
    assert "thread_start" in lines[0]


def _damaged(trace, tmp_path):
    data = trace.read_bytes()
    payload = bytearray(data)
    payload[64 + 48 + 3] ^= 0x10  # a byte of the first chunk's payload
    corrupt = tmp_path / "corrupt.trace"
    corrupt.write_bytes(bytes(payload))
    truncated = tmp_path / "truncated.trace"
    truncated.write_bytes(data[: len(data) - 20])
    foreign = tmp_path / "foreign.trace"
    shutil.copyfile("/bin/sh", foreign)
    empty = tmp_path / "empty.trace"
    empty.write_bytes(b"")
    return {"corrupt": corrupt, "truncated": truncated, "foreign": foreign, "empty": empty}


@pytest.mark.parametrize("action", ["dump", "stats"])
def test_bad_traces_give_one_line_naming_the_offset(recorded, tmp_path, action):
    trace, _ = recorded
    for name, path in _damaged(trace, tmp_path).items():
        completed = run_meshalloc("trace", action, str(path))
        lines = stderr_lines(completed)
        assert completed.returncode == EXIT_FAILURE, (name, completed.stderr)
        assert len(lines) == 1, (name, completed.stderr)
        assert "Traceback" not in completed.stderr
        assert f"{path}: offset " in lines[0], (name, lines[0])


def test_compress_keeps_every_event(built, tmp_path):
    """A compressed trace decodes to the same events; it is smaller; damage to a compressed
    payload and a second compression give one line and status 1."""
    trace = tmp_path / "ls.trace"
    completed = run_meshalloc("trace", "record", "--out", str(trace), "--", "ls", "-lR", "/usr/share/doc")
    assert completed.returncode == 0, completed.stderr
    packed = tmp_path / "ls.packed"
    completed = run_meshalloc("trace", "compress", str(trace), "--out", str(packed))
    assert completed.returncode == 0, completed.stderr
    assert not (tmp_path / "ls.packed.compressing").exists()
    before, after = _stats(trace), _stats(packed)
    assert after["compressed"] is True and before["compressed"] is False
    assert after["events"] == before["events"] > 10_000
    assert after["bytes"] < before["bytes"] * 0.75, (before["bytes"], after["bytes"])
    assert {key: value for key, value in after.items() if key not in ("file", "bytes", "bytes_per_event",
                                                                      "compressed")} == \
        {key: value for key, value in before.items() if key not in ("file", "bytes", "bytes_per_event", "compressed")}
    assert run_meshalloc("trace", "dump", str(packed)).stdout == run_meshalloc("trace", "dump", str(trace)).stdout
    again = run_meshalloc("trace", "compress", str(packed))
    assert again.returncode == EXIT_FAILURE and "already compressed" in again.stderr
    for name, path in _damaged(packed, tmp_path).items():
        completed = run_meshalloc("trace", "stats", str(path))
        assert completed.returncode == EXIT_FAILURE, (name, completed.stderr)
        assert len(stderr_lines(completed)) == 1 and f"{path}: offset " in completed.stderr, (name, completed.stderr)
    # In place, with the recording.
    in_place = tmp_path / "sh.trace"
    completed = run_meshalloc("trace", "record", "--compress", "--out", str(in_place), "--", "sh", "-c", "exit 0")
    assert completed.returncode == 0, completed.stderr
    assert _stats(in_place)["compressed"] is True


@pytest.mark.parametrize("arguments, status, words", [
    (["trace", "dump", "/no/such/trace"], EXIT_FAILURE, "no such trace file"),
    (["trace", "dump", "--head", "x", "t"], EXIT_USAGE, "not a whole number"),
    (["trace", "stats"], EXIT_USAGE, "required"),
    (["trace", "record", "--out", "t"], EXIT_USAGE, "missing command"),
    (["trace", "record", "--", "/no/such/program"], EXIT_NOT_FOUND, "command not found"),
    (["trace", "stats", "t", "--", "ls"], EXIT_USAGE, "takes no command"),
])
def test_bad_invocations_give_one_line(built, tmp_path, arguments, status, words):
    completed = run_meshalloc(*arguments, cwd=tmp_path)
    lines = stderr_lines(completed)
    assert completed.returncode == status, completed.stderr
    assert len(lines) == 1 and words in lines[0], completed.stderr


def test_thread_not_in_trace(recorded):
    trace, _ = recorded
    completed = run_meshalloc("trace", "dump", "--thread", "99", str(trace))
    assert completed.returncode == EXIT_USAGE
    assert len(stderr_lines(completed)) == 1


def test_exec_completes_the_trace_and_the_new_image_gets_its_own(built, tmp_path):
    trace = tmp_path / "t"
    completed = run_meshalloc("trace", "record", "--out", str(trace), "--", "sh", "-c", "echo a; exec /bin/echo b")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "a\nb\n"
    shell = _stats(trace)
    assert shell["complete"] is True  # written before the exec, which never returns
    assert shell["events"] > 0
    images = list(tmp_path.glob("t.*"))
    assert len(images) == 1  # the exec'd echo: same pid, so t.<pid>
    echo = _stats(images[0])
    assert echo["pid"] == shell["pid"] and echo["complete"] is True and echo["events"] > 0
