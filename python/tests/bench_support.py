"""What the `meshalloc bench` tests share: reading the experiments' TSV files and figures, and
running one experiment in smoke mode as a user would (`meshalloc bench --smoke NAME`)."""

from __future__ import annotations

import csv
import json
import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Tuple

import pytest
from conftest import run_meshalloc

from meshalloc_cli import paths
from meshalloc_cli.bench import EXPERIMENT_MODULES

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG_TAG = "{http://www.w3.org/2000/svg}svg"
ROOT = Path(__file__).resolve().parents[2]


def read_tsv(path: Path) -> Tuple[List[str], List[Dict[str, str]]]:
    """The header and the rows (as dicts) of a TSV file, which must have a header and no
    ragged row."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    assert rows, f"{path} is empty"
    for row in rows[1:]:
        assert len(row) == len(rows[0]), f"ragged row in {path}: {row}"
    return rows[0], [dict(zip(rows[0], row)) for row in rows[1:]]


def build_directory() -> Path:
    """Where `make release` builds (MESHALLOC_BUILD_DIR when set), built or not."""
    return paths.build_directory() or ROOT / paths.DEFAULT_BUILD_SUBDIR


def require_built(*files: Path) -> Path:
    """The build directory; the test is skipped unless `make release` built every one of
    FILES (paths inside it)."""
    build = build_directory()
    missing = [str(name) for name in files if not (build / name).is_file()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not built in {build} (`make release`)")
    return build


def require_redis_and_client_compiler() -> None:
    """Skips the test unless there is a redis-server (scripts/redis/build.sh's builds or
    Debian's) and a C compiler for the Redis LRU client (bench/redis/lru_client.c)."""
    from meshalloc_cli.bench import redis_support

    if redis_support.any_install(ROOT) is None:
        pytest.skip("no redis-server (neither scripts/redis/build.sh's builds nor Debian's redis-server)")
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for the client (bench/redis/lru_client.c)")


def run_smoke(experiment: str, out: Path, cwd: Optional[Path] = None) -> Path:
    """`meshalloc bench --smoke EXPERIMENT --out OUT` (OUT relative to `cwd` when given), which
    must succeed; the experiment's own directory."""
    completed = run_meshalloc("bench", "--smoke", experiment, "--out", str(out), cwd=cwd)
    assert completed.returncode == 0, completed.stderr
    return (cwd / out if cwd else out) / experiment


def assert_registered(module: ModuleType, name: str) -> None:
    """`meshalloc bench NAME` runs this module, whose EXPERIMENT says what it is."""
    assert EXPERIMENT_MODULES[name] == module.__name__.rpartition(".")[2]
    assert module.EXPERIMENT.name == name
    assert module.EXPERIMENT.title and module.EXPERIMENT.paper


def assert_ran_once(outcome: dict) -> None:
    """A smoke run's outcome.json: the experiment ran, one repetition, nothing failed."""
    assert outcome["status"] == "ran", outcome.get("reason")
    assert outcome["repetitions"] == 1
    assert outcome["failures"] == []


def smoke_outcome(directory: Path) -> dict:
    """The experiment directory's outcome.json, which must say what assert_ran_once checks."""
    outcome = json.loads((directory / "outcome.json").read_text())
    assert_ran_once(outcome)
    return outcome


def assert_figure(stem: Path) -> None:
    """STEM.png is a PNG and STEM.svg an SVG document."""
    assert stem.with_name(stem.name + ".png").read_bytes().startswith(PNG_SIGNATURE)
    assert ElementTree.parse(stem.with_name(stem.name + ".svg")).getroot().tag == SVG_TAG
