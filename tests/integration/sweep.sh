#!/usr/bin/env bash
# A sweep of real programs under meshalloc (stress-long, `make stress`): each command runs once
# without the preload and once with it, and the two outputs must be identical. CTest runs it
# under mesh-stress-like settings (a mesh pass every millisecond, no CPU budget) for 2y, 1y and
# 0y, so the programs get meshed while they work. Commands whose program is not installed are
# skipped one by one; the test is skipped only if none ran.
source "$(dirname "$0")/lib.sh"
require_cmd python3 md5sum

ran=0
skipped=()

# sweep NAME PROGRAM SCRIPT : runs SCRIPT with bash -c (so every process of its pipeline is
# preloaded) unless PROGRAM is missing, and compares its output with the unpreloaded run's.
sweep() {
  local name=$1 program=$2 script=$3 expected actual
  if ! command -v "$program" >/dev/null 2>&1; then
    skipped+=("$name")
    return 0
  fi
  expected=$(bash -c "$script" 2>&1 | md5sum) || fail "$name: the reference run failed"
  actual=$(preloaded bash -c "$script" 2>&1 | md5sum) || fail "$name: failed under meshalloc"
  expect_eq "$name output" "$expected" "$actual"
  ran=$((ran + 1))
}

# Deterministic input: 400,000 lines of 1-11 random numbers.
python3 - "$WORK/lines.txt" <<'PY'
import random, sys
rng = random.Random(1)
with open(sys.argv[1], "w") as out:
    for _ in range(400_000):
        out.write(" ".join(str(rng.randrange(10**9)) for _ in range(rng.randrange(1, 12))) + "\n")
PY
LINES=$WORK/lines.txt
SRC=$(cd "$(dirname "$0")/../.." && pwd)

sweep python-json python3 "python3 -c '
import json, random
rng = random.Random(2)
data = [{str(i): [rng.random() for _ in range(rng.randrange(20))], \"k\" * rng.randrange(100): i}
        for i in range(60000)]
for _ in range(3):
    text = json.dumps(data)
    data = json.loads(text)
    data = [x for x in data if rng.random() < 0.8] + data[:5000]
print(len(text), len(data))'"
sweep python-threads python3 "python3 -c '
import random, threading
totals = [0] * 8
def work(i):
    rng, d = random.Random(i), {}
    for n in range(150000):
        d[rng.randrange(20000)] = \"x\" * rng.randrange(1, 300)
        if n % 7 == 0:
            d.pop(rng.randrange(20000), None)
    totals[i] = sum(len(v) for v in d.values())
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(totals)'"
sweep python-malloc python3 "PYTHONMALLOC=malloc python3 '$SRC/tests/integration/alloc_heavy.py'"
sweep perl-hash perl "perl -e 'srand(3); my %h; for (1..400000) { \$h{int(rand(1e6))} = q(y) x int(rand(200));
  delete \$h{int(rand(1e6))} } my \$s = 0; \$s += length(\$h{\$_}) for sort keys %h; print \"\$s\\n\"'"
sweep sort-parallel sort "sort --parallel=2 -S 8M '$LINES' | md5sum"
sweep sort-numeric sort "sort -n -k2 '$LINES' | tail -3"
sweep xz xz "xz -T2 -3 -c '$LINES' | xz -d -T2 | md5sum"
sweep zstd zstd "zstd -T2 -q -c '$LINES' | zstd -d -q | md5sum"
cat >"$WORK/churn.sql" <<'SQL'
CREATE TABLE t (a, b);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000)
  INSERT INTO t SELECT x, substr(hex(x * x * 7919), 1, 1 + x % 40) || printf('%.*c', x % 60, 'q') FROM c;
CREATE INDEX i ON t (b);
DELETE FROM t WHERE a % 3 = 0;
SELECT count(*), sum(length(b)) FROM t;
VACUUM;
SELECT count(DISTINCT b) FROM t;
SQL
sweep sqlite sqlite3 "sqlite3 :memory: < '$WORK/churn.sql'"
sweep git-log git "git -C '$SRC' log -p --stat -n 200 2>/dev/null | md5sum"
sweep ruby ruby "ruby -e 'srand(4); a = []; 300000.times { |i| a << (\"s\" * rand(300));
  a.delete_at(rand(a.size)) if i % 3 == 0 }; puts a.map(&:size).sum'"
sweep node node "node -e 'const m = new Map(); let s = 0;
  for (let i = 0; i < 300000; i++) m.set(i % 50000, \"z\".repeat(i % 400));
  for (const v of m.values()) s += v.length; console.log(s)'"
sweep tcl tclsh "tclsh <<< 'set d [dict create]; for {set i 0} {\$i < 200000} {incr i} {
  dict set d [expr {\$i % 30000}] [string repeat x [expr {\$i % 250}]] }; puts [dict size \$d]'"
sweep g++ g++ "g++ -std=c++20 -O1 -I'$SRC/src' -c '$SRC/src/heap/heap.cc' -o '$WORK/heap.\$\$.o' &&
  md5sum < '$WORK/heap.\$\$.o'"
sweep clang-format clang-format "cat '$SRC'/src/mesh/*.cc | clang-format --style=file:'$SRC/.clang-format' | md5sum"
sweep jq jq "python3 -c 'import json; print(json.dumps([{\"a\": i, \"b\": [str(j) for j in range(i % 30)]}
  for i in range(50000)]))' | jq -c 'map(select(.a % 3 == 0)) | map(.b | length) | add'"

((${#skipped[@]} == 0)) || log "not installed, skipped: ${skipped[*]}"
((ran > 0)) || skip "none of the swept programs is installed"
log "ok: $ran programs gave the same output with and without meshalloc"
