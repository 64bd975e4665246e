//! Crashes of a real PostgreSQL under fenced writes: a backend killed with SIGKILL in
//! the middle of a transaction that has advanced a mark (the postmaster then ends
//! every backend and recovers), and the whole server stopped with `pg_ctl stop -m
//! immediate`'s SIGQUIT under load. After each recovery:
//!
//! * no mark is lost: every resource's mark is at least every token a committed
//!   (acknowledged) transaction wrote there;
//! * the killed transaction left nothing: its advance, its row and its audit row are
//!   gone, though its token was above every mark when it was killed;
//! * no committed row carries a token below its resource's mark at its commit
//!   (commit times from the server, advances from the audit);
//! * every acknowledged row is there, and the fence goes on working.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::commit_order;
use fencekeeper_harness::pg_wire::Client;
use fencekeeper_harness::postgres::{kill, Postgres};
use fencekeeper_harness::rng::Rng;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const RESOURCES: u64 = 3;
const WRITERS: usize = 4;

/// What the writers saw committed: per resource, the highest token; and the rows.
#[derive(Default)]
struct Acknowledged {
    highest: HashMap<u64, u64>,
    rows: u64,
}

/// Write until the connection fails (the crash): each transaction two rows of one
/// resource with the last token seen there or a fresh one.
fn writer(mut client: Client, thread: u64, counter: &AtomicU64, acked: &Mutex<Acknowledged>, started: &AtomicBool) {
    let mut rng = Rng::new(3, thread);
    let mut seen: HashMap<u64, u64> = HashMap::new();
    loop {
        let resource = rng.below(RESOURCES);
        let token = match seen.get(&resource) {
            Some(t) if rng.chance(1, 2) => *t,
            _ => counter.fetch_add(1, Ordering::Relaxed),
        };
        let sql =
            format!("BEGIN; INSERT INTO fenced VALUES ('r{resource}', {token}), ('r{resource}', {token}); COMMIT");
        match client.query(sql) {
            Ok(_) => {
                let mut acked = acked.lock().unwrap();
                let highest = acked.highest.entry(resource).or_default();
                *highest = (*highest).max(token);
                acked.rows += 2;
                seen.insert(resource, token);
                started.store(true, Ordering::Relaxed);
            }
            Err(e) if e.code() == Some("FK001") => {
                if client.query("ROLLBACK").is_err() {
                    return;
                }
                let detail = e.server().and_then(|s| s.detail.clone()).unwrap_or_default();
                seen.insert(resource, detail.strip_prefix("fencing-highest: ").unwrap().parse().unwrap());
            }
            // The crash: the connection is gone, or the server says it is going down.
            Err(_) => return,
        }
    }
}

/// Run the writers until `crash` has happened; return what they saw committed.
fn under_load(pg: &Postgres, counter: &AtomicU64, crash: impl FnOnce()) -> Acknowledged {
    let acked = Mutex::new(Acknowledged::default());
    let started = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for thread in 0..WRITERS {
            let client = pg.connect("postgres").unwrap();
            let (acked, started) = (&acked, &started);
            scope.spawn(move || writer(client, thread as u64, counter, acked, started));
        }
        // Some load first, then the crash while the writers write.
        while !started.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(500));
        crash();
    });
    acked.into_inner().unwrap()
}

/// What must hold after a recovery.
fn recovered(pg: &Postgres, acked: &Acknowledged, before: u64, victim: Option<u64>) {
    let mut c = pg.connect("postgres").unwrap();
    for (resource, highest) in &acked.highest {
        let mark: u64 = c.value(format!("SELECT fencekeeper.mark('r{resource}')")).unwrap().unwrap().parse().unwrap();
        assert!(mark >= *highest, "r{resource}: mark {mark} below the acknowledged {highest}: a mark was lost");
        assert_ne!(Some(mark), victim, "r{resource}: the killed transaction's advance survived");
    }
    if let Some(victim) = victim {
        let left = c.value(format!("SELECT count(*) FROM fenced WHERE token = {victim}")).unwrap();
        let audited =
            c.value(format!("SELECT count(*) FROM fencekeeper.audit WHERE entry->>'new' = '{victim}'")).unwrap();
        assert_eq!((left.as_deref(), audited.as_deref()), (Some("0"), Some("0")), "the killed transaction left rows");
    }
    let rows: u64 = c.value("SELECT count(*) FROM fenced").unwrap().unwrap().parse().unwrap();
    assert!(rows >= before + acked.rows, "{rows} rows, {} acknowledged: a committed row was lost", before + acked.rows);
    let (dated, advances) = commit_order::coverage(&mut c, "fenced").unwrap();
    assert!(dated == rows && advances > 0, "{dated} of {rows} rows dated, {advances} advances");
    let violations = commit_order::violations(&mut c, "fenced").unwrap();
    assert!(violations.is_empty(), "rows committed below the mark:\n{}", violations.join("\n"));
    // The fence works on: a token above every mark is admitted, and stale ones refused.
    let next: u64 = c.value("SELECT max(token) + 1000 FROM fenced").unwrap().unwrap().parse().unwrap();
    c.query(format!("INSERT INTO fenced VALUES ('r0', {next})")).unwrap();
    assert_eq!(c.query(format!("INSERT INTO fenced VALUES ('r0', {})", next - 1)).unwrap_err().code(), Some("FK001"));
}

#[test]
fn a_backend_killed_mid_transaction_and_an_immediate_stop_lose_no_mark_and_keep_the_commit_order() {
    let mut pg = Postgres::with_extension(&["track_commit_timestamp=on", "restart_after_crash=on"]).unwrap();
    pg.connect("postgres")
        .unwrap()
        .query(
        "CREATE TABLE fenced (resource text, token bigint);
         CREATE TRIGGER fence BEFORE INSERT ON fenced FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('resource', 'token')",
    )
    .unwrap();
    let counter = AtomicU64::new(1);

    // 1. SIGKILL a backend whose open transaction advanced r0 past every mark.
    let mut victim = pg.connect("postgres").unwrap();
    let victim_token = 1 << 40;
    let acked = under_load(&pg, &counter, || {
        victim.query(format!("BEGIN; INSERT INTO fenced VALUES ('r0', {victim_token})")).unwrap();
        kill(victim.backend_pid).unwrap();
    });
    assert!(victim.query("SELECT 1").is_err(), "the killed backend's connection is gone");
    pg.wait_ready(Duration::from_secs(120)).unwrap();
    assert!(pg.log().contains("terminated by signal 9"), "the postmaster saw the kill:\n{}", pg.log());
    recovered(&pg, &acked, 0, Some(victim_token));

    // 2. The whole server stopped with an immediate shutdown under load, and started again.
    let before = count(&pg);
    let postmaster = pg.process.child.id().to_string();
    let acked = under_load(&pg, &counter, || {
        let stopped = std::process::Command::new("kill").args(["-QUIT", &postmaster]).status().unwrap();
        assert!(stopped.success(), "kill -QUIT {postmaster}");
    });
    pg.restart().unwrap();
    recovered(&pg, &acked, before, None);
}

fn count(pg: &Postgres) -> u64 {
    let mut c = pg.connect("postgres").unwrap();
    c.value("SELECT count(*) FROM fenced").unwrap().unwrap().parse().unwrap()
}
