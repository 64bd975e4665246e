#!/usr/bin/env bash
# Envoy's shared-data copy of etcd's marks as resources accumulate, bounded (the
# default `shared_marks_max`, 65,536) beside unbounded (`--shared-marks-max
# 4294967295`: every mark kept, as before the bound), in one run:
#   scripts/bench-envoy-marks.sh [RESOURCES_PER_STEP [STEPS]]   (default 50000 and 4)
#
# One etcd, nginx answering 204, and the two Envoys (one worker each, correctness
# mode), written to in turn. Each step, wrk sends RESOURCES_PER_STEP PUTs to each
# Envoy, each to a resource it has never seen (a new mark: an etcd Txn put), then a
# probe measures a holder writing again on one resource for 3 s (p50, p99), and the
# Envoys' RSS is read. Prints a table for BENCHMARKS.md: RSS and the probe's latency
# against the number of marks.
# Needs: nginx, etcd, envoy, wrk (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
per_step=${1:-50000}
steps=${2:-4}
. scripts/lib/bench.sh

start_nginx_204
start_services etcd
declare -A listen envoypid
envoy_on_etcd() { # NAME ARGS...
    start_envoy "listen[$1]" "$1" "127.0.0.1:$up" --etcd "127.0.0.1:${FK_ETCD##*:}" --provenance off "${@:2}"
    envoypid[$1]=$envoy_pid
}
envoy_on_etcd bounded
envoy_on_etcd unbounded --shared-marks-max 4294967295

# PUT token 1 to /fresh/<prefix>/<n>, n counting up: every request a new resource.
cat >"$work/fresh.lua" <<'LUA'
wrk.method = "PUT"
wrk.body = "x"
wrk.headers["fencing-token"] = "1"
local n = 0
local prefix = os.getenv("FK_PREFIX") or "p"
request = function()
  n = n + 1
  return wrk.format(nil, "/fresh/" .. prefix .. "/" .. n)
end
LUA
rss_mb() { awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

# wrk has no request count: each step runs for the time RESOURCES_PER_STEP takes at
# the rate of a first 2 s batch, and counts what it sent. A refused write (not 2xx)
# would make no mark: the script stops.
fresh() { # NAME PREFIX SECONDS -> requests sent
    local out
    out=$(FK_PREFIX=$2 wrk -t1 -c4 -d"$3s" -s "$work/fresh.lua" --latency "http://127.0.0.1:${listen[$1]}/")
    if echo "$out" | grep -q 'Non-2xx'; then echo "$1: fresh writes refused:" >&2; echo "$out" >&2; exit 1; fi
    echo "$out" | awk '/requests in/ {print $1}'
}
echo "marks          envoy     RSS MiB  probe p50 us  probe p99 us" >"$work/table"
declare -A total seconds
for name in bounded unbounded; do
    total[$name]=$(fresh "$name" warm 2)
    seconds[$name]=$(( (per_step * 2 + total[$name] - 1) / total[$name] ))
done
for step in $(seq "$steps"); do
    for name in bounded unbounded; do
        total[$name]=$(( total[$name] + $(fresh "$name" "s$step" "${seconds[$name]}") ))
        probe=$(wrk -t1 -c1 -d3s -s scripts/lib/put-fixed.lua --latency "http://127.0.0.1:${listen[$name]}/" | wrk_numbers)
        read -r p50 p99 _ _ <<<"$probe"
        printf '%-14s %-9s %7s %13s %13s\n' "${total[$name]}" "$name" "$(rss_mb "${envoypid[$name]}")" "$p50" "$p99" >>"$work/table"
    done
done
cat "$work/table"
