"""The files `run` and `compare` write are complete and well formed: TSV with one header
and rows of the same width, parseable numbers, JSON summaries, PNG and SVG figures."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from conftest import MIB, run_meshalloc

from meshalloc_cli.output import RUN_COLUMNS, SAMPLE_COLUMNS, TABLE_COLUMNS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG_TAG = "{http://www.w3.org/2000/svg}svg"
BLOCK_MIB = "24"
HOLD_MS = "200"
REPEAT = 2


def read_tsv(path: Path, columns):
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    assert rows, f"{path} is empty"
    assert tuple(rows[0]) == tuple(columns)
    for row in rows[1:]:
        assert len(row) == len(columns), f"ragged row in {path}: {row}"
    return [dict(zip(rows[0], row)) for row in rows[1:]]


def check_figures(directory: Path):
    png = directory / "memory.png"
    assert png.read_bytes()[:len(PNG_SIGNATURE)] == PNG_SIGNATURE
    root = ElementTree.parse(directory / "memory.svg").getroot()
    assert root.tag == SVG_TAG


def check_samples(rows, run_key=()):
    """Times are seconds since the run's command started, so they rise within a run and
    start again at zero in the next one. A comparison's samples.tsv stacks its runs (one
    block of rows per run, identified by the `run_key` columns), in the order they ran."""
    blocks = []
    for row in rows:
        key = tuple(row[column] for column in run_key)
        if not blocks or blocks[-1][0] != key:
            assert key not in (seen for seen, _ in blocks), f"the rows of run {key} are not contiguous"
            blocks.append((key, []))
        blocks[-1][1].append(float(row["time_s"]))
    for key, times in blocks:
        assert times == sorted(times), f"time_s goes backwards within run {key}"
        assert times[0] >= 0
    for row in rows:
        for column in ("pss_bytes", "rss_bytes", "pte_bytes", "processes"):
            assert int(row[column]) >= 0
        assert row["cgroup_bytes"] == "" or int(row["cgroup_bytes"]) > 0
        # Mappings are left out of samples where counting them would cost too much time.
        assert row["maps"] == "" or int(row["maps"]) > 0
    assert any(row["maps"] for row in rows)


def test_run_writes_tsv_json_and_figures(memhog, tmp_path):
    completed = run_meshalloc("run", "--out", str(tmp_path), "--", str(memhog), BLOCK_MIB, HOLD_MS)
    assert completed.returncode == 0, completed.stderr
    rows = read_tsv(tmp_path / "samples.tsv", SAMPLE_COLUMNS)
    assert len(rows) >= 2
    check_samples(rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["samples"] == len(rows)
    assert summary["exit"] == {"returncode": 0, "exit_code": 0, "signal": None, "interrupted": False}
    assert set(summary["metrics"]) >= {"pss", "rss", "pte", "maps"}
    assert summary["allocator"]["name"] == "system"
    check_figures(tmp_path)
    for name in ("samples.tsv", "summary.json", "memory.png", "memory.svg"):
        assert str(tmp_path / name) in completed.stderr  # the report says where the files are


@pytest.fixture(scope="module")
def comparison_dir(memhog, build_dir_with_shim, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    completed = run_meshalloc("compare", "--allocators", "system,glibc", "--baseline", "glibc",
                              "--repeat", str(REPEAT), "--out", str(out), "--", str(memhog), BLOCK_MIB, HOLD_MS,
                              env={"MESHALLOC_BUILD_DIR": str(build_dir_with_shim)})
    assert completed.returncode == 0, completed.stderr
    return out, completed


def test_compare_writes_every_file(comparison_dir):
    out, completed = comparison_dir
    samples = read_tsv(out / "samples.tsv", ("allocator", "repetition") + SAMPLE_COLUMNS)
    assert {row["allocator"] for row in samples} == {"system", "glibc"}
    assert {row["repetition"] for row in samples} == {str(n) for n in range(1, REPEAT + 1)}
    check_samples(samples, run_key=("allocator", "repetition"))
    runs = read_tsv(out / "runs.tsv", RUN_COLUMNS)
    # The blocks of samples.tsv are in the order of runs.tsv.
    run_order = list(dict.fromkeys((row["allocator"], row["repetition"]) for row in samples))
    assert run_order == [(row["allocator"], row["repetition"]) for row in runs]
    # Interleaved: A B A B, never A A B B.
    assert [row["allocator"] for row in runs] == ["system", "glibc"] * REPEAT
    assert all(row["exit_code"] == "0" for row in runs)
    assert all((out / "logs" / row["log"]).is_file() for row in runs)
    table = read_tsv(out / "table.tsv", TABLE_COLUMNS)
    assert [row["allocator"] for row in table] == ["system", "glibc"]
    glibc = next(row for row in table if row["allocator"] == "glibc")
    assert float(glibc["peak_ratio"]) == 1.0 and float(glibc["time_ratio"]) == 1.0
    for row in table:
        assert float(row["peak_pss_min_mib"]) <= float(row["peak_pss_mib"]) <= float(row["peak_pss_max_mib"])
        assert float(row["peak_pss_mib"]) >= int(BLOCK_MIB)
        assert int(row["succeeded"]) == REPEAT
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline"] == "glibc" and len(summary["runs"]) == 2 * REPEAT
    check_figures(out)
    assert f"figure: {out / 'memory.png'}" in completed.stdout


def test_compare_markdown_table(comparison_dir):
    out, completed = comparison_dir
    lines = (out / "table.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header[:5] == ["allocator", "ok", "mean PSS MiB", "peak PSS MiB", "time s"]
    assert set(table[1].replace("|", "").replace(":", "")) == {"-"}
    body = table[2:]
    assert len(body) == 2
    for line in body:
        assert len(line.strip("|").split("|")) == len(header)
    assert any("glibc (baseline)" in line for line in body)
    assert any("RSS" in line and "overstates" in line for line in lines)
    # The terminal table shows the same rows.
    assert "glibc (baseline)" in completed.stdout
