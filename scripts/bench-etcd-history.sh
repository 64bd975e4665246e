#!/usr/bin/env bash
# etcd's database under advancing marks, with and without compaction, side by side:
#   scripts/bench-etcd-history.sh [ADVANCES [RESOURCES]]   (default 100000 and 1000)
#
# Every advance of a mark is a put, so a new etcd revision; etcd keeps every revision
# until it is compacted, so its database grows with the advances, not with the
# resources. Two etcds (Debian's etcd-server, one member each, on loopback): `plain`
# with etcd's defaults, `compacting` with --auto-compaction-mode=periodic
# --auto-compaction-retention=1m (history older than a minute is compacted, once a
# minute; production would keep more, e.g. 1h). Each gets
# ADVANCES puts of mark records spread over RESOURCES keys (the keys and record format
# the fence writes), through etcd's JSON gateway on one keep-alive connection. Then
# each is compacted to its current revision by hand (--physical: waiting until the
# space is free in the file) and defragmented. Prints the
# database size after the load, after the compaction, and after the defrag.
# Needs: etcd, etcdctl (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
advances=${1:-100000}
resources=${2:-1000}
for tool in etcd etcdctl python3; do
    command -v "$tool" >/dev/null || { echo "$tool not found; run scripts/install-deps.sh" >&2; exit 2; }
done
. scripts/lib/scratch.sh

declare -A client
start_etcd() { # NAME ARGS...
    local name=$1; shift
    local c p; c=$(port); p=$(port)
    etcd --name "$name" --data-dir "$work/$name" --listen-client-urls "http://127.0.0.1:$c" \
        --advertise-client-urls "http://127.0.0.1:$c" --listen-peer-urls "http://127.0.0.1:$p" \
        --initial-advertise-peer-urls "http://127.0.0.1:$p" --initial-cluster "$name=http://127.0.0.1:$p" \
        "$@" >"$work/$name.log" 2>&1 & pids+=($!)
    client[$name]=127.0.0.1:$c
    for _ in $(seq 1 100); do
        ETCDCTL_API=3 etcdctl --endpoints "${client[$name]}" endpoint health >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "etcd $name did not start; see $work/$name.log" >&2; exit 2
}
start_etcd plain
start_etcd compacting --auto-compaction-mode=periodic --auto-compaction-retention=1m

# ADVANCES puts: resource i % RESOURCES gets token i // RESOURCES + 1, as a mark
# record ("fk2 TOKEN CRC"; the CRC is not checked by etcd, any 8 hex digits do).
load() { # ENDPOINT
    python3 - "$1" "$advances" "$resources" <<'PY'
import base64, http.client, json, sys
endpoint, advances, resources = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
host, port = endpoint.split(":")
conn = http.client.HTTPConnection(host, int(port))
b64 = lambda s: base64.b64encode(s.encode()).decode()
for i in range(advances):
    key = "/fencekeeper/marks/data/object-%06d" % (i % resources)
    value = "fk2 %d 00000000" % (i // resources + 1)
    conn.request("POST", "/v3/kv/put", json.dumps({"key": b64(key), "value": b64(value)}))
    r = conn.getresponse(); r.read()
    if r.status != 200:
        sys.exit("put failed: %d" % r.status)
PY
}
status() { # NAME -> "FILE_MIB IN_USE_MIB REVISION": the database file, the part of it in use
    ETCDCTL_API=3 etcdctl --endpoints "${client[$1]}" endpoint status -w json | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]["Status"]
print("%.2f %.2f %d" % (s["dbSize"] / 1048576, s.get("dbSizeInUse", 0) / 1048576, s["header"]["revision"]))'
}

printf '%-11s %9s %9s %19s %19s %19s\n' etcd advances revision "loaded (file/used)" "compacted" "defragged"
for name in plain compacting; do
    start=$(date +%s.%N)
    load "${client[$name]}"
    seconds=$(python3 -c "import time; print(f'{time.time() - $start:.0f}')")
    read -r loaded used revision <<<"$(status "$name")"
    ETCDCTL_API=3 etcdctl --endpoints "${client[$name]}" compact --physical "$revision" >/dev/null 2>&1 || true
    read -r cfile cused _ <<<"$(status "$name")"
    ETCDCTL_API=3 etcdctl --endpoints "${client[$name]}" defrag >/dev/null
    read -r dfile dused _ <<<"$(status "$name")"
    printf '%-11s %9s %9s %19s %19s %19s   (load %ss; MiB)\n' "$name" "$advances" "$revision" "$loaded / $used" \
        "$cfile / $cused" "$dfile / $dused" "$seconds"
done
