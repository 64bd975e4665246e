//! Tokens from ZooKeeper, end to end: `fencekeeper lock --zookeeper` and kazoo's Lock
//! recipe (an independent client, `tests/clients/kazoo_lock.py`) take turns on one
//! lock with a real ZooKeeper, and write through the real gateway to nginx WebDAV.
//!
//! The token is the lock node's czxid as `epoch.counter`. The paused holder's session
//! really expires: its client is frozen (SIGSTOP) past the 2 s session timeout, the
//! server expires the session and deletes its node, and the other client acquires.
//! Then ZooKeeper restarts: its one-member ensemble elects a leader in a new epoch, the
//! counter starts over, and the next holder's token still orders after the last one.
//!
//! One ZooKeeper serves the whole file (a JVM takes seconds to start), so the stories
//! run in one test, the two directions side by side.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::holder::{fencekeeper_lock, pause_past_lease, stored, token, worker, Holder, ACQUIRE_WITHIN};
use fencekeeper_harness::repo_root;
use fencekeeper_harness::services::{NginxDav, ZooKeeper};
use std::process::Command;
use std::time::Duration;

/// The session timeout every client asks for, seconds (the server's tick is 250 ms).
const SESSION: &str = "2";

struct Stage {
    zookeeper: ZooKeeper,
    nginx: NginxDav,
    gateway: Gateway,
}

/// kazoo's Lock recipe: `kazoo_lock.py HOSTS 2 PATH -- WORKER... --resource R`.
fn kazoo_lock(stage: &Stage, path: &str, resource: &str, who: &str) -> Command {
    // Debian's python3, the one python3-kazoo is installed for.
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(repo_root().join("tests/clients/kazoo_lock.py")).args([&stage.zookeeper.address(), SESSION, path, "--"]);
    cmd.args(worker(&stage.gateway.url(), who, &["--resource", resource]).unwrap());
    cmd
}

/// `fencekeeper lock --zookeeper ... --ttl 2 --on-loss none --resource R PATH -- WORKER...`.
fn fencekeeper_zk_lock(stage: &Stage, path: &str, resource: &str, who: &str) -> Command {
    let address = stage.zookeeper.address();
    let args = ["--zookeeper", &address, "--ttl", SESSION, "--on-loss", "none", "--resource", resource, path];
    fencekeeper_lock(&args, &worker(&stage.gateway.url(), who, &[]).unwrap()).unwrap()
}

/// A pauses past its session, B takes over; A's late write is refused and B's data
/// stays. `a_is_fencekeeper`: A's client is `fencekeeper lock`, which exits 75.
fn paused_holder_is_fenced(stage: &Stage, a: Command, b: Command, resource: &str, a_is_fencekeeper: bool) {
    let mut story = pause_past_lease(a, b).unwrap();
    eprintln!("{resource}: A {} B {}; B acquired {:?} after A froze", story.a.token, story.b.token, story.b_waited);
    // B waited for A's 2 s session, pinged every 2/3 s, to expire.
    story.check_fenced(Duration::from_secs(1)).unwrap();
    if a_is_fencekeeper {
        assert_eq!(story.a_exit.code(), Some(75), "{}", story.a.stderr());
        let said = story.a.stderr();
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(said.contains("lost lock") && said.contains("ZooKeeper closed the connection"), "{said}");
    }
    story.finish_b(&stage.nginx, &stage.gateway, resource).unwrap();
}

/// One holder writes, ZooKeeper restarts (a new epoch), the next holder writes: its
/// token is admitted although its counter may be lower, because the epoch comes first.
fn tokens_order_across_a_leader_change(stage: &mut Stage) {
    let resource = "/orders/epochs.csv";
    let mut before =
        Holder::start("before", fencekeeper_zk_lock(stage, "/locks/epochs", resource, "before"), ACQUIRE_WITHIN)
            .unwrap();
    assert!(stored(before.wrote().unwrap()));
    let (status, exit) = before.finish().unwrap();
    assert!(stored(status) && exit.success(), "{status} {exit} {}", before.stderr());

    stage.zookeeper.restart().unwrap();
    let mut after =
        Holder::start("after", kazoo_lock(stage, "/locks/epochs", resource, "after"), ACQUIRE_WITHIN).unwrap();
    let (old, new) = (token(&before.token).unwrap(), token(&after.token).unwrap());
    eprintln!("across the restart: {old} then {new}");
    assert!(new.parts()[0] > old.parts()[0], "no new epoch: {old} then {new}");
    assert!(new > old);
    assert!(stored(after.wrote().unwrap()), "the first token of the new epoch was refused");
    let (status, exit) = after.finish().unwrap();
    assert!(stored(status) && exit.success(), "{status} {exit} {}", after.stderr());
}

#[test]
fn zookeeper_holders_are_fenced_by_czxid_whichever_client_and_across_a_leader_change() {
    let zookeeper = ZooKeeper::start().unwrap();
    let nginx = NginxDav::start().unwrap();
    let gateway = Gateway::start(&nginx.url(), &[]).unwrap();
    let mut stage = Stage { zookeeper, nginx, gateway };

    std::thread::scope(|s| {
        let stage = &stage;
        s.spawn(|| {
            let resource = "/orders/fencekeeper-paused.csv";
            let a = fencekeeper_zk_lock(stage, "/locks/one", resource, "A");
            let b = kazoo_lock(stage, "/locks/one", resource, "B");
            paused_holder_is_fenced(stage, a, b, resource, true);
        });
        s.spawn(|| {
            let resource = "/orders/kazoo-paused.csv";
            let a = kazoo_lock(stage, "/locks/two", resource, "A");
            let b = fencekeeper_zk_lock(stage, "/locks/two", resource, "B");
            paused_holder_is_fenced(stage, a, b, resource, false);
        });
    });
    tokens_order_across_a_leader_change(&mut stage);
}
