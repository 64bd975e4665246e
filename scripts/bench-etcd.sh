#!/usr/bin/env bash
# The gateway with its marks in etcd beside etcd's own Txn, on the same etcd, in
# interleaved rounds:
#   scripts/bench-etcd.sh [SECONDS_PER_ROW [ROUNDS]]   (default 5 and 3)
#
#   etcd-txn     wrk straight to etcd's JSON gateway (POST /v3/kv/txn): for the fixed
#                token, the compare the gateway needs (value equal, read back on
#                failure); for rising tokens, a Txn that puts a new value
#   etcd-grpc    the same Txns over etcd's gRPC API, as the gateway sends them, from
#                the store's own client (host/fencekeeper/benches/etcd_txn.rs: one
#                HTTP/2 connection, one call at a time per connection's thread)
#   gateway      wrk to `fencekeeper serve --etcd` in front of nginx answering 204
#                (a store that costs nothing, so the fence's cost shows): PUTs with
#                one fixed token (the holder writing again), rising tokens (every
#                admit advances the mark), or one fixed token on 64 resources in turn
#                (spread: holders of different resources; etcd's row compares each
#                key in turn)
#   shared-gate  the same gateway with --shared-gate: each write also registered in
#                the in-flight registry in etcd (one more Txn) and deleted after its
#                answer (one more); the cost of ordering writes across instances
#   hop          wrk to a second gateway told to fence POST alone (--fenced-methods
#                POST), so a PUT is forwarded to nginx without a check: the hop any
#                gateway makes. At one connection a request waits for its Txn and
#                then its hop, so a gateway whose fence cost nothing would serve
#                1 / (1/Txn + 1/hop) requests a second: the `floor` column.
# With 1 and 8 connections. The gateway's target is one etcd round trip per admit:
# the ratios are its throughput over etcd's own, through each API. Needs wrk, nginx, etcd
# (scripts/install-deps.sh); prints a table for BENCHMARKS.md; stops what it starts.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5}
rounds=${2:-3}
. scripts/lib/bench.sh
b64() { printf '%s' "$1" | base64 -w0; }

peer=$(bench_binary etcd_txn)
start_nginx_204
start_services etcd
etcd=${FK_ETCD#http://}
gw=$(port); admin=$(port)
"$fk" serve --upstream "127.0.0.1:$up" --listen "127.0.0.1:$gw" --admin "127.0.0.1:$admin" \
    --etcd "$etcd" --provenance off --local-gate >"$work/gateway.log" 2>&1 & pids+=($!)
gwpid=$!
sg=$(port); sgadmin=$(port)
"$fk" serve --upstream "127.0.0.1:$up" --listen "127.0.0.1:$sg" --admin "127.0.0.1:$sgadmin" \
    --etcd "$etcd" --provenance off --shared-gate >"$work/shared-gate.log" 2>&1 & pids+=($!)
hop=$(port); hopadmin=$(port)
"$fk" serve --upstream "127.0.0.1:$up" --listen "127.0.0.1:$hop" --admin "127.0.0.1:$hopadmin" \
    --etcd "$etcd" --provenance off --local-gate --fenced-methods POST >"$work/hop.log" 2>&1 & pids+=($!)
etcdpid=$(pgrep -f -- "--listen-client-urls=http://$etcd( |$)")
# CPU a process has used, in clock ticks (user + system).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wait_http "http://127.0.0.1:$admin/healthz"
wait_http "http://127.0.0.1:$hopadmin/healthz"
wait_http "http://127.0.0.1:$sgadmin/healthz"

# The fixed token's mark, written once through the gateway; its record is what the raw
# compare compares with.
curl -fsS -o /dev/null -X PUT -H 'fencing-token: 1' --data x "http://127.0.0.1:$gw/fixed"
key=$(b64 "/fencekeeper/marks//fixed")
value=$(curl -fsS -X POST "http://$etcd/v3/kv/range" -d "{\"key\":\"$key\"}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["value"])')

cat >"$work/etcd-fixed.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"compare":[{"key":"$key","target":"VALUE","result":"EQUAL","value":"$value"}],"success":[],"failure":[{"request_range":{"key":"$key"}}]}'
LUA
# Spread: one fixed token on 64 resources in turn (holders of different resources,
# whose confirms share a Txn only across resources). Each mark written once through
# the gateway; etcd's own row compares each key's record in turn.
for i in $(seq 0 63); do
  curl -fsS -o /dev/null -X PUT -H 'fencing-token: 1' --data x "http://127.0.0.1:$gw/spread/$i"
done
{
  echo 'local bodies = {'
  for i in $(seq 0 63); do
    k=$(b64 "/fencekeeper/marks//spread/$i")
    v=$(curl -fsS -X POST "http://$etcd/v3/kv/range" -d "{\"key\":\"$k\"}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["value"])')
    echo "  '{\"compare\":[{\"key\":\"$k\",\"target\":\"VALUE\",\"result\":\"EQUAL\",\"value\":\"$v\"}],\"success\":[],\"failure\":[{\"request_range\":{\"key\":\"$k\"}}]}',"
  done
  echo '}'
  echo 'local n = 0'
  echo 'request = function() n = n + 1; return wrk.format("POST", "/v3/kv/txn", nil, bodies[(n % 64) + 1]) end'
} >"$work/etcd-spread.lua"
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

# One row: URL SCRIPT CONNECTIONS -> "requests/s non-2xx"
# SCRIPT etcd-* is written above (it carries the keys and records); gw-* is the
# gateway's workload, scripts/lib/put-*.lua.
run() { # URL SCRIPT CONNECTIONS
  local n lua=$work/$2.lua
  [[ $2 == gw-* ]] && lua=scripts/lib/put-${2#gw-}.lua
  read -ra n < <(wrk -t1 -c"$3" -d"${duration}s" --latency -s "$lua" "$1" | wrk_numbers)
  echo "${n[2]} ${n[3]}"
}

for round in $(seq "$rounds"); do
  for c in 1 8; do
    for tok in fixed rising spread; do
      # Spread differs from fixed only when several connections can share a Txn.
      [[ $tok == spread && $c == 1 ]] && continue
      echo "etcd-txn $tok $c $(run "http://$etcd/v3/kv/txn" "etcd-$tok" "$c")" >>"$work/results"
      echo "etcd-grpc $tok $c $("$peer" "http://$etcd" "$tok" "$c" "$duration")" >>"$work/results"
      e0=$(ticks "$etcdpid"); g0=$(ticks "$gwpid")
      row=$(run "http://127.0.0.1:$gw/$tok" "gw-$tok" "$c")
      echo "gateway $tok $c $row $(($(ticks "$etcdpid") - e0)) $(($(ticks "$gwpid") - g0))" >>"$work/results"
      [[ $tok == fixed ]] && echo "hop $tok $c $(run "http://127.0.0.1:$hop/fixed" gw-fixed "$c")" >>"$work/results"
      [[ $tok == spread ]] || echo "shared-gate $tok $c $(run "http://127.0.0.1:$sg/$tok" "gw-$tok" "$c")" >>"$work/results"
    done
  done
done
python3 - "$work/results" "$duration" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
rows, cpu = {}, {}
duration, hz = float(sys.argv[2]), float(sys.argv[3])
for line in open(sys.argv[1]):
    who, tok, c, rps, bad, *ticks = line.split()
    rows.setdefault((tok, int(c)), {}).setdefault(who, []).append((float(rps), int(bad)))
    if ticks:
        # CPU per request, µs: the row's ticks over the requests it answered.
        n = float(rps) * duration
        cpu.setdefault((tok, int(c)), []).append(tuple(1e6 * int(t) / hz / n for t in ticks))
print("| tokens | conns | etcd Txn, JSON req/s (median) | etcd Txn, gRPC req/s (median) | gateway req/s (median) | gateway / JSON Txn | gateway / gRPC Txn | hop req/s (median) | floor: gRPC Txn then hop, req/s | gateway / floor | non-2xx |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (tok, c), by in sorted(rows.items()):
    e = statistics.median(r for r, _ in by["etcd-txn"])
    p = statistics.median(r for r, _ in by["etcd-grpc"])
    g = statistics.median(r for r, _ in by["gateway"])
    bad = sum(b for _, b in by["etcd-txn"] + by["etcd-grpc"] + by["gateway"])
    hop = floor = ratio = ""
    if "hop" in by:
        h = statistics.median(r for r, _ in by["hop"])
        hop = f"{h:.0f}"
        # One request at a time: its Txn's time and its hop's time add up.
        if c == 1:
            f = 1 / (1 / p + 1 / h)
            floor, ratio = f"{f:.0f}", f"{g / f:.2f}x"
    print(f"| {tok} | {c} | {e:.0f} | {p:.0f} | {g:.0f} | {g / e:.2f}x | {g / p:.2f}x | {hop} | {floor} | {ratio} | {bad} |")
print()
print("| tokens | conns | gateway req/s (median) | gateway --shared-gate req/s (median) | shared / local gate | non-2xx (shared) |")
print("|---|---|---|---|---|---|")
for (tok, c), by in sorted(rows.items()):
    if "shared-gate" not in by:
        continue
    g = statistics.median(r for r, _ in by["gateway"])
    s = statistics.median(r for r, _ in by["shared-gate"])
    bad = sum(b for _, b in by["shared-gate"])
    print(f"| {tok} | {c} | {g:.0f} | {s:.0f} | {s / g:.2f}x | {bad} |")
print()
print("| tokens | conns | etcd CPU per gateway request, µs (median) | gateway CPU per request, µs (median) |")
print("|---|---|---|---|")
for (tok, c), v in sorted(cpu.items()):
    print(f"| {tok} | {c} | {statistics.median(x[0] for x in v):.0f} | {statistics.median(x[1] for x in v):.0f} |")
PY
