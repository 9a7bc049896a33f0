"""`meshalloc bench redis-lru` in smoke mode: a few thousand keys, about a second per server,
on whatever Redis there is (the source builds if cached, else Debian's redis-server). Checks
that every output exists and is well formed and that the claims are there, unchecked. Also the
claims' arithmetic on made-up numbers, which needs no Redis at all."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from bench_support import (ROOT, assert_figure, assert_ran_once, assert_registered, read_tsv,
                           require_redis_and_client_compiler, run_smoke)

from meshalloc_cli.bench import framework, redis_lru, redis_support
from meshalloc_cli.bench.stats import Stat
from meshalloc_cli.errors import MeshallocError
from meshalloc_cli.measure import MIB
from meshalloc_cli.output import SAMPLE_COLUMNS


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One `meshalloc bench --smoke redis-lru`: its experiment directory and outcome.json."""
    require_redis_and_client_compiler()
    work = tmp_path_factory.mktemp("work")
    # A relative --out, as the default results/ is: the servers run in their own directories,
    # so the experiment must not hand them paths relative to ours.
    directory = run_smoke("redis-lru", Path("bench"), cwd=work)
    assert (directory.parent / "SUMMARY.md").is_file()
    return directory, json.loads((directory / "outcome.json").read_text())


def test_experiment_is_registered():
    assert_registered(redis_lru, "redis-lru")


def test_smoke_outcome(smoke):
    out, outcome = smoke
    assert_ran_once(outcome)
    assert outcome["table_md"].startswith("| config |")
    assert "jemalloc (baseline)" in outcome["table_md"]
    assert {"runs.tsv", "table.tsv", "table.md", "memory.png", "memory.svg"} <= set(outcome["files"])
    assert all((out / path).exists() for path in outcome["files"])
    assert len(outcome["claims"]) >= 6
    for claim in outcome["claims"]:
        assert claim["claim"] and claim["paper"] and claim["ours"]
        assert claim["holds"] is None and "smoke" in claim["note"]  # smoke checks nothing


def test_smoke_tables(smoke):
    out, _ = smoke
    header, runs = read_tsv(out / "runs.tsv")
    assert header == redis_lru.RUN_TSV_HEAD + redis_lru.RUN_METRICS + redis_lru.RUN_TSV_TAIL
    assert {row["config"] for row in runs} >= {redis_lru.BASELINE}
    for row in runs:
        assert row["ok"] == "1", row["problems"]
        assert float(row["mean_pss"]) > MIB
        assert float(row["insertion_s"]) > 0
        assert int(row["keys"]) > 0 and int(row["evicted_keys"]) > 0  # the cache was full and evicting
        if row["config"].startswith("meshalloc"):
            assert row["mesh_passes"] != "" and row["mesh_pause_max_ms"] != ""  # its statistics at exit
        samples_header, samples = read_tsv(out / row["samples_tsv"])
        assert tuple(samples_header) == SAMPLE_COLUMNS and len(samples) >= 10
    header, table = read_tsv(out / "table.tsv")
    assert header[:2] == ["config", "runs_ok"]
    for column in ("mean_pss", "final_pss", "peak_pss", "peak_pte", "insertion_s", "mean_ratio"):
        assert {column, column + "_min", column + "_max"} <= set(header)
    baseline = next(row for row in table if row["config"] == redis_lru.BASELINE)
    assert float(baseline["mean_ratio"]) == 1.0
    markdown = (out / "table.md").read_text()
    assert markdown.startswith("| config | ok | mean PSS MiB |") and "longest pause ms" in markdown
    header, timing = read_tsv(out / "timing.tsv")
    assert header == redis_lru.TIMING_TSV_HEAD
    names = {row["config"] for row in runs}
    # The repetition's timed runs and one timing round, every configuration in each.
    assert {row["round"] for row in timing} == {"repetition 1", "timing round 1"}
    for key in ("repetition 1", "timing round 1"):
        mine = {row["config"]: row for row in timing if row["round"] == key}
        assert set(mine) == names and all(row["problem"] == "" for row in mine.values())
        assert float(mine[redis_lru.BASELINE]["ratio"]) == 1.0 and float(mine[redis_lru.MESHALLOC]["ratio"]) > 0
        assert float(mine[redis_lru.BASELINE]["cpu_ratio"]) == 1.0
        assert all(float(row["server_main_cpu_s"]) > 0 for row in mine.values())


def test_smoke_summary_and_figure(smoke):
    out, _ = smoke
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == "redis-lru" and summary["mode"] == "smoke" and summary["repetitions"] == 1
    assert summary["claims"] and all(claim["holds"] is None for claim in summary["claims"])
    assert_figure(out / "memory")


def test_claims_on_made_up_numbers():
    """A meshalloc that halves jemalloc's heap, inserts 5 % slower and compacts in a tenth of
    activedefrag's time holds every paper claim but the pause (no runs carry one here)."""
    def row(mean_ratio, insertion_ratio, **extra):
        cells = {"mean_ratio": Stat(mean_ratio, mean_ratio, mean_ratio),
                 "after_ratio": Stat(mean_ratio, mean_ratio, mean_ratio),
                 "insertion_ratio": Stat(insertion_ratio, insertion_ratio, insertion_ratio),
                 "insertion_s": Stat(insertion_ratio, insertion_ratio, insertion_ratio)}
        cells.update({key: Stat(value, value, value) for key, value in extra.items()})
        return cells

    table = {redis_lru.BASELINE: row(1.0, 1.0), redis_lru.ACTIVEDEFRAG: row(0.62, 1.0, defrag_s=2.0),
             redis_lru.MESHALLOC: row(0.5, 1.05, mesh_cpu_s=0.2),
             redis_lru.MESHALLOC_PAPER: row(0.64, 1.18),
             redis_lru.MESHALLOC_OFF: row(1.0, 1.0, mean_pss=100.0 * MIB),
             redis_lru.TCMALLOC: row(1.0, 1.0, mean_pss=130.0 * MIB)}
    found = {claim.claim: claim for claim in redis_lru.claims(table, [], checked=True)}
    holds = {name: claim.holds for name, claim in found.items()}
    assert holds["meshalloc 3y mean heap (PSS) vs jemalloc"] is True
    assert holds["meshalloc 3y saves as much as jemalloc + activedefrag"] is True
    assert holds["time spent compacting: meshing vs active defragmentation"] is True
    assert holds["meshalloc 3y insertion time vs jemalloc"] is True
    assert holds["meshalloc 3y longest meshing pause"] is None
    assert holds["tcmalloc's mean heap equals meshalloc with meshing off"] is False
    assert all(value is True for name, value in holds.items() if "issue 3" in name)
    assert "0.50×" in found["meshalloc 3y mean heap (PSS) vs jemalloc"].ours
    # The paper's configuration is judged on its own row.
    assert holds["meshalloc 2y (the paper's randomisation) mean heap (PSS) vs jemalloc"] is True
    assert holds["meshalloc 2y (the paper's randomisation) insertion time vs jemalloc"] is False
    assert "1.18×" in found["meshalloc 2y (the paper's randomisation) insertion time vs jemalloc"].ours


def test_insertion_ratio_is_the_median_of_paired_rounds():
    """Each round's ratio is taken within the round: a slow round (the machine busy) slows both
    configurations and leaves the ratio alone, where a quotient of medians would mix rounds."""
    base = redis_support.Config(redis_lru.BASELINE, Path("redis-server"), None)
    mesh = redis_support.Config(redis_lru.MESHALLOC, Path("redis-server"), None)
    times = [(2.0, 2.2), (3.0, 3.3), (2.0, 2.4), (4.0, None)]  # the last round's meshalloc run failed
    insertions = []
    for index, (base_s, mesh_s) in enumerate(times, 1):
        insertions.append(redis_support.Insertion(base, index, {"total_s": str(base_s)}, None))
        insertions.append(redis_support.Insertion(mesh, index, {"total_s": str(mesh_s)} if mesh_s else {},
                                                  None if mesh_s else "client exited with 2"))
    rounds = redis_lru.insertion_rounds([], insertions)
    assert len(rounds) == 4 and redis_lru.MESHALLOC not in rounds["timing round 4"]
    table = {redis_lru.BASELINE: {}, redis_lru.MESHALLOC: {}}
    redis_lru.apply_paired_insertion(table, rounds)
    ratio = table[redis_lru.MESHALLOC]["insertion_ratio"]
    assert (ratio.median, ratio.low, ratio.high) == pytest.approx((1.1, 1.1, 1.2))
    assert table[redis_lru.MESHALLOC]["insertion_s"].median == 2.4  # of 2.2, 2.4, 3.3
    assert table[redis_lru.BASELINE]["insertion_ratio"] == Stat(1.0, 1.0, 1.0)
    found = {claim.claim: claim for claim in redis_lru.claims(table, [], checked=True, rounds=rounds)}
    insertion = found["meshalloc 3y insertion time vs jemalloc"]
    assert insertion.holds is True and "3 paired rounds" in insertion.ours


def test_timing_rounds_variable_is_checked(monkeypatch, tmp_path):
    assert redis_lru.timing_round_count(framework.QUICK) == redis_lru.TIMING_ROUNDS[framework.QUICK]
    monkeypatch.setenv(redis_lru.TIMING_ROUNDS_VARIABLE, "7")
    assert redis_lru.timing_round_count(framework.QUICK) == 7
    assert redis_lru.EXPERIMENT.parameters(framework.QUICK).timing_rounds == 7
    monkeypatch.setenv(redis_lru.TIMING_ROUNDS_VARIABLE, "many")
    with pytest.raises(MeshallocError, match="REDIS_LRU_TIMING_ROUNDS"):
        redis_lru.timing_round_count(framework.QUICK)


def test_unknown_configuration_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(redis_lru.CONFIGS_VARIABLE, "jemalloc,hoard")
    context = framework.Context(mode=framework.SMOKE, out=tmp_path, root=ROOT, build_dir=tmp_path, repeat=None,
                                log=lambda line: None)
    with pytest.raises(framework.ExperimentUnavailable, match="hoard"):
        redis_lru.EXPERIMENT.run(context)


def test_a_smoke_run_is_bounded():
    """Smoke must stay a matter of seconds: a few thousand keys and a short hold."""
    assert sum(keys for keys, _ in redis_lru.SMOKE_PHASES) <= 50_000
    assert redis_lru.SMOKE_HOLD_S <= 2.0


def test_a_failed_build_makes_the_experiment_unavailable(monkeypatch, tmp_path):
    """quick/full build Redis when it is missing; a failing build is a skip with its last error."""
    script = tmp_path / redis_support.BUILD_SCRIPT
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\necho 'building...' >&2\necho 'build.sh: FAILED: no network' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv(redis_support.CACHE_VARIABLE, str(tmp_path / "cache"))
    with pytest.raises(framework.ExperimentUnavailable, match="FAILED: no network"):
        redis_support.ensure_source_build(tmp_path, log=lambda line: None)


def test_insertions_start_at_spread_phases_of_the_wall_clock_second():
    """Redis's LRU clock ticks once a wall-clock second, so where in a second the insertion
    starts decides how many first-phase keys survive: every configuration of a repetition
    starts at the same phase, and the phases of successive repetitions spread over the second."""
    phases = [redis_support.clock_phase(index) for index in range(1, 6)]
    assert phases[0] == 0.0
    assert all(0.0 <= phase < 1.0 for phase in phases)
    gaps = [b - a for a, b in zip(sorted(phases), sorted(phases)[1:])]
    assert min(gaps) > 0.1  # five phases, none closer than a tenth of a second
    assert redis_support.seconds_until_phase(100.25, 0.5) == pytest.approx(0.25)
    assert redis_support.seconds_until_phase(100.75, 0.5) == pytest.approx(0.75)
    assert redis_support.seconds_until_phase(100.5, 0.5) == pytest.approx(0.0)


def test_client_rate_paces_the_insertion(tmp_path):
    """--rate (what `bench traces` records and replays Redis with): 30,000 keys at 20,000 keys/s
    take at least 1.5 s, however fast the server answers; without it they take a fraction."""
    import subprocess
    import time

    require_redis_and_client_compiler()
    install = redis_support.any_install(ROOT)
    client = redis_support.compile_client(ROOT)
    port = redis_support.free_port()
    server = subprocess.Popen([str(install.jemalloc_server), "--port", str(port), "--save", "", "--dir", str(tmp_path),
                               "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not redis_support.port_open(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        load = redis_support.Workload(maxmemory="100mb", phases=((20_000, 100), (10_000, 200)), pipeline=256,
                                      hold_s=0, idle_after_s=0, interval_s=0.01, seed=1, rate=20_000)
        paced = subprocess.run(redis_support.client_command(client, port, load, 1), capture_output=True, text=True,
                               check=True, timeout=60)
        unpaced = subprocess.run(redis_support.client_command(client, port, replace(load, rate=0), 2),
                                 capture_output=True, text=True, check=True, timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=10)

    def seconds(completed):
        return float(dict(field.split("=") for field in completed.stdout.split()[1:])["total_s"])

    assert 1.45 <= seconds(paced) <= 10, paced.stdout
    assert seconds(unpaced) < 1.45, unpaced.stdout
