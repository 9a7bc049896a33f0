"""`meshalloc bench`: the runner with fake experiments (claims table, failures, skips, the
summary rebuilt from what is on disk), the command line's errors, and a smoke run of the
thread-scaling experiment end to end."""

from __future__ import annotations

import json
import sys
import types

import pytest
from bench_support import PNG_SIGNATURE, assert_figure, read_tsv
from conftest import meshalloc_library, run_meshalloc, stderr_lines

from meshalloc_cli import bench, paths
from meshalloc_cli.bench import runner, thread_scaling
from meshalloc_cli.bench.framework import Claim, ExperimentUnavailable, Outcome
from meshalloc_cli.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, MeshallocError

FAKE_PACKAGE = "meshalloc_cli.bench"


class FakeExperiment:
    def __init__(self, name, behaviour):
        self.name = name
        self.title = f"Fake {name}"
        self.paper = f"Fake paper §{len(name)}"
        self.behaviour = behaviour
        self.contexts = []

    def run(self, context):
        self.contexts.append(context)
        return self.behaviour(context)


def _good(context):
    table = context.out / "table.tsv"
    table.write_text("a\tb\n1\t2\n")
    figure = context.out / "figure.png"
    figure.write_bytes(PNG_SIGNATURE)
    context.log("working")
    return Outcome(
        repetitions=context.repetitions(1, 2, 3),
        claims=[Claim("X is smaller than Y", "0.5x", "0.6x (0.55-0.65, 2 runs)", True),
                Claim("Z | W is faster", "2x", "1.1x", False),
                Claim("V scales", "linear", "—", None, note="needs 3 thread counts")],
        table_md="| a | b |\n|---|---|\n| 1 | 2 |\n",
        files=[table, figure],
        notes=["a caveat"],
    )


def _crash(context):
    raise ValueError("something broke\nin two lines")


def _unavailable(context):
    raise ExperimentUnavailable("needs a program that is not installed")


@pytest.fixture
def fakes(monkeypatch):
    """Four fake experiments in the package's namespace, in place of the real ones."""
    experiments = {"good": _good, "crash": _crash, "skip": _unavailable}
    modules = {}
    mapping = {}
    for name, behaviour in experiments.items():
        module_name = f"fake_{name}"
        module = types.ModuleType(f"{FAKE_PACKAGE}.{module_name}")
        module.EXPERIMENT = FakeExperiment(name, behaviour)
        monkeypatch.setitem(sys.modules, module.__name__, module)
        modules[name] = module.EXPERIMENT
        mapping[name] = module_name
    mapping["missing"] = "fake_module_that_does_not_exist"
    monkeypatch.setattr(bench, "EXPERIMENT_MODULES", mapping)
    return modules


def _run(tmp_path, names, mode="quick", repeat=None):
    lines = []
    report = runner.run_bench(names, mode, tmp_path, repeat=repeat, log=lines.append)
    return report, lines


def test_summary_has_machine_claims_table_and_tally(tmp_path, fakes):
    report, lines = _run(tmp_path, ["good"])
    assert report.exit_code == EXIT_OK
    outcome = json.loads((tmp_path / "good" / "outcome.json").read_text())
    assert outcome["status"] == "ran" and outcome["mode"] == "quick" and outcome["repetitions"] == 2
    assert outcome["files"] == ["table.tsv", "figure.png"]
    assert [claim["holds"] for claim in outcome["claims"]] == [True, False, None]
    assert outcome["date"] and outcome["duration_s"] >= 0
    assert (tmp_path / "good" / "log.txt").read_text() == "working\n"

    summary = (tmp_path / "SUMMARY.md").read_text()
    assert report.summary == tmp_path / "SUMMARY.md"
    for fact in ("machine:", "CPUs", "memory", "Linux", "commit:", "Fake good", "Fake paper §4", "mode: quick",
                 "repetitions: 2", "a caveat"):
        assert fact in summary, fact
    assert "| claim | paper | this machine | holds |" in summary
    assert "| X is smaller than Y | 0.5x | 0.6x (0.55-0.65, 2 runs) | ✓ |" in summary
    assert "| Z \\| W is faster | 2x | 1.1x | ✗ |" in summary  # a | inside a cell is escaped
    assert "| V scales | linear | — | — needs 3 thread counts |" in summary
    assert "![Fake good](good/figure.png)" in summary
    assert "1 claims hold, 1 do not, 1 unchecked" in summary
    assert (report.tally.hold, report.tally.do_not_hold, report.tally.unchecked) == (1, 1, 1)
    assert any("good" in line and "done" in line for line in lines)


def test_failure_is_reported_and_the_others_still_run(tmp_path, fakes):
    report, lines = _run(tmp_path, None, mode="smoke")
    statuses = {record.name: record.status for record in report.records}
    assert statuses == {"good": "ran", "crash": "failed", "skip": "skipped", "missing": "not available"}
    assert report.exit_code == EXIT_FAILURE  # because of the crash, not the skips
    error = (tmp_path / "crash" / "error.txt").read_text()
    assert "Traceback" in error and "ValueError: something broke" in error
    failed_lines = [line for line in lines if "crash" in line and "FAILED" in line]
    assert len(failed_lines) == 1 and "error.txt" in failed_lines[0]
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "**failed**: ValueError: something broke in two lines" in summary
    assert "**skipped**: needs a program that is not installed" in summary
    assert "**not available**" in summary
    assert "1 of 4 experiments ran" in summary


def test_skips_only_fail_when_named(tmp_path, fakes, monkeypatch):
    # Named on the command line, a skipped or missing experiment is an error ...
    assert _run(tmp_path, ["good", "missing"])[0].exit_code == EXIT_FAILURE
    assert _run(tmp_path, ["skip"])[0].exit_code == EXIT_FAILURE
    # ... in a run of everything it is only reported.
    without_crash = {name: module for name, module in bench.EXPERIMENT_MODULES.items() if name != "crash"}
    monkeypatch.setattr(bench, "EXPERIMENT_MODULES", without_crash)
    report, _ = _run(tmp_path, None)
    assert [(record.name, record.status) for record in report.records] == \
        [("good", "ran"), ("skip", "skipped"), ("missing", "not available")]
    assert report.exit_code == EXIT_OK


def test_summary_keeps_other_experiments_results(tmp_path, fakes):
    _run(tmp_path, ["good"])
    stale = tmp_path / "crash" / "stale.txt"
    stale.parent.mkdir()
    stale.write_text("from an earlier run")
    _run(tmp_path, ["crash"])
    assert not stale.exists()  # an experiment's directory is emptied before it runs
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "Fake good" in summary and "**failed**" in summary
    # Sections follow the run order of EXPERIMENT_MODULES, not the order of the runs.
    assert summary.index("Fake good") < summary.index("(`crash`)")


def test_repeat_and_mode_reach_the_experiment(tmp_path, fakes):
    _run(tmp_path, ["good"], mode="full", repeat=7)
    context = fakes["good"].contexts[-1]
    assert context.mode == "full" and context.repeat == 7 and context.repetitions(1, 2, 3) == 7
    assert context.out == tmp_path / "good"
    assert json.loads((tmp_path / "good" / "outcome.json").read_text())["repetitions"] == 7


def test_unknown_experiment_is_a_usage_error(tmp_path, fakes):
    with pytest.raises(MeshallocError) as caught:
        _run(tmp_path, ["good", "nosuch"])
    assert caught.value.exit_code == EXIT_USAGE
    assert not (tmp_path / "good").exists()  # nothing ran


def test_unreadable_outcome_is_listed_not_fatal(tmp_path, fakes):
    broken = tmp_path / "other" / "outcome.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    _run(tmp_path, ["good"])
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "(`other`)" in summary and "unreadable outcome.json" in summary


# ---------------------------------------------------------------------------------------------
# The command line


def test_unknown_experiment_exits_2_with_one_line(tmp_path):
    completed = run_meshalloc("bench", "--smoke", "--out", str(tmp_path), "no-such-experiment")
    assert completed.returncode == EXIT_USAGE
    lines = stderr_lines(completed)
    assert len(lines) == 1 and "unknown experiment 'no-such-experiment'" in lines[0]
    assert not any(tmp_path.iterdir())


def test_quick_and_smoke_exclude_each_other(tmp_path):
    completed = run_meshalloc("bench", "--quick", "--smoke", "--out", str(tmp_path))
    assert completed.returncode == EXIT_USAGE
    assert len(stderr_lines(completed)) == 1


def test_list_names_every_experiment():
    completed = run_meshalloc("bench", "--list")
    assert completed.returncode == EXIT_OK
    for name in bench.EXPERIMENT_MODULES:
        assert name in completed.stdout
    assert "thread-scaling" in completed.stdout and "study" in completed.stdout


# ---------------------------------------------------------------------------------------------
# The thread-scaling experiment, on tiny parameters


def test_line_fit():
    fit = thread_scaling.fit_line([1, 2, 3, 4], [3, 5, 7, 9])
    assert fit.slope == pytest.approx(2) and fit.intercept == pytest.approx(1) and fit.r2 == pytest.approx(1)
    noisy = thread_scaling.fit_line([1, 2, 3], [1, 3, 2])
    assert 0 <= noisy.r2 < 1
    assert thread_scaling.fit_line([1], [1]) is None
    assert thread_scaling.fit_line([2, 2], [1, 3]) is None


def test_result_line_is_parsed():
    fields, line = thread_scaling.parse_line("noise\nthreads=2 live_bytes=100 pss_bytes=300 ratio=3.000 "
                                             "seconds=0.5 checksum=abc\n")
    assert line.startswith("threads=2")
    assert fields["live_bytes"] == 100 and fields["pss_bytes"] == 300 and fields["seconds"] == 0.5
    assert thread_scaling.parse_line("no result here") == ({}, "")


def test_thread_scaling_smoke(tmp_path):
    build = paths.build_directory()
    if build is None or not (build / thread_scaling.BINARY).is_file() or meshalloc_library() is None:
        pytest.skip("build/release is not built (make release)")
    completed = run_meshalloc("bench", "--smoke", "thread-scaling", "--out", str(tmp_path))
    assert completed.returncode == EXIT_OK, completed.stderr
    assert "SUMMARY.md" in completed.stdout
    out = tmp_path / "thread-scaling"

    outcome = json.loads((out / "outcome.json").read_text())
    assert outcome["status"] == "ran" and outcome["mode"] == "smoke" and outcome["repetitions"] == 1
    assert not outcome["failures"], outcome["failures"]
    assert len(outcome["claims"]) >= 5
    assert all(claim["holds"] is None and claim["note"] for claim in outcome["claims"])  # smoke proves nothing
    for name in ("runs.tsv", "samples.tsv", "summary.tsv", "fits.tsv", "table.md", "pss-vs-threads.png",
                 "pss-vs-threads.svg"):
        assert name in outcome["files"] and (out / name).stat().st_size > 0, name

    _, runs = read_tsv(out / "runs.tsv")
    allocators = {row["allocator"] for row in runs}
    assert "meshalloc:3y" in allocators
    assert {int(row["threads"]) for row in runs} == {1, 2}
    assert all(row["status"] == "ok" and int(row["pss_bytes"]) > 0 and int(row["alive_pss_bytes"]) > 0
               for row in runs)
    assert len({row["live_bytes"] for row in runs if row["threads"] == "2"}) == 1  # same work for everyone
    assert read_tsv(out / "samples.tsv")[1]
    _, summary_rows = read_tsv(out / "summary.tsv")
    assert len(summary_rows) == 2 * len(allocators)
    assert all(float(row["pss_per_live"]) > 0 and float(row["alive_pss_per_live"]) > 0 for row in summary_rows)
    fits = {row["allocator"]: row for row in read_tsv(out / "fits.tsv")[1]}
    assert "live" in fits and allocators <= set(fits)

    table = (out / "table.md").read_text()
    assert "| allocator | moment | T=1 | T=2 |" in table and "slope MiB/thread" in table and "R²" in table
    assert_figure(out / "pss-vs-threads")

    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "Thread scaling" in summary and "| claim | paper | this machine | holds |" in summary
    assert f"0 claims hold, 0 do not, {len(outcome['claims'])} unchecked" in summary
