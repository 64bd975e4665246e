#!/usr/bin/env bash
# Count the lines of HTTP fencing code in each HTTP host and in the engine they share,
# at the working tree or at a commit, so that moving behaviour into the engine is
# measured rather than asserted (BENCHMARKS.md, "The HTTP engine").
#
#   scripts/count-http-lines.sh            # the working tree
#   scripts/count-http-lines.sh 8b6467b    # a commit (read with git show; nothing checked out)
#
# A counted line is a line of code: not blank, not a comment (`//`, `///`, `//!`), and
# not test-only (a `#[cfg(test)]` module, which sits at the end of a file, or item). Per file, then per part:
#   gateway  host/gateway/src and host/cli/src/serve.rs (the command that starts it)
#   filter   guest/filter/src
#   engine   crates/engine/src
# and, per host, the share that is plumbing (talking to hyper/tokio or to the proxy's
# host calls, etcd's wire, shared data, environment) rather than fencing behaviour; the
# files counted as plumbing are listed below, with why.
set -euo pipefail
cd "$(dirname "$0")/.."

rev="${1:-}"

# Plumbing: files whose code moves bytes for the host rather than deciding anything
# a client sees. Everything else in a host is behaviour the engine is meant to own.
plumbing=(
  host/gateway/src/server.rs     # accept loop, connections, shutdown
  host/gateway/src/admin.rs      # the admin listener's routes
  host/gateway/src/lib.rs        # module list, the body type
  guest/filter/src/etcd.rs       # gRPC calls to etcd from the proxy
  guest/filter/src/auth.rs       # etcd authentication tokens
  guest/filter/src/env.rs        # the VM's environment (secrets)
  guest/filter/src/wake.rs       # waking another worker's root context
  guest/filter/src/headers.rs    # reading the request's headers through host calls
  guest/filter/src/shared.rs     # shared data: the registry's host calls
  guest/filter/src/slots.rs      # shared data: the marks' slots and their CAS
  guest/filter/src/config.rs     # the configuration type's re-export
)

files_of() { # part -> the .rs files it counts
  case "$1" in
    gateway) list host/gateway/src; echo host/cli/src/serve.rs ;;
    filter) list guest/filter/src ;;
    engine) list crates/engine/src ;;
  esac
}

list() {
  if [[ -n "$rev" ]]; then
    git ls-tree -r --name-only "$rev" -- "$1" | grep '\.rs$' || true
  else
    find "$1" -name '*.rs' | sort
  fi
}

content() {
  if [[ -n "$rev" ]]; then git show "$rev:$1" 2>/dev/null || true; else cat "$1"; fi
}

count() { # stdin: Rust source -> lines of code outside test modules
  # `#[cfg(test)]` before a `mod` starts the unit tests, which run to the end of the
  # file; before anything else (a test-only `use`) it takes that one item's line.
  awk '
    intest { next }
    /^[[:space:]]*$/ { next }
    /^[[:space:]]*\/\// { next }
    /^[[:space:]]*#\[cfg\(test\)\]/ { pending = 1; next }
    pending && /^[[:space:]]*#\[/ { next }
    pending && /^[[:space:]]*(pub(\([a-z]+\))? )?mod / { intest = 1; next }
    pending { pending = 0; next }
    { n++ }
    END { print n + 0 }'
}

is_plumbing() {
  local f
  for f in "${plumbing[@]}"; do [[ "$f" == "$1" ]] && return 0; done
  return 1
}

echo "lines of code (not blank, not comments, not #[cfg(test)]) at ${rev:-the working tree}"
for part in gateway filter engine; do
  total=0 plumb=0
  while read -r file; do
    [[ -z "$file" ]] && continue
    n=$(content "$file" | count)
    total=$((total + n))
    mark=""
    if is_plumbing "$file"; then plumb=$((plumb + n)); mark=" (plumbing)"; fi
    printf '  %6d  %s%s\n' "$n" "$file" "$mark"
  done < <(files_of "$part")
  printf '%-8s %6d total, %6d plumbing, %6d behaviour\n\n' "$part" "$total" "$plumb" "$((total - plumb))"
done
