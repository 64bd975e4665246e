//! The Redis module against what a client, an operator or a guest can do wrong:
//! bad arguments (a 1 MiB token, bytes that are not UTF-8, wrong arity), marks that
//! were overwritten, renamed or given a TTL, an eviction policy that could forget a
//! mark, load arguments and guests that must not load, and the fault-injection guest
//! (guest/artifacts/test-guests/guest_faults.wasm: traps, loops, grows, lies). Each
//! is one error with a stable prefix; the server and its other clients carry on, and
//! no mark moves.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::validator::guest_path;
use fencekeeper_harness::redis::Redis;
use fencekeeper_harness::resp::{Client, Reply};
use std::time::{Duration, Instant};

const CONFIG: [&str; 4] = ["--save", "", "--appendonly", "no"];

fn ok() -> Reply {
    Reply::Status("OK".into())
}

fn bulk(text: &str) -> Reply {
    Reply::Bulk(Some(text.as_bytes().to_vec()))
}

fn error(reply: Reply) -> String {
    match reply {
        Reply::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn seeded() -> (Redis, Client) {
    let redis = Redis::with_module(&[], &CONFIG).unwrap();
    let mut c = redis.client().unwrap();
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "50", "kept"]).unwrap(), ok());
    (redis, c)
}

/// The mark and the data are as seeded, and a second connection is served.
fn unharmed(redis: &Redis) {
    let mut other = redis.client().unwrap();
    assert_eq!(other.cmd(&["PING"]).unwrap(), Reply::Status("PONG".into()));
    assert_eq!(other.cmd(&["FENCE.MARK", "fence:r"]).unwrap(), bulk("50"));
    assert_eq!(other.cmd(&["GET", "k"]).unwrap(), bulk("kept"));
}

#[test]
fn bad_arguments_are_one_line_errors_and_move_nothing() {
    let (redis, mut c) = seeded();
    let huge = "9".repeat(1 << 20);
    let e = error(c.call(&[b"FENCE.SET", b"k", b"fence:r", huge.as_bytes(), b"x"]).unwrap());
    assert!(e.starts_with("MALFORMED ") && e.contains("1048576 bytes") && e.len() < 512, "{}", &e[..e.len().min(300)]);
    let e = error(c.call(&[b"FENCE.SET", b"k", b"fence:r", b"5\xff0", b"x"]).unwrap());
    assert!(e.starts_with("MALFORMED "), "{e}");
    let e = error(c.call(&[b"FENCE.SET", b"k", b"fence:\xff\xfe", b"60", b"x"]).unwrap());
    assert!(e.starts_with("MALFORMED malformed request: resource key is not UTF-8"), "{e}");
    let long = format!("fence:{}", "r".repeat(1024));
    let e = error(c.cmd(&["FENCE.SET", "k", &long, "60", "x"]).unwrap());
    assert!(e.starts_with("MALFORMED ") && e.contains("1030 bytes"), "{e}");
    assert!(error(c.cmd(&["FENCE.MARK", &long]).unwrap()).starts_with("MALFORMED "));
    for bad in ["-1", "1.2.3.4.5", " 60", "18446744073709551616", "0x3c"] {
        let e = error(c.cmd(&["FENCE.SET", "k", "fence:r", bad, "x"]).unwrap());
        assert!(e.starts_with("MALFORMED "), "{bad}: {e}");
    }
    let e = error(c.call(&[b"FENCE.CALL", b"fence:r", b"60", b"S\0ET", b"k", b"x"]).unwrap());
    assert!(e.starts_with("ERR unknown command"), "{e}");
    for (args, name) in [
        (&["FENCE.SET", "k", "fence:r", "60"][..], "fence.set"),
        (&["FENCE.CALL", "fence:r", "60"], "fence.call"),
        (&["FENCE.MARK"], "fence.mark"),
        (&["FENCE.MARK", "a", "b"], "fence.mark"),
        (&["FENCE.RAISE", "fence:r"], "fence.raise"),
    ] {
        let e = error(c.cmd(args).unwrap());
        assert_eq!(e, format!("ERR wrong number of arguments for '{name}' command"), "{args:?}");
    }
    unharmed(&redis);
}

#[test]
fn a_mark_overwritten_renamed_or_given_a_ttl_is_an_error_never_a_lower_mark() {
    let (redis, mut c) = seeded();
    // Overwritten by a plain SET (nothing stops an unfenced client): undecided.
    assert_eq!(c.cmd(&["SET", "fence:r", "fk2 1 00000000"]).unwrap(), ok());
    for token in ["40", "60"] {
        let e = error(c.cmd(&["FENCE.SET", "k", "fence:r", token, "x"]).unwrap());
        assert!(e.starts_with("UNDECIDED ") && e.contains("holds a string, not a fencing mark"), "{e}");
    }
    assert!(error(c.cmd(&["FENCE.MARK", "fence:r"]).unwrap()).starts_with("UNDECIDED "));
    // A mark renamed to another resource's name fails its checksum there.
    assert_eq!(c.cmd(&["FENCE.SET", "k2", "fence:a", "70", "x"]).unwrap(), ok());
    assert_eq!(c.cmd(&["RENAME", "fence:a", "fence:b"]).unwrap(), ok());
    let e = error(c.cmd(&["FENCE.CALL", "fence:b", "1", "DEL", "k2"]).unwrap());
    assert!(e.starts_with("UNDECIDED ") && e.contains("belongs to another resource"), "{e}");
    // A mark given a TTL would be forgotten when it expires.
    assert_eq!(c.cmd(&["FENCE.SET", "k3", "fence:c", "80", "x"]).unwrap(), ok());
    assert_eq!(c.cmd(&["PEXPIRE", "fence:c", "600000"]).unwrap(), Reply::Integer(1));
    let e = error(c.cmd(&["FENCE.SET", "k3", "fence:c", "81", "y"]).unwrap());
    assert!(e.starts_with("UNDECIDED ") && e.contains("PERSIST it"), "{e}");
    assert_eq!(c.cmd(&["PERSIST", "fence:c"]).unwrap(), Reply::Integer(1));
    assert_eq!(c.cmd(&["FENCE.SET", "k3", "fence:c", "81", "y"]).unwrap(), ok());
    // COPY of a mark is refused by the type.
    assert!(c.cmd(&["COPY", "fence:c", "fence:d"]).unwrap().error().is_some());
    assert_eq!(c.cmd(&["GET", "k"]).unwrap(), bulk("kept"));
    assert_eq!(c.cmd(&["GET", "k3"]).unwrap(), bulk("y"));
    drop(redis);
}

#[test]
fn efficiency_mode_fails_open_on_a_damaged_mark_only() {
    let redis = Redis::with_module(&["mode", "efficiency"], &CONFIG).unwrap();
    let mut c = redis.client().unwrap();
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "50", "v"]).unwrap(), ok());
    assert!(error(c.cmd(&["FENCE.SET", "k", "fence:r", "49", "stale"]).unwrap()).starts_with("STALE 50 "));
    assert!(error(c.cmd(&["FENCE.SET", "k", "fence:r", "", "empty"]).unwrap()).starts_with("MALFORMED "));
    assert_eq!(c.cmd(&["SET", "fence:r", "damaged"]).unwrap(), ok());
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "49", "passed"]).unwrap(), ok(), "the store is unreadable: open");
    assert_eq!(c.cmd(&["GET", "fence:r"]).unwrap(), bulk("damaged"), "failing open writes no mark");
    assert_eq!(c.cmd(&["GET", "k"]).unwrap(), bulk("passed"));
}

#[test]
fn an_eviction_policy_that_could_forget_a_mark_refuses_every_fenced_write() {
    let (redis, mut c) = seeded();
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory", "512mb"]).unwrap(), ok());
    for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
        assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory-policy", policy]).unwrap(), ok());
        let e = error(c.cmd(&["FENCE.SET", "k", "fence:r", "60", "x"]).unwrap());
        assert!(
            e.starts_with(&format!("UNDECIDED cannot decide on \"fence:r\": maxmemory-policy {policy} lets")),
            "{e}"
        );
    }
    for policy in ["volatile-lru", "noeviction"] {
        assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory-policy", policy]).unwrap(), ok());
        assert_eq!(c.cmd(&["FENCE.SET", "k2", "fence:r", "50", "x"]).unwrap(), ok(), "{policy}");
    }
    // Out of memory: the commands are deny-oom, Redis refuses them before they run.
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory", "1"]).unwrap(), ok());
    let e = error(c.cmd(&["FENCE.SET", "k2", "fence:r", "51", "x"]).unwrap());
    assert!(e.starts_with("OOM "), "{e}");
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory", "0"]).unwrap(), ok());
    unharmed(&redis);
}

#[test]
fn wrong_load_arguments_and_guests_stop_the_server_with_one_line_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"not a component").unwrap();
    let garbage = garbage.display().to_string();
    let cases = [
        (vec!["mode", "fast"], "fencekeeper failed to load: mode \"fast\": expected correctness or efficiency"),
        (vec!["audit", "on"], "fencekeeper failed to load: unknown argument \"audit\""),
        (
            vec!["guest", "/nonexistent/guest.wasm"],
            "fencekeeper failed to load: cannot read guest /nonexistent/guest.wasm",
        ),
        (vec!["guest", &garbage], "is not WebAssembly"),
    ];
    for (args, expected) in cases {
        let Err(e) = Redis::with_module(&args, &CONFIG) else { panic!("{args:?} loaded") };
        assert!(format!("{e:#}").contains(expected), "{args:?}: {e:#}");
    }
    let redis = Redis::with_module(&[], &["--enable-module-command", "yes", "--save", ""]).unwrap();
    let mut c = redis.client().unwrap();
    let e = error(c.cmd(&["MODULE", "UNLOAD", "fencekeeper"]).unwrap());
    assert!(e.contains("can't unload") || e.contains("not possible"), "{e}");
    assert!(redis.log().contains("guest fencekeeper-validator"), "{}", redis.log());
}

/// The fault guest, on a server whose crash handler Redis installed again after the
/// module loaded (`crash-log-enabled`): a trap must still be the guest's, not a
/// signal that ends the server.
fn fault_server() -> (Redis, Client) {
    let guest = guest_path("test-guests/guest_faults.wasm").display().to_string();
    let redis = Redis::with_module(&["guest", &guest], &CONFIG).unwrap();
    let mut c = redis.client().unwrap();
    assert_eq!(c.cmd(&["CONFIG", "SET", "crash-log-enabled", "no"]).unwrap(), ok());
    assert_eq!(c.cmd(&["CONFIG", "SET", "crash-log-enabled", "yes"]).unwrap(), ok());
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "50", "kept"]).unwrap(), ok());
    (redis, c)
}

#[test]
fn a_guest_that_traps_loops_or_grows_is_stopped_and_the_server_carries_on() {
    let (mut redis, mut c) = fault_server();
    for (token, reason) in [("fault-trap", "unreachable"), ("fault-loop", "fuel"), ("fault-grow", "memory limit")] {
        let started = Instant::now();
        let e = error(c.cmd(&["FENCE.SET", "k", "fence:r", token, "x"]).unwrap());
        assert!(started.elapsed() < Duration::from_secs(10), "{token} took {:?}", started.elapsed());
        assert!(e.starts_with("UNDECIDED ") && e.contains(reason), "{token}: {e}");
        redis.process.check_alive().unwrap();
        unharmed(&redis);
    }
    // The next instance serves honest writes.
    assert_eq!(c.cmd(&["FENCE.SET", "k2", "fence:r2", "1", "v"]).unwrap(), ok());
}

#[test]
fn a_lying_guest_never_gets_a_write_through_or_moves_a_mark() {
    let (redis, mut c) = fault_server();
    // Reserved inputs of the fault guest (guest/validator/src/faults.rs): it admits a
    // token below the mark, raises a mark to the maximum, answers out of contract.
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:lie", "64023.1.0.34", "kept"]).unwrap(), ok());
    let e = error(c.cmd(&["FENCE.SET", "k", "fence:lie", "64023.1.0.33", "stale"]).unwrap());
    assert!(e.starts_with("STALE 64023.1.0.34 "), "{e}");
    let e = error(c.cmd(&["FENCE.SET", "k", "fence:max", "64023.2.0.5", "lock-out"]).unwrap());
    assert!(e.starts_with("UNDECIDED "), "{e}");
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:max"]).unwrap(), Reply::Bulk(None));
    let e = error(c.cmd(&["FENCE.SET", "k", "fence:arity", "64023.5.0.1", "x"]).unwrap());
    assert!(e.starts_with("UNDECIDED ") && e.contains("arity 0"), "{e}");
    assert_eq!(c.cmd(&["GET", "k"]).unwrap(), bulk("kept"));
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:lie"]).unwrap(), bulk("64023.1.0.34"));
    unharmed(&redis);
}
