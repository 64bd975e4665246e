//! The rules every [`MarkStore`] keeps, as checks that run against a store: the
//! library runs them against its own stores, and an engine author who writes one
//! runs them against theirs (`tests/` of a crate depending on `fencekeeper`):
//!
//! ```no_run
//! use fencekeeper::store::contract;
//! # fn my_store() -> fencekeeper::MemoryStore { fencekeeper::MemoryStore::new() }
//! let store = my_store();
//! contract::check(&store).unwrap();                  // the sequential rules
//! contract::check_concurrent(&store, 8, 200).unwrap(); // racing swaps, linearizable
//! ```
//!
//! The rules:
//! * a resource without a mark reads as none, and a first swap from none sets it;
//! * a swap from a mark other than the current one is a conflict that reports the
//!   current mark, and changes nothing;
//! * **a mark never falls**: a swap that would not raise the mark (to a lower token,
//!   the same one, or one of another arity) is refused, whatever its caller expects;
//! * marks are per resource;
//! * with a way to damage a stored record ([`check_damaged`]), a damaged record reads
//!   as an error, never as a lower mark, no mark or another resource's;
//! * concurrent swaps are linearizable against a max-register: on each resource the
//!   swaps that succeeded form one chain from no mark (each expected what the
//!   previous one wrote, none lost), and the mark read at the end is the chain's end.
//!
//! Each check writes resources of its own under `contract/`, named so that two runs
//! against one store do not meet.

use super::{MarkStore, Swap};
use fencekeeper_core::Token;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// A rule the store broke, and how.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the mark store broke the contract: {0}")]
pub struct Violation(pub String);

/// A fresh resource name for one check.
fn fresh(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("contract/{nanos:x}-{}-{}/{what}", std::process::id(), N.fetch_add(1, Relaxed))
}

/// One of the checks' own tokens.
fn t(text: &str) -> Result<Token, Violation> {
    Token::parse(text).map_err(|e| Violation(format!("the check's own token {text:?}: {e}")))
}

fn expect<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), Violation> {
    if got == want {
        return Ok(());
    }
    Err(Violation(format!("{what}: got {got:?}, want {want:?}")))
}

fn no_error<T>(what: &str, r: Result<T, super::StoreError>) -> Result<T, Violation> {
    r.map_err(|e| Violation(format!("{what}: unexpected error: {e}")))
}

/// The sequential rules: none, create, conflicts, raises, never lower, per resource.
pub fn check(store: &dyn MarkStore) -> Result<(), Violation> {
    let (r, other) = (fresh("r"), fresh("other"));
    expect("a resource never written", no_error("get", store.get(&r))?, None)?;
    let (four, five, six, seven) = (t("4")?, t("5")?, t("6")?, t("7")?);
    expect("a first swap from none", no_error("swap", store.compare_and_swap(&r, None, &five))?, Swap::Swapped)?;
    expect("the mark after it", no_error("get", store.get(&r))?, Some(five))?;
    let none_again = no_error("swap", store.compare_and_swap(&r, None, &six))?;
    expect("a swap from none once there is a mark", none_again, Swap::Conflict(Some(five)))?;
    let stale = no_error("swap", store.compare_and_swap(&r, Some(&four), &six))?;
    expect("a swap from a mark that is not the current one", stale, Swap::Conflict(Some(five)))?;
    expect("the mark after two conflicts", no_error("get", store.get(&r))?, Some(five))?;
    expect("a raise", no_error("swap", store.compare_and_swap(&r, Some(&five), &seven))?, Swap::Swapped)?;
    for (lower, what) in
        [("3", "a lowering swap"), ("7", "a swap to the same token"), ("7.1", "a swap to another arity")]
    {
        if no_error("swap", store.compare_and_swap(&r, Some(&seven), &t(lower)?))? == Swap::Swapped {
            return Err(Violation(format!("{what} (7 -> {lower}) was applied: a mark must never fall")));
        }
        expect(&format!("the mark after {what}"), no_error("get", store.get(&r))?, Some(seven))?;
    }
    expect("another resource", no_error("get", store.get(&other))?, None)?;
    let other_swap = no_error("swap", store.compare_and_swap(&other, None, &t("1")?))?;
    expect("a first swap on another resource", other_swap, Swap::Swapped)?;
    expect("the first resource after it", no_error("get", store.get(&r))?, Some(seven))?;
    Ok(())
}

/// A damaged record reads as an error: `damage` damages the stored record of the
/// resource it is given (its bytes, as the store keeps them), after this check wrote
/// mark 9 there.
pub fn check_damaged(store: &dyn MarkStore, damage: impl FnOnce(&str)) -> Result<(), Violation> {
    let r = fresh("damaged");
    expect("a first swap", no_error("swap", store.compare_and_swap(&r, None, &t("9")?))?, Swap::Swapped)?;
    damage(&r);
    match store.get(&r) {
        Err(_) => Ok(()),
        Ok(read) => Err(Violation(format!("a damaged record read back as {read:?}, not as an error"))),
    }
}

/// A swap that succeeded: (expected, new).
type Swapped = (Option<Token>, Token);

/// Concurrent swaps, linearizable: `threads` threads each make `rounds` attempts to
/// raise the mark of one of three resources (read, then swap from what was read to a
/// higher token of their own). On each resource the swaps that succeeded must form
/// one chain from no mark, with the mark read at the end at its end.
pub fn check_concurrent<S: MarkStore + Sync>(store: &S, threads: usize, rounds: usize) -> Result<(), Violation> {
    let resources: Vec<String> = (0..3).map(|i| fresh(&format!("race{i}"))).collect();
    // Per resource: each successful swap.
    let swaps: Mutex<HashMap<usize, Vec<Swapped>>> = Mutex::default();
    let errors: Mutex<Vec<String>> = Mutex::default();
    std::thread::scope(|s| {
        for thread in 0..threads {
            let (resources, swaps, errors) = (&resources, &swaps, &errors);
            s.spawn(move || {
                for round in 0..rounds {
                    let which = (thread + round) % resources.len();
                    let r = &resources[which];
                    let read = match store.get(r) {
                        Ok(m) => m,
                        Err(e) => return lock(errors).push(format!("get: {e}")),
                    };
                    // Rising, and unique to the thread: one above the mark read in the
                    // first component, the thread in the second.
                    let base = read.and_then(|m| m.parts().first().copied()).unwrap_or(0);
                    let Ok(new) = Token::from_parts(&[base + 1, thread as u64]) else { continue };
                    match store.compare_and_swap(r, read.as_ref(), &new) {
                        Ok(Swap::Swapped) => lock(swaps).entry(which).or_default().push((read, new)),
                        Ok(Swap::Conflict(_)) => {}
                        Err(e) => lock(errors).push(format!("swap: {e}")),
                    }
                }
            });
        }
    });
    if let Some(e) = lock(&errors).first() {
        return Err(Violation(format!("a racing call failed: {e}")));
    }
    let swaps = lock(&swaps);
    for (i, r) in resources.iter().enumerate() {
        let mut by_expected: HashMap<Option<Token>, Token> = HashMap::new();
        for (expected, new) in swaps.get(&i).into_iter().flatten() {
            if let Some(first) = by_expected.insert(*expected, *new) {
                return Err(Violation(format!(
                    "two swaps on one resource both succeeded from {expected:?} (to {first} and to {new}): one was lost"
                )));
            }
        }
        // Walk the chain from no mark.
        let (mut at, mut walked) = (None, 0);
        while let Some(next) = by_expected.get(&at) {
            if at.is_some_and(|a| *next <= a) {
                return Err(Violation(format!("a swap lowered the mark from {at:?} to {next}")));
            }
            at = Some(*next);
            walked += 1;
        }
        if walked != by_expected.len() {
            return Err(Violation(format!(
                "of {} successful swaps on one resource only {walked} chain from no mark",
                by_expected.len()
            )));
        }
        expect("the mark read after the race", no_error("get", store.get(r))?, at)?;
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
