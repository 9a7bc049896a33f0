#!/usr/bin/env bash
# The allocator speed comparison is `meshalloc bench speed` (python/meshalloc_cli/bench/speed.py,
# described in docs/speed.md): the microbenchmarks here and real programs under glibc,
# jemalloc, mimalloc, tcmalloc and meshalloc 1n/2y, with results in results/speed/ and the
# claims in results/SUMMARY.md. This wrapper only remains so that old habits keep working;
# its arguments are meshalloc bench's:
#
#   bench/run.sh                  # full run: 5 repetitions
#   bench/run.sh --quick          # about 2 minutes
#   bench/run.sh --smoke          # seconds: does everything run?
#   SPEED_WORKLOADS="churn larson" SPEED_ALLOCATORS="mimalloc meshalloc:1n" bench/run.sh --repeat 9
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/meshalloc ]] || { echo "bench/run.sh: .venv/bin/meshalloc is missing (run scripts/setup.sh)" >&2; exit 1; }
exec .venv/bin/meshalloc bench "$@" speed
