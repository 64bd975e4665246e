#!/usr/bin/env bash
# Rebuild every WebAssembly guest from source: scripts/build-guests.sh [--check]
#
#   (no flag)  build into guest/artifacts/ (then commit the changed files).
#   --check    build into a temporary directory and compare. On the reference
#              toolchain every byte must match the committed artifact (exit 1 when
#              one differs, naming the file). On the fallback toolchain bytes cannot
#              be compared; the fresh build is kept and its directory printed on
#              stdout as `FENCEKEEPER_GUEST_DIR=DIR`, for the tests to load instead
#              of the committed artifacts.
#
# Toolchains (see docs/building.md):
#   reference  rustup's 1.95.0 with the wasm32-unknown-unknown target (added with
#              `rustup target add` when missing). Only this one reproduces the bytes.
#   fallback   Debian's rustc-web/cargo-web/rust-web-src (installed with apt-get when
#              the target cannot be had), building core/alloc/std from source.
#              FK_TOOLCHAIN=fallback forces it (to test that path).
#
# Interface of a guest: every guest/<name>/build.sh is run as `build.sh OUTDIR` and
# writes its *.wasm into OUTDIR (test guests into OUTDIR/test-guests/, each named
# after the test file that uses it). It reads:
#   FK_CARGO         the cargo command to run.
#   FK_BUILD_STD=1   set on the fallback toolchain: add `-Z build-std=core,alloc`
#                    (no_std guests) or `-Z build-std=std,panic_abort` (std guests).
#   FK_COMPONENTIZE  the native `fencekeeper-componentize` binary (core -> component).
#   RUSTC, RUSTC_BOOTSTRAP, CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER
#                    already exported for the chosen toolchain.
# The guests are built from a copy of guest/, crates/ and wit/ at a fixed path (below), so
# build.sh finds the sources beside itself as usual. A guest remaps its source paths
# (--remap-path-prefix) and builds with --locked, so its bytes depend only on the
# sources, its Cargo.lock and the toolchain.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
artifacts=$repo/guest/artifacts
reference=1.95.0
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: scripts/build-guests.sh [--check]" >&2; exit 2 ;;
esac
say() { echo "build-guests: $*" >&2; }
# Each guest builds in its own target directory under the stage below. A caller's
# CARGO_TARGET_DIR would give them one: a guest's variants then overwrite each other's
# output, and the validator built with its test faults was copied as the validator.
unset CARGO_TARGET_DIR

toolchain=""
for candidate in "$reference" stable; do
  [[ ${FK_TOOLCHAIN:-} == fallback ]] && break
  if rustup run "$candidate" rustc -V 2>/dev/null | grep -q "^rustc $reference "; then
    toolchain=$candidate
    break
  fi
done
if [[ -n $toolchain ]] && ! rustup +"$toolchain" target list --installed | grep -qx wasm32-unknown-unknown; then
  say "adding the wasm32-unknown-unknown target to rustup's $toolchain"
  rustup +"$toolchain" target add wasm32-unknown-unknown >&2 || toolchain=""
fi

if [[ -n $toolchain ]]; then
  mode=reference
  export FK_CARGO="cargo +$toolchain" RUSTC="$(rustup +"$toolchain" which rustc)"
else
  mode=fallback
  say "rustup $reference with wasm32-unknown-unknown is not available: using Debian's rustc-web"
  if [[ ! -x /usr/bin/rustc || ! -x /usr/bin/cargo ]]; then
    apt-get install -y rustc-web cargo-web rust-web-src >&2
  fi
  # Debian's /usr/bin/rust-lld links to the LLVM lld of the same version (lld-22 for
  # rustc-web 1.96), which rustc-web does not pull in by itself.
  if [[ ! -x /usr/bin/rust-lld ]]; then
    apt-get install -y "$(basename "$(readlink /usr/bin/rust-lld)")" >&2
  fi
  export FK_CARGO=/usr/bin/cargo RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 FK_BUILD_STD=1
  # Debian ships rust-lld as /usr/bin/rust-lld (package rust-web-llvm), not in the sysroot.
  export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=/usr/bin/rust-lld
fi
say "toolchain: $mode ($($RUSTC -V))"

# The component tool runs natively: build it from the root workspace (its version
# is pinned there), with the usual native toolchain when there is one (sharing the
# root target directory's cache), else with the chosen cargo.
(cd "$repo" && env -u RUSTC -u RUSTC_BOOTSTRAP cargo build --release -q -p fencekeeper-componentize 2>/dev/null) ||
  (cd "$repo" && $FK_CARGO build --release -q -p fencekeeper-componentize)
export FK_COMPONENTIZE=$repo/target/release/fencekeeper-componentize

if [[ $check == 1 ]]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/fencekeeper-guests.XXXXXX")
else
  out=$artifacts
fi
# Build from a copy of the sources at one fixed path. Cargo hashes the absolute path
# of a path dependency that lies outside the building workspace (crates/core, for
# each guest workspace) into symbol names, and that was seen to change the code
# layout between two checkouts; --remap-path-prefix cannot reach that hash. The copy
# gets fresh mtimes, so cargo rebuilds the local crates and never trusts stale
# output; registry dependencies stay cached in the stage's target directories.
stage=/tmp/fencekeeper-guest-build
mkdir -p "$stage/guest"
exec 9>"$stage.lock"
flock 9
rm -rf "$stage/wit" && cp -r "$repo/wit" "$stage/wit"
# The crates the guests share with the hosts (crates/core, crates/etcd-wire).
rm -rf "$stage/crates" && cp -r "$repo/crates" "$stage/crates"
# crates/core inherits its package fields from the root workspace manifest.
cp "$repo/Cargo.toml" "$stage/Cargo.toml"
for dir in "$repo"/guest/*/; do
  name=$(basename "$dir")
  [[ $name == artifacts ]] && continue
  mkdir -p "$stage/guest/$name"
  find "$stage/guest/$name" -mindepth 1 -maxdepth 1 ! -name target -exec rm -rf {} +
  find "$dir" -mindepth 1 -maxdepth 1 ! -name target -exec cp -r {} "$stage/guest/$name/" \;
done
for script in "$stage"/guest/*/build.sh; do
  say "building $(basename "$(dirname "$script")")"
  "$script" "$out" >&2
done

# A test guest exists for one test file, named after it (wasmtime's test-programs rule),
# less the tier's e2e_ prefix of a module in tests/tests/all.
status=0
for guest in "$out"/test-guests/*.wasm; do
  [[ -e $guest ]] || continue
  name=$(basename "$guest" .wasm)
  if [[ -z $(find "$repo/host" "$repo/tests" \( -path "*/tests/$name.rs" -o -path "*/tests/all/$name.rs" \
      -o -path "*/tests/all/e2e_$name.rs" \) -print -quit) ]]; then
    say "test guest $name.wasm has no test file tests/$name.rs: name it after the test that uses it"
    status=1
  fi
done

if [[ $check == 0 ]]; then
  say "wrote the guests to ${out#"$repo"/}; commit the changed files"
  exit $status
fi

if [[ $mode == fallback ]]; then
  say "fallback toolchain: its bytes cannot be compared with the committed artifacts (built by rustc $reference)."
  say "the tests must run against this fresh build instead:"
  echo "FENCEKEEPER_GUEST_DIR=$out"
  exit $status
fi

(cd "$out" && find . -name '*.wasm' | sort) >"$out/.built"
(cd "$artifacts" && find . -name '*.wasm' | sort) >"$out/.committed"
while read -r file; do
  if ! cmp -s "$out/$file" "$artifacts/$file"; then
    if [[ -e $artifacts/$file ]]; then
      say "guest/artifacts/${file#./} differs from a rebuild from source ($out/${file#./});"
    else
      say "guest/artifacts/${file#./} is built from source but not committed;"
    fi
    say "  run scripts/build-guests.sh and commit guest/artifacts, or find what made the build differ"
    status=1
  fi
done <"$out/.built"
for file in $(comm -13 "$out/.built" "$out/.committed"); do
  say "guest/artifacts/${file#./} is committed but no guest builds it any more: remove it"
  status=1
done
if [[ $status == 0 ]]; then
  say "every committed guest artifact is byte-identical to its rebuild from source"
  rm -rf "$out"
fi
exit $status
