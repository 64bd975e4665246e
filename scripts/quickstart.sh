#!/usr/bin/env bash
# Fencekeeper in one minute, with no services: the lock-and-pause story told to the
# `fencekeeper` command, which decides with the bundled WebAssembly guest and keeps
# marks in an embedded file store (.fencekeeper/quickstart.redb, started afresh).
#
# The first run compiles the project (a few minutes: wasmtime is large).
set -euo pipefail
cd "$(dirname "$0")/.."
# Cargo's own progress shows: the first build is long, and a silent one looks hung.
echo "Building the fencekeeper command: the first build compiles wasmtime (about 6 minutes on 2 cores); later ones take seconds." >&2
cargo build --release -p fencekeeper-cli
fk=target/release/fencekeeper
store=.fencekeeper/quickstart.redb
mkdir -p .fencekeeper && rm -f "$store"

step() {
    printf '\n$ fencekeeper admit --store %s %s\n' "$store" "$*"
    set +e; "$fk" admit --store "$store" "$@"; code=$?; set -e
    echo "(exit $code)"
}

echo "Worker A acquires the lock on orders/2026-11.csv with fencing token 33, writes, then pauses."
step orders/2026-11.csv 33
echo
echo "A's lease expires. Worker B acquires the lock: token 34, and writes."
step orders/2026-11.csv 34
echo
echo "A wakes up, unaware it lost the lock, and writes with its old token 33:"
step orders/2026-11.csv 33
echo
echo "B writes again with its token 34 (the current holder may write any number of times):"
step orders/2026-11.csv 34
printf '\n$ fencekeeper marks --store %s\n' "$store"
"$fk" marks --store "$store"
echo
echo "The same story over HTTP, with curl writing to a real store (nginx) through the"
echo "gateway while etcd holds the lock and one worker is paused with SIGSTOP: scripts/demo.sh"
