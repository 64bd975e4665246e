//! Many clients racing fenced writes on a few resources, through one real
//! redis-server with the module: each resource's history of answers (admitted, or
//! stale with the mark reported) is checked linearizable against a max-register
//! (`fencekeeper_harness::max_register`, the checker of the library's concurrency
//! test and the torture run), and each resource's data is the write of its final
//! mark's token: the check and the write were one step.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::max_register::{self, Answer, Op};
use fencekeeper_harness::redis::Redis;
use fencekeeper_harness::resp::Reply;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Instant;

const CLIENTS: usize = 16;
const RESOURCES: usize = 4;
const WRITES_PER_CLIENT: usize = 400;

#[test]
fn racing_clients_leave_a_linearizable_history_and_the_data_of_the_final_mark() {
    let redis = Redis::with_module(&[], &["--save", "", "--appendonly", "no"]).unwrap();
    let origin = Instant::now();
    let stamp = || u64::try_from(origin.elapsed().as_nanos()).unwrap();
    // The lock service: each resource's next token.
    let issued: Vec<AtomicU64> = (0..RESOURCES).map(|_| AtomicU64::new(1)).collect();
    let histories: Vec<Vec<(usize, Op)>> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|n| {
                let (issued, stamp) = (&issued, &stamp);
                let mut c = redis.client().unwrap();
                s.spawn(move || {
                    let mut held = [0u64; RESOURCES];
                    let mut ops = Vec::with_capacity(WRITES_PER_CLIENT);
                    for i in 0..WRITES_PER_CLIENT {
                        // Clients walk the resources and the kinds of write in
                        // different orders; the races come from running at once.
                        let r = (n + i) % RESOURCES;
                        // Half take a new token, a quarter write again, a quarter are late.
                        let token = match (n + i / RESOURCES) % 4 {
                            0 | 1 => {
                                held[r] = issued[r].fetch_add(1, SeqCst);
                                held[r]
                            }
                            2 => held[r].max(1),
                            _ => held[r].saturating_sub(1 + (i % 8) as u64).max(1),
                        };
                        let text = token.to_string();
                        let start = stamp();
                        let reply = c.cmd(&["FENCE.SET", &format!("data:{r}"), &format!("fence:{r}"), &text, &text]);
                        let end = stamp();
                        let answer = match reply.unwrap() {
                            Reply::Status(s) if s == "OK" => Answer::Admitted { advanced: None },
                            Reply::Error(e) if e.starts_with("STALE ") => {
                                Answer::Stale { mark: e.split(' ').nth(1).unwrap().parse().unwrap() }
                            }
                            other => panic!("client {n}, token {token} on {r}: {other:?}"),
                        };
                        ops.push((r, Op { token, answer, start, end }));
                    }
                    ops
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let ops: Vec<(usize, Op)> = histories.into_iter().flatten().collect();
    let mut c = redis.client().unwrap();
    for r in 0..RESOURCES {
        let mine: Vec<Op> = ops.iter().filter(|(of, _)| *of == r).map(|(_, op)| *op).collect();
        let mark = c.cmd(&["FENCE.MARK", &format!("fence:{r}")]).unwrap().text().map(|m| m.parse::<u64>().unwrap());
        if let Err(e) = max_register::check(&mine, Some(mark)) {
            panic!("resource {r}: the history of {} writes is not linearizable: {e}", mine.len());
        }
        let data = c.cmd(&["GET", &format!("data:{r}")]).unwrap().text();
        assert_eq!(data, mark.map(|m| m.to_string()), "resource {r}: the data is the final mark's write");
    }
    let refused = ops.iter().filter(|(_, op)| matches!(op.answer, Answer::Stale { .. })).count();
    assert!(refused > ops.len() / 10 && refused < ops.len() * 9 / 10, "refused {refused} of {}", ops.len());
}
