"""`meshalloc bench real-apps` in smoke mode: every installed real program at its smallest size,
one repetition, glibc and meshalloc 3y (a few seconds). Checks that every output exists and is
well formed and that the claims are there, unchecked. Also the geomean and claim arithmetic on
made-up runs, and that the generated inputs (SQL, git history) are deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_support import assert_figure, assert_registered, read_tsv, require_built, run_smoke, smoke_outcome

from meshalloc_cli import paths
from meshalloc_cli.bench import programs, real_apps
from meshalloc_cli.allocators import Allocator
from meshalloc_cli.bench.framework import Results, Run


def installed():
    return [program.name for program in programs.PROGRAMS if program.available()]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    if not installed():
        pytest.skip("none of python3, ruby, perl, sqlite3, git is installed")
    require_built(paths.MESHALLOC_LIBRARY)
    return run_smoke("real-apps", tmp_path_factory.mktemp("bench"))


def test_experiment_is_registered():
    assert_registered(real_apps, "real-apps")


def test_smoke_outcome(smoke):
    outcome = smoke_outcome(smoke)
    assert "**Mean PSS**" in outcome["table_md"] and "**Peak PSS**" in outcome["table_md"]
    assert "| program | glibc MiB | meshalloc:3y × |" in outcome["table_md"]
    claims = outcome["claims"]
    assert claims[0]["claim"] == "meshalloc 3y mean memory vs glibc, geomean of the real programs"
    assert all(claim["holds"] is None and "smoke" in claim["note"] for claim in claims)
    assert "memory.png" in outcome["files"]


def test_smoke_runs_and_samples(smoke):
    _, runs = read_tsv(smoke / "runs.tsv")
    assert sorted({run["program"] for run in runs}) == sorted(installed())
    assert {run["allocator"] for run in runs} == set(real_apps.SMOKE_ALLOCATORS)
    for run in runs:
        assert run["status"] == "ok"
        assert 0 < float(run["mean_pss_bytes"]) <= int(run["peak_pss_bytes"])
        header, samples = read_tsv(smoke / run["samples_tsv"])
        assert header[:2] == ["time_s", "pss_bytes"] and samples


def test_smoke_table_and_figure(smoke):
    header, rows = read_tsv(smoke / "table.tsv")
    assert header[:4] == ["program", "allocator", "runs", "succeeded"]
    glibc = [row for row in rows if row["allocator"] == "glibc"]
    assert glibc and all(float(row["mean_pss_ratio_to_glibc"]) == 1.0 for row in glibc)
    markdown = (smoke / "table.md").read_text()
    for heading in ("## Mean PSS, MiB", "## Peak PSS, MiB", "## Claims", "## Programs", "## Notes"):
        assert heading in markdown
    assert_figure(smoke / "memory")


# -- arithmetic on made-up runs ------------------------------------------------------------

def results(rows, names, cells):
    """Results of made-up runs: cells maps (program, allocator) to [(mean, peak) per repetition]."""
    found = Results([], rows, [Allocator(name, None, "") for name in names], "glibc", 2)
    for (program, allocator), values in cells.items():
        for repetition, (mean, peak) in enumerate(values, 1):
            found.runs.append(Run(program, program, Allocator(allocator, None, ""), repetition, 0, Path("."),
                                  figures={"mean_pss": mean, "peak_pss": peak}))
    return found


def test_geomeans_and_claims_judge_the_direction():
    names = ["glibc", "jemalloc", "meshalloc:3y"]
    made_up = results(["perl", "git"], names, {
        ("perl", "glibc"): [(100, 200), (100, 200)], ("perl", "meshalloc:3y"): [(90, 150), (80, 150)],
        ("perl", "jemalloc"): [(100, 200), (100, 200)], ("git", "glibc"): [(50, 60), (50, 60)],
        ("git", "meshalloc:3y"): [(55, 70), (55, 70)], ("git", "jemalloc"): [(40, 60), (40, 60)]})
    assert made_up.ratio("perl", "meshalloc:3y", "mean_pss") == pytest.approx(0.85)
    mean = made_up.geomean(["perl", "git"], "meshalloc:3y", "glibc", "mean_pss")
    assert mean.value == pytest.approx((0.85 * 1.1) ** 0.5)
    assert mean.low == pytest.approx((0.8 * 1.1) ** 0.5) and mean.high == pytest.approx((0.9 * 1.1) ** 0.5)
    found = {claim.claim: claim for claim in real_apps.claims(["perl", "git"], made_up, checked=True)}
    assert found["meshalloc 3y mean memory vs glibc, geomean of the real programs"].holds is True
    assert found["meshalloc 3y peak memory vs glibc, perl"].holds is True
    assert found["meshalloc 3y mean memory vs jemalloc, geomean of the real programs"].holds is False
    markdown = real_apps.ratio_table(["perl", "git"], names, made_up, "mean_pss", "glibc")
    assert "| perl | 0.0 | 1.00 | 0.85 (0.80–0.90) |" in markdown


def test_generated_inputs_are_deterministic(tmp_path):
    programs.write_sql(tmp_path / "a.sql", 1)
    programs.write_sql(tmp_path / "b.sql", 1)
    assert (tmp_path / "a.sql").read_bytes() == (tmp_path / "b.sql").read_bytes()
    assert programs.fast_import_stream(1) == programs.fast_import_stream(1)
    assert programs.fast_import_stream(1).count(b"\ncommit refs/heads/main") == programs.GIT_COMMITS_PER_SCALE - 1
