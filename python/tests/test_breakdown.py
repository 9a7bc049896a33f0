"""meshalloc's breakdown at exit (docs/memory.md): the library's report is parsed, summed over
a process tree, grouped into the tables' columns, and shown by `run` and `compare` only for
meshalloc, with the numbers the library measured for a program whose memory is known."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import MIB, compile_helper, meshalloc_library, run_meshalloc, HELPERS

from meshalloc_cli.breakdown import COLUMNS, Collector, combine, parse_report
from meshalloc_cli.allocators import Allocator
from meshalloc_cli.output import RUN_COLUMNS, TABLE_COLUMNS

REPORT = {
    "version": "0.1.0",
    "stats": {"allocated": 1},
    "breakdown": {"small_live": 1000, "detached_free_0": 30, "detached_free_1": 70, "page_maps": 8,
                  "span_records": 2, "heap_total": 1110, "pss": 5000, "outside_heap": 3890},
    "breakdown_components": [
        {"name": "small_live", "group": "live", "in_heap_total": True, "basis": "counted", "description": "d"},
        {"name": "detached_free_0", "group": "detached_free", "in_heap_total": True, "basis": "counted",
         "description": "d"},
        {"name": "detached_free_1", "group": "detached_free", "in_heap_total": True, "basis": "counted",
         "description": "d"},
        {"name": "page_maps", "group": "metadata", "in_heap_total": True, "basis": "resident", "description": "d"},
        {"name": "span_records", "group": "metadata", "in_heap_total": True, "basis": "counted", "description": "d"},
        {"name": "heap_total", "group": "heap_total", "in_heap_total": False, "basis": "derived",
         "description": "d"},
        {"name": "pss", "group": "pss", "in_heap_total": False, "basis": "resident", "description": "d"},
        {"name": "outside_heap", "group": "outside_heap", "in_heap_total": False, "basis": "derived",
         "description": "d"},
    ],
}
LEAVE_MIB = 16
LARGE_BYTES = 3 * MIB + 100


def test_report_is_grouped_by_the_librarys_own_groups():
    parsed = parse_report(json.dumps(REPORT))
    assert parsed.components["small_live"] == 1000
    groups = parsed.groups()
    assert groups["live"] == 1000
    assert groups["detached_free"] == 100
    assert groups["metadata"] == 10
    assert parsed.column("dirty") is None  # not in this report: shown as a dash
    summed = combine([parsed, parse_report(json.dumps(REPORT))])
    assert summed.processes == 2 and summed.components["pss"] == 10000 and summed.groups()["detached_free"] == 200


@pytest.mark.parametrize("text", ["", "not json", json.dumps({"stats": {}}), json.dumps([1, 2])])
def test_reports_without_a_breakdown_are_ignored(text):
    assert parse_report(text) is None
    assert combine([]) is None


def test_only_meshalloc_runs_collect_and_the_users_settings_win(tmp_path):
    library = tmp_path / "libmeshalloc.so"
    meshalloc = Allocator(name="meshalloc", library=library, description="")
    other = Allocator(name="jemalloc", library=tmp_path / "libjemalloc.so.2", description="")
    collector = Collector(meshalloc, {})
    try:
        env = collector.environment({})
        assert env["MESHALLOC_STATS"] == "json" and "%p" in env["MESHALLOC_STATS_FILE"]
    finally:
        collector.close()
    assert Collector(other, {}).environment({}) == {}
    assert Collector(meshalloc, {"MESHALLOC_STATS_FILE": "mine"}).environment({}) == {}


needs_library = pytest.mark.skipif(meshalloc_library() is None,
                                   reason="build/release/src/libmeshalloc.so is not built (run `make release`)")


@pytest.fixture(scope="module")
def leaver(helper_dir):
    return compile_helper(HELPERS / "leaver.c", helper_dir / "leaver")


@needs_library
def test_run_reports_the_breakdown_of_a_known_heap(leaver, tmp_path):
    completed = run_meshalloc("run", "--no-figure", "--no-cgroup", "-a", "meshalloc", "--out", str(tmp_path), "--",
                              str(leaver), str(LEAVE_MIB), str(LARGE_BYTES))
    assert completed.returncode == 0, completed.stderr
    assert "breakdown at exit" in completed.stderr
    breakdown = json.loads((tmp_path / "summary.json").read_text())["breakdown"]
    assert breakdown["processes"] == 1
    components, groups = breakdown["components"], breakdown["groups"]
    # 16 MiB of 256-byte objects left live (slots at their class size: exactly 256 B).
    assert LEAVE_MIB * MIB <= groups["live"] <= LEAVE_MIB * MIB * 1.05
    assert components["large_live"] >= LARGE_BYTES
    assert groups["large"] - components["large_live"] < LARGE_BYTES * 0.01 + 8 * 1024
    assert components["pss"] > 0 and components["heap_total"] > groups["live"]
    assert abs(components["pss"] - components["heap_total"] - components["outside_heap"]) == 0
    assert {item["name"] for item in breakdown["component_info"]} == set(components)
    # A dash for a group the process did not use is fine; every group the tables show exists.
    assert {group for group, _ in COLUMNS} <= set(groups)


@needs_library
def test_compare_shows_the_breakdown_columns_for_meshalloc_only(leaver, tmp_path):
    completed = run_meshalloc("compare", "--no-figure", "--no-cgroup", "--allocators", "system,meshalloc",
                              "--repeat", "1", "--out", str(tmp_path), "--", str(leaver), "4", str(MIB))
    assert completed.returncode == 0, completed.stderr
    assert "live MiB" in completed.stdout and "page tables MiB" in completed.stdout
    with open(tmp_path / "table.tsv", newline="") as handle:
        table = {row["allocator"]: row for row in csv.DictReader(handle, delimiter="\t")}
    assert set(TABLE_COLUMNS) == set(next(iter(table.values())))
    assert table["system"]["exit_live_mib"] == ""
    assert 4.0 <= float(table["meshalloc"]["exit_live_mib"]) <= 4.2
    with open(tmp_path / "runs.tsv", newline="") as handle:
        runs = {row["allocator"]: row for row in csv.DictReader(handle, delimiter="\t")}
    assert set(RUN_COLUMNS) == set(runs["meshalloc"])
    assert int(runs["meshalloc"]["exit_metadata_bytes"]) > 0 and runs["system"]["exit_metadata_bytes"] == ""
    markdown = (tmp_path / "table.md").read_text()
    assert "meshed saving MiB" in markdown and "docs/memory.md" in markdown
