# Shared helpers for the integration tests (sourced, not run).
#
# Each test runs a real program with LD_PRELOAD=$MESHALLOC_LIB (set by CTest to the built
# libmeshalloc.so) and compares its output with a known answer and/or the same program run
# without the preload. Only the program under test is preloaded, never the script's own tools.
# MESHALLOC_CONFIG (0n 2n 0y 1y 2y), if set by CTest, reaches the preloaded program unchanged.
#
# Exit codes: 0 pass, 1 fail, 77 skip (a program is not installed).

set -euo pipefail

SKIP=77
TEST_NAME=$(basename "$0" .sh)

log() { printf '%s: %s\n' "$TEST_NAME" "$*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}
skip() {
  log "SKIP: $*"
  exit "$SKIP"
}

[[ -n ${MESHALLOC_LIB:-} ]] || fail "MESHALLOC_LIB is not set (path to libmeshalloc.so)"
[[ -f $MESHALLOC_LIB ]] || fail "MESHALLOC_LIB=$MESHALLOC_LIB does not exist"
log "library $MESHALLOC_LIB, MESHALLOC_CONFIG=${MESHALLOC_CONFIG:-<default>}"

# require_cmd NAME... : skip the test unless every program is installed.
require_cmd() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || skip "$c is not installed (scripts/setup.sh installs it)"
  done
}

# A private scratch directory, removed on exit. Extra cleanup commands can be queued with
# on_exit.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/meshalloc-${TEST_NAME}.XXXXXX")
EXIT_HOOKS=()
on_exit() { EXIT_HOOKS+=("$1"); }
run_exit_hooks() {
  local status=$? hook
  for hook in "${EXIT_HOOKS[@]+"${EXIT_HOOKS[@]}"}"; do eval "$hook" || true; done
  rm -rf "$WORK"
  exit "$status"
}
trap run_exit_hooks EXIT
trap 'exit 130' INT TERM

# preloaded CMD... : runs CMD with the allocator preloaded and checks that the dynamic loader
# really loaded it into CMD (ld.so's own debug log names every library it initialises), so a
# wrong path cannot silently test glibc instead. Also fails if the program was killed by a
# signal or printed a meshalloc error.
PRELOAD_RUNS=0
preloaded() {
  PRELOAD_RUNS=$((PRELOAD_RUNS + 1))
  local tag="$WORK/ld.$PRELOAD_RUNS" status=0
  # Under the mesh-stress configuration every preloaded process writes its statistics, so that
  # expect_meshing can check that meshing really happened while the program got its answers.
  if [[ -n ${MESHALLOC_TEST_MESH_STRESS:-} && -z ${MESHALLOC_STATS:-} ]]; then
    MESHALLOC_STATS=json MESHALLOC_STATS_FILE="$WORK/mesh-stats.%p.json" \
      LD_PRELOAD="$MESHALLOC_LIB" LD_DEBUG=libs LD_DEBUG_OUTPUT="$tag" "$@" 2>"$tag.stderr" ||
      status=$?
  else
    LD_PRELOAD="$MESHALLOC_LIB" LD_DEBUG=libs LD_DEBUG_OUTPUT="$tag" "$@" 2>"$tag.stderr" ||
      status=$?
  fi
  cat "$tag.stderr" >&2
  if ((status > 128)); then
    fail "'$*' was killed by signal $((status - 128)) under meshalloc"
  fi
  if grep -q "meshalloc:" "$tag.stderr"; then
    fail "'$*' reported an allocator error: $(grep "meshalloc:" "$tag.stderr" | head -3)"
  fi
  # grep reads the files itself: `cat | grep -q` under pipefail fails when grep stops early
  # and cat gets SIGPIPE (programs with large debug logs, e.g. git commit).
  if ! grep -qs "calling init: .*$(basename "$MESHALLOC_LIB")" "$tag".[0-9]*; then
    fail "'$*' did not load $MESHALLOC_LIB (LD_PRELOAD ignored?)"
  fi
  rm -f "$tag".[0-9]*
  check_traces
  return "$status"
}

# Under the trace configuration (MESHALLOC_TEST_TRACE_TOOL, set by CTest to meshalloc-trace, with
# MESHALLOC_LIB the trace recorder, docs/trace.md) every preloaded process records into $WORK;
# after each run, every trace written so far must decode completely, and the program's own must
# hold events (a forked child that execs at once records nothing before its exec). Silent when
# all is well: some tests capture a preloaded run's stderr as its output.
if [[ -n ${MESHALLOC_TEST_TRACE_TOOL:-} ]]; then
  export MESHALLOC_TRACE_FILE="$WORK/trace"
fi
check_traces() {
  [[ -n ${MESHALLOC_TEST_TRACE_TOOL:-} ]] || return 0
  local file events
  [[ -f $WORK/trace ]] || fail "trace: the preloaded program wrote no trace"
  for file in "$WORK"/trace*; do
    events=$("$MESHALLOC_TEST_TRACE_TOOL" stats --json "$file" | grep -o '"events": [0-9]*' | grep -o '[0-9]*$') ||
      fail "trace: $file does not decode"
    [[ $file != "$WORK/trace" ]] || ((events > 0)) || fail "trace: $file holds no event"
  done
  rm -f "$WORK"/trace*
}

# expect_meshing: under the mesh-stress configuration (MESHALLOC_TEST_MESH_STRESS, set by CTest
# with a 1 ms mesh period, no CPU budget and no minimum gain), fails unless the preloaded runs
# so far meshed at least one span between them; otherwise does nothing. Called by the tests
# whose programs run long enough to mesh, after their answers have been checked.
expect_meshing() {
  [[ -n ${MESHALLOC_TEST_MESH_STRESS:-} ]] || return 0
  local file count total=0 files=0
  for file in "$WORK"/mesh-stats.*.json; do
    [[ -f $file ]] || continue
    files=$((files + 1))
    count=$(grep -o '"mesh_count": *[0-9]*' "$file" | grep -o '[0-9]*$' || true)
    total=$((total + ${count:-0}))
  done
  ((files > 0)) || fail "mesh-stress: no preloaded process wrote its statistics"
  ((total > 0)) || fail "mesh-stress: no span was meshed in $files preloaded processes"
  log "ok: $total spans meshed in $files preloaded processes"
}

# expect_eq WHAT EXPECTED ACTUAL
expect_eq() {
  if [[ "$2" != "$3" ]]; then
    fail "$1: expected '$2', got '$3'"
  fi
  log "ok: $1 = $3"
}
