#!/usr/bin/env bash
# The deterministic simulator (tests/sim/README.md): lock holders, fence instances and
# a slow store on a virtual clock, one thread, every draw from one seed, judged by the
# torture checker's rules. Bugs, put in on purpose to show the checker finds them:
# skip-gate, admit-stale, equal-passes, header-kept, cas-lowers, lost-marks (with
# --file-marks), with --shared-gate local-gate, and with --conditional lend-unchecked,
# lend-stale, release-given-up. --faults draws only those kinds: instance-crash,
# store-slow, store-past-bound, etcd-stall, etcd-lost-replies. --filter: the instances
# are the Envoy filter's .wasm, marks in the simulated etcd (with --shared-gate its
# in-flight registry there too; with --conditional its conditional writes, chains in
# etcd; with --own-marks its shared data).
#
#   scripts/simulate.sh [--seed N] [--requests N | --seconds S]
#                       [--shared-gate | --conditional] [--filter]
#                       [--own-marks | --file-marks] [--clock-skew MS]
#                       [--faults K1,K2] [--bug NAME]
#                       [--skip-faults 1,4] [--skip-pauses 2,9] [--no-shrink]
#
# Without --seed, a seed is drawn from /dev/urandom and printed. Without --requests or
# --seconds, 100,000 requests. Prints the seed, the requests simulated, the violations
# and the trace's digest; the same seed and request count give the same digest. On a
# violation, the run is shrunk (fewer requests, faults and pauses, the same rule
# broken; --no-shrink skips it) and the findings, the shrunk run's first finding's
# trace lines and the commands that replay the run and the shrunk run are printed;
# --skip-faults and --skip-pauses are how the shrunk replay drops faults and pauses.
# Exit 0: no violation; 1: a violation; 2: bad arguments or a failed build.
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
seed=""
while (($#)); do
    case "$1" in
        --seed) seed="$2"; shift 2 ;;
        --requests | --seconds | --bug | --skip-faults | --skip-pauses | --clock-skew | --faults) args+=("$1" "$2"); shift 2 ;;
        --shared-gate | --own-marks | --file-marks | --conditional | --filter | --no-shrink) args+=("$1"); shift ;;
        -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "simulate.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -z $seed ]]; then
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
fi

# FENCEKEEPER_SKIP_BUILD=1: run target/release/fencekeeper-sim as it is, as
# scripts/test.sh does after building the workspace.
if [[ -z ${FENCEKEEPER_SKIP_BUILD:-} ]]; then
    cargo build -q --release --locked -p fencekeeper-sim || exit 2
elif [[ ! -x target/release/fencekeeper-sim ]]; then
    echo "simulate.sh: FENCEKEEPER_SKIP_BUILD is set but target/release/fencekeeper-sim was not built" >&2
    exit 2
fi
status=0
target/release/fencekeeper-sim --seed "$seed" "${args[@]}" || status=$?
if ((status == 1)); then
    echo "simulate.sh: violation with seed $seed; replay with the command on the 'replay:' or 'replay shrunk:' line above" >&2
fi
exit "$status"
