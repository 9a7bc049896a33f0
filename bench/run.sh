#!/usr/bin/env bash
# Runs every allocator microbenchmark under glibc, jemalloc, tcmalloc, mimalloc and meshalloc
# (two configurations) side by side, interleaving the allocators within each repetition, and
# prints a Markdown table of median wall-clock seconds with meshalloc's ratios to mimalloc.
# The same table goes to results/microbench/ as TSV and Markdown, next to every raw run.
#
#   bench/run.sh                      # 5 repetitions, full parameters (a few minutes)
#   BENCH_QUICK=1 bench/run.sh        # smoke test: 1 repetition, small parameters (< 1 min)
#
# Environment:
#   BUILD_DIR       build tree with bench/ and src/libmeshalloc.so     (default build/release)
#   BENCH_REPEAT    repetitions, medians are taken over them            (default 5; quick: 1)
#   BENCH_QUICK     1: smaller parameters and 1 repetition
#   BENCH_THREADS   threads of the multi-threaded workloads  (default: CPUs, clamped to 2..8)
#   BENCH_ONLY      space-separated workload names to run (default: all)
#   BENCH_ALLOCATORS space-separated allocator names to run (default: all that are installed)
#   BENCH_TIMEOUT   seconds before one run is killed and counted as failed (default 300)
#   BENCH_OUT       output directory                                    (default results/microbench)
#   MESHALLOC_LIB   the meshalloc library to preload        (default $BUILD_DIR/src/libmeshalloc.so)
#   JEMALLOC_LIB MIMALLOC_LIB TCMALLOC_LIB   override where the comparison allocators are found
# Other MESHALLOC_* variables in the environment reach both meshalloc configurations.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

QUICK=${BENCH_QUICK:-0}
if [[ $QUICK == 1 ]]; then REPEAT=${BENCH_REPEAT:-1}; else REPEAT=${BENCH_REPEAT:-5}; fi
BUILD_DIR=${BUILD_DIR:-build/release}
[[ $BUILD_DIR == /* ]] || BUILD_DIR=$ROOT/$BUILD_DIR
BIN=$BUILD_DIR/bench
MESHALLOC_LIB=${MESHALLOC_LIB:-$BUILD_DIR/src/libmeshalloc.so}
OUT=${BENCH_OUT:-results/microbench}
TIMEOUT=${BENCH_TIMEOUT:-300}

die() { echo "bench/run.sh: $*" >&2; exit 1; }
note() { echo "bench/run.sh: $*" >&2; }

[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPEAT must be a positive integer"
[[ -x $BIN/churn ]] || die "no benchmarks in $BIN (run 'make release' or set BUILD_DIR)"

cpus=$(nproc 2>/dev/null || echo 2)
THREADS=${BENCH_THREADS:-$cpus}
((THREADS < 2)) && THREADS=2
[[ -z ${BENCH_THREADS:-} ]] && ((THREADS > 8)) && THREADS=8
PAIRS_THREADS=$((THREADS / 2 * 2))  # prodcons runs producer/consumer pairs

# ---------------------------------------------------------------------------------------------
# Workloads: name, kind (st = single-threaded, mt = multi-threaded), binary, full arguments,
# quick arguments. The full arguments are the programs' defaults written out for the record
# (except churn-mt, which halves churn's per-thread work to keep the run near 0.5 s).
T=$THREADS
WORKLOADS=(
  "churn         st churn        --iterations=4000000|--iterations=300000"
  "mixlife       st mixlife      --iterations=1000000|--iterations=100000"
  "bigmix        st bigmix       --iterations=600000|--iterations=30000"
  "large         st large        --iterations=5000|--iterations=300"
  "realloc       st realloc      --iterations=2000000|--iterations=200000"
  "churn-mt      mt churn        --threads=$T --iterations=2000000|--threads=$T --iterations=300000"
  "larson        mt larson       --threads=$T --iterations=30000 --generations=100|--threads=$T --iterations=10000 --generations=20"
  "prodcons      mt prodcons     --threads=$PAIRS_THREADS --iterations=4000000|--threads=$PAIRS_THREADS --iterations=300000"
  "cache-scratch mt cachescratch --threads=$T --iterations=1000 --repetitions=20000|--threads=$T --iterations=100 --repetitions=20000"
  "cache-thrash  mt cachescratch --threads=$T --iterations=1000 --repetitions=20000 --thrash=1|--threads=$T --iterations=100 --repetitions=20000 --thrash=1"
)

# ---------------------------------------------------------------------------------------------
# Allocators: name, preload library, extra environment.
# shellcheck source=bench/allocators.sh
source "$(dirname "${BASH_SOURCE[0]}")/allocators.sh"
wanted() { [[ -z ${BENCH_ALLOCATORS:-} || " $BENCH_ALLOCATORS " == *" $1 "* ]]; }
add_comparison_allocators wanted
if [[ -f $MESHALLOC_LIB ]]; then
  wanted mesh-1n && add_alloc mesh-1n "$MESHALLOC_LIB" "MESHALLOC_MESH=0 MESHALLOC_RANDOMIZE=1"
  wanted mesh-2y && add_alloc mesh-2y "$MESHALLOC_LIB" "MESHALLOC_MESH=1 MESHALLOC_RANDOMIZE=2"
else
  SKIPPED+=("meshalloc ($MESHALLOC_LIB missing)")
fi
((${#ALLOC_NAMES[@]})) || die "no allocators to run"
for skipped in "${SKIPPED[@]}"; do note "skipping $skipped"; done

# The meshalloc configurations must really be what their names say.
for i in "${!ALLOC_NAMES[@]}"; do
  [[ ${ALLOC_NAMES[$i]} == mesh-* ]] || continue
  # shellcheck disable=SC2086  # the environment list is split on purpose
  shown=$(env ${ALLOC_ENVS[$i]} MESHALLOC_SHOW_OPTIONS=1 LD_PRELOAD="${ALLOC_LIBS[$i]}" "$BIN/churn" \
          --iterations=1 --slots=1 2>&1 >/dev/null)
  want_mesh=$([[ ${ALLOC_NAMES[$i]} == *y ]] && echo true || echo false)
  want_random=${ALLOC_NAMES[$i]:5:1}
  grep -q "mesh = $want_mesh" <<<"$shown" && grep -q "randomize = $want_random" <<<"$shown" ||
    note "warning: ${ALLOC_NAMES[$i]} did not report mesh = $want_mesh, randomize = $want_random"
done

ONLY=${BENCH_ONLY:-}
SELECTED=()
for spec in "${WORKLOADS[@]}"; do
  read -r name _ <<<"$spec"
  [[ -z $ONLY || " $ONLY " == *" $name "* ]] && SELECTED+=("$spec")
done
((${#SELECTED[@]})) || die "BENCH_ONLY matched no workload"

mkdir -p "$OUT" || die "cannot create $OUT"
stamp=$(date +%Y%m%d-%H%M%S)
label=microbench-$stamp$([[ $QUICK == 1 ]] && echo -quick)
RAW=$OUT/$label-runs.tsv
TSV=$OUT/$label.tsv
MD=$OUT/$label.md
printf 'workload\tkind\tallocator\trepetition\tstatus\tseconds\tmaxrss_kb\tchecksum\tline\n' >"$RAW"

# ---------------------------------------------------------------------------------------------
# Runs: for each workload, R rounds, each round every allocator once (A B C A B C ...).
note "$REPEAT repetition(s), $THREADS threads for multi-threaded workloads$([[ $QUICK == 1 ]] && echo ', quick mode')"
note "allocators: ${ALLOC_NAMES[*]}"
LOAD_START=$(cut -d" " -f1-3 /proc/loadavg 2>/dev/null)
errlog=$(mktemp)
trap 'rm -f "$errlog"' EXIT
for spec in "${SELECTED[@]}"; do
  read -r name kind binary rest <<<"$spec"
  full=${rest%%|*} quick=${rest#*|}
  args=$([[ $QUICK == 1 ]] && echo "$quick" || echo "$full")
  for ((rep = 1; rep <= REPEAT; rep++)); do
    progress="$name [$rep/$REPEAT]"
    for i in "${!ALLOC_NAMES[@]}"; do
      alloc=${ALLOC_NAMES[$i]}
      preload=()
      [[ -n ${ALLOC_LIBS[$i]} ]] && preload=(LD_PRELOAD="${ALLOC_LIBS[$i]}")
      # shellcheck disable=SC2086  # environment and argument lists are split on purpose
      line=$(env ${ALLOC_ENVS[$i]} "${preload[@]}" timeout "$TIMEOUT" "$BIN/$binary" $args 2>"$errlog")
      rc=$?
      seconds=$(grep -o 'seconds=[0-9.]*' <<<"$line" | cut -d= -f2)
      rss=$(grep -o 'maxrss_kb=[0-9]*' <<<"$line" | cut -d= -f2)
      checksum=$(grep -o 'checksum=[0-9a-f]*' <<<"$line" | cut -d= -f2)
      if ((rc == 0)) && [[ -n $seconds ]]; then
        status=ok
        progress+=" $alloc=$seconds"
      else
        status=$([[ $rc == 124 ]] && echo timeout || echo "exit$rc")
        progress+=" $alloc=$status"
        note "$name under $alloc failed ($status): $(head -c 300 "$errlog" | tr '\n' ' ')"
      fi
      printf '%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n' "$name" "$kind" "$alloc" "$rep" "$status" \
        "${seconds:-}" "${rss:-}" "${checksum:-}" "$line" >>"$RAW"
    done
    note "$progress"
  done
done

# ---------------------------------------------------------------------------------------------
# Summary: medians per workload and allocator, meshalloc/mimalloc ratios, geometric means.
summarise() {  # summarise tsv|md
  awk -F'\t' -v format="$1" -v allocs="${ALLOC_NAMES[*]}" '
    function median(list,   n, values, i, j, t) {
      n = split(list, values, " ")
      for (i = 2; i <= n; i++) {  # insertion sort: n is the repetition count
        t = values[i] + 0
        for (j = i - 1; j >= 1 && values[j] + 0 > t; j--) values[j + 1] = values[j]
        values[j + 1] = t
      }
      if (n == 0) return ""
      return n % 2 ? values[(n + 1) / 2] : (values[n / 2] + values[n / 2 + 1]) / 2
    }
    function cell(v) { return v == "" ? "-" : sprintf("%.4f", v) }
    function ratio(a, b) { return (a == "" || b == "" || b <= 0) ? "" : a / b }
    NR == 1 { next }
    {
      key = $1 SUBSEP $3
      if (!($1 in seen)) { seen[$1] = 1; order[++nw] = $1; kind[$1] = $2 }
      if ($5 == "ok") { times[key] = times[key] " " $6; rss[key] = rss[key] " " $7
                        if ($8 != "") sums[$1] = sums[$1] (index(sums[$1], " " $8 " ") ? "" : " " $8 " ") }
      else failed[key]++
    }
    END {
      na = split(allocs, names, " ")
      for (a = 1; a <= na; a++) { if (names[a] == "mimalloc") mi = a; if (names[a] == "mesh-1n") m1 = a
                                  if (names[a] == "mesh-2y") m2 = a }
      header = "workload\tkind"
      for (a = 1; a <= na; a++) header = header "\t" names[a]
      header = header "\t1n/mimalloc\t2y/mimalloc\t1n target"
      if (format == "md") {
        n = split(header, h, "\t"); line = "|"; rule = "|"
        for (i = 1; i <= n; i++) { line = line " " h[i] " |"; rule = rule (i <= 2 ? "---|" : "---:|") }
        print line; print rule
      } else print header
      for (w = 1; w <= nw; w++) {
        name = order[w]; row = name "\t" kind[name]; complete = 1
        for (a = 1; a <= na; a++) {
          m[a] = median(times[name SUBSEP names[a]])
          c = cell(m[a])
          if (failed[name SUBSEP names[a]]) c = c " (" failed[name SUBSEP names[a]] " failed)"
          row = row "\t" c
          if (m[a] == "") complete = 0
        }
        r1 = (mi && m1) ? ratio(m[m1], m[mi]) : ""; r2 = (mi && m2) ? ratio(m[m2], m[mi]) : ""
        limit = kind[name] == "st" ? 1.3 : 1.5
        verdict = r1 == "" ? (m1 && m[m1] == "" ? "FAIL" : "-") : (r1 <= limit ? "ok (<= " limit ")" : "MISS (<= " limit ")")
        if (format == "md" && r1 != "" && r1 > limit) r1s = sprintf("**%.2f**", r1); else r1s = r1 == "" ? "-" : sprintf("%.2f", r1)
        r2s = r2 == "" ? "-" : sprintf("%.2f", r2)
        if (split(sums[name], s, " ") > 1) verdict = verdict ", CHECKSUMS DIFFER"
        row = row "\t" r1s "\t" r2s "\t" verdict
        if (format == "md") { gsub("\t", " | ", row); row = "| " row " |" }
        print row
        if (complete) { nc++; for (a = 1; a <= na; a++) logsum[a] += log(m[a]) }
        if (r1 != "") { n1++; log1 += log(r1 + 0) }
        if (r2 != "") { n2++; log2 += log(r2 + 0) }
      }
      row = "geomean\t"
      for (a = 1; a <= na; a++) row = row "\t" (nc ? sprintf("%.4f", exp(logsum[a] / nc)) : "-")
      row = row "\t" (n1 ? sprintf("%.2f", exp(log1 / n1)) : "-") "\t" (n2 ? sprintf("%.2f", exp(log2 / n2)) : "-") "\t"
      if (format == "md") { gsub("\t", " | ", row); row = "| " row " |" }
      print row
    }' "$RAW"
}

spread() {  # Markdown table: (max - min) / median per workload and allocator, in percent
  awk -F'\t' -v allocs="${ALLOC_NAMES[*]}" '
    NR == 1 { next }
    $5 == "ok" {
      key = $1 SUBSEP $3
      if (!($1 in seen)) { seen[$1] = 1; order[++nw] = $1 }
      n[key]++; v[key, n[key]] = $6 + 0
    }
    END {
      na = split(allocs, names, " ")
      line = "| workload |"; rule = "|---|"
      for (a = 1; a <= na; a++) { line = line " " names[a] " |"; rule = rule "---:|" }
      print line; print rule
      for (w = 1; w <= nw; w++) {
        row = "| " order[w] " |"
        for (a = 1; a <= na; a++) {
          key = order[w] SUBSEP names[a]; k = n[key]
          if (k < 2) { row = row " - |"; continue }
          for (i = 1; i <= k; i++) x[i] = v[key, i]
          for (i = 2; i <= k; i++) { t = x[i]; for (j = i - 1; j >= 1 && x[j] > t; j--) x[j + 1] = x[j]; x[j + 1] = t }
          med = k % 2 ? x[(k + 1) / 2] : (x[k / 2] + x[k / 2 + 1]) / 2
          row = row sprintf(" %.0f%% |", med > 0 ? 100 * (x[k] - x[1]) / med : 0)
        }
        print row
      }
    }' "$RAW"
}

{
  echo "# meshalloc microbenchmarks ($stamp$([[ $QUICK == 1 ]] && echo ', quick mode'))"
  echo
  echo "Median wall-clock seconds over $REPEAT repetition(s) (lower is better); ratios are meshalloc's"
  echo "median divided by mimalloc's. Targets for mesh-1n: <= 1.3x mimalloc single-threaded (st),"
  echo "<= 1.5x multi-threaded (mt). mesh-1n = meshing off, randomisation 1; mesh-2y = meshing on,"
  echo "randomisation 2 (the default). The geomean row covers the workloads every allocator completed."
  echo "See docs/bench.md for what each workload models."
  echo
  summarise md
  echo
  if ((REPEAT > 1)); then
    echo "Spread of the repetitions, (slowest - fastest) / median: large values mean a noisy machine."
    echo
    spread
    echo
  fi
  echo "- machine: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $cpus CPUs, Linux $(uname -r)"
  libtree=$(dirname "$MESHALLOC_LIB")  # the git checkout the library was built from
  echo "- meshalloc: $MESHALLOC_LIB, built $(date -r "$MESHALLOC_LIB" '+%F %T' 2>/dev/null) from" \
       "$(git -C "$libtree" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$libtree" diff --quiet HEAD -- src 2>/dev/null || echo ' + uncommitted src/ changes')"
  for i in "${!ALLOC_NAMES[@]}"; do
    [[ -n ${ALLOC_LIBS[$i]} && ${ALLOC_NAMES[$i]} != mesh-* ]] || continue
    pkg=$(dpkg -S "$(readlink -f "${ALLOC_LIBS[$i]}")" 2>/dev/null | cut -d: -f1 | head -1)
    ver=$([[ -n $pkg ]] && dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null)
    echo "- ${ALLOC_NAMES[$i]}: ${ALLOC_LIBS[$i]}${ver:+ ($pkg $ver)}"
  done
  echo "- glibc: $(ldd --version 2>/dev/null | head -1)"
  echo "- threads for mt workloads: $THREADS (prodcons: $PAIRS_THREADS)"
  for skipped in "${SKIPPED[@]}"; do echo "- skipped: $skipped"; done
  echo "- load average (1/5/15 min) at start: ${LOAD_START:-?}, at end: $(cut -d" " -f1-3 /proc/loadavg 2>/dev/null)"
  echo "- raw runs: $RAW"
} >"$MD"
summarise tsv >"$TSV"
cp "$MD" "$OUT/latest$([[ $QUICK == 1 ]] && echo -quick).md"
cp "$TSV" "$OUT/latest$([[ $QUICK == 1 ]] && echo -quick).tsv"

cat "$MD"
echo
echo "written: $MD $TSV $RAW"
grep -q "CHECKSUMS DIFFER" "$TSV" && note "warning: some allocators computed different checksums (see the table)"
if awk -F'\t' 'NR > 1 && $5 != "ok" { bad = 1 } END { exit !bad }' "$RAW"; then
  note "some runs failed (see $RAW)"
  exit 1
fi
exit 0
