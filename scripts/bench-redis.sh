#!/usr/bin/env bash
# Fenced writes inside Redis: FENCE.SET (the module) beside a plain SET and beside the
# peer a Redis user would write by hand, an EVALSHA Lua script doing the same check
# (the mark a plain string key, compared as a number, then the SET), all through
# redis-benchmark against one redis-server that loads the module, in interleaved
# rounds:
#   scripts/bench-redis.sh [REQUESTS [ROUNDS]]   (default 200000 and 3)
# Two writes: `again`, a holder writing again with its token (the mark is read and
# kept: the common write), and `advance`, a first write on a fresh resource each
# time (the mark is created and replicated). 50 connections, one request at a time
# (-P 1: what a client waits for) and 16 pipelined (-P 16: the server's own cost per
# write). No persistence. Prints the medians of requests/s, of p50 latency and of
# the server's own time per command (INFO commandstats usec_per_call: the command's
# work without the network, FENCE.SET's including its inner SET, EVALSHA's the
# script's calls), and the ratios. Needs redis-server and redis-benchmark
# (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-200000}
rounds=${2:-3}
for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "$tool not found; run scripts/install-deps.sh" >&2; exit 2; }
done

cargo build --release -q -p fencekeeper-redis
module=$PWD/target/release/libfencekeeper_redis.so
. scripts/lib/redis.sh
start_redis --loadmodule "$module"

# The hand-written peer: KEYS[1] the data, KEYS[2] the mark (a plain string), ARGV[1]
# the token, ARGV[2] the value. Refuses a lower token with the mark, raises the mark
# to a higher one, then writes. (Tokens as Lua numbers: exact only up to 2^53, one
# component; the module takes 1 to 4 u64 components, checked.)
sha=$(redis-cli -p "$port" SCRIPT LOAD "
local mark = redis.call('GET', KEYS[2])
local token = tonumber(ARGV[1])
if mark then
  mark = tonumber(mark)
  if token < mark then return redis.error_reply('STALE ' .. mark) end
end
if not mark or token > mark then redis.call('SET', KEYS[2], ARGV[1]) end
return redis.call('SET', KEYS[1], ARGV[2])")

# One redis-benchmark run, appended to the results as "WRITE PIPELINE WHO rps p50_ms
# usec_per_call". -r expands __rand_int__ to random 12-digit numbers, so every write
# goes to its own key (and, in `advance`, its own resource). Every request must have
# been a write: a refusal or an error reply would count as fast, so any error stops
# the benchmark.
run() {
    local write=$1 pipeline=$2 who=$3; shift 3
    local name line usec
    name=$(echo "$1" | tr '[:upper:]' '[:lower:]')
    redis-cli -p "$port" FLUSHALL >/dev/null
    redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
    line=$(redis-benchmark -p "$port" -n "$requests" -c 50 -P "$pipeline" -r 100000000 --csv "$@" 2>/dev/null \
        | tail -1 | python3 -c 'import csv, sys; row = next(csv.reader(sys.stdin)); print(row[1], row[4])')
    usec=$(redis-cli -p "$port" INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_$name:.*usec_per_call=\([0-9.]*\).*/\1/p")
    if redis-cli -p "$port" INFO errorstats | grep -q '^errorstat_'; then
        echo "the benchmark's $* was refused: $(redis-cli -p "$port" INFO errorstats | tr -d '\r')" >&2
        exit 1
    fi
    echo "$write $pipeline $who $line $usec" >>"$work/results"
}

for round in $(seq "$rounds"); do
    for pipeline in 1 16; do
        for write in again advance; do
            if [ "$write" = again ]; then
                fence=(FENCE.SET "data:__rand_int__" fence:orders 34 value)
                lua=(EVALSHA "$sha" 2 "data:__rand_int__" lua:orders 34 value)
            else
                fence=(FENCE.SET "data:__rand_int__" "fence:__rand_int__" 1 value)
                lua=(EVALSHA "$sha" 2 "data:__rand_int__" "lua:__rand_int__" 1 value)
            fi
            run "$write" "$pipeline" SET SET "data:__rand_int__" value
            run "$write" "$pipeline" FENCE.SET "${fence[@]}"
            run "$write" "$pipeline" EVALSHA "${lua[@]}"
        done
    done
done
python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    write, pipeline, who, rps, p50, usec = line.split()
    rows.setdefault((write, int(pipeline), who), []).append((float(rps), float(p50), float(usec)))
def med(key, i):
    return statistics.median(r[i] for r in rows[key])
print("| write | pipeline | SET req/s | FENCE.SET req/s | EVALSHA req/s | FENCE.SET / EVALSHA | FENCE.SET / SET | p50 ms SET / FENCE.SET / EVALSHA | server µs per call SET / FENCE.SET / EVALSHA |")
print("|---|---|---|---|---|---|---|---|---|")
who = ("SET", "FENCE.SET", "EVALSHA")
for write in ("again", "advance"):
    for pipeline in (1, 16):
        s, f, l = (med((write, pipeline, w), 0) for w in who)
        ps, pf, pl = (med((write, pipeline, w), 1) for w in who)
        us, uf, ul = (med((write, pipeline, w), 2) for w in who)
        print(f"| {write} | {pipeline} | {s:.0f} | {f:.0f} | {l:.0f} | {f / l:.2f}x | {f / s:.2f}x "
              f"| {ps:.3f} / {pf:.3f} / {pl:.3f} | {us:.2f} / {uf:.2f} / {ul:.2f} |")
PY
