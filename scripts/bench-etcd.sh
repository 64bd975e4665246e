#!/usr/bin/env bash
# The gateway with its marks in etcd beside etcd's own Txn, on the same etcd, in
# interleaved rounds:
#   scripts/bench-etcd.sh [SECONDS_PER_ROW [ROUNDS]]   (default 5 and 3)
#
#   etcd-txn     wrk straight to etcd's JSON gateway (POST /v3/kv/txn): for the fixed
#                token, the compare the gateway needs (value equal, read back on
#                failure); for rising tokens, a Txn that puts a new value
#   gateway      wrk to `fencekeeper serve --etcd` in front of nginx answering 204
#                (a store that costs nothing, so the fence's cost shows): PUTs with
#                one fixed token (the holder writing again) or rising tokens (every
#                admit advances the mark)
# With 1 and 8 connections. The gateway's target is one etcd round trip per admit:
# the ratio is its throughput over etcd's own. Needs wrk, nginx, etcd
# (scripts/install-deps.sh); prints a table for BENCHMARKS.md; stops what it starts.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5}
rounds=${2:-3}
PATH="/usr/sbin:$PATH"
cargo build --release -q -p fencekeeper-cli -p fencekeeper-harness
fk=$PWD/target/release/fencekeeper
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 300); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "not ready: $1" >&2; exit 2; }
b64() { printf '%s' "$1" | base64 -w0; }

up=$(port)
mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<CONF
daemon off; master_process off; worker_processes 1; error_log $work/nginx/error.log warn; pid $work/nginx/nginx.pid;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $work/nginx/body;
  server { listen 127.0.0.1:$up; location / { return 204; } } }
CONF
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" >"$work/nginx.log" 2>&1 & pids+=($!)
target/release/fencekeeper-services --dir "$work/services" etcd >"$work/services.env" & pids+=($!)
until grep -qs '^FK_ETCD=' "$work/services.env" && grep -qs '^FK_READY=1' "$work/services.env"; do kill -0 $! 2>/dev/null || exit 2; sleep 0.1; done
. "$work/services.env"
etcd=${FK_ETCD#http://}
gw=$(port); admin=$(port)
"$fk" serve --upstream "127.0.0.1:$up" --listen "127.0.0.1:$gw" --admin "127.0.0.1:$admin" \
    --etcd "$etcd" >"$work/gateway.log" 2>&1 & pids+=($!)
wait_http "http://127.0.0.1:$admin/healthz"
wait_http "http://127.0.0.1:$up/"

# The fixed token's mark, written once through the gateway; its record is what the raw
# compare compares with.
curl -fsS -o /dev/null -X PUT -H 'fencing-token: 1' --data x "http://127.0.0.1:$gw/fixed"
key=$(b64 "/fencekeeper/marks//fixed")
value=$(curl -fsS -X POST "http://$etcd/v3/kv/range" -d "{\"key\":\"$key\"}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["value"])')

cat >"$work/gw-fixed.lua" <<'LUA'
wrk.method = "PUT"; wrk.body = "x"; wrk.headers["fencing-token"] = "1"
LUA
cat >"$work/gw-rising.lua" <<'LUA'
local n = os.time() * 100000
request = function()
  n = n + 1
  return wrk.format("PUT", "/rising", { ["fencing-token"] = string.format("%.0f", n) }, "x")
end
LUA
cat >"$work/etcd-fixed.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"compare":[{"key":"$key","target":"VALUE","result":"EQUAL","value":"$value"}],"success":[],"failure":[{"request_range":{"key":"$key"}}]}'
LUA
rising_key=$(b64 "/bench/rising")
cat >"$work/etcd-rising.lua" <<LUA
local n = os.time() * 100000
request = function()
  n = n + 1
  -- 16 digits: valid base64 (the gateway's values are base64), a new value each time.
  local body = '{"compare":[],"success":[{"request_put":{"key":"$rising_key","value":"' .. string.format("%016.0f", n) .. '"}}]}'
  return wrk.format("POST", "/v3/kv/txn", nil, body)
end
LUA

# One row: URL SCRIPT CONNECTIONS -> requests/s and non-2xx
run() {
  local out
  out=$(wrk -t1 -c"$3" -d"${duration}s" -s "$work/$2.lua" "$1")
  python3 - "$out" <<'PY'
import re, sys
t = sys.argv[1]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", t)
print(f"{rps:.0f} {bad.group(1) if bad else 0}")
PY
}

for round in $(seq "$rounds"); do
  for c in 1 8; do
    for tok in fixed rising; do
      echo "etcd-txn $tok $c $(run "http://$etcd/v3/kv/txn" "etcd-$tok" "$c")" >>"$work/results"
      echo "gateway $tok $c $(run "http://127.0.0.1:$gw/$tok" "gw-$tok" "$c")" >>"$work/results"
    done
  done
done
python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, tok, c, rps, bad = line.split()
    rows.setdefault((tok, int(c)), {}).setdefault(who, []).append((float(rps), int(bad)))
print("| tokens | conns | etcd Txn req/s (median) | gateway req/s (median) | gateway / etcd | non-2xx |")
print("|---|---|---|---|---|---|")
for (tok, c), by in sorted(rows.items()):
    e = statistics.median(r for r, _ in by["etcd-txn"])
    g = statistics.median(r for r, _ in by["gateway"])
    bad = sum(b for _, b in by["etcd-txn"] + by["gateway"])
    print(f"| {tok} | {c} | {e:.0f} | {g:.0f} | {g / e:.2f}x | {bad} |")
PY
