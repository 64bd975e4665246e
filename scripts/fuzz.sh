#!/usr/bin/env bash
# Run every fuzz target in fuzz/ (tests/README.md, "Fuzzing") for SECONDS each, one
# after the other; CI runs them for a short, fixed time through scripts/test.sh.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     default: 60 seconds, every target
#
# Exit 0 when no target crashed, 1 when one did (its input is printed and kept
# under fuzz/artifacts/TARGET/), 2 on a usage or setup error.
#
# Each target starts from its committed seeds in fuzz/corpus/TARGET; what libFuzzer
# finds on the way goes to a temporary directory, so the committed corpus does not
# change. To keep a finding as a seed, copy it there by hand.
#
#   FK_FUZZ_SANITIZER=address   build with AddressSanitizer (default: none; see
#                               tests/README.md for why)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "fuzz: $*" >&2; }
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { say "usage: scripts/fuzz.sh [SECONDS] [TARGET...]"; exit 2; }
shift $(($# > 0 ? 1 : 0))
sanitizer=${FK_FUZZ_SANITIZER:-none}
cargo_fuzz_version=0.13.2

# Without a sanitizer cargo-fuzz passes only flags that stable rustc takes. A
# sanitizer needs -Zsanitizer, which the pinned stable accepts under RUSTC_BOOTSTRAP
# (its rust-std carries the sanitizer runtimes).
if [[ $sanitizer != none ]]; then
    export RUSTC_BOOTSTRAP=1
    sysroot=$(rustc --print sysroot)
    runtime=${sanitizer:0:1}san   # address -> asan, memory -> msan, thread -> tsan, leak -> lsan
    if ! compgen -G "$sysroot/lib/rustlib/*/lib/librustc-*_rt.$runtime.a" >/dev/null; then
        say "$(rustc -V) has no $sanitizer runtime in $sysroot; run with FK_FUZZ_SANITIZER=none"
        exit 2
    fi
fi
if ! cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $cargo_fuzz_version"; then
    say "installing cargo-fuzz $cargo_fuzz_version (cargo install, about a minute)"
    cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked --quiet
fi
# cargo-fuzz has no --locked: check that fuzz/Cargo.lock needs no change first.
cargo fetch --locked --manifest-path fuzz/Cargo.toml --quiet

flags=(-s "$sanitizer" --debug-assertions --fuzz-dir fuzz)
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi
say "$(rustc -V), cargo-fuzz $cargo_fuzz_version, sanitizer $sanitizer, ${seconds}s per target"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$SECONDS
# One build for every target: cargo links them in parallel.
if ! cargo fuzz build "${flags[@]}" >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    say "the fuzz targets do not build"
    exit 2
fi
say "built in $((SECONDS - started))s"

failed=()
for target in "${targets[@]}"; do
    log=$work/$target.log
    mkdir -p "$work/$target"
    args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
    [[ -f fuzz/dict/$target.dict ]] && args+=(-dict="fuzz/dict/$target.dict")
    if cargo fuzz run "${flags[@]}" "$target" "$work/$target" "fuzz/corpus/$target" -- "${args[@]}" >"$log" 2>&1; then
        stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
        say "$target: ok, $(stat number_of_executed_units) runs, $(stat average_exec_per_sec) exec/s," \
            "$(stat new_units_added) new inputs"
    else
        # What failed: the panic, or libFuzzer's own finding (timeout, out of memory).
        grep -m1 -A6 -e 'panicked at' -e '^==[0-9]*== ERROR: libFuzzer' "$log" >&2 || tail -n 40 "$log" >&2
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        say "$target: CRASHED; input: ${artifact:-(none written; see the log above)}"
        say "  reproduce: cargo fuzz run ${flags[*]} $target ${artifact:-}"
        failed+=("$target")
    fi
done

say "took $((SECONDS - started))s"
if [[ ${#failed[@]} -gt 0 ]]; then
    say "crashed: ${failed[*]}"
    exit 1
fi
say "no crash"
