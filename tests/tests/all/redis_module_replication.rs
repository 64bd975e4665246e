//! Marks on a replica, and a failover. Two real redis-servers with the module, one
//! the replica of the other: the replica applies each fenced write's effect and its
//! advance (`FENCE.RAISE`), never running the guest itself; it refuses fenced writes
//! while it is a replica. When the primary dies and the replica is promoted, the
//! replica has every advance that `WAIT` confirmed, and may lack the ones acknowledged
//! after them: replication is asynchronous (docs/databases.md, "Failover").

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::redis::Redis;
use fencekeeper_harness::relay::Relay;
use fencekeeper_harness::resp::{Client, Reply};
use fencekeeper_harness::services::poll_until;
use std::net::SocketAddr;
use std::time::Duration;

/// No persistence; a primary starts a replica's full sync at once (by default it
/// waits 5 s for more replicas to share it).
const CONFIG: [&str; 6] = ["--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"];

fn ok() -> Reply {
    Reply::Status("OK".into())
}

fn text(reply: Reply) -> String {
    reply.text().unwrap_or_else(|| panic!("expected text, got {reply:?}"))
}

/// A replica of the primary at `primary` (directly, or through a relay).
fn replica_of(primary: SocketAddr) -> Redis {
    let port = primary.port().to_string();
    let mut config = CONFIG.to_vec();
    config.extend(["--replicaof", "127.0.0.1", &port]);
    let replica = Redis::with_module(&[], &config).unwrap();
    let mut c = replica.client().unwrap();
    poll_until("the replica's link to its primary", Duration::from_secs(30), || {
        text(c.cmd(&["INFO", "replication"]).unwrap()).contains("master_link_status:up")
    })
    .unwrap();
    replica
}

/// `WAIT 1 timeout`: how many replicas have every write this client sent.
fn wait_one(c: &mut Client, timeout_ms: u64) -> i64 {
    match c.cmd(&["WAIT", "1", &timeout_ms.to_string()]).unwrap() {
        Reply::Integer(n) => n,
        other => panic!("WAIT answered {other:?}"),
    }
}

#[test]
fn a_replica_applies_writes_and_advances_without_running_the_guest() {
    let primary = Redis::with_module(&[], &CONFIG).unwrap();
    let mut p = primary.client().unwrap();
    // Before the replica attaches: it gets this mark in the full sync (RDB).
    assert_eq!(p.cmd(&["FENCE.SET", "k", "fence:r", "10", "ten"]).unwrap(), ok());
    let replica = replica_of(primary.addr);
    let mut r = replica.client().unwrap();
    assert_eq!(p.cmd(&["FENCE.SET", "k", "fence:r", "11", "eleven"]).unwrap(), ok());
    assert_eq!(p.cmd(&["FENCE.CALL", "fence:r", "12", "HSET", "h", "f", "twelve"]).unwrap(), Reply::Integer(1));
    let script = "return redis.call('FENCE.SET', KEYS[1], KEYS[2], ARGV[1], ARGV[2])";
    assert_eq!(p.cmd(&["EVAL", script, "2", "k", "fence:r", "13", "thirteen"]).unwrap(), ok());
    assert!(p.cmd(&["FENCE.SET", "k", "fence:r", "9", "stale"]).unwrap().error().is_some());
    assert_eq!(wait_one(&mut p, 10_000), 1);

    assert_eq!(text(r.cmd(&["FENCE.MARK", "fence:r"]).unwrap()), "13");
    assert_eq!(text(r.cmd(&["GET", "k"]).unwrap()), "thirteen");
    assert_eq!(text(r.cmd(&["HGET", "h", "f"]).unwrap()), "twelve");
    assert_eq!(r.cmd(&["TYPE", "fence:r"]).unwrap(), Reply::Status("fencemark".into()));
    let readonly = r.cmd(&["FENCE.SET", "k", "fence:r", "14", "on the replica"]).unwrap();
    assert!(readonly.error().is_some_and(|e| e.starts_with("READONLY")), "{readonly:?}");
    // The replica ran the effects: FENCE.RAISE, never FENCE.SET or FENCE.CALL.
    let stats = text(r.cmd(&["INFO", "commandstats"]).unwrap());
    assert!(stats.contains("cmdstat_fence.raise:calls=3,"), "{stats}");
    assert!(stats.contains("cmdstat_fence.set:calls=0,") && !stats.contains("cmdstat_fence.call:"), "{stats}");
    assert!(!replica.log().contains("CRITICAL"), "{}", replica.log());
}

#[test]
fn a_replicas_own_aof_keeps_the_advances_it_applied() {
    let mut primary = Redis::with_module(&[], &CONFIG).unwrap();
    let port = primary.addr.port().to_string();
    let config = ["--save", "", "--appendonly", "yes", "--appendfsync", "always", "--replicaof", "127.0.0.1", &port];
    let mut replica = Redis::with_module(&[], &config).unwrap();
    let mut r = replica.client().unwrap();
    poll_until("the replica's link to its primary", Duration::from_secs(30), || {
        text(r.cmd(&["INFO", "replication"]).unwrap()).contains("master_link_status:up")
    })
    .unwrap();
    // After its full sync a replica rewrites its AOF; what it applies before the
    // rewrite is done is not in it yet (Redis's own rule): wait for the rewrite.
    poll_until("the replica's AOF rewrite after its sync", Duration::from_secs(30), || {
        let info = text(r.cmd(&["INFO", "persistence"]).unwrap());
        ["aof_rewrite_in_progress:0", "aof_rewrite_scheduled:0", "aof_rewrites:1"].iter().all(|f| info.contains(f))
    })
    .unwrap();
    let mut p = primary.client().unwrap();
    assert_eq!(p.cmd(&["FENCE.SET", "k", "fence:r", "20", "twenty"]).unwrap(), ok());
    assert_eq!(p.cmd(&["FENCE.CALL", "fence:r", "21", "SET", "k", "twenty-one"]).unwrap(), ok());
    assert_eq!(wait_one(&mut p, 10_000), 1);
    // The replica restarts from its own AOF alone: its primary is gone.
    primary.kill();
    replica.restart().unwrap();
    let mut r = replica.client().unwrap();
    assert_eq!(text(r.cmd(&["FENCE.MARK", "fence:r"]).unwrap()), "21");
    assert_eq!(text(r.cmd(&["GET", "k"]).unwrap()), "twenty-one");
}

#[test]
fn a_promoted_replica_has_every_advance_wait_confirmed_and_can_lack_the_rest() {
    let mut primary = Redis::with_module(&[], &CONFIG).unwrap();
    let relay = Relay::start(primary.addr).unwrap();
    let replica = replica_of(relay.addr);
    let mut p = primary.client().unwrap();
    assert_eq!(p.cmd(&["FENCE.SET", "k", "fence:r", "50", "B's write"]).unwrap(), ok());
    assert_eq!(wait_one(&mut p, 10_000), 1, "the advance to 50 is on the replica");

    // A partition: the replica stops hearing from its primary, which goes on
    // acknowledging writes (asynchronous replication waits for no replica).
    relay.sever();
    assert_eq!(p.cmd(&["FENCE.SET", "k", "fence:r", "51", "C's write"]).unwrap(), ok());
    assert_eq!(wait_one(&mut p, 300), 0, "a client that asks sees the advance to 51 is on no replica");
    primary.kill();

    let mut r = replica.client().unwrap();
    assert_eq!(r.cmd(&["REPLICAOF", "NO", "ONE"]).unwrap(), ok());
    // What a client sees on the promoted replica: the acknowledged advance to 51 and
    // its write are gone; the mark is the last one WAIT confirmed.
    assert_eq!(text(r.cmd(&["FENCE.MARK", "fence:r"]).unwrap()), "50");
    assert_eq!(text(r.cmd(&["GET", "k"]).unwrap()), "B's write");
    // So the holder of 50, stale since 51 was admitted, is admitted again ...
    assert_eq!(r.cmd(&["FENCE.SET", "k", "fence:r", "50", "B again, after C"]).unwrap(), ok());
    // ... while everything below what WAIT confirmed is still refused.
    let stale = r.cmd(&["FENCE.SET", "k", "fence:r", "49", "A"]).unwrap();
    assert!(stale.error().is_some_and(|e| e.starts_with("STALE 50 ")), "{stale:?}");
    // C, reacquiring with a newer token, writes on.
    assert_eq!(r.cmd(&["FENCE.SET", "k", "fence:r", "52", "C again"]).unwrap(), ok());
}
