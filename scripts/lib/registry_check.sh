#!/usr/bin/env bash
# The filter's OCI image used as Istio would: pushed to a real registry (Debian's
# docker-registry on a free loopback port), pulled back with skopeo, and checked: the
# registry's manifest digest is the one the release names, every blob is what its
# digest says, and the layer's plugin.wasm is the committed filter, byte for byte.
#
#   scripts/lib/registry_check.sh DIST VERSION
set -euo pipefail
dist=$1 version=$2
image=fencekeeper-filter-$version-oci
# $work, pids (stopped on exit), port().
source "$(dirname "$0")/scratch.sh"
port=$(port)
cat >"$work/registry.yml" <<CONF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $work/storage
http:
  addr: 127.0.0.1:$port
CONF
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry=$!
pids+=($registry)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/v2/" >/dev/null && break
  kill -0 $registry 2>/dev/null || { cat "$work/registry.log" >&2; exit 1; }
  sleep 0.1
done
ref=127.0.0.1:$port/fencekeeper-filter:$version
skopeo copy -q --dest-tls-verify=false "oci-archive:$dist/$image.tar:$version" "docker://$ref"
served=$(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$ref")
named=$(cat "$dist/$image.digest")
[[ $served == "$named" ]] || { echo "the registry serves $served, the release names $named" >&2; exit 1; }
# Pulled by digest, as a pinned WasmPlugin would.
skopeo copy -q --src-tls-verify=false "docker://127.0.0.1:$port/fencekeeper-filter@$named" "dir:$work/pulled"
for file in "$work"/pulled/*; do
  name=$(basename "$file")
  [[ $name =~ ^[0-9a-f]{64}$ ]] || continue
  [[ $(sha256sum "$file" | cut -d' ' -f1) == "$name" ]] || { echo "blob $name is not what its digest says" >&2; exit 1; }
done
layer=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["layers"][0]["digest"].split(":")[1])' "$work/pulled/manifest.json")
tar -xzf "$work/pulled/$layer" -C "$work" plugin.wasm
cmp "$work/plugin.wasm" guest/artifacts/fencekeeper_filter.wasm
echo "registry: pushed, pulled by $named, plugin.wasm is the filter"
