"""Sampling against a program whose memory use is known.

Tolerance: the helper is a small C program, so everything it has besides its block --
its own pages, its share of libc, its stack, page-table pages -- stays far below
BASELINE_TOLERANCE; a PSS outside [block, block + tolerance] would mean the sampler
missed or double-counted memory.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

from conftest import MIB, run_meshalloc

from meshalloc_cli.procfs import ProcessReader

BLOCK_MIB = 64
# After freeing, glibc unmaps a block this large, so PSS falls back within the tolerance.
BASELINE_TOLERANCE = 4 * MIB
# Holding long enough for dozens of 10 ms samples in each phase; tests never assert on
# time itself, only on memory values seen while the helper holds.
HOLD_MS = "500"
SMALL_BLOCK_MIB = 16
CHILDREN = 2


def test_reader_sees_known_block_then_its_release(memhog, tmp_path):
    release = tmp_path / "release"
    process = subprocess.Popen([str(memhog), str(BLOCK_MIB), str(release)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "touched"
        reader = ProcessReader()
        held = reader.read_tree(reader.descendants(process.pid))
        assert held.processes == 1
        assert BLOCK_MIB * MIB <= held.pss <= BLOCK_MIB * MIB + BASELINE_TOLERANCE
        assert held.rss >= BLOCK_MIB * MIB
        assert held.pte > 0  # 64 MiB of 4 KiB pages needs page tables of its own
        assert held.maps > 0
        release.touch()
        assert process.stdout.readline().strip() == "freed"
        freed = reader.read_tree(reader.descendants(process.pid))
        assert freed.pss < BASELINE_TOLERANCE
    finally:
        release.touch()
        process.wait()


def test_reader_sums_the_whole_process_tree(memhog, tmp_path):
    """Two children under a shell: the tree's PSS holds both blocks."""
    release = tmp_path / "release"
    script = f'"$0" {SMALL_BLOCK_MIB} "$1" & "$0" {SMALL_BLOCK_MIB} "$1" & wait'
    process = subprocess.Popen(["sh", "-c", script, str(memhog), str(release)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(CHILDREN):
            assert process.stdout.readline().strip() == "touched"
        reader = ProcessReader()
        tree = reader.read_tree(reader.descendants(process.pid))
        assert tree.processes == CHILDREN + 1
        expected = CHILDREN * SMALL_BLOCK_MIB * MIB
        assert expected <= tree.pss <= expected + (CHILDREN + 1) * BASELINE_TOLERANCE
    finally:
        release.touch()
        process.wait()


def test_run_reports_known_peak_and_final(memhog, tmp_path):
    out = tmp_path / "out"
    completed = run_meshalloc("run", "--no-figure", "--out", str(out), "--", str(memhog), str(BLOCK_MIB), HOLD_MS)
    assert completed.returncode == 0, completed.stderr
    summary = json.loads((out / "summary.json").read_text())
    pss = summary["metrics"]["pss"]
    assert BLOCK_MIB * MIB <= pss["peak"] <= BLOCK_MIB * MIB + BASELINE_TOLERANCE
    assert pss["final"] < BASELINE_TOLERANCE
    assert 0 < pss["mean"] < pss["peak"]
    assert summary["metrics"]["rss"]["peak"] >= BLOCK_MIB * MIB
    with open(out / "samples.tsv") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert max(int(row["pss_bytes"]) for row in rows) == pss["peak"]
    if summary["cgroup"]["available"]:
        # The charge also holds page cache the helper faults in (its binary, libc if not
        # yet cached), so it gets a wider band than PSS.
        assert summary["cgroup"]["kernel_peak_bytes"] >= BLOCK_MIB * MIB
        assert summary["metrics"]["cgroup"]["peak"] >= BLOCK_MIB * MIB
        assert summary["metrics"]["cgroup"]["peak"] <= BLOCK_MIB * MIB + 4 * BASELINE_TOLERANCE
    # The report names PSS, and RSS only with its caveat.
    assert "PSS" in completed.stderr
    assert "double-count" in completed.stderr or "overstates" in completed.stderr
    assert "touched" in completed.stdout  # the command's own output passes through


def test_exiting_tells_a_live_process_from_a_finished_one():
    """A sample is kept only while the command is not exiting (measure.py drops one that
    straddles the exit); a zombie and a reaped pid both count as exiting."""
    import os

    from meshalloc_cli.procfs import exiting

    assert not exiting(os.getpid())
    child = subprocess.Popen(["true"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert exiting(child.pid)
    finally:
        child.wait()
    assert exiting(child.pid)
