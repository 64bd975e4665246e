// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

//! What the conditional-writes stories share, through the gateway
//! (`e2e_conditional`) and through Envoy (`e2e_envoy_conditional`): moto's bucket and
//! object, the three holders' bodies, a relay that holds the old holder's write
//! until a story lets it reach the store late, and the bound on writes left lent.

use fencekeeper_chain::MAX_LENDS;
use fencekeeper_harness::gateway::RecordingUpstream;
use fencekeeper_harness::moto::Moto;
use fencekeeper_harness::relay::{Relay, Trap};
use fencekeeper_harness::s3::BotoRun;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

pub const BUCKET: &str = "ledger";
pub const KEY: &str = "q3.csv";
pub const FIRST: &[u8] = b"q3,first version (token 32)\n";
pub const NEW: &[u8] = b"q3,written by the new holder (token 34)\n";
pub const OLD: &[u8] = b"q3,written by the OLD HOLDER, who paused (token 33)\n";
/// What the relay looks for to hold the old holder's write.
const OLD_MARK: &[u8] = b"OLD HOLDER";

/// The old holder's write, held by the relay.
pub struct Held {
    trap: Trap,
    arrived: Receiver<()>,
    release: Sender<()>,
}

impl Held {
    /// Wait until the write has reached the relay (and is held there).
    pub fn wait_arrived(&self) {
        self.arrived.recv_timeout(Duration::from_secs(30)).expect("the old holder's write never reached the relay");
    }
}

/// Hold the next request through `relay` that carries the old holder's body until
/// [`release_and_answer`].
pub fn hold_old(relay: &Relay) -> Held {
    hold(relay, OLD_MARK)
}

/// Hold the next request through `relay` that carries `mark` until
/// [`release_and_answer`].
pub fn hold(relay: &Relay, mark: &[u8]) -> Held {
    let (release, held) = mpsc::channel::<()>();
    let (arrive, arrived) = mpsc::channel::<()>();
    let trap = relay.trap(mark, move || {
        let _ = arrive.send(());
        let _ = held.recv_timeout(Duration::from_secs(120));
        Ok(())
    });
    Held { trap, arrived, release }
}

/// Let the held write go on to moto, and return moto's status line for it.
pub fn release_and_answer(held: Held) -> String {
    held.release.send(()).unwrap();
    held.trap.wait_fired(Duration::from_secs(30)).unwrap();
    let answer = held.trap.wait_answered(Duration::from_secs(30)).unwrap();
    // The final status line (moto answers a forwarded `Expect: 100-continue` first).
    let text = String::from_utf8_lossy(&answer).into_owned();
    let last = text.lines().find(|l| l.starts_with("HTTP/1.1 ") && !l.starts_with("HTTP/1.1 100"));
    last.unwrap_or_default().to_owned()
}

/// The object's bytes in moto.
pub fn object(moto: &Moto) -> Vec<u8> {
    moto.get(BUCKET, KEY).unwrap().unwrap().0
}

/// How a story ends with conditional writes: moto refused the late write's
/// precondition (412), and the new holder's object is kept. `log` is the host's.
pub fn assert_refused_late(late: &str, object: &[u8], log: &str) {
    assert!(late.contains(" 412 "), "moto did not refuse the late write's precondition: {late:?}\n{log}");
    assert_eq!(object, NEW, "the new holder's object was overwritten\n{log}");
}

/// How a control ends: the late write applied (200) and its bytes are the object's.
pub fn assert_landed_late(late: &str, object: &[u8], window: &str) {
    assert!(late.contains(" 200 "), "{late:?}");
    assert_eq!(object, OLD, "the control shows the window {window}");
}

/// Give up on [`MAX_LENDS`] writes to `/r` with token 34, which `upstream` holds,
/// through `put` (token, body → status, body), each answered 504 and left lent; then
/// a write with the higher token 35 is refused 503 with a reason that says how to
/// release them, and reaches no store.
pub fn lends_bar_the_resource_past_the_bound(
    upstream: &RecordingUpstream,
    put: impl Fn(&str, &[u8]) -> (u16, String),
    log: impl Fn() -> String,
) {
    upstream.hold("34");
    for n in 0..MAX_LENDS {
        let (status, body) = put("34", format!("given up on {n}").as_bytes());
        assert_eq!(status, 504, "write {n}: {body}\n{}", log());
    }
    let (status, body) = put("35", b"past the bound");
    assert_eq!(status, 503, "{body}\n{}", log());
    let says = format!("{MAX_LENDS} writes given up on");
    assert!(body.contains(&says) && body.contains("--release-lends"), "says what to do: {body}");
    assert!(upstream.applied().is_empty(), "the refused write reached the store");
    upstream.release("34");
}

/// More writes given up on than [`MAX_LENDS`], one after another, each held by
/// `relay` on its way to moto: each stays lent for its term (`put`'s host was started
/// with a term of about a second), so none is refused for too many lent, and a
/// normal write then goes at once. Released at last, every held write is refused by
/// moto (412), and the normal write's object is kept. `put` is (token, body).
pub fn given_up_writes_end_by_themselves(
    relay: &Relay,
    moto: &Moto,
    put: impl Fn(&str, &[u8]) -> BotoRun,
    log: impl Fn() -> String,
) {
    assert!(put("32", FIRST).ok, "{}", log());
    let mut held = Vec::new();
    for n in 0..MAX_LENDS + 8 {
        let body = format!("given up on, number {n:02} (token 34)\n");
        let trap = hold(relay, body.as_bytes());
        let run = put("34", body.as_bytes());
        assert_eq!(run.status, Some(504), "write {n} is given up on: {run:?}\n{}", log());
        trap.wait_arrived();
        held.push(trap);
    }
    let normal = put("35", NEW);
    assert!(normal.ok, "after {} writes given up on: {normal:?}\n{}", MAX_LENDS + 8, log());
    for trap in held {
        let late = release_and_answer(trap);
        assert!(late.contains(" 412 "), "a late write was not refused: {late:?}\n{}", log());
    }
    assert_eq!(object(moto), NEW);
}

/// The store apply bound of the stories that write a late write's version again: with
/// the 1 s request timeout, a held write's term is 5 s from when it was sent. Three
/// boto3 clients run inside it (about 0.7 s each to start, more on a loaded machine);
/// a 2 s term ran out under them and let the A-B-A write through before it was tried.
pub const ABA_APPLY_BOUND: &str = "4s";
/// The term that [`ABA_APPLY_BOUND`] makes.
pub const ABA_TERM: Duration = Duration::from_secs(5);

/// After [`hold_old`]'s write was given up on and refused late, the version it was
/// conditioned on (FIRST's) is barred only for its term: writing FIRST again (`put`,
/// a new holder's) is refused while the term lasts, then goes by itself, with no
/// operator, within `term` and a margin.
pub fn the_version_is_free_once_the_term_is_over(put: impl Fn() -> BotoRun, term: Duration, log: impl Fn() -> String) {
    let started = Instant::now();
    let mut refused = 0;
    loop {
        let back = put();
        if back.ok {
            break;
        }
        assert_eq!((back.status, back.code.as_str()), (Some(409), "FencingVersionConflict"), "{back:?}");
        refused += 1;
        let waited = started.elapsed();
        assert!(waited < term + Duration::from_secs(10), "still refused {waited:?} after the term\n{}", log());
        // Polling the chain's term, which nothing announces.
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("refused {refused} times, then written after {:?}", started.elapsed());
}
