#!/usr/bin/env bash
# In-memory admits per second: the library (one Guard, memory store, the bundled wasm
# validator) beside Redis running the same compare-and-set as a Lua script through
# EVALSHA (each thread one connection, one request at a time), with 1 and 2 threads
# and a fixed or a rising token, in interleaved rounds:
#   scripts/bench-memory.sh [SECONDS_PER_ROW [ROUNDS]]   (default 5 and 3)
# Redis runs without persistence (an in-memory peer). Needs redis-server and
# redis-cli (scripts/install-deps.sh installs them); stops Redis at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5}
rounds=${2:-3}
for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || { echo "$tool not found; run scripts/install-deps.sh" >&2; exit 2; }
done

cargo build --release -q --bench memory -p fencekeeper
. scripts/lib/redis.sh
start_redis
# The fence as a Lua script: the mark moves to the token if it is not lower; 1 admitted,
# 0 refused. Tokens are decimal integers here (Redis compares them as numbers).
sha=$(redis-cli -p "$port" SCRIPT LOAD "
local mark = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < mark then return 0 end
if token > mark then redis.call('SET', KEYS[1], ARGV[1]) end
return 1")

bench() { cargo bench -q --bench memory -p fencekeeper -- "$@" 2>/dev/null | tail -1 | cut -d' ' -f2; }
for round in $(seq "$rounds"); do
    for tokens in fixed rising; do
        for threads in 1 2; do
            echo "fencekeeper $tokens $threads $(bench "$threads" "$duration" "$tokens")" >>"$work/results"
            redis-cli -p "$port" FLUSHALL >/dev/null
            echo "redis $tokens $threads $(bench "$threads" "$duration" "$tokens" "$port" "$sha")" >>"$work/results"
        done
    done
done
python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, tokens, threads, rate = line.split()
    rows.setdefault((who, tokens, int(threads)), []).append(float(rate))
print("| tokens | threads | fencekeeper memory store + wasm, admits/s (median) | Redis EVALSHA, admits/s (median) | ratio | fencekeeper 2 threads / 1 |")
print("|---|---|---|---|---|---|")
for tokens in ("fixed", "rising"):
    one = statistics.median(rows[("fencekeeper", tokens, 1)])
    for threads in (1, 2):
        ours = statistics.median(rows[("fencekeeper", tokens, threads)])
        peer = statistics.median(rows[("redis", tokens, threads)])
        scale = f"{ours / one:.2f}x" if threads == 2 else ""
        print(f"| {tokens} | {threads} | {ours:.0f} | {peer:.0f} | {ours / peer:.1f}x | {scale} |")
PY
