//! Concurrent admits through one guard are linearizable against a max-register.
//!
//! Many threads admit rising and falling tokens on a few resources. Each admit is
//! stamped from one global sequence just before the call and just after it returns,
//! so "A returned before B was called" is `A.end < B.start`. The history, not just the
//! final mark, is then checked: it is linearizable against a max-register exactly when
//! (per resource) ordering the operations by the value they saw (the admitted token,
//! or the mark a refusal reported) respects real time, each value is advanced to by
//! one admit that nothing else on that value wholly precedes, and refusals report a
//! value some admit wrote. The checker is tested against broken histories too.

// A test states its expectations by panicking.
#![allow(clippy::panic)]

use fencekeeper::store::FileStore;
use fencekeeper::validator::Validator;
use fencekeeper::{Decider, Guard, MarkStore, MemoryStore, Mode, Policy, Verdict};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const THREADS: usize = 8;
const RESOURCES: usize = 3;

/// What one admit answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Admitted { advanced: bool },
    Stale { mark: u64 },
}

/// One admit, stamped with the global sequence before the call and after the return.
#[derive(Clone, Copy, Debug)]
struct Op {
    resource: usize,
    token: u64,
    answer: Answer,
    start: u64,
    end: u64,
}

impl Op {
    /// The register's value at the op's linearization point.
    fn value(&self) -> u64 {
        match self.answer {
            Answer::Admitted { .. } => self.token,
            Answer::Stale { mark } => mark,
        }
    }
}

/// A small deterministic generator (xorshift64*): reproducible histories per seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn resource_name(r: usize) -> String {
    format!("shard/{r}")
}

/// Run `ops_per_thread` admits on each of [`THREADS`] threads through one guard. Each
/// thread plays a lock client: it acquires fresh tokens from a shared counter per
/// resource (rising), writes again with the token it holds (equal), or wakes from a
/// pause and writes with an older one (falling).
fn record_history(guard: &Guard, ops_per_thread: usize, seed: u64) -> Vec<Op> {
    record_history_through(&[guard], ops_per_thread, seed)
}

/// [`record_history`] with thread `t` admitting through `guards[t % len]`: several
/// hosts in front of one store.
fn record_history_through(guards: &[&Guard], ops_per_thread: usize, seed: u64) -> Vec<Op> {
    let clock = AtomicU64::new(0);
    let lock_service: Vec<AtomicU64> = (0..RESOURCES).map(|_| AtomicU64::new(1)).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (clock, lock_service) = (&clock, &lock_service);
                let guard = guards[t % guards.len()];
                s.spawn(move || {
                    let mut rng = Rng(seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t as u64 + 1)));
                    let mut held = [0u64; RESOURCES];
                    let mut ops = Vec::with_capacity(ops_per_thread);
                    for _ in 0..ops_per_thread {
                        let r = rng.below(RESOURCES as u64) as usize;
                        let token = match rng.below(4) {
                            0 | 1 => {
                                held[r] = lock_service[r].fetch_add(1, Ordering::SeqCst);
                                held[r]
                            }
                            2 => held[r],
                            _ => held[r].saturating_sub(1 + rng.below(8)),
                        };
                        let start = clock.fetch_add(1, Ordering::SeqCst);
                        let decision = guard.admit(&resource_name(r), Some(&token.to_string()));
                        let end = clock.fetch_add(1, Ordering::SeqCst);
                        let answer = match decision.verdict {
                            Some(Verdict::Admit { mark, advanced }) => {
                                assert_eq!(mark.parts(), &[token], "an admit must carry the presented token");
                                Answer::Admitted { advanced }
                            }
                            Some(Verdict::Stale { mark, .. }) => Answer::Stale { mark: mark.parts()[0] },
                            other => panic!("admit of {token} on {r}: unexpected {other:?} ({:?})", decision.undecided),
                        };
                        ops.push(Op { resource: r, token, answer, start, end });
                    }
                    ops
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("worker thread")).collect()
    })
}

/// Check one resource's history against a max-register starting empty; `final_mark`
/// is the store's mark after the run. Returns what is wrong, if anything.
fn check_max_register(ops: &[Op], final_mark: Option<u64>) -> Result<(), String> {
    let mut advancing: HashMap<u64, &Op> = HashMap::new();
    for op in ops {
        match op.answer {
            Answer::Stale { mark } if op.token >= mark => {
                return Err(format!("{op:?}: refused as stale below its mark"))
            }
            Answer::Admitted { advanced: true } => {
                if let Some(other) = advancing.insert(op.token, op) {
                    return Err(format!("{op:?} and {other:?} both advanced to the same token"));
                }
            }
            _ => {}
        }
    }
    for op in ops {
        let Some(first) = advancing.get(&op.value()) else {
            return Err(format!("{op:?} saw value {} that no admit advanced to", op.value()));
        };
        if op.end < first.start {
            return Err(format!("{op:?} returned before {first:?}, the admit that set its value, began"));
        }
    }
    // Real time: an op that returned before another was called saw no higher value.
    let mut by_end: Vec<&Op> = ops.iter().collect();
    by_end.sort_by_key(|op| op.end);
    let mut by_start: Vec<&Op> = ops.iter().collect();
    by_start.sort_by_key(|op| op.start);
    let (mut done, mut highest): (usize, Option<&Op>) = (0, None);
    for op in by_start {
        while done < by_end.len() && by_end[done].end < op.start {
            if highest.is_none_or(|h| by_end[done].value() > h.value()) {
                highest = Some(by_end[done]);
            }
            done += 1;
        }
        if let Some(h) = highest.filter(|h| h.value() > op.value()) {
            return Err(format!("{op:?} saw {} although {h:?} had already returned with {}", op.value(), h.value()));
        }
    }
    let max_admitted = advancing.keys().max().copied();
    if final_mark != max_admitted {
        return Err(format!("final mark {final_mark:?} is not the highest admitted token {max_admitted:?}"));
    }
    Ok(())
}

fn check_history(guard: &Guard, ops: &[Op]) {
    for r in 0..RESOURCES {
        let mine: Vec<Op> = ops.iter().filter(|op| op.resource == r).copied().collect();
        let final_mark = guard.mark(&resource_name(r)).expect("read the final mark").map(|t| t.parts()[0]);
        if let Err(e) = check_max_register(&mine, final_mark) {
            panic!("resource {r}: history of {} admits is not linearizable: {e}", mine.len());
        }
    }
    let refused = ops.iter().filter(|op| matches!(op.answer, Answer::Stale { .. })).count();
    let advanced = ops.iter().filter(|op| op.answer == Answer::Admitted { advanced: true }).count();
    // The history must exercise every path, or the check proves little.
    assert!(
        refused > ops.len() / 10 && advanced > ops.len() / 10,
        "refused {refused}, advanced {advanced} of {}",
        ops.len()
    );
}

/// The bundled wasm validator (or the fresh build in `FENCEKEEPER_GUEST_DIR`).
fn wasm_validator() -> Arc<dyn Decider> {
    Arc::new(Validator::bundled(Policy { mode: Mode::Correctness, strict: false }).expect("load the wasm validator"))
}

#[test]
fn concurrent_admits_through_wasm_and_memory_store_are_linearizable() {
    let guard = Guard::new(wasm_validator(), Arc::new(MemoryStore::new()));
    let ops = record_history(&guard, 2_000, 0x5EED_0001);
    check_history(&guard, &ops);
}

#[test]
fn concurrent_admits_through_wasm_and_file_store_are_linearizable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = FileStore::open(dir.path().join("marks.redb")).expect("open the file store");
    let store: Arc<dyn MarkStore + Send + Sync> = Arc::new(store);
    let guard = Guard::new(wasm_validator(), store);
    // Every advance is an fsync'd transaction: fewer ops keep the test quick.
    let ops = record_history(&guard, 400, 0x5EED_0002);
    check_history(&guard, &ops);
}

/// Two gateways' stores on one real etcd, each deciding first on its own copy of the
/// marks (one round trip per admit), so their copies are often behind each other: the
/// history must still be linearizable, because every answer rests on an etcd
/// operation (a compare-and-swap, a compare, or a read before a refusal).
#[test]
fn concurrent_admits_through_two_etcd_stores_with_their_copies_are_linearizable() {
    let etcd = fencekeeper_harness::services::Etcd::start().expect("start etcd");
    let store = || -> Arc<dyn MarkStore + Send + Sync> {
        Arc::new(fencekeeper::store::EtcdStore::connect(&etcd.url()).expect("connect to etcd"))
    };
    let (a, b) = (Guard::new(wasm_validator(), store()), Guard::new(wasm_validator(), store()));
    let ops = record_history_through(&[&a, &b], 150, 0x5EED_0003);
    check_history(&a, &ops);
}

mod checker {
    //! The checker must reject histories a max-register cannot produce.
    use super::*;

    fn op(token: u64, answer: Answer, start: u64, end: u64) -> Op {
        Op { resource: 0, token, answer, start, end }
    }
    const ADV: Answer = Answer::Admitted { advanced: true };
    const SAME: Answer = Answer::Admitted { advanced: false };

    #[test]
    fn accepts_a_sequential_history() {
        let h = [op(33, ADV, 0, 1), op(34, ADV, 2, 3), op(33, Answer::Stale { mark: 34 }, 4, 5), op(34, SAME, 6, 7)];
        assert_eq!(check_max_register(&h, Some(34)), Ok(()));
    }

    #[test]
    fn accepts_overlapping_admits_in_either_order() {
        // 34 and 33 overlap: 33 may linearize first and advance too.
        let h = [op(34, ADV, 0, 5), op(33, ADV, 1, 2)];
        assert_eq!(check_max_register(&h, Some(34)), Ok(()));
    }

    #[test]
    fn rejects_a_lower_admit_after_a_higher_one_returned() {
        let h = [op(34, ADV, 0, 1), op(33, ADV, 2, 3)];
        assert!(check_max_register(&h, Some(34)).is_err());
    }

    #[test]
    fn rejects_a_refusal_reporting_a_mark_lower_than_an_earlier_admit() {
        let h = [op(33, ADV, 0, 1), op(35, ADV, 2, 3), op(30, Answer::Stale { mark: 33 }, 4, 5)];
        assert!(check_max_register(&h, Some(35)).is_err());
    }

    #[test]
    fn rejects_a_refusal_citing_a_mark_nobody_wrote_yet() {
        let h = [op(30, Answer::Stale { mark: 33 }, 0, 1), op(33, ADV, 2, 3)];
        assert!(check_max_register(&h, Some(33)).is_err());
    }

    #[test]
    fn rejects_two_advances_to_one_token_and_a_wrong_final_mark() {
        assert!(check_max_register(&[op(33, ADV, 0, 3), op(33, ADV, 1, 2)], Some(33)).is_err());
        assert!(check_max_register(&[op(33, ADV, 0, 1)], Some(32)).is_err());
        assert!(check_max_register(&[op(33, SAME, 0, 1)], Some(33)).is_err());
    }
}
