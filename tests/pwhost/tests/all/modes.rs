//! Efficiency mode (marks in shared data, no etcd) under both profiles.

use crate::common::start;
use fencekeeper_pwhost::{Profile, Proxy, Request, State};
use serde_json::json;

fn profiles() -> [Profile; 1] {
    [Profile::envoy()]
}

fn efficiency() -> serde_json::Value {
    json!({"etcd": null, "mode": "efficiency"})
}

/// Send `request` to worker 0 and have the store answer 201 if it gets it; the answer.
fn write(proxy: &mut Proxy, worker: usize, request: Request) -> fencekeeper_pwhost::Answer {
    let id = proxy.send(worker, request);
    if proxy.state(id) == State::AtUpstream {
        proxy.respond(id, 201);
    }
    match proxy.state(id) {
        State::Answered(a) => a,
        other => panic!("{} profile: not answered: {other:?}", proxy.profile().name),
    }
}

#[test]
fn admits_then_refuses_a_stale_token_with_the_highest_under_every_profile() {
    for profile in profiles() {
        let mut proxy = start(profile, &efficiency(), 2);
        let name = proxy.profile().name;
        let a = write(&mut proxy, 0, Request::put("/r").token("34"));
        assert_eq!((a.status, a.local), (201, false), "{name}: {a:?}");
        let stale = write(&mut proxy, 1, Request::put("/r").token("33"));
        assert_eq!(stale.status, 409, "{name}: {stale:?}");
        assert_eq!(stale.header("fencing-highest"), Some("34"), "{name}");
        assert_eq!(write(&mut proxy, 0, Request::put("/r")).status, 428, "{name}: no token");
        assert_eq!(write(&mut proxy, 1, Request::put("/r").token("x1")).status, 400, "{name}: malformed");
        assert!(proxy.violations().is_empty(), "{name}: {:?}", proxy.violations());
    }
}

#[test]
fn a_higher_token_waits_while_a_lower_write_is_in_flight_then_goes() {
    let mut proxy = start(Profile::envoy(), &efficiency(), 2);
    let a = proxy.send(0, Request::put("/r").token("33"));
    assert_eq!(proxy.state(a), State::AtUpstream);
    let b = proxy.send(1, Request::put("/r").token("34"));
    assert_eq!(proxy.state(b), State::Held, "34 waits while 33 may still reach the store");
    proxy.advance(1_000);
    assert_eq!(proxy.state(b), State::Held, "still held: 33 is unanswered and within the budget");
    proxy.respond(a, 201);
    assert_eq!(proxy.state(b), State::AtUpstream, "33 answered: 34 goes");
    let admitted = proxy.forwarded(b).and_then(|h| h.iter().find(|(n, _)| n == "fencing-admitted-token").cloned());
    assert_eq!(admitted.map(|(_, v)| v), Some("34".to_owned()));
    proxy.respond(b, 201);
    assert_eq!(proxy.metric("fencekeeper.gate.waited"), Some(1));
    assert!(proxy.violations().is_empty(), "{:?}", proxy.violations());
}

#[test]
fn a_write_held_past_the_budget_behind_one_given_up_on_gets_503_with_retry_after() {
    let mut proxy = start(Profile::envoy(), &efficiency(), 1);
    let a = proxy.send(0, Request::put("/r").token("33"));
    proxy.give_up(a);
    let b = proxy.send(0, Request::put("/r").token("34"));
    assert_eq!(proxy.state(b), State::Held, "33 was given up on: the store may still apply it");
    proxy.advance(5_200);
    let State::Answered(answer) = proxy.state(b) else { panic!("{:?}", proxy.state(b)) };
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.header("retry-after").is_some(), "{answer:?}");
    assert_eq!(proxy.metric("fencekeeper.gate.given_up"), Some(1));
    assert!(proxy.violations().is_empty(), "{:?}", proxy.violations());
}
