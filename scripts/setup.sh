#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian 12 machine: the build toolchain,
# the comparison allocators, the real programs the tests run, and the Python environment.
# Idempotent: packages already present are skipped, so repeated `make` runs are fast.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
  cmake ninja-build g++ make git pkg-config
  libgtest-dev googletest
  libjemalloc2 libmimalloc2.0 libtcmalloc-minimal4
  sqlite3 ruby perl redis-server redis-tools
  clang-format
  clang libclang-rt-14-dev  # the fuzzer (tests/fuzz): clang with libFuzzer and ASan's runtime
  dpkg-dev  # dpkg-shlibdeps: `make deb` and the install tests' .deb case
  zlib1g-dev  # compressed traces (`meshalloc trace compress`, tools/trace)
)

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing Debian packages (${missing[*]}); run as root or install them" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Mirrors and the dpkg lock can fail transiently on a fresh machine: retry, and show apt's
  # own messages when it finally fails.
  installed=0
  for attempt in 1 2 3; do
    if apt-get update -qq >/tmp/meshalloc-apt.log 2>&1 &&
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/meshalloc-apt.log 2>&1; then
      installed=1
      break
    fi
    echo "setup: apt-get failed (attempt $attempt of 3), retrying" >&2
    sleep $((attempt * 5))
  done
  if ((!installed)); then
    tail -20 /tmp/meshalloc-apt.log >&2
    echo "setup: could not install ${missing[*]}" >&2
    exit 1
  fi
fi

# The Python tooling lives in a project-local virtual environment.
VENV=.venv
if [[ ! -x $VENV/bin/python ]]; then
  python3 -m venv "$VENV"
fi
stamp=$VENV/.installed-$(sha1sum python/pyproject.toml 2>/dev/null | cut -c1-12)
if [[ -f python/pyproject.toml && ! -f $stamp ]]; then
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q -e "python[test]"
  rm -f $VENV/.installed-* && touch "$stamp"
fi
