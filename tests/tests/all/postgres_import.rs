//! The seed's import story inside PostgreSQL, with real processes: two importers
//! (`fencekeeper-pg-importer`) take turns on one etcd lock through `fencekeeper lock
//! --etcd`, each inserting a batch's lines with its lock's token in the row. Importer
//! A is frozen (SIGSTOP, client and worker) mid-import, past its 2 s lease; B acquires,
//! resumes after A's last line and finishes the batch; A is resumed and, not knowing
//! it lost the lock, goes on with the lines it still counts as its own, then amends
//! each of them with an UPDATE that leaves the token column as it is (the row's
//! token is then B's, or A's own stale one, never a token A sent with the UPDATE).
//!
//! With the `fencekeeper.fence` trigger on the table, every late line of A's is
//! refused (FK001), every amend too (FK003: no token presented), and the batch holds
//! each line once, as B wrote it. The control, the same story on a table without
//! the trigger, imports the late lines twice and A's amends rewrite B's lines.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::holder::{fencekeeper_lock, token, Holder, ACQUIRE_WITHIN};
use fencekeeper_harness::postgres::{Postgres, USER};
use fencekeeper_harness::services::Etcd;
use fencekeeper_harness::workspace_bin;
use std::process::Command;
use std::time::{Duration, Instant};

const LINES: u32 = 24;
const A_WRITES_FIRST: u32 = 8;

struct Story {
    /// A's late lines: how each was answered (201 inserted, 409 refused).
    late: Vec<u16>,
    /// A's amends: how each was answered (201 updated, 428 refused as missing).
    amends: Vec<u16>,
    /// Rows that say B imported them.
    by_b: u64,
    /// Rows in the batch, and distinct lines among them.
    rows: u64,
    lines: u64,
}

/// `fencekeeper lock --etcd E --ttl 2 [--on-loss none] NAME -- importer ...`.
fn importer(etcd: &Etcd, pg: &Postgres, table: &str, name: &str, pause_after: u32, keeps_going: bool) -> Command {
    let etcd = etcd.client.to_string();
    let mut lock = vec!["--etcd", &etcd, "--ttl", "2"];
    if keeps_going {
        // A worker that does not hear about the loss: the paused holder of the story.
        lock.extend(["--on-loss", "none"]);
    }
    lock.push("/locks/import");
    let pause = pause_after.to_string();
    let lines = LINES.to_string();
    let addr = pg.addr.to_string();
    let worker = [
        workspace_bin("fencekeeper-pg-importer").unwrap().display().to_string(),
        "--postgres".into(),
        addr,
        "--user".into(),
        USER.into(),
        "--table".into(),
        table.into(),
        "--batch".into(),
        "orders/2026-11.csv".into(),
        "--lines".into(),
        lines,
        "--pause-after".into(),
        pause,
    ];
    // The paused holder of the story goes on to amend its lines.
    let worker: Vec<String> =
        worker.into_iter().chain(keeps_going.then(|| "--amend".into())).chain([name.into()]).collect();
    fencekeeper_lock(&lock, &worker).unwrap()
}

fn story(table: &str) -> Story {
    let etcd = Etcd::start().unwrap();
    let pg = Postgres::with_extension(&[]).unwrap();
    let mut c = pg.connect("postgres").unwrap();
    c.query(
        "CREATE TABLE fenced (batch text, line int, importer text, token bigint);
         CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON fenced
             FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('batch', 'token');
         CREATE TABLE unfenced (batch text, line int, importer text, token bigint)",
    )
    .unwrap();
    let mut a = Holder::start("A", importer(&etcd, &pg, table, "A", A_WRITES_FIRST, true), ACQUIRE_WITHIN).unwrap();
    for _ in 0..A_WRITES_FIRST {
        assert_eq!(a.wrote().unwrap(), 201, "A holds the lock");
    }
    a.freeze().unwrap();
    let frozen = Instant::now();
    let mut b = Holder::start("B", importer(&etcd, &pg, table, "B", LINES, false), ACQUIRE_WITHIN).unwrap();
    assert!(frozen.elapsed() >= Duration::from_secs(1), "B acquired while A's lease held");
    assert!(token(&b.token).unwrap() > token(&a.token).unwrap());
    for _ in A_WRITES_FIRST..LINES {
        assert_eq!(b.wrote().unwrap(), 201, "B imports the rest; {}", b.stderr());
    }
    assert!(b.exit().unwrap().success(), "{}", b.stderr());
    a.thaw().unwrap();
    a.go().unwrap();
    let late = (A_WRITES_FIRST..LINES).map(|_| a.wrote().unwrap()).collect();
    let amends = (0..LINES).map(|_| a.wrote().unwrap()).collect();
    a.exit().unwrap();
    let count = |c: &mut fencekeeper_harness::pg_wire::Client, sql: String| -> u64 {
        c.value(sql).unwrap().unwrap().parse().unwrap()
    };
    let rows = count(&mut c, format!("SELECT count(*) FROM {table}"));
    let lines = count(&mut c, format!("SELECT count(DISTINCT line) FROM {table}"));
    let by_b = count(&mut c, format!("SELECT count(*) FROM {table} WHERE importer = 'B'"));
    Story { late, amends, by_b, rows, lines }
}

#[test]
fn a_paused_importer_s_rows_are_refused_and_the_batch_has_no_duplicate() {
    let story = story("fenced");
    assert!(story.late.iter().all(|status| *status == 409), "A's late lines: {:?}", story.late);
    assert_eq!((story.rows, story.lines), (u64::from(LINES), u64::from(LINES)), "each line once");
    assert!(story.amends.iter().all(|status| *status == 428), "A's amends without a token: {:?}", story.amends);
    assert_eq!(story.by_b, u64::from(LINES - A_WRITES_FIRST), "B's lines are as B wrote them");
}

#[test]
fn without_the_trigger_the_paused_importer_imports_its_lines_twice() {
    let story = story("unfenced");
    assert!(story.late.iter().all(|status| *status == 201), "A's late lines: {:?}", story.late);
    assert_eq!(story.lines, u64::from(LINES));
    assert_eq!(story.rows - story.lines, u64::from(LINES - A_WRITES_FIRST), "the duplicates appear");
    assert!(story.amends.iter().all(|status| *status == 201), "A's amends: {:?}", story.amends);
    assert_eq!(story.by_b, 0, "A's amends rewrote B's lines");
}
