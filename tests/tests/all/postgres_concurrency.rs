//! Many connections racing on few resources in a real PostgreSQL.
//!
//! * Through `fencekeeper.admit`, each call its own transaction: the history of every
//!   resource (when each call started and returned, what it answered) is checked
//!   linearizable against a max-register, the final mark included (the harness's
//!   checker, shared with the library's concurrency test and the torture harness).
//! * Through the trigger, in transactions of several rows that stay open a while:
//!   no row commits after an advance of its resource past its token (commit times
//!   from the server, advances from the audit). This is what the `FOR SHARE` lock on
//!   a mark a write reuses is for.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::commit_order;
use fencekeeper_harness::max_register::{check, Answer, Op};
use fencekeeper_harness::pg_wire::Client;
use fencekeeper_harness::postgres::Postgres;
use fencekeeper_harness::rng::Rng;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const RESOURCES: usize = 3;
const CONNECTIONS: usize = 8;
const OPS: usize = 120;
const TRANSACTIONS: usize = 40;

/// What a writer presents next on `resource`: the last mark it saw (the holder
/// writing again, or by now a stale token), or a fresh token from the shared counter.
fn next_token(rng: &mut Rng, seen: &HashMap<usize, u64>, resource: usize, counter: &AtomicU64) -> u64 {
    match seen.get(&resource) {
        Some(mark) if rng.chance(1, 2) => *mark,
        _ => counter.fetch_add(1, Ordering::Relaxed),
    }
}

#[test]
fn racing_admits_on_few_resources_are_linearizable_against_a_max_register() {
    let pg = Postgres::with_extension(&[]).unwrap();
    let clock = Instant::now();
    let counter = Arc::new(AtomicU64::new(1));
    let history: Arc<Mutex<Vec<Vec<Op>>>> = Arc::new(Mutex::new(vec![Vec::new(); RESOURCES]));
    std::thread::scope(|scope| {
        for thread in 0..CONNECTIONS {
            let (counter, history) = (counter.clone(), history.clone());
            let mut client = pg.connect("postgres").unwrap();
            scope.spawn(move || {
                let mut rng = Rng::new(1, thread as u64);
                let mut seen = HashMap::new();
                for _ in 0..OPS {
                    let resource = rng.below(RESOURCES as u64) as usize;
                    let token = next_token(&mut rng, &seen, resource, &counter);
                    let start = clock.elapsed().as_nanos() as u64;
                    let answer = client.value(format!("SELECT fencekeeper.admit('race/{resource}', '{token}')"));
                    let end = clock.elapsed().as_nanos() as u64;
                    let answer = match answer {
                        Ok(Some(advanced)) => Answer::Admitted { advanced: Some(advanced == "t") },
                        Err(e) if e.code() == Some("FK001") => {
                            let detail = e.server().and_then(|s| s.detail.clone()).unwrap_or_default();
                            let mark = detail.strip_prefix("fencing-highest: ").unwrap().parse().unwrap();
                            Answer::Stale { mark }
                        }
                        other => panic!("admit {token} on race/{resource}: {other:?}"),
                    };
                    seen.insert(
                        resource,
                        match answer {
                            Answer::Stale { mark } => mark,
                            _ => token,
                        },
                    );
                    history.lock().unwrap()[resource].push(Op { token, answer, start, end });
                }
            });
        }
    });
    let mut c = pg.connect("postgres").unwrap();
    let history = history.lock().unwrap();
    for (resource, ops) in history.iter().enumerate() {
        let mark = c.value(format!("SELECT fencekeeper.mark('race/{resource}')")).unwrap().map(|m| m.parse().unwrap());
        let admitted = ops.iter().filter(|op| matches!(op.answer, Answer::Admitted { .. })).count();
        let stale = ops.iter().filter(|op| matches!(op.answer, Answer::Stale { .. })).count();
        assert!(admitted > 0 && stale > 0, "race/{resource}: {admitted} admitted, {stale} stale: no race");
        check(ops, Some(mark)).unwrap_or_else(|v| panic!("race/{resource}: {v}"));
    }
}

/// A writer on the trigger's table, `TRANSACTIONS` attempts: each transaction three
/// rows with one token, held open a moment. Returns how many committed.
fn write_rows(client: &mut Client, thread: usize, counter: &AtomicU64) -> usize {
    let mut rng = Rng::new(2, thread as u64);
    let mut seen = HashMap::new();
    let mut committed = 0;
    for _ in 0..TRANSACTIONS {
        let resource = rng.below(RESOURCES as u64) as usize;
        let token = next_token(&mut rng, &seen, resource, counter);
        let rows = (0..3).map(|i| format!("('rows/{resource}', {token}, {i})")).collect::<Vec<_>>().join(", ");
        let sql = format!("BEGIN; INSERT INTO fenced VALUES {rows}; SELECT pg_sleep(0.002); COMMIT");
        match client.query(sql) {
            Ok(_) => {
                committed += 1;
                seen.insert(resource, token);
            }
            Err(e) if e.code() == Some("FK001") => {
                client.query("ROLLBACK").unwrap();
                let detail = e.server().and_then(|s| s.detail.clone()).unwrap_or_default();
                seen.insert(resource, detail.strip_prefix("fencing-highest: ").unwrap().parse().unwrap());
            }
            Err(e) => panic!("{e}"),
        }
    }
    committed
}

#[test]
fn no_row_commits_after_an_advance_past_its_token() {
    let pg = Postgres::with_extension(&["track_commit_timestamp=on"]).unwrap();
    let mut c = pg.connect("postgres").unwrap();
    c.query(
        "CREATE TABLE fenced (resource text, token bigint, line int);
         CREATE TRIGGER fence BEFORE INSERT ON fenced FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('resource', 'token')",
    )
    .unwrap();
    let counter = AtomicU64::new(1);
    let committed: usize = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..CONNECTIONS)
            .map(|thread| {
                let mut client = pg.connect("postgres").unwrap();
                let counter = &counter;
                scope.spawn(move || write_rows(&mut client, thread, counter))
            })
            .collect();
        writers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let (rows, advances) = commit_order::coverage(&mut c, "fenced").unwrap();
    // Enough of both to have raced: about half the attempts advance or reuse a mark.
    assert!(committed > 40 && rows == 3 * committed as u64 && advances > 20, "{committed} {rows} {advances}");
    let violations = commit_order::violations(&mut c, "fenced").unwrap();
    assert!(violations.is_empty(), "{} rows committed below the mark:\n{}", violations.len(), violations.join("\n"));
}
