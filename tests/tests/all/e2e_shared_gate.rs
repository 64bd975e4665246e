//! End-to-end: the ordering gate across instances (the shared gate, on by default
//! whenever the marks are in etcd), through real gateways and Envoys sharing a real
//! etcd in front of one store that holds chosen writes.
//! Holder 33 writes through one instance and its write is slow at the store; holder
//! 34 writes through another. With the default flags the store applies 33 then 34;
//! each story has a control with `--local-gate` (the opt-out) that shows the window.

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::{exchange_on, Envoy, Reply as EnvoyReply};
use fencekeeper_harness::gateway::{request, Gateway, RecordingUpstream, Reply};
use fencekeeper_harness::relay::Relay;
use fencekeeper_harness::services::Etcd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn gateway(upstream: &RecordingUpstream, etcd: &Etcd, extra: &[&str]) -> Gateway {
    let url = etcd.url();
    let mut args = vec!["--etcd", url.as_str()];
    args.extend_from_slice(extra);
    Gateway::start(&upstream.url(), &args).unwrap()
}

fn put_in_background(url: String, token: &str) -> JoinHandle<Reply> {
    let token = token.to_owned();
    std::thread::spawn(move || request(&url, "PUT", "/r", &[("fencing-token", &token)], token.as_bytes()).unwrap())
}

/// Poll `done` (at most 20 s): the gauges and the store's record are the signals.
fn poll(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not reached in 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// 33 through `a`, held at the store; 34 through `b`, which waits or (without the
/// shared gate) is stored; then the store applies 33. The order it applied them in.
fn slow_33_on_a_then_34_on_b(upstream: &RecordingUpstream, a: &Gateway, b: &Gateway) -> Vec<String> {
    upstream.hold("33");
    let first = put_in_background(a.url(), "33");
    upstream.wait_held("33").unwrap();
    let second = put_in_background(b.url(), "34");
    poll("34 waits or is stored", || {
        b.metric("fencekeeper_gateway_shared_gate_waiting").unwrap_or(0) == 1 || !upstream.applied().is_empty()
    });
    upstream.release("33");
    assert_eq!(first.join().unwrap().status, 201);
    assert_eq!(second.join().unwrap().status, 201);
    upstream.tokens()
}

#[test]
fn two_gateways_with_default_flags_never_land_a_lower_write_after_a_higher_one() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (a, b) = (gateway(&upstream, &etcd, &[]), gateway(&upstream, &etcd, &[]));
    assert_eq!(slow_33_on_a_then_34_on_b(&upstream, &a, &b), ["33", "34"]);
}

#[test]
fn two_gateways_with_the_shared_gate_named_never_land_a_lower_write_after_a_higher_one() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (a, b) = (gateway(&upstream, &etcd, &["--shared-gate"]), gateway(&upstream, &etcd, &["--shared-gate"]));
    assert_eq!(slow_33_on_a_then_34_on_b(&upstream, &a, &b), ["33", "34"]);
}

/// An operator lowers a mark beside a running gateway (`marks --set`, after a forged
/// token raised it, say). The holder of the token the gateway's copy still names
/// writes again: the registry's pass finds the mark moved (the copy's equal-token
/// confirm is the pass's), the write is refused for a retry, and the retry, judged on
/// the mark read again, raises it back and goes. Not a 503 on every retry.
#[test]
fn after_an_operator_lowers_a_mark_the_holders_retry_goes() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let a = gateway(&upstream, &etcd, &["--provenance", "off"]);
    let put = |body: &[u8]| request(&a.url(), "PUT", "/r", &[("fencing-token", "34")], body).unwrap();
    assert_eq!(put(b"first").status, 201);
    let set = std::process::Command::new(fencekeeper_harness::workspace_bin("fencekeeper").unwrap())
        .args(["marks", "--etcd", &etcd.url(), "--set", "/r", "30", "--force"])
        .output()
        .unwrap();
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let first = put(b"after the set");
    let retried = if first.status == 503 {
        assert!(first.body.contains("retry"), "{}", first.body);
        put(b"after the set, again")
    } else {
        first
    };
    assert!((200..300).contains(&retried.status), "{}: {}\n{}", retried.status, retried.body, a.log());
    assert_eq!(a.mark("/r").unwrap().as_deref(), Some("34"), "raised back");
}

/// The same through an Envoy (one worker: both writes see one shared-data copy).
#[test]
fn after_an_operator_lowers_a_mark_the_holders_retry_through_envoy_goes() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (up, client) = (upstream.addr.to_string(), etcd.client.to_string());
    let envoy = Envoy::start(1, &["--upstream", &up, "--etcd", &client, "--provenance", "off"]).unwrap();
    assert_eq!(envoy.put("/r", "34", "first").unwrap().status, 201);
    let set = std::process::Command::new(fencekeeper_harness::workspace_bin("fencekeeper").unwrap())
        .args(["marks", "--etcd", &etcd.url(), "--set", "/r", "30", "--force"])
        .output()
        .unwrap();
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let first = envoy.put("/r", "34", "after the set").unwrap();
    let retried = if first.status == 503 {
        assert!(first.text().contains("retry"), "{}", first.text());
        envoy.put("/r", "34", "after the set, again").unwrap()
    } else {
        first
    };
    assert!((200..300).contains(&retried.status), "{}: {}\n{}", retried.status, retried.text(), envoy.log());
}

#[test]
fn two_gateways_with_the_local_gate_land_the_lower_write_last() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (a, b) = (gateway(&upstream, &etcd, &["--local-gate"]), gateway(&upstream, &etcd, &["--local-gate"]));
    // The window across instances: each gateway sees only its own writes in flight.
    assert_eq!(slow_33_on_a_then_34_on_b(&upstream, &a, &b), ["34", "33"]);
}

#[test]
fn a_gateway_killed_with_a_write_in_flight_holds_the_resource_through_its_lease() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let short = ["--shared-gate", "--request-timeout", "1s", "--store-apply-bound", "2s"];
    let mut a = gateway(&upstream, &etcd, &short);
    let b = gateway(&upstream, &etcd, &["--shared-gate", "--gate-timeout", "20s"]);
    upstream.hold("33");
    let first = put_in_background(a.url(), "33");
    upstream.wait_held("33").unwrap();
    a.kill();
    let _ = first.join();
    let killed = Instant::now();
    let second = put_in_background(b.url(), "34");
    poll("34 waits for the dead gateway's flight", || {
        b.metric("fencekeeper_gateway_shared_gate_waiting").unwrap_or(0) == 1
    });
    // The store applies the dead gateway's write late, within the bound.
    upstream.release("33");
    let second = second.join().unwrap();
    assert_eq!(second.status, 201, "{}", second.body);
    assert_eq!(upstream.tokens(), ["33", "34"]);
    // It waited for the lease (1 s + 2 s + margin), not for the 20 s gate timeout.
    let waited = killed.elapsed();
    assert!(waited >= Duration::from_secs(3) && waited < Duration::from_secs(15), "{waited:?}");
}

#[test]
fn a_flight_whose_delete_was_lost_holds_the_resource_only_until_its_lease_expires() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    // `a` reaches etcd through a relay that can cut it off; `b` directly.
    let relay = Relay::start(etcd.client).unwrap();
    let short = ["--shared-gate", "--request-timeout", "1s", "--store-apply-bound", "1s"];
    let relayed = relay.url();
    let a = Gateway::start(&upstream.url(), &[&["--etcd", relayed.as_str()][..], &short[..]].concat()).unwrap();
    let b = gateway(&upstream, &etcd, &["--shared-gate", "--gate-timeout", "60s"]);
    // 5 is stored through `a`; the delete of its flight that `a` sends a little later
    // is lost, and `a` stays cut off from etcd (its retries are lost too).
    let first = request(&a.url(), "PUT", "/r", &[("fencing-token", "5")], b"5").unwrap();
    relay.sever();
    assert_eq!(first.status, 201, "{}", first.body);
    poll("the lost delete", || a.log().contains("could not be deleted from the in-flight registry"));
    // 6 through `b` finds 5's flight, which no write stands for any more: it waits
    // until the key is gone, and the key is gone once its lease expires.
    let lost = Instant::now();
    let second = put_in_background(b.url(), "6");
    poll("6 waits for the flight nobody deleted", || {
        b.metric("fencekeeper_gateway_shared_gate_waiting").unwrap_or(0) == 1
    });
    let second = second.join().unwrap();
    relay.heal();
    assert_eq!(second.status, 201, "{}", second.body);
    assert_eq!(upstream.tokens(), ["5", "6"]);
    let waited = lost.elapsed();
    assert!(waited < Duration::from_secs(30), "{waited:?}");
}

/// A delete that failed while etcd was out of reach is sent again once it is back:
/// the flight no write stands for holds its resource for the outage, not for the
/// rest of its lease (12 s here).
#[test]
fn a_flight_whose_delete_failed_is_deleted_once_etcd_is_back() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let relay = Relay::start(etcd.client).unwrap();
    let short = ["--request-timeout", "1s", "--store-apply-bound", "1s"];
    let relayed = relay.url();
    let a = Gateway::start(&upstream.url(), &[&["--etcd", relayed.as_str()][..], &short[..]].concat()).unwrap();
    let b = gateway(&upstream, &etcd, &["--gate-timeout", "60s"]);
    let first = request(&a.url(), "PUT", "/r", &[("fencing-token", "5")], b"5").unwrap();
    relay.sever();
    assert_eq!(first.status, 201, "{}", first.body);
    poll("the failed delete", || a.log().contains("could not be deleted from the in-flight registry"));
    relay.heal();
    let back = Instant::now();
    let second = request(&b.url(), "PUT", "/r", &[("fencing-token", "6")], b"6").unwrap();
    assert_eq!(second.status, 201, "{}", second.body);
    assert_eq!(upstream.tokens(), ["5", "6"]);
    let waited = back.elapsed();
    assert!(waited < Duration::from_secs(6), "6 waited {waited:?}: the flight went with its lease, not the retry");
}

fn envoy(upstream: &RecordingUpstream, etcd: &Etcd, extra: &[&str]) -> Envoy {
    let (up, client) = (upstream.addr.to_string(), etcd.client.to_string());
    // Made-up tokens, not etcd revisions: the provenance check is e2e_envoy_provenance's.
    let mut args = vec!["--upstream", &up, "--etcd", &client, "--provenance", "off"];
    args.extend_from_slice(extra);
    Envoy::start(2, &args).unwrap()
}

fn envoy_put_in_background(envoy: &Envoy, token: &str) -> JoinHandle<EnvoyReply> {
    let s = std::net::TcpStream::connect(envoy.listen).unwrap();
    let token = token.to_owned();
    std::thread::spawn(move || exchange_on(s, "PUT", "/r", &[("fencing-token", &token)], token.as_bytes()).unwrap())
}

const ENVOY_SHARED_WAITED: &str = "wasmcustom.fencekeeper.gate.shared_waited";

/// Write `token` through `envoy` until the store holds it: on a loaded machine a
/// first write can be refused 503 (etcd slower than the filter's call timeout)
/// before it is ever forwarded, which is not what these tests are about.
fn held_at_the_store(upstream: &RecordingUpstream, envoy: &Envoy, token: &str) -> JoinHandle<EnvoyReply> {
    for _ in 0..10 {
        let write = envoy_put_in_background(envoy, token);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !write.is_finished() && Instant::now() < deadline {
            if upstream.wait_held_for(token, Duration::from_millis(50)) {
                return write;
            }
        }
        let reply = write.join().unwrap();
        eprintln!("{token} was answered {} before the store held it: {}", reply.status, reply.text());
    }
    panic!("{token} never reached the store");
}

#[test]
fn two_envoys_and_a_gateway_with_default_flags_never_land_a_lower_write_after_a_higher_one() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (e1, e2) = (envoy(&upstream, &etcd, &[]), envoy(&upstream, &etcd, &[]));
    let gw = gateway(&upstream, &etcd, &[]);
    upstream.hold("33");
    let a = held_at_the_store(&upstream, &e1, "33");
    // 34 through the gateway waits for Envoy 1's 33; 35 through Envoy 2 waits for both.
    let b = put_in_background(gw.url(), "34");
    poll("34 waits", || gw.metric("fencekeeper_gateway_shared_gate_waiting").unwrap_or(0) == 1);
    let c = envoy_put_in_background(&e2, "35");
    e2.wait_stat(ENVOY_SHARED_WAITED, 1).unwrap();
    assert!(upstream.applied().is_empty(), "a higher write reached the store while 33 was in flight");
    upstream.release("33");
    let (a, b, c) = (a.join().unwrap(), b.join().unwrap(), c.join().unwrap());
    assert_eq!((a.status, c.status), (201, 201), "{} / {}", a.text(), c.text());
    // 34 was overtaken by 35 while it waited: refused, never sent after 35.
    assert_eq!(b.status, 409, "{}", b.body);
    assert_eq!(b.header("fencing-highest"), Some("35"));
    assert_eq!(upstream.tokens(), ["33", "35"]);
}

#[test]
fn an_envoy_and_a_gateway_with_default_flags_never_land_a_lower_write_after_a_higher_one() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (e1, gw) = (envoy(&upstream, &etcd, &[]), gateway(&upstream, &etcd, &[]));
    upstream.hold("33");
    let a = held_at_the_store(&upstream, &e1, "33");
    let b = put_in_background(gw.url(), "34");
    poll("34 waits", || gw.metric("fencekeeper_gateway_shared_gate_waiting").unwrap_or(0) == 1);
    assert!(upstream.applied().is_empty(), "34 reached the store while 33 was in flight");
    upstream.release("33");
    assert_eq!(a.join().unwrap().status, 201);
    assert_eq!(b.join().unwrap().status, 201);
    assert_eq!(upstream.tokens(), ["33", "34"]);
}

#[test]
fn two_envoys_with_the_local_gate_land_the_lower_write_last() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (e1, e2) = (envoy(&upstream, &etcd, &["--local-gate"]), envoy(&upstream, &etcd, &["--local-gate"]));
    upstream.hold("33");
    let a = held_at_the_store(&upstream, &e1, "33");
    assert_eq!(e2.put("/r", "34", b"34").unwrap().status, 201);
    upstream.release("33");
    assert_eq!(a.join().unwrap().status, 201);
    assert_eq!(upstream.tokens(), ["34", "33"]);
}

#[test]
fn an_envoy_killed_with_a_write_in_flight_holds_the_resource_through_its_lease() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let mut e1 = envoy(&upstream, &etcd, &["--shared-gate", "--request-timeout", "1s", "--store-apply-bound", "2s"]);
    let e2 = envoy(&upstream, &etcd, &["--shared-gate", "--gate-timeout", "20s"]);
    upstream.hold("33");
    let a = held_at_the_store(&upstream, &e1, "33");
    e1.kill();
    let _ = a.join();
    let killed = Instant::now();
    let b = envoy_put_in_background(&e2, "34");
    e2.wait_stat(ENVOY_SHARED_WAITED, 1).unwrap();
    upstream.release("33");
    let b = b.join().unwrap();
    assert_eq!(b.status, 201, "{}", b.text());
    assert_eq!(upstream.tokens(), ["33", "34"]);
    let waited = killed.elapsed();
    assert!(waited >= Duration::from_secs(3) && waited < Duration::from_secs(15), "{waited:?}");
}

// After a write waited at one instance's gate, another instance on the same etcd may
// have admitted a higher token meanwhile, which the first one's gate never saw. Both
// hosts check the mark again before the write goes: it is refused as stale, never
// sent after the higher one. Without the shared gate the gateway reads the mark again
// and Envoy confirms it in etcd (as a holder writing again is confirmed); with it,
// the registry's Txn, which compares the mark with the token, is that check in both.

/// A write with a token, in the background: its status and `fencing-highest`.
type Put<'a> = Box<dyn Fn(&str) -> JoinHandle<(u16, Option<String>)> + 'a>;

/// One instance of a test below: how to write through it, in the background, and
/// whether its gate holds a write (locally, or in the shared registry).
struct Instance<'a> {
    put: Put<'a>,
    waiting: Box<dyn Fn() -> bool + 'a>,
    shared_waiting: Box<dyn Fn() -> bool + 'a>,
}

fn through_gateway(gw: &Gateway) -> Instance<'_> {
    Instance {
        put: Box::new(|token| {
            let write = put_in_background(gw.url(), token);
            std::thread::spawn(move || {
                let r = write.join().unwrap();
                (r.status, r.header("fencing-highest").map(str::to_owned))
            })
        }),
        waiting: Box::new(|| gw.metric("fencekeeper_gateway_gate_waiting").unwrap_or(0) == 1),
        shared_waiting: Box::new(|| gw.metric("fencekeeper_gateway_shared_gate_waiting").unwrap_or(0) == 1),
    }
}

fn through_envoy(envoy: &Envoy) -> Instance<'_> {
    Instance {
        put: Box::new(|token| {
            let write = envoy_put_in_background(envoy, token);
            std::thread::spawn(move || {
                let r = write.join().unwrap();
                (r.status, r.header("fencing-highest").map(str::to_owned))
            })
        }),
        waiting: Box::new(|| envoy.stat("wasmcustom.fencekeeper.gate.waited").unwrap_or(0) == 1),
        shared_waiting: Box::new(|| envoy.stat(ENVOY_SHARED_WAITED).unwrap_or(0) == 1),
    }
}

/// 33 through `a`, held at the store (`hold_33`); 34 through `a` waits for it at
/// `a`'s gate; 35 through `b` is admitted (stored, or held by the shared registry for
/// 33); then the store applies 33. 34 must be refused as stale (35 is the mark), 35
/// stored, and the store must have applied `applied`, never 34.
fn stale_after_waiting(
    upstream: &RecordingUpstream,
    hold_33: impl FnOnce() -> JoinHandle<(u16, Option<String>)>,
    a: &Instance,
    b: &Instance,
    applied: [&str; 2],
) {
    upstream.hold("33");
    let first = hold_33();
    let second = (a.put)("34");
    poll("34 waits for 33", || (a.waiting)());
    let third = (b.put)("35");
    poll("35 is admitted", || upstream.tokens().contains(&"35".to_owned()) || (b.shared_waiting)());
    upstream.release("33");
    assert_eq!(first.join().unwrap().0, 201);
    assert_eq!((second.join().unwrap(), third.join().unwrap().0), ((409, Some("35".to_owned())), 201));
    assert_eq!(upstream.tokens(), applied, "34 was sent after 35");
}

fn envoy_holding_33<'a>(
    upstream: &'a RecordingUpstream,
    envoy: &'a Envoy,
) -> impl FnOnce() -> JoinHandle<(u16, Option<String>)> + 'a {
    move || {
        let write = held_at_the_store(upstream, envoy, "33");
        std::thread::spawn(move || (write.join().unwrap().status, None))
    }
}

fn gateway_holding_33<'a>(
    upstream: &'a RecordingUpstream,
    a: &'a Instance<'a>,
) -> impl FnOnce() -> JoinHandle<(u16, Option<String>)> + 'a {
    move || {
        let write = (a.put)("33");
        upstream.wait_held("33").unwrap();
        write
    }
}

#[test]
fn a_write_that_waited_at_a_gateway_is_stale_once_another_gateway_admitted_a_higher_token() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (ga, gb) = (gateway(&upstream, &etcd, &["--local-gate"]), gateway(&upstream, &etcd, &["--local-gate"]));
    let (a, b) = (through_gateway(&ga), through_gateway(&gb));
    // Without the shared gate 33 still lands after 35 (the window across instances).
    let hold = gateway_holding_33(&upstream, &a);
    stale_after_waiting(&upstream, hold, &a, &b, ["35", "33"]);
}

#[test]
fn a_write_that_waited_at_an_envoy_is_stale_once_another_envoy_admitted_a_higher_token() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (e1, e2) = (envoy(&upstream, &etcd, &["--local-gate"]), envoy(&upstream, &etcd, &["--local-gate"]));
    let (a, b) = (through_envoy(&e1), through_envoy(&e2));
    let hold = envoy_holding_33(&upstream, &e1);
    stale_after_waiting(&upstream, hold, &a, &b, ["35", "33"]);
}

#[test]
fn with_the_shared_gate_the_registry_checks_the_mark_after_a_wait_at_a_gateway() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (ga, e1) = (gateway(&upstream, &etcd, &["--shared-gate"]), envoy(&upstream, &etcd, &["--shared-gate"]));
    let (a, b) = (through_gateway(&ga), through_envoy(&e1));
    // The gateway reads no mark after the wait: the registry's Txn refuses 34.
    let hold = gateway_holding_33(&upstream, &a);
    stale_after_waiting(&upstream, hold, &a, &b, ["33", "35"]);
}

#[test]
fn with_the_shared_gate_the_registry_checks_the_mark_after_a_wait_at_an_envoy() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (e1, gb) = (envoy(&upstream, &etcd, &["--shared-gate"]), gateway(&upstream, &etcd, &["--shared-gate"]));
    let (a, b) = (through_envoy(&e1), through_gateway(&gb));
    // Envoy confirms nothing itself after the wait: the registry's Txn refuses 34.
    let hold = envoy_holding_33(&upstream, &e1);
    stale_after_waiting(&upstream, hold, &a, &b, ["33", "35"]);
}

/// A third gateway started while 33 is held at the store through the first one
/// (scaling out under load) finds that flight on its first write: 34 through it
/// waits, and the store applies 33 then 34.
#[test]
fn a_gateway_that_joins_while_a_write_is_in_flight_orders_its_writes_after_it() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (a, _b) = (gateway(&upstream, &etcd, &[]), gateway(&upstream, &etcd, &[]));
    upstream.hold("33");
    let first = put_in_background(a.url(), "33");
    upstream.wait_held("33").unwrap();
    let joined = gateway(&upstream, &etcd, &[]);
    let second = put_in_background(joined.url(), "34");
    poll("34 waits at the joined gateway", || {
        joined.metric("fencekeeper_gateway_shared_gate_waiting").unwrap_or(0) == 1 || !upstream.applied().is_empty()
    });
    upstream.release("33");
    assert_eq!(first.join().unwrap().status, 201);
    assert_eq!(second.join().unwrap().status, 201);
    assert_eq!(upstream.tokens(), ["33", "34"]);
}

/// A holder that goes on writing with its token after the lock moved on, from 8
/// connections through one gateway, never starves the next holder through another:
/// its writes are refused once etcd showed the higher mark, and do not keep its
/// flight alive, so the next holder's write goes within the gate timeout, every
/// round; and no write of the old token that started after an advance returned is
/// stored.
#[test]
fn a_holder_writing_on_with_a_superseded_token_never_starves_the_next_holder_through_another_gateway() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (a, b) = (gateway(&upstream, &etcd, &[]), gateway(&upstream, &etcd, &[]));
    let put = |g: &Gateway, token: u64| {
        let t = token.to_string();
        request(&g.url(), "PUT", "/busy", &[("fencing-token", &t)], t.as_bytes()).unwrap().status
    };
    assert_eq!(put(&a, 10), 201);
    let (stop, holder) = (AtomicBool::new(false), AtomicU64::new(10));
    type Late = Vec<(u64, Instant, u16)>;
    let (advanced_at, late): (Vec<(u64, Instant)>, Late) = std::thread::scope(|s| {
        let load: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    while !stop.load(SeqCst) {
                        let token = holder.load(SeqCst);
                        let start = Instant::now();
                        mine.push((token, start, put(&a, token)));
                    }
                    mine
                })
            })
            .collect();
        let mut advanced_at = Vec::new();
        for token in 11..=14 {
            std::thread::sleep(Duration::from_millis(300)); // the load runs meanwhile
            let start = Instant::now();
            let status = put(&b, token);
            if status != 201 {
                stop.store(true, SeqCst);
            }
            assert_eq!(status, 201, "round {token}: the next holder was refused after {:?}", start.elapsed());
            advanced_at.push((token, Instant::now()));
            // The old holder learns late that it lost the lock.
            std::thread::sleep(Duration::from_millis(300));
            holder.store(token, SeqCst);
        }
        stop.store(true, SeqCst);
        (advanced_at, load.into_iter().flat_map(|t| t.join().unwrap()).collect())
    });
    let mut refused = 0;
    for (token, start, status) in late {
        let superseded = advanced_at.iter().find(|(t, _)| *t == token + 1);
        if superseded.is_some_and(|(_, at)| start > *at) {
            assert_eq!(status, 409, "token {token}, sent after {} was admitted", token + 1);
            refused += 1;
        }
    }
    assert!(refused >= 20, "only {refused} writes came after an advance");
}

/// With the shared gate the gateway leaves the confirm of a token equal to its copy
/// of the mark to the registry's Txn: a gateway whose copy still says 20 after
/// another gateway admitted 21 refuses 20 as stale, names 21, and stores nothing.
#[test]
fn a_gateway_whose_copy_of_the_mark_is_old_refuses_the_old_token_through_the_registrys_compare() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let (a, b) = (gateway(&upstream, &etcd, &[]), gateway(&upstream, &etcd, &[]));
    let put = |g: &Gateway, token: &str| request(&g.url(), "PUT", "/r", &[("fencing-token", token)], token.as_bytes());
    assert_eq!(put(&a, "20").unwrap().status, 201);
    assert_eq!(put(&b, "21").unwrap().status, 201);
    let stale = put(&a, "20").unwrap();
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert_eq!(stale.headers.iter().find(|(k, _)| k == "fencing-highest").map(|(_, v)| v.as_str()), Some("21"));
    assert_eq!(upstream.tokens(), ["20", "21"]);
    assert_eq!(a.metric("fencekeeper_gateway_requests_total{class=\"stale\"}").unwrap(), 1);
}

/// An Envoy started while 33 is held at the store through another (scaling out
/// under load) finds that flight on its first write: 34 through it waits, and the
/// store applies 33 then 34.
#[test]
fn an_envoy_that_joins_while_a_write_is_in_flight_orders_its_writes_after_it() {
    let (upstream, etcd) = (RecordingUpstream::start().unwrap(), Etcd::start().unwrap());
    let first = envoy(&upstream, &etcd, &[]);
    upstream.hold("33");
    let a = held_at_the_store(&upstream, &first, "33");
    let joined = envoy(&upstream, &etcd, &[]);
    let b = envoy_put_in_background(&joined, "34");
    joined.wait_stat(ENVOY_SHARED_WAITED, 1).unwrap();
    assert!(upstream.applied().is_empty(), "34 reached the store while 33 was in flight");
    upstream.release("33");
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!((a.status, b.status), (201, 201), "{} / {}", a.text(), b.text());
    assert_eq!(upstream.tokens(), ["33", "34"]);
}
