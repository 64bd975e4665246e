//! The proxy's check-then-forward window (docs/gateway.md), through the real gateway, with an
//! upstream that holds chosen writes: with the ordering gate, a late lower-token write
//! never lands after a higher one; with `--no-gate`, the same schedule shows the window.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use anyhow::Result;
use fencekeeper_harness::gateway::{Gateway, RecordingUpstream, Reply};
use std::thread::JoinHandle;
use std::time::Duration;

fn put_in_background(gateway: &Gateway, token: &str) -> JoinHandle<Result<Reply>> {
    let (url, token) = (gateway.url(), token.to_owned());
    std::thread::spawn(move || {
        fencekeeper_harness::gateway::request(&url, "PUT", "/r", &[("fencing-token", &token)], token.as_bytes())
    })
}

fn join(handle: JoinHandle<Result<Reply>>) -> Reply {
    handle.join().expect("client thread").expect("request")
}

/// A gateway (started with `args`) whose write with token 33 on `/r` has been
/// forwarded and is held by the upstream, unanswered: the in-flight write of every
/// schedule below.
fn with_33_in_flight(args: &[&str]) -> (RecordingUpstream, Gateway, JoinHandle<Result<Reply>>) {
    let upstream = RecordingUpstream::start().unwrap();
    let gateway = Gateway::start(&upstream.url(), args).unwrap();
    upstream.hold("33");
    let a = put_in_background(&gateway, "33");
    upstream.wait_held("33").unwrap();
    (upstream, gateway, a)
}

/// Poll the gateway's gauge until `n` writes wait at the gate (bounded).
fn wait_gate_waiting(gateway: &Gateway, n: u64) {
    for _ in 0..500 {
        if gateway.metric("fencekeeper_gateway_gate_waiting").unwrap_or(0) == n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{n} writes never waited at the gate:\n{}", gateway.log());
}

#[test]
fn late_lower_token_write_never_lands_after_a_higher_one() {
    let (upstream, gateway, a) = with_33_in_flight(&[]);
    let b = put_in_background(&gateway, "34");
    wait_gate_waiting(&gateway, 1);
    assert!(upstream.applied().is_empty(), "34 reached the store while 33 was in flight");
    upstream.release("33");
    assert_eq!(join(a).status, 201);
    assert_eq!(join(b).status, 201);
    assert_eq!(upstream.tokens(), ["33", "34"]);
    assert_eq!(gateway.metric("fencekeeper_gateway_gate_waits_total").unwrap(), 1);
}

#[test]
fn without_the_gate_a_late_lower_token_write_lands_last() {
    let (upstream, gateway, a) = with_33_in_flight(&["--no-gate"]);
    assert_eq!(gateway.put("/r", Some("34"), b"34").unwrap().status, 201);
    upstream.release("33");
    assert_eq!(join(a).status, 201);
    // The window: the store applied the stale holder's write after the newer one.
    assert_eq!(upstream.tokens(), ["34", "33"]);
}

#[test]
fn waiting_write_overtaken_by_a_higher_token_is_refused_as_stale() {
    let (upstream, gateway, a) = with_33_in_flight(&[]);
    let b = put_in_background(&gateway, "34");
    wait_gate_waiting(&gateway, 1);
    let c = put_in_background(&gateway, "35");
    wait_gate_waiting(&gateway, 2);
    upstream.release("33");
    let (a, b, c) = (join(a), join(b), join(c));
    assert_eq!((a.status, c.status), (201, 201));
    assert_eq!(b.status, 409, "{}", b.body);
    assert_eq!(b.header("fencing-highest"), Some("35"));
    assert_eq!(upstream.tokens(), ["33", "35"]);
}

#[test]
fn write_waiting_past_the_gate_timeout_gets_503_and_never_lands() {
    let (upstream, gateway, a) = with_33_in_flight(&["--gate-timeout", "200ms"]);
    let b = gateway.put("/r", Some("34"), b"34").unwrap();
    assert_eq!(b.status, 503, "{}", b.body);
    assert!(b.body.contains("ordering gate"), "{}", b.body);
    upstream.release("33");
    assert_eq!(join(a).status, 201);
    assert_eq!(upstream.tokens(), ["33"]);
    assert_eq!(gateway.metric("fencekeeper_gateway_gate_timeouts_total").unwrap(), 1);
}

#[test]
fn writes_on_other_resources_do_not_wait() {
    let (upstream, gateway, a) = with_33_in_flight(&[]);
    assert_eq!(gateway.put("/other", Some("34"), b"34").unwrap().status, 201);
    upstream.release("33");
    assert_eq!(join(a).status, 201);
    assert_eq!(gateway.metric("fencekeeper_gateway_gate_waits_total").unwrap(), 0);
}

/// 33 is held at the store and its exchange given up on by `give_up` (the store
/// still applies it when released); 34 is written meanwhile. The order the store
/// applied them in, and 34's answer.
fn given_up_then_34(args: &[&str], give_up: impl FnOnce(&RecordingUpstream, &Gateway)) -> (Vec<String>, Reply) {
    let upstream = RecordingUpstream::start().unwrap();
    let gateway = Gateway::start(&upstream.url(), args).unwrap();
    upstream.hold("33");
    give_up(&upstream, &gateway);
    let b = put_in_background(&gateway, "34");
    // 34 waits at the gate, or (without a bound) is stored; then the store applies
    // 33 late, after the gateway gave up on it, within the bound.
    poll(|| gateway.metric("fencekeeper_gateway_gate_waiting").unwrap_or(0) == 1 || !upstream.applied().is_empty());
    upstream.release("33");
    let b = join(b);
    poll(|| upstream.applied().len() == 1 + usize::from(b.status == 201));
    (upstream.tokens(), b)
}

/// Poll `done` (at most 10 s): the gateway's gauge and the store's record are the
/// readiness signals.
fn poll(done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("condition not reached in 10 s");
}

/// The store takes longer than the gateway's request timeout: 504, given up on.
fn upstream_times_out(upstream: &RecordingUpstream, gateway: &Gateway) {
    let a = gateway.put("/r", Some("33"), b"33").unwrap();
    assert_eq!(a.status, 504, "{}", a.body);
    upstream.wait_held("33").unwrap();
    assert_eq!(gateway.metric("fencekeeper_gateway_gate_given_up_total").unwrap(), 1);
}

#[test]
fn a_write_the_gateway_gave_up_on_holds_its_resource_for_the_store_apply_bound() {
    let args = ["--request-timeout", "300ms", "--store-apply-bound", "3s"];
    let (order, b) = given_up_then_34(&args, upstream_times_out);
    assert_eq!(b.status, 201, "{}", b.body);
    assert_eq!(order, ["33", "34"]);
}

#[test]
fn without_an_apply_bound_a_write_the_gateway_gave_up_on_lands_after_the_newer_one() {
    let args = ["--request-timeout", "300ms", "--store-apply-bound", "0s"];
    let (order, b) = given_up_then_34(&args, upstream_times_out);
    assert_eq!(b.status, 201, "{}", b.body);
    assert_eq!(order, ["34", "33"]);
}

#[test]
fn a_write_the_store_reset_holds_its_resource_for_the_store_apply_bound() {
    let reset = |upstream: &RecordingUpstream, gateway: &Gateway| {
        upstream.hold_and_reset("33");
        let a = gateway.put("/r", Some("33"), b"33").unwrap();
        assert_eq!(a.status, 502, "{}", a.body);
    };
    let (order, b) = given_up_then_34(&["--store-apply-bound", "3s"], reset);
    assert_eq!(b.status, 201, "{}", b.body);
    assert_eq!(order, ["33", "34"]);
}

#[test]
fn a_write_whose_client_went_away_still_holds_its_resource_until_the_store_answers() {
    use std::io::Write;
    let hang_up = |upstream: &RecordingUpstream, gateway: &Gateway| {
        let addr = gateway.url().trim_start_matches("http://").to_owned();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let head = "PUT /r HTTP/1.1\r\nHost: fencekeeper\r\nfencing-token: 33\r\nContent-Length: 2\r\n\r\n33";
        s.write_all(head.as_bytes()).unwrap();
        upstream.wait_held("33").unwrap();
        drop(s);
    };
    // The exchange goes on without the client: 34 waits for the store's answer to 33.
    let (order, b) = given_up_then_34(&["--store-apply-bound", "0s"], hang_up);
    assert_eq!(b.status, 201, "{}", b.body);
    assert_eq!(order, ["33", "34"]);
}

#[test]
fn a_write_held_by_a_given_up_one_past_the_gate_timeout_is_told_when_to_retry() {
    let upstream = RecordingUpstream::start().unwrap();
    let args = ["--request-timeout", "200ms", "--store-apply-bound", "20s", "--gate-timeout", "200ms"];
    let gateway = Gateway::start(&upstream.url(), &args).unwrap();
    upstream.hold("33");
    upstream_times_out(&upstream, &gateway);
    let b = gateway.put("/r", Some("34"), b"34").unwrap();
    assert_eq!(b.status, 503, "{}", b.body);
    let retry: u64 = b.header("retry-after").unwrap().parse().unwrap();
    assert!((15..=20).contains(&retry), "Retry-After {retry}: when 33 stops holding the resource");
    upstream.release("33");
}
