"""Allocator specs (allocators.resolve): every form --allocator, --allocators and --baseline
take, each error as one line, and the options reaching the library; then one experiment run
end to end on a list of all three forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_support import read_tsv, require_built
from conftest import meshalloc_library, run_meshalloc, stderr_lines

from meshalloc_cli import allocators, paths
from meshalloc_cli.allocators import Allocator
from meshalloc_cli.errors import EXIT_USAGE, MeshallocError

pytestmark = pytest.mark.skipif(meshalloc_library() is None,
                                reason="build/release/src/libmeshalloc.so is not built (run `make release`)")

BUDGET = "mesh_budget_permille"


def test_a_configuration_with_overrides_sets_each_option_through_its_variable():
    allocator = allocators.resolve(f"meshalloc:3Y+{BUDGET}=200+Decay_ms=5")
    assert allocator.name == f"meshalloc:3y+{BUDGET}=200+decay_ms=5"
    assert allocator.library == meshalloc_library()
    assert allocator.set_env == {"MESHALLOC_CONFIG": "3y", "MESHALLOC_MESH_BUDGET_PERMILLE": "200",
                                 "MESHALLOC_DECAY_MS": "5"}
    shown = allocators.shown_options(allocator)
    assert (shown["mesh"], shown["randomize"], shown[BUDGET], shown["decay_ms"]) == ("true", "3", "200", "5")


def test_option_names_are_the_librarys_own():
    names = allocators.library_options(meshalloc_library())
    assert BUDGET in names and "mesh" in names and "show_options" in names


def test_a_path_is_preloaded_as_it_is_and_may_take_options_when_it_is_meshalloc(tmp_path):
    library = meshalloc_library()
    plain = allocators.resolve(str(library))
    assert plain.name == str(library) and plain.library == library.resolve() and not plain.set_env
    tuned = allocators.resolve(f"{library}+{BUDGET}=300")
    assert allocators.shown_options(tuned)[BUDGET] == "300"


def test_a_name_resolves_as_before():
    assert allocators.resolve("system").library is None
    assert allocators.resolve("meshalloc:0n").set_env == {"MESHALLOC_CONFIG": "0n"}


@pytest.mark.parametrize("spec, message", [
    ("nosuchalloc", "unknown allocator 'nosuchalloc'"),
    ("/no/such/libfoo.so", "allocator library not found: /no/such/libfoo.so"),
    ("meshalloc:3y+no_such_option=1", "unknown meshalloc option 'no_such_option'"),
    ("meshalloc:3y+mesh=maybe", "MESHALLOC_MESH=maybe"),
    (f"meshalloc:3y+{BUDGET}", f"expected +option=value in 'meshalloc:3y+{BUDGET}'"),
    ("system+mesh=0", "only meshalloc takes +option=value"),
    ("meshalloc:4y+mesh=0", "unknown meshalloc configuration '4y'"),
])
def test_each_bad_spec_says_what_is_wrong(spec, message):
    with pytest.raises(MeshallocError) as error:
        allocators.resolve(spec)
    assert message in str(error.value)


def test_options_on_a_library_that_is_not_meshalloc_are_refused(build_dir_with_shim):
    shim = build_dir_with_shim / paths.GLIBC_SHIM_LIBRARY
    with pytest.raises(MeshallocError, match="not a meshalloc build"):
        allocators.resolve(f"{shim}+mesh=0")


def test_a_configuration_the_environment_contradicts_is_reported(monkeypatch):
    monkeypatch.setenv("MESHALLOC_MESH", "1")  # wins over MESHALLOC_CONFIG in the library
    monkeypatch.setenv("MESHALLOC_MESH_BUDGET_PERMILLE", "30")
    assert allocators.configuration_problem(allocators.resolve(f"meshalloc:0n+{BUDGET}=40")) is None
    library = meshalloc_library()
    leaky = Allocator("meshalloc:0n", library, "", set_env={"MESHALLOC_CONFIG": "0n"})
    assert allocators.configuration_problem(leaky) == "meshalloc:0n runs with mesh=true (not false)"


@pytest.mark.parametrize("args, message", [
    (["bench", "--smoke", "speed", "--allocators", "glibc,nosuchalloc"], "unknown allocator 'nosuchalloc'"),
    (["bench", "--smoke", "--allocators", "meshalloc:3y+no_such_option=1"], "unknown meshalloc option"),
    (["bench", "--smoke", "--allocators", "/no/such/libfoo.so"], "not found"),
    (["bench", "--smoke", "--allocators", "meshalloc:0n", "--baseline", "system"], "baseline 'system'"),
    (["bench", "--smoke", "--baseline", "meshalloc:3y+mesh=maybe"], "MESHALLOC_MESH=maybe"),
    (["compare", "--allocators", "system,meshalloc:3y+mesh=maybe", "--", "true"], "MESHALLOC_MESH=maybe"),
])
def test_the_commands_refuse_a_bad_spec_in_one_line_before_running_anything(args, message, tmp_path):
    completed = run_meshalloc(*args, "--out", str(tmp_path / "out")) if args[0] == "bench" else run_meshalloc(*args)
    assert completed.returncode == EXIT_USAGE
    lines = stderr_lines(completed)
    assert len(lines) == 1 and message in lines[0], completed.stderr
    assert not (tmp_path / "out").exists()


def test_an_experiment_runs_any_list_of_specs(tmp_path):
    """`meshalloc bench speed --allocators glibc,meshalloc:3y+...,PATH`: the tables have these
    three columns, and the overrides reached the processes (the library's statistics at exit
    list the options it ran with)."""
    require_built(Path("bench") / "churn", paths.GLIBC_SHIM_LIBRARY)
    library = str(meshalloc_library())
    tuned = f"meshalloc:3y+{BUDGET}=250+stats=json"
    specs = ["glibc", tuned, library]
    completed = run_meshalloc("bench", "--smoke", "speed", "--out", str(tmp_path), "--allocators", ",".join(specs),
                              "--baseline", "glibc", env={"SPEED_WORKLOADS": "churn"})
    assert completed.returncode == 0, completed.stderr
    out = tmp_path / "speed"
    lines = (out / "table.md").read_text().splitlines()
    assert f"| workload | kind | glibc | {tuned} | {library} |" in lines  # seconds
    assert f"| workload | kind | glibc s | {tuned} × | {library} × |" in lines  # ratios to --baseline
    _, cells = read_tsv(out / "table.tsv")
    assert [cell["allocator"] for cell in cells] == specs
    assert all(cell["succeeded"] == "1" for cell in cells)
    _, memory = read_tsv(out / "memory-runs.tsv")
    stderr = {run["allocator"]: (out / run["samples_tsv"]).parent.joinpath("stderr.txt").read_text()
              for run in memory}
    report = json.loads(stderr[tuned][stderr[tuned].index("{"):])
    assert report["options"][BUDGET] == 250 and report["options"]["randomize"] == 3
    assert "{" not in stderr[library]  # the plain path runs the library's defaults: no statistics


def test_a_name_an_experiment_builds_itself_passes_only_for_that_experiment():
    from meshalloc_cli.bench import runner

    runner.check_allocators(["redis-lru"], ["jemalloc+activedefrag", "meshalloc:0n"])
    runner.check_allocators([], ["jemalloc+activedefrag"])  # a run of everything includes redis-lru
    with pytest.raises(MeshallocError, match="only meshalloc takes"):
        runner.check_allocators(["speed"], ["jemalloc+activedefrag"])


def _context(tmp_path, **overrides):
    from meshalloc_cli.bench import framework

    fields = dict(mode=framework.SMOKE, out=tmp_path, root=Path(__file__).resolve().parents[2],
                  build_dir=meshalloc_library().parents[1], repeat=None, log=lambda line: None)
    return framework.Context(**{**fields, **overrides})


def test_experiments_choose_the_users_list_and_baseline(tmp_path, monkeypatch):
    from meshalloc_cli.bench import common
    from meshalloc_cli.bench.framework import ExperimentUnavailable

    chosen = common.choose_allocators(_context(tmp_path, allocators=("system",), baseline="meshalloc:0n"),
                                      ["nosuchalloc"], baselines=("system",))
    assert chosen.names == ["meshalloc:0n", "system"] and chosen.baseline == "meshalloc:0n"
    assert chosen.allocators[0].library == tmp_path / "libmeshalloc.so"  # the experiment's private copy
    unused = common.choose_allocators(_context(tmp_path, baseline="system"), ["meshalloc:0n"])
    assert unused.names == ["meshalloc:0n"] and unused.baseline is None
    assert "--baseline system does not apply" in unused.notes()[0]
    own = common.choose_allocators(_context(tmp_path), ["nosuchalloc", "system"], baselines=("meshalloc:0n",))
    assert own.names == ["system"] and own.baseline is None
    assert own.notes("meshalloc:0n")[0].startswith("Skipped allocator nosuchalloc: unknown allocator")
    monkeypatch.setenv("SOME_ALLOCATORS", "system nosuchalloc")
    with pytest.raises(ExperimentUnavailable, match="SOME_ALLOCATORS: unknown allocator 'nosuchalloc'"):
        common.choose_allocators(_context(tmp_path), ["system"], alias="SOME_ALLOCATORS")
