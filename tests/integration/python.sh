#!/usr/bin/env bash
# python3 runs an allocation-heavy script (alloc_heavy.py) under meshalloc, once with Python's
# own small-object allocator and once with PYTHONMALLOC=malloc (every object from malloc); the
# printed checksum must equal that of a run without the preload.
source "$(dirname "$0")/lib.sh"
require_cmd python3
# Resolve launcher shims (pyenv and the like) so that only the interpreter is preloaded.
PYTHON=$(python3 -c 'import sys; print(sys.executable)')
SCRIPT="$(dirname "$0")/alloc_heavy.py"

expected=$("$PYTHON" "$SCRIPT")
[[ $expected == kept=* ]] || fail "reference run printed '$expected'"
actual=$(preloaded "$PYTHON" "$SCRIPT") || fail "python3 exited with status $?"
expect_eq "checksum (pymalloc)" "$expected" "$actual"
actual=$(PYTHONMALLOC=malloc preloaded "$PYTHON" "$SCRIPT") || fail "python3 exited with status $?"
expect_eq "checksum (PYTHONMALLOC=malloc)" "$expected" "$actual"
expect_meshing
