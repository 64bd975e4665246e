#!/usr/bin/env bash
# Envoy with and without the fencing filter, side by side in one run:
#   scripts/bench-envoy.sh [SECONDS_PER_ROW [ROUNDS]]   (default 3 and 5)
#
# One nginx answering 204 to everything (a fast upstream, so the proxy's cost shows),
# one etcd, and Envoys with one worker each, built by `fencekeeper envoy-config`:
#   none           the same config with the filter removed
#   empty          a filter built here with every callback the SDK's default and no
#                  host call: the floor any wasm filter pays on V8
#   headers        a filter built here that reads the request's headers (one host
#                  call) and does nothing else
#   fence-floor    a filter built here that makes the host calls no fencing filter on
#                  shared data can do without (the headers, the mark's entry, the
#                  admitted token set on the request) and nothing else
#   pause-floor    a filter built here whose requests pause after reading their
#                  headers and are resumed by the root context (through a shared
#                  queue): what waiting for any outside answer costs
#   confirm-floor  a filter built here that confirms with etcd and does nothing else:
#                  requests pause and join a batch, the root sends one etcd Range per
#                  batch (after its requests arrived) and resumes them on the answer;
#                  the floor of any filter that asks etcd for every write
#   passthrough    our filter with --fenced-methods POST: a PUT skips it on its route
#   in-filter-pass our filter told to fence POST alone in its own configuration, so a
#                  PUT enters the VM and is let through there
#   shared         our filter in efficiency mode on shared data alone (--no-etcd)
#   shared-nogate  the same without its ordering gate (--no-gate): what the gate costs
#   etcd           our filter in correctness mode, marks in etcd
#   etcd-nogate    the same without its ordering gate (--no-gate)
#   etcd-sharedgate the same with the gate shared through etcd (--shared-gate): one
#                  more etcd Txn per write (its registration) and a delete after it
#   etcd-json      `etcd` calling etcd's JSON API over HTTP/1.1 (--etcd-api json), as a
#                  proxy-wasm host without gRPC calls does, instead of its gRPC API
#   etcd-single    the same with batched confirms off: one Txn per request (not in
#                  the default rows; FK_BENCH_ROWS=etcd-single:fixed:16 runs it)
#   shared-before, etcd-before, etcd-sharedgate-before
#                  with BEFORE_FILTER=FILE.wasm (an earlier build of our filter, e.g.
#                  `git show REV:guest/artifacts/fencekeeper_filter.wasm`): `shared`,
#                  `etcd` and `etcd-sharedgate` with that filter, so a change is measured beside its
#                  predecessor in one run (not in the default rows: name them in
#                  FK_BENCH_ROWS)
# wrk sends PUTs: either one fixed token on one resource (every request an admit
# that does not advance the mark: a shared-data read, or an etcd compare Txn), or
# rising tokens from one connection (every request advances the mark: a shared-data
# CAS write, or an etcd Txn put), or one fixed token on 64 resources in turn
# (`spread`: holders of different resources, whose confirms share Txns only across
# resources). GET rows show what an unfenced read costs: the
# generated route sends GET, HEAD and OPTIONS past the filter, so they should match
# `none`, as should `passthrough`; `in-filter-pass` shows the filter's own cost for a
# method it lets through. Prints a table for BENCHMARKS.md, with the CPU that each
# row's Envoy (and, for rows that ask etcd, etcd) used per request answered.
# Needs: nginx, etcd, envoy, wrk (scripts/install-deps.sh); etcd is started by the
# test harness (fencekeeper-services).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-3}
rounds=${2:-5}
. scripts/lib/bench.sh

start_nginx_204
start_services etcd
ec=${FK_ETCD##*:}
etcdpid=$(pgrep -f -- "--listen-client-urls=http://127.0.0.1:$ec( |$)")
# CPU ticks (user + system) a process has used: a row's CPU per request.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
clk=$(getconf CLK_TCK)

declare -A listen admin envoypid
start_envoy() { # NAME ARGS...
  local name=$1; shift
  local l a; l=$(port); a=$(port)
  "$fk" envoy-config --upstream "127.0.0.1:$up" --listen "$l" --admin "$a" "$@" >"$work/$name.yaml"
  if [[ $name == none ]]; then
    # Drop the wasm filter, keep everything else identical.
    python3 - "$work/$name.yaml" <<'PY'
import sys
p = sys.argv[1]; lines = open(p).read().split("\n"); out = []; skip = False
for line in lines:
    if line.strip() == "- name: fencekeeper" and line.startswith("          -"):
        skip = True
    elif skip and line.strip() == "- name: envoy.filters.http.router":
        skip = False
    if not skip:
        out.append(line)
open(p, "w").write("\n".join(out))
PY
  fi
  if [[ $name == etcd-single ]]; then
    sed -i 's/"timeout_ms":1000}/"timeout_ms":1000,"batch_confirms":false}/' "$work/$name.yaml"
    grep -q '"batch_confirms":false' "$work/$name.yaml"
  fi
  if [[ $name == in-filter-pass ]]; then
    # PUT not fenced in the filter's own configuration alone, so it still enters the
    # VM: what the filter costs for a request it lets through.
    sed -i 's/"strict":false}/"strict":false,"fenced_methods":["POST"]}/' "$work/$name.yaml"
    grep -q '"fenced_methods":\["POST"\]' "$work/$name.yaml"
  fi
  envoy -c "$work/$name.yaml" --concurrency 1 --disable-hot-restart --log-level error >"$work/$name.log" 2>&1 & pids+=($!)
  listen[$name]=$l admin[$name]=$a envoypid[$name]=$!
  wait_http "http://127.0.0.1:$a/ready"
}
# Synthetic filters with the same proxy-wasm SDK as ours, each doing only what its
# comment says: floors our filter's rows are held against.
sdk=$(awk '/^name = "proxy-wasm"$/ { getline; print $3 }' guest/filter/Cargo.lock | tr -d '"')
# build_filter NAME: the Rust source of `configure`, `queue_ready` and `impl
# HttpContext for Http` on stdin, inside the template below; build_filter NAME
# --whole: the whole lib.rs on stdin. Prints the .wasm's path.
build_filter() {
  local dir=$work/filter-$1
  mkdir -p "$dir/src"
  cat >"$dir/Cargo.toml" <<TOML
[package]
name = "synthetic-filter"
version = "0.0.0"
edition = "2021"
[lib]
crate-type = ["cdylib"]
[dependencies]
proxy-wasm = "=$sdk"
[profile.release]
opt-level = "s"
lto = true
panic = "abort"
[workspace]
TOML
  if [[ ${2:-} == --whole ]]; then
    cat >"$dir/src/lib.rs"
  else
  {
    cat <<'RS'
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
proxy_wasm::main! {{ proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) }); }}
struct Root;
impl Context for Root {}
impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool { configure(self) }
    fn on_queue_ready(&mut self, queue: u32) { queue_ready(queue) }
    fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> { Some(Box::new(Http(id))) }
    fn get_type(&self) -> Option<ContextType> { Some(ContextType::HttpContext) }
}
/// The request's context id.
struct Http(#[allow(dead_code)] u32);
impl Context for Http {}
RS
    cat
  } >"$dir/src/lib.rs"
  fi
  # Checked here: `set -e` does not reach into the $(...) this runs in.
  cargo build -q --release --target wasm32-unknown-unknown --manifest-path "$dir/Cargo.toml" --target-dir "$work/filters-target" >&2 \
    || { echo "bench-envoy: the synthetic filter $1 does not build" >&2; return 1; }
  cp "$work/filters-target/wasm32-unknown-unknown/release/synthetic_filter.wasm" "$work/$1.wasm" || return 1
  echo "$work/$1.wasm"
}
# empty: every callback the SDK's default, no host call.
empty_wasm=$(build_filter empty <<'RS'
fn configure(_: &Root) -> bool { true }
fn queue_ready(_: u32) {}
impl HttpContext for Http {}
RS
)
# headers: one host call, the request's headers (what our filter's first step is).
headers_wasm=$(build_filter headers <<'RS'
fn configure(_: &Root) -> bool { true }
fn queue_ready(_: u32) {}
use proxy_wasm::types::Action;
impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        std::hint::black_box(self.get_http_request_headers_bytes());
        Action::Continue
    }
}
RS
)
# fence-floor: the host calls no fencing filter on shared data can do without for
# a holder writing again: the request's headers, the mark's shared-data entry (as
# large as our filter's slot for one resource), the admitted token set on the
# request. It compares nothing and counts nothing.
floor_wasm=$(build_filter fence-floor <<'RS'
fn configure(root: &Root) -> bool { root.set_shared_data("floor", Some(b"\x01\x06\x00/fixed\x011"), None).is_ok() }
fn queue_ready(_: u32) {}
use proxy_wasm::types::Action;
impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let headers = self.get_http_request_headers_bytes();
        let token = headers.into_iter().find(|(n, _)| n == "fencing-token").map(|(_, v)| v).unwrap_or_default();
        std::hint::black_box(self.get_shared_data("floor"));
        self.set_http_request_header("fencing-admitted-token", Some(&String::from_utf8_lossy(&token)));
        Action::Continue
    }
}
RS
)

# pause-floor: what waiting for an answer from outside costs a request, whoever
# answers: the request's headers, then it pauses and puts its context id on a
# shared queue; the root drains the queue and resumes each request from there. No
# call leaves Envoy: the rest of the etcd rows' cost is the etcd Txns and the
# fencing itself.
pause_wasm=$(build_filter pause-floor <<'RS'
use proxy_wasm::hostcalls;
use proxy_wasm::types::Action;
use std::sync::atomic::{AtomicU32, Ordering};
static QUEUE: AtomicU32 = AtomicU32::new(0);
fn configure(_: &Root) -> bool {
    hostcalls::register_shared_queue("pause-floor").map(|q| QUEUE.store(q, Ordering::Relaxed)).is_ok()
}
fn queue_ready(queue: u32) {
    while let Ok(Some(id)) = hostcalls::dequeue_shared_queue(queue) {
        let id = u32::from_le_bytes(id[..4].try_into().unwrap_or_default());
        if hostcalls::set_effective_context(id).is_ok() {
            let _ = hostcalls::resume_http_request();
        }
    }
}
impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        std::hint::black_box(self.get_http_request_headers_bytes());
        let _ = hostcalls::enqueue_shared_queue(QUEUE.load(Ordering::Relaxed), Some(&self.0.to_le_bytes()));
        Action::Pause
    }
}
RS
)

# confirm-floor: the least a filter that confirms with etcd can do: each request
# pauses and joins the waiting batch; the root sends one etcd Range (a
# linearizable read, cheaper for etcd than our compare Txn) per batch, only after
# the batch's requests arrived, and resumes all of them on its answer. No fencing,
# no shared data, no header set: what our `etcd` rows are held against.
confirm_wasm=$(build_filter confirm-floor --whole <<'RS'
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType};
use std::cell::{Cell, RefCell};
use std::time::Duration;
proxy_wasm::main! {{ proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(Root(id)) }); }}
thread_local! {
    static WAITING: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static FLYING: RefCell<Option<Vec<u32>>> = const { RefCell::new(None) };
    static QUEUE: Cell<u32> = const { Cell::new(0) };
}
// GrpcService { envoy_grpc { cluster_name: "fencekeeper_etcd" } }, the generated cluster.
const SERVICE: &str = "\x0a\x12\x0a\x10fencekeeper_etcd";
// RangeRequest { key: "/fencekeeper/marks//fixed" }: the etcd rows' mark.
const RANGE: &[u8] = b"\x0a\x19/fencekeeper/marks//fixed";
fn send() {
    let batch = WAITING.with(|w| std::mem::take(&mut *w.borrow_mut()));
    if batch.is_empty() {
        return;
    }
    match hostcalls::dispatch_grpc_call(SERVICE, "etcdserverpb.KV", "Range", vec![], Some(RANGE), Duration::from_secs(1)) {
        Ok(_) => FLYING.with(|f| *f.borrow_mut() = Some(batch)),
        Err(_) => resume(batch),
    }
}
fn resume(batch: Vec<u32>) {
    for id in batch {
        if hostcalls::set_effective_context(id).is_ok() {
            let _ = hostcalls::resume_http_request();
        }
    }
}
struct Root(u32);
impl Context for Root {
    fn on_grpc_call_response(&mut self, _: u32, _: u32, size: usize) {
        std::hint::black_box(hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size).ok());
        resume(FLYING.with(|f| f.borrow_mut().take()).unwrap_or_default());
        // The next batch's call belongs to the root, like the first.
        let _ = hostcalls::set_effective_context(self.0);
        send();
    }
}
impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        hostcalls::register_shared_queue("confirm-floor").map(|q| QUEUE.with(|x| x.set(q))).is_ok()
    }
    fn on_queue_ready(&mut self, queue: u32) {
        while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue) {}
        if FLYING.with(|f| f.borrow().is_none()) {
            send();
        }
    }
    fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> { Some(Box::new(Http(id))) }
    fn get_type(&self) -> Option<ContextType> { Some(ContextType::HttpContext) }
}
struct Http(u32);
impl Context for Http {}
impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        std::hint::black_box(self.get_http_request_headers_bytes());
        let idle = FLYING.with(|f| f.borrow().is_none()) && WAITING.with(|w| w.borrow().is_empty());
        WAITING.with(|w| w.borrow_mut().push(self.0));
        if idle {
            let _ = hostcalls::enqueue_shared_queue(QUEUE.with(Cell::get), Some(b"1"));
        }
        Action::Pause
    }
}
RS
)

start_envoy none --no-etcd --mode efficiency
start_envoy empty --no-etcd --mode efficiency --filter "$empty_wasm"
start_envoy headers --no-etcd --mode efficiency --filter "$headers_wasm"
start_envoy fence-floor --no-etcd --mode efficiency --filter "$floor_wasm"
start_envoy pause-floor --no-etcd --mode efficiency --filter "$pause_wasm"
start_envoy shared --no-etcd --mode efficiency
start_envoy shared-nogate --no-etcd --mode efficiency --no-gate
start_envoy passthrough --no-etcd --mode efficiency --fenced-methods POST
start_envoy in-filter-pass --no-etcd --mode efficiency
# The tokens are made up, not etcd revisions: measured without the provenance check.
start_envoy etcd --etcd "127.0.0.1:$ec" --provenance off --local-gate
start_envoy etcd-json --etcd "127.0.0.1:$ec" --provenance off --local-gate --etcd-api json
start_envoy etcd-single --etcd "127.0.0.1:$ec" --provenance off --local-gate
start_envoy etcd-nogate --etcd "127.0.0.1:$ec" --provenance off --no-gate
start_envoy etcd-sharedgate --etcd "127.0.0.1:$ec" --provenance off --shared-gate
start_envoy confirm-floor --etcd "127.0.0.1:$ec" --provenance off --local-gate --filter "$confirm_wasm"
before=()
if [[ -n ${BEFORE_FILTER:-} ]]; then
  start_envoy shared-before --no-etcd --mode efficiency --filter "$BEFORE_FILTER"
  start_envoy etcd-before --etcd "127.0.0.1:$ec" --provenance off --local-gate --filter "$BEFORE_FILTER"
  start_envoy etcd-sharedgate-before --etcd "127.0.0.1:$ec" --provenance off --shared-gate --filter "$BEFORE_FILTER"
  before=(shared-before etcd-before etcd-sharedgate-before)
fi

# One row: NAME SCRIPT CONNECTIONS PATH -> "p50_us p99_us rps non2xx envoy_ticks etcd_ticks"
# (the CPU that row's Envoy and etcd used while it ran). Each run writes a resource of
# its own: the writes wrk abandons when it stops are given up on, and hold their
# resource at the ordering gate for the store apply bound.
# SCRIPT is a workload in scripts/lib/: fixed, spread and rising are put-*.lua, get is get.lua.
run() {
  local e0 d0 numbers lua=scripts/lib/put-$2.lua
  [[ $2 == get ]] && lua=scripts/lib/get.lua
  e0=$(ticks "${envoypid[$1]}") d0=$(ticks "$etcdpid")
  numbers=$(wrk -t1 -c"$3" -d"${duration}s" --latency -s "$lua" "http://127.0.0.1:${listen[$1]}/$4" | wrk_numbers)
  echo "$numbers $(($(ticks "${envoypid[$1]}") - e0)) $(($(ticks "$etcdpid") - d0))"
}

# Warm up each path (V8 tiers, connection pools, the first etcd writes).
for n in none empty headers fence-floor pause-floor passthrough in-filter-pass shared shared-nogate etcd etcd-json etcd-single etcd-nogate etcd-sharedgate confirm-floor "${before[@]}"; do wrk -t1 -c1 -d2s -s scripts/lib/put-fixed.lua "http://127.0.0.1:${listen[$n]}/fixed" >/dev/null; done
wrk -t1 -c1 -d1s -s scripts/lib/put-spread.lua "http://127.0.0.1:${listen[etcd]}/" >/dev/null

# Rows interleaved, ROUNDS times; the median and the best round are reported: the
# machine is shared, interleaving spreads its drift over every row alike, and the
# best round is the one least disturbed by other work.
# FK_BENCH_ROWS="NAME:TOKENS:CONNS ..." runs those rows alone.
rows=(none:fixed:1 empty:fixed:1 passthrough:fixed:1 shared-nogate:fixed:1 shared:fixed:1 etcd-nogate:fixed:1
  etcd:fixed:1 etcd-json:fixed:1 etcd-sharedgate:fixed:1
  none:fixed:16 empty:fixed:16 headers:fixed:16 fence-floor:fixed:16 passthrough:fixed:16
  in-filter-pass:fixed:16 shared-nogate:fixed:16 shared:fixed:16 pause-floor:fixed:16 confirm-floor:fixed:16
  etcd-nogate:fixed:16 etcd:fixed:16 etcd-json:fixed:16 etcd-sharedgate:fixed:16
  shared:rising:1 etcd-nogate:rising:1 etcd:rising:1 etcd-json:rising:1 etcd-sharedgate:rising:1 none:spread:16 etcd:spread:16
  none:get:1 shared:get:1 none:get:16 empty:get:16 shared:get:16)
if [[ -n ${FK_BENCH_ROWS:-} ]]; then read -r -a rows <<<"$FK_BENCH_ROWS"; fi
# The etcd filter's confirm batches (its confirm_batch.* stats) around each of its rows.
batches() { curl -fsS "http://127.0.0.1:${admin[etcd]}/stats?filter=confirm_batch" | awk -F': ' '{ printf "%s ", $2 } END { print "" }'; }
runs=0
for round in $(seq "$rounds"); do
  for row in "${rows[@]}"; do
    IFS=: read -r n script c <<<"$row"
    [[ $n == etcd ]] && before=$(batches)
    runs=$((runs + 1))
    echo "$n $script $c $(run "$n" "$script" "$c" "fixed-$runs")" >>"$work/results"
    [[ $n == etcd ]] && echo "$script $c $before $(batches)" >>"$work/batches"
  done
done
python3 - "$work/results" "$rounds" "$duration" "$clk" <<'PY'
import statistics, sys
rows, cpu = {}, {}
duration, clk = float(sys.argv[3]), float(sys.argv[4])
for line in open(sys.argv[1]):
    n, tok, c, p50, p99, rps, bad, et, dt = line.split()
    rows.setdefault((n, tok, c), []).append((float(p50), float(p99), float(rps), int(bad)))
    # µs of CPU per request answered in the row.
    per = 1e6 / clk / (float(rps) * duration)
    cpu.setdefault((n, tok, c), []).append((int(et) * per, int(dt) * per))
print("| Envoy (1 worker) | tokens | conns | p50 µs (median) | p50 µs (best) | p99 µs | requests/s (median) | requests/s (best) | non-2xx | vs none, same conns (median; best) | vs empty (median) | Envoy CPU µs/request (median) | etcd CPU µs/request (median) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in rows.items()}
best = {k: (min(x[0] for x in v), max(x[2] for x in v)) for k, v in rows.items()}
for key, (p50, p99, rps) in med.items():
    n, tok, c = key
    bad = sum(x[3] for x in rows[key])
    bkey = ("none", tok if tok in ("get", "spread") else "fixed", c)
    base, bbase = med[bkey], best[bkey]
    rel = "" if n == "none" else (
        f"p50 {p50 - base[0]:+.0f} µs, {100 * rps / base[2]:.0f}%; "
        f"p50 {best[key][0] - bbase[0]:+.0f} µs, {100 * best[key][1] / bbase[1]:.0f}%")
    ekey = ("empty", "get" if tok == "get" else "fixed", c)
    erel = f"{rps / med[ekey][2]:.3f}x" if n not in ("none", "empty") and ekey in med else ""
    ecpu = statistics.median(x[0] for x in cpu[key])
    dcpu = f"{statistics.median(x[1] for x in cpu[key]):.1f}" if n.startswith("etcd") or n == "confirm-floor" else ""
    print(f"| {n} | {tok} | {c} | {p50:.0f} | {best[key][0]:.0f} | {p99:.0f} | {rps:.0f} | {best[key][1]:.0f} | {bad} | {rel} | {erel} | {ecpu:.1f} | {dcpu} |")
PY
if [[ -s $work/batches ]]; then
  # Envoy lists the stats by name: confirm_batch.requests, then confirm_batch.txns.
  python3 - "$work/batches" "$duration" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tok, c, r0, t0, r1, t1 = line.split()
    rows.setdefault((tok, c), []).append((int(r1) - int(r0), int(t1) - int(t0)))
print()
print("| etcd row | confirm Txns/s (median) | requests per Txn (median) |")
print("|---|---|---|")
for (tok, c), v in rows.items():
    tps = statistics.median(t / float(sys.argv[2]) for _, t in v)
    # Rows whose requests all advance the mark send no confirms.
    per = [r / t for r, t in v if t]
    print(f"| {tok}, {c} conns | {tps:.0f} | {statistics.median(per):.2f} |" if per else f"| {tok}, {c} conns | 0 | |")
PY
fi
