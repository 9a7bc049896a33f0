# Sourced by the benchmark scripts: finds the comparison allocators' libraries.
#   find_lib OVERRIDE NAME...     first existing library among NAME... (or OVERRIDE if set)
#   add_comparison_allocators WANTED_FN
#       appends glibc (no preload), jemalloc, mimalloc and tcmalloc (those installed, and for
#       which WANTED_FN NAME succeeds) to ALLOC_NAMES / ALLOC_LIBS / ALLOC_ENVS, and the
#       missing ones to SKIPPED. JEMALLOC_LIB / MIMALLOC_LIB / TCMALLOC_LIB override a path.

find_lib() {
  local override=$1
  shift
  if [[ -n $override ]]; then
    [[ -f $override ]] && echo "$override"
    return
  fi
  local multiarch dir name
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")
  for name in "$@"; do
    for dir in "/usr/lib/$multiarch" /usr/lib64 /usr/lib /usr/local/lib; do
      [[ -f $dir/$name ]] && {
        echo "$dir/$name"
        return
      }
    done
  done
}

ALLOC_NAMES=() ALLOC_LIBS=() ALLOC_ENVS=() SKIPPED=()
add_alloc() { ALLOC_NAMES+=("$1"); ALLOC_LIBS+=("$2"); ALLOC_ENVS+=("$3"); }

add_comparison_allocators() {
  local wanted_fn=$1 spec name override files lib
  "$wanted_fn" glibc && add_alloc glibc "" ""
  for spec in "jemalloc|${JEMALLOC_LIB:-}|libjemalloc.so.2 libjemalloc.so" \
    "tcmalloc|${TCMALLOC_LIB:-}|libtcmalloc_minimal.so.4 libtcmalloc.so.4" \
    "mimalloc|${MIMALLOC_LIB:-}|libmimalloc.so.2 libmimalloc.so"; do
    IFS='|' read -r name override files <<<"$spec"
    "$wanted_fn" "$name" || continue
    # shellcheck disable=SC2086  # $files is a list of names
    lib=$(find_lib "$override" $files)
    if [[ -n $lib ]]; then add_alloc "$name" "$lib" ""; else SKIPPED+=("$name (not installed)"); fi
  done
}
