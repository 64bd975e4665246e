#!/usr/bin/env bash
# Build the proxy-wasm filter: guest/proxy-wasm/build.sh OUTDIR
# Writes OUTDIR/fencekeeper_filter.wasm. Environment (set by scripts/build-guests.sh):
#   FK_CARGO       the cargo command (default: cargo)
#   FK_BUILD_STD=1 add -Z build-std=std,panic_abort (the Debian rustc-web fallback)
#
# Reproducible bytes: paths are remapped (--remap-path-prefix), and the sources are
# built from one fixed directory. Cargo hashes the absolute path of a path
# dependency that lies outside the building workspace (the core, ../core) into its
# symbol names, and the symbol order decides the function order in the module; a
# fixed source path keeps that order the same in every clone.
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
out=$(mkdir -p "$out" && cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cargo_cmd=${FK_CARGO:-cargo}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
sysroot=$(${RUSTC:-rustc} --print sysroot)
src=/tmp/fencekeeper-proxy-wasm-src

extra=()
if [[ ${FK_BUILD_STD:-0} == 1 ]]; then
  extra+=(-Z build-std=std,panic_abort)
fi

# One build at a time uses the fixed directory.
exec 9>"$src.lock"
flock 9
rm -rf "$src"
mkdir -p "$src/guest/proxy-wasm"
cp "$repo/Cargo.toml" "$src/"   # the core inherits workspace.package fields from it
cp -R "$repo/guest/core" "$src/guest/core"
cp -R "$here/Cargo.toml" "$here/Cargo.lock" "$here/src" "$src/guest/proxy-wasm/"

# The last matching prefix wins, so the most specific come last.
flags="--remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$sysroot=/rustc-sysroot --remap-path-prefix=$src=/fencekeeper"
cd "$src/guest/proxy-wasm"
RUSTFLAGS="$flags" $cargo_cmd build --release --locked --target wasm32-unknown-unknown \
  --target-dir "$here/target" ${extra[@]+"${extra[@]}"}
cp "$here/target/wasm32-unknown-unknown/release/fencekeeper_filter.wasm" "$out/fencekeeper_filter.wasm"
echo "wrote $out/fencekeeper_filter.wasm ($(wc -c <"$out/fencekeeper_filter.wasm") bytes)"
