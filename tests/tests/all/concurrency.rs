//! Concurrent admits through one guard are linearizable against a max-register.
//!
//! Many threads admit rising and falling tokens on a few resources. Each admit is
//! stamped from one global sequence just before the call and just after it returns,
//! so "A returned before B was called" is `A.end < B.start`. The history, not just the
//! final mark, is then checked: it is linearizable against a max-register exactly when
//! (per resource) ordering the operations by the value they saw (the admitted token,
//! or the mark a refusal reported) respects real time, each value is advanced to by
//! one admit that nothing else on that value wholly precedes, and refusals report a
//! value some admit wrote. The checker (`fencekeeper_harness::max_register`, shared with
//! the torture harness) is tested against broken histories there.

// A test states its expectations by panicking.
#![allow(clippy::panic)]

use fencekeeper::store::FileStore;
use fencekeeper::validator::Validator;
use fencekeeper::{Decider, Guard, MarkStore, MemoryStore, Mode, Policy, Verdict};
use fencekeeper_harness::max_register::{self, Answer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const THREADS: usize = 8;
const RESOURCES: usize = 3;

/// One admit on a resource, stamped with the global sequence before the call and
/// after the return.
#[derive(Clone, Copy, Debug)]
struct Op {
    resource: usize,
    op: max_register::Op,
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
    record_history_through(&[guard], ops_per_thread, seed, MIXED, false)
}

/// How the lock clients choose their tokens, out of four draws: fresh (rising), the
/// one held (equal), or an older one (falling); the rest of the four is equal.
#[derive(Clone, Copy)]
struct Mix {
    rising: u64,
    falling: u64,
    /// The share of draws out of which `rising` and `falling` are taken.
    of: u64,
    /// An equal draw writes with the newest token issued for the resource (a holder
    /// with several writes in flight), not the one this thread last took.
    newest: bool,
}

/// Half rising, a quarter each equal and falling.
const MIXED: Mix = Mix { rising: 2, falling: 1, of: 4, newest: false };

/// [`record_history`] with thread `t` admitting through `guards[t % len]`: several
/// hosts in front of one store. When `awaited`, every odd thread awaits its admits
/// ([`Guard::admit_async`]) on a tokio runtime of its own, as the gateway does.
fn record_history_through(guards: &[&Guard], ops_per_thread: usize, seed: u64, mix: Mix, awaited: bool) -> Vec<Op> {
    let clock = AtomicU64::new(0);
    let lock_service: Vec<AtomicU64> = (0..RESOURCES).map(|_| AtomicU64::new(1)).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (clock, lock_service) = (&clock, &lock_service);
                let guard = guards[t % guards.len()];
                s.spawn(move || {
                    let runtime = (awaited && t % 2 == 1).then(|| {
                        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
                    });
                    let mut rng = Rng(seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t as u64 + 1)));
                    let mut held = [0u64; RESOURCES];
                    let mut ops = Vec::with_capacity(ops_per_thread);
                    for _ in 0..ops_per_thread {
                        let r = rng.below(RESOURCES as u64) as usize;
                        let draw = rng.below(mix.of);
                        let token = if draw < mix.rising {
                            held[r] = lock_service[r].fetch_add(1, Ordering::SeqCst);
                            held[r]
                        } else if draw < mix.rising + mix.falling {
                            held[r].saturating_sub(1 + rng.below(8))
                        } else if mix.newest {
                            lock_service[r].load(Ordering::SeqCst).saturating_sub(1)
                        } else {
                            held[r]
                        };
                        let start = clock.fetch_add(1, Ordering::SeqCst);
                        let (resource, token_text) = (resource_name(r), token.to_string());
                        let decision = match &runtime {
                            Some(runtime) => runtime.block_on(guard.admit_async(&resource, Some(&token_text))),
                            None => guard.admit(&resource, Some(&token_text)),
                        };
                        let end = clock.fetch_add(1, Ordering::SeqCst);
                        let answer = match decision.verdict {
                            Some(Verdict::Admit { mark, advanced }) => {
                                assert_eq!(mark.parts(), &[token], "an admit must carry the presented token");
                                Answer::Admitted { advanced: Some(advanced) }
                            }
                            Some(Verdict::Stale { mark, .. }) => Answer::Stale { mark: mark.parts()[0] },
                            other => panic!("admit of {token} on {r}: unexpected {other:?} ({:?})", decision.undecided),
                        };
                        ops.push(Op { resource: r, op: max_register::Op { token, answer, start, end } });
                    }
                    ops
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("worker thread")).collect()
    })
}

fn check_history(guard: &Guard, ops: &[Op]) {
    for r in 0..RESOURCES {
        let mine: Vec<max_register::Op> = ops.iter().filter(|op| op.resource == r).map(|op| op.op).collect();
        let final_mark = guard.mark(&resource_name(r)).expect("read the final mark").map(|t| t.parts()[0]);
        if let Err(e) = max_register::check(&mine, Some(final_mark)) {
            panic!("resource {r}: history of {} admits is not linearizable: {e}", mine.len());
        }
    }
    let refused = ops.iter().filter(|op| matches!(op.op.answer, Answer::Stale { .. })).count();
    let advanced = ops.iter().filter(|op| op.op.answer == Answer::Admitted { advanced: Some(true) }).count();
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

/// A guard on a store of its own (its own copy of the marks) on `etcd`, as a gateway.
fn etcd_guard(etcd: &fencekeeper_harness::services::Etcd) -> Guard {
    let store = fencekeeper::store::EtcdStore::connect(&etcd.url()).expect("connect to etcd");
    Guard::new(wasm_validator(), Arc::new(store))
}

/// [`etcd_guard`] whose store's connection is driven by `runtime` rather than by a
/// thread of its own, as the gateway's is.
fn etcd_guard_on(etcd: &fencekeeper_harness::services::Etcd, runtime: &tokio::runtime::Runtime) -> Guard {
    let options = fencekeeper::etcd::EtcdOptions { runtime: Some(runtime.handle().clone()), ..Default::default() };
    let store =
        fencekeeper::store::EtcdStore::connect_with(&etcd.url(), fencekeeper::store::ETCD_DEFAULT_PREFIX, &options)
            .expect("connect to etcd");
    Guard::new(wasm_validator(), Arc::new(store))
}

/// Two gateways' stores on one real etcd, each deciding first on its own copy of the
/// marks (one round trip per admit), so their copies are often behind each other: the
/// history must still be linearizable, because every answer rests on an etcd
/// operation (a compare-and-swap, a compare, or a read before a refusal).
#[test]
fn concurrent_admits_through_two_etcd_stores_with_their_copies_are_linearizable() {
    let etcd = fencekeeper_harness::services::Etcd::start().expect("start etcd");
    let (a, b) = (etcd_guard(&etcd), etcd_guard(&etcd));
    let ops = record_history_through(&[&a, &b], 150, 0x5EED_0003, MIXED, false);
    check_history(&a, &ops);
}

/// Holders writing again with the token they hold: their confirms of one resource
/// queue behind the etcd Txn in flight and share the next one (the store's batched
/// confirms). Advances land in between, through the other store too. A confirm
/// answered by a Txn that began before it arrived would show here as an equal token
/// admitted after a higher one was: not linearizable. Half the threads await their
/// admits, as the gateway does, so a batch holds both kinds of caller; the other
/// store's connection is driven by a runtime it was given, as the gateway's is.
#[test]
fn batched_confirms_on_etcd_stay_linearizable() {
    let etcd = fencekeeper_harness::services::Etcd::start().expect("start etcd");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let (a, b) = (etcd_guard(&etcd), etcd_guard_on(&etcd, &runtime));
    let mix = Mix { rising: 3, falling: 2, of: 10, newest: true };
    let ops = record_history_through(&[&a, &a, &a, &b], 250, 0x5EED_0004, mix, true);
    check_history(&a, &ops);
    let repeated = ops.iter().filter(|op| op.op.answer == Answer::Admitted { advanced: Some(false) }).count();
    assert!(repeated > ops.len() / 5, "only {repeated} of {} admits repeated the mark", ops.len());
}

/// The gateway awaits admits over etcd on its request tasks: they must never block
/// the thread. Here sixteen holders and advancers share one thread (a current-thread
/// runtime). Awaited, the holders' confirms wait together and share etcd Txns; an
/// admit that blocked the thread on the store would run every confirm alone, one
/// Txn each, which etcd's own count of Txns shows.
#[test]
fn awaited_admits_on_etcd_share_one_thread_without_blocking_it() {
    let etcd = fencekeeper_harness::services::Etcd::start().expect("start etcd");
    let guard = Arc::new(etcd_guard(&etcd));
    assert!(guard.awaits(), "an etcd store without a provenance check is awaited");
    let file = tempfile::tempdir().expect("a directory");
    let store = FileStore::open(file.path().join("marks")).expect("a file store");
    assert!(!Guard::new(wasm_validator(), Arc::new(store)).awaits(), "a file store's commit blocks");
    assert!(guard.admit("one", Some("1")).admitted());
    let txns_before = etcd_txns(&etcd);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let (admitted, advanced) = runtime.block_on(async {
        let tasks: Vec<_> = (0..16u64)
            .map(|t| {
                let guard = guard.clone();
                tokio::spawn(async move {
                    let (mut admitted, mut advanced) = (0, 0);
                    for i in 0..25u64 {
                        // Most write again at the mark; every fourth task advances its own.
                        let (resource, token) =
                            if t % 4 == 0 { (format!("own/{t}"), i + 1) } else { ("one".to_owned(), 1) };
                        let decision = guard.admit_async(&resource, Some(&token.to_string())).await;
                        admitted += usize::from(decision.admitted());
                        advanced += usize::from(decision.advance.is_some());
                    }
                    (admitted, advanced)
                })
            })
            .collect();
        let mut sums = (0, 0);
        for task in tasks {
            let (a, v) = tokio::time::timeout(std::time::Duration::from_secs(60), task)
                .await
                .expect("an awaited admit blocked the runtime's only thread")
                .expect("the task");
            sums = (sums.0 + a, sums.1 + v);
        }
        sums
    });
    assert_eq!((admitted, advanced), (400, 100), "every write admitted, every advance made");
    assert_eq!(guard.mark("own/4").expect("read"), fencekeeper::Token::parse("25").ok());

    // etcd's provenance check is awaited too: a token above every revision etcd has
    // issued is refused as unverified, an issued one admitted.
    let store = fencekeeper::store::EtcdStore::connect(&etcd.url()).expect("connect to etcd");
    let weak = fencekeeper::provenance::EtcdProvenance::sharing(&store, fencekeeper::provenance::EtcdCheck::Weak);
    let vouched = Guard::new(wasm_validator(), Arc::new(store)).with_provenance(Arc::new(weak));
    assert!(vouched.awaits(), "an etcd store and etcd's provenance check are both awaited");
    let forged = runtime.block_on(vouched.admit_async("vouched", Some("18446744073709551615")));
    assert_eq!(forged.class(), fencekeeper::Class::Unverified, "{}", forged.reason("vouched"));
    assert!(runtime.block_on(vouched.admit_async("vouched", Some("2"))).admitted());
    // 100 advances and 300 confirms: one Txn each if nothing waited together.
    let txns = etcd_txns(&etcd) - txns_before;
    assert!(txns < 300, "{txns} etcd Txns for 100 advances and 300 confirms: the confirms did not share Txns");
}

/// The Txns etcd has answered, from its metrics.
fn etcd_txns(etcd: &fencekeeper_harness::services::Etcd) -> u64 {
    let (status, body) =
        fencekeeper_harness::services::http(etcd.client, "GET", "/metrics", &[], b"").expect("metrics");
    assert_eq!(status, 200);
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{") && l.contains("grpc_method=\"Txn\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
