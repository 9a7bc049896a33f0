#!/usr/bin/env bash
# The Redis LRU experiment (paper section 6.2.2; docs/redis-lru.md): Redis as an LRU cache
# (maxmemory 100mb, allkeys-lru) fed 700,000 keys with 240-byte values and then 170,000 keys
# with 492-byte values, under jemalloc (Redis's default), jemalloc with activedefrag, glibc,
# mimalloc, tcmalloc and meshalloc (2y, and 0n: meshing off). The server's PSS is sampled over
# its whole life (~15 s); the insertion time comes from the client. Prints a Markdown table of
# medians and the checks of meshalloc 2y against its targets.
#
#   bench/redis/run.sh                    # 3 interleaved repetitions (~7 minutes)
#   bench/redis/run.sh --quick            # 1 repetition, 10 s per run (~1.5 minutes)
#   bench/redis/run.sh --repeat 5 --out results/redis-lru/mine
#
# Options: --repeat N (default 3; --quick: 1), --quick, --out DIR (default
# results/redis-lru/<date-time>[-quick], with results/redis-lru/latest pointing at it),
# --hold SECONDS (server lifetime, default 15; quick 10), --configs A,B,... (a subset of
# jemalloc,jemalloc+activedefrag,glibc,mimalloc,tcmalloc,meshalloc:2y,meshalloc:0n).
# Needs: scripts/redis/build.sh (the two redis-server builds), `make release` (libmeshalloc.so),
# `make setup` (.venv with the meshalloc command, whose sampler this uses).
# Environment: BUILD_DIR (default build/release), MESHALLOC_LIB (default
# $BUILD_DIR/src/libmeshalloc.so), REDIS_CACHE (default third_party_cache); other MESHALLOC_*
# variables reach the meshalloc configurations (not MESHALLOC_CONFIG/MESH/RANDOMIZE, which the
# configuration names fix).
# Exit status: 0 when every run succeeded (the targets are reported, not enforced), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

die() { echo "bench/redis/run.sh: $*" >&2; exit 1; }

REPEAT="" QUICK=0 OUT="" HOLD="" CONFIGS=""
while (($#)); do
  case $1 in
    --repeat) [[ $# -ge 2 ]] || die "--repeat needs a number"; REPEAT=$2; shift 2 ;;
    --repeat=*) REPEAT=${1#*=}; shift ;;
    --quick) QUICK=1; shift ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a directory"; OUT=$2; shift 2 ;;
    --out=*) OUT=${1#*=}; shift ;;
    --hold) [[ $# -ge 2 ]] || die "--hold needs seconds"; HOLD=$2; shift 2 ;;
    --hold=*) HOLD=${1#*=}; shift ;;
    --configs) [[ $# -ge 2 ]] || die "--configs needs a list"; CONFIGS=$2; shift 2 ;;
    --configs=*) CONFIGS=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -z $REPEAT ]] && REPEAT=$([[ $QUICK == 1 ]] && echo 1 || echo 3)
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a positive integer"

BUILD_DIR=${BUILD_DIR:-build/release}
[[ $BUILD_DIR == /* ]] || BUILD_DIR=$ROOT/$BUILD_DIR
MESHALLOC_LIB=${MESHALLOC_LIB:-$BUILD_DIR/src/libmeshalloc.so}
CACHE=${REDIS_CACHE:-$ROOT/third_party_cache}
[[ $CACHE == /* ]] || CACHE=$ROOT/$CACHE
REDIS_BIN=$CACHE/redis-bin
PY=$ROOT/.venv/bin/python

[[ -x $REDIS_BIN/redis-server-jemalloc && -x $REDIS_BIN/redis-server-libc && -x $REDIS_BIN/redis-cli ]] ||
  die "no Redis builds in ${REDIS_BIN#"$ROOT"/}: run scripts/redis/build.sh first"
[[ -x $PY ]] || die "no .venv: run 'make setup' (scripts/setup.sh) first"
[[ -f $MESHALLOC_LIB ]] || echo "bench/redis/run.sh: $MESHALLOC_LIB missing ('make release'): meshalloc is skipped" >&2

# The client, compiled here (not part of the CMake tree); rebuilt when its source changes.
CLIENT_DIR=$ROOT/build/redis
CLIENT=$CLIENT_DIR/lru_client
if [[ ! -x $CLIENT || bench/redis/lru_client.c -nt $CLIENT ]]; then
  mkdir -p "$CLIENT_DIR" || die "cannot create $CLIENT_DIR"
  cc -O2 -std=c11 -Wall -Wextra -o "$CLIENT" bench/redis/lru_client.c || die "cannot compile bench/redis/lru_client.c"
fi

if [[ -z $OUT ]]; then
  OUT=results/redis-lru/$(date +%Y%m%d-%H%M%S)$([[ $QUICK == 1 ]] && echo -quick)
  LINK_LATEST=1
else
  LINK_LATEST=0
fi
mkdir -p "$OUT" || die "cannot create $OUT"

args=(--repeat "$REPEAT" --out "$OUT" --redis-bin "$REDIS_BIN" --redis-cli "$REDIS_BIN/redis-cli" --client "$CLIENT")
[[ $QUICK == 1 ]] && args+=(--quick)
[[ -n $HOLD ]] && args+=(--hold "$HOLD")
[[ -n $CONFIGS ]] && args+=(--configs "$CONFIGS")
if [[ -f $MESHALLOC_LIB ]]; then
  # Every run preloads one private copy: a `make release` elsewhere during the experiment
  # must not mix two versions of the library in one table. Which version it was goes beside it.
  cp "$MESHALLOC_LIB" "$OUT/libmeshalloc.so" || die "cannot copy $MESHALLOC_LIB to $OUT"
  { echo "library: $MESHALLOC_LIB ($(date -r "$MESHALLOC_LIB" '+%F %T'))"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "uncommitted changes under src/: $(git status --porcelain -- src 2>/dev/null | wc -l) file(s)"
  } >"$OUT/meshalloc-version.txt"
  args+=(--meshalloc-lib "$OUT/libmeshalloc.so")
fi

# The sampler is the meshalloc command's own (meshalloc_cli.measure), imported from .venv.
MESHALLOC_BUILD_DIR=$BUILD_DIR "$PY" bench/redis/lru_bench.py "${args[@]}"
status=$?
if ((LINK_LATEST)); then ln -sfn "$(basename "$OUT")" results/redis-lru/latest; fi
exit $status
