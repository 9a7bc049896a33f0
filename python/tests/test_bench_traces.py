"""`meshalloc bench traces`: registered, its claims judged from the rankings as the thesis
orders its allocators, and a smoke run (ls and tar recorded, replayed under glibc and meshalloc)
that writes the rankings, the per-trace analyses and the claims."""

from __future__ import annotations

import json

from bench_support import assert_registered, read_tsv, require_built, run_smoke

from meshalloc_cli import paths
from meshalloc_cli.bench import traces


def test_experiment_is_registered():
    assert_registered(traces, "traces")


def _ranked(space, speed):
    """Tables as trace_analyze.rankings returns them: allocators in penalty (c) order."""
    return {"space": {name: {} for name in space}, "speed": {name: {} for name in speed}}


def test_claims_follow_the_thesis_order():
    shares = [("ls", 90.0, 10), ("tar", 40.0, 10), ("git", 70.0, 10)]
    found = traces.Traces.claims(_ranked(["meshalloc", "glibc", "tcmalloc", "jemalloc"],
                                         ["jemalloc", "glibc", "tcmalloc"]), shares)
    by_claim = {claim.claim.split(" (")[0]: claim for claim in found}
    assert by_claim["short-lived blocks dominate"].holds is True  # median 70 %
    memory, speed = found[1], found[2]
    assert memory.holds is True and "best of all: meshalloc" in memory.ours
    assert speed.holds is False and speed.ours.startswith("jemalloc < glibc < tcmalloc")
    missing = traces.Traces.claims(_ranked(["glibc", "jemalloc"], ["glibc", "jemalloc"]), shares)
    assert missing[1].holds is None  # tcmalloc did not run: cannot be judged


def test_smoke_run(tmp_path):
    require_built(paths.TRACE_RECORDER_LIBRARY, paths.TRACE_REPLAYER, paths.TRACE_REPLAY_PREPARE,
                  paths.MESHALLOC_LIBRARY, paths.GLIBC_SHIM_LIBRARY)
    directory = run_smoke("traces", tmp_path / "results")
    outcome = json.loads((directory / "outcome.json").read_text())
    assert outcome["status"] == "ran", outcome.get("reason")
    assert outcome["failures"] == []
    _, rows = read_tsv(directory / "rankings.tsv")
    # Speed always; space only when every run lasted long enough for a PSS sample (a few ms).
    assert sorted(row["allocator"] for row in rows if row["table"] == "speed") == ["glibc", "meshalloc"]
    assert sorted(row["allocator"] for row in rows if row["table"] == "space") in ([], ["glibc", "meshalloc"])
    for name in ("ls", "tar"):
        _, lifetimes = read_tsv(directory / name / "analysis" / "lifetimes.tsv")
        assert sum(int(row["blocks"]) for row in lifetimes if row["measure"] == "ops" and row["panel"] == "all") > 0
        assert (directory / name / "replay" / "op-times.tsv").is_file()
    assert "short-lived" in (directory / "table.md").read_text()
