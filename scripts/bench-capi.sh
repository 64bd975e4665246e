#!/usr/bin/env bash
# One admit through the C ABI, from C and from Python, beside the same admit as a
# Rust library call, in one run (memory store, the bundled wasm validator with its
# verdict cache on, one thread; median of 15 rounds of 20,000 admits, thread CPU time):
#   scripts/bench-capi.sh [ROUNDS_OF_ALL]     (default 1: each caller once, in turn)
# Prints each caller's lines, then a table of medians and ratios to the Rust library
# call, as BENCHMARKS.md shows it ("Admit through the C ABI").
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-1}

cargo build --release -q -p fencekeeper-capi --lib --bench admit
bench=$(cargo bench -q -p fencekeeper-capi --bench admit --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and "admit" in m["target"]["name"]]' | tail -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -std=c11 -O2 -I host/capi/include host/capi/c/bench.c -L target/release -lfencekeeper_capi \
    -Wl,-rpath,"$PWD/target/release" -o "$work/bench-c"

for _ in $(seq 1 "$repeat"); do
    "$bench"
    "$work/bench-c"
    python3 host/capi/python/bench.py
done | tee "$work/results"

python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    path, scenario, ns = line.split()
    rows.setdefault((path, scenario), []).append(float(ns))
print("\n| caller | repeating (ns) | × Rust library | advancing (ns) | × Rust library |")
print("|---|---|---|---|---|")
for path in ["rust-library", "rust-abi", "c", "python-ctypes", "python-module"]:
    cells = []
    for scenario in ["repeating", "advancing"]:
        ns = statistics.median(rows[(path, scenario)])
        base = statistics.median(rows[("rust-library", scenario)])
        cells += [f"{ns:.0f}", f"{ns / base:.2f}"]
    print(f"| {path} | " + " | ".join(cells) + " |")
PY
