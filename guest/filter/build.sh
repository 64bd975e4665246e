#!/usr/bin/env bash
# Build the proxy-wasm filter: guest/filter/build.sh OUTDIR
# Writes OUTDIR/fencekeeper_filter.wasm, and OUTDIR/test-guests/filter_faults.wasm (the
# `faults` build, for tests/tests/all/e2e_filter_faults.rs). Environment (set by
# scripts/build-guests.sh):
#   FK_CARGO       the cargo command (default: cargo)
#   FK_BUILD_STD=1 add -Z build-std=std,panic_abort (the Debian rustc-web fallback)
#
# Why a workspace of its own, and so this copy: the filter builds for wasm32 only
# (the root workspace's `cargo build --workspace` and `cargo test` are native), and
# its own Cargo.lock pins exactly what goes into the artifact, whatever the host's
# dependencies do. Outside the root workspace, the core is a path dependency from
# another workspace, and that costs the fixed directory below.
#
# Reproducible bytes: paths are remapped (--remap-path-prefix), and the sources are
# built from one fixed directory. Cargo hashes the absolute path of a path
# dependency that lies outside the building workspace (crates/*) into its
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
src=/tmp/fencekeeper-filter-src

extra=()
if [[ ${FK_BUILD_STD:-0} == 1 ]]; then
  extra+=(-Z build-std=std,panic_abort)
fi

# One build at a time uses the fixed directory.
exec 9>"$src.lock"
flock 9
rm -rf "$src"
mkdir -p "$src/guest/filter"
cp "$repo/Cargo.toml" "$src/"   # the crates inherit workspace.package fields from it
cp -R "$repo/crates" "$src/crates"   # core, etcd-wire, filter-config
cp -R "$here/Cargo.toml" "$here/Cargo.lock" "$here/src" "$src/guest/filter/"

# The last matching prefix wins, so the most specific come last.
flags="--remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$sysroot=/rustc-sysroot --remap-path-prefix=$src=/fencekeeper"
cd "$src/guest/filter"
build() { # build FEATURES DEST
  RUSTFLAGS="$flags" $cargo_cmd build --release --locked --target wasm32-unknown-unknown \
    --target-dir "$here/target" --features "$1" ${extra[@]+"${extra[@]}"}
  mkdir -p "$(dirname "$2")"
  cp "$here/target/wasm32-unknown-unknown/release/fencekeeper_filter.wasm" "$2"
  echo "wrote $2 ($(wc -c <"$2") bytes)"
}
build "" "$out/fencekeeper_filter.wasm"
build faults "$out/test-guests/filter_faults.wasm"
