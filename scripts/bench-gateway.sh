#!/usr/bin/env bash
# Benchmark: the same PUT load with wrk against the same nginx WebDAV store, four ways:
# straight to nginx, through the gateway (embedded file store), through the gateway
# (etcd store), and through Envoy with the proxy-wasm filter (marks in etcd).
#
# Two workloads per target:
#   steady     one resource, one token: the current holder writing again (no mark I/O)
#   advancing  a new resource per request: every admit creates a mark
#              (an fsync'd redb commit, or an etcd Txn)
#
# Usage: scripts/bench-gateway.sh [SECONDS] [CONNECTIONS]   (default 10 s, 16 connections)
# With BEFORE_FK=BINARY (a `fencekeeper` built from an earlier revision), the two
# gateway rows run with that binary too, right after the current one's, so a change is
# measured beside its predecessor in one run.
# Prints a Markdown table for BENCHMARKS.md. Needs wrk, nginx, etcd, envoy
# (scripts/install-deps.sh); without envoy the Envoy rows are skipped. nginx and etcd
# come from the test harness (fencekeeper-services).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
connections=${2:-16}
threads=$(( connections < 2 ? connections : 2 ))

. scripts/lib/bench.sh

# nginx WebDAV (a store that accepts any write) and etcd (the shared mark store),
# started by the harness as the tests start them; it stops both when it is stopped.
start_services nginx-dav etcd
np=${FK_NGINX_DAV##*:}
ec=${FK_ETCD##*:}

start_gateway gw_file gateway-file "127.0.0.1:$np" --store "$work/marks.redb"
start_gateway gw_etcd gateway-etcd "127.0.0.1:$np" --etcd "http://127.0.0.1:$ec"
if [ -n "${BEFORE_FK:-}" ]; then
    current=$fk fk=$BEFORE_FK
    start_gateway gw_file_before gateway-file-before "127.0.0.1:$np" --store "$work/marks-before.redb"
    start_gateway gw_etcd_before gateway-etcd-before "127.0.0.1:$np" --etcd "http://127.0.0.1:$ec" \
        --etcd-prefix /fencekeeper-before/
    fk=$current
fi

envoy_port=""
if command -v envoy >/dev/null && [ -f guest/artifacts/fencekeeper_filter.wasm ]; then
    envoy_port=$(port); envoy_admin=$(port)
    # The tokens are made up, not etcd revisions: measured without the provenance check.
    "$fk" envoy-config --upstream "127.0.0.1:$np" --listen "$envoy_port" --admin "$envoy_admin" \
        --etcd "127.0.0.1:$ec" --provenance off >"$work/envoy.yaml"
    envoy -c "$work/envoy.yaml" --concurrency 2 --log-level warn --base-id "$envoy_port" >"$work/envoy.log" 2>&1 &
    pids+=($!)
    wait_http "http://127.0.0.1:$envoy_admin/ready" LIVE
else
    echo "envoy or guest/artifacts/fencekeeper_filter.wasm missing: Envoy rows skipped" >&2
fi

cp scripts/lib/put-fixed.lua "$work/steady.lua"
cat >"$work/advancing.lua" <<'EOF'
local threads, next_id, n = {}, 0, 0
function setup(thread) thread:set("id", next_id); next_id = next_id + 1 end
function request()
  n = n + 1
  return wrk.format("PUT", wrk.path .. "-" .. id .. "-" .. n, {["fencing-token"] = "1"}, "x")
end
EOF

run() { # LABEL PORT WORKLOAD
    local out p50 p99 rps errors
    # Warm-up (discarded): connections, caches, the first marks.
    wrk -t"$threads" -c"$connections" -d2s -s "$work/$3.lua" "http://127.0.0.1:$2/bench/warm-$1-$3" >/dev/null 2>&1
    out=$(wrk -t"$threads" -c"$connections" -d"${seconds}s" --latency -s "$work/$3.lua" \
        "http://127.0.0.1:$2/bench/$1-$3" 2>&1)
    p50=$(awk '/^ +50%/ {print $2}' <<<"$out")
    p99=$(awk '/^ +99%/ {print $2}' <<<"$out")
    rps=$(awk '/^Requests\/sec/ {printf "%.0f", $2}' <<<"$out")
    errors=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
    printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$3" "$rps" "$p50" "$p99" "${errors:-0}"
}

echo "wrk -t$threads -c$connections -d${seconds}s --latency, PUT 1-byte bodies to nginx WebDAV; $(nproc) cores; $(date -u +%F)"
echo
echo "| target | workload | requests/s | p50 | p99 | non-2xx |"
echo "|---|---|---:|---:|---:|---:|"
for workload in steady advancing; do
    run nginx-direct "$np" "$workload"
    run gateway-file "$gw_file" "$workload"
    if [ -n "${BEFORE_FK:-}" ]; then run gateway-file-before "$gw_file_before" "$workload"; fi
    run gateway-etcd "$gw_etcd" "$workload"
    if [ -n "${BEFORE_FK:-}" ]; then run gateway-etcd-before "$gw_etcd_before" "$workload"; fi
    if [ -n "$envoy_port" ]; then run envoy-filter-etcd "$envoy_port" "$workload"; fi
done
