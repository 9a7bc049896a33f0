#!/usr/bin/env bash
# redis-server under meshalloc on a free loopback port, driven by redis-benchmark (also
# preloaded) with SET/GET, then checked with redis-cli: a known key, DBSIZE, the statistics
# Redis reads through the exported jemalloc-style mallctl, MEMORY PURGE, and a clean shutdown.
source "$(dirname "$0")/lib.sh"
require_cmd redis-server redis-benchmark redis-cli

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

SERVER_PID=
stop_server() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
}
on_exit stop_server

PORT=
for attempt in $(seq 1 20); do
  candidate=$((20000 + RANDOM % 40000))
  port_in_use "$candidate" && continue
  LD_PRELOAD="$MESHALLOC_LIB" redis-server --port "$candidate" --bind 127.0.0.1 --save "" \
    --appendonly no --dir "$WORK" --logfile "$WORK/redis.log" --daemonize no &
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
    if [[ $(redis-cli -p "$candidate" ping 2>/dev/null) == PONG ]]; then
      PORT=$candidate
      break 2
    fi
    sleep 0.1
  done
  status=0
  wait "$SERVER_PID" || status=$?
  SERVER_PID=
  grep -q "Address already in use" "$WORK/redis.log" 2>/dev/null || {
    cat "$WORK/redis.log" >&2 || true
    fail "redis-server did not start (attempt $attempt, exit status $status)"
  }
done
[[ -n $PORT ]] || fail "no free port found for redis-server"
log "redis-server pid $SERVER_PID on 127.0.0.1:$PORT"
grep -q "$(basename "$MESHALLOC_LIB")" "/proc/$SERVER_PID/maps" ||
  fail "redis-server does not have $MESHALLOC_LIB mapped"

cli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }

bench=$(preloaded redis-benchmark -h 127.0.0.1 -p "$PORT" -n 20000 -r 10000 -d 100 -c 20 -q \
  -t set,get) || fail "redis-benchmark exited with status $?"
bench=$(tr '\r' '\n' <<<"$bench" | grep "requests per second" || true)
grep -q "SET: [0-9.]* requests per second" <<<"$bench" || fail "no SET result in: $bench"
grep -q "GET: [0-9.]* requests per second" <<<"$bench" || fail "no GET result in: $bench"
log "$(tr '\n' ' ' <<<"$bench")"
# Larger values too (other size classes; 20 KiB values are large objects for some allocators).
preloaded redis-benchmark -h 127.0.0.1 -p "$PORT" -n 2000 -r 500 -d 20000 -c 10 -q \
  -t set,lpush >/dev/null || fail "redis-benchmark (large values) exited with status $?"

expect_eq "SET" OK "$(cli set meshalloc:known value-$$)"
expect_eq "GET" "value-$$" "$(cli get meshalloc:known)"
dbsize=$(cli dbsize)
((dbsize >= 100 && dbsize <= 10600)) || fail "DBSIZE $dbsize is not plausible after the benchmark"
log "ok: DBSIZE = $dbsize"

# Redis (Debian's build is jemalloc-aware) reads allocator statistics through mallctl.
memory=$(cli info memory | tr -d '\r')
allocated=$(sed -n 's/^allocator_allocated://p' <<<"$memory")
used=$(sed -n 's/^used_memory://p' <<<"$memory")
log "used_memory=$used allocator_allocated=$allocated"
((used > 1000000)) || fail "used_memory=$used is implausible"
((allocated > 0)) || fail "allocator_allocated=$allocated: mallctl stats.allocated not answered"
expect_eq "MEMORY PURGE" OK "$(cli memory purge)"
expect_eq "GET after purge" "value-$$" "$(cli get meshalloc:known)"
cli flushall >/dev/null
expect_eq "DBSIZE after FLUSHALL" 0 "$(cli dbsize)"

# A clean shutdown: SIGTERM makes Redis exit 0 (a crash in the allocator would not).
kill -TERM "$SERVER_PID"
status=0
wait "$SERVER_PID" || status=$?
SERVER_PID=
if grep -q "meshalloc:" "$WORK/redis.log"; then fail "allocator error: $(grep meshalloc: "$WORK/redis.log")"; fi
expect_eq "redis-server exit status after SIGTERM" 0 "$status"
