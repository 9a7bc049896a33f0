"""`meshalloc bench thread-scaling`: the two moments the program reads its PSS at (threads alive
and idle, and after they exited), from the program's line through the analysis, the files and
the claims of issue 22's targets, on made-up runs (nothing built needed). The smoke run end to
end is in test_bench_runner.py."""

from __future__ import annotations

from typing import Dict, List, Optional

import pytest
from bench_support import assert_figure, read_tsv

from meshalloc_cli.bench import thread_scaling as ts
from meshalloc_cli.bench.framework import QUICK, SMOKE
from meshalloc_cli.measure import MIB

LINE = ("threads=48 live_bytes=119914980 pss_bytes=166043648 pte_bytes=618496 ratio=1.385 seconds=0.4279 "
        "base_pss_bytes=1729536 mappings=6616 retained=48000 checksum=5381161b5247ef60 "
        "alive_pss_bytes=166355968 alive_pte_bytes=700416 alive_ratio=1.387")
LIVE_PER_THREAD = MIB  # made-up runs keep 1 MiB per thread
GRID = [1, 24, ts.TARGET_THREADS]


def test_both_readings_are_parsed():
    fields, line = ts.parse_line("starting\n" + LINE + "\n")
    assert line == LINE
    assert fields["alive_pss_bytes"] == 166355968 and isinstance(fields["alive_pss_bytes"], int)
    assert fields["alive_pte_bytes"] == 700416 and isinstance(fields["alive_pte_bytes"], int)
    assert fields["pss_bytes"] == 166043648 and fields["alive_ratio"] == pytest.approx(1.387)


def made_up_run(allocator: str, threads: int, repetition: int, exit_ratio: float,
                alive_ratio: Optional[float]) -> ts.ScalingRun:
    """A successful run whose PSS is the given multiple of its live bytes at each moment
    (alive_ratio None: a program that printed no alive reading)."""
    live = threads * LIVE_PER_THREAD
    fields: Dict[str, float] = {"threads": threads, "live_bytes": live, "pss_bytes": int(exit_ratio * live),
                                "pte_bytes": 4096 * threads, "mappings": 10 * threads, "seconds": 0.1}
    if alive_ratio is not None:
        fields["alive_pss_bytes"] = int(alive_ratio * live)
        fields["alive_pte_bytes"] = 8192 * threads
    return ts.ScalingRun(allocator, threads, repetition, status="ok", fields=fields, line="threads=...")


def analysis_of(ratios: Dict[str, tuple], repetitions: int = 2) -> ts.Analysis:
    """Every allocator of RATIOS at every thread count of GRID, each repetition at
    (exit ratio, alive ratio) plus 0.02 × (repetition − 1), so the repetitions differ."""
    runs: List[ts.ScalingRun] = []
    for count in GRID:
        for repetition in range(1, repetitions + 1):
            for name, (exit_ratio, alive_ratio) in ratios.items():
                step = 0.02 * (repetition - 1)
                runs.append(made_up_run(name, count, repetition, exit_ratio + step,
                                        None if alive_ratio is None else alive_ratio + step))
    return ts.analyse(runs, list(ratios), GRID, repetitions)


def target_claims(analysis: ts.Analysis, mode: str = QUICK):
    """Issue 22's three claims: (alive ratio, alive below the rivals, after-exit ratio)."""
    claims = ts.build_claims(analysis, mode)
    alive = [claim for claim in claims if "issue 22" in claim.claim and ts.MOMENT_PHRASE[ts.ALIVE] in claim.claim]
    after = [claim for claim in claims if "issue 22" in claim.claim and ts.MOMENT_PHRASE[ts.EXIT] in claim.claim]
    (ratio,) = [claim for claim in alive if "≤" in claim.claim]
    (rivals,) = [claim for claim in alive if "below" in claim.claim]
    (exit_ratio,) = after
    return ratio, rivals, exit_ratio


def test_analysis_keeps_each_moment_apart():
    analysis = analysis_of({ts.MESH_ON: (1.2, 1.4), ts.GLIBC: (2.0, 2.1)})
    cell = analysis.cells[(ts.MESH_ON, 48)]
    live = 48 * LIVE_PER_THREAD
    assert cell.alive_pss.low == int(1.4 * live) and cell.alive_pss.high == int(1.42 * live)
    assert cell.pss.low == int(1.2 * live)
    assert cell.alive_pte.median == 8192 * 48 and cell.pte.median == 4096 * 48
    assert analysis.ratio(ts.MESH_ON, 48, ts.ALIVE) == pytest.approx(1.41, abs=1e-6)
    assert analysis.ratio(ts.MESH_ON, 48) == pytest.approx(1.21, abs=1e-6)  # after exit unless asked
    assert analysis.ratios[(ts.MESH_ON, 48, ts.ALIVE)] == pytest.approx([1.4, 1.42], abs=1e-6)
    assert analysis.pss(ts.GLIBC, 48, ts.ALIVE) > analysis.pss(ts.GLIBC, 48, ts.EXIT)


@pytest.mark.parametrize("alive, holds", [(1.4, True), (1.45, True), (1.6, False), (2.5, False)])
def test_alive_ratio_claim(alive, holds):
    # The median of two repetitions is alive + 0.01.
    analysis = analysis_of({ts.MESH_ON: (1.1, alive), ts.GLIBC: (3.0, 3.0), ts.JEMALLOC: (3.0, 3.0)})
    ratio, _, _ = target_claims(analysis)
    assert ratio.holds is holds, ratio
    assert f"{alive + 0.01:.2f}×" in ratio.ours and "1.5×" in ratio.claim


@pytest.mark.parametrize("after, holds", [(1.1, True), (1.23, True), (1.3, False), (1.9, False)])
def test_after_exit_ratio_claim(after, holds):
    analysis = analysis_of({ts.MESH_ON: (after, 1.2), ts.GLIBC: (3.0, 3.0), ts.JEMALLOC: (3.0, 3.0)})
    alive_ratio, _, exit_ratio = target_claims(analysis)
    assert exit_ratio.holds is holds, exit_ratio
    assert alive_ratio.holds is True  # the alive reading does not stand in for the exit one
    assert "1.25×" in exit_ratio.claim


def test_moments_are_judged_separately():
    # Fine after exit, too much while the threads are alive: only the alive claims fail.
    analysis = analysis_of({ts.MESH_ON: (1.1, 2.5), ts.GLIBC: (1.8, 2.0), ts.JEMALLOC: (1.7, 1.9)})
    ratio, rivals, exit_ratio = target_claims(analysis)
    assert (ratio.holds, rivals.holds, exit_ratio.holds) == (False, False, True)


def test_alive_rivals_claim():
    below = analysis_of({ts.MESH_ON: (1.2, 1.4), ts.GLIBC: (1.3, 1.5), ts.JEMALLOC: (1.3, 1.45)})
    assert target_claims(below)[1].holds is True
    # Above jemalloc alone is enough to fail, whatever glibc does.
    above = analysis_of({ts.MESH_ON: (1.2, 1.4), ts.GLIBC: (2.0, 2.0), ts.JEMALLOC: (1.3, 1.35)})
    claim = target_claims(above)[1]
    assert claim.holds is False and ts.GLIBC in claim.ours and ts.JEMALLOC in claim.ours
    # Only the rivals that ran are compared; the missing one is named.
    glibc_only = analysis_of({ts.MESH_ON: (1.2, 1.4), ts.GLIBC: (2.0, 2.0)})
    claim = target_claims(glibc_only)[1]
    assert claim.holds is True and f"{ts.JEMALLOC}: no reading" in claim.ours
    alone = analysis_of({ts.MESH_ON: (1.2, 1.4)})
    claim = target_claims(alone)[1]
    assert claim.holds is None and "no successful" in claim.note


def test_target_claims_unchecked_without_evidence():
    ratios = {ts.MESH_ON: (1.1, 1.2), ts.GLIBC: (3.0, 3.0), ts.JEMALLOC: (3.0, 3.0)}
    for claim in target_claims(analysis_of(ratios), SMOKE):
        assert claim.holds is None and "smoke" in claim.note
    # A program that printed no alive reading: the alive claims cannot be judged, the exit one can.
    old = analysis_of({name: (after, None) for name, (after, _) in ratios.items()})
    ratio, rivals, exit_ratio = target_claims(old)
    assert ratio.holds is None and rivals.holds is None and "alive" in ratio.note
    assert exit_ratio.holds is True
    assert old.ratios[(ts.MESH_ON, 48, ts.ALIVE)] == [] and old.ratio(ts.MESH_ON, 48, ts.ALIVE) is None


def test_tables_show_both_moments():
    analysis = analysis_of({ts.MESH_ON: (1.2, 1.4), ts.GLIBC: (2.0, 2.2)})
    table = ts.table_md(analysis)
    assert "| allocator | moment | T=1 | T=24 | T=48 |" in table
    assert f"| {ts.MESH_ON} | {ts.ALIVE} | " in table and f"| {ts.MESH_ON} | {ts.EXIT} | " in table
    alive_row = next(line for line in table.splitlines() if line.startswith(f"| {ts.GLIBC} | {ts.ALIVE} |"))
    exit_row = next(line for line in table.splitlines() if line.startswith(f"| {ts.GLIBC} | {ts.EXIT} |"))
    assert "(2.21×)" in alive_row and "(2.01×)" in exit_row
    detail = ts.detail_table(analysis)
    header = detail[0].split("|")
    assert len(header) == len(detail[1].split("|")) == len(detail[2].split("|"))  # no ragged row
    assert "alive PSS MiB" in detail[0] and "PSS after exit MiB" in detail[0]


def test_files_carry_both_moments(tmp_path):
    analysis = analysis_of({ts.MESH_ON: (1.2, 1.4), ts.GLIBC: (2.0, 2.2)})
    ts.write_summary_tsv(analysis, tmp_path)
    _, rows = read_tsv(tmp_path / "summary.tsv")
    row = next(row for row in rows if row["allocator"] == ts.MESH_ON and row["threads"] == "48")
    assert float(row["alive_pss_per_live"]) == pytest.approx(1.41, abs=1e-4)
    assert float(row["pss_per_live"]) == pytest.approx(1.21, abs=1e-4)
    assert int(row["alive_pss_min_bytes"]) == int(1.4 * 48 * LIVE_PER_THREAD)
    assert int(row["alive_pte_bytes"]) == 8192 * 48 and int(row["pte_bytes"]) == 4096 * 48

    run = made_up_run(ts.MESH_ON, 48, 1, 1.2, 1.4)
    ts.write_runs([run], tmp_path)
    (written,) = read_tsv(tmp_path / "runs.tsv")[1]
    assert int(written["alive_pss_bytes"]) == run.value("alive_pss_bytes")
    assert int(written["alive_pte_bytes"]) == 8192 * 48


def test_figure_draws_both_moments(tmp_path):
    pytest.importorskip("matplotlib")
    analysis = analysis_of({ts.MESH_ON: (1.2, 1.4), ts.GLIBC: (2.0, 2.2)})
    ts.plot(analysis, tmp_path / ts.FIGURE_STEM, ts.SMOKE_WORKLOAD)
    assert_figure(tmp_path / ts.FIGURE_STEM)


def test_workload_names_both_readings():
    text = ts.STUDY_WORKLOAD.describe()
    assert "alive and idle" in text and "after they exited" in text
