#!/usr/bin/env bash
# sqlite3: create a table, insert 100k rows in one transaction, index it, query aggregates;
# the answers are known in closed form and must also match a run without the preload.
source "$(dirname "$0")/lib.sh"
require_cmd sqlite3

cat >"$WORK/script.sql" <<'SQL'
PRAGMA journal_mode = WAL;
CREATE TABLE t (id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, payload BLOB);
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
INSERT INTO t (id, grp, name, payload)
  SELECT i, i % 97, printf('name-%08d-%s', i, substr('abcdefghijklmnopqrstuvwxyz', 1 + i % 26)),
         zeroblob(i % 300)
  FROM n;
COMMIT;
CREATE INDEX t_name ON t (name);
CREATE INDEX t_grp ON t (grp, id);
SELECT count(*), sum(id), sum(length(payload)) FROM t;
SELECT count(DISTINCT grp), max(name) FROM t;
SELECT grp, count(*), sum(id) FROM t WHERE grp IN (0, 13, 96) GROUP BY grp ORDER BY grp;
DELETE FROM t WHERE id % 3 = 0;
UPDATE t SET name = name || '-updated' WHERE id % 5 = 0;
VACUUM;
SELECT count(*), sum(id), count(*) FILTER (WHERE name LIKE '%-updated') FROM t;
PRAGMA integrity_check;
SQL

run() { # run DB-FILE [preloaded]
  local db=$1
  shift
  rm -f "$db" "$db"-wal "$db"-shm
  "$@" sqlite3 -batch -bail "$db" <"$WORK/script.sql"
}

expected=$(run "$WORK/ref.db")
actual=$(run "$WORK/test.db" preloaded) || fail "sqlite3 exited with status $?"
[[ $actual == "$expected" ]] || fail "results differ from an unpreloaded run:
--- without meshalloc
$expected
--- with meshalloc
$actual"

# Closed forms: sum 1..100000 = 5000050000; sum(i % 300) = 333 * 44850 + 5050 = 14940100;
# after deleting the 33333 multiples of 3: 66667 rows summing to 5000050000 - 1666683333,
# of which 20000 - 6666 = 13334 (multiples of 5) were renamed.
mapfile -t lines <<<"$actual"
expect_eq "journal mode" "wal" "${lines[0]}"
expect_eq "count/sum/blob bytes" "100000|5000050000|14940100" "${lines[1]}"
expect_eq "groups/max name" "97|name-00100000-efghijklmnopqrstuvwxyz" "${lines[2]}"
expect_eq "group 0" "0|1030|51503605" "${lines[3]}"
expect_eq "group 13" "13|1031|51517008" "${lines[4]}"
expect_eq "group 96" "96|1030|51502575" "${lines[5]}"
expect_eq "rows after delete" "66667|3333366667|13334" "${lines[6]}"
expect_eq "integrity" "ok" "${lines[7]}"
# No expect_meshing: SQLite keeps its data in its own page cache (large blocks), so there is
# little for meshing to do; it still runs under the mesh-stress configuration.
