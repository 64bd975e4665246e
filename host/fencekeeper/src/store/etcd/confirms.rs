//! Concurrent confirms share one etcd Txn, across resources.
//!
//! A holder writing again presents the token equal to the mark, and the store must
//! check with etcd that the mark has not moved ([`MarkStore::confirm`]). Under load
//! many such checks are in flight at once, each was one Txn, and holders of different
//! resources (the usual case: each lock guards its own files) never shared one. Here
//! every confirm queues behind the Txn in flight and the next Txn answers all of them,
//! whatever their resources: it compares each resource's mark and, when any moved,
//! reads every key back. The pattern of Raft's ReadIndex, on our side of the wire.
//!
//! Linearizable, because a caller is only ever answered by a Txn that *began after it
//! arrived*: it joins the batch that has not started yet, never the one in flight (a
//! read that began before the caller arrived could miss an advance that completed
//! before it, and admit a token already superseded). A Txn tells the mark etcd held
//! for each resource when it ran: the compared mark when every compare held, else the
//! mark it read back; every caller of a resource is answered from that one mark.
//!
//! One Txn is in flight at a time for the whole store: while it flies, the next batch
//! fills with every confirm that arrives, so under load each Txn carries many.
//!
//! [`MarkStore::confirm`]: super::MarkStore::confirm

use crate::store::{StoreError, Swap};
use fencekeeper_core::Token;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// What one Txn said about a resource: the mark etcd held when it ran.
pub(super) type Outcome = Result<Option<Token>, StoreError>;

/// The batch waiting for the Txn in flight, if any.
#[derive(Default)]
pub(super) struct Confirms {
    state: Mutex<State>,
    /// The waiting batch's leader sleeps here until the Txn in flight is done.
    turn: Condvar,
}

#[derive(Default)]
struct State {
    in_flight: bool,
    waiting: Option<Arc<Batch>>,
}

/// Callers answered by one Txn: each resource once, with the mark its first caller
/// presented (the one the Txn compares).
#[derive(Default)]
struct Batch {
    marks: Mutex<Vec<(String, Token)>>,
    outcomes: Mutex<Option<Vec<Outcome>>>,
    done: Condvar,
}

impl Batch {
    /// Add `resource` (once) and return its place in the Txn.
    fn join(&self, resource: &str, mark: &Token) -> usize {
        let mut marks = lock(&self.marks);
        match marks.iter().position(|(r, _)| r == resource) {
            Some(i) => i,
            None => {
                marks.push((resource.to_owned(), *mark));
                marks.len() - 1
            }
        }
    }

    fn publish(&self, outcomes: Vec<Outcome>) {
        *lock(&self.outcomes) = Some(outcomes);
        self.done.notify_all();
    }

    fn wait(&self, i: usize) -> Outcome {
        let mut slot = lock(&self.outcomes);
        loop {
            if let Some(outcomes) = slot.as_ref() {
                return outcomes.get(i).map_or_else(|| Err(unanswered()), copy);
            }
            slot = self.done.wait(slot).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Confirms {
    /// Confirm that `resource`'s mark is still `mark`. `run` runs once for every
    /// batch: given each resource of the batch with the mark to compare, it returns
    /// the mark etcd held for each, in the same order.
    pub(super) fn confirm(
        &self,
        resource: &str,
        mark: &Token,
        run: impl FnOnce(&[(String, Token)]) -> Vec<Outcome>,
    ) -> Result<Swap, StoreError> {
        let mut state = lock(&self.state);
        if let Some(batch) = state.waiting.clone() {
            // Its Txn has not begun: it will read after this caller arrived.
            let i = batch.join(resource, mark);
            drop(state);
            return answer(batch.wait(i), mark);
        }
        let batch = Arc::new(Batch::default());
        let i = batch.join(resource, mark);
        state.waiting = Some(batch.clone());
        while state.in_flight {
            state = self.turn.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        // Closed: whoever comes now starts the next batch.
        state.in_flight = true;
        state.waiting = None;
        drop(state);

        // Whatever happens in the Txn, a panic included, the next batch gets its turn
        // and this batch an answer: nobody waits for ever.
        let mut landing = Landing { confirms: self, batch: &batch, outcomes: None };
        let marks = lock(&batch.marks).clone();
        landing.outcomes = Some(run(&marks));
        drop(landing);
        answer(batch.wait(i), mark)
    }
}

/// The end of a batch's Txn: the next batch is let go and this one's callers are
/// answered (with an error if the Txn never returned).
struct Landing<'a> {
    confirms: &'a Confirms,
    batch: &'a Batch,
    outcomes: Option<Vec<Outcome>>,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.confirms.state);
        state.in_flight = false;
        drop(state);
        self.confirms.turn.notify_one();
        self.batch.publish(self.outcomes.take().unwrap_or_default());
    }
}

fn unanswered() -> StoreError {
    StoreError::Unavailable("the etcd confirm failed before it answered (it panicked)".into())
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

    /// How many callers hold the waiting batch (the state, its leader, its joiners).
    fn waiting_holders(confirms: &Confirms) -> usize {
        lock(&confirms.state).waiting.as_ref().map_or(0, Arc::strong_count)
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::yield_now();
        }
    }

    /// Callers that arrive while a Txn is in flight share the next one, whatever
    /// their resources; none is answered by the Txn that was already running when it
    /// arrived, and each is answered from its own resource's mark.
    #[test]
    fn callers_arriving_during_a_txn_share_the_next_one_across_resources() {
        let confirms = Arc::new(Confirms::default());
        let txns = Arc::new(Mutex::new(Vec::new()));
        let (started, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        // The first caller's Txn holds until the others have queued.
        let first = {
            let (confirms, txns, started, release) = (confirms.clone(), txns.clone(), started.clone(), release.clone());
            std::thread::spawn(move || {
                confirms.confirm("r", &token("5"), |marks| {
                    lock(&txns).push(marks.to_vec());
                    started.wait();
                    release.wait();
                    // etcd's mark when this Txn ran: 5.
                    vec![Ok(Some(token("5")))]
                })
            })
        };
        started.wait();
        // While it is in flight, etcd's mark of "r" moves to 7; "s" stays at 3.
        let later: Vec<_> = ["r", "s", "r", "s", "r", "s"]
            .into_iter()
            .map(|resource| {
                let (confirms, txns) = (confirms.clone(), txns.clone());
                let mark = if resource == "r" { "5" } else { "3" };
                std::thread::spawn(move || {
                    confirms.confirm(resource, &token(mark), |marks| {
                        lock(&txns).push(marks.to_vec());
                        marks.iter().map(|(r, _)| Ok(Some(token(if r == "r" { "7" } else { "3" })))).collect()
                    })
                })
            })
            .collect();
        // Every later caller is queued before the first Txn returns: the waiting batch
        // is held by the state, its leader and the five that joined it.
        wait_until("the later callers did not all queue for the next Txn", || waiting_holders(&confirms) == 7);
        release.wait();
        assert!(matches!(first.join().unwrap(), Ok(Swap::Swapped)));
        for (t, resource) in later.into_iter().zip(["r", "s", "r", "s", "r", "s"]) {
            let got = t.join().unwrap();
            match resource {
                "r" => assert!(matches!(got, Ok(Swap::Conflict(Some(m))) if m == token("7")), "{got:?}"),
                _ => assert_eq!(got.ok(), Some(Swap::Swapped)),
            }
        }
        let txns = lock(&txns);
        assert_eq!(txns.len(), 2, "one Txn for the six that queued: {txns:?}");
        let resources: Vec<&str> = txns[1].iter().map(|(r, _)| r.as_str()).collect();
        assert!(resources.len() == 2 && resources.contains(&"r") && resources.contains(&"s"), "{resources:?}");
        assert!(lock(&confirms.state).waiting.is_none() && !lock(&confirms.state).in_flight);
    }

    /// A caller that arrives while nothing is in flight runs its Txn at once.
    #[test]
    fn an_idle_store_confirms_at_once() {
        let confirms = Confirms::default();
        let runs = AtomicUsize::new(0);
        for _ in 0..3 {
            let got = confirms.confirm("r", &token("5"), |marks| {
                runs.fetch_add(1, Ordering::SeqCst);
                assert_eq!(marks, [("r".to_owned(), token("5"))]);
                vec![Ok(Some(token("5")))]
            });
            assert_eq!(got.ok(), Some(Swap::Swapped));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    /// A Txn that panics leaves no caller waiting: the next batch runs, and the
    /// panicking batch's other callers get an error.
    #[test]
    fn a_panicking_txn_strands_nobody() {
        let confirms = Arc::new(Confirms::default());
        let panicked = {
            let confirms = confirms.clone();
            std::thread::spawn(move || confirms.confirm("r", &token("5"), |_| panic!("the Txn panicked"))).join()
        };
        assert!(panicked.is_err());
        assert!(!lock(&confirms.state).in_flight, "the store is not left in flight");
        let got = confirms.confirm("r", &token("5"), |_| vec![Ok(Some(token("5")))]);
        assert_eq!(got.ok(), Some(Swap::Swapped));
        // A run that answers too few resources fails the ones it left out.
        let batch = Batch::default();
        batch.join("a", &token("1"));
        batch.publish(vec![]);
        assert!(matches!(batch.wait(0), Err(StoreError::Unavailable(_))));
    }

    /// A batch answers each caller for its own mark, and shares a failure.
    #[test]
    fn each_caller_is_answered_for_its_own_mark_and_errors_are_shared() {
        let confirms = Confirms::default();
        let got = confirms.confirm("r", &token("3"), |_| vec![Ok(Some(token("4")))]);
        assert!(matches!(got, Ok(Swap::Conflict(Some(m))) if m == token("4")));
        let got = confirms.confirm("r", &token("4"), |_| vec![Ok(None)]);
        assert!(matches!(got, Ok(Swap::Conflict(None))));
        let got = confirms.confirm("r", &token("4"), |_| vec![Err(StoreError::Unavailable("down".into()))]);
        assert!(matches!(got, Err(StoreError::Unavailable(ref why)) if why == "down"));
        assert_eq!(answer(Ok(Some(token("4"))), &token("4")).ok(), Some(Swap::Swapped));
    }
}
