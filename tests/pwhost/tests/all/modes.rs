//! Efficiency mode (marks in shared data, no etcd) under both profiles: the filter
//! configured for Envoy under `envoy`, and with `"host": "portable"` under both.

use crate::common::{answer, start, write};
use fencekeeper_pwhost::{Profile, Proxy, Request, State};
use serde_json::json;

/// Efficiency mode without etcd, for `host` (`None`: the default, Envoy).
pub fn efficiency(host: Option<&str>) -> serde_json::Value {
    let mut config = json!({"etcd": null, "mode": "efficiency"});
    if let Some(host) = host {
        config["host"] = json!(host);
    }
    config
}

/// Every profile with a configuration it runs: Envoy's own, and portable on each.
fn every_host() -> Vec<(Profile, serde_json::Value)> {
    vec![
        (Profile::envoy(), efficiency(None)),
        (Profile::envoy(), efficiency(Some("portable"))),
        (Profile::strict(), efficiency(Some("portable"))),
    ]
}

#[test]
fn admits_then_refuses_a_stale_token_with_the_highest_under_every_profile() {
    for (profile, config) in every_host() {
        let mut proxy = start(profile, &config, 2);
        let name = format!("{} profile, {config}", proxy.profile().name);
        let a = write(&mut proxy, 0, Request::put("/r").token("34"));
        assert_eq!((a.status, a.local), (201, false), "{name}: {a:?}");
        let stale = write(&mut proxy, 1, Request::put("/r").token("33"));
        assert_eq!(stale.status, 409, "{name}: {stale:?}");
        assert_eq!(stale.header("fencing-highest"), Some("34"), "{name}: the mark set through the other worker");
        assert_eq!(write(&mut proxy, 0, Request::put("/r")).status, 428, "{name}: no token");
        assert_eq!(write(&mut proxy, 1, Request::put("/r").token("x1")).status, 400, "{name}: malformed");
        assert_eq!(proxy.metric("fencekeeper.admitted"), Some(1), "{name}");
        assert_eq!(proxy.metric("fencekeeper.stale"), Some(1), "{name}");
        assert!(proxy.violations().is_empty(), "{name}: {:?}", proxy.violations());
    }
}

#[test]
fn a_higher_token_waits_while_a_lower_write_is_in_flight_then_goes() {
    let mut proxy = start(Profile::envoy(), &efficiency(None), 2);
    let a = proxy.send(0, Request::put("/r").token("33"));
    assert_eq!(proxy.state(a), State::AtUpstream);
    let b = proxy.send(1, Request::put("/r").token("34"));
    assert_eq!(proxy.state(b), State::Held, "34 waits while 33 may still reach the store");
    proxy.advance(1_000);
    assert_eq!(proxy.state(b), State::Held, "still held: 33 is unanswered and within the budget");
    proxy.respond(a, 201);
    assert_eq!(proxy.state(b), State::AtUpstream, "33 answered: 34 goes at once (the queue woke its worker)");
    let admitted = proxy.forwarded(b).and_then(|h| h.iter().find(|(n, _)| n == "fencing-admitted-token").cloned());
    assert_eq!(admitted.map(|(_, v)| v), Some("34".to_owned()));
    proxy.respond(b, 201);
    assert_eq!(proxy.metric("fencekeeper.gate.waited"), Some(1));
    assert!(proxy.violations().is_empty(), "{:?}", proxy.violations());
}

#[test]
fn a_write_held_past_the_budget_behind_one_given_up_on_gets_503_with_retry_after() {
    let mut proxy = start(Profile::envoy(), &efficiency(None), 1);
    let a = proxy.send(0, Request::put("/r").token("33"));
    proxy.give_up(a);
    let b = proxy.send(0, Request::put("/r").token("34"));
    assert_eq!(proxy.state(b), State::Held, "33 was given up on: the store may still apply it");
    proxy.advance(5_200);
    let answer = answer(&mut proxy, b);
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.header("retry-after").is_some(), "{answer:?}");
    assert_eq!(proxy.metric("fencekeeper.gate.given_up"), Some(1));
    assert!(proxy.violations().is_empty(), "{:?}", proxy.violations());
}

/// The ordering gate where nothing can hold a write: refused at once, from its own
/// context, while a lower one is in flight; admitted as soon as the store answered it.
#[test]
fn where_no_write_can_be_held_a_higher_token_is_refused_503_while_a_lower_is_in_flight_then_admitted() {
    for (profile, config) in [
        (Profile::strict(), efficiency(Some("portable"))),
        (Profile::envoy(), efficiency(Some("portable"))),
        // Configured for Envoy, on a host that does not switch contexts: found out.
        (Profile { switches_context: false, ..Profile::envoy() }, efficiency(None)),
    ] {
        let mut proxy = start(profile, &config, 2);
        let name = format!("{} profile, {config}", proxy.profile().name);
        let a = proxy.send(0, Request::put("/r").token("33"));
        assert_eq!(proxy.state(a), State::AtUpstream, "{name}");
        let b = proxy.send(1, Request::put("/r").token("34"));
        let refused = answer(&mut proxy, b);
        assert_eq!((refused.status, refused.local), (503, true), "{name}: {refused:?}");
        assert_eq!(refused.header("retry-after"), Some("1"), "{name}: 33 is unanswered: soon");
        assert!(refused.body.contains("cannot be held"), "{name}: {refused:?}");
        assert_eq!(proxy.forwarded(b), None, "{name}: never forwarded");
        proxy.respond(a, 201);
        // The store's 201 ended 33's flight at once: no code_details needed.
        let c = proxy.send(1, Request::put("/r").token("34"));
        assert_eq!(proxy.state(c), State::AtUpstream, "{name}: 33 answered by the store");
        proxy.respond(c, 201);
        assert_eq!(proxy.metric("fencekeeper.gate.given_up"), Some(0), "{name}");
        assert!(proxy.violations().is_empty(), "{name}: {:?}", proxy.violations());
    }
}

/// Without `response.code_details` a local 504 still counts as given up: the store may
/// apply 33 later, so 34 is refused for the store apply bound, never let through.
#[test]
fn without_code_details_a_write_the_proxy_gave_up_on_holds_its_resource_for_the_bound() {
    let mut proxy = start(Profile::strict(), &efficiency(Some("portable")), 1);
    let a = proxy.send(0, Request::put("/r").token("33"));
    proxy.give_up(a);
    assert_eq!(proxy.metric("fencekeeper.gate.given_up"), Some(1));
    proxy.advance(30_000);
    let refused = answer_of(&mut proxy, Request::put("/r").token("34"));
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("30"), "until the bound after the give-up: {refused:?}");
    proxy.advance(30_001);
    let b = proxy.send(0, Request::put("/r").token("34"));
    assert_eq!(proxy.state(b), State::AtUpstream, "the bound passed");
    assert!(proxy.violations().is_empty(), "{:?}", proxy.violations());
}

/// A store's own 5xx is, without code_details, taken as possibly the proxy's: safe.
#[test]
fn without_code_details_a_stores_503_is_taken_as_given_up() {
    let mut proxy = start(Profile::strict(), &efficiency(Some("portable")), 1);
    let a = proxy.send(0, Request::put("/r").token("33"));
    proxy.respond(a, 503);
    assert_eq!(proxy.metric("fencekeeper.gate.given_up"), Some(1));
    // With Envoy's details the same answer is the store's.
    let mut envoy = start(Profile::envoy(), &efficiency(None), 1);
    let a = envoy.send(0, Request::put("/r").token("33"));
    envoy.respond(a, 503);
    assert_eq!(envoy.metric("fencekeeper.gate.given_up"), Some(0));
}

fn answer_of(proxy: &mut Proxy, request: Request) -> fencekeeper_pwhost::Answer {
    let id = proxy.send(0, request);
    answer(proxy, id)
}
