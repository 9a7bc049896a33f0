#!/usr/bin/env bash
# Statistics at exit: MESHALLOC_STATS=json|text with MESHALLOC_STATS_FILE makes a preloaded
# program (here a multi-threaded sort) write a report when it exits; the JSON must parse.
source "$(dirname "$0")/lib.sh"
require_cmd sort seq

seq 1 300000 | sort -R --random-source=/dev/zero >"$WORK/input"
expected=$(sort -n "$WORK/input" | sha256sum)

MESHALLOC_STATS=json MESHALLOC_STATS_FILE="$WORK/stats.json" \
  preloaded sort -n --parallel=2 -S 64M "$WORK/input" >"$WORK/sorted" || fail "sort failed"
expect_eq "sorted output" "$expected" "$(sha256sum <"$WORK/sorted")"
[[ -s $WORK/stats.json ]] || fail "MESHALLOC_STATS=json wrote nothing to MESHALLOC_STATS_FILE"
if command -v python3 >/dev/null 2>&1; then
  python3 - "$WORK/stats.json" <<'PY' || fail "the JSON report does not parse: $(head -c 400 "$WORK/stats.json")"
import json, sys
with open(sys.argv[1]) as f:
    report = json.load(f)
assert isinstance(report, dict), "top level is not an object"
assert "allocated" in json.dumps(report), "no 'allocated' figure"
PY
  log "ok: JSON report parses ($(wc -c <"$WORK/stats.json") bytes)"
else
  grep -q '^[[:space:]]*{' "$WORK/stats.json" || fail "the JSON report does not start with {"
fi

# A small program's own metadata mapping is sized by what it uses, not by a large heap's
# needs (the internal heap's chunks start at 64 KiB and double): under 256 KiB for a short sort.
if command -v python3 >/dev/null 2>&1; then
  seq 1 2000 >"$WORK/small"
  MESHALLOC_STATS=json MESHALLOC_STATS_FILE="$WORK/small.json" \
    preloaded sort -n "$WORK/small" >/dev/null || fail "sort of a small input failed"
  metadata=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["stats"]["metadata"])' "$WORK/small.json") ||
    fail "no metadata figure in $(head -c 400 "$WORK/small.json")"
  ((metadata <= 262144)) || fail "a small sort maps $metadata bytes of metadata (expected at most 256 KiB)"
  log "ok: a small sort maps $metadata bytes of metadata"
fi

MESHALLOC_STATS=text MESHALLOC_STATS_FILE="$WORK/stats.txt" \
  preloaded sort -n "$WORK/input" >/dev/null || fail "sort failed"
[[ -s $WORK/stats.txt ]] || fail "MESHALLOC_STATS=text wrote nothing to MESHALLOC_STATS_FILE"
grep -qi "allocated" "$WORK/stats.txt" || fail "the text report has no 'allocated' line"
log "ok: text report, $(wc -l <"$WORK/stats.txt") lines"

# "%p" in MESHALLOC_STATS_FILE is the process id, so that each process of a preloaded tree
# (here a shell and the two sorts it starts) writes its own report; "%%" is a literal "%".
MESHALLOC_STATS=json MESHALLOC_STATS_FILE="$WORK/tree.%p.%%.json" \
  preloaded bash -c 'sort -n "$1" >/dev/null; sort -rn "$1" >/dev/null; true' bash "$WORK/input" ||
  fail "bash -c 'sort; sort' failed"
reports=("$WORK"/tree.*.%.json)
((${#reports[@]} >= 3)) ||
  fail "expected a report per process (bash and two sorts), got: ${reports[*]##*/}"
for report in "${reports[@]}"; do
  [[ ${report##*/} =~ ^tree\.[0-9]+\.%\.json$ ]] || fail "unexpected report name ${report##*/}"
  grep -q '"mesh_count"' "$report" || fail "${report##*/} is not a JSON report"
done
log "ok: MESHALLOC_STATS_FILE with %p: ${#reports[@]} reports (${reports[*]##*/})"
