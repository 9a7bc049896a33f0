#!/usr/bin/env bash
# Thread scaling: memory (PSS) against the number of threads under every allocator. The
# experiment is `meshalloc bench thread-scaling` (python/meshalloc_cli/bench/thread_scaling.py);
# this wrapper only keeps the old name working. See docs/thread-scaling.md.
#
#   bench/thread_scaling.sh              # T = 1 6 12 ... 48 (the study's grid), 3 repetitions
#   bench/thread_scaling.sh --quick      # T = 1 12 24 48, 2 repetitions (under a minute)
#   bench/thread_scaling.sh --smoke      # T = 1 2, tiny workload (seconds)
#   bench/thread_scaling.sh --repeat 5 --out /tmp/results
#
# Writes results/thread-scaling/ and updates results/SUMMARY.md (--out moves both).
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
for arg in "$@"; do
  case $arg in
    # The old script's --study grid is now the full run's.
    --study) ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *) args+=("$arg") ;;
  esac
done
exec .venv/bin/meshalloc bench "${args[@]}" thread-scaling
