#!/usr/bin/env bash
# Fail when a process a test run started outlived it. scripts/test.sh exports a marker,
# FENCEKEEPER_TEST_RUN, which every process the run starts inherits; this finds each
# process whose environment (/proc/PID/environ) still holds it, apart from this script
# and the shells it runs under. It prints one line per leftover (its pid and command
# line) and exits 1 if any is still there after a few seconds' grace (a service stopped
# by Ctrl-C may still be shutting down).
#
#   FENCEKEEPER_TEST_RUN=MARKER scripts/lib/leftovers.sh
#
# The scan itself starts no process: one it started would carry the marker too.
set -uo pipefail

marker="FENCEKEEPER_TEST_RUN=${FENCEKEEPER_TEST_RUN:?the marker scripts/test.sh exports}"

# This script and its ancestors (scripts/test.sh) carry the marker and are not leftovers.
declare -A ours=()
pid=$$
while [[ $pid != 0 && -z ${ours[$pid]:-} ]]; do
    ours[$pid]=1
    ppid=0
    while read -r key value; do
        [[ $key == PPid: ]] && ppid=$value
    done 2>/dev/null <"/proc/$pid/status"
    pid=$ppid
done

# Sets `found` to one line per process that carries the marker.
scan() {
    found=()
    local dir env cmdline
    for dir in /proc/[0-9]*; do
        [[ -n ${ours[${dir#/proc/}]:-} ]] && continue
        # Unreadable (another user's, without root) or gone meanwhile: not ours to judge.
        { mapfile -t -d '' env <"$dir/environ"; } 2>/dev/null || continue
        for var in "${env[@]}"; do
            if [[ $var == "$marker" ]]; then
                { mapfile -t -d '' cmdline <"$dir/cmdline"; } 2>/dev/null
                found+=("pid ${dir#/proc/}: ${cmdline[*]}")
                break
            fi
        done
    done
}

for _ in {1..25}; do
    scan
    ((${#found[@]} == 0)) && exit 0
    sleep 0.2
done
for line in "${found[@]}"; do
    echo "leftover: $line" >&2
done
echo "test: ${#found[@]} process(es) the tests started outlived them (listed above); a test's service must stop when its handle drops" >&2
exit 1
