#!/usr/bin/env bash
# Benchmark: how the database hosts grow with the number of marks they hold, as
# scripts/bench-growth.sh does for the file store and etcd: the PostgreSQL extension
# (marks are rows of fencekeeper.marks) and the Redis module (marks are keys of its
# type).
#
# Usage: scripts/bench-growth-db.sh [PG_SIZES [REDIS_SIZES]]
#   default: "1000 100000 1000000" for both (REDIS_SIZES defaults to PG_SIZES)
#
# For each size, ascending, the host is filled with first marks (token 1) on
# `bucket/objects/NNNNNNNNNN` (25-byte resources, the names bench-growth.sh uses), then
# measured at that size:
#
# * bytes per mark: PostgreSQL, pg_total_relation_size of fencekeeper.marks (heap,
#   primary key index, TOAST) after a VACUUM, and beside it the audit's bytes per
#   advance (fencekeeper.audit, on by default: a row per advance, first marks
#   included); Redis, the growth of INFO memory's used_memory since the empty server,
#   and the RDB file's bytes per mark;
# * admit p50 and p99 (µs, as the client sees it) of 2,000 admits one at a time on
#   resources drawn uniformly over the whole key space: `again`, a holder writing again
#   (its token equal to the mark: the even resources, whose mark stays 1) and `advance`
#   (a higher token than any given so far: the odd resources). PostgreSQL: pgbench
#   (-M prepared, one client, --log) running `SELECT fencekeeper.admit(...)`, each its
#   own transaction, with synchronous_commit = off (the extension's and the table's
#   work) and with the default, on (each commit waits for its WAL flush, whose mean
#   time pg_stat_wal gives: track_wal_io_timing is on). Redis: a
#   small Python client on one connection (RESP over a socket, the clock around each
#   request and its reply) sending `FENCE.SET data RESOURCE TOKEN v` (one data key for
#   every write, so that only the marks accumulate), and the server's own time per
#   call (INFO commandstats);
# * the fill: PostgreSQL, SQL calling fencekeeper.admit over generate_series, 10^6
#   admits a transaction, one connection; Redis, the FENCE.SET commands (written to a
#   file first, not timed) through `redis-cli --pipe`;
# * PostgreSQL: the VACUUM of the marks table and a restart (a fast stop, with its
#   checkpoint, after a CHECKPOINT; then the start until it accepts connections);
#   Redis: SAVE (the RDB) and a restart that loads it (the process until PING answers,
#   and the load alone from Redis's log).
#
# The PostgreSQL server and redis-server run in a scratch directory on free ports,
# with shared_preload_libraries = 'fencekeeper' and no persistence of Redis's own
# (SAVE is called explicitly), and are stopped and removed on exit. Builds and installs
# the extension (scripts/install-postgres-extension.sh) and builds the module. Needs
# PostgreSQL 15 with pgbench, redis-server and redis-cli (scripts/install-deps.sh).
# Prints Markdown tables for BENCHMARKS.md; progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
pg_sizes=${1:-"1000 100000 1000000"}
redis_sizes=${2:-$pg_sizes}
samples=2000
say() { echo "bench-growth-db: $*" >&2; }
pgbin=/usr/lib/postgresql/15/bin
[ -x "$pgbin/pgbench" ] || { echo "pgbench not found; run scripts/install-deps.sh" >&2; exit 2; }
for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || { echo "$tool not found; run scripts/install-deps.sh" >&2; exit 2; }
done
# PostgreSQL refuses to run as root: run it as its own user.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

scripts/install-postgres-extension.sh >/dev/null
cargo build --release -q --locked -p fencekeeper-redis
module=$PWD/target/release/libfencekeeper_redis.so

. scripts/lib/scratch.sh
chmod 755 "$work"
[ "$(id -u)" = 0 ] && chown postgres "$work"
pg_stop() { [ -d "$work/pg" ] && as_pg "$pgbin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true; }
trap 'pg_stop; cleanup' EXIT

ms() { date +%s%3N; }
# Numbers (µs), one a line, on stdin -> "p50 p99", as growth.rs picks them.
percentiles() {
    python3 -c '
import sys
took = sorted(float(line) for line in sys.stdin if line.strip())
at = lambda q: took[min(int(len(took) * q), len(took) - 1)]
print(f"{at(0.5):.0f} {at(0.99):.0f}")'
}
# A time from milliseconds: "840 ms", "12.3 s".
secs() { python3 -c "print(f'{$1} ms' if $1 < 10000 else f'{$1 / 1000:.1f} s')"; }
# A fill's time and its µs a mark (over the marks it added): "2130 ms (21.5 µs)".
fill_cell() { echo "$(secs "$1") ($(python3 -c "print(f'{$1 * 1000 / $2:.1f}')") µs)"; }

# ---------------------------------------------------------------- PostgreSQL
pgport=$(port)
as_pg "$pgbin/initdb" -D "$work/pg" -A trust -U bench >/dev/null
pg_start() {
    as_pg "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg.log" \
        -o "-p $pgport -k $work -c listen_addresses=127.0.0.1 -c shared_preload_libraries=fencekeeper -c track_wal_io_timing=on" start >/dev/null
    for _ in $(seq 1 30000); do
        as_pg "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$pgport" && return 0
        sleep 0.02
    done
    echo "PostgreSQL did not start: $(tail -3 "$work/pg.log")" >&2
    exit 2
}
psql() { as_pg "$pgbin/psql" -h 127.0.0.1 -p "$pgport" -U bench -d postgres -qAtX -v ON_ERROR_STOP=1 "$@"; }
pg_start
psql -c "CREATE EXTENSION fencekeeper" -c "CREATE SEQUENCE tokens START 2"
# Again: an even resource, whose mark stays 1. Advance: an odd one, a token from the
# sequence (above every mark).
cat >"$work/again.sql" <<'SQL'
\set i 2 * random(0, :half - 1)
SELECT fencekeeper.admit('bucket/objects/' || lpad(:i::text, 10, '0'), '1');
SQL
cat >"$work/advance.sql" <<'SQL'
\set i 2 * random(0, :half - 1) + 1
SELECT fencekeeper.admit('bucket/objects/' || lpad(:i::text, 10, '0'), nextval('tokens')::text);
SQL
chmod 644 "$work"/*.sql

# Admit token 1 on resources FROM..TO-1, 10^6 a transaction; every one must advance.
pg_fill() { # FROM TO
    local a=$1 b got
    while [ "$a" -lt "$2" ]; do
        b=$((a + 1000000 < $2 ? a + 1000000 : $2))
        got=$(psql -c "SELECT count(*) FILTER (WHERE fencekeeper.admit('bucket/objects/' || lpad(i::text, 10, '0'), '1'))
                       FROM generate_series($a, $((b - 1))) i")
        [ "$got" = $((b - a)) ] || { echo "fill $a..$b: $got of $((b - a)) advanced" >&2; exit 1; }
        a=$b
    done
}
# p50 and p99 (µs) of $samples admits by pgbench with SCRIPT over N marks.
pg_latency() { # SCRIPT N synchronous_commit
    rm -f "$work"/pglog.*
    as_pg env PGOPTIONS="-c synchronous_commit=$3" "$pgbin/pgbench" -n -h 127.0.0.1 -p "$pgport" -U bench \
        -M prepared -c 1 -t "$samples" -D half=$(($2 / 2)) -f "$work/$1.sql" --log --log-prefix="$work/pglog" postgres \
        >"$work/pgbench.out" 2>&1 || { echo "pgbench $1 failed:" >&2; tail -5 "$work/pgbench.out" >&2; exit 1; }
    grep -q "number of failed transactions: 0 " "$work/pgbench.out" || { tail -5 "$work/pgbench.out" >&2; exit 1; }
    [ "$(cat "$work"/pglog.* | wc -l)" = "$samples" ] || { echo "pgbench $1: not $samples transactions" >&2; exit 1; }
    cat "$work"/pglog.* | awk '{ print $3 }' | percentiles
}

have=0
for n in $pg_sizes; do
    say "PostgreSQL: filling to $n marks"
    t=$(ms); pg_fill "$have" "$n"; fill=$(($(ms) - t))
    added=$((n - have)) have=$n
    t=$(ms); psql -c "VACUUM (ANALYZE) fencekeeper.marks"; vacuum=$(($(ms) - t))
    psql -c "CHECKPOINT"
    sizes=$(psql -F ' ' -c "SELECT pg_total_relation_size('fencekeeper.marks'),
        pg_total_relation_size('fencekeeper.audit'), (SELECT max(id) FROM fencekeeper.audit)")
    read -r marks_bytes audit_bytes audit_rows <<<"$sizes"
    say "PostgreSQL: $n marks, measuring admits"
    r=$(pg_latency again "$n" off); read -r again50 again99 <<<"$r"
    r=$(pg_latency advance "$n" off); read -r advance50 advance99 <<<"$r"
    psql -c "SELECT pg_stat_reset_shared('wal')" >/dev/null
    r=$(pg_latency again "$n" on); read -r again50s again99s <<<"$r"
    r=$(pg_latency advance "$n" on); read -r advance50s advance99s <<<"$r"
    flush=$(psql -c "SELECT round((wal_sync_time / greatest(wal_sync, 1))::numeric, 2) FROM pg_stat_wal")
    psql -c "CHECKPOINT"
    t=$(ms); as_pg "$pgbin/pg_ctl" -D "$work/pg" -m fast -w -t 600 stop >/dev/null; stopped=$(($(ms) - t))
    t=$(ms); pg_start; started=$(($(ms) - t))
    [ "$(psql -c "SELECT count(*) FROM fencekeeper.marks")" = "$n" ] || { echo "marks lost at $n" >&2; exit 1; }
    echo "| $n | $((marks_bytes / n)) | $((audit_bytes / audit_rows)) | $(fill_cell "$fill" "$added") | $(secs "$vacuum") |" \
        "$again50 / $again99 µs | $advance50 / $advance99 µs | $again50s / $again99s µs | $advance50s / $advance99s µs | $flush ms |" \
        "$(secs "$stopped") + $(secs "$started") |" >>"$work/pg.rows"
done
pg_stop
rm -rf "$work/pg"

# ---------------------------------------------------------------- Redis
rport=$(port)
mkdir -p "$work/redis"
redis_start() {
    redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work/redis" \
        --dbfilename marks.rdb --loadmodule "$module" >>"$work/redis.log" 2>&1 &
    redis_pid=$!
    pids+=("$redis_pid")
    # A loading Redis answers PING with -LOADING.
    for _ in $(seq 1 30000); do
        [ "$(redis-cli -p "$rport" ping 2>/dev/null)" = PONG ] && return 0
        kill -0 "$redis_pid" 2>/dev/null || break
        sleep 0.02
    done
    echo "Redis did not start: $(tail -3 "$work/redis.log")" >&2
    exit 2
}
rcli() { redis-cli -p "$rport" "$@"; }
info() { rcli INFO "$1" | tr -d '\r' | sed -n "s/^$2:\(.*\)/\1/p"; }
# p50 and p99 (µs) of $samples FENCE.SETs, one at a time, over N marks; KIND again,
# advance (tokens from BASE up) or ping (the client's and the loopback's own floor).
redis_latency() { # KIND N BASE
    python3 - "$rport" "$2" "$1" "$3" "$samples" <<'PY'
import random, socket, sys, time
port, n, kind, base, samples = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def resp(*args):
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
rng = random.Random(n)
half = n // 2
took = []
for k in range(samples):
    if kind == "ping":
        request, want = resp(b"PING"), b"+PONG\r\n"
    elif kind == "again":  # an even resource: its mark is 1
        request, want = resp(b"FENCE.SET", b"data", b"bucket/objects/%010d" % (2 * rng.randrange(half)), b"1", b"v"), b"+OK\r\n"
    else:  # an odd resource, above any token given so far
        request, want = resp(b"FENCE.SET", b"data", b"bucket/objects/%010d" % (2 * rng.randrange(half) + 1),
                             b"%d" % (base + k), b"v"), b"+OK\r\n"
    start = time.perf_counter_ns()
    s.sendall(request)
    reply = s.recv(4096)
    took.append(time.perf_counter_ns() - start)
    if reply != want:
        sys.exit(f"{kind} at {n} marks: {reply!r}")
took.sort()
at = lambda q: took[min(int(len(took) * q), len(took) - 1)] / 1000
print(f"{at(0.5):.0f} {at(0.99):.0f}")
PY
}
usec_per_call() { rcli INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_fence.set:.*usec_per_call=\([0-9.]*\).*/\1/p'; }

redis_start
empty=$(info memory used_memory)
have=0
for n in $redis_sizes; do
    say "Redis: filling to $n marks"
    python3 - "$have" "$n" >"$work/fill.resp" <<'PY'
import sys
out = sys.stdout.buffer
a, b = int(sys.argv[1]), int(sys.argv[2])
for s in range(a, b, 100_000):
    out.write(b"".join(b"*5\r\n$9\r\nFENCE.SET\r\n$4\r\ndata\r\n$25\r\nbucket/objects/%010d\r\n$1\r\n1\r\n$1\r\nv\r\n" % i
                       for i in range(s, min(b, s + 100_000))))
PY
    t=$(ms); rcli --pipe <"$work/fill.resp" >"$work/pipe.out"; fill=$(($(ms) - t))
    rm -f "$work/fill.resp"
    grep -q "errors: 0, replies: $((n - have))" "$work/pipe.out" || { cat "$work/pipe.out" >&2; exit 1; }
    added=$((n - have)) have=$n
    used=$(info memory used_memory)
    say "Redis: $n marks, measuring admits"
    r=$(redis_latency ping "$n" 0); read -r ping50 _ <<<"$r"
    rcli CONFIG RESETSTAT >/dev/null
    r=$(redis_latency again "$n" 0); read -r again50 again99 <<<"$r"
    again_usec=$(usec_per_call)
    rcli CONFIG RESETSTAT >/dev/null
    r=$(redis_latency advance "$n" $((1000000 * n))); read -r advance50 advance99 <<<"$r"
    advance_usec=$(usec_per_call)
    t=$(ms); [ "$(rcli SAVE)" = OK ]; saved=$(($(ms) - t))
    rdb=$(stat -c %s "$work/redis/marks.rdb")
    rcli SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait "$redis_pid" 2>/dev/null || true
    t=$(ms); redis_start; restarted=$(($(ms) - t))
    loaded=$(sed -n 's/.*DB loaded from disk: \([0-9.]*\) seconds.*/\1/p' "$work/redis.log" | tail -1)
    [ "$(rcli DBSIZE)" = $((n + 1)) ] || { echo "Redis holds $(rcli DBSIZE) keys, not $n marks and the data" >&2; exit 1; }
    [ "$(rcli FENCE.MARK bucket/objects/0000000000)" = 1 ] || { echo "a mark did not come back from the RDB" >&2; exit 1; }
    echo "| $n | $(((used - empty) / n)) | $(fill_cell "$fill" "$added") | $again50 / $again99 µs | $advance50 / $advance99 µs |" \
        "$again_usec / $advance_usec µs | $ping50 µs | $((rdb / n)) | $(secs "$saved") | $(secs "$restarted") ($loaded s) |" \
        >>"$work/redis.rows"
done

echo "growth of the database hosts: $samples single admits measured at each size; $(nproc) cores; $(date -u '+%F %H:%M UTC')"
echo
echo "| PostgreSQL marks | fencekeeper.marks, bytes per mark | fencekeeper.audit, bytes per advance | fill (µs a mark) | VACUUM | again p50 / p99, synchronous_commit off | advance p50 / p99, off | again p50 / p99, on | advance p50 / p99, on | WAL flush, on | restart: stop + start |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
cat "$work/pg.rows"
echo
echo "| Redis marks | used_memory, bytes per mark | fill (µs a mark) | again p50 / p99 | advance p50 / p99 | server µs a call, again / advance | PING p50 | RDB bytes per mark | SAVE | restart (RDB load) |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
cat "$work/redis.rows"
