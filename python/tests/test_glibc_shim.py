"""The `glibc` allocator (the project's shim) really routes a program linked against
another allocator to glibc.

Observables, both from a probe program (helpers/allocator_probe.c):
  - malloc_usable_size(malloc(1)): allocator-specific (glibc's minimum chunk differs from
    jemalloc's, mimalloc's and tcmalloc's smallest size class). The expected value is
    not hard-coded; it is what the same probe reports when built without any other
    allocator, i.e. on plain glibc.
  - the growth of glibc's main arena (mallinfo2) while the probe allocates 100 KB: all of
    it when glibc serves malloc, none when another allocator does.
mimalloc and tcmalloc also define glibc's __libc_malloc names, which a naive shim would
forward to; testing all three catches that.
"""

from __future__ import annotations

import re

import pytest
from conftest import HELPERS, compile_helper, run_meshalloc, system_library

PROBE_BLOCKS_BYTES = 1000 * 100  # kBlocks x kBlockSize in allocator_probe.c
PROBE_LINE = re.compile(r"usable=(\d+)(?: arena_delta=(\d+))?")
LINKED_ALLOCATORS = ("jemalloc", "mimalloc", "tcmalloc")


def _probe(program, allocator, build_dir, tmp_path):
    completed = run_meshalloc("run", "--no-figure", "--no-cgroup", "-a", allocator, "--out", str(tmp_path / allocator),
                              "--", str(program), env={"MESHALLOC_BUILD_DIR": str(build_dir)})
    assert completed.returncode == 0, completed.stderr
    match = PROBE_LINE.search(completed.stdout)
    assert match, completed.stdout
    usable = int(match.group(1))
    delta = int(match.group(2)) if match.group(2) is not None else None
    return usable, delta


@pytest.fixture(scope="module")
def glibc_reference(helper_dir, build_dir_with_shim, tmp_path_factory):
    """(usable, usable from new) of the probes on plain glibc, nothing preloaded."""
    plain = compile_helper(HELPERS / "allocator_probe.c", helper_dir / "probe-plain")
    plain_cc = compile_helper(HELPERS / "allocator_probe.cc", helper_dir / "probe-plain-cc")
    tmp = tmp_path_factory.mktemp("reference")
    usable, delta = _probe(plain, "system", build_dir_with_shim, tmp)
    assert delta >= PROBE_BLOCKS_BYTES  # glibc serves malloc: the arena grew
    usable_cc, _ = _probe(plain_cc, "system", build_dir_with_shim, tmp)
    return usable, usable_cc


@pytest.mark.parametrize("linked", LINKED_ALLOCATORS)
def test_shim_routes_c_program_to_glibc(linked, helper_dir, build_dir_with_shim, glibc_reference, tmp_path):
    library = system_library(linked)
    program = compile_helper(HELPERS / "allocator_probe.c", helper_dir / f"probe-{linked}", [f"-l:{library.name}"])
    glibc_usable, _ = glibc_reference

    # Control: as linked, the other allocator serves malloc and glibc's arena stays put.
    usable, delta = _probe(program, "system", build_dir_with_shim, tmp_path)
    assert usable != glibc_usable
    assert delta < PROBE_BLOCKS_BYTES

    # Under the shim: glibc answers, and glibc's arena holds the probe's blocks.
    usable, delta = _probe(program, "glibc", build_dir_with_shim, tmp_path)
    assert usable == glibc_usable
    assert delta >= PROBE_BLOCKS_BYTES


@pytest.mark.parametrize("linked", LINKED_ALLOCATORS)
def test_shim_routes_operator_new_to_glibc(linked, helper_dir, build_dir_with_shim, glibc_reference, tmp_path):
    library = system_library(linked)
    program = compile_helper(HELPERS / "allocator_probe.cc", helper_dir / f"probe-cc-{linked}", [f"-l:{library.name}"])
    _, glibc_usable = glibc_reference
    usable, _ = _probe(program, "system", build_dir_with_shim, tmp_path)
    assert usable != glibc_usable
    usable, _ = _probe(program, "glibc", build_dir_with_shim, tmp_path)
    assert usable == glibc_usable
