# A scratch directory and the background processes started in it, stopped and
# removed on exit, and free loopback ports: the plumbing every benchmark script
# shares (sourced, not run; scripts/lib/bench.sh sources it too).
#
# After sourcing: $work (the scratch directory), pids (the background processes
# cleanup stops). Start services in the sourcing shell, never inside $(...): a
# process started in a subshell records its PID in the subshell's copy of pids, and
# cleanup never stops it.

work=$(mktemp -d)
pids=()
# Stop every service and wait for it to exit, so that none outlives the script (and
# none still writes into $work while it is removed).
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
