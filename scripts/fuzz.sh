#!/usr/bin/env bash
# Run every fuzz target in fuzz/ and host/capi/fuzz/ (tests/README.md, "Fuzzing") for
# SECONDS each, one per core at a time; CI runs them for a short, fixed time through
# scripts/test.sh. host/capi/fuzz is its own cargo-fuzz directory because its target
# (the C ABI) links the host library and wasmtime, which fuzz/'s pure targets must not
# build.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     default: 60 seconds, every target
#
# Exit 0 when no target crashed, 1 when one did (its input is printed and kept
# under DIR/artifacts/TARGET/), 2 on a usage or setup error.
#
# Each target starts from its committed seeds in DIR/corpus/TARGET; what libFuzzer
# finds on the way goes to a temporary directory, so the committed corpus does not
# change. To keep a finding as a seed, copy it there by hand.
#
#   FK_FUZZ_SANITIZER=address   build with AddressSanitizer (default: none; see
#                               tests/README.md for why)
#   FK_FUZZ_DIRS=fuzz           only the targets in these directories (default: fuzz
#                               host/capi/fuzz; CI leaves out host/capi/fuzz, whose
#                               build compiles wasmtime again)
#   FK_FUZZ_JOBS=N              targets run at once (default: one per core)
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
read -r -a fuzz_dirs <<<"${FK_FUZZ_DIRS:-fuzz host/capi/fuzz}"
# cargo-fuzz has no --locked: check that each Cargo.lock needs no change first.
for dir in "${fuzz_dirs[@]}"; do
    cargo fetch --locked --manifest-path "$dir/Cargo.toml" --quiet
done

flags=(-s "$sanitizer" --debug-assertions)
declare -A dir_of
for dir in "${fuzz_dirs[@]}"; do
    while read -r t; do dir_of[$t]=$dir; done < <(cd "$dir" && cargo fuzz list)
done
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    for dir in "${fuzz_dirs[@]}"; do
        mapfile -t -O "${#targets[@]}" targets < <(cd "$dir" && cargo fuzz list)
    done
fi
for target in "${targets[@]}"; do
    [[ -n ${dir_of[$target]:-} ]] || { say "no fuzz target $target in ${fuzz_dirs[*]}"; exit 2; }
done
at_once=${FK_FUZZ_JOBS:-$(nproc)}
[[ $at_once =~ ^[0-9]+$ && $at_once -gt 0 ]] || { say "FK_FUZZ_JOBS must be a positive number"; exit 2; }
say "$(rustc -V), cargo-fuzz $cargo_fuzz_version, sanitizer $sanitizer, ${seconds}s per target, $at_once at a time"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One build per directory with a target to run: cargo links its targets in parallel.
for dir in "${fuzz_dirs[@]}"; do
    wanted=0
    for target in "${targets[@]}"; do [[ ${dir_of[$target]} == "$dir" ]] && wanted=1; done
    [[ $wanted == 1 ]] || continue
    started=$SECONDS
    if ! cargo fuzz build "${flags[@]}" --fuzz-dir "$dir" >"$work/build.log" 2>&1; then
        cat "$work/build.log" >&2
        say "the fuzz targets in $dir do not build"
        exit 2
    fi
    say "built $dir in $((SECONDS - started))s"
done
started=$SECONDS

# One target per core at a time: each fuzzer runs on one thread, so on two cores two
# targets take about the wall time of one (each does 75 to 90% of the runs it does alone).
run_target() { # target -> its log, and its one-line result in $work/$target.result
    local target=$1 dir=${dir_of[$1]} log=$work/$1.log
    mkdir -p "$work/$target"
    local args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
    [[ -f $dir/dict/$target.dict ]] && args+=(-dict="$dir/dict/$target.dict")
    if cargo fuzz run "${flags[@]}" --fuzz-dir "$dir" "$target" "$work/$target" "$dir/corpus/$target" -- "${args[@]}" >"$log" 2>&1; then
        stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
        echo "ok, $(stat number_of_executed_units) runs, $(stat average_exec_per_sec) exec/s, $(stat new_units_added) new inputs" \
            >"$work/$target.result"
    else
        echo CRASHED >"$work/$target.result"
    fi
}
for target in "${targets[@]}"; do
    while (($(jobs -rp | wc -l) >= at_once)); do wait -n || true; done
    run_target "$target" &
done
wait

failed=()
for target in "${targets[@]}"; do
    dir=${dir_of[$target]}
    log=$work/$target.log
    result=$(cat "$work/$target.result" 2>/dev/null || echo CRASHED)
    if [[ $result != CRASHED ]]; then
        say "$target: $result"
    else
        # What failed: the panic, or libFuzzer's own finding (timeout, out of memory).
        grep -m1 -A6 -e 'panicked at' -e '^==[0-9]*== ERROR: libFuzzer' "$log" >&2 || tail -n 40 "$log" >&2
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        say "$target: CRASHED; input: ${artifact:-(none written; see the log above)}"
        say "  reproduce: cargo fuzz run ${flags[*]} --fuzz-dir $dir $target ${artifact:-}"
        failed+=("$target")
    fi
done

say "took $((SECONDS - started))s"
if [[ ${#failed[@]} -gt 0 ]]; then
    say "crashed: ${failed[*]}"
    exit 1
fi
say "no crash"
