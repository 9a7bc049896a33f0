"""The heap under a memory cgroup limit (issue 24's fault injection: "a memory cgroup limit").

`meshalloc_limits --phases 32` (tests/stress/limits.cc) allocates six phases of 32 MiB of small
blocks, each phase of another size class, keeps one block in ten and frees the rest, meshing
after each phase; every kept block is checked after every phase. In all it allocates 192 MiB
(plus its own 17 MiB table of blocks); its charge peaks at 91 MiB (91.1–91.7 in three runs).
Under a limit of 98 MiB it must live: that needs the pages it freed (`madvise`) and the pages
meshing released (holes punched in the memfd that backs meshed spans) to stop being charged to
the cgroup; without swap the kernel kills the process at the limit. Neither release can be
lost unnoticed: with `madvise` made a no-op the peak is 105 MiB, with the hole punching made a
no-op 104 MiB (measured; both runs are killed here). With meshing off the run cannot fit
either."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from bench_support import require_built

from meshalloc_cli.cgroup import CgroupUnavailable, MemoryCgroup

PROGRAM = Path("tests") / "stress" / "meshalloc_limits"
PHASE_MIB = 32
LIMIT_MIB = 98
TIMEOUT_S = 120


def run_limited(build: Path, **env: str) -> subprocess.CompletedProcess:
    try:
        cgroup = MemoryCgroup.create()
    except CgroupUnavailable as why:
        pytest.skip(f"no memory cgroup: {why}")
    try:
        cgroup.limit(LIMIT_MIB << 20)
        return subprocess.run([str(build / PROGRAM), "--phases", str(PHASE_MIB)], preexec_fn=cgroup.joiner(),
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        cgroup.remove()


def test_meshing_keeps_a_fragmenting_program_under_its_cgroup_limit():
    build = require_built(PROGRAM)
    completed = run_limited(build, MESHALLOC_MESH="1")
    assert completed.returncode == 0, (completed.returncode, completed.stdout, completed.stderr)
    assert "meshes" in completed.stdout and " 0 meshes" not in completed.stdout, completed.stdout


def test_the_limit_is_below_what_the_program_needs_without_meshing():
    build = require_built(PROGRAM)
    completed = run_limited(build, MESHALLOC_MESH="0")
    assert completed.returncode == -signal.SIGKILL, (completed.returncode, completed.stdout, completed.stderr)
