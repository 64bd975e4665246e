#!/usr/bin/env bash
# The lock-and-pause story with real processes: scripts/demo.sh [fencekeeper-demo flags]
#
# etcd is the lock service (a lease with a 2 s TTL; the token is the lock key's
# revision), nginx WebDAV is a store that accepts any write, and the gateway is
# `fencekeeper serve`. Two workers import the same records with curl (the token in a
# `fencing-token` header); one is paused with
# SIGSTOP past its lease while the other takes the lock and imports, then it resumes
# with its old token. The story runs straight to the store, then through the gateway,
# and a table compares what landed. `--help` lists the flags (`--work-dir DIR` keeps
# every service's files and logs; `--json` prints the result as JSON).
#
# Builds the `fencekeeper` command and the demo (the harness crate's `fencekeeper-demo`,
# which runs the gateway from the `fencekeeper` binary beside it). Needs etcd, nginx
# and curl: scripts/install-deps.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="/usr/sbin:$PATH"
cargo build --release --quiet -p fencekeeper-cli -p fencekeeper-harness
exec target/release/fencekeeper-demo "$@"
