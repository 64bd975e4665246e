#!/bin/sh
# An independent Redis lock client for the token tests: redis-cli running the
# acquisition script that `fencekeeper lock --redis` runs (host/cli/src/lock/redis_acquire.lua,
# shown in docs/tokens.md), on the same keys.
#
#   redis_cli_lock.sh HOST PORT NAME TTL_MS -- COMMAND...
#
# Waits until the script answers a token, then execs COMMAND with FENCING_TOKEN set.
# It neither renews nor releases the key: the lock ends when its TTL runs out, which
# is all a client of the script needs for the tests' story.
set -eu
host=$1 port=$2 name=$3 ttl=$4
shift 4
[ "$1" = "--" ] && shift
script=$(cat "$(dirname "$0")/../../host/cli/src/lock/redis_acquire.lua")
owner="redis-cli-$$"
while :; do
    token=$(redis-cli -h "$host" -p "$port" --raw EVAL "$script" 2 \
        "fencekeeper:lock:{$name}" "fencekeeper:token:{$name}" "$owner" "$ttl")
    [ -n "$token" ] && break
    sleep 0.05
done
FENCING_TOKEN=$token exec "$@"
