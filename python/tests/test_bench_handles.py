"""The handle LRU cache server (bench/handle_cache) as a client sees it, and `meshalloc bench
handles` in smoke mode: a few thousand keys per server, handle_ops for a fraction of a second.
The server's own protocol tests run on each storage the build can run (handles only when the
libmeshalloc.so beside it has the handle API)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import List

import pytest
from bench_support import (assert_figure, assert_ran_once, assert_registered, read_tsv, require_built,
                           require_redis_and_client_compiler, run_smoke)

from meshalloc_cli.allocators import resolve
from meshalloc_cli.bench import handles, redis_support
from meshalloc_cli.bench.handles import OpsResult
from meshalloc_cli.compare import Stat
from meshalloc_cli.measure import MIB

SERVER = handles.SERVER_BINARY
OPS = handles.OPS_BINARY
LIBRARY = Path("src") / "libmeshalloc.so"
START_TIMEOUT_S = 10.0


def storages() -> List[str]:
    """malloc always; handles when the built libmeshalloc.so exports the handle API."""
    build = require_built(SERVER, OPS, LIBRARY)
    found = ["malloc"]
    if handles.handles_available(build / OPS, resolve(handles.MESHALLOC_CONFIG, build)):
        found.append("handles")
    return found


class Server:
    """handle_cache on a free loopback port, with a blocking RESP connection to it."""

    def __init__(self, storage: str, *options: str):
        build = require_built(SERVER, LIBRARY)
        self.port = redis_support.free_port()
        env = dict(os.environ)
        if storage == "handles":
            env["LD_PRELOAD"] = str(build / LIBRARY)
        self.process = subprocess.Popen([str(build / SERVER), "--storage", storage, "--port", str(self.port),
                                         *options], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not redis_support.port_open(self.port):
            assert self.process.poll() is None, self.process.stderr.read().decode()
            assert time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.01)
        self.socket = socket.create_connection(("127.0.0.1", self.port))
        self.reader = self.socket.makefile("rb")

    def send(self, *words: str) -> None:
        data = f"*{len(words)}\r\n".encode()
        for word in words:
            raw = word.encode()
            data += b"$%d\r\n%s\r\n" % (len(raw), raw)
        self.socket.sendall(data)

    def reply(self):
        line = self.reader.readline()
        assert line.endswith(b"\r\n"), line
        kind, body = line[:1], line[1:-2].decode()
        if kind == b"+":
            return body
        if kind == b"-":
            return RuntimeError(body)
        if kind == b":":
            return int(body)
        if kind == b"$":
            if int(body) < 0:
                return None
            data = self.reader.read(int(body) + 2)
            return data[:-2].decode()
        if kind == b"*":
            return [self.reply() for _ in range(int(body))]
        raise AssertionError(f"unexpected reply {line!r}")

    def call(self, *words: str):
        self.send(*words)
        return self.reply()

    def info(self) -> dict:
        return redis_support.parse_info(self.call("INFO"))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.send("SHUTDOWN", "NOSAVE")
        self.socket.close()
        return self.process.wait(timeout=30)


@pytest.fixture(params=["malloc", "handles"])
def storage(request):
    if request.param not in storages():
        pytest.skip("this libmeshalloc.so has no handle API (mh_alloc ...)")
    return request.param


def test_commands_answer_as_redis_does(storage):
    server = Server(storage)
    try:
        assert server.call("PING") == "PONG"
        assert server.call("SET", "k", "v" * 1000) == "OK"
        assert server.call("GET", "k") == "v" * 1000
        assert server.call("SET", "k", "") == "OK"
        assert server.call("GET", "k") == ""
        assert server.call("GET", "missing") is None
        assert server.call("DEL", "k", "missing") == 1
        assert server.call("DBSIZE") == 0
        assert server.call("CONFIG", "GET", "maxmemory") == ["maxmemory", "0"]
        assert server.call("CONFIG", "SET", "maxmemory", "2mb") == "OK"
        assert server.call("CONFIG", "GET", "maxmemory") == ["maxmemory", str(2 << 20)]
        assert isinstance(server.call("CONFIG", "SET", "maxmemory", "lots"), RuntimeError)
        assert isinstance(server.call("SET", "k"), RuntimeError)
        assert "unknown command" in str(server.call("FLUSHALL"))
        # Pipelined: every reply in order.
        for index in range(1000):
            server.send("SET", f"p{index}", str(index))
        assert [server.reply() for _ in range(1000)] == ["OK"] * 1000
        for index in range(1000):
            server.send("GET", f"p{index}")
        assert [server.reply() for _ in range(1000)] == [str(index) for index in range(1000)]
        info = server.info()
        assert info["storage"] == storage and int(info["process_id"]) == server.process.pid
        assert info["db0"].startswith("keys=1000,") and float(info["used_cpu_user_main_thread"]) >= 0
    finally:
        assert server.stop() == 0


def test_memory_malloc_stats_is_meshallocs_report_with_its_breakdown():
    """MEMORY MALLOC-STATS (Redis's command) answers meshalloc's JSON report, whose breakdown
    holds the handle store's bytes; without meshalloc, one error."""
    if "handles" not in storages():
        pytest.skip("this libmeshalloc.so has no handle API (mh_alloc ...)")
    server = Server("handles")
    try:
        for index in range(1000):
            server.send("SET", f"k{index}", "v" * 300)
        assert [server.reply() for _ in range(1000)] == ["OK"] * 1000
        report = json.loads(server.call("MEMORY", "MALLOC-STATS"))
        breakdown = report["breakdown"]
        # 1000 payloads of 8 + 5 + 300 bytes, each in a 320-byte slot.
        assert 1000 * 320 <= breakdown["handles_live"] < 1000 * 320 + (64 << 10)
        assert breakdown["handles_table"] >= 1000 * 16
        assert isinstance(server.call("MEMORY", "DOCTOR"), RuntimeError)
    finally:
        assert server.stop() == 0
    server = Server("malloc")  # glibc: no meshalloc to ask
    try:
        assert "needs meshalloc" in str(server.call("MEMORY", "MALLOC-STATS"))
    finally:
        assert server.stop() == 0


def test_eviction_keeps_used_memory_under_maxmemory_and_recent_keys(storage):
    """allkeys-lru at 640 KiB, where 2,000 entries of 232 bytes fit under any allocator and 1,800
    more make it evict 1,000-1,400 of them (the count depends on the allocator's size classes):
    the accounted memory never passes maxmemory by more than one entry, and 200 old keys read a
    second after they were written survive while the other old keys go (Redis's LRU clock ticks
    in whole seconds, hence the pauses)."""
    server = Server(storage, "--maxmemory", "640kb", "--maxmemory-policy", "allkeys-lru")
    value = "x" * 200
    try:
        for index in range(2000):
            server.send("SET", f"old:{index}", value)
        assert [server.reply() for _ in range(2000)] == ["OK"] * 2000
        time.sleep(1.1)
        for index in range(200):
            server.send("GET", f"old:{index}")
        assert all(reply == value for reply in (server.reply() for _ in range(200)))
        time.sleep(1.1)
        for index in range(1800):
            server.send("SET", f"new:{index}", value)
            if index % 300 == 299:
                assert [server.reply() for _ in range(300)] == ["OK"] * 300
                assert int(server.info()["used_memory"]) <= (640 << 10) + 512
        info = server.info()
        assert int(info["evicted_keys"]) > 900
        for index in range(200):
            server.send("GET", f"old:{index}")
        survivors = sum(reply == value for reply in (server.reply() for _ in range(200)))
        for index in range(200, 2000):
            server.send("GET", f"old:{index}")
        unread = sum(reply == value for reply in (server.reply() for _ in range(1800)))
        # The read keys are a second younger than the other old ones: sampling keeps nearly all.
        assert survivors >= 180 and unread <= 0.7 * 1800, (survivors, unread)
    finally:
        assert server.stop() == 0


def test_protocol_error_is_answered_and_the_connection_closed():
    server = Server("malloc")
    try:
        server.socket.sendall(b"*1\r\n$x\r\n")
        reply = server.reply()
        assert isinstance(reply, RuntimeError) and "Protocol error" in str(reply)
        assert server.reader.readline() == b""  # closed
        assert server.process.poll() is None  # and still serving others
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


@pytest.mark.parametrize("arguments,message", [
    (["--maxmemory", "lots"], "bad value for --maxmemory"),
    (["--storage", "disk"], "--storage must be malloc or handles"),
    (["--appendonly", "yes"], "not supported"),
    (["--frobnicate", "1"], "unknown option '--frobnicate'"),
])
def test_bad_options_print_one_line(arguments, message):
    build = require_built(SERVER)
    done = subprocess.run([str(build / SERVER), *arguments], capture_output=True, text=True, timeout=10)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0] and "handle_cache:" in lines[0]


def test_handles_storage_without_the_library_says_so():
    build = require_built(SERVER)
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    done = subprocess.run([str(build / SERVER), "--storage", "handles"], capture_output=True, text=True,
                          timeout=10, env=env)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1 and "LD_PRELOAD=libmeshalloc.so" in done.stderr


def test_handle_ops_reports_every_operation_it_can_run():
    build = require_built(OPS, LIBRARY)
    env = dict(os.environ, LD_PRELOAD=str(build / LIBRARY))
    done = subprocess.run([str(build / OPS), *handles.PROBE_ARGS, "--reps", "2"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    operations = {line.split()[1].partition("=")[2] for line in done.stdout.splitlines() if line.startswith("rep=")}
    expected = set(handles.OPS_ORDER) if "handles=yes" in done.stdout else {
        "malloc_free", "pointer_read", "pointer_random"}
    assert operations == expected


# ---------------------------------------------------------------------------------------------
# The experiment

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    require_redis_and_client_compiler()
    require_built(SERVER, OPS, LIBRARY)
    work = tmp_path_factory.mktemp("work")
    directory = run_smoke("handles", Path("bench"), cwd=work)
    return directory, json.loads((directory / "outcome.json").read_text())


def test_experiment_is_registered():
    assert_registered(handles, "handles")


def test_smoke_outcome_tables_and_figure(smoke):
    out, outcome = smoke
    assert_ran_once(outcome)
    assert outcome["table_md"].startswith("| config |")
    assert f"{handles.BASELINE} (baseline)" in outcome["table_md"] and "| malloc_free |" in outcome["table_md"]
    assert all((out / path).exists() for path in outcome["files"])
    for claim in outcome["claims"]:
        assert claim["holds"] is None and "smoke" in claim["note"]
    _, runs = read_tsv(out / "runs.tsv")
    names = {row["config"] for row in runs}
    assert {handles.BASELINE, handles.CACHE_MESH} <= names
    for row in runs:
        assert row["ok"] == "1", row["problems"]
        assert int(row["keys"]) > 0 and int(row["evicted_keys"]) > 0  # full and evicting
        assert float(row["insertion_s"]) > 0
        if row["config"].startswith("cache/"):
            assert float(row["used_memory"]) <= 4 * 1024 * 1024 + 1024  # smoke's maxmemory 4mb
    # The read phase ran in every timed run, and some GETs found their key.
    for row in runs:
        report = dict(word.split("=", 1) for word in
                      ((out / row["samples_tsv"]).parent / "timed-client.txt").read_text().split() if "=" in word)
        assert report["reads"] == str(handles.READS["smoke"]) and int(report["hits"]) > 0
    assert "GETs s" in outcome["table_md"]
    # The handle cache's INFO carries meshalloc's handle statistics: its entries are handles.
    for row in runs:
        info = redis_support.parse_info(((out / row["samples_tsv"]).parent / "info.txt").read_text())
        if row["config"] == handles.CACHE_HANDLES:
            assert int(info["handles_live"]) == int(row["keys"]) and int(info["handles_committed"]) > 0
        else:
            assert "handles_live" not in info
    _, ops = read_tsv(out / "ops.tsv")
    assert {(row["allocator"], row["operation"]) for row in ops} >= {("meshalloc", "malloc_free"),
                                                                        ("glibc", "malloc_free")}
    assert_figure(out / "memory")


def test_claims_on_made_up_numbers():
    """Handles at 0.55× jemalloc, below meshing (0.7×) and activedefrag (0.58×), 10 % slower than
    the same cache on malloc, mh_alloc 1.1× malloc and a 4 ns pin: every claim holds; the same
    with a 12 ns pin and mh_alloc at 1.5× fails those two."""
    def row(mean):
        return {"mean_ratio": Stat(mean, mean, mean)}

    table = {handles.BASELINE: row(1.0), handles.REDIS_DEFRAG: row(0.58), handles.REDIS_MESH: row(0.7),
             handles.CACHE_MESH: row(0.75), handles.CACHE_HANDLES: row(0.55)}
    rounds = {"timing round 1": {handles.CACHE_MESH: 1.0, handles.CACHE_HANDLES: 1.1}}

    def verdicts(pin: float, alloc: float) -> dict:
        ops = OpsResult({("meshalloc", "malloc_free"): [10.0], ("meshalloc", "mh_alloc_free"): [10.0 * alloc],
                         ("meshalloc", "pin_unpin"): [pin]}, [])
        found = handles.claims(table, [], rounds, ops, checked=True, reads=rounds)
        return {claim.claim: claim.holds for claim in found}

    assert all(verdicts(4.0, 1.1).values())
    failing = verdicts(12.0, 1.5)
    assert [name for name, holds in failing.items() if not holds] == [
        "mh_alloc + mh_free vs malloc + free (meshalloc, same process)", "mh_pin + mh_unpin, uncontended"]
    # The accounting's bound: maxmemory over the baseline's PSS after the insertion.
    table[handles.BASELINE]["mean_pss_after_insertion"] = Stat(175 * MIB, 175 * MIB, 175 * MIB)
    ops = OpsResult({}, [])
    note = handles.claims(table, [], rounds, ops, checked=True, reads=rounds, maxmemory_mib=100.0)[0].note
    assert "its maxmemory (100 MiB) would be at 0.57× after the insertion" in note
    slow = {"r": dict(rounds["timing round 1"], **{handles.CACHE_HANDLES: 1.3})}
    found = {claim.claim: claim.holds for claim in handles.claims(table, [], slow, OpsResult({}, []), checked=True,
                                                                   reads=slow)}
    assert found["handle cache insertion time vs the same cache on malloc (both meshalloc)"] is False
    assert found["handle cache GET time vs the same cache on malloc (both meshalloc)"] is False
