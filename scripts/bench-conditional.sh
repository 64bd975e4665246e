#!/usr/bin/env bash
# Benchmark: conditional writes (`serve --conditional-writes`) beside the same
# gateway without them, in front of the same store that honours If-Match: moto's S3
# server (PyPI moto[server]), here without signature checking so that wrk can write.
#
# Targets: moto straight from wrk; the gateway with its embedded file store, without
# and with conditional writes; the same with marks (and chains) in etcd; and Envoy
# with the filter (one worker, marks in etcd), with its ordering gate and with
# conditional writes (`envoy-config --conditional-writes`).
# Workloads:
#   steady     one object, one token: the holder writing again. With conditional
#              writes each gateway write waits for the one before it on the object
#              (a turn per resource), so this measures that serialization. The
#              filter has no turn, but the bytes never change, so neither does the
#              version (an MD5 ETag) and concurrent writes all apply.
#   distinct   one object, one token, a new body each request (a counter): with
#              conditional writes, concurrent writes to the object race for its
#              version, and the losers get 409 (the non-2xx column).
#   advancing  a new object per request: every admit creates a mark, and with
#              conditional writes a chain (lend and settle: two more commits).
#
# Usage: scripts/bench-conditional.sh [SECONDS] [CONNECTIONS]   (default 10 s, 16)
#   BEFORE_FILTER=FILE.wasm   adds envoy-etcd-conditional-before: the same Envoy with an
#                             earlier build of the filter (git show REV:guest/artifacts/...)
#   FK_BENCH_TARGETS="a b"    only these targets (names as in the table)
#   ROUNDS=N                  every row N times, interleaved round by round (default 1)
# Prints a Markdown table for BENCHMARKS.md. Needs wrk, moto_server, etcd
# (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
connections=${2:-16}
threads=$(( connections < 2 ? connections : 2 ))

. scripts/lib/bench.sh
command -v moto_server >/dev/null || { echo "moto_server not found; run scripts/install-deps.sh" >&2; exit 2; }

start_services etcd
# moto refuses an anonymous overwrite (403); with signatures unchecked, any
# credential names the account that owns the bucket.
auth='AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00'
ec=${FK_ETCD##*:}
mp=$(port)
moto_server -H 127.0.0.1 -p "$mp" >"$work/moto.log" 2>&1 & pids+=($!)
wait_http "http://127.0.0.1:$mp/moto-api/"
curl -fsS -X PUT -H "authorization: $auth" "http://127.0.0.1:$mp/bench" >/dev/null

# A probe path each: the probe's object stays when moto refuses its anonymous
# DELETE, and moto refuses an anonymous overwrite of it.
conditional() { echo --conditional-writes --precondition-probe "/bench/fencekeeper-probe-$1"; }
start_gateway gw_file gateway-file "127.0.0.1:$mp" --store "$work/plain.redb"
start_gateway gw_file_c gateway-file-conditional "127.0.0.1:$mp" --store "$work/conditional.redb" $(conditional file)
start_gateway gw_etcd gateway-etcd "127.0.0.1:$mp" --etcd "http://127.0.0.1:$ec" --etcd-prefix /plain/
start_gateway gw_etcd_c gateway-etcd-conditional "127.0.0.1:$mp" --etcd "http://127.0.0.1:$ec" --etcd-prefix /conditional/ $(conditional etcd)
envoy_args=(--etcd "127.0.0.1:$ec" --protocol s3 --provenance off)
start_envoy envoy envoy-etcd "127.0.0.1:$mp" "${envoy_args[@]}"
start_envoy envoy_c envoy-etcd-conditional "127.0.0.1:$mp" "${envoy_args[@]}" $(conditional envoy)
if [[ -n ${BEFORE_FILTER:-} ]]; then
    start_envoy envoy_c_before envoy-etcd-conditional-before "127.0.0.1:$mp" "${envoy_args[@]}" \
        $(conditional envoy-before) --filter "$BEFORE_FILTER"
fi

cat >"$work/steady.lua" <<LUA
wrk.method = "PUT"
wrk.body = "x"
wrk.headers["fencing-token"] = "1"
wrk.headers["authorization"] = "$auth"
LUA
cat >"$work/distinct.lua" <<LUA
local next_id, n = 0, 0
function setup(thread) thread:set("id", next_id); next_id = next_id + 1 end
function request()
  n = n + 1
  return wrk.format("PUT", nil, {["fencing-token"] = "1", ["authorization"] = "$auth"}, id .. "-" .. n)
end
LUA
cat >"$work/advancing.lua" <<LUA
local threads, next_id, n = {}, 0, 0
function setup(thread) thread:set("id", next_id); next_id = next_id + 1 end
function request()
  n = n + 1
  return wrk.format("PUT", wrk.path .. "-" .. id .. "-" .. n, {["fencing-token"] = "1", ["authorization"] = "$auth"}, "x")
end
LUA

# Each round writes its own objects: wrk cuts its last write off when its time is up,
# the fence gives that write up while the store may still apply it (moto does), and
# on an object whose store refuses the fence's own anonymous HEAD the next write is
# then refused until a client reads the object through the fence, which wrk does not.
run() { # LABEL PORT WORKLOAD
    local out
    if [[ -n ${FK_BENCH_TARGETS:-} && " $FK_BENCH_TARGETS " != *" $1 "* ]]; then
        return
    fi
    wrk -t"$threads" -c"$connections" -d2s -s "$work/$3.lua" "http://127.0.0.1:$2/bench/warm-$1-$3" >/dev/null 2>&1
    out=$(wrk -t"$threads" -c"$connections" -d"${seconds}s" --latency -s "$work/$3.lua" \
        "http://127.0.0.1:$2/bench/$1-$3-$round" 2>&1)
    read -r p50 p99 rps errors <<<"$(wrk_numbers <<<"$out")"
    printf '| %s | %s | %s | %s µs | %s µs | %s |\n' "$1" "$3" "$rps" "$p50" "$p99" "$errors"
}

echo "wrk -t$threads -c$connections -d${seconds}s --latency, PUT 1-byte bodies to moto $(pip show moto 2>/dev/null | awk '/^Version/ {print $2}'); $(nproc) cores; $(date -u +%F)"
echo
echo "| target | workload | requests/s | p50 | p99 | non-2xx |"
echo "|---|---|---:|---:|---:|---:|"
for ((round = 1; round <= ${ROUNDS:-1}; round++)); do
    for workload in steady distinct advancing; do
        run moto-direct "$mp" "$workload"
        run gateway-file "$gw_file" "$workload"
        run gateway-file-conditional "$gw_file_c" "$workload"
        run gateway-etcd "$gw_etcd" "$workload"
        run gateway-etcd-conditional "$gw_etcd_c" "$workload"
        run envoy-etcd "$envoy" "$workload"
        run envoy-etcd-conditional "$envoy_c" "$workload"
        if [[ -n ${BEFORE_FILTER:-} ]]; then
            run envoy-etcd-conditional-before "$envoy_c_before" "$workload"
        fi
    done
done
