"""`meshalloc trace replay` and `meshalloc trace analyze` (docs/trace.md, Replay and Analysis) on
traces written event by event (tests/trace/synthetic_trace.cc), so every expected figure is
known exactly: cross-thread frees and reallocs replay without deadlock and with every block's
contents intact under each allocator, a broken allocator is caught, bad input gives one line,
and the analyses count lifetimes, sizes and threads right."""

from __future__ import annotations

import csv
import subprocess

import numpy
import pytest
from conftest import compile_helper, HELPERS, run_meshalloc, stderr_lines

from meshalloc_cli import allocators, paths, trace_analyze
from meshalloc_cli.errors import EXIT_FAILURE, EXIT_USAGE

SYNTHETIC = paths.Path("tests") / "trace" / "trace_synthetic"
# The calls of the cross-thread trace, as synthetic_trace.cc writes them (free: one of them is
# free(NULL); the free of a never-allocated address is not replayed).
CROSS_THREAD_CALLS = {"malloc": 376, "calloc": 375, "realloc": 751, "free": 2251, "memalign": 375,
                      "posix_memalign": 375, "aligned_alloc": 375, "valloc": 375, "malloc_usable_size": 375,
                      "new": 375, "new[]": 375, "delete": 375, "delete[]": 375}
LIFETIME_OPS = 221  # 100 × (malloc, free) + 10 mallocs + 10 frees + 1 malloc
MIB = 1 << 20


@pytest.fixture(scope="module")
def build():
    build = paths.build_directory()
    for product in (paths.TRACE_REPLAYER, paths.TRACE_REPLAY_PREPARE, SYNTHETIC):
        if build is None or not (build / product).is_file():
            pytest.skip(f"{product} is not built (make release)")
    return build


def _synthetic(build, scenario, directory):
    trace = directory / f"{scenario}.trace"
    subprocess.run([str(build / SYNTHETIC), scenario, str(trace)], check=True)
    return trace


@pytest.fixture(scope="module")
def cross_thread(build, tmp_path_factory):
    return _synthetic(build, "cross-thread", tmp_path_factory.mktemp("cross"))


@pytest.fixture(scope="module")
def lifetimes(build, tmp_path_factory):
    return _synthetic(build, "lifetimes", tmp_path_factory.mktemp("lifetimes"))


def _available():
    names = []
    for name in ("glibc", "jemalloc", "mimalloc", "tcmalloc", "meshalloc"):
        try:
            allocators.resolve(name)
        except Exception:
            continue
        names.append(name)
    return names


def _tsv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


@pytest.mark.parametrize("touch", ["page", "block"])
def test_cross_thread_replay_under_every_allocator(cross_thread, tmp_path, touch):
    names = _available()
    if not names:
        pytest.skip("no allocator available")
    out = tmp_path / "replay"
    completed = run_meshalloc("trace", "replay", str(cross_thread), "--allocators", ",".join(names), "--repeat", "1",
                              "--touch", touch, "--no-figure", "--no-cgroup", "--out", str(out))
    assert completed.returncode == 0, completed.stderr + completed.stdout
    runs = _tsv(out / "runs.tsv")
    assert [row["allocator"] for row in runs] == names
    assert all(row["exit_code"] == "0" for row in runs)
    times = _tsv(out / "op-times.tsv")
    for name in names:
        calls = {row["call"]: int(row["calls"]) for row in times if row["allocator"] == name and row["call"] != "all"}
        assert calls == CROSS_THREAD_CALLS, name
        assert all(row["failed_allocations"] == "0" for row in times if row["allocator"] == name)
        # The replayer's own tables: at least the slot table (4 slots: the trace's peak live blocks).
        assert all(int(row["own_bytes"]) >= 4 * 8 for row in times if row["allocator"] == name)
    assert "time per call" in completed.stdout


def test_a_lost_write_is_caught(build, cross_thread, helper_dir, tmp_path):
    broken = compile_helper(HELPERS / "realloc_no_copy.c", helper_dir / "realloc_no_copy.so",
                            ["-shared", "-fPIC", "-ldl"])
    out = tmp_path / "replay"
    completed = run_meshalloc("trace", "replay", str(cross_thread), "--allocators", str(broken), "--repeat", "1",
                              "--no-figure", "--no-cgroup", "--out", str(out))
    assert completed.returncode == 3, completed.stderr
    assert "lost its contents in realloc" in completed.stderr
    assert "block 0x" in completed.stderr


@pytest.mark.parametrize("pace", [["--speed", "0.001"], ["--warp", "0.0001:0.2"]], ids=["speed", "warp"])
def test_recorded_timing_keeps_the_gaps(lifetimes, tmp_path, pace):
    # 221 calls a microsecond apart: about 0.22 ms at the recorded pace; 0.22 s at --speed 0.001,
    # and at least 0.2 s when a warp maps the first 0.1 ms onto 0.2 s (the gaps after it as recorded).
    out = tmp_path / "replay"
    completed = run_meshalloc("trace", "replay", str(lifetimes), "--allocators", "glibc", "--repeat", "1",
                              "--timing", "recorded", *pace, "--no-figure", "--no-cgroup", "--out", str(out))
    assert completed.returncode == 0, completed.stderr
    assert float(_tsv(out / "runs.tsv")[0]["wall_time_s"]) >= 0.2


def test_warp_points_must_increase():
    from meshalloc_cli.errors import MeshallocError
    from meshalloc_cli.trace_replay import parse_warp
    assert parse_warp("1:2,3:3.5") == [(1.0, 2.0), (3.0, 3.5)]
    for bad in ("1:2,0.5:3", "1:2,2:2", "0:1", "1", "a:b", ",".join(f"{n}:{n}" for n in range(1, 34))):
        with pytest.raises(MeshallocError):
            parse_warp(bad)


def _damaged(trace, directory):
    data = trace.read_bytes()
    flipped = bytearray(data)
    flipped[64 + 48 + 5] ^= 0x04
    cases = {"truncated": data[: len(data) // 2], "flipped": bytes(flipped), "foreign": b"#!/bin/sh\necho\n" * 8,
             "empty": b""}
    paths_ = {}
    for name, content in cases.items():
        path = directory / f"{name}.trace"
        path.write_bytes(content)
        paths_[name] = path
    return paths_


@pytest.mark.parametrize("action", ["replay", "analyze"])
def test_malformed_traces_are_rejected_in_one_line(cross_thread, tmp_path, action):
    for name, path in _damaged(cross_thread, tmp_path).items():
        completed = run_meshalloc("trace", action, str(path), "--out", str(tmp_path / f"out-{name}"),
                                  *(["--allocators", "glibc"] if action == "replay" else []))
        lines = stderr_lines(completed)
        assert completed.returncode == EXIT_FAILURE, (name, completed.stderr)
        assert len(lines) == 1 and "Traceback" not in completed.stderr, (name, completed.stderr)
        assert f"{path}: offset " in lines[0], (name, lines[0])


def test_malformed_ops_files_are_rejected(build, cross_thread, tmp_path):
    prepared = tmp_path / "t.ops"
    subprocess.run([str(build / paths.TRACE_REPLAY_PREPARE), str(cross_thread), "--ops", str(prepared)], check=True,
                   capture_output=True)
    data = prepared.read_bytes()
    for name, content in {"magic": b"X" + data[1:], "truncated": data[: len(data) - 100]}.items():
        bad = tmp_path / f"{name}.ops"
        bad.write_bytes(content)
        completed = subprocess.run([str(build / paths.TRACE_REPLAYER), str(bad)], capture_output=True, text=True,
                                   timeout=60)
        assert completed.returncode == 1, (name, completed.stderr)
        assert len(completed.stderr.splitlines()) == 1 and "offset" in completed.stderr, (name, completed.stderr)


@pytest.mark.parametrize("arguments, status, words", [
    (["trace", "replay", "/no/such/trace"], EXIT_FAILURE, "no such trace file"),
    (["trace", "analyze", "/no/such/trace"], EXIT_FAILURE, "no such trace file"),
    (["trace", "replay", "t", "--timing", "slow"], EXIT_USAGE, "invalid choice"),
    (["trace", "replay", "t", "--speed", "0"], EXIT_USAGE, "must be positive"),
    (["trace", "replay", "t", "--warp", "2:1,1:2"], EXIT_USAGE, "is not RECORDED_S:REPLAY_S"),
    (["trace", "replay", "t", "--", "ls"], EXIT_USAGE, "takes no command"),
])
def test_bad_invocations_give_one_line(build, tmp_path, arguments, status, words):
    completed = run_meshalloc(*arguments, cwd=tmp_path)
    lines = stderr_lines(completed)
    assert completed.returncode == status, completed.stderr
    assert len(lines) == 1 and words in lines[0], completed.stderr


def test_unknown_allocator(cross_thread, tmp_path):
    completed = run_meshalloc("trace", "replay", str(cross_thread), "--allocators", "nosuch", cwd=tmp_path)
    assert completed.returncode == EXIT_USAGE
    assert len(stderr_lines(completed)) == 1 and "unknown allocator" in completed.stderr


@pytest.fixture(scope="module")
def analyzed(lifetimes, tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis")
    completed = run_meshalloc("trace", "analyze", str(lifetimes), "--no-figure", "--out", str(out))
    assert completed.returncode == 0, completed.stderr
    return out, completed


def _bins(out, measure, panel):
    return [(float(row["low"]), float(row["high"]), int(row["blocks"])) for row in _tsv(out / "lifetimes.tsv")
            if row["measure"] == measure and row["panel"] == panel]


def test_lifetimes_in_operations(analyzed):
    out, _ = analyzed
    bins = _bins(out, "ops", "all")
    assert bins[0][1] == pytest.approx(LIFETIME_OPS / 50)
    # 100 blocks freed by the next call, and the 1 MiB block allocated by the last call (it lives
    # to the end): lifetime 1; the ten 4096-byte blocks: 10 calls each (bin 8.84-13.26).
    assert [count for _, _, count in bins if count] == [101, 10]
    assert bins[2][2] == 10
    # The 1-100 % panel (2.21 calls and more) holds only the ten; the 0-2 % panel everything.
    assert sum(count for _, _, count in _bins(out, "ops", "1-100%")) == 10
    zoomed = _bins(out, "ops", "0-2%")
    assert sum(count for _, _, count in zoomed) == 101
    assert [count for low, high, count in zoomed if low <= 1.0 < high] == [101]  # exactly 1 call


def test_lifetimes_in_bytes_and_seconds(analyzed):
    out, _ = analyzed
    # Bytes allocated while a block lives: 0 for the 16-byte blocks and the last one; 4096 × (9 - j)
    # for the j-th 4096-byte block (the later ones are allocated after it).
    bins = _bins(out, "bytes", "all")
    total = 100 * 16 + 10 * 4096 + MIB
    assert bins[-1][1] == pytest.approx(total)
    values = [0] * 101 + [4096 * (9 - j) for j in range(10)]
    expected, _ = numpy.histogram(values, bins=50, range=(0, total))
    assert [count for _, _, count in bins] == list(expected)
    # Seconds: 1 µs for the 16-byte blocks, 10 µs for the 4096-byte ones.
    seconds = _bins(out, "seconds", "all")
    assert sum(count for low, high, count in seconds if low <= 1e-6 <= high) >= 100
    assert sum(count for _, _, count in seconds) == 111


def test_sizes_threads_and_live_bytes(analyzed):
    out, completed = analyzed
    sizes = {(int(row["low_bytes"]), int(row["high_bytes"])): int(row["blocks"]) for row in _tsv(out / "sizes.tsv")}
    assert sizes[(8, 16)] == 100 and sizes[(2048, 4096)] == 10 and sizes[(524288, 1048576)] == 1
    assert sum(sizes.values()) == 111
    threads = {(row["alloc_thread"], row["free_thread"]): int(row["blocks"]) for row in _tsv(out / "threads.tsv")}
    assert threads == {("0", "0"): 110, ("0", "never"): 1}
    live = _tsv(out / "live.tsv")
    assert int(live[-1]["live_bytes"]) == MIB and int(live[-1]["live_blocks"]) == 1
    assert max(int(row["window_peak_bytes"]) for row in live) == MIB
    assert "91.0 % of blocks" in completed.stdout  # short-lived: 101 of 111 die within 1 % of the calls


def test_ranking_scores():
    # Three allocators over four operations; lower is better.
    values = numpy.array([[1.0, 1.0, 4.0, 2.0],
                          [2.0, 3.0, 2.0, 2.0],
                          [4.0, 2.0, 1.0, 8.0]])
    scores = trace_analyze.ranking(["a", "b", "c"], values)
    # ranks (0 best; ties broken by order): a 0,0,2,0  b 1,2,1,1  c 2,1,0,2
    assert scores["a"]["penalty_c"] == pytest.approx(2 / 12)
    assert scores["b"]["penalty_c"] == pytest.approx(5 / 12)
    assert scores["c"]["penalty_c"] == pytest.approx(5 / 12)
    # distance to the best: a 0,0,3,0; c 3,1,0,3
    assert scores["a"]["penalty_w"] == pytest.approx(3 / 4)
    assert scores["c"]["penalty_w"] == pytest.approx(7 / 4)
    assert scores["a"]["best"] == pytest.approx(3 / 4)  # ties (the last column) count for both
    assert scores["b"]["best"] == pytest.approx(1 / 4)
    assert scores["c"]["worst"] == pytest.approx(2 / 4)


def test_analyze_with_replays(lifetimes, cross_thread, tmp_path):
    names = [name for name in _available() if name in ("glibc", "meshalloc")]
    if len(names) < 2:
        pytest.skip("needs glibc and meshalloc")
    directories = []
    for trace in (lifetimes, cross_thread):
        # Stretched 100 times (to 20-30 ms), so that every run has PSS samples at 1 ms.
        out = tmp_path / trace.stem
        completed = run_meshalloc("trace", "replay", str(trace), "--allocators", ",".join(names), "--repeat", "1",
                                  "--timing", "recorded", "--speed", "0.01", "--no-figure", "--no-cgroup",
                                  "--interval", "1", "--out", str(out))
        assert completed.returncode == 0, completed.stderr
        directories.append(out)
    out = tmp_path / "analysis"
    completed = run_meshalloc("trace", "analyze", str(lifetimes), "--replay", str(directories[0]), "--replay",
                              str(directories[1]), "--out", str(out))
    assert completed.returncode == 0, completed.stderr
    fragmentation = _tsv(out / "fragmentation.tsv")
    assert sorted(row["allocator"] for row in fragmentation) == sorted(names * 2)
    rankings = _tsv(out / "rankings.tsv")
    assert sorted((row["table"], row["allocator"]) for row in rankings) == sorted(
        (table, name) for table in ("space", "speed") for name in names)
    assert (out / "lifetimes.png").is_file() and (out / "live.svg").is_file()


def test_heap_map_under_meshalloc(lifetimes, tmp_path):
    if "meshalloc" not in _available():
        pytest.skip("libmeshalloc.so is not built")
    out = tmp_path / "replay"
    # Stretched to about 0.45 s: a few readings of meshalloc's statistics, every 100 ms.
    completed = run_meshalloc("trace", "replay", str(lifetimes), "--allocators", "glibc,meshalloc", "--repeat", "1",
                              "--timing", "recorded", "--speed", "0.0005", "--heap-map", "--no-figure", "--no-cgroup",
                              "--out", str(out))
    assert completed.returncode == 0, completed.stderr
    rows = _tsv(out / "heap-map.tsv")
    assert rows and {row["allocator"] for row in rows} == {"meshalloc"}  # glibc publishes nothing
    # The 1 MiB block, allocated last, is a large object from then on; before it, the heap holds
    # at most ten 4096-byte blocks.
    assert all(int(row["live_bytes"]) + int(row["large_bytes"]) <= MIB + 10 * 4096 for row in rows)
    analysis = tmp_path / "analysis"
    completed = run_meshalloc("trace", "analyze", str(lifetimes), "--replay", str(out), "--out", str(analysis))
    assert completed.returncode == 0, completed.stderr
    assert (analysis / "heap-map.png").is_file()
