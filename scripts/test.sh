#!/usr/bin/env bash
# Fencekeeper's whole test suite, from a clean clone: installs what the tests need,
# checks the committed guest artifacts against a rebuild from source, builds, and
# runs every test tier (tests/README.md). The tests start their own etcd, ZooKeeper,
# Redis (with the Fencekeeper module), nginx, Envoy and PostgreSQL (with the extension)
# on loopback. Everything runs in release: wasmtime is built once for all.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each part says when it starts, so that a run's log shows where its time goes (CI
# keeps the whole run under 30 minutes on 2 cores).
section() { printf '== %s (at %dm%02ds)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)) >&2; }

# A full disk fails deep inside rustc or a store's write with an error that names
# neither; say it first. A run here takes about 3 GiB (target/ and the temporary stores).
need_kib=$((4 * 1024 * 1024))
for where in . "${TMPDIR:-/tmp}"; do
    free_kib=$(df -Pk "$where" | awk 'NR == 2 { print $4 }')
    if ((free_kib < need_kib)); then
        echo "test: $((free_kib / 1024)) MiB free on the disk holding $(cd "$where" && pwd); the build and tests need about 4 GiB: free some space (old target/ directories, temporary stores)" >&2
        exit 1
    fi
done

scripts/install-deps.sh
# Envoy comes from a PyPI wheel; nginx lives in /usr/sbin: put both on PATH.
PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):/usr/sbin:$PATH"
export PATH

# Every process started from here on inherits this marker, by which
# scripts/lib/leftovers.sh finds what the tests left running. It is set after
# install-deps.sh: a daemon a package's installation starts is not the tests'.
FENCEKEEPER_TEST_RUN="$$-$RANDOM"
export FENCEKEEPER_TEST_RUN
log="" installed="" leftovers_checked=""
on_exit() {
    local status=$?
    [[ -n $log ]] && rm -f "$log"
    [[ -n $installed ]] && rm -rf "$installed"
    # A run that fails midway (or is interrupted) names its leftovers too; its exit
    # status stays the failure's.
    if ((status != 0)) && [[ -z $leftovers_checked ]]; then
        scripts/lib/leftovers.sh || true
    fi
}
trap on_exit EXIT

section "format"
if cargo fmt --version >/dev/null 2>&1; then
    for ws in . guest/validator guest/filter fuzz host/capi/fuzz; do
        (cd "$ws" && cargo fmt --all --check >/dev/null) \
            || { echo "$ws is not formatted: run cargo fmt --all there" >&2; exit 1; }
    done
else
    echo "rustfmt is not installed; format not checked (rustup component add rustfmt)" >&2
fi

section "guest artifacts: rebuild from source and compare"
# On the reference toolchain this fails when a committed .wasm differs from its
# rebuild. On the fallback toolchain it prints FENCEKEEPER_GUEST_DIR=<fresh build>,
# and the tests then load the guests from there instead of the committed bytes.
guest_env=$(scripts/build-guests.sh --check)
if [[ $guest_env == FENCEKEEPER_GUEST_DIR=* ]]; then
    export "${guest_env?}"
    section "tests run against the fresh fallback build in ${FENCEKEEPER_GUEST_DIR}"
fi

section "the library crates package on their own"
# The quick half of `cargo publish --dry-run` (docs/building.md): metadata and file lists.
cargo package -q --no-verify --allow-dirty --locked -p fencekeeper-core -p fencekeeper-engine -p fencekeeper-chain -p fencekeeper-etcd-wire -p fencekeeper

section "build"
# --lib builds the Redis module (a cdylib, libfencekeeper_redis.so), which the Redis
# tests load into redis-server, and libfencekeeper_capi.{so,a} in target/release, for
# the Python and Go callers below (`cargo test` leaves them in target/release/deps).
cargo build --release --workspace --lib --bins --examples --locked

section "the PostgreSQL extension (built above) installed into Debian's PostgreSQL 15"
# tests/tests/all/postgres_*.rs start their own servers from this installation, and fail
# if what is installed is not this build.
scripts/install-postgres-extension.sh --no-build

section "tests"
log=$(mktemp)
# The proxy-wasm filter is its own workspace (it builds for wasm32); its unit tests
# run natively.
(cd guest/filter && cargo test --release --locked) 2>&1 | tee -a "$log"
cargo test --release --workspace --locked 2>&1 | tee -a "$log"

section "callers of the C ABI outside Rust (the C programs ran above, in host/capi/tests)"
# Over target/release/libfencekeeper_capi.so, which the tests above built.
(cd host/capi/python && python3 -m pytest -q -p no:cacheprovider) 2>&1 | tee -a "$log"
(cd host/capi/go && go test -count=1 -v ./...) 2>&1 | grep -v '^=== RUN' | tee -a "$log"

section "the committed validator component in other hosts: wasmtime-py, Node (jco, bare core module)"
(cd host/runtimes/python && python3 -m pytest -q -p no:cacheprovider) 2>&1 | tee -a "$log"
(cd host/runtimes/node && npm test --silent) 2>&1 | tee -a "$log" | grep -E '^(not ok|# (pass|fail))'

section "torture: lock holders, a nemesis and a checker (tests/README.md, Torture)"
# Three minutes of load under faults, at least 60,000 checked writes (about 400 a second
# on 2 cores with the shared ordering gate); a violation fails the run and leaves its
# history window and SVG in the printed directory. (It was four: the simulator below
# now takes a minute of CI, on millions of writes, and the run stays under 30 minutes.)
scripts/torture.sh --seconds 180 --min-writes 60000 --max-seconds 240 2>&1 | tee -a "$log" | grep -v -E '^torture: (fault|[0-9]+ writes, )' || {
    # The fault schedule, which the display above leaves out: what each finding's
    # message places the write against.
    grep '^torture: fault' "$log" >&2 || true
    echo "the torture run failed (its seed is printed above; replay with scripts/torture.sh --seed S)" >&2
    exit 1
}

section "torture with conditional writes: the gateways and Envoys, no store apply bound, no start grace"
# The store honours If-Match here; every write that lands out of order on a claimed
# group is a violation, late or not (about 100 s).
scripts/torture.sh --conditional --target all --seconds 60 2>&1 | tee -a "$log" | grep -v -E '^torture: (fault|[0-9]+ writes, )' || {
    grep '^torture: fault' "$log" >&2 || true
    echo "the conditional torture run failed (its seed is printed above; replay with scripts/torture.sh --conditional --target all --seed S)" >&2
    exit 1
}

section "the deterministic simulator: a minute on fresh seeds (tests/sim/README.md)"
# Each run prints its seed; a violation prints the shortened trace and the command that
# replays it. About 55 s of writes and 15 s of judging them: the ordering gate local
# and shared; conditional writes, whose lend terms are read on the instances' clocks,
# apart by up to 90 ms either way (less than the 200 ms upstream timeout, which absorbs
# it); and the Envoy filter's own binary in the in-process proxy-wasm host, as
# envoy-config configures it: marks and the in-flight registry in the simulated etcd,
# or its conditional writes' chains there.
# On the binary the workspace build made, with no cargo call per run. Each run says
# when it starts: one CI run spent 5 minutes in this part although its runs
# reported 74 s between them, and the log is to show where the rest went.
export FENCEKEEPER_SKIP_BUILD=1
for run in "--seconds 16" "--seconds 10 --shared-gate" "--seconds 12 --conditional --clock-skew 90" \
    "--seconds 8 --filter --shared-gate" "--seconds 8 --filter --conditional"; do
    section "simulate.sh $run"
    read -r -a run_args <<<"$run"
    scripts/simulate.sh "${run_args[@]}" 2>&1 | tee -a "$log"
done
unset FENCEKEEPER_SKIP_BUILD

section "the quickstart, as a newcomer runs it: a paused holder's late write refused in front of a real store"
# On the binary the workspace build above made: `cargo build -p fencekeeper-cli` alone
# unifies features differently and would build the library again (about 2 minutes).
quick=$(FENCEKEEPER_SKIP_BUILD=1 scripts/quickstart.sh 2>&1) || { echo "$quick" >&2; echo "the quickstart failed" >&2; exit 1; }
echo "$quick" | tee -a "$log"
if ! grep -q '^HTTP/1.1 409 Conflict$' <<<"$quick" || ! grep -qx 'from B, token 34' <<<"$quick"; then
    echo "the quickstart did not end with the late write refused (409) and the store keeping B's write" >&2
    exit 1
fi

section "release artifacts, used as a user would: the sums, the command from its tarball, a C program against the library's"
dist=$(mktemp -d)
scripts/release.sh --no-build "$dist" 2>&1 | tee -a "$log"
(cd "$dist" && sha256sum -c SHA256SUMS) | tee -a "$log"
for archive in "$dist"/*.tar.gz; do tar -C "$dist" -xzf "$archive"; done
released=$(echo "$dist"/fencekeeper-*-linux)
# Each output is taken whole before grep reads it: `producer | grep -q` under pipefail
# fails when grep's early exit leaves the producer writing into a closed pipe.
version=$("$released/bin/fencekeeper" --version)
grep -q "filter sha256:$(sha256sum guest/artifacts/fencekeeper_filter.wasm | cut -d' ' -f1)" <<<"$version"
"$released/bin/fencekeeper" admit --store "$dist/marks.redb" orders/2026-11.csv 34
if "$released/bin/fencekeeper" admit --store "$dist/marks.redb" orders/2026-11.csv 33; then
    echo "the released command admitted a stale token" >&2
    exit 1
fi
test -s "$released/share/man/man1/fencekeeper-serve.1" && test -s "$released/deploy/systemd/fencekeeper-gateway.service"
# The shipped settings file, checked by the shipped command outside the checkout.
(cd "$dist" && "$released/bin/fencekeeper" check "$released/deploy/fencekeeper.toml") | tee -a "$log"
# The Go module from the library's tarball, used by a module of its own outside the
# checkout (no network: the module is replaced by the tarball's directory).
mkdir -p "$dist/goapp"
cat >"$dist/goapp/main.go" <<'GO'
package main

import (
	"fmt"
	"os"

	"fencekeeper"
)

func main() {
	guard, err := fencekeeper.Open(fencekeeper.Options{StorePath: "go-marks.redb"})
	if err != nil {
		panic(err)
	}
	token := func(t string) *string { return &t }
	first, err := guard.Admit("orders/2026-11.csv", token("34"))
	if err != nil || !first.Admitted {
		panic(fmt.Sprint("34 not admitted: ", first, err))
	}
	stale, err := guard.Admit("orders/2026-11.csv", token("33"))
	if err != nil || stale.Admitted {
		fmt.Fprintln(os.Stderr, "33 admitted after 34:", stale, err)
		os.Exit(1)
	}
	fmt.Println("go module: admitted 34, refused 33:", stale.Reason)
}
GO
golib=$(echo "$dist"/libfencekeeper_capi-*-linux)
(cd "$dist/goapp" && go mod init example.com/goapp >/dev/null 2>&1 &&
    go mod edit -require fencekeeper@v0.0.0 -replace "fencekeeper=$golib/go" &&
    GOFLAGS=-mod=mod GOPROXY=off go build -o goapp . &&
    linked=$(ldd goapp) && grep -q "$golib/go/../lib/libfencekeeper_capi.so" <<<"$linked" && ./goapp) | tee -a "$log"
# The Python wheel in a fresh venv outside the checkout, with no hint of where the
# library is: it must use the one it carries.
python3 -m venv "$dist/venv"
"$dist/venv/bin/pip" install -q --no-index "$dist"/fencekeeper-*.whl
(cd "$dist" && env -u FENCEKEEPER_CAPI_LIB "$dist/venv/bin/python" - "$dist/venv" <<'PY'
import sys
import fencekeeper
library = fencekeeper._library_path()
assert library.startswith(sys.argv[1]), f"loaded {library}, not the wheel's"
guard = fencekeeper.Guard(store=fencekeeper.FileStore("wheel-marks.redb"))
assert guard.admit("orders/2026-11.csv", "34").admitted
stale = guard.admit("orders/2026-11.csv", "33")
assert not stale.admitted and stale.mark == "34", stale
print(f"wheel: admitted 34, refused 33 with the library it carries ({library})")
PY
) | tee -a "$log"
# The npm package installed into an empty directory (offline: it depends on nothing)
# and run: the committed validator, through the package's own entry point.
mkdir -p "$dist/nodeapp"
(cd "$dist/nodeapp" && npm install --offline --no-audit --no-fund --silent "$dist"/fencekeeper-component-*.tgz &&
    node --input-type=module -e "
import { validator, admit, canonical } from 'fencekeeper-component';
const utf8 = (s) => new TextEncoder().encode(s);
const guest = await validator();
const admitted = admit(guest, false, utf8('orders/2026-11.csv'), utf8('34'), canonical('33'));
const stale = admit(guest, false, utf8('orders/2026-11.csv'), utf8('33'), canonical('34'));
if (admitted.kind !== 'admit' || !admitted.advanced || stale.kind !== 'stale') {
  console.error('the npm package decided', admitted, stale);
  process.exit(1);
}
console.log('npm package: admitted 34 over 33, refused 33 under 34');
") | tee -a "$log"
# The filter's OCI image through a real registry, as Istio pulls it.
scripts/lib/registry_check.sh "$dist" "$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)" | tee -a "$log"
# The gateway's container image under podman: a stale write refused, the mark kept
# across containers on one volume.
scripts/lib/image_check.sh | tee -a "$log"
library=$(echo "$dist"/libfencekeeper_capi-*-linux)
cc -o "$dist/release_check" scripts/lib/release_check.c -I "$library/include" -L "$library/lib" -lfencekeeper_capi \
    -Wl,-rpath,"$library/lib"
"$dist/release_check" | tee -a "$log"
rm -rf "$dist"

section "an installed binary is enough: the CLI alone, run from elsewhere, writes a working Envoy setup"
# The binary the build above made, copied out of the checkout as `cargo install` would
# (not `cargo install` itself: its feature set differs from the workspace's, so it
# would rebuild wasmtime, minutes on a 2-core machine, to prove nothing more; that
# the crates package on their own is checked above).
installed=$(mktemp -d)
install -D -m 755 target/release/fencekeeper "$installed/bin/fencekeeper"
(
    cd "$installed"
    mkdir -p envoy
    bin/fencekeeper envoy-config --upstream 127.0.0.1:8080 --write-filter envoy/fencekeeper_filter.wasm >envoy/envoy.yaml
    cmp -s envoy/fencekeeper_filter.wasm "$OLDPWD/guest/artifacts/fencekeeper_filter.wasm"
    envoy --mode validate --disable-hot-restart -c envoy/envoy.yaml >/dev/null
) || { echo "the installed fencekeeper's Envoy configuration was refused" >&2; exit 1; }

section "fuzz: every target in fuzz/ for 10 s, one per core at a time (scripts/fuzz.sh)"
# Not host/capi/fuzz's `abi`: its build instruments wasmtime, a second wasmtime build
# of about six minutes on 2 cores. The C ABI's own tests ran above; run the target
# with `scripts/fuzz.sh 60 abi`.
FK_FUZZ_DIRS=fuzz scripts/fuzz.sh 10

section "nothing the tests started is still running"
# A service that outlives its test keeps its port and its files; one line per leftover.
leftovers_checked=yes
scripts/lib/leftovers.sh

# cargo ends on the summary of its last test binary; print the whole suite's.
# (and pytest's, go test -v's and node --test's own lines).
awk '/^test result:/ { passed += $4; failed += $6; ignored += $8 }
     /^[0-9]+ (passed|failed)/ { for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) passed += $i; if ($(i+1) ~ /^failed/) failed += $i; if ($(i+1) ~ /^skipped/) ignored += $i } }
     /^--- PASS: / { passed++ } /^--- FAIL: / { failed++ }
     /^# pass / { passed += $3 } /^# fail / { failed += $3 }
     END { printf "fencekeeper: %d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"
section "done"
