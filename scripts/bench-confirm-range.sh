#!/usr/bin/env bash
# The etcd confirm as a plain Range beside today's compare Txn, on one etcd, in
# interleaved rounds:
#   scripts/bench-confirm-range.sh [SECONDS_PER_ROW [ROUNDS]]   (default 3 and 5)
#
# A holder writing again presents the token equal to the mark, and the store must hear
# from etcd that the mark has not moved. Today that is a Txn comparing the mark's record
# (no put; the key read back on failure); the alternative reads the key with a plain
# linearizable Range and compares the record in the host. Both from the store's own
# client (host/fencekeeper/benches/etcd_txn.rs: one HTTP/2 connection, each thread one
# call at a time), on one mark (fixed) and on 64 marks in turn (spread), with 1 and 8
# threads. Per row: requests a second, and etcd's CPU a request (user + system, from
# /proc). Prints medians over the rounds and each alternative's ratio to the Txn.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-3}
rounds=${2:-5}
. scripts/lib/bench.sh

peer=$(bench_binary etcd_txn)
start_services etcd
etcd=${FK_ETCD#http://}
etcdpid=$(pgrep -f -- "--listen-client-urls=http://$etcd( |$)")
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
"$fk" marks --etcd "$etcd" --raise /fixed 1 >/dev/null 2>&1
for i in $(seq 0 63); do "$fk" marks --etcd "$etcd" --raise "/spread/$i" 1 >/dev/null 2>&1; done

echo "confirm as a Range beside the compare Txn: $(nproc) cores, ${duration}s a row, $rounds rounds, $(date -u '+%F %H:%M UTC')"
rows=$work/rows.txt
: >"$rows"
for round in $(seq 1 "$rounds"); do
  for conns in 1 8; do
    for mode in fixed fixed-range spread spread-range; do
      before=$(ticks "$etcdpid")
      read -r rate errors < <("$peer" "http://$etcd" "$mode" "$conns" "$duration")
      after=$(ticks "$etcdpid")
      [ "$errors" = 0 ] || { echo "$mode: $errors errors" >&2; exit 1; }
      echo "$conns $mode $rate $(( after - before ))" >>"$rows"
    done
  done
done
python3 - "$rows" "$duration" "$hz" <<'PY'
import statistics, sys
rows, duration, hz = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
data = {}
for line in open(rows):
    conns, mode, rate, ticks = line.split()
    cpu_us = float(ticks) / hz * 1e6 / (float(rate) * duration)
    data.setdefault((int(conns), mode), []).append((float(rate), cpu_us))
print()
print("| threads | marks | Txn req/s | Range req/s | ratio | etcd CPU a Txn | etcd CPU a Range | ratio |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
for conns in (1, 8):
    for marks in ("fixed", "spread"):
        txn, rng = data[(conns, marks)], data[(conns, marks + "-range")]
        t_rate, r_rate = statistics.median(r for r, _ in txn), statistics.median(r for r, _ in rng)
        t_cpu, r_cpu = statistics.median(c for _, c in txn), statistics.median(c for _, c in rng)
        print(f"| {conns} | {marks} | {t_rate:.0f} | {r_rate:.0f} | {r_rate / t_rate:.2f} | {t_cpu:.1f} µs | {r_cpu:.1f} µs | {r_cpu / t_cpu:.2f} |")
PY
