#!/usr/bin/env bash
# Thread scaling: memory (PSS) at the end of bench/thread_scaling.cc's retaining workload for
# a list of thread counts, under glibc, jemalloc, mimalloc, tcmalloc and meshalloc (meshing on:
# 2y, the default; meshing off: 0n). Prints a Markdown table (PSS in MiB and PSS/live per
# allocator and thread count), the least-squares slope of PSS against threads in MiB per thread
# with R^2 for every allocator, and whether meshalloc stays within 2x the live bytes at 48
# threads. Writes raw runs, the summary (TSV + Markdown) and a figure (PNG + SVG) to
# results/thread-scaling/. See docs/thread-scaling.md.
#
#   bench/thread_scaling.sh            # T = 1 8 16 32 48, 3 repetitions (about 3 minutes)
#   bench/thread_scaling.sh --quick    # T = 1 8 16, 1 repetition (seconds)
#   bench/thread_scaling.sh --study    # T = 1 6 12 ... 48, the thread-scaling study's grid
#
# Environment:
#   SCALING_THREADS     thread counts to run                  (default "1 8 16 32 48")
#   SCALING_REPEAT      repetitions; medians are reported      (default 3; quick: 1)
#   SCALING_ALLOCATORS  allocator names to run (default: all installed of glibc jemalloc mimalloc
#                       tcmalloc meshalloc-2y meshalloc-0n)
#   SCALING_ARGS        extra arguments for every run, e.g. "--seed 7" or "--compact"
#   SCALING_TIMEOUT     seconds before one run is killed and counted as failed (default 300)
#   SCALING_OUT         output directory                        (default results/thread-scaling)
#   BUILD_DIR           build tree with bench/thread_scaling and src/libmeshalloc.so
#                                                                (default build/release)
#   MESHALLOC_LIB       the meshalloc library to preload  (default $BUILD_DIR/src/libmeshalloc.so)
#   JEMALLOC_LIB MIMALLOC_LIB TCMALLOC_LIB   override where the comparison allocators are found
#   PYTHON              interpreter for the summary and figure  (default .venv/bin/python)
# Other MESHALLOC_* variables in the environment reach both meshalloc configurations.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

die() { echo "bench/thread_scaling.sh: $*" >&2; exit 1; }
note() { echo "bench/thread_scaling.sh: $*" >&2; }

QUICK=0 STUDY=0
for arg in "$@"; do
  case $arg in
    --quick) QUICK=1 ;;
    --study) STUDY=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $arg (try --help)" ;;
  esac
done

if [[ -n ${SCALING_THREADS:-} ]]; then THREAD_LIST=$SCALING_THREADS
elif ((STUDY)); then THREAD_LIST="1 6 12 18 24 30 36 42 48"
elif ((QUICK)); then THREAD_LIST="1 8 16"
else THREAD_LIST="1 8 16 32 48"; fi
if ((QUICK)); then REPEAT=${SCALING_REPEAT:-1}; else REPEAT=${SCALING_REPEAT:-3}; fi
BUILD_DIR=${BUILD_DIR:-build/release}
[[ $BUILD_DIR == /* ]] || BUILD_DIR=$ROOT/$BUILD_DIR
BIN=$BUILD_DIR/bench/thread_scaling
MESHALLOC_LIB=${MESHALLOC_LIB:-$BUILD_DIR/src/libmeshalloc.so}
OUT=${SCALING_OUT:-results/thread-scaling}
TIMEOUT=${SCALING_TIMEOUT:-300}
EXTRA_ARGS=${SCALING_ARGS:-}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3

[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "SCALING_REPEAT must be a positive integer"
for t in $THREAD_LIST; do [[ $t =~ ^[1-9][0-9]*$ ]] || die "SCALING_THREADS: '$t' is not a thread count"; done
[[ -x $BIN ]] || die "no $BIN (run 'make release' or set BUILD_DIR)"

# ---------------------------------------------------------------------------------------------
# Allocators: name, preload library, extra environment.
# shellcheck source=bench/allocators.sh
source "$(dirname "${BASH_SOURCE[0]}")/allocators.sh"
wanted() { [[ -z ${SCALING_ALLOCATORS:-} || " $SCALING_ALLOCATORS " == *" $1 "* ]]; }
add_comparison_allocators wanted
SNAPSHOT_DIR=$(mktemp -d)
trap 'rm -rf "$SNAPSHOT_DIR"' EXIT
if [[ -f $MESHALLOC_LIB ]]; then
  # Every run preloads one snapshot of the library, so a rebuild during the run (other work in
  # the same tree) cannot mix two versions in one table.
  MESHALLOC_BUILT=$(date -r "$MESHALLOC_LIB" '+%F %T' 2>/dev/null)
  cp "$MESHALLOC_LIB" "$SNAPSHOT_DIR/libmeshalloc.so" || die "cannot copy $MESHALLOC_LIB"
  MESHALLOC_SHA=$(sha256sum "$SNAPSHOT_DIR/libmeshalloc.so" | cut -c1-12)
  SNAPSHOT_LIB=$SNAPSHOT_DIR/libmeshalloc.so
  wanted meshalloc-2y && add_alloc meshalloc-2y "$SNAPSHOT_LIB" "MESHALLOC_CONFIG=2y"
  wanted meshalloc-0n && add_alloc meshalloc-0n "$SNAPSHOT_LIB" "MESHALLOC_CONFIG=0n"
else
  SKIPPED+=("meshalloc ($MESHALLOC_LIB missing)")
fi
((${#ALLOC_NAMES[@]})) || die "no allocators to run"
for skipped in "${SKIPPED[@]}"; do note "skipping $skipped"; done

# The meshalloc configurations must really be what their names say (an environment variable
# such as MESHALLOC_MESH set by the caller would override MESHALLOC_CONFIG).
for i in "${!ALLOC_NAMES[@]}"; do
  [[ ${ALLOC_NAMES[$i]} == meshalloc-* ]] || continue
  # shellcheck disable=SC2086  # the environment list is split on purpose
  shown=$(env ${ALLOC_ENVS[$i]} MESHALLOC_SHOW_OPTIONS=1 LD_PRELOAD="${ALLOC_LIBS[$i]}" "$BIN" \
          --threads 1 --rounds 1 --objects 10 --settle-ms 0 2>&1 >/dev/null)
  want_mesh=$([[ ${ALLOC_NAMES[$i]} == *y ]] && echo true || echo false)
  want_random=${ALLOC_NAMES[$i]: -2:1}
  mesh=$(sed -n 's/^ *mesh = //p' <<<"$shown" | head -1)
  random=$(sed -n 's/^ *randomize = //p' <<<"$shown" | head -1)
  if [[ -n $mesh && ( $mesh != "$want_mesh" || $random != "$want_random" ) ]]; then
    die "${ALLOC_NAMES[$i]} runs with mesh=$mesh randomize=$random (is MESHALLOC_MESH/RANDOMIZE set?)"
  fi
done

# ---------------------------------------------------------------------------------------------
# Runs: thread counts in the outer loop, repetitions next, allocators interleaved innermost so
# that slow drifts of the machine touch every allocator alike.
mkdir -p "$OUT" || die "cannot create $OUT"
stamp=$(date +%Y%m%d-%H%M%S)
BASE=$OUT/$stamp$([[ $QUICK == 1 ]] && echo -quick)
RAW=$BASE-raw.tsv
printf 'allocator\tthreads\trep\tstatus\tlive_bytes\tpss_bytes\tpte_bytes\tmappings\tseconds\tbase_pss_bytes\tline\n' >"$RAW"
note "threads: $THREAD_LIST; $REPEAT repetition(s); allocators: ${ALLOC_NAMES[*]}"
LOAD_START=$(cut -d" " -f1-3 /proc/loadavg 2>/dev/null)
errlog=$SNAPSHOT_DIR/stderr
field() { grep -o "\<$1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
failures=0
for t in $THREAD_LIST; do
  for ((rep = 1; rep <= REPEAT; rep++)); do
    progress="T=$t [$rep/$REPEAT]"
    for i in "${!ALLOC_NAMES[@]}"; do
      alloc=${ALLOC_NAMES[$i]}
      preload=()
      [[ -n ${ALLOC_LIBS[$i]} ]] && preload=(LD_PRELOAD="${ALLOC_LIBS[$i]}")
      # shellcheck disable=SC2086  # environment and argument lists are split on purpose
      line=$(env ${ALLOC_ENVS[$i]} "${preload[@]}" timeout "$TIMEOUT" "$BIN" --threads "$t" \
             --rounds 5 --objects 10000 --keep-percent 10 --min 16 --max 1024 --seed 1 $EXTRA_ARGS 2>"$errlog")
      rc=$?
      pss=$(field pss_bytes "$line")
      if ((rc == 0)) && [[ -n $pss && $pss -gt 0 ]]; then
        status=ok
        progress+=" $alloc=$(awk -v p="$pss" 'BEGIN { printf "%.1fMiB", p / 1048576 }')"
      else
        status=$([[ $rc == 124 ]] && echo timeout || echo "exit$rc")
        progress+=" $alloc=$status"
        failures=$((failures + 1))
        note "T=$t under $alloc failed ($status): $(head -c 300 "$errlog" | tr '\n' ' ')"
      fi
      printf '%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$alloc" "$t" "$rep" "$status" \
        "$(field live_bytes "$line")" "$pss" "$(field pte_bytes "$line")" "$(field mappings "$line")" \
        "$(field seconds "$line")" "$(field base_pss_bytes "$line")" "$line" >>"$RAW"
    done
    note "$progress"
  done
done

# ---------------------------------------------------------------------------------------------
# Summary and figure.
{
  echo "- machine: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs," \
       "$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)," \
       "page size $(getconf PAGESIZE)"
  libtree=$(dirname "$MESHALLOC_LIB")
  echo "- meshalloc: $MESHALLOC_LIB, built ${MESHALLOC_BUILT:-?} from" \
       "$(git -C "$libtree" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$libtree" diff --quiet HEAD -- src 2>/dev/null || echo ' + uncommitted src/ changes')," \
       "sha256 ${MESHALLOC_SHA:-?} (one snapshot preloaded for every run)"
  for i in "${!ALLOC_NAMES[@]}"; do
    [[ -n ${ALLOC_LIBS[$i]} && ${ALLOC_NAMES[$i]} != meshalloc-* ]] || continue
    pkg=$(dpkg -S "$(readlink -f "${ALLOC_LIBS[$i]}")" 2>/dev/null | cut -d: -f1 | head -1)
    ver=$([[ -n $pkg ]] && dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null)
    echo "- ${ALLOC_NAMES[$i]}: ${ALLOC_LIBS[$i]}${ver:+ ($pkg $ver)}"
  done
  echo "- glibc: $(ldd --version 2>/dev/null | head -1)"
  echo "- workload: --rounds 5 --objects 10000 --keep-percent 10 --min 16 --max 1024 --seed 1${EXTRA_ARGS:+ $EXTRA_ARGS}"
  for skipped in "${SKIPPED[@]}"; do echo "- skipped: $skipped"; done
  echo "- load average (1/5/15 min) at start: ${LOAD_START:-?}, at end: $(cut -d" " -f1-3 /proc/loadavg 2>/dev/null)"
  echo "- raw runs: $RAW"
} >"$BASE-env.txt"

"$PYTHON" - "$RAW" "$BASE" "$REPEAT" "$QUICK" "${ALLOC_NAMES[*]}" <<'PY'
import csv, math, statistics, sys

raw, base, repeat, quick, allocs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5].split()
MiB = 1024.0 * 1024.0
runs = {}      # (alloc, T) -> list of rows
failed = {}
with open(raw, newline="") as f:
    for row in csv.DictReader(f, delimiter="\t"):
        key = (row["allocator"], int(row["threads"]))
        if row["status"] == "ok":
            runs.setdefault(key, []).append(row)
        else:
            failed[key] = failed.get(key, 0) + 1
threads = sorted({t for (_, t) in list(runs) + list(failed)})

def med(key, col):
    values = [float(r[col]) for r in runs.get(key, []) if r[col] not in ("", None)]
    return statistics.median(values) if values else None

live = {}      # T -> live bytes (deterministic: the same for every allocator)
live_disagree = []
for t in threads:
    seen = {int(r["live_bytes"]) for a in allocs for r in runs.get((a, t), [])}
    if seen:
        live[t] = min(seen)
    if len(seen) > 1:
        live_disagree.append(t)

def fit(xs, ys):
    """Least squares y = a + b x; returns (slope, intercept, R^2) or None."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    b = sxy / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return b, a, r2

pss = {(a, t): med((a, t), "pss_bytes") for a in allocs for t in threads}
summary_rows = []
md = []
title = "thread scaling" + (" (quick mode)" if quick else "")
md.append(f"# meshalloc {title}: memory at the end of the retaining workload")
md.append("")
md.append(f"Median over {repeat} repetition(s) of the PSS (MiB) after every thread has exited, and in")
md.append("parentheses PSS divided by the live bytes (the requested sizes of the objects still held).")
md.append("Each thread allocates 5 rounds x 10,000 objects of 16-1024 B and keeps a random 10% of them.")
md.append("meshalloc-2y = meshing on, randomisation 2 (the default); meshalloc-0n = meshing off.")
md.append("")
header = "| allocator | " + " | ".join(f"T={t}" for t in threads) + " |"
md.append(header)
md.append("|---|" + "---:|" * len(threads))
md.append("| live bytes | " + " | ".join(f"{live[t] / MiB:.1f}" if t in live else "-" for t in threads) + " |")
for a in allocs:
    cells = []
    for t in threads:
        p = pss[(a, t)]
        if p is None:
            cells.append("FAIL" if failed.get((a, t)) else "-")
            continue
        c = f"{p / MiB:.1f} ({p / live[t]:.2f}x)" if t in live else f"{p / MiB:.1f}"
        if failed.get((a, t)):
            c += f" ({failed[(a, t)]} failed)"
        cells.append(c)
        summary_rows.append([a, t, live.get(t, ""), int(p), f"{p / live[t]:.4f}" if t in live else "",
                             int(med((a, t), "pte_bytes") or 0), int(med((a, t), "mappings") or 0),
                             f"{med((a, t), 'seconds'):.4f}", len(runs[(a, t)]), failed.get((a, t), 0)])
    md.append(f"| {a} | " + " | ".join(cells) + " |")
md.append("")

# Slopes: PSS (MiB) against threads, least squares over the medians.
md.append("Least-squares fit of PSS (MiB) against the thread count: slope in MiB per thread, with R^2;")
md.append("the live-bytes row is the workload's own growth, so slope - live slope is the allocator's")
md.append("overhead per thread.")
md.append("")
md.append("| allocator | slope MiB/thread | intercept MiB | R^2 | overhead MiB/thread |")
md.append("|---|---:|---:|---:|---:|")
slopes = {}
lt = [t for t in threads if t in live]
live_fit = fit(lt, [live[t] / MiB for t in lt])
if live_fit:
    md.append(f"| live bytes | {live_fit[0]:.3f} | {live_fit[1]:.2f} | {live_fit[2]:.4f} | - |")
for a in allocs:
    ts = [t for t in threads if pss[(a, t)] is not None]
    f_ = fit(ts, [pss[(a, t)] / MiB for t in ts])
    slopes[a] = f_
    if f_:
        over = f"{f_[0] - live_fit[0]:.3f}" if live_fit else "-"
        md.append(f"| {a} | {f_[0]:.3f} | {f_[1]:.2f} | {f_[2]:.4f} | {over} |")
    else:
        md.append(f"| {a} | - | - | - | - |")
md.append("")

# Page tables and mappings at the largest thread count: meshing costs both.
tmax = max(threads) if threads else None
if tmax is not None:
    md.append(f"At T={tmax}: page tables (VmPTE), mappings (lines of /proc/self/maps) and wall time of the")
    md.append("threaded part (medians).")
    md.append("")
    md.append("| allocator | PSS MiB | PSS/live | VmPTE KiB | mappings | seconds |")
    md.append("|---|---:|---:|---:|---:|---:|")
    for a in allocs:
        p = pss[(a, tmax)]
        if p is None:
            md.append(f"| {a} | - | - | - | - | - |")
            continue
        md.append(f"| {a} | {p / MiB:.1f} | {p / live[tmax]:.2f} | {med((a, tmax), 'pte_bytes') / 1024:.0f} | "
                  f"{med((a, tmax), 'mappings'):.0f} | {med((a, tmax), 'seconds'):.3f} |")
    md.append("")

# The interim target.
check_alloc = "meshalloc-2y" if "meshalloc-2y" in allocs else next((a for a in allocs if a.startswith("meshalloc")), None)
if check_alloc is None:
    verdict = "meshalloc PSS <= 2x live at 48 threads: not measured (meshalloc not run)"
elif 48 not in threads or pss.get((check_alloc, 48)) is None:
    verdict = f"meshalloc PSS <= 2x live at 48 threads: not measured (no successful {check_alloc} run at T=48)"
else:
    r = pss[(check_alloc, 48)] / live[48]
    verdict = (f"meshalloc PSS <= 2x live at 48 threads: {'holds' if r <= 2.0 else 'does not hold'} "
               f"({check_alloc}: {pss[(check_alloc, 48)] / MiB:.1f} MiB for {live[48] / MiB:.1f} MiB live, "
               f"{r:.2f}x; the issue quotes upstream Mesh at 4.2x, glibc at 2.15x)")
md.append(f"**{verdict}**")
md.append("")
if live_disagree:
    md.append(f"WARNING: live bytes differ between allocators at T={live_disagree} (the workload should be deterministic).")
    md.append("")
with open(base + "-env.txt") as f:
    md.extend(line.rstrip("\n") for line in f)
md.append(f"- figure: {base}.png, {base}.svg")

with open(base + ".md", "w") as f:
    f.write("\n".join(md) + "\n")
with open(base + ".tsv", "w") as f:
    f.write("allocator\tthreads\tlive_bytes\tpss_bytes\tratio\tpte_bytes\tmappings\tseconds\truns\tfailed\n")
    for row in summary_rows:
        f.write("\t".join(str(x) for x in row) + "\n")
    f.write("\n# fit of PSS MiB against threads\nallocator\tslope_mib_per_thread\tintercept_mib\tr2\n")
    if live_fit:
        f.write(f"live\t{live_fit[0]:.4f}\t{live_fit[1]:.4f}\t{live_fit[2]:.5f}\n")
    for a in allocs:
        if slopes[a]:
            f.write(f"{a}\t{slopes[a][0]:.4f}\t{slopes[a][1]:.4f}\t{slopes[a][2]:.5f}\n")

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except Exception as e:  # the table is the result; the figure is a convenience
    print(f"thread_scaling.sh: no figure (matplotlib unavailable: {e})", file=sys.stderr)
else:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    markers = "osD^v<>ph*"
    for i, a in enumerate(allocs):
        ts = [t for t in threads if pss[(a, t)] is not None]
        if not ts:
            continue
        label = a + (f"  ({slopes[a][0]:.2f} MiB/thread)" if slopes[a] else "")
        ax.plot(ts, [pss[(a, t)] / MiB for t in ts], marker=markers[i % len(markers)], label=label)
    if lt:
        ax.plot(lt, [live[t] / MiB for t in lt], color="black", linestyle="--", label="live bytes")
        ax.plot(lt, [2 * live[t] / MiB for t in lt], color="grey", linestyle=":", label="2x live (target)")
    ax.set_xlabel("threads")
    ax.set_ylabel("PSS at the end (MiB)")
    ax.set_title("Thread scaling: 5 x 10,000 objects of 16-1024 B per thread, 10% kept")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=120)
    fig.savefig(base + ".svg")
PY
rc=$?
((rc == 0)) || die "summary failed (raw runs in $RAW)"
suffix=$([[ $QUICK == 1 ]] && echo -quick)
for ext in md tsv png svg; do
  [[ -f $BASE.$ext ]] && cp "$BASE.$ext" "$OUT/latest$suffix.$ext"
done
rm -f "$BASE-env.txt"
cat "$BASE.md"
echo
echo "written: $BASE.md $BASE.tsv $BASE.png $BASE.svg $RAW"
if ((failures)); then
  note "$failures run(s) failed (see $RAW)"
  exit 1
fi
exit 0
