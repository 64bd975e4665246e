//! Retention (`fencekeeper::store::Retention`) against a max-register model: random
//! admits, compactions and passing time on the memory and file stores. Whatever a
//! compaction forgets, no token below a resource's highest admitted one is ever
//! admitted again; a refusal is only ever for a token below the resource's mark or,
//! where it has none, below the floor (and then names retention); a token at or above
//! both is always admitted. The etcd store runs the same model against a real etcd in
//! tests/tests/all/e2e_retention.rs.

#![allow(clippy::unwrap_used)]

use fencekeeper::store::{Compaction, Retention};
use fencekeeper::{FileStore, Guard, MarkStore, MemoryStore, NativeDecider, Token};
use fencekeeper_core::{Mode, Policy};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
enum Step {
    Admit { resource: u8, token: u64 },
    Compact { idle_for: u64 },
    Tick { secs: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..5, 1u64..60).prop_map(|(resource, token)| Step::Admit { resource, token }),
        1 => (0u64..3).prop_map(|idle_for| Step::Compact { idle_for }),
        1 => (0u64..3).prop_map(|secs| Step::Tick { secs }),
    ]
}

/// Run `steps` against `store` and the model; an error names the first broken rule.
fn run<S: Retention + Send + Sync + 'static>(store: Arc<S>, steps: &[Step]) -> Result<(), String> {
    let guard = Guard::new(Arc::new(NativeDecider(Policy { mode: Mode::Correctness, strict: false })), store.clone());
    let mut highest: HashMap<String, Token> = HashMap::new();
    let mut floor: Option<Token> = None;
    let mut now = 1_000_000u64;
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Admit { resource, token } => {
                let (resource, token) = (format!("r{resource}"), Token::parse(&token.to_string()).unwrap());
                let mark = store.get(&resource).map_err(|e| e.to_string())?;
                let decision = guard.admit(&resource, Some(&token.to_string()));
                let below = |bound: Option<&Token>| bound.is_some_and(|b| token < *b);
                let held_to = mark.or(floor);
                if decision.admitted() {
                    if below(highest.get(&resource)) {
                        return Err(format!("step {i}: {token} admitted on {resource} after {:?}", highest[&resource]));
                    }
                    highest.insert(resource, token);
                } else {
                    if !below(held_to.as_ref()) {
                        return Err(format!(
                            "step {i}: {token} refused on {resource} at or above its mark {mark:?} and the floor \
                             {floor:?}: {}",
                            decision.reason(&resource)
                        ));
                    }
                    let names_retention = decision.reason(&resource).contains("retention floor");
                    if names_retention != mark.is_none() {
                        return Err(format!("step {i}: {}", decision.reason(&resource)));
                    }
                }
            }
            Step::Compact { idle_for } => {
                let Compaction { forgotten, floor_before, floor: after, .. } =
                    store.compact(Duration::from_secs(idle_for), now).map_err(|e| e.to_string())?;
                if floor_before != floor || after.is_some_and(|a| floor.is_some_and(|f| a < f)) {
                    return Err(format!("step {i}: the floor went from {floor:?} to {floor_before:?} / {after:?}"));
                }
                for (resource, mark) in &forgotten {
                    if after.is_none_or(|a| a < *mark) || highest.get(resource) != Some(mark) {
                        return Err(format!("step {i}: forgot {resource}'s {mark} under the floor {after:?}"));
                    }
                    if store.get(resource).map_err(|e| e.to_string())?.is_some() {
                        return Err(format!("step {i}: {resource} forgotten but still has a mark"));
                    }
                }
                floor = after;
            }
            Step::Tick { secs } => now += secs,
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_memory_store_never_admits_below_a_forgotten_mark(steps in proptest::collection::vec(step(), 1..80)) {
        run(Arc::new(MemoryStore::new()), &steps).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    // Every advance is an fsync'd commit: fewer cases.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_file_store_never_admits_below_a_forgotten_mark(steps in proptest::collection::vec(step(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        run(Arc::new(FileStore::open(dir.path().join("marks.redb")).unwrap()), &steps)
            .map_err(TestCaseError::fail)?;
    }
}

/// Time, not compactions, makes a mark idle: a mark that rose since the last
/// compaction is kept, one unchanged for the idle time is forgotten.
#[test]
fn only_a_mark_unchanged_for_the_idle_time_is_forgotten() {
    for store in stores() {
        let guard =
            Guard::new(Arc::new(NativeDecider(Policy { mode: Mode::Correctness, strict: false })), store.clone());
        assert!(guard.admit("old", Some("10")).admitted());
        assert!(guard.admit("busy", Some("11")).admitted());
        let first = store.compact(Duration::from_secs(60), 1000).unwrap();
        assert_eq!((first.forgotten.len(), first.kept, first.floor), (0, 2, None), "seen for the first time");
        assert!(guard.admit("busy", Some("12")).admitted());
        let second = store.compact(Duration::from_secs(60), 1060).unwrap();
        assert_eq!(second.forgotten, vec![("old".to_owned(), Token::parse("10").unwrap())]);
        assert_eq!((second.kept, second.floor), (1, Token::parse("10").ok()));
        assert_eq!(store.get("busy").unwrap(), Token::parse("12").ok(), "it rose since: kept");
        // A first mark below the floor is refused, naming retention; at it, admitted.
        let refused = guard.admit("new", Some("9"));
        assert!(
            !refused.admitted() && refused.reason("new").contains("retention floor 10"),
            "{}",
            refused.reason("new")
        );
        assert!(guard.admit("old", Some("10")).admitted(), "the old holder at the floor");
        assert_eq!(store.get("old").unwrap(), Token::parse("10").ok(), "and the resource has its own mark again");
    }
}

/// Tokens of another arity than the floor are kept, never forgotten under it, and a
/// resource without a mark refuses them.
#[test]
fn marks_of_another_arity_are_kept_and_their_tokens_refused_under_the_floor() {
    for store in stores() {
        let guard =
            Guard::new(Arc::new(NativeDecider(Policy { mode: Mode::Correctness, strict: false })), store.clone());
        for (r, t) in [("a", "5"), ("b", "7"), ("c", "3.9")] {
            assert!(guard.admit(r, Some(t)).admitted());
        }
        let c = store.compact(Duration::ZERO, 1000).unwrap();
        assert_eq!((c.forgotten.len(), c.other_arity, c.floor), (2, 1, Token::parse("7").ok()));
        assert_eq!(store.get("c").unwrap(), Token::parse("3.9").ok());
        assert!(!guard.admit("d", Some("8.1")).admitted(), "not comparable with the floor: refused");
        assert!(guard.admit("d", Some("8")).admitted());
    }
}

/// Admits race a compaction that forgets everything: the floor is raised before a
/// mark goes, so no thread's token ever lands below one admitted before it.
#[test]
fn admits_racing_compactions_never_go_below_a_forgotten_mark() {
    for store in stores() {
        let guard = Arc::new(Guard::new(
            Arc::new(NativeDecider(Policy { mode: Mode::Correctness, strict: false })),
            store.clone(),
        ));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let compactor = {
            let (store, stop, runs) = (store.clone(), stop.clone(), runs.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    store.compact(Duration::ZERO, 1000).unwrap();
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        };
        // Each thread writes its own rising tokens over shared resources, and notes
        // when each admit began and ended on one clock of steps: at least 150 writes,
        // and on until the compactions have run a few times (admits into the file
        // store's journal can outrun a compaction's first run).
        let clock = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let (guard, clock, runs) = (guard.clone(), clock.clone(), runs.clone());
                std::thread::spawn(move || {
                    let mut admitted = Vec::new();
                    for i in 0..1_000_000u64 {
                        if i >= 150 && runs.load(std::sync::atomic::Ordering::SeqCst) >= 3 {
                            break;
                        }
                        let resource = format!("r{}", i % 3);
                        let token = i * 4 + w + 1;
                        let began = clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if guard.admit(&resource, Some(&token.to_string())).admitted() {
                            let ended = clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            admitted.push((resource, token, began, ended));
                        }
                    }
                    admitted
                })
            })
            .collect();
        let admits: Vec<(String, u64, u64, u64)> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        compactor.join().unwrap();
        assert!(runs.load(std::sync::atomic::Ordering::SeqCst) >= 3);
        // The violation: an admit that began after another on the same resource had
        // ended, with a lower token.
        for (r, t, _, ended) in &admits {
            for (r2, t2, began2, _) in &admits {
                assert!(!(r == r2 && began2 > ended && t2 < t), "{r}: {t2} admitted after {t}");
            }
        }
        assert!(admits.len() > 100, "the writers got through: {}", admits.len());
    }
}

fn stores() -> Vec<Arc<dyn Retention + Send + Sync>> {
    let dir = tempfile::tempdir().unwrap().keep();
    let file = dir.join(format!("marks-{}.redb", std::process::id()));
    vec![Arc::new(MemoryStore::new()), Arc::new(FileStore::open(file).unwrap())]
}

/// The file store compacts in chunks of a few thousand marks, each its own short write
/// transaction: across chunk boundaries every idle mark is forgotten once, a mark that
/// rose is kept and stamped again, and one cleared by hand leaves nothing behind.
#[test]
fn the_file_store_compacts_in_chunks_across_their_boundaries() {
    use fencekeeper::store::{Repair, Swap};
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path().join("marks.redb")).unwrap();
    let five = Token::parse("5").unwrap();
    let resources: Vec<String> = (0..9000).map(|i| format!("r{i:05}")).collect();
    std::thread::scope(|s| {
        for chunk in resources.chunks(1125) {
            let store = &store;
            s.spawn(move || {
                for r in chunk {
                    assert_eq!(store.compare_and_swap(r, None, &five).unwrap(), Swap::Swapped);
                }
            });
        }
    });
    let first = store.compact(Duration::from_secs(60), 1000).unwrap();
    assert_eq!((first.forgotten.len(), first.kept, first.floor), (0, 9000, None), "stamped, none idle yet");
    store.compare_and_swap("r04500", Some(&five), &Token::parse("6").unwrap()).unwrap();
    store.force("r04096", None).unwrap();
    let second = store.compact(Duration::from_secs(60), 1060).unwrap();
    assert_eq!((second.forgotten.len(), second.kept, second.floor), (8998, 1, Some(five)));
    assert!(second.forgotten.windows(2).all(|w| w[0].0 < w[1].0), "sorted, each once");
    assert_eq!(store.list().unwrap(), vec![("r04500".to_owned(), Token::parse("6").unwrap())]);
    let third = store.compact(Duration::from_secs(60), 1200).unwrap();
    assert_eq!((third.forgotten.len(), third.floor), (1, Token::parse("6").ok()));
    assert!(store.list().unwrap().is_empty());
}
