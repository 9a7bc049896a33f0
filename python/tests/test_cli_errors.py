"""Each bad input gives one line on stderr and its exit status, and runs nothing."""

from __future__ import annotations

import os
import stat

import pytest
from conftest import run_meshalloc, stderr_lines

from meshalloc_cli.errors import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_USAGE


def _not_executable(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho should not run\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    return str(script)


def _not_a_library(tmp_path):
    fake = tmp_path / "libfake.so"
    fake.write_text("not an ELF file\n")
    return str(fake)


def _file_in_the_way(tmp_path):
    # Root may write anywhere, so "unwritable" is made with a regular file where a
    # directory would have to be: no permission check can be bypassed around that.
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    return str(blocker / "out")


CASES = {
    "unknown allocator": (lambda t: ["run", "-a", "nosuchalloc", "--", "true"], EXIT_USAGE, "unknown allocator"),
    "unknown meshalloc configuration": (lambda t: ["run", "-a", "meshalloc:3q", "--", "true"], EXIT_USAGE,
                                        "configuration"),
    "configuration on another allocator": (lambda t: ["run", "-a", "jemalloc:2y", "--", "true"], EXIT_USAGE,
                                           "only meshalloc takes a configuration"),
    "missing library path": (lambda t: ["run", "-a", str(t / "libnone.so"), "--", "true"], EXIT_USAGE,
                             "not found"),
    "library that is not ELF": (lambda t: ["run", "-a", _not_a_library(t), "--", "true"], EXIT_USAGE,
                                "not an ELF shared object"),
    "missing command (run)": (lambda t: ["run", "--"], EXIT_USAGE, "missing command"),
    "missing command, no separator": (lambda t: ["run"], EXIT_USAGE, "missing command"),
    "missing command (compare)": (lambda t: ["compare", "--allocators", "system", "--"], EXIT_USAGE,
                                  "missing command"),
    "command not found": (lambda t: ["run", "--", "no-such-command-anywhere"], EXIT_NOT_FOUND, "command not found"),
    "command path not found": (lambda t: ["run", "--", str(t / "absent")], EXIT_NOT_FOUND, "command not found"),
    "command not executable": (lambda t: ["run", "--", _not_executable(t)], EXIT_CANNOT_EXECUTE, "not executable"),
    "directory as command": (lambda t: ["run", "--", str(t)], EXIT_CANNOT_EXECUTE, "not executable"),
    "unwritable output directory": (lambda t: ["run", "--out", _file_in_the_way(t), "--", "true"], EXIT_USAGE,
                                    "cannot write to output directory"),
    "unknown option": (lambda t: ["run", "--bogus", "--", "true"], EXIT_USAGE, "unrecognized arguments"),
    "bad interval": (lambda t: ["run", "--interval", "-5", "--", "true"], EXIT_USAGE, "interval"),
    "interval not a number": (lambda t: ["run", "--interval", "fast", "--", "true"], EXIT_USAGE, "milliseconds"),
    "bad repeat": (lambda t: ["compare", "--repeat", "0", "--", "true"], EXIT_USAGE, "at least 1"),
    "unknown subcommand": (lambda t: ["frobnicate"], EXIT_USAGE, "invalid choice"),
    "allocator listed twice": (lambda t: ["compare", "--allocators", "system,system", "--", "true"], EXIT_USAGE,
                               "listed twice"),
    "baseline not compared": (lambda t: ["compare", "--allocators", "system", "--baseline", "glibc", "--", "true"],
                              EXIT_USAGE, "baseline"),
    "unknown allocator in a list": (lambda t: ["compare", "--allocators", "system,nosuch", "--", "true"],
                                    EXIT_USAGE, "unknown allocator"),
    "arguments on both sides of --": (lambda t: ["run", "true", "--", "false"], EXIT_USAGE, "unexpected arguments"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_line_and_status(case, tmp_path):
    make_args, status, fragment = CASES[case]
    out = tmp_path / "never-written"
    args = make_args(tmp_path)
    if "--out" not in args and args and args[0] in ("run", "compare"):
        args = [args[0], "--out", str(out), *args[1:]]
    completed = run_meshalloc(*args)
    lines = stderr_lines(completed)
    assert completed.returncode == status, completed.stderr
    assert len(lines) == 1, completed.stderr
    assert fragment in lines[0]
    assert lines[0].startswith("meshalloc")
    assert completed.stdout == ""
    assert not (out / "samples.tsv").exists()  # nothing ran


def test_help_and_version_succeed():
    for args in (["--help"], ["run", "--help"], ["compare", "--help"], ["allocators", "--help"], ["--version"]):
        completed = run_meshalloc(*args)
        assert completed.returncode == 0, args
        assert completed.stdout


def test_not_executable_means_what_it_says(tmp_path):
    """Sanity check of the fixture: as root os.access(X_OK) is still false without x bits."""
    assert not os.access(_not_executable(tmp_path), os.X_OK)
