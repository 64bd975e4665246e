#!/usr/bin/env bash
# The gateway's admits over an etcd store, awaited on the request's task (the default)
# beside the same gateway with --blocking-admits (every admit on tokio's blocking
# pool, as before), in interleaved rounds:
#   scripts/bench-async-admit.sh [SECONDS_PER_ROW [ROUNDS]]   (default 5 and 3)
#
# Both gateways share one etcd and stand in front of nginx answering 204 (a store
# that costs nothing, so the fence's cost shows). wrk PUTs one fixed token (the holder
# writing again: a confirm), rising tokens (every admit advances the mark: a
# compare-and-swap), or one fixed token on 64 resources in turn (spread), with 1 and 8
# connections. Besides requests a second and latency, each row records the gateway's
# CPU and its threads' context switches per request (every thread woken is one), and
# etcd's gRPC Txn from the store's own client (host/fencekeeper/benches/etcd_txn.rs)
# for scale. Needs wrk, nginx, etcd (scripts/install-deps.sh); prints a table for
# BENCHMARKS.md; stops what it starts.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5}
rounds=${2:-3}
. scripts/lib/bench.sh

peer=$(bench_binary etcd_txn)
start_nginx_204
start_services etcd
start_gateway awaited awaited "127.0.0.1:$up" --etcd "$FK_ETCD"
awaited_pid=${pids[-1]}
start_gateway blocking blocking "127.0.0.1:$up" --etcd "$FK_ETCD" --blocking-admits
blocking_pid=${pids[-1]}

# CPU a process has used, in clock ticks (user + system), and its threads' context
# switches (voluntary and not), summed over every thread alive.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {n += $2} END {print n}'; }

# The marks the fixed and spread rows write again, once (both gateways, one etcd).
curl -fsS -o /dev/null -X PUT -H 'fencing-token: 1' --data x "http://127.0.0.1:$awaited/fixed"
for i in $(seq 0 63); do
  curl -fsS -o /dev/null -X PUT -H 'fencing-token: 1' --data x "http://127.0.0.1:$awaited/spread/$i"
done

for round in $(seq "$rounds"); do
  for c in 1 8; do
    for tok in fixed rising spread; do
      [[ $tok == spread && $c == 1 ]] && continue
      echo "grpc $tok $c 0 0 $("$peer" "$FK_ETCD" "$tok" "$c" "$duration") 0 0" >>"$work/results"
      for who in awaited blocking; do
        pid_var=${who}_pid; port=${!who}
        path=$tok; [[ $tok == rising ]] && path=rising-$who-$round-$c
        t0=$(ticks "${!pid_var}"); s0=$(switches "${!pid_var}")
        read -ra n < <(wrk -t1 -c"$c" -d"${duration}s" --latency -s "scripts/lib/put-$tok.lua" \
          "http://127.0.0.1:$port/$path" | wrk_numbers)
        echo "$who $tok $c ${n[*]} $(($(ticks "${!pid_var}") - t0)) $(($(switches "${!pid_var}") - s0))" >>"$work/results"
      done
    done
  done
done
python3 - "$work/results" "$duration" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
rows = {}
duration, hz = float(sys.argv[2]), float(sys.argv[3])
for line in open(sys.argv[1]):
    who, tok, c, p50, p99, rps, bad, ticks, sw = line.split()[:9]
    n = float(rps) * duration
    rows.setdefault((tok, int(c)), {}).setdefault(who, []).append(
        (float(rps), float(p50), float(p99), int(bad), 1e6 * int(ticks) / hz / n if n else 0, int(sw) / n if n else 0))
med = lambda xs, i: statistics.median(x[i] for x in xs)
print("| tokens | conns | etcd gRPC Txn req/s | blocking req/s | awaited req/s | awaited / blocking | p50 blocking / awaited, µs | p99 blocking / awaited, µs | gateway CPU a request, blocking / awaited, µs | context switches a request, blocking / awaited | non-2xx |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (tok, c), by in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    b, a, g = by["blocking"], by["awaited"], by["grpc"]
    bad = sum(x[3] for x in a + b)
    print(f"| {tok} | {c} | {med(g, 0):.0f} | {med(b, 0):.0f} | {med(a, 0):.0f} | {med(a, 0) / med(b, 0):.2f}x | "
          f"{med(b, 1):.0f} / {med(a, 1):.0f} | {med(b, 2):.0f} / {med(a, 2):.0f} | {med(b, 4):.0f} / {med(a, 4):.0f} | "
          f"{med(b, 5):.1f} / {med(a, 5):.1f} | {bad} |")
PY
