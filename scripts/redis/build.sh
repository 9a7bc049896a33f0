#!/usr/bin/env bash
# Builds the two redis-server binaries the Redis LRU experiment (bench/redis/run.sh) needs,
# from Debian bookworm's source package of Redis (its tarball carries Redis's own patched
# jemalloc in deps/):
#
#   third_party_cache/redis-bin/redis-server-libc      MALLOC=libc: glibc malloc, so that any
#                                                      allocator can be put in front with LD_PRELOAD
#   third_party_cache/redis-bin/redis-server-jemalloc  MALLOC=jemalloc: Redis's default build, the
#                                                      baseline, the only one that takes `activedefrag yes`
#   third_party_cache/redis-bin/redis-cli              the client of the same source, for `shutdown`
#
# Idempotent: when the binaries exist (and still pass the checks below) nothing is done.
# Needs root only the first time, to add a deb-src entry and install dpkg-dev/build-essential.
#
#   scripts/redis/build.sh            # build what is missing
#   REDIS_REBUILD=1 scripts/redis/build.sh   # build again even if the binaries exist
#
# Environment: REDIS_CACHE (default third_party_cache), REDIS_JOBS (make -j, default 2).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CACHE=${REDIS_CACHE:-$ROOT/third_party_cache}
[[ $CACHE == /* ]] || CACHE=$ROOT/$CACHE
SRC_DIR=$CACHE/redis-src
BIN_DIR=$CACHE/redis-bin
JOBS=${REDIS_JOBS:-2}
LOG=$CACHE/redis-build.log
DEB_SRC_FILE=/etc/apt/sources.list.d/meshalloc-deb-src.sources

fail() { echo "scripts/redis/build.sh: FAILED: $*" >&2; exit 1; }
note() { echo "scripts/redis/build.sh: $*" >&2; }

# ---------------------------------------------------------------------------------------------
# Checks on finished binaries: the jemalloc build must say malloc=jemalloc and accept
# `activedefrag yes` (a Redis built without its patched jemalloc refuses it at start-up).
check_binaries() {
  local server_je=$BIN_DIR/redis-server-jemalloc server_libc=$BIN_DIR/redis-server-libc cli=$BIN_DIR/redis-cli
  [[ -x $server_je && -x $server_libc && -x $cli ]] || return 1
  "$server_je" --version 2>/dev/null | grep -q 'malloc=jemalloc' ||
    { note "$server_je --version does not say malloc=jemalloc"; return 1; }
  "$server_libc" --version 2>/dev/null | grep -q 'malloc=libc' ||
    { note "$server_libc --version does not say malloc=libc"; return 1; }
  local dir sock pid answer status
  dir=$(mktemp -d) || return 1
  sock=$dir/redis.sock
  "$server_je" --port 0 --unixsocket "$sock" --save '' --appendonly no --dir "$dir" \
    --activedefrag yes --logfile "$dir/server.log" &
  pid=$!
  for _ in $(seq 1 100); do
    [[ -S $sock ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  answer=$("$cli" -s "$sock" config get activedefrag 2>/dev/null | tail -1)
  "$cli" -s "$sock" shutdown nosave >/dev/null 2>&1
  wait "$pid" 2>/dev/null
  status=$?
  if [[ $answer != yes ]]; then
    note "$server_je did not accept 'activedefrag yes' (exit status $status):"
    sed 's/^/  /' "$dir/server.log" >&2 2>/dev/null
    rm -rf "$dir"
    return 1
  fi
  rm -rf "$dir"
  return 0
}

if [[ ${REDIS_REBUILD:-0} != 1 ]] && check_binaries; then
  echo "scripts/redis/build.sh: up to date: $("$BIN_DIR/redis-server-jemalloc" --version | cut -d' ' -f3,5) in ${BIN_DIR#"$ROOT"/}/"
  exit 0
fi

mkdir -p "$SRC_DIR" "$BIN_DIR" || fail "cannot create $SRC_DIR and $BIN_DIR"
: >"$LOG" || fail "cannot write $LOG"

as_root() {
  if [[ $(id -u) == 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else fail "this step needs root: $*"; fi
}

# ---------------------------------------------------------------------------------------------
# 1. The source package: a deb-src entry, dpkg-dev, a compiler.
have_deb_src() {
  # One-line format (sources.list, *.list) or deb822 (*.sources) with deb-src among its Types.
  local file
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $file ]] && grep -Eq '^[[:space:]]*deb-src[[:space:]].*(bookworm|stable)' "$file" && return 0
  done
  for file in /etc/apt/sources.list.d/*.sources; do
    [[ -f $file ]] || continue
    awk 'BEGIN { RS = ""; found = 0 }
         /(^|\n)Types:[^\n]*deb-src/ && /(^|\n)Suites:[^\n]*(bookworm|stable)/ && !/(^|\n)Enabled:[[:space:]]*no/ { found = 1 }
         END { exit !found }' "$file" && return 0
  done
  return 1
}

SRC_TREE=$(find "$SRC_DIR" -mindepth 1 -maxdepth 1 -type d -name 'redis-*' 2>/dev/null | sort | tail -1)
if [[ -z $SRC_TREE || ! -f $SRC_TREE/src/Makefile || ! -d $SRC_TREE/deps/jemalloc ]]; then
  packages=()
  command -v dpkg-source >/dev/null || packages+=(dpkg-dev)
  { command -v make >/dev/null && command -v cc >/dev/null && command -v g++ >/dev/null; } || packages+=(build-essential)
  need_update=0
  if ! have_deb_src; then
    note "adding a deb-src entry for Debian bookworm: $DEB_SRC_FILE"
    # shellcheck disable=SC2016  # the here-document is literal
    as_root tee "$DEB_SRC_FILE" >/dev/null <<'EOF' || fail "cannot write $DEB_SRC_FILE"
# Added by meshalloc's scripts/redis/build.sh: Debian's source packages, for `apt-get source redis`.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    need_update=1
  fi
  if ((need_update)) || ((${#packages[@]})); then
    note "apt-get update"
    as_root apt-get update -qq >>"$LOG" 2>&1 || fail "apt-get update (see ${LOG#"$ROOT"/})"
  fi
  if ((${#packages[@]})); then
    note "installing ${packages[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" \
      >>"$LOG" 2>&1 || fail "apt-get install ${packages[*]} (see ${LOG#"$ROOT"/})"
  fi
  note "apt-get source redis into ${SRC_DIR#"$ROOT"/}/"
  rm -rf "$SRC_DIR" && mkdir -p "$SRC_DIR" || fail "cannot recreate $SRC_DIR"
  # apt-get source extracts with dpkg-source, which applies Debian's patches (security fixes
  # and packaging defaults; the bundled jemalloc stays in deps/ and is what MALLOC=jemalloc uses).
  (cd "$SRC_DIR" && apt-get source -qq redis) >>"$LOG" 2>&1 ||
    fail "apt-get source redis (see ${LOG#"$ROOT"/}; is there a deb-src entry and network access?)"
  SRC_TREE=$(find "$SRC_DIR" -mindepth 1 -maxdepth 1 -type d -name 'redis-*' | sort | tail -1)
  [[ -n $SRC_TREE && -f $SRC_TREE/src/Makefile ]] || fail "apt-get source left no redis-*/src/Makefile in $SRC_DIR"
  [[ -d $SRC_TREE/deps/jemalloc ]] || fail "$SRC_TREE has no deps/jemalloc (the source package changed?)"
fi
note "source: ${SRC_TREE#"$ROOT"/}"

# Debian's patch 0004 ("Add support for USE_SYSTEM_JEMALLOC flag") tests
# `#if USE_SYSTEM_JEMALLOC == yes`; with neither name defined the preprocessor reads 0 == 0,
# so a build with the bundled jemalloc calls the unprefixed malloc/mallctl: glibc's malloc, and
# an undefined `mallctl` at link time. Debian builds only with its system jemalloc and never
# notices. The experiment needs the bundled one (it is what Redis's `activedefrag` is written
# for), so that one patch is taken back out of our copy of the tree.
SYSTEM_JEMALLOC_PATCH=debian/patches/0004-Add-support-for-USE_SYSTEM_JEMALLOC-flag.patch
UNPATCHED_MARK=$SRC_TREE/.meshalloc-reverted-0004
if [[ -f $SRC_TREE/$SYSTEM_JEMALLOC_PATCH && ! -f $UNPATCHED_MARK ]]; then
  note "reverting $SYSTEM_JEMALLOC_PATCH (it breaks MALLOC=jemalloc with the bundled jemalloc)"
  (cd "$SRC_TREE" && patch -R -p1 -s --dry-run <"$SYSTEM_JEMALLOC_PATCH" && patch -R -p1 -s <"$SYSTEM_JEMALLOC_PATCH") \
    >>"$LOG" 2>&1 || fail "cannot revert $SYSTEM_JEMALLOC_PATCH in ${SRC_TREE#"$ROOT"/} (see ${LOG#"$ROOT"/})"
  touch "$UNPATCHED_MARK"
fi

# ---------------------------------------------------------------------------------------------
# 2. Two builds from the same tree, `make distclean` between them (the dependencies in deps/
# are built differently for each MALLOC). BUILD_TLS and systemd stay off: not needed here.
build_one() {  # build_one <libc|jemalloc>
  local malloc=$1
  note "building redis-server MALLOC=$malloc (make -j$JOBS; log ${LOG#"$ROOT"/})"
  (cd "$SRC_TREE" && make distclean && make -j"$JOBS" MALLOC="$malloc" BUILD_TLS=no USE_SYSTEMD=no) >>"$LOG" 2>&1 ||
    { tail -20 "$LOG" >&2; fail "make MALLOC=$malloc in ${SRC_TREE#"$ROOT"/} (see ${LOG#"$ROOT"/})"; }
  install -m 755 "$SRC_TREE/src/redis-server" "$BIN_DIR/redis-server-$malloc" ||
    fail "cannot copy redis-server to $BIN_DIR"
  install -m 755 "$SRC_TREE/src/redis-cli" "$BIN_DIR/redis-cli" || fail "cannot copy redis-cli to $BIN_DIR"
}
build_one libc
build_one jemalloc

check_binaries || fail "the binaries in ${BIN_DIR#"$ROOT"/} do not pass the checks above"
echo "scripts/redis/build.sh: built $("$BIN_DIR/redis-server-jemalloc" --version | cut -d' ' -f3,5): ${BIN_DIR#"$ROOT"/}/redis-server-libc, redis-server-jemalloc, redis-cli"
