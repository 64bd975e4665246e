//! End-to-end: the ordering gate inside Envoy. A real Envoy with the filter, as
//! `fencekeeper envoy-config` generates it (etcd marks, correctness mode), in front of
//! a store that holds chosen writes (`RecordingUpstream`): holder 33's write is slow
//! at the store while holder 34 writes. With the gate the store applies 33 then 34,
//! whatever happened to 33's exchange (answered, the client gone, the store's reset,
//! Envoy's route timeout, Envoy killed); each test has a control that shows the
//! window without the gate (or without the store apply bound).

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::{exchange_on, Envoy, Reply};
use fencekeeper_harness::gateway::RecordingUpstream;
use fencekeeper_harness::services::Etcd;
use std::io::Write;
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WAITED: &str = "wasmcustom.fencekeeper.gate.waited";
const TIMED_OUT: &str = "wasmcustom.fencekeeper.gate.timed_out";
const GIVEN_UP: &str = "wasmcustom.fencekeeper.gate.given_up";

/// The store, etcd and one Envoy with two workers, configured with `extra`.
fn setup(extra: &[&str]) -> (RecordingUpstream, Etcd, Envoy) {
    let upstream = RecordingUpstream::start().unwrap();
    let etcd = Etcd::start().unwrap();
    let envoy = start_envoy(&upstream, &etcd, extra);
    (upstream, etcd, envoy)
}

fn start_envoy(upstream: &RecordingUpstream, etcd: &Etcd, extra: &[&str]) -> Envoy {
    let (up, client) = (upstream.addr.to_string(), etcd.client.to_string());
    // Made-up tokens, not etcd revisions: the provenance check is e2e_envoy_provenance's.
    let mut args = vec!["--upstream", &up, "--etcd", &client, "--provenance", "off"];
    args.extend_from_slice(extra);
    Envoy::start(2, &args).unwrap()
}

fn put_in_background(envoy: &Envoy, token: &str) -> JoinHandle<Reply> {
    let s = TcpStream::connect(envoy.listen).unwrap();
    let token = token.to_owned();
    std::thread::spawn(move || exchange_on(s, "PUT", "/r", &[("fencing-token", &token)], token.as_bytes()).unwrap())
}

fn stored(r: &Reply) -> bool {
    r.status == 201
}

/// Wait (bounded) until the store has applied `n` writes.
fn wait_applied(upstream: &RecordingUpstream, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while upstream.applied().len() < n {
        assert!(Instant::now() < deadline, "the store applied {:?}, not {n} writes", upstream.tokens());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_slow_lower_token_write_never_lands_after_a_higher_one() {
    let (upstream, _etcd, envoy) = setup(&[]);
    upstream.hold("33");
    let a = put_in_background(&envoy, "33");
    upstream.wait_held("33").unwrap();
    // Several connections, so that some land on the other worker: the gate is shared.
    let b: Vec<_> = (0..4).map(|_| put_in_background(&envoy, "34")).collect();
    envoy.wait_stat(WAITED, 4).unwrap();
    assert!(upstream.applied().is_empty(), "34 reached the store while 33 was in flight");
    upstream.release("33");
    assert!(stored(&a.join().unwrap()));
    for b in b {
        let b = b.join().unwrap();
        assert!(stored(&b), "{} {}", b.status, b.text());
    }
    assert_eq!(upstream.tokens(), ["33", "34", "34", "34", "34"]);
}

#[test]
fn without_the_gate_the_slow_lower_token_write_lands_last() {
    let (upstream, _etcd, envoy) = setup(&["--no-gate"]);
    upstream.hold("33");
    let a = put_in_background(&envoy, "33");
    upstream.wait_held("33").unwrap();
    assert!(stored(&envoy.put("/r", "34", b"34").unwrap()));
    upstream.release("33");
    assert!(stored(&a.join().unwrap()));
    // The window: the store ends up holding the stale holder's data.
    assert_eq!(upstream.tokens(), ["34", "33"]);
}

#[test]
fn a_held_write_overtaken_by_a_higher_token_is_refused_as_stale() {
    let (upstream, _etcd, envoy) = setup(&[]);
    upstream.hold("33");
    let a = put_in_background(&envoy, "33");
    upstream.wait_held("33").unwrap();
    let b = put_in_background(&envoy, "34");
    envoy.wait_stat(WAITED, 1).unwrap();
    let c = put_in_background(&envoy, "35");
    envoy.wait_stat(WAITED, 2).unwrap();
    upstream.release("33");
    let (a, b, c) = (a.join().unwrap(), b.join().unwrap(), c.join().unwrap());
    assert!(stored(&a) && stored(&c), "{} {}", a.status, c.status);
    assert_eq!(b.status, 409, "{}", b.text());
    assert_eq!(b.header("fencing-highest"), Some("35"));
    assert_eq!(upstream.tokens(), ["33", "35"]);
}

#[test]
fn a_write_held_past_the_budget_gets_503_with_retry_after_and_never_lands() {
    let (upstream, _etcd, envoy) = setup(&["--gate-timeout", "300ms"]);
    upstream.hold("33");
    let a = put_in_background(&envoy, "33");
    upstream.wait_held("33").unwrap();
    let b = envoy.put("/r", "34", b"34").unwrap();
    assert_eq!(b.status, 503, "{}", b.text());
    assert!(b.text().contains("ordering gate"), "{}", b.text());
    assert!(b.header("retry-after").is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s >= 1)), "{:?}", b.headers);
    assert_eq!(envoy.stat(TIMED_OUT).unwrap(), 1);
    upstream.release("33");
    assert!(stored(&a.join().unwrap()));
    assert_eq!(upstream.tokens(), ["33"]);
}

/// Holder 33's write reaches the store, then its exchange is given up on by `give_up`
/// (the store still applies it when released); holder 34 writes meanwhile. Returns
/// the order the store applied them in, and 34's answer.
fn given_up_then_34(extra: &[&str], give_up: impl FnOnce(&RecordingUpstream, &Envoy)) -> (Vec<String>, Reply) {
    let (upstream, _etcd, envoy) = setup(extra);
    upstream.hold("33");
    give_up(&upstream, &envoy);
    envoy.wait_stat(GIVEN_UP, 1).unwrap();
    let b = put_in_background(&envoy, "34");
    // 34 is held at the gate, or (without a bound) already stored; then the store
    // applies 33 late, after Envoy gave up on it, within the bound.
    let deadline = Instant::now() + Duration::from_secs(10);
    while envoy.stat(WAITED).unwrap() == 0 && upstream.applied().is_empty() {
        assert!(Instant::now() < deadline, "34 was neither held nor stored");
        std::thread::sleep(Duration::from_millis(10));
    }
    upstream.release("33");
    let b = b.join().unwrap();
    wait_applied(&upstream, 1 + usize::from(stored(&b)));
    (upstream.tokens(), b)
}

/// 33 is sent from a client that hangs up once the store has it.
fn client_hangs_up(upstream: &RecordingUpstream, envoy: &Envoy) {
    let mut s = TcpStream::connect(envoy.listen).unwrap();
    let head = "PUT /r HTTP/1.1\r\nHost: fencekeeper\r\nfencing-token: 33\r\nContent-Length: 2\r\n\r\n33";
    s.write_all(head.as_bytes()).unwrap();
    upstream.wait_held("33").unwrap();
    drop(s);
}

#[test]
fn a_write_whose_client_went_away_holds_its_resource_for_the_store_apply_bound() {
    let (order, b) = given_up_then_34(&["--store-apply-bound", "3s"], client_hangs_up);
    assert!(stored(&b), "{} {}", b.status, b.text());
    assert_eq!(order, ["33", "34"]);
}

#[test]
fn without_an_apply_bound_a_write_whose_client_went_away_lands_after_the_newer_one() {
    let (order, b) = given_up_then_34(&["--store-apply-bound", "0s"], client_hangs_up);
    assert!(stored(&b));
    assert_eq!(order, ["34", "33"]);
}

#[test]
fn a_write_the_store_reset_holds_its_resource_for_the_store_apply_bound() {
    let reset = |upstream: &RecordingUpstream, envoy: &Envoy| {
        upstream.hold_and_reset("33");
        let a = envoy.put("/r", "33", b"33").unwrap();
        // The store broke off the exchange: 502, as the gateway answers it.
        assert_eq!(a.status, 502, "Envoy's answer to a reset: {}", a.text());
    };
    let (order, b) = given_up_then_34(&["--store-apply-bound", "3s"], reset);
    assert!(stored(&b), "{} {}", b.status, b.text());
    assert_eq!(order, ["33", "34"]);
}

#[test]
fn a_write_past_the_route_timeout_holds_its_resource_for_the_store_apply_bound() {
    let timed_out = |upstream: &RecordingUpstream, envoy: &Envoy| {
        let a = envoy.put("/r", "33", b"33").unwrap();
        assert_eq!(a.status, 504, "{}", a.text());
        upstream.wait_held("33").unwrap();
    };
    let (order, b) = given_up_then_34(&["--request-timeout", "300ms", "--store-apply-bound", "3s"], timed_out);
    assert!(stored(&b), "{} {}", b.status, b.text());
    assert_eq!(order, ["33", "34"]);
}

#[test]
fn a_write_held_by_a_given_up_one_past_the_budget_is_told_when_to_retry() {
    let (upstream, _etcd, envoy) = setup(&["--store-apply-bound", "20s", "--gate-timeout", "200ms"]);
    // The shared gate's first lease comes on the worker's first ticks: a write before
    // it waits for it, within the 200 ms budget, which a loaded machine can exceed.
    store_once_writes_pass(&envoy, "/warm-up");
    upstream.hold("33");
    client_hangs_up(&upstream, &envoy);
    envoy.wait_stat(GIVEN_UP, 1).unwrap();
    let b = envoy.put("/r", "34", b"34").unwrap();
    assert_eq!(b.status, 503, "{}", b.text());
    let retry: u64 = b.header("retry-after").unwrap().parse().unwrap();
    assert!((15..=20).contains(&retry), "Retry-After {retry}: when 33 stops holding the resource");
    upstream.release("33");
}

/// Envoy is killed (SIGKILL) while 33 is held at the store, and started again; the
/// store applies 33 afterwards. Returns what 34 got right after the restart, and the
/// order the store applied the writes in once 34 was sent again after the grace.
/// The local gate: the start grace is what covers a restart without the shared gate
/// (with it, the dead Envoy's flights hold the resource: `e2e_shared_gate`).
fn killed_with_33_in_flight(extra: &[&str]) -> (Reply, Vec<String>) {
    let (upstream, _etcd, mut envoy) = setup(&[extra, &["--local-gate"]].concat());
    // The first start's own grace, on another resource.
    store_once_writes_pass(&envoy, "/warm-up");
    upstream.hold("33");
    let a = put_in_background(&envoy, "33");
    upstream.wait_held("33").unwrap();
    envoy.restart().unwrap();
    let _ = a.join();
    let first = envoy.put("/r", "34", b"34").unwrap();
    upstream.release("33");
    if !stored(&first) {
        store_once_writes_pass(&envoy, "/r");
    }
    wait_applied(&upstream, 3);
    let order = upstream.applied().into_iter().filter(|a| a.path == "/r").map(|a| a.token).collect();
    (first, order)
}

/// Write 34 to `path` until it is stored (bounded): past a start grace.
fn store_once_writes_pass(envoy: &Envoy, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stored(&envoy.put(path, "34", b"34").unwrap()) {
        assert!(Instant::now() < deadline, "no write was stored on {path}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_envoy_restarted_after_a_kill_waits_out_its_start_grace() {
    let (first, order) = killed_with_33_in_flight(&["--start-grace", "2s"]);
    assert_eq!(first.status, 503, "{}", first.text());
    assert!(first.text().contains("start grace"), "{}", first.text());
    assert!(first.header("retry-after").is_some());
    assert_eq!(order, ["33", "34"]);
}

#[test]
fn without_a_start_grace_an_envoy_restarted_after_a_kill_forwards_at_once() {
    let (first, order) = killed_with_33_in_flight(&[]);
    assert!(stored(&first));
    // The predecessor's gate died with it: the store applied the stale write last.
    assert_eq!(order, ["34", "33"]);
}
