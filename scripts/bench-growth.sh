#!/usr/bin/env bash
# Benchmark: how the file store and etcd grow with the number of marks they hold
# (host/fencekeeper/benches/growth.rs): bytes per mark, admit p50/p99 of a holder
# writing again and of an advance at each size, and for the file store the time to
# open it again (every page verified: a gateway's start-up) and to verify every record
# (`marks --verify`), and what retention's compactions take (one that forgets nothing
# yet, one that forgets every mark).
#
# Usage: scripts/bench-growth.sh [FILE_SIZES] [ETCD_SIZES]
#   default: "1000 100000 1000000" for the file store, "1000 100000" for etcd
#   etcd at 10^7: FENCEKEEPER_GROWTH_FILL=txn FENCEKEEPER_GROWTH_FORGET=no \
#                 scripts/bench-growth.sh "" "1000000 10000000"
#   (filled by Txns of 128 puts; see host/fencekeeper/benches/growth.rs)
# Prints Markdown tables for BENCHMARKS.md. Needs etcd (scripts/install-deps.sh),
# started by the test harness with a fresh data directory.
set -euo pipefail
cd "$(dirname "$0")/.."
file_sizes=${1-"1000 100000 1000000"}
etcd_sizes=${2-"1000 100000"}

. scripts/lib/scratch.sh
cargo build --release --quiet -p fencekeeper-harness
cargo bench --no-run --quiet -p fencekeeper --features etcd --bench growth 2>/dev/null
bench=$(ls -t target/release/deps/growth-* | grep -v '\.d$' | head -1)

echo "growth: 16 threads fill each size; 2,000 single admits measured at each; $(nproc) cores; $(date -u +%F)"
echo
FENCEKEEPER_BENCH_DIR=$work "$bench" file $file_sizes
echo
target/release/fencekeeper-services --dir "$work/services" etcd >"$work/services.env" & pids+=($!)
until grep -qs '^FK_READY=1' "$work/services.env"; do kill -0 $! 2>/dev/null || exit 2; sleep 0.1; done
. "$work/services.env"
"$bench" "etcd=http://127.0.0.1:${FK_ETCD##*:}" $etcd_sizes | tail -n +3
