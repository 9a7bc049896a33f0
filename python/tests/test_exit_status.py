"""The command's exit status comes back out of meshalloc; a command killed by a signal is
reported by the signal's name, exits 128 + N like in a shell, and keeps its samples."""

from __future__ import annotations

import csv
import json
import signal

import pytest
from conftest import MIB, run_meshalloc

from meshalloc_cli.errors import EXIT_SIGNAL_BASE

CRASH_BLOCK_MIB = 32
CRASH_HOLD_MS = "300"  # long enough for samples to see the block before the signal


@pytest.mark.parametrize("status", [0, 1, 7, 255])
def test_exit_status_passes_through(status, tmp_path):
    completed = run_meshalloc("run", "--no-figure", "--out", str(tmp_path), "--", "sh", "-c", f"exit {status}")
    assert completed.returncode == status, completed.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["exit"]["exit_code"] == status


@pytest.mark.parametrize("number", [signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL])
def test_signal_is_named_and_partial_samples_kept(number, crasher, tmp_path):
    completed = run_meshalloc("run", "--out", str(tmp_path), "--", str(crasher), str(CRASH_BLOCK_MIB),
                              CRASH_HOLD_MS, str(int(number)))
    name = signal.Signals(number).name
    assert completed.returncode == EXIT_SIGNAL_BASE + number
    assert f"killed by {name}" in completed.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exit"]["signal"] == name
    with open(tmp_path / "samples.tsv") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert rows, "partial samples must be written"
    assert max(int(row["pss_bytes"]) for row in rows) >= CRASH_BLOCK_MIB * MIB
    assert (tmp_path / "memory.png").stat().st_size > 0  # the figure is drawn too


def test_compare_passes_on_a_failing_status(tmp_path):
    completed = run_meshalloc("compare", "--no-figure", "--repeat", "1", "--allocators", "system",
                              "--out", str(tmp_path), "--", "sh", "-c", "exit 3")
    assert completed.returncode == 3
    assert "Failed runs" in completed.stdout
    assert (tmp_path / "logs").is_dir()
