#!/usr/bin/env bash
# The torture run (tests/README.md, "Torture"): a 3-member etcd cluster, two gateways
# and two Envoys with marks in it, a file-store gateway, an instrumented store, many
# lock holders, a nemesis injecting faults, then a checker over the logs.
#
#   scripts/torture.sh [--seconds N] [--seed S] [--target all|gateways,envoys,file]
#                      [--out DIR] [--min-writes N] [--max-seconds N] [--faults K1,K2]
#                      [--holders N] [--conditional]
#
# Prints the seed (replay the same fault schedule with --seed), a report, and one
# summary line. Exit 0: no violation; 1: a violation (its history window and an SVG
# timeline are in DIR/findings); 2: the harness itself failed. Everything it starts is
# stopped, and its tmpfs unmounted, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):/usr/sbin:$PATH"
export PATH

out=""
args=()
while (($#)); do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --seconds | --seed | --target | --min-writes | --max-seconds | --faults | --holders) args+=("$1" "$2"); shift 2 ;;
        --conditional) args+=("$1"); shift ;;
        -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "torture.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -z $out ]]; then
    out=$(mktemp -d "${TMPDIR:-/tmp}/fencekeeper-torture.XXXXXX")
fi
mkdir -p "$out"

# The same build as scripts/test.sh (the same features: nothing is rebuilt there).
cargo build -q --release --workspace --bins --examples --locked

# The runner and every service it starts share this process group; a signal or an
# error ends them all, and the file store's tmpfs goes with them.
cleanup() {
    # The group outlives its leader when the runner itself died: end it either way.
    if [[ -n ${pid:-} ]] && kill -0 -- "-$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null || true
        sleep 1
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    if mountpoint -q "$out/gwfile-disk" 2>/dev/null; then
        umount -l "$out/gwfile-disk" || true
    fi
}
trap cleanup EXIT INT TERM

setsid target/release/fencekeeper-torture run --out "$out" "${args[@]}" &
pid=$!
status=0
wait "$pid" || status=$?
exit "$status"
