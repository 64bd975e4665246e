#!/usr/bin/env bash
# Durable advancing admits per second: the library's file store (group commit, fsync
# on every commit) beside PostgreSQL's conditional UPDATE (fsync and synchronous
# commit on, its defaults), with 1 and 8 concurrent writers, in interleaved rounds:
#   scripts/bench-durable.sh [SECONDS_PER_ROW [ROUNDS]]   (default 5 and 3)
#   BEFORE=REV scripts/bench-durable.sh ...   also the file store as of git revision REV,
#                                             in the same rounds (built in a worktree)
# Beside them, at one writer, the floor of a lone durable advance in the file store
# (one page write made durable with fdatasync: its journal frame). Both keep their files in one temporary directory, on the same disk. Each writer has
# its own resource (row) and presents a rising token, so every operation is a durable
# write. Installs PostgreSQL from Debian when it is missing; stops it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5}
rounds=${2:-3}
say() { echo "bench-durable: $*" >&2; }
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    say "installing PostgreSQL from Debian"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql >/dev/null
fi
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
# PostgreSQL refuses to run as root: run it as its own user.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

cargo build --release -q --bench durable -p fencekeeper
work=$(mktemp -d)
chmod 755 "$work"
[ "$(id -u)" = 0 ] && chown postgres "$work"
cleanup() {
    as_pg "$pgbin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
    [ -n "${BEFORE:-}" ] && git worktree remove --force "$work/before" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
if [ -n "${BEFORE:-}" ]; then
    say "building the file store as of $BEFORE"
    git worktree add -q --detach "$work/before" "$BEFORE"
    # The same target directory, so only the workspace's own crates are built again.
    # They land on the current ones' files, which cargo then takes for fresh (their
    # sources are older): the binary is copied out, and the current sources touched so
    # that cargo builds them again.
    built=$(cd "$work/before" && CARGO_TARGET_DIR="$OLDPWD/target" cargo bench --no-run -q -p fencekeeper \
        --bench durable --message-format=json | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "durable": print(m["executable"])')
    before_bin=$work/durable-before
    cp "$built" "$before_bin"
    find crates host -name '*.rs' -exec touch {} +
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg "$pgbin/initdb" -D "$work/pg" -A trust -U bench >/dev/null
as_pg "$pgbin/pg_ctl" -D "$work/pg" -w -l "$work/pg.log" \
    -o "-p $port -k $work -c listen_addresses=127.0.0.1 -c max_connections=20" start >/dev/null
psql() { as_pg "$pgbin/psql" -h 127.0.0.1 -p "$port" -U bench -d postgres -qAt "$@"; }
psql -c "CREATE TABLE marks (resource text PRIMARY KEY, mark bigint NOT NULL); CREATE SEQUENCE tokens;"
psql -c "INSERT INTO marks SELECT 'bench/' || i, 0 FROM generate_series(0, 15) i;"
# A conditional UPDATE: the mark moves to the presented token only if it is higher.
cat >"$work/advance.sql" <<'SQL'
WITH t AS (SELECT nextval('tokens') AS v)
UPDATE marks SET mark = t.v FROM t WHERE resource = 'bench/' || :client_id AND mark < t.v;
SQL
chmod 644 "$work/advance.sql"

ours() { FENCEKEEPER_BENCH_DIR=$work cargo bench -q --bench durable -p fencekeeper -- "$1" "$duration" 2>/dev/null | tail -1 | cut -d' ' -f2; }
postgres() {
    as_pg "$pgbin/pgbench" -n -h 127.0.0.1 -p "$port" -U bench -c "$1" -j "$1" -T "$duration" -f "$work/advance.sql" postgres 2>/dev/null \
        | sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}

# The floor of a lone durable advance in the file store: one page write made durable
# with fdatasync (its journal frame; store/file/journal.rs).
floor() { FENCEKEEPER_BENCH_DIR=$work cargo bench -q --bench durable -p fencekeeper -- floor "$duration" 2>/dev/null | tail -1 | cut -d' ' -f2; }

before() { FENCEKEEPER_BENCH_DIR=$work "$before_bin" "$1" "$duration" 2>/dev/null | tail -1 | cut -d' ' -f2; }

for round in $(seq "$rounds"); do
    for writers in 1 8; do
        echo "fencekeeper $writers $(ours "$writers")" >>"$work/results"
        echo "postgresql $writers $(postgres "$writers")" >>"$work/results"
        [ -n "${BEFORE:-}" ] && echo "before $writers $(before "$writers")" >>"$work/results"
    done
    echo "floor 1 $(floor)" >>"$work/results"
done
python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, writers, rate = line.split()
    rows.setdefault((who, int(writers)), []).append(float(rate))
print("| writers | fencekeeper file store, admits/s (median) | PostgreSQL UPDATE, tx/s (median) | ratio | floor: one fdatasync, ops/s (median) | fencekeeper / floor |")
print("|---|---|---|---|---|---|")
for w in sorted({k[1] for k in rows}):
    ours, pg = statistics.median(rows[("fencekeeper", w)]), statistics.median(rows[("postgresql", w)])
    floor = rows.get(("floor", w))
    f = f"{statistics.median(floor):.0f} | {ours / statistics.median(floor):.2f}x" if floor else " | "
    print(f"| {w} | {ours:.0f} | {pg:.0f} | {ours / pg:.2f}x | {f} |")
if any(k[0] == "before" for k in rows):
    print()
    print("| writers | the file store before, admits/s (median) | before / PostgreSQL | now / before |")
    print("|---|---|---|---|")
    for w in sorted({k[1] for k in rows if k[0] == "before"}):
        b = statistics.median(rows[("before", w)])
        ours, pg = statistics.median(rows[("fencekeeper", w)]), statistics.median(rows[("postgresql", w)])
        print(f"| {w} | {b:.0f} | {b / pg:.2f}x | {ours / b:.2f}x |")
PY
