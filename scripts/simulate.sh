#!/usr/bin/env bash
# The deterministic simulator (tests/sim/README.md): lock holders, fence instances and
# a slow store on a virtual clock, one thread, every draw from one seed, judged by the
# torture checker's rules. Bugs, put in on purpose to show the checker finds them:
# skip-gate, admit-stale, equal-passes, lend-unchecked, release-given-up (the last two
# with --conditional).
#
#   scripts/simulate.sh [--seed N] [--requests N | --seconds S]
#                       [--shared-gate | --conditional] [--own-marks] [--bug NAME]
#
# Without --seed, a seed is drawn from /dev/urandom and printed. Without --requests or
# --seconds, 100,000 requests. Prints the seed, the requests simulated, the violations
# and the trace's digest; the same seed and request count give the same digest. Exit
# 0: no violation; 1: a violation (the findings, the first one's trace lines and the
# command that replays the run are printed); 2: bad arguments or a failed build.
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
seed=""
while (($#)); do
    case "$1" in
        --seed) seed="$2"; shift 2 ;;
        --requests | --seconds | --bug) args+=("$1" "$2"); shift 2 ;;
        --shared-gate | --own-marks | --conditional) args+=("$1"); shift ;;
        -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "simulate.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -z $seed ]]; then
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
fi

cargo build -q --release --locked -p fencekeeper-sim || exit 2
status=0
target/release/fencekeeper-sim --seed "$seed" "${args[@]}" || status=$?
if ((status == 1)); then
    echo "simulate.sh: violation with seed $seed; replay with the command on the 'replay:' line above" >&2
fi
exit "$status"
