# A redis-server for the benchmark scripts (sourced, not run): on a free loopback port,
# without persistence, in a scratch directory, stopped and removed on exit.
#
#   . scripts/lib/redis.sh
#   start_redis [DIRECTIVE...]     # e.g. --loadmodule "$PWD/target/release/libfencekeeper_redis.so"
#
# Afterwards: $port, $work (the scratch directory, its log redis.log), $redis_pid.
# Call start_redis in the sourcing shell, never inside $(...): cleanup must see the PID.

work=$(mktemp -d)
redis_pid=""
cleanup() {
    if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

start_redis() {
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" "$@" >"$work/redis.log" 2>&1 &
    redis_pid=$!
    for _ in $(seq 1 100); do
        redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0
        sleep 0.1
    done
    echo "Redis did not start: $(tail -3 "$work/redis.log")" >&2
    exit 2
}
