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
from meshalloc_cli.bench.speed import MemoryRecord
from meshalloc_cli.measure import MetricSummary


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

class FakeResult:
    def __init__(self, mean, peak):
        self.summaries = {"pss": MetricSummary(mean=mean, peak=peak, final=peak)}
        self.cgroup_kernel_peak = None
        self.achieved_rate = 100.0

    def summary(self, metric):
        return self.summaries.get(metric)


def record(program, allocator, repetition, mean, peak):
    return MemoryRecord(program, allocator, repetition, 0, "ok", Path("."), FakeResult(mean, peak))


def test_geomeans_and_claims_judge_the_direction():
    records = [record("perl", "glibc", 1, 100, 200), record("perl", "glibc", 2, 100, 200),
               record("perl", "meshalloc:3y", 1, 90, 150), record("perl", "meshalloc:3y", 2, 80, 150),
               record("perl", "jemalloc", 1, 100, 200), record("perl", "jemalloc", 2, 100, 200),
               record("git", "glibc", 1, 50, 60), record("git", "glibc", 2, 50, 60),
               record("git", "meshalloc:3y", 1, 55, 70), record("git", "meshalloc:3y", 2, 55, 70),
               record("git", "jemalloc", 1, 40, 60), record("git", "jemalloc", 2, 40, 60)]
    names = ["glibc", "jemalloc", "meshalloc:3y"]
    table = real_apps.build_table(["perl", "git"], names, records, "glibc")
    assert table["perl"]["meshalloc:3y"].ratios["mean_pss"] == pytest.approx(0.85)
    mean = real_apps.between(table, ["perl", "git"], "meshalloc:3y", "glibc", "mean_pss")
    assert mean.value == pytest.approx((0.85 * 1.1) ** 0.5)
    assert mean.low == pytest.approx((0.8 * 1.1) ** 0.5) and mean.high == pytest.approx((0.9 * 1.1) ** 0.5)
    found = {claim.claim: claim for claim in real_apps.claims(["perl", "git"], table, checked=True)}
    assert found["meshalloc 3y mean memory vs glibc, geomean of the real programs"].holds is True
    assert found["meshalloc 3y peak memory vs glibc, perl"].holds is True
    assert found["meshalloc 3y mean memory vs jemalloc, geomean of the real programs"].holds is False
    markdown = real_apps.ratio_table(["perl", "git"], names, table, "mean_pss", "glibc")
    assert "| perl | 0.0 | 1.00 | 0.85 (0.80–0.90) |" in markdown


def test_generated_inputs_are_deterministic(tmp_path):
    programs.write_sql(tmp_path / "a.sql", 1)
    programs.write_sql(tmp_path / "b.sql", 1)
    assert (tmp_path / "a.sql").read_bytes() == (tmp_path / "b.sql").read_bytes()
    assert programs.fast_import_stream(1) == programs.fast_import_stream(1)
    assert programs.fast_import_stream(1).count(b"\ncommit refs/heads/main") == programs.GIT_COMMITS_PER_SCALE - 1
