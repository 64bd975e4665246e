//! Marks kept by Redis's own persistence: a real redis-server with the module and
//! `appendonly yes` + `appendfsync always`, killed with SIGKILL while clients write,
//! restarted on the same directory. Every acknowledged advance is there afterwards,
//! and each resource's data is the write of its mark's token: the write and the
//! advance are one MULTI in the AOF. Also: the AOF rewrite (with and without the RDB
//! preamble), an RDB snapshot, and a record damaged in the AOF, which reads back as
//! an error, never as the lower mark before it.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::redis::Redis;
use fencekeeper_harness::resp::Reply;
use fencekeeper_harness::services::poll_until;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const RESOURCES: usize = 4;
const WRITERS: usize = 6;

fn ok() -> Reply {
    Reply::Status("OK".into())
}

fn durable() -> Redis {
    Redis::with_module(&[], &["--appendonly", "yes", "--appendfsync", "always", "--save", ""]).unwrap()
}

/// What the writers were told: the highest token acknowledged (OK) per resource, and
/// the highest sent.
#[derive(Default)]
struct Told {
    acked: [u64; RESOURCES],
    sent: [u64; RESOURCES],
}

/// Writers race increasing tokens on a few resources until the server dies; each
/// write stores its token as the data. Returns once `acks` writes were acknowledged
/// and the server was killed.
fn write_until_killed(redis: &mut Redis, next: &Arc<[AtomicU64; RESOURCES]>, told: &Arc<Mutex<Told>>, acks: u64) {
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (next, told, acked, stop) = (next.clone(), told.clone(), acked.clone(), stop.clone());
            let mut client = redis.client().unwrap();
            std::thread::spawn(move || {
                for i in 0.. {
                    if stop.load(SeqCst) {
                        break;
                    }
                    let r = (w + i) % RESOURCES;
                    let token = next[r].fetch_add(1, SeqCst) + 1;
                    {
                        let mut t = told.lock().unwrap();
                        t.sent[r] = t.sent[r].max(token);
                    }
                    let (key, resource, text) = (format!("data:{r}"), format!("fence:{r}"), token.to_string());
                    match client.cmd(&["FENCE.SET", &key, &resource, &text, &text]) {
                        Ok(reply) if reply == ok() => {
                            let mut t = told.lock().unwrap();
                            t.acked[r] = t.acked[r].max(token);
                            acked.fetch_add(1, SeqCst);
                        }
                        Ok(Reply::Error(e)) if e.starts_with("STALE ") => {}
                        Ok(other) => panic!("writer {w}: {other:?}"),
                        Err(_) => break, // the server died: this write's fate is unknown
                    }
                }
            })
        })
        .collect();
    poll_until("acknowledged writes", Duration::from_secs(60), || acked.load(SeqCst) >= acks).unwrap();
    redis.kill();
    stop.store(true, SeqCst);
    for writer in writers {
        writer.join().unwrap();
    }
}

/// After a restart: each mark is at least the highest acknowledged token, at most
/// the highest sent, and the data is the write of the mark's token.
fn check_after_restart(redis: &Redis, told: &Told) {
    let mut c = redis.client().unwrap();
    for r in 0..RESOURCES {
        let mark = c.cmd(&["FENCE.MARK", &format!("fence:{r}")]).unwrap().text().unwrap();
        let mark: u64 = mark.parse().unwrap();
        assert!(mark >= told.acked[r], "resource {r}: mark {mark} below the acknowledged {}", told.acked[r]);
        assert!(mark <= told.sent[r], "resource {r}: mark {mark} above anything sent ({})", told.sent[r]);
        let data = c.cmd(&["GET", &format!("data:{r}")]).unwrap().text().unwrap();
        assert_eq!(data, mark.to_string(), "resource {r}: the data and the mark are one step");
    }
}

#[test]
fn sigkill_with_aof_always_loses_no_acknowledged_advance() {
    let mut redis = durable();
    let next: Arc<[AtomicU64; RESOURCES]> = Arc::new(Default::default());
    let told = Arc::new(Mutex::new(Told::default()));
    // Round 1: the AOF as written. Round 2: rewritten with the RDB preamble (the
    // type's rdb_save) first. Round 3: rewritten as commands (aof_rewrite, which
    // emits FENCE.RAISE).
    for round in 1..=3 {
        if round > 1 {
            let mut c = redis.client().unwrap();
            let preamble = if round == 2 { "yes" } else { "no" };
            assert_eq!(c.cmd(&["CONFIG", "SET", "aof-use-rdb-preamble", preamble]).unwrap(), ok());
            let mut before = None;
            poll_until("no AOF rewrite running", Duration::from_secs(60), || {
                before = aof_rewrites(&mut c);
                before.is_some()
            })
            .unwrap();
            assert!(c.cmd(&["BGREWRITEAOF"]).unwrap().text().is_some());
            poll_until("the AOF rewrite", Duration::from_secs(60), || aof_rewrites(&mut c) > before).unwrap();
        }
        write_until_killed(&mut redis, &next, &told, 300);
        redis.restart().unwrap();
        check_after_restart(&redis, &told.lock().unwrap());
    }
    assert!(!redis.log().contains("CRITICAL"), "{}", redis.log());
}

/// `aof_rewrites` from INFO persistence; `None` while a rewrite runs or waits.
fn aof_rewrites(c: &mut fencekeeper_harness::resp::Client) -> Option<u64> {
    let info = c.cmd(&["INFO", "persistence"]).unwrap().text().unwrap();
    let field = |name: &str| {
        info.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).and_then(|v| v.trim().parse::<u64>().ok())
    };
    if field("aof_rewrite_in_progress") != Some(0) || field("aof_rewrite_scheduled") != Some(0) {
        return None;
    }
    field("aof_rewrites")
}

#[test]
fn a_record_damaged_in_the_aof_reads_as_an_error_never_as_the_lower_mark() {
    let mut redis = durable();
    let mut c = redis.client().unwrap();
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "50", "fifty"]).unwrap(), ok());
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "60", "sixty"]).unwrap(), ok());
    redis.kill();
    // The advance to 60 is `FENCE.RAISE fence:r "fk2 60 <crc>"` in the AOF: make its
    // digit a 4, as a flipped bit would. Believed, the mark would read 40, below 50.
    let incr = incremental_aof(&redis);
    let mut aof = std::fs::read(&incr).unwrap();
    let at = aof.windows(7).position(|w| w == b"fk2 60 ").unwrap();
    aof[at + 4] = b'4';
    std::fs::write(&incr, &aof).unwrap();
    redis.restart().unwrap();
    let mut c = redis.client().unwrap();
    let mark = c.cmd(&["FENCE.MARK", "fence:r"]).unwrap();
    assert!(mark.error().is_some_and(|e| e.starts_with("UNDECIDED ") && e.contains("does not match")), "{mark:?}");
    let write = c.cmd(&["FENCE.SET", "k", "fence:r", "55", "between"]).unwrap();
    assert!(write.error().is_some_and(|e| e.starts_with("UNDECIDED ")), "{write:?}");
    assert_eq!(c.cmd(&["GET", "k"]).unwrap().text().as_deref(), Some("sixty"));
    assert!(redis.log().contains("FENCE.RAISE stored a damaged mark record"), "{}", redis.log());
}

#[test]
fn a_lower_record_in_the_aof_does_not_lower_the_mark() {
    let mut redis = durable();
    let mut c = redis.client().unwrap();
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "60", "sixty"]).unwrap(), ok());
    redis.kill();
    // A sound record of 40, appended as a later command (a tool, a mixed-up file).
    let record = fencekeeper_core::record::encode(b"fence:r", &fencekeeper_core::Token::parse("40").unwrap());
    let incr = incremental_aof(&redis);
    let mut aof = std::fs::read(&incr).unwrap();
    let command = [&b"FENCE.RAISE"[..], b"fence:r", record.as_bytes()];
    aof.extend(format!("*{}\r\n", command.len()).as_bytes());
    for word in command {
        aof.extend(format!("${}\r\n", word.len()).as_bytes());
        aof.extend(word);
        aof.extend(b"\r\n");
    }
    std::fs::write(&incr, &aof).unwrap();
    redis.restart().unwrap();
    let mut c = redis.client().unwrap();
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:r"]).unwrap().text().as_deref(), Some("60"), "FENCE.RAISE only raises");
}

/// The AOF's incremental file (Redis 7's multi-part AOF: appendonlydir/*.incr.aof).
fn incremental_aof(redis: &Redis) -> std::path::PathBuf {
    std::fs::read_dir(redis.dir().join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .unwrap()
}

#[test]
fn an_rdb_snapshot_keeps_marks_as_marks() {
    let mut redis = Redis::with_module(&[], &["--appendonly", "no"]).unwrap();
    let mut c = redis.client().unwrap();
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "7.1042", "v"]).unwrap(), ok());
    assert_eq!(c.cmd(&["SAVE"]).unwrap(), ok());
    redis.kill();
    redis.restart().unwrap();
    let mut c = redis.client().unwrap();
    assert_eq!(c.cmd(&["TYPE", "fence:r"]).unwrap(), Reply::Status("fencemark".into()));
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:r"]).unwrap().text().as_deref(), Some("7.1042"));
    let stale = c.cmd(&["FENCE.SET", "k", "fence:r", "7.1041", "late"]).unwrap();
    assert!(stale.error().is_some_and(|e| e.starts_with("STALE 7.1042 ")), "{stale:?}");
}
