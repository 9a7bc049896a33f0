#!/usr/bin/env bash
# The Redis LRU experiment (paper section 6.2.2; docs/redis-lru.md) is `meshalloc bench
# redis-lru` (python/meshalloc_cli/bench/redis_lru.py); this wrapper only runs it, passing its
# options through to `meshalloc bench`:
#
#   bench/redis/run.sh                # 3 interleaved repetitions, 15 s per server
#   bench/redis/run.sh --quick        # 1 repetition, 10 s per server (~1.5 minutes)
#   bench/redis/run.sh --smoke        # a few thousand keys: seconds
#
# REDIS_LRU_CONFIGS=jemalloc,meshalloc:2y runs a subset of the configurations.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -x .venv/bin/meshalloc ]] || { echo "bench/redis/run.sh: no .venv: run 'make setup' first" >&2; exit 1; }
exec .venv/bin/meshalloc bench "$@" redis-lru
