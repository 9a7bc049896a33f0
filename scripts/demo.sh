#!/usr/bin/env bash
# `make demo`: the fragmentation workload under glibc, jemalloc, mimalloc and meshalloc
# (those present), three interleaved runs each, compared on PSS against glibc. Prints the
# table and where the figure is. `make demo` runs scripts/setup.sh and `make release`
# first; run by hand, this script expects both to have been done.
#
# Environment: DEMO_ALLOCATORS (comma-separated, default glibc,jemalloc,mimalloc,meshalloc),
# DEMO_REPEAT (default 3), DEMO_OUT (default results/demo), DEMO_WORKLOAD_ARGS (options
# for the workload, default none: see `fragmentation --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

MESHALLOC=.venv/bin/meshalloc
PYTHON=.venv/bin/python
WORKLOAD=build/release/tools/workloads/fragmentation
WANTED=${DEMO_ALLOCATORS:-glibc,jemalloc,mimalloc,meshalloc}
REPEAT=${DEMO_REPEAT:-3}
OUT=${DEMO_OUT:-results/demo}
read -r -a WORKLOAD_ARGS <<<"${DEMO_WORKLOAD_ARGS:-}"
BASELINE=glibc

if [[ ! -x $MESHALLOC ]]; then
  echo "demo: $MESHALLOC is missing; run ./scripts/setup.sh (or \`make demo\`)" >&2
  exit 1
fi
if [[ ! -x $WORKLOAD ]]; then
  echo "demo: $WORKLOAD is missing; run \`make release\` (or \`make demo\`)" >&2
  exit 1
fi

# Keep the allocators that are present; say why each missing one is left out.
available=$("$PYTHON" - "$WANTED" <<'EOF'
import sys
from meshalloc_cli import allocators
from meshalloc_cli.errors import MeshallocError

present = []
for name in filter(None, (part.strip() for part in sys.argv[1].split(","))):
    try:
        allocators.resolve(name)
    except MeshallocError as error:
        print(f"demo: skipping {name}: {error}", file=sys.stderr)
        continue
    present.append(name)
print(",".join(present))
EOF
)
if [[ -z $available ]]; then
  echo "demo: none of $WANTED is available; see \`$MESHALLOC allocators\`" >&2
  exit 1
fi
baseline_args=()
if [[ ",$available," == *",$BASELINE,"* ]]; then
  baseline_args=(--baseline "$BASELINE")
else
  echo "demo: $BASELINE is not available; ratios are against ${available%%,*}" >&2
fi

echo "demo: $WORKLOAD under ${available//,/, } (${REPEAT} interleaved runs each)"
status=0
"$MESHALLOC" compare --allocators "$available" --repeat "$REPEAT" "${baseline_args[@]}" --out "$OUT" \
  -- "$WORKLOAD" "${WORKLOAD_ARGS[@]}" || status=$?

# What the program itself holds at the end: the floor no allocator can go below.
first_log=$(ls "$OUT"/logs/*.log 2>/dev/null | head -n 1 || true)
if [[ -n $first_log ]] && live=$(grep -m1 '^live:' "$first_log"); then
  echo "the workload's own live data at its end: ${live#live: }"
fi
if [[ -f $OUT/memory.png ]]; then
  echo "demo: figure $OUT/memory.png (and .svg); table $OUT/table.md; raw samples $OUT/samples.tsv"
fi
exit "$status"
