#!/usr/bin/env bash
# Build the validator component: guest/validator/build.sh OUTDIR
# Writes OUTDIR/fencekeeper_validator.wasm (the bundled guest) and
# OUTDIR/test-guests/guest_faults.wasm (the fault-injection guest used by
# host/fencekeeper/tests/all/guest_faults.rs). Environment (set by scripts/build-guests.sh):
#   FK_CARGO         the cargo command (default: cargo)
#   FK_BUILD_STD=1   add -Z build-std=core,alloc (the Debian rustc-web fallback)
#   FK_COMPONENTIZE  the native fencekeeper-componentize binary (core module -> component)
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cargo_cmd=${FK_CARGO:-cargo}
componentize=${FK_COMPONENTIZE:?FK_COMPONENTIZE must name the fencekeeper-componentize binary}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
sysroot=$(${RUSTC:-rustc} --print sysroot)

# Keep the bytes independent of where the checkout, the registry and the sysroot
# live. The last matching prefix wins, so the most specific come last.
flags="--remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$sysroot=/rustc-sysroot --remap-path-prefix=$repo=/fencekeeper"
extra=()
if [[ ${FK_BUILD_STD:-0} == 1 ]]; then
  extra+=(-Z build-std=core,alloc)
fi

cd "$here"
core=target/wasm32-unknown-unknown/release/fencekeeper_validator.wasm
build() { # build FEATURES DEST
  RUSTFLAGS="$flags" $cargo_cmd build --release --locked --target wasm32-unknown-unknown --features "$1" "${extra[@]}"
  mkdir -p "$(dirname "$2")"
  "$componentize" "$core" "$2"
  echo "wrote $2 ($(wc -c <"$2") bytes)"
}
build "" "$out/fencekeeper_validator.wasm"
build faults "$out/test-guests/guest_faults.wasm"
