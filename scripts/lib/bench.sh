# Shared plumbing of the HTTP benchmark scripts (sourced, not run): the scratch
# directory, its services and free ports (scratch.sh); readiness checks; a fast
# upstream; wrk's output read into numbers.
#
# After sourcing: $work (scratch directory), $fk (the release CLI), pids (the
# background processes cleanup stops). Start services in the sourcing shell, never
# inside $(...): a process started in a subshell records its PID in the subshell's
# copy of pids, and cleanup never stops it.

PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):/usr/sbin:$PATH"
for tool in wrk nginx curl; do
    command -v "$tool" >/dev/null || { echo "$tool not found; run scripts/install-deps.sh" >&2; exit 2; }
done
cargo build --release --quiet -p fencekeeper-cli -p fencekeeper-harness
fk=$PWD/target/release/fencekeeper
. "$(dirname "${BASH_SOURCE[0]}")/scratch.sh"

wait_http() { # URL [TEXT the body must contain]
    for _ in $(seq 1 300); do
        if [ -z "${2:-}" ]; then curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
        elif curl -fsS "$1" 2>/dev/null | grep -q "$2"; then return 0; fi
        sleep 0.1
    done
    echo "not ready: $1" >&2; exit 2
}

# The path of the library's bench binary NAME (host/fencekeeper/benches/NAME.rs),
# built with the etcd feature.
bench_binary() { # NAME
    cargo bench --no-run -q -p fencekeeper --features etcd --bench "$1" --message-format=json |
      python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]: print(m["executable"])' "$1"
}

# Services from the test harness, started as the tests start them (FK_* variables
# set here); the harness stops them when it is stopped. It says why on stderr if it
# cannot start them.
start_services() { # SERVICE...
    target/release/fencekeeper-services --dir "$work/services" "$@" >"$work/services.env" & pids+=($!)
    until grep -qs '^FK_READY=1' "$work/services.env"; do kill -0 $! 2>/dev/null || exit 2; sleep 0.1; done
    . "$work/services.env"
}

# `fencekeeper serve` in front of UPSTREAM (HOST:PORT) with ARGS, its log
# $work/NAME.log; sets VAR to its port once /healthz answers. The benches' tokens are
# counters, not etcd revisions: no provenance check unless ARGS ask for one.
start_gateway() { # VAR NAME UPSTREAM ARGS...
    local p a; p=$(port); a=$(port)
    FENCEKEEPER_PROVENANCE=off RUST_LOG=warn "$fk" serve --upstream "http://$3" --listen "127.0.0.1:$p" --admin "127.0.0.1:$a" \
        "${@:4}" >"$work/$2.log" 2>&1 &
    pids+=($!)
    wait_http "http://127.0.0.1:$a/healthz" ok
    printf -v "$1" '%s' "$p"
}

# Envoy with one worker, configured by `fencekeeper envoy-config --upstream UPSTREAM
# ARGS...`, its log $work/NAME.log; sets VAR to its listener's port and $envoy_pid to
# its process once /ready answers.
start_envoy() { # VAR NAME UPSTREAM ARGS...
    local l a; l=$(port); a=$(port)
    "$fk" envoy-config --upstream "$3" --listen "$l" --admin "$a" "${@:4}" >"$work/$2.yaml"
    envoy -c "$work/$2.yaml" --concurrency 1 --disable-hot-restart --log-level error >"$work/$2.log" 2>&1 &
    pids+=($!)
    envoy_pid=$!
    wait_http "http://127.0.0.1:$a/ready"
    printf -v "$1" '%s' "$l"
}

# nginx answering 204 to everything: a store that costs nothing, so the cost of what
# stands in front of it shows. Sets $up to its port.
start_nginx_204() {
    up=$(port)
    mkdir -p "$work/nginx"
    cat >"$work/nginx/nginx.conf" <<CONF
daemon off; master_process off; worker_processes 1; error_log $work/nginx/error.log warn; pid $work/nginx/nginx.pid;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $work/nginx/body;
  server { listen 127.0.0.1:$up; location / { return 204; } } }
CONF
    nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" >"$work/nginx.log" 2>&1 & pids+=($!)
    wait_http "http://127.0.0.1:$up/"
}

# wrk's report (with --latency) on stdin -> "p50_us p99_us requests_per_s non2xx".
wrk_numbers() {
    python3 -c '
import re, sys
t = sys.stdin.read()
def us(v):
    n, u = re.match(r"([\d.]+)(us|ms|s)", v).groups()
    return float(n) * {"us": 1, "ms": 1e3, "s": 1e6}[u]
p = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", t, re.M))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", t)
p50, p99 = us(p["50"]), us(p["99"])
print(f"{p50:.0f} {p99:.0f} {rps:.0f} {bad.group(1) if bad else 0}")'
}
