#!/usr/bin/env bash
# Fencekeeper in two minutes after the build: a paused lock holder's late write refused
# by the fence in front of a real HTTP store. It starts a small file store
# (scripts/lib/file_store.py: it trusts every write, as most storage does) and the
# gateway in front of it (`fencekeeper serve`), then writes with curl as two lock
# holders would, and shows what the store kept. Everything it starts stops with it.
#
# The first run compiles the project (about 6 minutes on 2 cores: wasmtime is large).
# Needs python3 and curl.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in python3 curl; do
  command -v "$tool" >/dev/null || { echo "quickstart: $tool is needed (apt-get install $tool)" >&2; exit 2; }
done
# Cargo's own progress shows: the first build is long, and a silent one looks hung.
# (FENCEKEEPER_SKIP_BUILD=1: use target/release/fencekeeper as it is, as scripts/test.sh
# does after building the workspace.)
if [[ -z ${FENCEKEEPER_SKIP_BUILD:-} ]]; then
  echo "Building the fencekeeper command: the first build compiles wasmtime (about 6 minutes on 2 cores); later ones take seconds." >&2
  cargo build --release -p fencekeeper-cli
fi
fk=$PWD/target/release/fencekeeper

# $work, pids and their cleanup on exit, and port(): the benchmark scripts' plumbing.
. scripts/lib/scratch.sh
# Waits for a condition (a port file written, a ready endpoint), never a fixed sleep.
wait_for() {
  local what=$1; shift
  for _ in $(seq 200); do "$@" && return 0; sleep 0.05; done
  echo "quickstart: $what did not come up" >&2
  exit 1
}

python3 scripts/lib/file_store.py "$work/store" "$work/store.port" &
pids+=($!)
wait_for "the store" test -s "$work/store.port"
store=127.0.0.1:$(cat "$work/store.port")
listen=127.0.0.1:$(port)
admin=127.0.0.1:$(port)
"$fk" serve --upstream "$store" --listen "$listen" --admin "$admin" --store "$work/marks.redb" 2>"$work/gateway.log" &
pids+=($!)
wait_for "the gateway (log: $work/gateway.log)" curl -fsS -o /dev/null "http://$admin/readyz"

url=http://$listen/orders/2026-11.csv
write() {
  local token=$1 body=$2
  printf '\n$ curl -X PUT -H "fencing-token: %s" --data-binary "%s" %s\n' "$token" "$body" "$url"
  curl -sS -i -X PUT -H "fencing-token: $token" --data-binary "$body" "$url" |
    tr -d '\r' | grep -E '^(HTTP/|fencing-highest:)|^[a-z].*token' || true
}

echo
echo "A file store on $store, and the fence (fencekeeper serve) in front of it on $listen."
echo
echo "Worker A holds the lock on orders/2026-11.csv with fencing token 33, writes, then pauses."
write 33 "from A, token 33"
echo
echo "A's lease expires. Worker B takes the lock: token 34. B writes."
write 34 "from B, token 34"
echo
echo "A wakes up, unaware it lost the lock, and writes with its old token 33:"
write 33 "from A, late"
echo
printf '$ cat store/orders/2026-11.csv   # what the store kept\n'
cat "$work/store/orders/2026-11.csv"
echo
echo
echo "The store kept B's write: the fence refused A's (409, fencing-highest: 34)."
echo "Next: put it in front of your store (README.md, \"Put it in front of a store\")."
