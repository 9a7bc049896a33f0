"""`meshalloc bench ruby-strings` in smoke mode: a 4 MiB budget, a second or so per run. Checks
that every output exists and is well formed, that each run's printed result matched the
parameters, and that the claims are there, unchecked. Also the workload arithmetic and the
claims' verdicts on made-up runs, which need no Ruby at all."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from bench_support import ROOT, assert_figure, assert_registered, build_directory, read_tsv, run_smoke
from conftest import run_meshalloc

from meshalloc_cli import paths
from meshalloc_cli.allocators import Allocator
from meshalloc_cli.bench import framework, ruby_strings
from meshalloc_cli.compare import Comparison, RunRecord
from meshalloc_cli.measure import MIB, MetricSummary
from meshalloc_cli.output import SAMPLE_COLUMNS

SCRIPT = ROOT / ruby_strings.SCRIPT


def need_ruby() -> str:
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.skip("ruby is not installed (scripts/setup.sh installs it)")
    return ruby


def cli_has_bench() -> bool:
    try:
        from meshalloc_cli.bench import runner  # noqa: F401
    except ImportError:
        return False
    return run_meshalloc("bench", "--help").returncode == 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run: (the experiment's directory, outcome.json's contents or the Outcome)."""
    need_ruby()
    build = build_directory()
    if not (build / paths.GLIBC_SHIM_LIBRARY).is_file() and not (build / paths.MESHALLOC_LIBRARY).is_file():
        pytest.skip("nothing built (`make release`)")
    out = tmp_path_factory.mktemp("bench")
    if cli_has_bench():
        directory = run_smoke("ruby-strings", out)
        outcome = json.loads((directory / "outcome.json").read_text())
        assert outcome["status"] == "ran", outcome
        assert (out / "SUMMARY.md").is_file()
        return directory, outcome
    context = framework.Context(mode=framework.SMOKE, out=out, root=ROOT, build_dir=build, repeat=None,
                                log=lambda line: print(line, file=sys.stderr))
    result = ruby_strings.EXPERIMENT.run(context)
    return out, {"repetitions": result.repetitions, "failures": result.failures, "table_md": result.table_md,
                 "files": [str(path.relative_to(out)) for path in result.files],
                 "claims": [vars(claim) for claim in result.claims]}


def test_experiment_is_registered():
    assert_registered(ruby_strings, "ruby-strings")
    assert "6.3" in ruby_strings.EXPERIMENT.paper


def test_smoke_outcome(smoke):
    directory, outcome = smoke
    assert outcome["repetitions"] == 1
    assert outcome["failures"] == []
    assert "| allocator |" in outcome["table_md"] and "(baseline)" in outcome["table_md"]
    assert "| work s |" in outcome["table_md"]
    for name in outcome["files"]:
        assert (directory / name).exists(), name  # the runs' directory (logs) too
    claims = outcome["claims"]
    assert len(claims) >= 5
    for claim in claims:
        assert claim["claim"] and claim["paper"]
        assert claim["holds"] is None  # smoke: nothing is judged on a 4 MiB run


def test_smoke_tables(smoke):
    directory, _ = smoke
    header, samples = read_tsv(directory / "samples.tsv")
    assert header == ["allocator", "repetition", *SAMPLE_COLUMNS]
    allocators = {row["allocator"] for row in samples}
    assert allocators and allocators <= set(ruby_strings.PAPER_CONFIGS) | {ruby_strings.MESH_DEFAULT}
    for row in samples:
        assert float(row["time_s"]) >= 0 and int(row["pss_bytes"]) > 0
    _, runs = read_tsv(directory / "runs.tsv")
    assert {row["allocator"] for row in runs} == allocators
    assert all(row["exit_code"] == "0" for row in runs)
    _, table = read_tsv(directory / "table.tsv")
    assert {row["allocator"] for row in table} == allocators
    for row in table:
        assert float(row["mean_pss_mib"]) > 0 and float(row["time_s"]) > 0


def test_smoke_workload_checked(smoke):
    directory, _ = smoke
    header, rows = read_tsv(directory / "workload.tsv")
    assert header == list(ruby_strings.WORKLOAD_COLUMNS)
    expected = ruby_strings.Workload(ruby_strings.SMOKE_BUDGET_MB, ruby_strings.PAPER_FIRST_SIZE,
                                     ruby_strings.PAPER_KEEP_EVERY, ruby_strings.SMOKE_PAUSE_MS).expected()
    assert rows
    for row in rows:
        assert row["checked"] == "1", row
        assert row["checksum"] == row["expected_checksum"]
        for key, value in expected.items():
            assert row[key] == str(value)


def test_smoke_figure(smoke):
    directory, _ = smoke
    assert_figure(directory / "memory")
    assert "## Claims" in (directory / "report.md").read_text()


# -- the workload on its own -------------------------------------------------------------------

def test_workload_plan_follows_the_paper():
    plan = ruby_strings.Workload(128.0, 512, 4, 200).rounds()
    assert plan[0] == (512, 128 * MIB // 512)
    assert [size for size, _ in plan] == [512 << k for k in range(10)]
    for (size, count), (next_size, next_count) in zip(plan, plan[1:]):
        assert next_size == 2 * size and next_count * 4 == count  # half the bytes, twice the length
    expected = ruby_strings.Workload(128.0, 512, 4, 200).expected()
    # The survivors: a quarter of a batch that halves each round, about half the budget.
    assert 64 * MIB <= expected["retained_bytes"] <= 64 * MIB + (plan[-1][0] << 1)


def test_script_prints_what_python_expects(tmp_path):
    ruby = need_ruby()
    load = ruby_strings.Workload(1.0, 256, 4, 0)
    completed = subprocess.run([ruby, str(SCRIPT), *load.arguments()], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    fields, problem = ruby_strings.check_output(completed.stdout, load)
    assert not problem and fields["ok"] == "1"
    rounds = [line for line in completed.stdout.splitlines() if line.startswith("round ")]
    assert len(rounds) == load.expected()["rounds"]


def test_check_output_catches_a_wrong_result():
    load = ruby_strings.Workload(1.0, 256, 4, 0)
    fields = " ".join(f"{key}={value}" for key, value in load.expected().items())
    assert "checksum" in ruby_strings.check_output(f"strings {fields} checksum=5 expected=6 ok=0\n", load)[1]
    assert "no `strings" in ruby_strings.check_output("nothing\n", load)[1]


# -- the claims on made-up runs ----------------------------------------------------------------

def fake_comparison(heaps_mib: dict, times_s: dict) -> Comparison:
    names = list(heaps_mib)
    comparison = Comparison(["ruby"], [Allocator(name, None, name) for name in names], names[0], 2, 0.01)
    order = 0
    for repetition in (1, 2):
        for name in names:
            order += 1
            result = SimpleNamespace(succeeded=True, wall_time=times_s[name],
                                     summary=lambda metric, mib=heaps_mib[name]: MetricSummary(mib * MIB, 0, 0))
            comparison.runs.append(RunRecord(name, repetition, order, result))
    return comparison


def test_claims_judge_the_paper_numbers():
    heaps = {"jemalloc": 236, "glibc": 236, "meshalloc:0n": 240, "meshalloc:0y": 237, "meshalloc:2y": 197,
             "meshalloc:3y": 163}
    times = {"jemalloc": 2.6, "glibc": 2.6, "meshalloc:0n": 2.6, "meshalloc:0y": 2.7, "meshalloc:2y": 2.8,
             "meshalloc:3y": 2.8}
    found = ruby_strings.claims(fake_comparison(heaps, times), "jemalloc", checked=True)
    assert all(claim.holds is True for claim in found), [c for c in found if not c.holds]
    default = [c for c in found if c.claim.startswith("not a paper configuration: meshalloc 3y")]
    assert len(default) == 1 and "0.69×" in default[0].ours
    heaps["meshalloc:2y"] = 236  # no reduction at all
    found = {c.claim: c for c in ruby_strings.claims(fake_comparison(heaps, times), "jemalloc", checked=True)}
    assert found["meshalloc 2y mean heap (PSS) vs jemalloc"].holds is False
    assert found["randomisation's value: meshalloc 2y mean heap vs 0y"].holds is False
    assert "1.00×" in found["meshalloc 2y mean heap (PSS) vs jemalloc"].ours


def test_claims_without_a_configuration_are_unchecked():
    heaps = {"jemalloc": 236, "glibc": 236}
    found = ruby_strings.claims(fake_comparison(heaps, {"jemalloc": 2.6, "glibc": 2.6}), "jemalloc", checked=True)
    meshalloc = [claim for claim in found if "meshalloc" in claim.claim]
    assert meshalloc and all(claim.holds is None and "not measured" in claim.note for claim in meshalloc)


def test_missing_ruby_skips_the_experiment(tmp_path, monkeypatch):
    monkeypatch.setattr(ruby_strings.shutil, "which", lambda name: None)
    context = framework.Context(mode=framework.SMOKE, out=tmp_path, root=ROOT, build_dir=tmp_path, repeat=None,
                                log=lambda line: None)
    with pytest.raises(framework.ExperimentUnavailable, match="ruby"):
        ruby_strings.EXPERIMENT.run(context)
