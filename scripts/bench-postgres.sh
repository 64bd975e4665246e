#!/usr/bin/env bash
# The fencekeeper PostgreSQL extension beside what a database user writes by hand,
# in one run, interleaved rounds:
#   scripts/bench-postgres.sh [SECONDS_PER_ROW [ROUNDS]]   (default 5 and 3)
#
# pgbench inserts one row per transaction into three tables: `plain` (no trigger),
# `fenced` (the fencekeeper.fence trigger) and `peer` (a PL/pgSQL trigger doing the
# same check by hand with a conditional UPDATE of its own marks table), with 1 and 8
# clients, each client its own resource. Two token patterns: `holder` (every row of a
# client carries the same token: the lock holder writing again) and `advance` (every
# row a new, higher token from a sequence). Each with the server's defaults (a commit
# waits for its WAL flush) and with synchronous_commit = off (what the trigger costs
# in CPU). Then the first call on a new connection and the steady-state call
# (fencekeeper-pg-bench), without and with shared_preload_libraries.
#
# Builds and installs the extension (scripts/install-postgres-extension.sh), runs the
# server in a temporary directory on a free port, and stops it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5}
rounds=${2:-3}
say() { echo "bench-postgres: $*" >&2; }
pgbin=/usr/lib/postgresql/15/bin
[ -x "$pgbin/pgbench" ] || { echo "pgbench not found; run scripts/install-deps.sh" >&2; exit 2; }
# PostgreSQL refuses to run as root: run it as its own user.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

scripts/install-postgres-extension.sh >/dev/null
cargo build --release -q --locked -p fencekeeper-harness --bin fencekeeper-pg-bench
work=$(mktemp -d)
chmod 755 "$work"
[ "$(id -u)" = 0 ] && chown postgres "$work"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
stop() { as_pg "$pgbin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true; }
cleanup() { stop; rm -rf "$work"; }
trap cleanup EXIT
as_pg "$pgbin/initdb" -D "$work/pg" -A trust -U bench >/dev/null
start() { # extra server options
    as_pg "$pgbin/pg_ctl" -D "$work/pg" -w -l "$work/pg.log" \
        -o "-p $port -k $work -c listen_addresses=127.0.0.1 -c max_connections=40 $*" start >/dev/null
}
start
psql() { as_pg "$pgbin/psql" -h 127.0.0.1 -p "$port" -U bench -d postgres -qAtX -v ON_ERROR_STOP=1 "$@"; }
psql <<'SQL'
CREATE EXTENSION fencekeeper;
CREATE SEQUENCE tokens;
CREATE TABLE plain (batch text, line bigint, token bigint, body text);
CREATE TABLE fenced (LIKE plain);
CREATE TRIGGER fence BEFORE INSERT ON fenced
    FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('batch', 'token');
-- The hand-written peer: the same rule (a token below the mark is refused, a higher
-- one advances it, an equal one passes) as a conditional UPDATE of its own marks.
CREATE TABLE peer (LIKE plain);
CREATE TABLE peer_marks (resource text PRIMARY KEY, mark bigint NOT NULL);
CREATE FUNCTION peer_fence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE peer_marks SET mark = NEW.token WHERE resource = NEW.batch AND mark <= NEW.token;
    IF NOT FOUND THEN
        INSERT INTO peer_marks VALUES (NEW.batch, NEW.token) ON CONFLICT (resource) DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'stale fencing token % for %', NEW.token, NEW.batch USING ERRCODE = 'FK001';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fence BEFORE INSERT ON peer FOR EACH ROW EXECUTE FUNCTION peer_fence();
SQL
# Each pattern its own resources: the holder's token is above the sequence's.
for table in plain fenced peer; do
    printf "INSERT INTO %s VALUES ('holder/' || :client_id, :client_id, 1000000000000, 'row');\n" "$table" >"$work/holder-$table.sql"
    printf "INSERT INTO %s VALUES ('advance/' || :client_id, :client_id, nextval('tokens'), 'row');\n" "$table" >"$work/advance-$table.sql"
done
chmod 644 "$work"/*.sql

pgbench() { # clients script
    as_pg "$pgbin/pgbench" -n -h 127.0.0.1 -p "$port" -U bench -c "$1" -j "$1" -T "$duration" -f "$2" postgres \
        >"$work/pgbench.out" 2>&1 || true
    local tps
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/pgbench.out")
    [ -n "$tps" ] || { echo "pgbench -c $1 -f $2 failed:" >&2; tail -5 "$work/pgbench.out" >&2; exit 1; }
    echo "$tps"
}

for commit in on off; do
    psql -c "ALTER SYSTEM SET synchronous_commit = $commit" -c "SELECT pg_reload_conf()" >/dev/null
    for round in $(seq "$rounds"); do
        for pattern in holder advance; do
            for clients in 1 8; do
                for table in plain fenced peer; do
                    tps=$(pgbench "$clients" "$work/$pattern-$table.sql")
                    echo "$commit $pattern $clients $table $tps" >>"$work/results"
                done
            done
        done
    done
    say "synchronous_commit=$commit done"
done

bench() { target/release/fencekeeper-pg-bench "$@" --postgres "127.0.0.1:$port" --user bench; }
bench first-call >"$work/first-plain"
bench steady >"$work/steady"
stop
start "-c shared_preload_libraries=fencekeeper"
bench first-call >"$work/first-preload"

python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    commit, pattern, clients, table, tps = line.split()
    rows.setdefault((commit, pattern, int(clients), table), []).append(float(tps))
print("| synchronous_commit | tokens | clients | plain INSERT, tx/s | fenced (fencekeeper.fence), tx/s | PL/pgSQL peer, tx/s | fenced / plain | fenced / peer |")
print("|---|---|---|---|---|---|---|---|")
for commit in ("on", "off"):
    for pattern in ("holder", "advance"):
        for clients in (1, 8):
            m = {t: statistics.median(rows[(commit, pattern, clients, t)]) for t in ("plain", "fenced", "peer")}
            print(f"| {commit} | {pattern} | {clients} | {m['plain']:.0f} | {m['fenced']:.0f} | {m['peer']:.0f} "
                  f"| {m['fenced'] / m['plain']:.2f}x | {m['fenced'] / m['peer']:.2f}x |")
PY
echo
echo "first call on a new connection (medians of 20 connections): without preload | with shared_preload_libraries"
paste "$work/first-plain" "$work/first-preload" | awk '{ printf "%-30s %8s %s | %8s %s\n", $1, $2, $3, $5, $6 }'
echo
echo "steady state, one connection (medians):"
cat "$work/steady"
