//! Conditional writes through Envoy (`fencekeeper envoy-config --conditional-writes`)
//! in front of a real store that honours preconditions: moto's S3 server (PyPI),
//! checking every SigV4 signature, written with boto3 through a real Envoy with the
//! filter and a real etcd. A relay between Envoy and moto holds the old holder's PUT,
//! then lets it reach the store late: after Envoy gave up on it (the route timeout),
//! after Envoy was SIGKILLed and restarted without a start grace, or while a second
//! Envoy on the same etcd admitted a newer write.
//!
//! Each story ends with the late write refused by moto itself (412) and the new
//! holder's object kept, and has a control without conditional writes where the same
//! schedule lets the late write land last. The tokens are made up: the order is the
//! story.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::late_writes::{
    assert_landed_late, assert_refused_late, given_up_writes_end_by_themselves, hold_old,
    lends_bar_the_resource_past_the_bound, object, release_and_answer, the_version_is_free_once_the_term_is_over, Held,
    ABA_APPLY_BOUND, ABA_TERM, BUCKET, FIRST, KEY, NEW, OLD,
};
use fencekeeper_harness::envoy::{generate, Envoy};
use fencekeeper_harness::gateway::RecordingUpstream;
use fencekeeper_harness::moto::Moto;
use fencekeeper_harness::relay::Relay;
use fencekeeper_harness::s3::{Boto, BotoRun};
use fencekeeper_harness::services::Etcd;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

const PRECONDITION_FAILED: &str = "wasmcustom.fencekeeper.conditional.precondition_failed";

/// moto with the bucket, a relay in front of it, and etcd.
fn store() -> (Moto, Relay, Etcd) {
    let moto = Moto::start().unwrap();
    moto.create_bucket(BUCKET).unwrap();
    let relay = Relay::start(moto.addr).unwrap();
    (moto, relay, Etcd::start().unwrap())
}

/// An Envoy with two workers in front of `upstream`, S3, marks in `etcd`; with or
/// without conditional writes (moto refuses an anonymous probe: vouched for).
fn envoy(upstream: SocketAddr, etcd: &Etcd, conditional: bool, more: &[&str]) -> Envoy {
    let (up, client) = (upstream.to_string(), etcd.client.to_string());
    let mut args = vec!["--upstream", &up, "--etcd", &client, "--protocol", "s3", "--provenance", "off"];
    if conditional {
        args.extend(["--conditional-writes", "--precondition-probe", "off"]);
    } else {
        // The stories without conditional writes are the controls that show the
        // window conditional writes close: the local gate (the opt-out), as the
        // shared gate would close it too.
        args.push("--local-gate");
    }
    args.extend(more);
    Envoy::start(2, &args).unwrap()
}

fn url(envoy: &Envoy) -> String {
    format!("http://{}", envoy.listen)
}

fn client(envoy: &Envoy, moto: &Moto, token: &str) -> Boto {
    Boto::new(&url(envoy), moto.access_key()).with_token_header(token)
}

fn put(envoy: &Envoy, moto: &Moto, token: &str, body: &[u8]) -> BotoRun {
    client(envoy, moto, token).put(BUCKET, KEY, body, None).unwrap()
}

/// The old holder's PUT through `envoy`, in the background (it is held), once the
/// relay has it.
fn old_put_held(envoy: &Envoy, moto: &Moto, held: &Held) -> JoinHandle<BotoRun> {
    let boto = client(envoy, moto, "33");
    let old = std::thread::spawn(move || boto.put(BUCKET, KEY, OLD, None).unwrap());
    held.wait_arrived();
    old
}

/// The slow write: 33 is forwarded and held; Envoy's route gives up on it; 34 lands;
/// then 33 reaches the store. Without conditional writes the gate's store apply bound
/// is 0 (what a bound too short for a real stall amounts to).
fn slow_write_story(conditional: bool) -> (String, Vec<u8>, String) {
    let (moto, relay, etcd) = store();
    let more = if conditional {
        vec!["--request-timeout", "1s"]
    } else {
        vec!["--request-timeout", "1s", "--store-apply-bound", "0s"]
    };
    let envoy = envoy(relay.addr, &etcd, conditional, &more);
    assert!(put(&envoy, &moto, "32", FIRST).ok, "{}", envoy.log());
    let held = hold_old(&relay);
    let old = old_put_held(&envoy, &moto, &held).join().unwrap();
    assert_eq!(old.status, Some(504), "Envoy's route gives up on the held write: {old:?}");
    let new = put(&envoy, &moto, "34", NEW);
    assert!(new.ok, "{new:?}\n{}", envoy.log());
    let late = release_and_answer(held);
    (late, object(&moto), envoy.log())
}

#[test]
fn a_write_envoy_gave_up_on_is_refused_by_the_store_when_it_arrives_late() {
    let (late, object, log) = slow_write_story(true);
    assert_refused_late(&late, &object, &log);
}

#[test]
fn without_conditional_writes_the_write_envoy_gave_up_on_lands_last() {
    let (late, object, _) = slow_write_story(false);
    assert_landed_late(&late, &object, "conditional writes close");
}

/// The crash: 33 is held at the relay when Envoy is SIGKILLed; it restarts (no start
/// grace), 34 lands, then 33 reaches the store.
fn crash_story(conditional: bool) -> (String, Vec<u8>, String) {
    let (moto, relay, etcd) = store();
    let mut envoy = envoy(relay.addr, &etcd, conditional, &[]);
    assert!(put(&envoy, &moto, "32", FIRST).ok, "{}", envoy.log());
    let held = hold_old(&relay);
    let old = old_put_held(&envoy, &moto, &held);
    envoy.restart().unwrap(); // SIGKILL, then the same configuration
    assert!(!old.join().unwrap().ok, "the old holder saw its write fail with Envoy");
    let new = put(&envoy, &moto, "34", NEW);
    assert!(new.ok, "{new:?}\n{}", envoy.log());
    if conditional {
        // The lent write outlived the crash: the chain may not come back to its version.
        let back = put(&envoy, &moto, "34", FIRST);
        assert_eq!((back.status, back.code.as_str()), (Some(409), "FencingVersionConflict"), "{back:?}");
        assert!(back.message.contains("write different bytes"), "{back:?}");
    }
    let late = release_and_answer(held);
    (late, object(&moto), envoy.log())
}

#[test]
fn a_write_in_flight_when_envoy_was_sigkilled_is_refused_by_the_store_after_the_restart() {
    let (late, object, log) = crash_story(true);
    assert_refused_late(&late, &object, &log);
}

#[test]
fn without_conditional_writes_a_write_in_flight_at_an_envoy_crash_lands_after_the_restart() {
    let (late, object, _) = crash_story(false);
    assert_landed_late(&late, &object, "a start grace would have to cover");
}

/// Two Envoys on one etcd, without a shared gate: 33 through the first is held; 34
/// goes through the second; then 33 reaches the store. Also the first Envoy's
/// counters: admitted, stale, precondition_failed, version_refused.
fn two_envoys_story(conditional: bool) -> (String, Vec<u8>, BotoRun, String, [u64; 4]) {
    let (moto, relay, etcd) = store();
    let first = envoy(relay.addr, &etcd, conditional, &[]);
    let second = envoy(moto.addr, &etcd, conditional, &[]);
    assert!(put(&first, &moto, "32", FIRST).ok, "{}", first.log());
    let held = hold_old(&relay);
    let old = old_put_held(&first, &moto, &held);
    let new = put(&second, &moto, "34", NEW);
    assert!(new.ok, "{new:?}\n{}", second.log());
    let late = release_and_answer(held);
    let old = old.join().unwrap();
    let counted = ["admitted", "stale", "conditional.precondition_failed", "conditional.version_refused"]
        .map(|name| first.stat(&format!("wasmcustom.fencekeeper.{name}")).unwrap());
    (late, object(&moto), old, first.log(), counted)
}

#[test]
fn two_envoys_without_a_shared_gate_cannot_land_a_late_write_with_conditional_writes() {
    let (late, object, old, log, counted) = two_envoys_story(true);
    assert_refused_late(&late, &object, &log);
    assert_eq!(
        (old.status, old.code.as_str()),
        (Some(409), "FencingTokenStale"),
        "the 412 is a stale refusal: {old:?}"
    );
    // Counted once, as what its client was told (stale), and once as the store's refusal.
    assert_eq!(counted, [1, 1, 1, 0], "admitted (32 only), stale, precondition_failed, version_refused");
}

#[test]
fn two_envoys_without_a_shared_gate_or_conditional_writes_land_the_late_write_last() {
    let (late, object, old, _, _) = two_envoys_story(false);
    assert!(late.contains(" 200 ") && old.ok, "{late:?} {old:?}");
    assert_eq!(object, OLD, "the control shows the window across Envoys");
}

#[test]
fn through_envoy_a_write_that_would_bring_back_a_late_writes_version_is_refused_for_its_term() {
    let (moto, relay, etcd) = store();
    let envoy = envoy(relay.addr, &etcd, true, &["--request-timeout", "1s", "--store-apply-bound", ABA_APPLY_BOUND]);
    assert!(put(&envoy, &moto, "32", FIRST).ok);
    let held = hold_old(&relay);
    assert_eq!(old_put_held(&envoy, &moto, &held).join().unwrap().status, Some(504));
    assert!(put(&envoy, &moto, "34", NEW).ok, "{}", envoy.log());
    // FIRST's MD5 is the version the held write is conditioned on.
    let back = put(&envoy, &moto, "34", FIRST);
    assert_eq!((back.status, back.code.as_str()), (Some(409), "FencingVersionConflict"), "{back:?}");
    assert!(put(&envoy, &moto, "34", NEW).ok, "the same bytes again is a retry, and goes");
    let late = release_and_answer(held);
    assert!(late.contains(" 412 "), "{late:?}\n{}", envoy.log());
    assert_eq!(object(&moto), NEW);
    // The held write's term (the route timeout plus the store apply bound) is over
    // 5 s after it was sent: FIRST goes by itself, as through the gateway.
    let again = || put(&envoy, &moto, "34", FIRST);
    the_version_is_free_once_the_term_is_over(again, ABA_TERM, || envoy.log());
    assert_eq!(object(&moto), FIRST);
}

#[test]
fn through_envoy_after_a_write_given_up_on_that_the_store_applied_one_write_is_refused_and_its_retry_goes() {
    // A write Envoy gave up on (its route timed out) that moto applied anyway: Envoy
    // never sees that answer, and moto refuses the fence's own anonymous HEAD (as a
    // SigV4 store does), so the filter cannot read the version. The next write's
    // If-Match on the version before fails (412, a 409 to the client). The one write
    // still lent on that version makes the object's bytes, so the fence takes their
    // version, and the client's retry goes with no read (before, every write was
    // refused until a client read the object through the fence).
    let (moto, relay, etcd) = store();
    let envoy = envoy(relay.addr, &etcd, true, &["--request-timeout", "1s"]);
    assert!(put(&envoy, &moto, "32", FIRST).ok, "{}", envoy.log());
    let held = hold_old(&relay);
    assert_eq!(old_put_held(&envoy, &moto, &held).join().unwrap().status, Some(504));
    let late = release_and_answer(held);
    assert!(late.contains(" 200 "), "moto applied the late write: {late:?}");
    assert_eq!(object(&moto), OLD);
    let refused = put(&envoy, &moto, "34", NEW);
    assert_eq!((refused.status, refused.code.as_str()), (Some(409), "FencingVersionConflict"), "{refused:?}");
    let retry = put(&envoy, &moto, "34", NEW);
    assert!(retry.ok, "the retry goes with no read: {retry:?}\n{}", envoy.log());
    assert_eq!(object(&moto), NEW);
}

#[test]
fn through_envoy_more_writes_given_up_on_than_the_bound_end_by_themselves() {
    let (moto, relay, etcd) = store();
    let envoy = envoy(relay.addr, &etcd, true, &["--request-timeout", "300ms", "--store-apply-bound", "700ms"]);
    given_up_writes_end_by_themselves(&relay, &moto, |token, body| put(&envoy, &moto, token, body), || envoy.log());
}

#[test]
fn through_envoy_an_object_written_outside_the_fence_is_learned_from_a_read() {
    let moto = Moto::start().unwrap();
    moto.create_bucket(BUCKET).unwrap();
    let etcd = Etcd::start().unwrap();
    assert!(moto.client().put(BUCKET, KEY, FIRST, None).unwrap().ok, "written straight to moto");
    let envoy = envoy(moto.addr, &etcd, true, &[]);
    let refused = put(&envoy, &moto, "34", NEW);
    assert_eq!((refused.status, refused.code.as_str()), (Some(409), "FencingVersionConflict"), "{refused:?}");
    assert!(refused.message.contains("(GET or HEAD)"), "the reason says what to do: {refused:?}");
    assert_eq!(envoy.stat(PRECONDITION_FAILED).unwrap(), 1, "If-None-Match: * met the object");
    assert_eq!(object(&moto), FIRST, "the object the fence did not know is kept");
    let read = client(&envoy, &moto, "34").get(BUCKET, KEY).unwrap();
    assert_eq!(read.map(|o| o.0), Some(FIRST.to_vec()));
    let new = put(&envoy, &moto, "34", NEW);
    assert!(new.ok, "{new:?}\n{}", envoy.log());
    assert_eq!(object(&moto), NEW);
    // And a delete goes conditionally too (vouched for with the probe off).
    let deleted = client(&envoy, &moto, "34").delete(BUCKET, KEY).unwrap();
    assert!(deleted.ok, "{deleted:?}");
    assert!(moto.get(BUCKET, KEY).unwrap().is_none());
}

#[test]
fn through_envoy_in_front_of_apache_mod_dav_the_filter_learns_each_version_with_a_head() {
    // Apache's mod_dav answers a PUT without an ETag, so after each write the filter
    // does not know the version it made. As the gateway does (e2e_conditional), it
    // asks Apache itself with a HEAD through the store's cluster, and refuses a write
    // only while the HEAD's ETag is weak (a second after a change): no client read.
    let apache = fencekeeper_harness::apache::ApacheDav::start().unwrap();
    let etcd = Etcd::start().unwrap();
    let (upstream, client) = (apache.url(), etcd.client.to_string());
    let args = [
        "--upstream",
        &upstream,
        "--etcd",
        &client,
        "--provenance",
        "off",
        "--conditional-writes",
        "--precondition-probe",
        "/fencekeeper-probe",
    ];
    let envoy = Envoy::start(2, &args).unwrap();
    let first = envoy.put("/doc.txt", "34", b"one").unwrap();
    assert!((200..300).contains(&first.status), "{}\n{}", first.text(), envoy.log());
    // Each next write is refused (409, nothing reaching Apache) only while Apache's
    // ETag for the last one is weak, then goes, learned by the filter's own HEAD.
    let mut previous: &[u8] = b"one";
    for body in [&b"two"[..], b"three"] {
        let started = std::time::Instant::now();
        loop {
            let reply = envoy.put("/doc.txt", "34", body).unwrap();
            if (200..300).contains(&reply.status) {
                break;
            }
            assert_eq!(reply.status, 409, "{}", reply.text());
            assert!(reply.text().contains("not known"), "{}", reply.text());
            assert_eq!(apache.read("/doc.txt").as_deref(), Some(previous), "a refused write never reached Apache");
            assert!(started.elapsed() < Duration::from_secs(10), "no version was learned\n{}", envoy.log());
            std::thread::sleep(Duration::from_millis(200)); // polling Apache's one-second weak window
        }
        assert_eq!(apache.read("/doc.txt").as_deref(), Some(body));
        previous = body;
    }
}

#[test]
fn through_envoy_a_body_is_held_whole_up_to_the_limit_and_a_larger_one_never_reaches_the_store() {
    let moto = Moto::start().unwrap();
    moto.create_bucket(BUCKET).unwrap();
    let etcd = Etcd::start().unwrap();
    let envoy = envoy(moto.addr, &etcd, true, &["--conditional-max-body", "3145728"]);
    // Above Envoy's default buffer (1 MiB), within the limit: held whole, then sent.
    let big: Vec<u8> = (0..2 << 20).map(|i: u32| (i % 251) as u8).collect();
    let run = put(&envoy, &moto, "34", &big);
    assert!(run.ok, "{run:?}\n{}", envoy.log());
    assert_eq!(object(&moto), big);
    // Over the limit (a small one, so that the whole request fits the sockets' buffers
    // and the client reads the answer): refused by its length, before any admit.
    let small = self::envoy(moto.addr, &etcd, true, &["--conditional-max-body", "65536"]);
    let over = vec![b'x'; 80 << 10];
    let refused = put(&small, &moto, "34", &over);
    assert_eq!((refused.status, refused.code.as_str()), (Some(413), "EntityTooLarge"), "{refused:?}");
    assert!(refused.message.contains("conditional_max_body"), "{refused:?}");
    assert_eq!(object(&moto), big, "none of the larger write reached the store");
    // Nothing was lent for it: the next write goes on the version the first made.
    assert!(put(&envoy, &moto, "34", NEW).ok, "{}", envoy.log());
    assert_eq!(object(&moto), NEW);
}

#[test]
fn through_envoy_writes_that_cannot_be_conditional_are_refused_before_they_are_admitted() {
    let moto = Moto::start().unwrap();
    moto.create_bucket(BUCKET).unwrap();
    let etcd = Etcd::start().unwrap();
    let envoy = envoy(moto.addr, &etcd, true, &[]);
    let s3 = client(&envoy, &moto, "34");
    let copy = s3.copy(BUCKET, KEY, "copy.csv", None).unwrap();
    assert_eq!(copy.status, Some(501), "{copy:?}");
    let multipart = s3.multipart(BUCKET, "big.bin", &[vec![7u8; 16]], None).unwrap();
    assert_eq!(multipart.status, Some(501), "{multipart:?}");
    assert_eq!(envoy.stat("wasmcustom.fencekeeper.conditional.not_conditional").unwrap(), 2);
    assert_eq!(envoy.stat("wasmcustom.fencekeeper.admitted").unwrap(), 0, "nothing was admitted");
}

#[test]
fn past_the_bound_of_writes_given_up_on_envoy_refuses_the_resource_503_as_the_gateway_does() {
    let upstream = RecordingUpstream::start().unwrap();
    let etcd = Etcd::start().unwrap();
    let (up, client) = (upstream.addr.to_string(), etcd.client.to_string());
    let args = ["--upstream", &up, "--etcd", &client, "--provenance", "off", "--request-timeout", "200ms"];
    let envoy =
        Envoy::start(2, &[&args[..], &["--conditional-writes", "--precondition-probe", "off"]].concat()).unwrap();
    let put = |token: &str, body: &[u8]| {
        let reply = envoy.put("/r", token, body).unwrap();
        (reply.status, reply.text())
    };
    lends_bar_the_resource_past_the_bound(&upstream, put, || envoy.log());
}

#[test]
fn envoy_config_refuses_conditional_writes_in_front_of_a_store_that_ignores_if_match() {
    let upstream = RecordingUpstream::start().unwrap();
    let up = upstream.addr.to_string();
    let args = ["--upstream", &up, "--conditional-writes", "--precondition-probe", "/probe"];
    let e = generate(10000, 9901, &args).unwrap_err().to_string();
    assert!(e.contains("If-Match"), "{e}");
    let without_probe = generate(10000, 9901, &["--upstream", &up, "--conditional-writes"]).unwrap_err();
    assert!(without_probe.to_string().contains("--precondition-probe"), "{without_probe}");
}
