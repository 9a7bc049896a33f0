"""Configuration names reach the library: under `meshalloc:XY` the library's own
statistics (MESHALLOC_STATS=json at exit) report meshing and randomisation as named,
even when the user's environment says otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import meshalloc_library, run_meshalloc

from meshalloc_cli.allocators import PAPER_CONFIGS, Allocator

pytestmark = pytest.mark.skipif(meshalloc_library() is None,
                                reason="build/release/src/libmeshalloc.so is not built (run `make release`)")

# Deliberately the opposite of several named configurations: a named configuration must
# win over inherited variables, or `compare meshalloc:0n,meshalloc:2y` would compare
# the same thing twice.
CONTRARY_ENVIRONMENT = {"MESHALLOC_MESH": "1", "MESHALLOC_RANDOMIZE": "1", "MESHALLOC_CONFIG": "1y"}


def _library_options(allocator, tmp_path, extra_env=None):
    stats = tmp_path / f"stats-{allocator.replace(':', '-')}.json"
    env = {"MESHALLOC_STATS": "json", "MESHALLOC_STATS_FILE": str(stats), **(extra_env or {})}
    completed = run_meshalloc("run", "--no-figure", "--no-cgroup", "-a", allocator, "--out", str(tmp_path / "out"),
                              "--", "/bin/true", env=env)
    assert completed.returncode == 0, completed.stderr
    assert stats.is_file(), f"the library wrote no statistics: {completed.stderr}"
    return json.loads(stats.read_text())["options"]


@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_named_configuration_reaches_library(config, tmp_path):
    options = _library_options(f"meshalloc:{config}", tmp_path, CONTRARY_ENVIRONMENT)
    assert options["randomize"] == int(config[0])
    assert options["mesh"] is (config[1] == "y")


def test_plain_meshalloc_keeps_the_users_settings(tmp_path):
    """`meshalloc` without a configuration is the library as the user set it up."""
    options = _library_options("meshalloc", tmp_path, {"MESHALLOC_MESH": "0", "MESHALLOC_RANDOMIZE": "1"})
    assert options["mesh"] is False
    assert options["randomize"] == 1


def test_preload_path_is_absolute_whatever_the_working_directory(tmp_path):
    """ld.so resolves a relative LD_PRELOAD against the program's working directory: a run in
    another directory would silently fall back to glibc."""
    relative = Path("results") / "libmeshalloc.so"
    env = Allocator(name="meshalloc", library=relative, description="").environment({})
    assert Path(env["LD_PRELOAD"]).is_absolute()
    assert env["LD_PRELOAD"] == str(relative.resolve())
