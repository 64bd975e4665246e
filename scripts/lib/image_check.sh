#!/usr/bin/env bash
# The gateway's container image used as an operator would, under podman (with runc
# and a storage of its own, so nothing is left behind): built from the release build,
# run as its unprivileged user in front of a store with its marks on a named volume;
# a stale write refused; the container stopped (SIGTERM: exit 0) and a new one started
# on the same volume, which still refuses the stale token and admits a newer one.
#
#   scripts/lib/image_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# $work, pids (stopped on exit), port().
source scripts/lib/scratch.sh
cat >"$work/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
CONF
export CONTAINERS_CONF=$work/containers.conf
export PODMAN="podman --root $work/storage --runroot $work/run --storage-driver vfs --runtime runc"
# The container and its volume go before the scratch directory that holds podman's storage.
trap '$PODMAN rm -f -t 0 gateway >/dev/null 2>&1 || true; $PODMAN volume rm -f marks >/dev/null 2>&1 || true; cleanup' EXIT

image=$(scripts/build-image.sh --no-build fencekeeper-gateway:check)
user=$($PODMAN image inspect --format '{{.Config.User}}' "$image")
[[ $user == 65532:65532 ]] || { echo "the image runs as '$user', not its own user" >&2; exit 1; }

python3 scripts/lib/file_store.py "$work/store" "$work/store.port" &
pids+=($!)
for _ in $(seq 100); do [[ -s $work/store.port ]] && break; sleep 0.05; done
store=127.0.0.1:$(cat "$work/store.port")
$PODMAN volume create marks >/dev/null

gateway() { # start a container on the volume and wait until it answers /healthz
  listen=$(port) admin=$(port)
  $PODMAN run -d --name gateway --network host -v marks:/var/lib/fencekeeper \
    -e FENCEKEEPER_UPSTREAM="$store" -e FENCEKEEPER_LISTEN="127.0.0.1:$listen" \
    -e FENCEKEEPER_ADMIN="127.0.0.1:$admin" "$image" >/dev/null
  for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$admin/healthz" >/dev/null && return
    [[ $($PODMAN inspect --format '{{.State.Running}}' gateway) == true ]] || break
    sleep 0.05
  done
  $PODMAN logs gateway >&2
  echo "the gateway's container did not come up" >&2
  exit 1
}
put() { # TOKEN BODY -> the status
  curl -s -o /dev/null -w '%{http_code}' -X PUT -H "fencing-token: $1" --data "$2" "http://127.0.0.1:$listen/orders.csv"
}
expect() { [[ $2 == "$3" ]] || { echo "$1: got $2, expected $3" >&2; $PODMAN logs gateway >&2; exit 1; }; }

gateway
expect "token 34" "$(put 34 new)" 201
expect "token 33 after 34" "$(put 33 old)" 409
expect "the store" "$(cat "$work/store/orders.csv")" new
$PODMAN stop -t 30 gateway >/dev/null
expect "the exit code after SIGTERM" "$($PODMAN inspect --format '{{.State.ExitCode}}' gateway)" 0
$PODMAN rm gateway >/dev/null

gateway
expect "token 33 in a new container" "$(put 33 old)" 409
expect "token 35 in a new container" "$(put 35 newer)" 204
expect "the store" "$(cat "$work/store/orders.csv")" newer
echo "container: $image as 65532 refused 33 after 34, and again in a new container on the same volume"
