//! ZooKeeper provenance against a real ZooKeeper (the harness's one-member ensemble),
//! with tokens from the real `fencekeeper lock --zookeeper` (the lock node's czxid as
//! `epoch.counter`), through the real gateway (`fencekeeper serve --lock-zookeeper
//! ... --provenance strong --lock-prefix /locks`, marks in a file):
//!
//! * a forged maximum token is refused 403, and so is a well-formed czxid nobody holds;
//! * the holder's token is admitted and advances the mark, whichever client holds
//!   (`fencekeeper lock --zookeeper`, or kazoo's `Lock` in `tests/clients/kazoo_lock.py`);
//! * once the holder has released and the next one holds, the first holder's token no
//!   longer advances a mark (but, equal to the mark, it still writes: not checked);
//! * a contender that has queued a node but does not hold is refused: the rule is
//!   "the holder's czxid", not "some child's czxid";
//! * a restarted ZooKeeper closes the gateway's session: the next check opens another;
//! * ZooKeeper stopped: an advance gets 503 with one line, the mark stays, and a token
//!   equal to the mark still writes.
//!
//! One ZooKeeper serves the whole file (a JVM takes seconds to start), so the stories
//! run in one test, one after the other.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::provenance::ZooKeeperProvenance;
use fencekeeper::zookeeper::jute::{Jute, Reader};
use fencekeeper::zookeeper::lock_node::token_text;
use fencekeeper::zookeeper::session::op;
use fencekeeper::zookeeper::Session;
use fencekeeper::{Origin, Provenance};
use fencekeeper_core::token;
use fencekeeper_harness::gateway::{start_up_error, Gateway, RecordingUpstream};
use fencekeeper_harness::holder::{fencekeeper_lock, Holder, ACQUIRE_WITHIN};
use fencekeeper_harness::repo_root;
use fencekeeper_harness::services::ZooKeeper;
use std::process::Command;
use std::time::Duration;

const FORGED: &str = "4294967295.4294967295";

/// `fencekeeper lock --zookeeper ZK --ttl 2 /locks<resource>` running a command that
/// says `holding TOKEN pid PID` and waits for its go file (the test writes itself).
fn holder(zookeeper: &ZooKeeper, name: &str, resource: &str) -> Holder {
    Holder::start(name, lock_command(zookeeper, resource), ACQUIRE_WITHIN).unwrap()
}

/// The command a holder runs: it reports its token and waits for its go file.
fn report_and_wait() -> Vec<String> {
    let wait = "echo \"holding $FENCING_TOKEN pid $$\"; while [ ! -e \"$FK_WORKER_GO\" ]; do sleep 0.05; done";
    ["sh", "-c", wait].map(String::from).to_vec()
}

fn lock_command(zookeeper: &ZooKeeper, resource: &str) -> Command {
    let path = format!("/locks{resource}");
    let args = ["--zookeeper", &zookeeper.address(), "--ttl", "2", &path];
    fencekeeper_lock(&args, &report_and_wait()).unwrap()
}

/// kazoo's Lock recipe on `/locks<resource>` (`tests/clients/kazoo_lock.py`), an
/// independent client whose nodes the check must order the same way.
fn kazoo_holder(zookeeper: &ZooKeeper, name: &str, resource: &str) -> Holder {
    // Debian's python3, the one python3-kazoo is installed for.
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(repo_root().join("tests/clients/kazoo_lock.py"));
    cmd.args([zookeeper.address(), "2".into(), format!("/locks{resource}"), "--".into()]).args(report_and_wait());
    Holder::start(name, cmd, ACQUIRE_WITHIN).unwrap()
}

/// Let the holder's command end, and wait for `fencekeeper lock` to release and exit.
fn release(mut holder: Holder) {
    holder.go().unwrap();
    let exit = holder.exit().unwrap();
    assert!(exit.success(), "{exit}: {}", holder.stderr());
}

/// A client that queues an ephemeral sequential node under `lock` as a contender
/// would, without waiting for its turn: its czxid is a real one, of a node that
/// exists but does not hold.
fn queue_without_holding(zookeeper: &ZooKeeper, lock: &str) -> (Session, String) {
    let mut session = Session::open(&zookeeper.address(), Duration::from_secs(2)).unwrap();
    let mut create = Jute::default();
    create.string(&format!("{lock}/forger__lock__")).buffer(&[]);
    create.int(1).int(0x1f).string("world").string("anyone").int(3);
    let (err, body) = session.call(op::CREATE2, &create.0).unwrap();
    assert_eq!(err, 0);
    let mut reply = Reader(&body);
    let _path = reply.string().unwrap();
    (session, token_text(reply.long().unwrap()))
}

#[test]
fn zookeeper_provenance_admits_only_the_holders_czxid_through_the_gateway() {
    let mut zookeeper = ZooKeeper::start().unwrap();
    let upstream = RecordingUpstream::start().unwrap();
    let lock_args = ["--lock-zookeeper", &zookeeper.address(), "--provenance", "strong", "--lock-prefix", "/locks"];
    let gateway = Gateway::start(&upstream.url(), &lock_args).unwrap();

    // (a) A forged maximum, and a well-formed czxid while nobody holds the lock.
    let forged = gateway.put("/a", Some(FORGED), b"forged").unwrap();
    assert_eq!(forged.status, 403, "{}", forged.body);
    assert!(forged.body.starts_with("unverified fencing token for \"/a\": ZooKeeper has not issued token"));
    assert_eq!(forged.body.lines().count(), 1, "{}", forged.body);
    let unheld = gateway.put("/a", Some("1.5"), b"nobody holds").unwrap();
    assert_eq!(unheld.status, 403, "{}", unheld.body);
    assert!(unheld.body.contains("nobody holds the ZooKeeper lock \"/locks/a\""), "{}", unheld.body);
    assert_eq!(gateway.put("/a", Some("57"), b"an etcd revision").unwrap().status, 403);
    assert_eq!(gateway.mark("/a").unwrap(), None);

    // (b) The holder's token advances; a queued client that does not hold is refused.
    let first = holder(&zookeeper, "first", "/a");
    let admitted = gateway.put("/a", Some(&first.token), b"first").unwrap();
    assert_eq!(admitted.status, 201, "{}", admitted.body);
    assert_eq!(gateway.mark("/a").unwrap().as_deref(), Some(first.token.as_str()));
    assert_eq!(gateway.put("/a", Some(FORGED), b"forged").unwrap().status, 403, "forged while someone holds");
    let (forger, queued) = queue_without_holding(&zookeeper, "/locks/a");
    assert!(token!(&queued) > token!(&first.token), "{queued} after {}", first.token);
    let waiting = gateway.put("/a", Some(&queued), b"queued, not holding").unwrap();
    assert_eq!(waiting.status, 403, "a contender's czxid is not the holder's: {}", waiting.body);
    assert!(waiting.body.contains("a waiting contender's"), "{}", waiting.body);
    drop(forger); // its session's node goes once the session expires; close it now
    let mut second = Holder::spawn("second", lock_command(&zookeeper, "/a")).unwrap();

    // (c) After the first holder releases and the second holds, the first's token no
    // longer advances a mark; equal to the mark, it is not checked.
    let first_token = first.token.clone();
    release(first);
    second.acquired(ACQUIRE_WITHIN).unwrap();
    assert!(token!(&second.token) > token!(&first_token));
    let equal = gateway.put("/a", Some(&first_token), b"first, after releasing").unwrap();
    assert_eq!(equal.status, 201, "a token equal to the mark needs no check: {}", equal.body);
    assert_eq!(gateway.put("/a", Some(&second.token), b"second").unwrap().status, 201);
    assert_eq!(gateway.put("/a", Some(&first_token), b"first, stale").unwrap().status, 409);

    let never_wrote = holder(&zookeeper, "paused", "/b");
    let paused_token = never_wrote.token.clone();
    release(never_wrote);
    let next = kazoo_holder(&zookeeper, "next (kazoo)", "/b");
    let late = gateway.put("/b", Some(&paused_token), b"an earlier holder, late").unwrap();
    assert_eq!(late.status, 403, "{}", late.body);
    assert!(late.body.contains("an earlier holder's"), "{}", late.body);
    assert_eq!(gateway.mark("/b").unwrap(), None);
    assert_eq!(gateway.put("/b", Some(&next.token), b"next").unwrap().status, 201);
    release(next);

    // The library's check, beside the gateway: other resources, other arities.
    let provenance = ZooKeeperProvenance::connect(&zookeeper.address(), "/locks", Duration::from_secs(2)).unwrap();
    assert_eq!(provenance.check("/a", &token!(&second.token)).unwrap(), Origin::Issued);
    for (resource, token, why) in [
        ("/b", second.token.as_str(), "nobody holds"),
        ("/a", "1.2.3", "two components"),
        ("/a", "5", "two components"),
        ("/a", "1.4294967296", "at most 4294967295"),
        ("/../a", second.token.as_str(), "is no ZooKeeper path"),
    ] {
        match provenance.check(resource, &token!(token)).unwrap() {
            Origin::Unverified(reason) => assert!(reason.contains(why) && reason.contains(token), "{reason}"),
            Origin::Issued => panic!("{resource} {token} was vouched for"),
        }
    }

    // A restart closes every connection: the gateway's next check opens a new session.
    release(second);
    zookeeper.restart().unwrap();
    let after_restart = holder(&zookeeper, "after restart", "/c");
    let fresh = gateway.put("/c", Some(&after_restart.token), b"after the restart").unwrap();
    assert_eq!(fresh.status, 201, "{}", fresh.body);
    assert_eq!(provenance.check("/c", &token!(&after_restart.token)).unwrap(), Origin::Issued, "the library's too");

    // (d) ZooKeeper stopped: an advance cannot be checked.
    zookeeper.process.kill();
    let down = gateway.put("/d", Some(&after_restart.token), b"unchecked").unwrap();
    assert_eq!(down.status, 503, "{}", down.body);
    assert_eq!(down.body.trim_end().lines().count(), 1, "{}", down.body);
    let why = down.body.split_once("the lock service cannot check the token: ").map(|(_, why)| why);
    assert!(why.is_some_and(|why| why.contains("ZooKeeper at")), "{}", down.body);
    assert_eq!(gateway.mark("/d").unwrap(), None, "the mark stayed");
    let equal = gateway.put("/c", Some(&after_restart.token), b"the holder again").unwrap();
    assert_eq!(equal.status, 201, "a token equal to the mark is not checked: {}", equal.body);
    assert!(provenance.check("/c", &token!(&after_restart.token)).is_err(), "unreachable is an error, not a verdict");

    let applied: Vec<(String, Vec<u8>)> = upstream.applied().into_iter().map(|a| (a.path, a.body)).collect();
    let expected: Vec<(String, Vec<u8>)> = [
        ("/a", &b"first"[..]),
        ("/a", b"first, after releasing"),
        ("/a", b"second"),
        ("/b", b"next"),
        ("/c", b"after the restart"),
        ("/c", b"the holder again"),
    ]
    .iter()
    .map(|(p, b)| (p.to_string(), b.to_vec()))
    .collect();
    assert_eq!(applied, expected);
}

#[test]
fn zookeeper_provenance_flags_that_do_not_fit_are_one_line_start_up_errors() {
    for (args, needle) in [
        (&["--provenance", "weak", "--lock-zookeeper", "127.0.0.1:1"][..], "use --provenance strong --lock-prefix P"),
        (&["--provenance", "strong", "--lock-zookeeper", "127.0.0.1:1"][..], "needs --lock-prefix"),
        (&["--lock-zookeeper", "127.0.0.1:1"][..], "--lock-zookeeper goes with --provenance strong"),
        (&["--lock-zookeeper", "127.0.0.1:1", "--lock-etcd", "127.0.0.1:1"][..], "cannot be used with"),
        (
            &["--provenance", "strong", "--lock-prefix", "/locks", "--lock-zookeeper", "127.0.0.1:1"][..],
            "connecting to ZooKeeper at 127.0.0.1:1",
        ),
        (&["--provenance", "strong", "--lock-prefix", "/locks"][..], "or --lock-zookeeper"),
    ] {
        let (code, last, stderr) = start_up_error(args).unwrap();
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(last.starts_with("fencekeeper: ") && last.contains(needle), "{args:?}: {stderr}");
    }
}
