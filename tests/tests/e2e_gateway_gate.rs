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

fn tokens(upstream: &RecordingUpstream) -> Vec<String> {
    upstream.applied().into_iter().map(|a| a.token).collect()
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
    assert_eq!(tokens(&upstream), ["33", "34"]);
    assert_eq!(gateway.metric("fencekeeper_gateway_gate_waits_total").unwrap(), 1);
}

#[test]
fn without_the_gate_a_late_lower_token_write_lands_last() {
    let (upstream, gateway, a) = with_33_in_flight(&["--no-gate"]);
    assert_eq!(gateway.put("/r", Some("34"), b"34").unwrap().status, 201);
    upstream.release("33");
    assert_eq!(join(a).status, 201);
    // The window: the store applied the stale holder's write after the newer one.
    assert_eq!(tokens(&upstream), ["34", "33"]);
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
    assert_eq!(tokens(&upstream), ["33", "35"]);
}

#[test]
fn write_waiting_past_the_gate_timeout_gets_503_and_never_lands() {
    let (upstream, gateway, a) = with_33_in_flight(&["--gate-timeout", "200ms"]);
    let b = gateway.put("/r", Some("34"), b"34").unwrap();
    assert_eq!(b.status, 503, "{}", b.body);
    assert!(b.body.contains("ordering gate"), "{}", b.body);
    upstream.release("33");
    assert_eq!(join(a).status, 201);
    assert_eq!(tokens(&upstream), ["33"]);
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
