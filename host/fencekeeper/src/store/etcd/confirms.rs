//! Concurrent confirms of one resource share one etcd Txn.
//!
//! A holder writing again presents the token equal to the mark, and the store must
//! check with etcd that the mark has not moved ([`MarkStore::confirm`]). Under load
//! many such checks of one resource are in flight at once, and each was one Txn. Here
//! they queue behind the Txn in flight and the next Txn answers all of them: the
//! pattern of Raft's ReadIndex, on our side of the wire.
//!
//! Linearizable, because a caller is only ever answered by a Txn that *began after it
//! arrived*: it joins the batch that has not started yet, never the one in flight (a
//! read that began before the caller arrived could miss an advance that completed
//! before it, and admit a token already superseded). A Txn tells the mark etcd held
//! when it ran: the caller's own mark when the compare held, else the mark it read
//! back; every caller of the batch is answered from that one mark.
//!
//! [`MarkStore::confirm`]: super::MarkStore::confirm

use crate::store::{StoreError, Swap};
use fencekeeper_core::Token;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// What one Txn said about a resource: the mark etcd held when it ran.
type Outcome = Result<Option<Token>, StoreError>;

/// The batches of every resource with a confirm in flight or waiting.
#[derive(Default)]
pub(super) struct Confirms {
    resources: Mutex<HashMap<String, Resource>>,
}

/// One resource's queue: at most one Txn in flight and one batch waiting for it.
struct Resource {
    in_flight: bool,
    waiting: Option<Arc<Batch>>,
    /// The waiting batch's leader sleeps here until the Txn in flight is done.
    turn: Arc<Condvar>,
}

/// Callers answered by one Txn.
#[derive(Default)]
struct Batch {
    outcome: Mutex<Option<Outcome>>,
    done: Condvar,
}

impl Batch {
    fn publish(&self, outcome: &Outcome) {
        *lock(&self.outcome) = Some(copy(outcome));
        self.done.notify_all();
    }

    fn wait(&self) -> Outcome {
        let mut slot = lock(&self.outcome);
        loop {
            if let Some(outcome) = slot.as_ref() {
                return copy(outcome);
            }
            slot = self.done.wait(slot).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Confirms {
    /// Confirm that `resource`'s mark is still `mark`, with `txn` (a compare of
    /// `mark` that reads the current mark back when it fails) run once for every
    /// caller of a batch.
    pub(super) fn confirm(
        &self,
        resource: &str,
        mark: &Token,
        txn: impl FnOnce() -> Result<Swap, StoreError>,
    ) -> Result<Swap, StoreError> {
        let mut resources = lock(&self.resources);
        let entry = resources.entry(resource.to_owned()).or_insert_with(|| Resource {
            in_flight: false,
            waiting: None,
            turn: Arc::new(Condvar::new()),
        });
        if let Some(batch) = entry.waiting.clone() {
            // Its Txn has not begun: it will read after this caller arrived.
            drop(resources);
            return answer(batch.wait(), mark);
        }
        let batch = Arc::new(Batch::default());
        entry.waiting = Some(batch.clone());
        let turn = entry.turn.clone();
        while resources.get(resource).is_some_and(|r| r.in_flight) {
            resources = turn.wait(resources).unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(entry) = resources.get_mut(resource) {
            entry.in_flight = true;
            entry.waiting = None;
        }
        drop(resources);

        // Whatever happens in the Txn, a panic included, the resource's next batch
        // gets its turn and this batch an answer: nobody waits for ever.
        let mut landing = Landing { confirms: self, resource, batch: &batch, outcome: None };
        let outcome = match txn() {
            Ok(Swap::Swapped) => Ok(Some(*mark)),
            Ok(Swap::Conflict(current)) => Ok(current),
            Err(e) => Err(e),
        };
        landing.outcome = Some(copy(&outcome));
        drop(landing);
        answer(outcome, mark)
    }
}

/// The end of a batch's Txn: the resource's next batch is let go and this one's
/// callers are answered (with an error if the Txn never returned).
struct Landing<'a> {
    confirms: &'a Confirms,
    resource: &'a str,
    batch: &'a Batch,
    outcome: Option<Outcome>,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        let mut resources = lock(&self.confirms.resources);
        if let Some(entry) = resources.get_mut(self.resource) {
            entry.in_flight = false;
            if entry.waiting.is_some() {
                entry.turn.notify_one();
            } else {
                resources.remove(self.resource);
            }
        }
        drop(resources);
        let outcome =
            self.outcome.take().unwrap_or_else(|| Err(StoreError::Unavailable("the etcd confirm panicked".into())));
        self.batch.publish(&outcome);
    }
}

/// A caller's answer from the mark a Txn saw.
fn answer(outcome: Outcome, mark: &Token) -> Result<Swap, StoreError> {
    match outcome? {
        Some(current) if current == *mark => Ok(Swap::Swapped),
        other => Ok(Swap::Conflict(other)),
    }
}

fn copy(outcome: &Outcome) -> Outcome {
    match outcome {
        Ok(mark) => Ok(*mark),
        Err(e) => Err(e.again()),
    }
}

/// A poisoned lock still guards consistent data here: every critical section only
/// sets flags and options.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    fn token(s: &str) -> Token {
        Token::parse(s).unwrap()
    }

    /// Callers that arrive while a Txn is in flight share the next one; none is
    /// answered by the Txn that was already running when it arrived.
    #[test]
    fn callers_arriving_during_a_txn_share_the_next_one() {
        let confirms = Arc::new(Confirms::default());
        let txns = Arc::new(AtomicUsize::new(0));
        let (started, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        // The first caller's Txn holds until the others have queued.
        let first = {
            let (confirms, txns, started, release) = (confirms.clone(), txns.clone(), started.clone(), release.clone());
            std::thread::spawn(move || {
                confirms.confirm("r", &token("5"), || {
                    txns.fetch_add(1, Ordering::SeqCst);
                    started.wait();
                    release.wait();
                    // etcd's mark when this Txn ran: 5.
                    Ok(Swap::Swapped)
                })
            })
        };
        started.wait();
        // While it is in flight, etcd's mark moves to 7; the next Txn sees 7.
        let later: Vec<_> = (0..6)
            .map(|_| {
                let (confirms, txns) = (confirms.clone(), txns.clone());
                std::thread::spawn(move || {
                    confirms.confirm("r", &token("5"), || {
                        txns.fetch_add(1, Ordering::SeqCst);
                        Ok(Swap::Conflict(Some(token("7"))))
                    })
                })
            })
            .collect();
        // Every later caller is queued before the first Txn returns: the waiting batch
        // is held by the resource, its leader and the five that joined it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while lock(&confirms.resources).get("r").and_then(|r| r.waiting.as_ref()).map_or(0, Arc::strong_count) < 7 {
            assert!(std::time::Instant::now() < deadline, "the later callers did not all queue for the next Txn");
            std::thread::yield_now();
        }
        release.wait();
        assert!(matches!(first.join().unwrap(), Ok(Swap::Swapped)));
        for t in later {
            let got = t.join().unwrap();
            assert!(matches!(got, Ok(Swap::Conflict(Some(m))) if m == token("7")), "{got:?}");
        }
        assert_eq!(txns.load(Ordering::SeqCst), 2, "one Txn for the six that queued");
        assert!(lock(&confirms.resources).is_empty(), "an idle resource is forgotten");
    }

    /// A Txn that panics leaves no caller waiting: the next batch runs, and the
    /// panicking batch's other callers get an error.
    #[test]
    fn a_panicking_txn_strands_nobody() {
        let confirms = Arc::new(Confirms::default());
        let panicked = {
            let confirms = confirms.clone();
            std::thread::spawn(move || confirms.confirm("r", &token("5"), || panic!("the Txn panicked"))).join()
        };
        assert!(panicked.is_err());
        assert!(lock(&confirms.resources).is_empty(), "the resource is not left in flight");
        let got = confirms.confirm("r", &token("5"), || Ok(Swap::Swapped));
        assert_eq!(got.ok(), Some(Swap::Swapped));
    }

    /// A batch answers each caller for its own mark, and shares a failure.
    #[test]
    fn each_caller_is_answered_for_its_own_mark_and_errors_are_shared() {
        let confirms = Confirms::default();
        let got = confirms.confirm("r", &token("3"), || Ok(Swap::Conflict(Some(token("4")))));
        assert!(matches!(got, Ok(Swap::Conflict(Some(m))) if m == token("4")));
        let got = confirms.confirm("r", &token("4"), || Ok(Swap::Conflict(None)));
        assert!(matches!(got, Ok(Swap::Conflict(None))));
        let got = confirms.confirm("r", &token("4"), || Err(StoreError::Unavailable("down".into())));
        assert!(matches!(got, Err(StoreError::Unavailable(ref why)) if why == "down"));
        assert_eq!(answer(Ok(Some(token("4"))), &token("4")).ok(), Some(Swap::Swapped));
    }
}
