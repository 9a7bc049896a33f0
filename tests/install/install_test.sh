#!/usr/bin/env bash
# usage: install_test.sh CASE
#
# Installs the build tree into a temporary prefix P (`cmake --install --prefix P`) and checks
# one way of using it, from a working directory outside the source and build trees:
#   files         the files and links in P, the SONAME, `ldd` (libc and the loader only),
#                 the pkg-config file's prefix, the man page
#   pkg-config    the C and C++ programs built with `pkg-config --cflags --libs meshalloc`,
#                 and statically with `--static` and -l:libmeshalloc.a
#   find-package  a small CMake project: find_package(meshalloc VERSION), the four programs
#                 linked with meshalloc::meshalloc and meshalloc::meshalloc-static; a version
#                 the package does not provide must be refused
#   plain         cc/c++ -I P/include -L P/lib -lmeshalloc
#   preload       LD_PRELOAD=P/lib/libmeshalloc.so: /bin/true, and a program that finds
#                 meshalloc_mallctl with dlsym
#   cli           P/bin/meshalloc with the system python3, without the project's .venv; one
#                 line naming the module when a required one is missing
#   deb           the Debian package (cpack -G DEB): its files, control fields and .pc
# Every program asks meshalloc_mallctl whether its allocations went through meshalloc.
#
# Environment (set by tests/install/CMakeLists.txt): CMAKE_COMMAND, MESHALLOC_BUILD_TREE,
# MESHALLOC_SOURCE_TREE, MESHALLOC_INSTALL_LIBDIR, MESHALLOC_VERSION.
# MESHALLOC_INSTALL_TEST_BREAK=PATH (relative to P) deletes PATH after installing: the case
# that depends on it must then fail (how the tests were checked to catch what they check).
set -euo pipefail
case=${1:?usage: install_test.sh CASE}
here=$(cd "$(dirname "$0")" && pwd)
build=${MESHALLOC_BUILD_TREE:?}
source_tree=${MESHALLOC_SOURCE_TREE:?}
libdir_name=${MESHALLOC_INSTALL_LIBDIR:-lib}
version=${MESHALLOC_VERSION:?}
major=${version%%.*}
cmake=${CMAKE_COMMAND:-cmake}

work=$(mktemp -d "${TMPDIR:-/tmp}/meshalloc-install-$case.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
lib=$prefix/$libdir_name

fail() {
  echo "install.$case: FAIL: $*" >&2
  exit 1
}
step() { echo "install.$case: $*"; }

# Runs a built program and shows its output; fails the test when it fails.
run_program() {
  local what=$1
  shift
  local output
  output=$("$@" 2>&1) || fail "$what: $* failed: $output"
  step "$what: $output"
}

install_prefix() {
  "$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log" >&2; fail "cmake --install $build --prefix $prefix failed"; }
  if [[ -n ${MESHALLOC_INSTALL_TEST_BREAK:-} ]]; then
    step "deleting $MESHALLOC_INSTALL_TEST_BREAK from the prefix (MESHALLOC_INSTALL_TEST_BREAK)"
    rm -rf "${prefix:?}/$MESHALLOC_INSTALL_TEST_BREAK"
  fi
}

# Nothing may depend on the working directory: work from an unrelated one.
mkdir -p "$work/elsewhere"
cd "$work/elsewhere"

case $case in
files)
  install_prefix
  for file in "$lib/libmeshalloc.so" "$lib/libmeshalloc.so.$major" "$lib/libmeshalloc.so.$version" \
    "$lib/libmeshalloc.a" "$prefix/include/meshalloc.h" "$lib/pkgconfig/meshalloc.pc" \
    "$lib/cmake/meshalloc/meshallocConfig.cmake" "$lib/cmake/meshalloc/meshallocConfigVersion.cmake" \
    "$lib/cmake/meshalloc/meshallocTargets.cmake" "$prefix/bin/meshalloc" \
    "$lib/meshalloc/python/meshalloc_cli/cli.py" "$lib/meshalloc/src/libmeshalloc.so" \
    "$lib/meshalloc/tools/glibc-shim/libmeshalloc-glibc-shim.so" \
    "$lib/meshalloc/tools/trace/libmeshalloc-trace.so" "$lib/meshalloc/tools/trace/meshalloc-trace" \
    "$lib/meshalloc/tools/trace/meshalloc-replay" "$lib/meshalloc/tools/trace/meshalloc-replay-prepare" \
    "$prefix/share/man/man3/meshalloc.3" "$prefix/share/doc/meshalloc/options.md"; do
    [[ -e $file ]] || fail "missing after install: ${file#"$prefix/"}"
  done
  [[ -L $lib/libmeshalloc.so && -L $lib/libmeshalloc.so.$major && ! -L $lib/libmeshalloc.so.$version ]] ||
    fail "libmeshalloc.so and libmeshalloc.so.$major must be links to libmeshalloc.so.$version"
  [[ $(readlink -f "$lib/libmeshalloc.so") == "$lib/libmeshalloc.so.$version" ]] ||
    fail "libmeshalloc.so does not lead to libmeshalloc.so.$version"
  soname=$(readelf -d "$lib/libmeshalloc.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [[ $soname == "libmeshalloc.so.$major" ]] || fail "SONAME is '$soname', not libmeshalloc.so.$major"
  step "SONAME $soname"
  # ldd: the vDSO, libc and the loader, nothing else (no libstdc++, no libgcc_s).
  extra=$(ldd "$lib/libmeshalloc.so" | grep -v -e 'linux-vdso' -e 'libc\.so\.6' -e 'ld-linux' || true)
  [[ -z $extra ]] || fail "libmeshalloc.so needs more than libc: $extra"
  step "ldd: libc and the loader only"
  grep -qx "prefix=$prefix" "$lib/pkgconfig/meshalloc.pc" || fail "meshalloc.pc does not say prefix=$prefix"
  grep -q '^\.TH MESHALLOC 3' "$prefix/share/man/man3/meshalloc.3" || fail "meshalloc.3 is not a man page"
  grep -q 'MESHALLOC_MESH_BUDGET_PERMILLE' "$prefix/share/man/man3/meshalloc.3" ||
    fail "meshalloc.3 does not describe the options"
  step "all files in place"
  ;;
pkg-config)
  install_prefix
  command -v pkg-config >/dev/null || { echo "pkg-config is not installed"; exit 77; }
  export PKG_CONFIG_PATH=$lib/pkgconfig
  flags=$(pkg-config --cflags --libs meshalloc) || fail "pkg-config --cflags --libs meshalloc failed"
  step "pkg-config --cflags --libs: $flags"
  static_flags=$(pkg-config --cflags --libs --static meshalloc) || fail "pkg-config --static failed"
  [[ $static_flags == *-lpthread* && $static_flags == *-ldl* ]] ||
    fail "pkg-config --static does not list -lpthread -ldl: $static_flags"
  [[ $(pkg-config --modversion meshalloc) == "$version" ]] || fail "pkg-config --modversion is not $version"
  rpath=-Wl,-rpath,$(pkg-config --variable=libdir meshalloc)
  # shellcheck disable=SC2086 # the flags are words
  cc -o c_shared "$here/program.c" $flags "$rpath" || fail "cc with pkg-config flags failed"
  # shellcheck disable=SC2086
  c++ -std=c++17 -o cxx_shared "$here/program.cc" $flags "$rpath" || fail "c++ with pkg-config flags failed"
  # The archive: -l:libmeshalloc.a in place of -lmeshalloc, with the --static libraries.
  static_flags=${static_flags/-lmeshalloc/-l:libmeshalloc.a}
  # shellcheck disable=SC2086
  cc -o c_static "$here/program.c" $static_flags || fail "cc with pkg-config --static flags failed"
  # shellcheck disable=SC2086
  c++ -std=c++17 -o cxx_static "$here/program.cc" $static_flags || fail "c++ with pkg-config --static flags failed"
  for program in c_static cxx_static; do
    ! readelf -d "$program" | grep -q 'libmeshalloc' || fail "$program links libmeshalloc.so, not the archive"
  done
  for program in c_shared cxx_shared c_static cxx_static; do run_program "$program" "./$program"; done
  ;;
find-package)
  install_prefix
  for wanted in "$version" "$major.0"; do
    rm -rf consumer
    "$cmake" -S "$here/consumer" -B consumer -DCMAKE_PREFIX_PATH="$prefix" -DPROGRAMS_DIR="$here" \
      -DMESHALLOC_WANTED_VERSION="$wanted" >consumer.log 2>&1 ||
      { cat consumer.log >&2; fail "find_package(meshalloc $wanted) failed"; }
    grep -F -- "-- meshalloc $version from $lib/cmake/meshalloc" consumer.log >/dev/null ||
      { cat consumer.log >&2; fail "find_package(meshalloc $wanted) did not find the installed package"; }
  done
  "$cmake" --build consumer >build.log 2>&1 || { cat build.log >&2; fail "building the CMake consumer failed"; }
  for program in c_static cxx_static; do
    ! readelf -d "consumer/$program" | grep -q 'libmeshalloc' ||
      fail "$program links libmeshalloc.so, not meshalloc::meshalloc-static's archive"
  done
  for program in c_shared cxx_shared c_static cxx_static; do run_program "$program" "consumer/$program"; done
  # The version file: a major version the package is not must be refused.
  rm -rf refused
  if "$cmake" -S "$here/consumer" -B refused -DCMAKE_PREFIX_PATH="$prefix" -DPROGRAMS_DIR="$here" \
    -DMESHALLOC_WANTED_VERSION=$((major + 1)).0 >refused.log 2>&1; then
    fail "find_package(meshalloc $((major + 1)).0) accepted version $version"
  fi
  step "find_package(meshalloc $((major + 1)).0) refused, as it should be"
  ;;
plain)
  install_prefix
  cc -o c_plain "$here/program.c" -I "$prefix/include" -L "$lib" -lmeshalloc || fail "cc -lmeshalloc failed"
  c++ -std=c++17 -o cxx_plain "$here/program.cc" -I "$prefix/include" -L "$lib" -lmeshalloc ||
    fail "c++ -lmeshalloc failed"
  for program in c_plain cxx_plain; do
    readelf -d "$program" | grep -q "NEEDED.*\[libmeshalloc.so.$major\]" ||
      fail "$program does not need libmeshalloc.so.$major (the SONAME)"
    run_program "$program" env LD_LIBRARY_PATH="$lib" "./$program"
  done
  ;;
preload)
  install_prefix
  cc -o preload_probe "$here/preload_probe.c" -ldl || fail "building preload_probe failed"
  # ld.so only warns about a library it cannot preload, and the program still succeeds: the
  # output must be empty as well.
  output=$(LD_PRELOAD=$lib/libmeshalloc.so /bin/true 2>&1) || fail "LD_PRELOAD=... /bin/true failed: $output"
  [[ -z $output ]] || fail "LD_PRELOAD=$lib/libmeshalloc.so /bin/true printed: $output"
  step "LD_PRELOAD=$lib/libmeshalloc.so /bin/true: ok"
  run_program "preload_probe" env LD_PRELOAD="$lib/libmeshalloc.so" ./preload_probe
  if ./preload_probe >/dev/null 2>&1; then fail "preload_probe succeeds without LD_PRELOAD: it checks nothing"; fi
  ;;
cli)
  install_prefix
  # A required module missing (python3 -S -E: no site-packages, no PYTHONPATH): one line, status 1.
  python=/usr/bin/python3
  [[ -x $python ]] || python=$(command -v python3) || { echo "no python3"; exit 77; }
  status=0
  output=$("$python" -S -E "$prefix/bin/meshalloc" --version 2>&1) || status=$?
  [[ $status -eq 1 ]] || fail "without rich and psutil: status $status, not 1 ($output)"
  [[ $(printf '%s\n' "$output" | wc -l) -eq 1 && $output == *"rich"* && $output == *"apt-get install"* ]] ||
    fail "without rich and psutil, not one line naming them: $output"
  step "missing modules: $output"
  # The system python3 with the modules the CLI needs and nothing of the project's: the
  # project's .venv only lends its site-packages directory (rich, psutil) through PYTHONPATH.
  venv_python=$source_tree/.venv/bin/python
  modules=""
  if [[ -x $venv_python ]]; then
    modules=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  fi
  if PYTHONPATH=$modules "$python" -c 'import rich, psutil' 2>/dev/null; then
    export PYTHONPATH=$modules
    runner=("$prefix/bin/meshalloc")
    [[ $python == /usr/bin/python3 ]] || runner=("$python" "$prefix/bin/meshalloc")
  elif [[ -x $venv_python ]]; then
    step "the system python3 cannot use the .venv's modules; running the launcher with $venv_python"
    runner=("$venv_python" "$prefix/bin/meshalloc")
  else
    echo "no Python with rich and psutil to run the installed CLI"
    exit 77
  fi
  unset MESHALLOC_ROOT MESHALLOC_BUILD_DIR
  output=$("${runner[@]}" --version 2>&1) || fail "meshalloc --version failed: $output"
  [[ $output == "meshalloc $version" ]] || fail "meshalloc --version printed '$output'"
  step "meshalloc --version: $output"
  output=$("${runner[@]}" allocators 2>&1) || fail "meshalloc allocators failed: $output"
  grep -q "$lib/meshalloc/src/libmeshalloc.so\|$lib/libmeshalloc.so.$major" <<<"$output" ||
    fail "meshalloc allocators does not use the installed library: $output"
  step "meshalloc allocators lists the installed libmeshalloc.so"
  output=$(COLUMNS=200 "${runner[@]}" run --allocator meshalloc --no-figure --no-cgroup --out "$work/out" \
    -- /bin/sh -c 'echo hello' 2>&1) || fail "meshalloc run --allocator meshalloc failed: $output"
  [[ $output == *hello* ]] || fail "meshalloc run did not run the command: $output"
  step "meshalloc run --allocator meshalloc -- sh -c 'echo hello': ok"
  ;;
deb)
  command -v dpkg-deb >/dev/null || { echo "dpkg-deb is not installed"; exit 77; }
  command -v dpkg-shlibdeps >/dev/null || { echo "dpkg-shlibdeps (dpkg-dev) is not installed"; exit 77; }
  cpack=$(dirname "$cmake")/cpack
  [[ -x $cpack ]] || cpack=cpack
  "$cpack" --config "$build/CPackConfig.cmake" -G DEB -B "$work/deb" >"$work/cpack.log" 2>&1 ||
    { cat "$work/cpack.log" >&2; fail "cpack -G DEB failed"; }
  debs=("$work"/deb/meshalloc_*.deb)
  [[ -f ${debs[0]} ]] || fail "cpack wrote no meshalloc_*.deb"
  deb=${debs[0]}
  step "built $(basename "$deb")"
  [[ $(dpkg-deb -f "$deb" Package) == meshalloc ]] || fail "package name is not meshalloc"
  [[ $(dpkg-deb -f "$deb" Version) == "$version" ]] || fail "package version is not $version"
  depends=$(dpkg-deb -f "$deb" Depends)
  [[ $depends == *libc6* && $depends == *python3* ]] || fail "Depends lacks libc6 or python3: $depends"
  contents=$(dpkg-deb -c "$deb")
  # The libraries in /usr/lib or /usr/lib/<multiarch>; the rest in the usual places.
  for file in "usr/lib/\(.*/\)\?libmeshalloc.so.$version" "usr/lib/\(.*/\)\?libmeshalloc.so.$major " \
    "usr/lib/\(.*/\)\?libmeshalloc.so " "usr/lib/\(.*/\)\?libmeshalloc.a" "usr/include/meshalloc.h" \
    "usr/lib/\(.*/\)\?pkgconfig/meshalloc.pc" "usr/lib/\(.*/\)\?cmake/meshalloc/meshallocConfig.cmake" \
    "usr/bin/meshalloc" "usr/share/doc/meshalloc/options.md" "usr/share/man/man3/meshalloc.3"; do
    grep -q "\./$file" <<<"$contents" || fail "the package lacks /$file"
  done
  step "files in /usr/lib, /usr/include, /usr/bin, /usr/share/doc/meshalloc, /usr/share/man"
  dpkg-deb -x "$deb" "$work/root"
  pc=$(find "$work/root" -name meshalloc.pc)
  grep -qx 'prefix=/usr' "$pc" || fail "the package's meshalloc.pc does not say prefix=/usr: $(cat "$pc")"
  # ldconfig after installing and removing (CPack writes postinst/postrm or a triggers file).
  dpkg-deb -e "$deb" "$work/control"
  grep -qs ldconfig "$work/control/postinst" "$work/control/triggers" || fail "the package never runs ldconfig"
  step "meshalloc.pc says prefix=/usr; ldconfig runs on install"
  ;;
*)
  fail "unknown case (files pkg-config find-package plain preload cli deb)"
  ;;
esac
step "passed"
