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
# With ROUNDS=N (N > 1), every row runs N times, the rows interleaved round by round
# (so a slow minute of a shared machine falls on every row alike), and a second table
# gives each row's median requests/s and, with BEFORE_FK, the ratio to its predecessor.
# Every gateway row also gives the gateway's CPU time per request (/proc/PID/stat).
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

# Each gateway's process by its port: its CPU time a request is measured too, which a
# busy machine disturbs far less than requests/s.
declare -A pid_of=()
start_gateway gw_file gateway-file "127.0.0.1:$np" --store "$work/marks.redb"; pid_of[$gw_file]=${pids[-1]}
start_gateway gw_etcd gateway-etcd "127.0.0.1:$np" --etcd "http://127.0.0.1:$ec" --local-gate; pid_of[$gw_etcd]=${pids[-1]}
if [ -n "${BEFORE_FK:-}" ]; then
    current=$fk fk=$BEFORE_FK
    start_gateway gw_file_before gateway-file-before "127.0.0.1:$np" --store "$work/marks-before.redb"
    pid_of[$gw_file_before]=${pids[-1]}
    start_gateway gw_etcd_before gateway-etcd-before "127.0.0.1:$np" --etcd "http://127.0.0.1:$ec" \
        --etcd-prefix /fencekeeper-before/
    pid_of[$gw_etcd_before]=${pids[-1]}
    fk=$current
fi
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tick_us=$((1000000 / $(getconf CLK_TCK)))

envoy_port=""
if command -v envoy >/dev/null && [ -f guest/artifacts/fencekeeper_filter.wasm ]; then
    envoy_port=$(port); envoy_admin=$(port)
    # The tokens are made up, not etcd revisions: measured without the provenance check.
    "$fk" envoy-config --upstream "127.0.0.1:$np" --listen "$envoy_port" --admin "$envoy_admin" \
        --etcd "127.0.0.1:$ec" --provenance off --local-gate >"$work/envoy.yaml"
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
    local out p50 p99 rps errors requests cpu="" before=""
    # Warm-up (discarded): connections, caches, the first marks.
    wrk -t"$threads" -c"$connections" -d2s -s "$work/$3.lua" "http://127.0.0.1:$2/bench/warm-$1-$3" >/dev/null 2>&1
    [ -n "${pid_of[$2]:-}" ] && before=$(ticks "${pid_of[$2]}")
    out=$(wrk -t"$threads" -c"$connections" -d"${seconds}s" --latency -s "$work/$3.lua" \
        "http://127.0.0.1:$2/bench/$1-$3" 2>&1)
    p50=$(awk '/^ +50%/ {print $2}' <<<"$out")
    p99=$(awk '/^ +99%/ {print $2}' <<<"$out")
    rps=$(awk '/^Requests\/sec/ {printf "%.0f", $2}' <<<"$out")
    errors=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
    requests=$(awk '/ requests in / {print $1}' <<<"$out")
    if [ -n "$before" ] && [ "${requests:-0}" -gt 0 ]; then
        cpu=$(awk -v t=$(( $(ticks "${pid_of[$2]}") - before )) -v u="$tick_us" -v n="$requests" \
            'BEGIN {printf "%.1f", t * u / n}')
    fi
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$3" "$rps" "$p50" "$p99" "${errors:-0}" "$cpu"
}

rounds=${ROUNDS:-1}
declare -A samples=() cpus=()
rows=()
echo "wrk -t$threads -c$connections -d${seconds}s --latency, PUT 1-byte bodies to nginx WebDAV; $(nproc) cores; $(date -u +%F); $rounds round(s)"
echo
echo "| target | workload | requests/s | p50 | p99 | non-2xx | gateway CPU µs/request |"
echo "|---|---|---:|---:|---:|---:|---:|"
for ((round = 1; round <= rounds; round++)); do
    for workload in steady advancing; do
        targets=("nginx-direct:$np" "gateway-file:$gw_file")
        if [ -n "${BEFORE_FK:-}" ]; then targets+=("gateway-file-before:$gw_file_before"); fi
        targets+=("gateway-etcd:$gw_etcd")
        if [ -n "${BEFORE_FK:-}" ]; then targets+=("gateway-etcd-before:$gw_etcd_before"); fi
        if [ -n "$envoy_port" ]; then targets+=("envoy-filter-etcd:$envoy_port"); fi
        for target in "${targets[@]}"; do
            line=$(run "${target%%:*}" "${target##*:}" "$workload")
            echo "$line"
            key="${target%%:*} $workload"
            [ "$round" = 1 ] && rows+=("$key")
            samples[$key]+="$(awk -F'|' '{gsub(/ /, "", $4); print $4}' <<<"$line") "
            cpus[$key]+="$(awk -F'|' '{gsub(/ /, "", $8); print $8}' <<<"$line") "
        done
    done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
if [ "$rounds" -gt 1 ]; then
    echo
    echo "| target | workload | median requests/s | samples | ratio to before | median gateway CPU µs/request | CPU ratio to before |"
    echo "|---|---|---:|---|---:|---:|---:|"
    for key in "${rows[@]}"; do
        m=$(median <<<"${samples[$key]}")
        c=""
        [ -n "${cpus[$key]// /}" ] && c=$(median <<<"${cpus[$key]}")
        ratio="" cratio=""
        target=${key% *} workload=${key#* }
        if [[ $target == gateway-* && $target != *-before && -n "${samples[$target-before $workload]:-}" ]]; then
            before=$(median <<<"${samples[$target-before $workload]}")
            ratio=$(awk -v a="$m" -v b="$before" 'BEGIN {printf "%.2f", a / b}')
            cbefore=$(median <<<"${cpus[$target-before $workload]}")
            cratio=$(awk -v a="$c" -v b="$cbefore" 'BEGIN {printf "%.2f", a / b}')
        fi
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$target" "$workload" "$m" "${samples[$key]% }" "$ratio" "$c" "$cratio"
    done
fi
