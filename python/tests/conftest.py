"""Shared fixtures: helper programs compiled once per session, and a way to run the
`meshalloc` command exactly as a user would (a separate process, real exit status)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

from meshalloc_cli import allocators, paths

HELPERS = Path(__file__).parent / "helpers"
SHIM_SOURCE = Path(__file__).resolve().parents[2] / "tools" / "glibc-shim" / "glibc_shim.c"
MIB = 1 << 20
# Every meshalloc invocation in the tests finishes in seconds; this only stops a hang
# from blocking the suite forever, it is not a timing assertion.
COMMAND_TIMEOUT_S = 120


def compiler(name: str) -> str:
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed")
    return found


def compile_helper(source: Path, output: Path, extra: Optional[List[str]] = None) -> Path:
    tool = compiler("c++" if source.suffix == ".cc" else "cc")
    subprocess.run([tool, "-O1", "-o", str(output), str(source), *(extra or [])], check=True)
    return output


@pytest.fixture(scope="session")
def helper_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("helpers")


@pytest.fixture(scope="session")
def memhog(helper_dir) -> Path:
    return compile_helper(HELPERS / "memhog.c", helper_dir / "memhog")


@pytest.fixture(scope="session")
def crasher(helper_dir) -> Path:
    return compile_helper(HELPERS / "crash.c", helper_dir / "crash")


@pytest.fixture(scope="session")
def build_dir_with_shim(tmp_path_factory) -> Path:
    """A build directory holding the glibc shim: the project's own when `make release`
    has built it, else the shim compiled here from the same source, laid out the same
    way, so the tests always exercise the name `glibc`."""
    real = paths.build_directory()
    if real and (real / paths.GLIBC_SHIM_LIBRARY).is_file():
        return real
    build = tmp_path_factory.mktemp("build")
    target = build / paths.GLIBC_SHIM_LIBRARY
    target.parent.mkdir(parents=True)
    subprocess.run([compiler("cc"), "-std=gnu11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
                    "-fno-builtin-malloc", "-fno-builtin-calloc", "-fno-builtin-realloc", "-fno-builtin-free",
                    "-Wl,--no-undefined", "-o", str(target), str(SHIM_SOURCE)], check=True)
    return build


def meshalloc_library() -> Optional[Path]:
    build = paths.build_directory()
    library = build / paths.MESHALLOC_LIBRARY if build else None
    return library if library and library.is_file() else None


def run_meshalloc(*args: str, env: Optional[dict] = None, cwd: Optional[Path] = None,
                  stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    """`meshalloc ARGS...` as a separate process, output captured as text."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "meshalloc_cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, stdin=stdin, timeout=COMMAND_TIMEOUT_S)


def stderr_lines(completed: subprocess.CompletedProcess) -> List[str]:
    return [line for line in completed.stderr.splitlines() if line.strip()]


def system_library(name: str) -> Path:
    soname, package = allocators.SYSTEM_ALLOCATORS[name]
    found = allocators.find_system_library(soname)
    if found is None:
        pytest.skip(f"{name} is not installed (apt-get install {package})")
    return found
