"""The demo's fragmentation workload (tools/workloads/fragmentation.c) and `make demo`'s
script.

The workload checks every object's contents before freeing it, so running it under each
allocator is also a data-integrity test of that allocator under a fragmenting pattern.
These runs are scaled down (a few MiB per phase, short holds); the demo runs the defaults.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import (COMMAND_TIMEOUT_S, compile_helper, meshalloc_library, run_meshalloc, stderr_lines,
                      system_library)

from meshalloc_cli import paths

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tools" / "workloads" / "fragmentation.c"
BUILT = Path("tools") / "workloads" / "fragmentation"
DEMO = ROOT / "scripts" / "demo.sh"
SMALL = ["--phases", "5", "--phase-mib", "4", "--hold-ms", "20", "--final-hold-ms", "20"]
PHASE_MIB = 4
LIVE_LINE = re.compile(r"^live: (\d+) objects, (\d+) bytes", re.MULTILINE)
PHASE_LINE = re.compile(r"^phase \d+: .* freed (\d+)%", re.MULTILINE)
EXIT_USAGE = 2


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    """The workload `make release` built, else one compiled here from the same source."""
    build = paths.build_directory()
    if build and (build / BUILT).is_file():
        return build / BUILT
    return compile_helper(SOURCE, tmp_path_factory.mktemp("workload") / "fragmentation", ["-O2"])


def _allocator_names():
    names = ["system", "glibc", "jemalloc", "mimalloc", "tcmalloc"]
    if meshalloc_library() is not None:
        names += ["meshalloc", "meshalloc:0n", "meshalloc:2y"]
    return names


def test_workload_is_deterministic_and_reports_live_bytes(workload):
    first = subprocess.run([str(workload), *SMALL], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    second = subprocess.run([str(workload), *SMALL], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout  # same seed, same objects
    frees = [int(percent) for percent in PHASE_LINE.findall(first.stdout)]
    assert len(frees) == 5 and all(75 <= percent <= 90 for percent in frees)
    objects, live = map(int, LIVE_LINE.search(first.stdout).groups())
    # Each phase keeps 10-25 % of its PHASE_MIB (with some slack for the random draw).
    assert 0.05 * 5 * (PHASE_MIB << 20) < live < 0.30 * 5 * (PHASE_MIB << 20)
    assert objects > 0
    other_seed = subprocess.run([str(workload), *SMALL, "--seed", "7"], capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT_S)
    assert other_seed.returncode == 0 and other_seed.stdout != first.stdout


@pytest.mark.skipif(meshalloc_library() is None, reason="build/release/src/libmeshalloc.so is not built")
def test_kept_survivors_are_meshallocs_live_bytes_at_exit(workload, tmp_path):
    """--keep leaves the survivors allocated at exit, where meshalloc's breakdown finds them:
    at their size classes' sizes, so at least what the program holds and at most a quarter
    more (classes are at most 25 % apart, docs/heap.md)."""
    completed = run_meshalloc("run", "--no-figure", "--no-cgroup", "-a", "meshalloc", "--out", str(tmp_path), "--",
                              str(workload), *SMALL, "--keep")
    assert completed.returncode == 0, completed.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    log = (tmp_path / "summary.json").read_text()
    live_bytes = summary["breakdown"]["components"]["small_live"]
    objects, held = map(int, LIVE_LINE.search(completed.stdout).groups())
    assert held <= live_bytes <= held * 1.25 + (1 << 20), log


@pytest.mark.skipif(meshalloc_library() is None, reason="build/release/src/libmeshalloc.so is not built")
def test_mass_frees_bring_the_mesh_pass_forward(workload, tmp_path):
    """A phase that frees most of what it allocated and goes idle is meshed when the frees stop
    (MeshPolicy::onSpanFreedInto), not at the mesh thread's next tick: with a 10 s period, the
    timer alone would not run a pass before the program exits 1 s later (it did not, before)."""
    stats_file = tmp_path / "stats.json"
    env = dict(os.environ, LD_PRELOAD=str(meshalloc_library()), MESHALLOC_MESH_PERIOD_MS="10000",
               MESHALLOC_MESH_THREAD_NICE="0", MESHALLOC_STATS="json", MESHALLOC_STATS_FILE=str(stats_file))
    completed = subprocess.run([str(workload), "--phases", "1", "--phase-mib", "16", "--hold-ms", "0",
                                "--final-hold-ms", "1000", "--keep"], capture_output=True, text=True, env=env,
                               timeout=COMMAND_TIMEOUT_S)
    assert completed.returncode == 0, completed.stderr
    stats = json.loads(stats_file.read_text())["stats"]
    # A pass still in progress at exit has meshed already: mesh_count, not mesh_passes.
    assert stats["mesh_count"] > 0, stats


@pytest.mark.parametrize("args", [["--phases", "0"], ["--free-min", "95", "--free-max", "80"], ["--bogus", "1"],
                                  ["--phase-mib"], ["--hold-ms", "-1"]])
def test_workload_rejects_bad_options(workload, args):
    completed = subprocess.run([str(workload), *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert completed.returncode == EXIT_USAGE
    assert completed.stderr.startswith("fragmentation: ")
    assert completed.stdout == ""


@pytest.mark.parametrize("allocator", _allocator_names())
def test_workload_keeps_its_data_under_every_allocator(allocator, workload, build_dir_with_shim, tmp_path):
    """Run through `meshalloc run`, as the demo does: exit 0 means every object still held
    its pattern when it was checked."""
    if allocator in ("jemalloc", "mimalloc", "tcmalloc"):
        system_library(allocator)  # skips when not installed
    completed = run_meshalloc("run", "--no-figure", "--no-cgroup", "-a", allocator, "--out", str(tmp_path),
                              "--", str(workload), *SMALL, env={"MESHALLOC_BUILD_DIR": str(build_dir_with_shim)}
                              if allocator == "glibc" else None)
    assert completed.returncode == 0, completed.stderr
    assert "CORRUPTION" not in completed.stderr
    assert LIVE_LINE.search(completed.stdout)


@pytest.mark.skipif(not os.access(DEMO, os.X_OK), reason="scripts/demo.sh is missing")
def test_demo_script_compares_what_is_present(tmp_path):
    build = paths.build_directory()
    if not (build and (build / BUILT).is_file() and (build / paths.GLIBC_SHIM_LIBRARY).is_file()):
        pytest.skip("the demo needs `make release` (the workload and the glibc shim)")
    out = tmp_path / "demo"
    env = dict(os.environ, DEMO_REPEAT="1", DEMO_OUT=str(out), DEMO_ALLOCATORS="glibc,nosuchalloc",
               DEMO_WORKLOAD_ARGS=" ".join(SMALL))
    completed = subprocess.run([str(DEMO)], capture_output=True, text=True, env=env, cwd=ROOT,
                               timeout=COMMAND_TIMEOUT_S)
    assert completed.returncode == 0, completed.stderr
    # A missing allocator is skipped with its reason, not fatal.
    assert any("skipping nosuchalloc" in line for line in stderr_lines(completed))
    assert "glibc (baseline)" in completed.stdout
    assert f"figure: {out / 'memory.png'}" in completed.stdout
    assert "live data at its end" in completed.stdout
    with open(out / "runs.tsv", newline="") as handle:
        runs = list(csv.DictReader(handle, delimiter="\t"))
    assert [(row["allocator"], row["exit_code"]) for row in runs] == [("glibc", "0")]
