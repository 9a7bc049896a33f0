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
    found = traces.Traces.thesis_claims(_ranked(["meshalloc", "glibc", "tcmalloc", "jemalloc"],
                                         ["jemalloc", "glibc", "tcmalloc"]), shares)
    by_claim = {claim.claim.split(" (")[0]: claim for claim in found}
    assert by_claim["short-lived blocks dominate"].holds is True  # median 70 %
    memory, speed = found[1], found[2]
    assert memory.holds is True and "best of all: meshalloc" in memory.ours
    assert speed.holds is False and speed.ours.startswith("jemalloc < glibc < tcmalloc")
    missing = traces.Traces.thesis_claims(_ranked(["glibc", "jemalloc"], ["glibc", "jemalloc"]), shares)
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


def _fidelity(live, replayed, own_mib, spread=0.0, unjudged_because=""):
    """A Fidelity from MiB figures: live {name: (mean, peak)}, replayed likewise (one replay
    holding every allocator's runs); every replay run reports `own_mib` of the replayer's own
    tables."""
    from types import SimpleNamespace

    from meshalloc_cli.bench.stats import Stat
    from meshalloc_cli.trace_replay import RunTimes

    def stat(mib, spread=0.0):
        if mib is None:
            return None
        return Stat(mib * (1 << 20), (mib - spread) * (1 << 20), (mib + spread) * (1 << 20))

    rows = [SimpleNamespace(allocator=name, mean_pss=stat(mean), peak_pss=stat(peak))
            for name, (mean, peak) in replayed.items()]
    times = {(name, 1): RunTimes(0, 0, 0, 0, int(own_mib * (1 << 20)), {}) for name in replayed}
    replay = SimpleNamespace(comparison=SimpleNamespace(rows=rows), times=times)
    return traces.Fidelity("w", {name: (stat(mean, spread), stat(peak, spread))
                                 for name, (mean, peak) in live.items()}, {name: replay for name in replayed},
                           unjudged_because=unjudged_because)


def test_fidelity_is_judged_without_the_replayers_own_tables():
    from types import SimpleNamespace
    allocators = [SimpleNamespace(name="glibc"), SimpleNamespace(name="meshalloc")]
    live = {"glibc": (100.0, 150.0), "meshalloc": (80.0, 140.0)}
    # 10 MiB of the replayer's own: +12.5 % raw on meshalloc's mean, +0 % without.
    close = _fidelity(live, {"glibc": (112.0, 160.0), "meshalloc": (90.0, 152.0)}, 10.0)
    within, ranking = traces.judge([close], allocators, 3)[0]
    assert within.holds is True and "12.5 % with them" in within.ours
    assert ranking.holds is True
    # The same replay without the own tables to take out: 12 % off.
    assert traces.judge([_fidelity(live, {"glibc": (112.0, 160.0), "meshalloc": (90.0, 152.0)}, 0.0)],
                        allocators, 3)[0][0].holds is False
    # Ranked the other way on the mean: within 10 % each, but not the same ranking.
    swapped = _fidelity({"glibc": (85.0, 150.0), "meshalloc": (80.0, 140.0)},
                        {"glibc": (88.0, 150.0), "meshalloc": (89.0, 140.0)}, 0.0)
    assert traces.judge([swapped], allocators, 3)[0][1].holds is False
    # The same, but the live runs' ranges overlap (±3 MiB around 85 and 80): no order to keep.
    tied = _fidelity({"glibc": (85.0, 150.0), "meshalloc": (80.0, 140.0)},
                     {"glibc": (88.0, 150.0), "meshalloc": (89.0, 140.0)}, 0.0, spread=3.0)
    ranking = traces.judge([tied], allocators, 3)[0][1]
    assert ranking.holds is True and "1 pairs are within" in ranking.ours, ranking.ours
    # A missing live figure leaves both unjudged.
    missing = _fidelity({"glibc": (100.0, 150.0), "meshalloc": (None, 140.0)},
                        {"glibc": (100.0, 150.0), "meshalloc": (80.0, 140.0)}, 0.0)
    assert [claim.holds for claim in traces.judge([missing], allocators, 3)[0]] == [None, None]


def _samples(points):
    from meshalloc_cli.measure import Sample
    return [Sample(time, int(mib * (1 << 20)), 0, 0, None, None, 1) for time, mib in points]


def test_the_redis_peak_splits_into_plateau_and_rise():
    # Phase 2 starts at 10 s: the plateau is the mean of the samples of the 2 s before it
    # (100 and 104 MiB), not the earlier ramp (50 MiB at 7.5 s) nor phase 2 itself.
    samples = _samples([(7.5, 50.0), (8.5, 100.0), (9.5, 104.0), (10.5, 160.0), (12.0, 120.0)])
    plateau, rise = traces.plateau_and_growth(samples, 10.0)
    assert (plateau / (1 << 20), rise / (1 << 20)) == (102.0, 58.0)
    assert traces.plateau_and_growth(samples, 2.0) is None  # no sample in the window


def test_the_redis_peak_table_compares_live_and_replay(tmp_path):
    from types import SimpleNamespace
    from meshalloc_cli.bench.redis_support import Run
    from meshalloc_cli.trace_replay import RunTimes

    def run(name, start, phase1, keys, points):
        made = Run(SimpleNamespace(name=name), 1, 1, tmp_path)
        made.client = {"phase1_s": str(phase1), "errors": "0"}
        made.client_start_s, made.info = start, {"db0": f"keys={keys},expires=0"}
        made.result = SimpleNamespace(samples=_samples(points), succeeded=True, summary=lambda metric: None)
        return made

    # Recorded: phase 2 at 0.5 + 9.5 = 10 s; live: at 1 + 9.5 = 10.5 s (its plateau window takes in
    # the sample at 10.2 s), with 4 % fewer keys.
    recording = run("recorded", 0.5, 9.5, 100_000, [])
    live = [run("meshalloc", 1.0, 9.5, 96_000, [(9.0, 100.0), (10.2, 104.0), (11.0, 150.0)])]
    replay_run = SimpleNamespace(allocator="meshalloc", repetition=1,
                                 result=SimpleNamespace(samples=_samples([(9.0, 110.0), (9.9, 110.0), (11.0, 160.0)]),
                                                        succeeded=True))
    replayed = SimpleNamespace(comparison=SimpleNamespace(allocators=[SimpleNamespace(name="meshalloc")],
                                                          runs=[replay_run]),
                               times={("meshalloc", 1): RunTimes(0, 0, 0, 0, 10 << 20, {})})
    table = traces.redis_peak_table({"meshalloc": recording}, live, {"meshalloc": replayed}, "t")
    row = next(line for line in table.splitlines() if line.startswith("| meshalloc"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells == ["meshalloc", "102.0 (102.0–102.0)", "110.0 (110.0–110.0)", "48.0 (48.0–48.0)",
                     "50.0 (50.0–50.0)", "10.0", "96,000 (-4.0 %)", "100,000 (recorded)"], cells
    # Why the single trace cannot rank Redis's allocators: the live servers' key counts against it.
    assert "meshalloc -4.0 % keys against the recorded trace's 100,000" in traces.key_shift(recording, live)


def test_the_redis_replay_takes_the_live_runs_pace(tmp_path):
    from types import SimpleNamespace
    from meshalloc_cli.bench.redis_support import Run

    def run(start, phase1, phase2, served=True):
        made = Run(SimpleNamespace(name="x"), 1, 1, tmp_path)
        made.client = {"phase1_s": str(phase1), "phase2_s": str(phase2), "errors": "0" if served else "3"}
        made.client_start_s = start
        made.result = SimpleNamespace(succeeded=True)
        return made

    # Recorded: a slow second phase (5 s); live: 2, 3 and 4 s (median 3), and a failed run.
    recording = run(0.5, 10.0, 5.0)
    live = [run(1.0, 10.0, 2.0), run(0.6, 10.2, 3.0), run(0.8, 10.0, 4.0), run(0.1, 1.0, 1.0, served=False)]
    warp = traces.live_pace_warp(recording, live)
    assert [(a, round(b, 6)) for a, b in warp] == [(0.5, 0.8), (10.5, 10.8), (15.5, 13.8)]
    assert traces.live_pace_warp(recording, [live[3]]) == []  # no live run served: the recorded pace
    recording.client = {}
    assert traces.live_pace_warp(recording, live) == []


def test_an_allocator_adaptive_workload_replays_each_allocators_own_trace():
    names = ["glibc", "jemalloc", "meshalloc"]
    # Redis LRU evicts by malloc_usable_size: each allocator's fidelity replay runs its own recording.
    assert traces.trace_owners(traces.REDIS_FIDELITY, names) == {name: name for name in names}
    # The fragmentation workload does not adapt: every allocator replays the one glibc recording.
    assert traces.trace_owners(traces.FIDELITY, names) == {name: "glibc" for name in names}


def test_replay_owned_replays_each_trace_under_its_owners(tmp_path, monkeypatch):
    from types import SimpleNamespace

    calls = []

    def fake_replay(trace, allocators, out, repetitions, timing, warp):
        calls.append((trace, [allocator.name for allocator in allocators], out.name, tuple(warp)))
        return SimpleNamespace(comparison=SimpleNamespace(allocators=allocators))

    monkeypatch.setattr(traces.trace_replay, "replay", fake_replay)
    monkeypatch.setattr(traces.trace_replay, "write_results", lambda replayed, out: None)
    allocators = [SimpleNamespace(name=name) for name in ("glibc", "jemalloc", "meshalloc")]
    names = [allocator.name for allocator in allocators]
    paths = {name: tmp_path / f"{name}.trace" for name in names}
    warps = {"jemalloc": [(1.0, 2.0)]}
    owned = traces.replay_owned(paths, traces.trace_owners(traces.REDIS_FIDELITY, names), allocators, tmp_path, 2,
                                warps)
    assert calls == [(paths[name], [name], f"replay-{name}", tuple(warps.get(name, []))) for name in names]
    assert {name: replayed.comparison.allocators[0].name for name, replayed in owned.items()} == \
        {name: name for name in names}
    calls.clear()
    single = traces.replay_owned(paths, traces.trace_owners(traces.FIDELITY, names), allocators, tmp_path, 2, warps)
    assert calls == [(paths["glibc"], names, "replay", ())]
    assert len({id(replayed) for replayed in single.values()}) == 1 and sorted(single) == names


def test_the_single_trace_ranking_is_shown_not_judged():
    from types import SimpleNamespace
    allocators = [SimpleNamespace(name="glibc"), SimpleNamespace(name="jemalloc"), SimpleNamespace(name="meshalloc")]
    live = {"glibc": (105.0, 172.0), "jemalloc": (100.0, 171.0), "meshalloc": (95.0, 155.0)}
    # Each allocator's own trace: the live order kept, every figure within 10 %.
    own = _fidelity(live, {"glibc": (107.0, 175.0), "jemalloc": (101.0, 173.0), "meshalloc": (96.0, 158.0)}, 0.0)
    # The one glibc trace: glibc's key count under every allocator, glibc and jemalloc swap on the mean.
    single = {"glibc": (103.0, 175.0), "jemalloc": (104.0, 174.0), "meshalloc": (96.0, 158.0)}
    claims, table = traces.judge([own, _fidelity(live, single, 0.0, unjudged_because="keys differ")], allocators, 3)
    assert [claim.holds for claim in claims] == [True, True, None]
    assert claims[2].note == "keys differ"
    assert "5 of the 6 pairs" in claims[2].ours and "not kept: jemalloc < glibc (mean)" in claims[2].ours, \
        claims[2].ours
    assert table.count("| w |") == 6  # both replays' rows in the table
    # The same swap in a judged replay fails the ranking claim and names the pair.
    ranking = traces.judge([_fidelity(live, single, 0.0)], allocators, 3)[0][1]
    assert ranking.holds is False and "jemalloc < glibc (mean)" in ranking.ours
