//! Conditional writes (`fencekeeper serve --conditional-writes`) in front of a real
//! store that honours preconditions: moto's S3 server (PyPI), checking every SigV4
//! signature, written with boto3. A relay between the gateway and moto holds the old
//! holder's PUT for as long as a test wants, then lets it reach the store late: after
//! the gateway gave up on it, after the gateway was SIGKILLed and restarted without
//! a start grace, or while another gateway on the same etcd admitted a newer write.
//!
//! Each story ends with the late write refused by moto itself (412) and the new
//! holder's object kept, and has a control without `--conditional-writes` where the
//! same schedule lets the late write land last. The tokens are made up: the order is
//! the story.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::late_writes::{
    assert_landed_late, assert_refused_late, given_up_writes_end_by_themselves, hold_old,
    lends_bar_the_resource_past_the_bound, object, release_and_answer, the_version_is_free_once_the_term_is_over,
    ABA_APPLY_BOUND, ABA_TERM, BUCKET, FIRST, KEY, NEW, OLD,
};
use fencekeeper_harness::gateway::{start_up_error, start_up_error_in_front_of, Gateway, RecordingUpstream};
use fencekeeper_harness::moto::Moto;
use fencekeeper_harness::relay::Relay;
use fencekeeper_harness::s3::{Boto, BotoRun};
use fencekeeper_harness::services::{poll_until, Etcd};
use std::thread::JoinHandle;
use std::time::Duration;

/// moto with the bucket, and a relay in front of it.
fn store() -> (Moto, Relay) {
    let moto = Moto::start().unwrap();
    moto.create_bucket(BUCKET).unwrap();
    let relay = Relay::start(moto.addr).unwrap();
    (moto, relay)
}

/// The gateway arguments of every story: S3, no credentials to probe with.
fn s3_args<'a>(conditional: bool, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--protocol", "s3", "--provenance", "off"];
    if conditional {
        args.extend(["--conditional-writes", "--precondition-probe", "off"]);
    }
    args.extend(more);
    args
}

fn client(fence: &str, moto: &Moto, token: &str) -> Boto {
    Boto::new(fence, moto.access_key()).with_token_header(token)
}

fn put(fence: &str, moto: &Moto, token: &str, body: &[u8]) -> BotoRun {
    client(fence, moto, token).put(BUCKET, KEY, body, None).unwrap()
}

/// The old holder's PUT through `fence`, in the background (it is held).
fn old_put_in_background(fence: &str, moto: &Moto) -> JoinHandle<BotoRun> {
    let boto = client(fence, moto, "33");
    std::thread::spawn(move || boto.put(BUCKET, KEY, OLD, None).unwrap())
}

/// The slow write: 33 is forwarded and held; the gateway gives up on it; 34 lands; then
/// 33 reaches the store. Returns moto's answer to the late 33 and the object.
fn slow_write_story(conditional: bool) -> (String, Vec<u8>, String) {
    let (moto, relay) = store();
    let args = s3_args(conditional, &["--request-timeout", "1s", "--store-apply-bound", "0s"]);
    let gateway = Gateway::start(&relay.url(), &args).unwrap();
    let fence = gateway.url();
    assert!(put(&fence, &moto, "32", FIRST).ok, "{}", gateway.log());
    let held = hold_old(&relay);
    let old = old_put_in_background(&fence, &moto);
    held.wait_arrived();
    let old = old.join().unwrap();
    assert_eq!(old.status, Some(504), "the gateway gives up on the held write: {old:?}");
    let new = put(&fence, &moto, "34", NEW);
    assert!(new.ok, "{new:?}\n{}", gateway.log());
    let late = release_and_answer(held);
    (late, object(&moto), gateway.log())
}

#[test]
fn a_write_the_gateway_gave_up_on_is_refused_by_the_store_when_it_arrives_late() {
    let (late, object, log) = slow_write_story(true);
    assert_refused_late(&late, &object, &log);
}

#[test]
fn without_conditional_writes_and_no_apply_bound_the_late_write_lands_last() {
    let (late, object, _) = slow_write_story(false);
    assert!(late.contains(" 200 "), "{late:?}");
    assert_eq!(object, OLD, "the control shows the window");
}

/// 33 held in flight through a gateway on a file store; the gateway is SIGKILLed and
/// started again on the same store without a start grace; 34 writes; 33 arrives.
fn crash_story(conditional: bool) -> (String, Vec<u8>, String) {
    let (moto, relay) = store();
    let args = s3_args(conditional, &[]);
    let mut gateway = Gateway::start(&relay.url(), &args).unwrap();
    assert!(put(&gateway.url(), &moto, "32", FIRST).ok, "{}", gateway.log());
    let held = hold_old(&relay);
    let old = old_put_in_background(&gateway.url(), &moto);
    held.wait_arrived();
    gateway.restart().unwrap(); // SIGKILL, then the same arguments and mark store
    let old = old.join().unwrap();
    assert!(!old.ok, "the old holder saw its write fail with the gateway: {old:?}");
    let new = put(&gateway.url(), &moto, "34", NEW);
    assert!(new.ok, "{new:?}\n{}", gateway.log());
    if conditional {
        // The lent write outlived the crash: the chain may not come back to its version.
        let back = put(&gateway.url(), &moto, "34", FIRST);
        assert_eq!((back.status, back.code.as_str()), (Some(409), "FencingVersionConflict"), "{back:?}");
    }
    let late = release_and_answer(held);
    (late, object(&moto), gateway.log())
}

#[test]
fn a_write_in_flight_when_the_gateway_was_sigkilled_is_refused_by_the_store_after_the_restart() {
    let (late, object, log) = crash_story(true);
    assert_refused_late(&late, &object, &log);
}

#[test]
fn without_conditional_writes_a_write_in_flight_at_a_crash_lands_after_the_restart() {
    let (late, object, _) = crash_story(false);
    assert_landed_late(&late, &object, "a start grace would have to cover");
}

/// Two gateways on one etcd, without a shared gate: 33 through the first is held;
/// 34 goes through the second; then 33 reaches the store. Also the first gateway's
/// counters: admitted, stale, precondition_failed, version_refused.
fn two_gateways_story(conditional: bool) -> (String, Vec<u8>, BotoRun, String, [u64; 4]) {
    let (moto, relay) = store();
    let etcd = Etcd::start().unwrap();
    let etcd_url = etcd.client.to_string();
    // Conditional writes replace the gate; without them, the local gate (the
    // opt-out) is the control: no shared registry either way.
    let gate: &[&str] = if conditional { &[] } else { &["--local-gate"] };
    let args = s3_args(conditional, &[&["--etcd", etcd_url.as_str()], gate].concat());
    let first = Gateway::start(&relay.url(), &args).unwrap();
    let second = Gateway::start(&moto.url(), &args).unwrap();
    assert!(put(&first.url(), &moto, "32", FIRST).ok, "{}", first.log());
    let held = hold_old(&relay);
    let old = old_put_in_background(&first.url(), &moto);
    held.wait_arrived();
    let new = put(&second.url(), &moto, "34", NEW);
    assert!(new.ok, "{new:?}\n{}", second.log());
    let late = release_and_answer(held);
    let old = old.join().unwrap();
    let counted = [
        "fencekeeper_gateway_requests_total{class=\"admitted\"}",
        "fencekeeper_gateway_requests_total{class=\"stale\"}",
        "fencekeeper_gateway_precondition_failed_total",
        "fencekeeper_gateway_version_refused_total",
    ]
    .map(|name| first.metric(name).unwrap());
    (late, object(&moto), old, first.log(), counted)
}

#[test]
fn two_gateways_without_a_shared_gate_cannot_land_a_late_write_with_conditional_writes() {
    let (late, object, old, log, counted) = two_gateways_story(true);
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
fn two_gateways_without_a_shared_gate_or_conditional_writes_land_the_late_write_last() {
    let (late, object, old, _, _) = two_gateways_story(false);
    assert!(late.contains(" 200 ") && old.ok, "{late:?} {old:?}");
    assert_eq!(object, OLD, "the control shows the window across gateways");
}

#[test]
fn a_write_that_would_bring_back_a_version_a_late_write_carries_is_refused_for_its_term() {
    // S3's ETag is the body's MD5: A, B, A is a chain that comes back. 33's write
    // conditioned on A is given up on; 34 writes B, then A again, which would let 33's
    // land. The fence refuses that A, and the late 33 fails at the store. Once 33's
    // term is over (the request timeout plus the store apply bound, 5 s), A goes.
    let (moto, relay) = store();
    let args = s3_args(true, &["--request-timeout", "1s", "--store-apply-bound", ABA_APPLY_BOUND]);
    let gateway = Gateway::start(&relay.url(), &args).unwrap();
    let fence = gateway.url();
    assert!(put(&fence, &moto, "32", FIRST).ok);
    let held = hold_old(&relay);
    let old = old_put_in_background(&fence, &moto);
    held.wait_arrived();
    assert_eq!(old.join().unwrap().status, Some(504));
    assert!(put(&fence, &moto, "34", NEW).ok, "{}", gateway.log());
    let back = put(&fence, &moto, "34", FIRST);
    assert_eq!((back.status, back.code.as_str()), (Some(409), "FencingVersionConflict"), "{back:?}");
    assert!(back.message.contains("write different bytes"), "{back:?}");
    assert!(put(&fence, &moto, "34", NEW).ok, "the same bytes again is a retry, and goes");
    let late = release_and_answer(held);
    assert!(late.contains(" 412 "), "{late:?}\n{}", gateway.log());
    assert_eq!(object(&moto), NEW);
    let again = || put(&fence, &moto, "34", FIRST);
    the_version_is_free_once_the_term_is_over(again, ABA_TERM, || gateway.log());
    assert_eq!(object(&moto), FIRST);
}

/// 32 writes FIRST; 33's write of OLD is held by the relay and given up on (504);
/// `between` runs; then the held write reaches moto, whose answer (its status line)
/// the gateway, still waiting for it, settles the lend with.
fn given_up_then_answered_late(between: impl FnOnce(&str, &Moto)) -> (Gateway, Moto, String) {
    let (moto, relay) = store();
    let gateway = Gateway::start(&relay.url(), &s3_args(true, &["--request-timeout", "1s"])).unwrap();
    let fence = gateway.url();
    assert!(put(&fence, &moto, "32", FIRST).ok, "{}", gateway.log());
    let held = hold_old(&relay);
    let old = old_put_in_background(&fence, &moto);
    held.wait_arrived();
    assert_eq!(old.join().unwrap().status, Some(504));
    between(&fence, &moto);
    let late = release_and_answer(held);
    let settled = "a conditional write given up on was answered late; settled";
    poll_until("the late answer's settle", Duration::from_secs(10), || gateway.log().contains(settled)).unwrap();
    (gateway, moto, late)
}

#[test]
fn a_write_given_up_on_that_the_store_applies_late_tells_the_gateway_the_version() {
    // moto applies 33's late write (nothing moved the object meanwhile): the version
    // is OLD's, which the gateway learns from the late answer itself. moto refuses the
    // gateway's own unsigned HEAD, so without it 34's first write would go on FIRST's
    // version and be refused (409) until the client read the object.
    let (gateway, moto, late) = given_up_then_answered_late(|_, _| {});
    assert!(late.contains(" 200 "), "{late:?}");
    let new = put(&gateway.url(), &moto, "34", NEW);
    assert!(new.ok, "the next holder's first write goes: {new:?}\n{}", gateway.log());
    assert_eq!(object(&moto), NEW);
}

#[test]
fn a_write_given_up_on_that_the_store_refuses_late_ends_its_lend_at_once() {
    // 34 writes NEW meanwhile, so moto refuses 33's late write (412): its lend ends
    // then, not at its term (91 s away), and FIRST's bytes may be written again.
    let (gateway, moto, late) = given_up_then_answered_late(|fence, moto| {
        assert!(put(fence, moto, "34", NEW).ok);
        let back = put(fence, moto, "34", FIRST);
        assert_eq!((back.status, back.code.as_str()), (Some(409), "FencingVersionConflict"), "{back:?}");
    });
    assert!(late.contains(" 412 "), "{late:?}");
    let again = put(&gateway.url(), &moto, "34", FIRST);
    assert!(again.ok, "FIRST goes once the late write was refused: {again:?}\n{}", gateway.log());
    assert_eq!(object(&moto), FIRST);
}

#[test]
fn more_writes_given_up_on_than_the_bound_end_by_themselves_and_the_next_write_goes() {
    let (moto, relay) = store();
    let args = s3_args(true, &["--request-timeout", "300ms", "--store-apply-bound", "700ms"]);
    let gateway = Gateway::start(&relay.url(), &args).unwrap();
    let fence = gateway.url();
    given_up_writes_end_by_themselves(&relay, &moto, |token, body| put(&fence, &moto, token, body), || gateway.log());
}

#[test]
fn control_moto_lets_a_stale_if_match_through_once_the_chain_comes_back() {
    // Why the fence must refuse A after A, B: straight to moto, a client's conditional
    // write on the first A lands after the object went A, B, A.
    let moto = Moto::start().unwrap();
    moto.create_bucket(BUCKET).unwrap();
    let s3 = moto.client();
    let a = s3.put(BUCKET, KEY, FIRST, None).unwrap().etag.expect("moto answers a PUT with its ETag");
    assert!(s3.put(BUCKET, KEY, NEW, None).unwrap().ok);
    assert_eq!(s3.put(BUCKET, KEY, FIRST, None).unwrap().etag, Some(a.clone()), "the same bytes, the same ETag");
    let late = s3.put_if_match(BUCKET, KEY, OLD, &a).unwrap();
    assert!(late.ok, "the stale precondition matched again: {late:?}");
    let refused = s3.put_if_match(BUCKET, KEY, NEW, &a).unwrap();
    assert_eq!(refused.status, Some(412), "moto does check If-Match: {refused:?}");
    assert_eq!(object(&moto), OLD);
}

#[test]
fn an_object_written_outside_the_fence_is_learned_from_a_read_then_written() {
    let moto = Moto::start().unwrap();
    moto.create_bucket(BUCKET).unwrap();
    assert!(moto.client().put(BUCKET, KEY, FIRST, None).unwrap().ok, "written straight to moto");
    let gateway = Gateway::start(&moto.url(), &s3_args(true, &[])).unwrap();
    let refused = put(&gateway.url(), &moto, "34", NEW);
    assert_eq!((refused.status, refused.code.as_str()), (Some(409), "FencingVersionConflict"), "{refused:?}");
    assert!(refused.message.contains("(GET or HEAD)"), "the reason says what to do: {refused:?}");
    assert_eq!(object(&moto), FIRST, "If-None-Match: * kept the object the fence did not know");
    let read = client(&gateway.url(), &moto, "34").get(BUCKET, KEY).unwrap();
    assert_eq!(read.map(|o| o.0), Some(FIRST.to_vec()));
    assert!(put(&gateway.url(), &moto, "34", NEW).ok, "{}", gateway.log());
    assert_eq!(object(&moto), NEW);
    assert!(gateway.log().contains("learned the store's version from a read"), "{}", gateway.log());
}

#[test]
fn writes_that_cannot_be_conditional_are_refused_before_they_are_admitted() {
    let moto = Moto::start().unwrap();
    moto.create_bucket(BUCKET).unwrap();
    let gateway = Gateway::start(&moto.url(), &s3_args(true, &[])).unwrap();
    let s3 = client(&gateway.url(), &moto, "34");
    let copy = s3.copy(BUCKET, KEY, "copy.csv", None).unwrap();
    assert_eq!(copy.status, Some(501), "{copy:?}");
    let multipart = s3.multipart(BUCKET, "big.bin", &[vec![7u8; 16]], None).unwrap();
    assert_eq!(multipart.status, Some(501), "{multipart:?}");
    assert_eq!(gateway.mark(&format!("/{BUCKET}/copy.csv")).unwrap(), None, "nothing was admitted");
}

#[test]
fn a_store_that_ignores_if_match_is_refused_at_start_up() {
    let upstream = RecordingUpstream::start().unwrap();
    let args = ["--conditional-writes", "--precondition-probe", "/probe"];
    let (code, last, all) = start_up_error_in_front_of(&upstream.url(), &args).unwrap();
    assert_eq!(code, Some(2), "{all}");
    assert!(last.contains("ignores If-Match"), "{all}");
}

#[test]
fn conditional_writes_without_a_probe_or_in_efficiency_mode_do_not_start() {
    let (code, _, all) = start_up_error(&["--conditional-writes"]).unwrap();
    assert_eq!(code, Some(2), "{all}");
    assert!(all.contains("--precondition-probe"), "{all}");
    let args = ["--conditional-writes", "--precondition-probe", "off", "--mode", "efficiency"];
    let (code, last, all) = start_up_error(&args).unwrap();
    assert_eq!(code, Some(2), "{all}");
    assert!(last.contains("--mode correctness"), "{all}");
}

#[test]
fn a_store_that_answers_without_an_etag_stops_the_next_write_with_a_reason() {
    // The recording upstream honours nothing and sends no ETag: vouched for with the
    // probe off, its first answer leaves the version unknown, and the gateway says so
    // instead of writing on unconditionally.
    let upstream = RecordingUpstream::start().unwrap();
    let gateway = Gateway::start(&upstream.url(), &["--conditional-writes", "--precondition-probe", "off"]).unwrap();
    let first = gateway.put("/r", Some("34"), b"one").unwrap();
    assert!((200..300).contains(&first.status), "{first:?}");
    let second = gateway.put("/r", Some("34"), b"two").unwrap();
    assert_eq!(second.status, 409, "{second:?}");
    assert!(second.body.contains("not known"), "{second:?}");
    // What reached the store: the first write, and the gateway's HEAD asking for the
    // version (no token, no body); never the second write.
    let bodies: Vec<Vec<u8>> = upstream.applied().into_iter().map(|a| a.body).collect();
    assert_eq!(bodies, vec![b"one".to_vec(), Vec::new()], "the second write never reached the store");
    assert!(gateway.log().contains("without telling its version"), "{}", gateway.log());
}

#[test]
fn past_the_bound_of_writes_given_up_on_the_gateway_refuses_the_resource_503() {
    let upstream = RecordingUpstream::start().unwrap();
    let args = ["--conditional-writes", "--precondition-probe", "off", "--request-timeout", "200ms"];
    let gateway = Gateway::start(&upstream.url(), &args).unwrap();
    let put = |token: &str, body: &[u8]| {
        let reply = gateway.put("/r", Some(token), body).unwrap();
        (reply.status, reply.body)
    };
    lends_bar_the_resource_past_the_bound(&upstream, put, || gateway.log());
}

#[test]
fn a_write_given_up_on_stays_lent_across_a_kill_for_its_term_or_until_an_operator_releases_it() {
    let upstream = RecordingUpstream::start().unwrap();
    let args = ["--conditional-writes", "--precondition-probe", "off", "--request-timeout", "300ms"];
    let mut gateway = Gateway::start(&upstream.url(), &args).unwrap();
    upstream.hold("34");
    assert_eq!(gateway.put("/r", Some("34"), b"held").unwrap().status, 504);
    gateway.kill(); // the file store is one process's at a time
    let marks = |more: &[&str]| {
        let out = std::process::Command::new(fencekeeper_harness::workspace_bin("fencekeeper").unwrap())
            .args(["marks", "--store", &gateway.store.display().to_string()])
            .args(more)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, shown) = marks(&["--chain", "/r"]);
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("version absent")
            && shown.contains("lent    1")
            && shown.contains("token 34 on absent (ends in "),
        "{shown}"
    );
    let (code, refused) = marks(&["--release-lends", "/r"]);
    assert_eq!(code, Some(2), "{refused}");
    assert!(refused.contains("--force"), "{refused}");
    let (code, released) = marks(&["--release-lends", "/r", "--force"]);
    assert_eq!(code, Some(0), "{released}");
    assert!(released.contains("released 1 lent writes") && released.contains("lent    0"), "{released}");
    assert!(released.contains("version unknown"), "the released write may have changed it: {released}");
    upstream.release("34");
}

#[test]
fn in_front_of_apache_mod_dav_writes_wait_for_a_strong_etag_and_never_go_unconditionally() {
    // Apache httpd's mod_dav honours If-Match on PUT but answers a PUT without an
    // ETag, and for a second after a change gives a weak one, which never matches.
    // The gateway starts (its probe's stale If-Match is refused), learns each version
    // with a HEAD, and refuses a write until the HEAD gives a strong ETag.
    let apache = fencekeeper_harness::apache::ApacheDav::start().unwrap();
    let args = ["--conditional-writes", "--precondition-probe", "/fencekeeper-probe"];
    let gateway = Gateway::start(&apache.url(), &args).unwrap();
    let first = gateway.put("/doc.txt", Some("34"), b"one").unwrap();
    assert!((200..300).contains(&first.status), "{first:?}\n{}", gateway.log());
    let started = std::time::Instant::now();
    let mut refused = 0;
    loop {
        let second = gateway.put("/doc.txt", Some("34"), b"two").unwrap();
        if (200..300).contains(&second.status) {
            break;
        }
        assert_eq!(second.status, 409, "{second:?}");
        assert!(second.body.contains("not known"), "{second:?}");
        assert_eq!(apache.read("/doc.txt"), Some(b"one".to_vec()), "a refused write never reached Apache");
        refused += 1;
        assert!(started.elapsed() < Duration::from_secs(10), "Apache's ETag never became strong\n{}", gateway.log());
        std::thread::sleep(Duration::from_millis(200)); // polling Apache's one-second weak window
    }
    assert_eq!(apache.read("/doc.txt"), Some(b"two".to_vec()));
    eprintln!("refused {refused} times while Apache's ETag was weak");
    let log = gateway.log();
    assert!(log.contains("without telling its version") && log.contains("learned the store's version"), "{log}");
}
