#!/usr/bin/env bash
# Build the gateway's container image (deploy/container/Containerfile) from this
# checkout's release build, with podman:
#
#   scripts/build-image.sh [--no-build] [IMAGE]    IMAGE: fencekeeper-gateway:VERSION
#
# The image holds target/release/fencekeeper and the shared libraries it links (ldd
# names them: glibc's loader, libc, libm, libgcc_s), copied from this machine: the
# release build, not a second (static, musl) build of wasmtime. $PODMAN replaces the
# `podman` command (the tests give it a storage and a runtime of their own).
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [[ ${1:-} == --no-build ]]; then build=0; shift; fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image=${1:-fencekeeper-gateway:$version}
if ((build)); then cargo build --release --locked -p fencekeeper-cli; fi
binary=target/release/fencekeeper
[[ -x $binary ]] || { echo "build-image: $binary is missing: run without --no-build" >&2; exit 1; }
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/rootfs/usr/local/bin" "$context/marks"
install -m 755 "$binary" "$context/rootfs/usr/local/bin/fencekeeper"
for library in $(ldd "$binary" | grep -oE '/[^ ]+'); do
  mkdir -p "$context/rootfs$(dirname "$library")"
  cp -L "$library" "$context/rootfs$library"
done
# The certificates a TLS upstream's CA file is checked with come from the user
# (--upstream-cacert); nothing else is needed from /etc.
${PODMAN:-podman} build -q -t "$image" -f deploy/container/Containerfile "$context" >/dev/null
echo "$image"
