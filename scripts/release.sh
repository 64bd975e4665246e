#!/usr/bin/env bash
# Release artifacts, built from this checkout into dist/ (or $1):
#
#   fencekeeper-VERSION-ARCH-linux.tar.gz        the command (bin/fencekeeper, with the
#       filter and the validator built in), its manual pages and shell completions
#       (made by the binary itself), the systemd unit, the Prometheus rules and the
#       Grafana dashboard, README, CHANGELOG
#   libfencekeeper_capi-VERSION-ARCH-linux.tar.gz the C library (lib/*.so, lib/*.a),
#       its header (include/fencekeeper_capi.h) and the Go module over it (go/, which
#       links ../lib: `go mod edit -replace fencekeeper=DIR/go`)
#   fencekeeper-filter-VERSION-oci.tar           the filter as an OCI image (an image
#       layout in a tar, tagged VERSION) for Istio's WasmPlugin: `skopeo copy
#       oci-archive:FILE:VERSION docker://REGISTRY/fencekeeper-filter:VERSION`;
#       fencekeeper-filter-VERSION-oci.digest names its manifest, for pinning
#   fencekeeper-VERSION-py3-none-linux_ARCH.whl  the Python package with the C library
#       in it: `pip install FILE` and `import fencekeeper`, nothing else needed
#   fencekeeper-component-VERSION.tgz            the validator for Node (`npm install
#       FILE`; jco's bindings of the committed component and the host's checks)
#   SHA256SUMS                                   `sha256sum -c SHA256SUMS` checks them
#
# The binaries are `cargo build --release` of the locked workspace. scripts/test.sh
# runs this and checks the artifacts as a user would use them.
#
#   scripts/release.sh [--no-build] [DIR]   --no-build: package target/release as it is
#                                           (what scripts/test.sh does after its build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [[ ${1:-} == --no-build ]]; then build=0; shift; fi
out=$(realpath -m "${1:-dist}")
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(uname -m)
echo "release: building fencekeeper $version for $arch-linux" >&2
if ((build)); then cargo build --release --locked -p fencekeeper-cli -p fencekeeper-capi; fi
# A build puts its outputs in target/release; `cargo test` leaves the C library's in
# target/release/deps.
built() {
  local name=$1
  for dir in target/release target/release/deps; do
    [[ -f $dir/$name ]] && { echo "$dir/$name"; return; }
  done
  echo "release: $name is not in target/release: run without --no-build" >&2
  exit 1
}
fk=$(built fencekeeper)
so=$(built libfencekeeper_capi.so)
a=$(built libfencekeeper_capi.a)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cli=fencekeeper-$version-$arch-linux
lib=libfencekeeper_capi-$version-$arch-linux

mkdir -p "$stage/$cli/bin" "$stage/$cli/share/man/man1" "$stage/$cli/share/completions" "$stage/$cli/deploy"
install -m 755 "$fk" "$stage/$cli/bin/fencekeeper"
"$stage/$cli/bin/fencekeeper" man --dir "$stage/$cli/share/man/man1"
for shell in bash zsh fish; do
  "$stage/$cli/bin/fencekeeper" completions "$shell" >"$stage/$cli/share/completions/fencekeeper.$shell"
done
cp -r deploy/systemd deploy/prometheus deploy/grafana deploy/fencekeeper.toml "$stage/$cli/deploy/"
cp -r README.md CHANGELOG.md docs "$stage/$cli/"

mkdir -p "$stage/$lib/lib" "$stage/$lib/include"
install -m 644 "$so" "$a" "$stage/$lib/lib/"
install -m 644 host/capi/include/fencekeeper_capi.h "$stage/$lib/include/"
mkdir -p "$stage/$lib/go"
install -m 644 host/capi/go/go.mod host/capi/go/fencekeeper.go host/capi/go/table.c "$stage/$lib/go/"

mkdir -p "$out"
# Reproducible archives: fixed owner, order and times (the commit's).
when=$(git log -1 --format=%ct 2>/dev/null || echo 0)
for name in "$cli" "$lib"; do
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$when" -C "$stage" -cf - "$name" |
    gzip -n >"$out/$name.tar.gz"
done
image=fencekeeper-filter-$version-oci
python3 scripts/lib/oci_image.py guest/artifacts/fencekeeper_filter.wasm "$version" "$out/$image.tar" >"$out/$image.digest"
wheel=$(basename "$(python3 scripts/lib/python_wheel.py host/capi/python/fencekeeper "$so" "$version" "$out")")
# jco (pinned by the lockfile; fetched once by npm ci) transpiles the committed
# validator; npm pack packs what npm would publish.
npm=fencekeeper-component-$version.tgz
(cd host/runtimes/node && { [[ -d node_modules ]] || npm ci --no-audit --no-fund --silent; } &&
  npm run transpile --silent && npm pack --silent --pack-destination "$out" >/dev/null)
(cd "$out" && sha256sum "$cli.tar.gz" "$lib.tar.gz" "$image.tar" "$wheel" "$npm" >SHA256SUMS)
echo "release: wrote $out/$cli.tar.gz, $out/$lib.tar.gz, $out/$image.tar, $out/$wheel, $out/$npm and $out/SHA256SUMS" >&2
