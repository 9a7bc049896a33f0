"""`meshalloc bench large-heap`: the program's sample and summary lines, the table and files, and
issue 22's three claims on made-up runs (each must fail when its condition is false), then a
smoke run end to end (16 MiB, 1 s idle, glibc and meshalloc 3y: a few seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

import pytest
from bench_support import assert_figure, assert_registered, read_tsv, require_built, run_smoke, smoke_outcome

from meshalloc_cli import paths
from meshalloc_cli.bench import large_heap as lh
from meshalloc_cli.bench.framework import QUICK, SMOKE
from meshalloc_cli.measure import MIB

# Lines as bench/large_heap printed them (16 MiB heap under meshalloc 3y).
SAMPLE = "sample t_s=0.501 pss_bytes=12108800 pte_bytes=106496 mappings=985 mesh_cpu_ns=13109751"
SUMMARY = ("workload=large_heap live_bytes=4194304 objects=65536 fill_s=0.012 free_s=0.005 pss_after_free=17730560 "
           "pss_end=12077056 ratio_end=2.879 seconds_to_2x=-1.000 pte_end=106496 mappings_end=989 "
           "mesh_cpu_ns=14010196 checksum=959f774678cc9498")

HEAP = 256 * MIB
WORKLOAD = lh.Workload(HEAP, idle_s=60, sample_ms=1000)
LIVE = WORKLOAD.live_bytes
LIMIT = 65530
THRESHOLD = lh.mapping_threshold(LIMIT)


def test_experiment_is_registered():
    assert_registered(lh, "large-heap")


def test_sample_line_is_parsed():
    sample = lh.parse_sample(SAMPLE)
    assert sample == lh.Sample(0.501, 12108800, 106496, 985, 13109751)
    assert isinstance(sample.pss_bytes, int) and isinstance(sample.t_s, float)
    assert lh.parse_sample("sample t_s=1.0 pss_bytes=5") is None  # cut short: not a sample
    assert lh.parse_sample(SUMMARY) is None


def test_summary_line_and_samples_are_parsed_from_the_output():
    text = "\n".join(["large_heap: starting", SAMPLE.replace("0.501", "0.000"), SAMPLE, SUMMARY, ""])
    samples, fields, line = lh.parse_output(text)
    assert [sample.t_s for sample in samples] == [0.0, 0.501]
    assert line == SUMMARY
    assert fields["live_bytes"] == 4194304 and isinstance(fields["live_bytes"], int)
    assert fields["ratio_end"] == pytest.approx(2.879) and fields["seconds_to_2x"] == -1.0
    assert fields["checksum"] == "959f774678cc9498" and fields["mesh_cpu_ns"] == 14010196
    assert lh.parse_output("no result\n") == ([], {}, "")


def test_workload_matches_the_program():
    # The program keeps count - count * 75 / 100 objects: 16 MiB of 256 B objects keeps 4 MiB.
    assert lh.Workload(16 * MIB, 1, 250).live_bytes == 4194304
    arguments = WORKLOAD.arguments()
    assert arguments[arguments.index("--bytes") + 1] == str(HEAP)
    assert arguments[arguments.index("--idle-ms") + 1] == "60000"
    assert int(arguments[arguments.index("--time-limit") + 1]) > WORKLOAD.idle_s
    assert lh.SETTINGS[lh.FULL].heaps == (2 << 30, 8 << 30) and lh.SETTINGS[lh.FULL].idle_s == 60
    assert lh.SETTINGS[QUICK].heaps == (256 * MIB,) and lh.SETTINGS[QUICK].idle_s == 10
    assert lh.REPETITIONS[lh.FULL] >= 3 and lh.REPETITIONS[QUICK] == 1


def test_mapping_threshold_is_meshallocs_margin():
    assert lh.mapping_threshold(65530) == 65530 - 8191  # 1/8 of the limit
    assert lh.mapping_threshold(4096) == 4096 - 1024  # at least 1024


# -- made-up runs ------------------------------------------------------------------------------

def program_output(ratios: Sequence[float], mappings: Sequence[int], mesh_ns: int = -1,
                   checksum: str = "00000000000000aa", live: int = LIVE) -> str:
    """What bench/large_heap would print for a run whose PSS, one reading a second from t = 0,
    is each of `ratios` times the live bytes; seconds_to_2x worked out as the program does."""
    lines, reached = [], -1.0
    for second, (ratio, maps) in enumerate(zip(ratios, mappings)):
        pss = int(ratio * live)
        if reached < 0 and pss <= 2 * live:
            reached = float(second)
        lines.append(f"sample t_s={second}.002 pss_bytes={pss} pte_bytes={4096 * maps} mappings={maps} "
                     f"mesh_cpu_ns={mesh_ns}")
    end = int(ratios[-1] * live)
    lines.append(f"workload=large_heap live_bytes={live} objects={HEAP // 256} fill_s=1.000 free_s=0.500 "
                 f"pss_after_free={int(ratios[0] * live)} pss_end={end} ratio_end={end / live:.3f} "
                 f"seconds_to_2x={reached:.3f} pte_end={4096 * mappings[-1]} mappings_end={mappings[-1]} "
                 f"mesh_cpu_ns={mesh_ns} checksum={checksum}")
    return "\n".join(lines) + "\n"


def made_up_run(allocator: str, ratios: Sequence[float], mappings: Optional[Sequence[int]] = None,
                repetition: int = 1, **options) -> lh.HeapRun:
    mappings = list(mappings or [100] * len(ratios))
    run = lh.HeapRun(HEAP, allocator, repetition, 0, "ok")
    run.samples, run.summary, run.line = lh.parse_output(program_output(ratios, mappings, **options))
    run.status = lh.check_run(run, WORKLOAD, None)
    assert run.ok, run.status
    return run


def falling(start: float, end: float, seconds: int = 60) -> List[float]:
    """PSS ÷ live falling linearly from `start` to `end` over `seconds` (one reading a second)."""
    return [start + (end - start) * second / seconds for second in range(seconds + 1)]


FLAT_GLIBC = [4.6] * 61


def table_of(runs: Sequence[lh.HeapRun], names: Sequence[str]) -> lh.Table:
    return lh.build_table(runs, [HEAP], names)


def claims_of(runs: Sequence[lh.HeapRun], names: Sequence[str] = (lh.GLIBC, lh.MESH_ON), mode: str = lh.FULL,
              limit: Optional[int] = LIMIT):
    found = lh.claims(table_of(runs, names), [HEAP], list(names), limit, checked=mode != SMOKE)
    ratio, maps, rivals = found
    assert "2× live within 60 s" in ratio.claim and "mappings" in maps.claim and "every other" in rivals.claim
    return ratio, maps, rivals


def test_checks_of_a_run():
    run = made_up_run(lh.MESH_ON, falling(4.0, 3.0))
    assert lh.check_run(run, WORKLOAD, "00000000000000aa") == "ok"
    assert "checksum" in lh.check_run(run, WORKLOAD, "00000000000000bb")
    assert "live_bytes" in lh.check_run(run, lh.Workload(HEAP * 2, 60, 1000), None)
    assert "summary" in lh.check_run(lh.HeapRun(HEAP, lh.MESH_ON, 1, 0, "ok"), WORKLOAD, None)


def test_readings_at_the_checkpoints():
    run = made_up_run(lh.MESH_ON, falling(4.0, 1.0))
    assert run.ratio(run.pss_at(10)) == pytest.approx(3.5, abs=1e-6)
    assert run.ratio(run.pss_at(60)) == pytest.approx(1.0, abs=1e-6)
    assert run.pss_at(90) is None  # not watched that long
    assert run.seconds_to_2x == 40.0
    short = made_up_run(lh.MESH_ON, falling(4.0, 3.0, seconds=10))
    assert short.seconds_to_2x is None and short.watched_s == pytest.approx(10.002)


def test_readings_that_slip_behind_the_period_still_count():
    # Each reading of a large meshed heap takes ~0.1 s, so the program's readings come every
    # 1.1 s: the 10 s checkpoint takes the nearest one (9.9 s), and 10 readings watched 11 s.
    run = made_up_run(lh.MESH_ON, falling(4.0, 3.0, seconds=10))
    for index, sample in enumerate(run.samples):
        sample.t_s = index * 1.1
    assert run.ratio(run.pss_at(10)) == pytest.approx(3.1, abs=1e-6)
    assert run.pss_at(30) is None


@pytest.mark.parametrize("end, holds", [(1.5, True), (2.0, True), (2.2, False), (3.5, False)])
def test_ratio_claim(end, holds):
    runs = [made_up_run(lh.GLIBC, FLAT_GLIBC), made_up_run(lh.MESH_ON, falling(4.0, end))]
    ratio, _, _ = claims_of(runs)
    assert ratio.holds is holds, ratio
    assert f"{end:.2f}× at the end" in ratio.ours
    if not holds:
        assert "never in 60 s" in ratio.ours


def test_ratio_claim_takes_the_median_run():
    # Two of three runs reach 2× in time: holds; one of three: does not.
    good, bad = falling(4.0, 1.5), falling(4.0, 3.0)
    mostly = [made_up_run(lh.MESH_ON, ratios, repetition=index + 1) for index, ratios in enumerate([good, good, bad])]
    assert claims_of(mostly, [lh.MESH_ON])[0].holds is True
    rarely = [made_up_run(lh.MESH_ON, ratios, repetition=index + 1) for index, ratios in enumerate([good, bad, bad])]
    claim = claims_of(rarely, [lh.MESH_ON])[0]
    assert claim.holds is False and "2 of 3 runs never" in claim.ours


def test_ratio_claim_needs_the_whole_window():
    # Reached only after 60 s: too late.
    late = made_up_run(lh.MESH_ON, falling(4.0, 1.0, seconds=120))
    assert late.seconds_to_2x == 80.0
    assert claims_of([late], [lh.MESH_ON])[0].holds is False
    # Watched 10 s (quick) and not there yet: cannot be judged; there already: holds.
    short = made_up_run(lh.MESH_ON, falling(4.0, 3.0, seconds=10))
    claim = claims_of([short], [lh.MESH_ON], mode=QUICK)[0]
    assert claim.holds is None and "less than the target's 60 s" in claim.note
    fast = made_up_run(lh.MESH_ON, falling(4.0, 1.5, seconds=10))
    assert claims_of([fast], [lh.MESH_ON], mode=QUICK)[0].holds is True


@pytest.mark.parametrize("peak, holds", [(1000, True), (THRESHOLD, True), (THRESHOLD + 1, False), (LIMIT, False)])
def test_mapping_claim(peak, holds):
    # The peak is in the middle of the run; the end is far below it: "never" means every reading.
    mappings = [100] * 30 + [peak] + [200] * 30
    runs = [made_up_run(lh.GLIBC, FLAT_GLIBC), made_up_run(lh.MESH_ON, falling(4.0, 3.0), mappings)]
    _, maps, _ = claims_of(runs)
    assert maps.holds is holds, maps
    assert f"peak {peak:,}" in maps.ours and f"{THRESHOLD:,}" in maps.paper


def test_mapping_claim_takes_the_worst_run():
    mine = [made_up_run(lh.MESH_ON, falling(4.0, 3.0), [100] * 61, repetition=1),
            made_up_run(lh.MESH_ON, falling(4.0, 3.0), [100] * 60 + [THRESHOLD + 5], repetition=2),
            made_up_run(lh.MESH_ON, falling(4.0, 3.0), [100] * 61, repetition=3)]
    assert claims_of(mine, [lh.MESH_ON])[1].holds is False
    assert claims_of(mine, [lh.MESH_ON], limit=None)[1].holds is None


def test_rivals_claim():
    mesh = made_up_run(lh.MESH_ON, falling(4.0, 3.0))
    below = [made_up_run(lh.GLIBC, FLAT_GLIBC), made_up_run(lh.JEMALLOC, [3.2] * 61), mesh]
    names = [lh.GLIBC, lh.JEMALLOC, lh.MESH_ON]
    claim = claims_of(below, names)[2]
    assert claim.holds is True and "glibc 4.60×" in claim.ours and "jemalloc 3.20×" in claim.ours
    # Above one rival (jemalloc) is enough to fail.
    above = [made_up_run(lh.GLIBC, FLAT_GLIBC), made_up_run(lh.JEMALLOC, [2.9] * 61), mesh]
    assert claims_of(above, names)[2].holds is False
    equal = [made_up_run(lh.GLIBC, FLAT_GLIBC), made_up_run(lh.JEMALLOC, [3.0] * 61), mesh]
    assert claims_of(equal, names)[2].holds is False  # "below", not "as low as"
    assert claims_of([mesh], [lh.MESH_ON])[2].holds is None


def test_claims_unchecked_without_evidence():
    runs = [made_up_run(lh.GLIBC, FLAT_GLIBC), made_up_run(lh.MESH_ON, falling(4.0, 1.5))]
    for claim in claims_of(runs, mode=SMOKE):
        assert claim.holds is None and "smoke" in claim.note
    for claim in claims_of([made_up_run(lh.GLIBC, FLAT_GLIBC)], [lh.GLIBC]):
        assert claim.holds is None and "did not run" in claim.note
    found = lh.claims({}, [HEAP], [lh.GLIBC, lh.MESH_ON], LIMIT, checked=True, not_run={HEAP: "no room"})
    assert all(claim.holds is None and "no room" in claim.note for claim in found)


def test_table_and_files(tmp_path):
    runs = [made_up_run(lh.GLIBC, FLAT_GLIBC), made_up_run(lh.MESH_ON, falling(4.0, 3.0), mesh_ns=1_500_000_000),
            lh.HeapRun(HEAP, lh.JEMALLOC, 1, 0, "killed by SIGALRM")]
    names = [lh.GLIBC, lh.JEMALLOC, lh.MESH_ON]
    table = table_of(runs, names)
    markdown = lh.table_md(table, [HEAP], names, 60)
    assert "| at 10 s | at 30 s | at 60 s | at end |" in markdown and "page tables MiB" in markdown
    mesh_row = next(line for line in markdown.splitlines() if f"| {lh.MESH_ON} |" in line)
    assert "| 3.83× | 3.50× | 3.00× | 3.00× |" in mesh_row and "never in 60 s" in mesh_row and "| 1.50 |" in mesh_row
    assert f"| 256 MiB | {lh.JEMALLOC} | 0/1 |" in markdown
    quick = lh.table_md(table, [HEAP], names, 10)
    assert "at 10 s" in quick and "at 30 s" not in quick

    lh.write_runs(tmp_path, runs)
    lh.write_summary_tsv(tmp_path, table, [HEAP], names)
    _, written = read_tsv(tmp_path / "runs.tsv")
    assert [row["status"] for row in written] == ["ok", "ok", "killed by SIGALRM"]
    assert written[1]["peak_mappings"] == "100" and written[1]["seconds_to_2x"] == "-1"
    _, samples = read_tsv(tmp_path / "samples.tsv")
    assert len(samples) == 2 * 61 and float(samples[61]["pss_per_live"]) == pytest.approx(4.0, abs=1e-4)
    _, summary = read_tsv(tmp_path / "summary.tsv")
    mesh = next(row for row in summary if row["allocator"] == lh.MESH_ON)
    assert float(mesh["ratio_at_30s"]) == pytest.approx(3.5, abs=1e-4) and mesh["never_2x"] == "1"
    assert float(mesh["mesh_cpu_s"]) == pytest.approx(1.5)


def test_figure(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [made_up_run(lh.GLIBC, FLAT_GLIBC), made_up_run(lh.MESH_ON, falling(4.0, 3.0), [100 * s for s in range(61)])]
    lh.plot(tmp_path, runs, [HEAP, 2 * HEAP], [lh.GLIBC, lh.MESH_ON], LIMIT)  # a panel with no run stays empty
    assert_figure(tmp_path / lh.FIGURE_STEM)


# -- end to end ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    require_built(lh.BINARY, paths.MESHALLOC_LIBRARY, paths.GLIBC_SHIM_LIBRARY)
    return run_smoke("large-heap", tmp_path_factory.mktemp("bench"))


def test_smoke_run(smoke):
    outcome = smoke_outcome(smoke)
    assert len(outcome["claims"]) == 3
    assert all(claim["holds"] is None and "smoke" in claim["note"] for claim in outcome["claims"])
    assert "| heap | allocator | runs |" in outcome["table_md"]
    for name in ("runs.tsv", "samples.tsv", "summary.tsv", "table.md", "pss-over-time.png", "summary.json"):
        assert name in outcome["files"], name
    _, runs = read_tsv(smoke / "runs.tsv")
    assert {run["allocator"] for run in runs} == set(lh.SMOKE_ALLOCATORS)
    assert all(run["status"] == "ok" and run["live_bytes"] == "4194304" for run in runs)
    assert len({run["checksum"] for run in runs}) == 1  # the same survivors under every allocator
    mesh = next(run for run in runs if run["allocator"] == lh.MESH_ON)
    assert int(mesh["mesh_cpu_ns"]) >= 0 and int(mesh["pte_end"]) > 0
    _, samples = read_tsv(smoke / "samples.tsv")
    assert len(samples) >= 2 * 4  # 1 s at 250 ms, per allocator
    assert_figure(smoke / lh.FIGURE_STEM)
