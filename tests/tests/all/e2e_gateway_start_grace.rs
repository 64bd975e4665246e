//! A gateway SIGKILLed with a write in flight to a store that still applies it: the
//! ordering gate lived in the dead process, so the restarted gateway forwards a newer
//! token at once and the store applies the older write after it (the torture run's
//! `gateway-kill-slow-upstream` finding). `--start-grace` closes it: for that long
//! after start, fenced writes are refused with 503 and `Retry-After`, before any admit.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::gateway::{Gateway, RecordingUpstream};
use fencekeeper_harness::services::poll_until;
use std::time::{Duration, Instant};

/// Token 33 in flight and held by the store when the gateway is SIGKILLed and
/// restarted; returns when the restart began (the new process started after it).
fn kill_with_33_in_flight(upstream: &RecordingUpstream, gw: &mut Gateway) -> Instant {
    gw.put("/r", Some("32"), b"32").unwrap();
    upstream.hold("33");
    let url = gw.url();
    let writer = std::thread::spawn(move || {
        fencekeeper_harness::gateway::request(&url, "PUT", "/r", &[("fencing-token", "33")], b"33")
    });
    upstream.wait_held("33").unwrap();
    gw.kill();
    assert!(writer.join().unwrap().is_err(), "the client of a killed gateway gets no answer");
    let restarting = Instant::now();
    gw.restart().unwrap();
    restarting
}

fn applied_tokens(upstream: &RecordingUpstream) -> Vec<String> {
    upstream.applied().into_iter().map(|a| a.token).collect()
}

#[test]
fn without_a_start_grace_a_write_in_flight_through_a_killed_gateway_lands_after_a_newer_one() {
    let upstream = RecordingUpstream::start().unwrap();
    let mut gw = Gateway::start(&upstream.url(), &[]).unwrap();
    kill_with_33_in_flight(&upstream, &mut gw);
    assert_eq!(gw.put("/r", Some("34"), b"34").unwrap().status, 201, "the restarted gateway forwards at once");
    upstream.release("33");
    poll_until("the held write applied", Duration::from_secs(10), || upstream.applied().len() == 3).unwrap();
    assert_eq!(applied_tokens(&upstream), ["32", "34", "33"], "the stale write landed last: the window is real");
}

#[test]
fn a_start_grace_refuses_fenced_writes_until_writes_in_flight_before_the_crash_have_landed() {
    let grace = Duration::from_secs(6);
    let upstream = RecordingUpstream::start().unwrap();
    let mut gw = Gateway::start(&upstream.url(), &["--start-grace", "6s"]).unwrap();
    // The first gateway's own grace: wait it out (a fresh gateway refuses too).
    poll_until("the first grace over", Duration::from_secs(20), || {
        gw.put("/first", Some("1"), b"1").is_ok_and(|r| r.status == 201)
    })
    .unwrap();
    let restarted = kill_with_33_in_flight(&upstream, &mut gw);

    let refused = gw.put("/r", Some("34"), b"34").unwrap();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.body.contains("start grace"), "the reason names the grace: {}", refused.body);
    assert!(refused.body.contains("retry with the same token"), "and what to do: {}", refused.body);
    let retry: u64 = refused.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!((1..=6).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        gw.mark("/r").unwrap().as_deref(),
        Some("33"),
        "refused before any admit: the mark is the dead gateway's"
    );
    assert_eq!(gw.metric("fencekeeper_gateway_start_grace_total").unwrap(), 1);

    // The store applies the dead gateway's write while the new one refuses.
    upstream.release("33");
    poll_until("the held write applied", Duration::from_secs(10), || upstream.applied().len() == 3).unwrap();
    poll_until("the grace over", Duration::from_secs(20), || {
        gw.put("/r", Some("34"), b"34").is_ok_and(|r| r.status == 201)
    })
    .unwrap();
    assert!(
        restarted.elapsed() >= grace,
        "admitted {:?} after the restart began, within the grace",
        restarted.elapsed()
    );
    assert_eq!(applied_tokens(&upstream), ["1", "32", "33", "34"], "store order is token order");
}
