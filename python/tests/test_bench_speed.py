"""`meshalloc bench speed` in smoke mode: every microbenchmark and every installed real program,
tiny parameters, one repetition, two allocators (a few seconds). Checks that every output exists
and is well formed and that the claims are there, unchecked. Also the table's and the claims'
arithmetic on made-up runs, which needs nothing built."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from bench_support import ROOT, assert_figure, assert_registered, read_tsv, require_built, run_smoke, smoke_outcome

from meshalloc_cli import paths
from meshalloc_cli.bench import programs, speed


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    require_built(Path("bench") / "churn", paths.MESHALLOC_LIBRARY)  # churn: the microbenchmarks
    return run_smoke("speed", tmp_path_factory.mktemp("bench"))


def test_experiment_is_registered():
    assert_registered(speed, "speed")


def test_every_microbenchmark_is_built():
    """Each row's program is one that `make release` builds (BENCH_WORKLOADS in
    bench/CMakeLists.txt), and the row names are distinct: a row whose program is missing there
    would only show when the experiment refuses to run."""
    cmake = (ROOT / "bench" / "CMakeLists.txt").read_text()
    listed = re.search(r"set\(BENCH_WORKLOADS\s([^)]*)\)", cmake)
    assert listed, "bench/CMakeLists.txt no longer sets BENCH_WORKLOADS"
    missing = {bench.binary for bench in speed.MICROBENCHMARKS} - set(listed.group(1).split())
    assert not missing, f"MICROBENCHMARKS run programs that BENCH_WORKLOADS does not build: {sorted(missing)}"
    names = [bench.name for bench in speed.MICROBENCHMARKS]
    assert len(names) == len(set(names))


def test_smoke_outcome(smoke):
    outcome = smoke_outcome(smoke)
    assert "| workload | kind | mimalloc s |" in outcome["table_md"]
    assert "geomean all" in outcome["table_md"]
    claims = outcome["claims"]
    assert [claim["claim"] for claim in claims][:2] == [
        "meshalloc 1n time vs mimalloc, each single-threaded microbenchmark (10)",
        "meshalloc 1n time vs mimalloc, each multi-threaded microbenchmark (8)"]
    assert all(claim["holds"] is None and "smoke" in claim["note"] for claim in claims)
    assert "speed.png" in outcome["files"] and "table.tsv" in outcome["files"]


def test_smoke_runs_cover_every_workload(smoke):
    installed = [program.name for program in programs.PROGRAMS if program.available()]
    expected = [bench.name for bench in speed.MICROBENCHMARKS] + installed
    _, runs = read_tsv(smoke / "runs.tsv")
    assert sorted({run["workload"] for run in runs}) == sorted(expected)
    assert {run["allocator"] for run in runs} == set(speed.SMOKE_ALLOCATORS)
    assert all(run["status"] == "ok" and float(run["seconds"]) > 0 for run in runs)
    micro = [run for run in runs if run["workload"] in {bench.name for bench in speed.MICROBENCHMARKS}]
    assert all(run["checksum"] for run in micro)


def test_smoke_memory_pass(smoke):
    _, runs = read_tsv(smoke / "memory-runs.tsv")
    assert len(runs) == len({run["workload"] for run in runs}) * len(speed.SMOKE_ALLOCATORS)
    for run in runs:
        assert run["status"] == "ok"
        header, samples = read_tsv(smoke / run["samples_tsv"])
        assert header[:2] == ["time_s", "pss_bytes"]
        # A smoke microbenchmark lasts 10-50 ms: on a busy machine it can end before the
        # first sample, which the notes then say; a program always lasts long enough.
        if run["workload"] in {program.name for program in programs.PROGRAMS} or run["peak_pss_bytes"]:
            assert int(run["peak_pss_bytes"]) > 0 and int(run["samples"]) == len(samples) >= 1


def test_smoke_table_and_figure(smoke):
    header, rows = read_tsv(smoke / "table.tsv")
    assert header[:5] == ["workload", "kind", "allocator", "runs", "succeeded"]
    mimalloc = [row for row in rows if row["allocator"] == "mimalloc"]
    assert mimalloc and all(float(row["time_ratio"]) == 1.0 for row in mimalloc)
    assert all(float(row["peak_pss_bytes"]) > 0 for row in rows if row["kind"] == "program")
    markdown = (smoke / "table.md").read_text()
    for heading in ("## Median seconds", "## Peak PSS", "## Claims", "## Workloads", "## Notes"):
        assert heading in markdown
    assert_figure(smoke / "speed")
    summary = json.loads((smoke / "summary.json").read_text())
    assert summary["mode"] == "smoke" and summary["workloads"]


# -- arithmetic on made-up runs ------------------------------------------------------------

def made_up(times):
    """TimeRecords from {(workload, allocator): [seconds per repetition]}."""
    records = []
    for (workload, allocator), seconds in times.items():
        for repetition, value in enumerate(seconds, 1):
            records.append(speed.TimeRecord(workload, allocator, repetition, 0, "ok", value))
    return records


def workload(name, kind):
    return programs.Workload(name, kind, ["true"], None, {}, "pattern", "true")


def test_ratios_geomeans_and_target_claims():
    workloads = [workload("a", speed.ST), workload("b", speed.ST), workload("c", speed.MT)]
    times = made_up({("a", "mimalloc"): [1.0, 1.0, 1.0], ("a", "meshalloc:1n"): [1.2, 1.4, 1.3],
                     ("b", "mimalloc"): [2.0, 2.0, 2.0], ("b", "meshalloc:1n"): [1.0, 1.0, 1.0],
                     ("c", "mimalloc"): [1.0, 1.0, 1.0], ("c", "meshalloc:1n"): [1.6, 1.6, 1.6]})
    names = ["mimalloc", "meshalloc:1n"]
    table = speed.build_table(workloads, names, "mimalloc", times, [])
    cell = table["a"]["meshalloc:1n"]
    assert cell.ratio == pytest.approx(1.3)
    assert cell.ratio_range == pytest.approx((1.2, 1.4))
    both = speed.geomean_over(table, ["a", "b"], "meshalloc:1n")
    assert both.value == pytest.approx((1.3 * 0.5) ** 0.5)
    assert both.low == pytest.approx((1.2 * 0.5) ** 0.5) and both.high == pytest.approx((1.4 * 0.5) ** 0.5)
    found = speed.claims(workloads, table, "mimalloc", checked=True)
    single, multi = found[0], found[1]
    assert single.holds is True and "worst 1.30× (a, 1.20–1.40 over 3 runs)" in single.ours
    assert multi.holds is False and "1 of 1 over: c" in multi.ours
    markdown = speed.ratio_table(workloads, names, "mimalloc", table)
    assert "| c | mt | 1.000 | **1.60** | MISS (≤ 1.5) |" in markdown


def test_program_claims_compare_with_glibc_and_jemalloc():
    workloads = [workload("perl", speed.PROGRAM), workload("git", speed.PROGRAM)]
    times = made_up({("perl", "glibc"): [1.0, 1.0], ("perl", "meshalloc:3y"): [1.05, 1.05],
                     ("perl", "jemalloc"): [0.9, 0.9], ("perl", "mimalloc"): [1.0, 1.0],
                     ("git", "glibc"): [2.0, 2.0], ("git", "meshalloc:3y"): [2.6, 2.6],
                     ("git", "jemalloc"): [2.0, 2.0], ("git", "mimalloc"): [2.0, 2.0]})
    names = ["glibc", "jemalloc", "mimalloc", "meshalloc:3y"]
    table = speed.build_table(workloads, names, "mimalloc", times, [])
    found = {claim.claim: claim for claim in speed.claims(workloads, table, "mimalloc", checked=True)}
    spec = found["meshalloc 3y time vs glibc, geomean of the real programs"]
    assert spec.ours.startswith(f"{(1.05 * 1.3) ** 0.5:.3f}×") and spec.holds is False
    assert found["meshalloc 3y time vs glibc, perl"].holds is True
    assert found["meshalloc 3y time vs jemalloc, geomean of the real programs"].holds is False


def test_microbenchmark_line_is_parsed():
    line = "workload=churn threads=1 seconds=0.223240 ops=4004096 maxrss_kb=13556 checksum=36a77ac1a2bf995c"
    fields = speed.parse_line("noise\n" + line + "\n")
    assert fields["seconds"] == "0.223240" and fields["checksum"] == "36a77ac1a2bf995c"


def test_the_time_pass_changes_which_allocator_follows_which():
    """With one order every repetition, one build always ran right after glibc and came out
    behind another on old-free and turnover (docs/speed.md): in the timed pass, over the quick
    mode's repetitions, no allocator may always have the same predecessor."""
    from meshalloc_cli.bench import schedule
    from meshalloc_cli.bench.framework import QUICK
    params = speed.PARAMETERS[QUICK]
    time_pass = speed.Speed.passes(speed.Speed.__new__(speed.Speed), params)[0]
    allocators = ["mimalloc", "jemalloc", "glibc", "new", "old"]
    slots = schedule.plan(["w"], allocators, params.repetitions, time_pass.order)
    predecessors = {name: set() for name in allocators}
    for before, after in zip(slots, slots[1:]):
        if before.repetition == after.repetition:
            predecessors[after.allocator].add(before.allocator)
    assert all(len(seen) > 1 for seen in predecessors.values()), predecessors
