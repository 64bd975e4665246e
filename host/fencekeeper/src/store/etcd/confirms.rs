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
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::Notify;

/// What one Txn said about a resource: the mark etcd held when it ran.
pub(super) type Outcome = Result<Option<Token>, StoreError>;

/// The batch waiting for the Txn in flight, if any.
#[derive(Default)]
pub(super) struct Confirms {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    in_flight: bool,
    waiting: Option<Arc<Batch>>,
}

/// Callers answered by one Txn: each resource once, with the mark its first caller
/// presented (the one the Txn compares). Any of them runs it, the first to find the
/// store free: a caller that goes away (its request was dropped) leaves the others
/// to run it.
#[derive(Default)]
struct Batch {
    marks: Mutex<Vec<(String, Token)>>,
    landed: Mutex<Option<Landed>>,
    /// Its callers wait here: for the Txn's answer, or for the store to be free.
    changed: Notify,
}

/// How a batch's Txn ended.
enum Landed {
    /// The mark etcd held for each resource, in the batch's order.
    Answered(Vec<Outcome>),
    /// The caller running it went away first: its callers join another batch (the
    /// Txn, only a read, may or may not have run; its answer is lost).
    Abandoned,
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

    fn land(&self, landed: Landed) {
        *lock(&self.landed) = Some(landed);
        self.changed.notify_waiters();
    }

    /// Caller `i`'s answer, once the Txn landed; `Some(None)` when it was abandoned.
    fn answer(&self, i: usize) -> Option<Option<Outcome>> {
        match lock(&self.landed).as_ref()? {
            Landed::Answered(outcomes) => Some(Some(outcomes.get(i).map_or_else(|| Err(unanswered()), copy))),
            Landed::Abandoned => Some(None),
        }
    }
}

impl Confirms {
    /// Confirm that `resource`'s mark is still `mark`. `run` runs once for every
    /// batch: given each resource of the batch with the mark to compare, it returns
    /// the mark etcd held for each, in the same order.
    pub(super) async fn confirm<R, F>(&self, resource: &str, mark: &Token, run: R) -> Result<Swap, StoreError>
    where
        R: Fn(Vec<(String, Token)>) -> F,
        F: Future<Output = Vec<Outcome>>,
    {
        loop {
            let (batch, i) = {
                let mut state = lock(&self.state);
                // Its Txn has not begun: it will read after this caller arrived.
                let batch = state.waiting.get_or_insert_with(Default::default).clone();
                let i = batch.join(resource, mark);
                (batch, i)
            };
            match self.until_answered(&batch, i, &run).await {
                Some(outcome) => return answer(outcome, mark),
                // Abandoned: join the batch that is waiting now.
                None => continue,
            }
        }
    }

    /// Wait for `batch`'s Txn, running it if the store is free first.
    async fn until_answered<R, F>(&self, batch: &Arc<Batch>, i: usize, run: &R) -> Option<Outcome>
    where
        R: Fn(Vec<(String, Token)>) -> F,
        F: Future<Output = Vec<Outcome>>,
    {
        loop {
            let changed = batch.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before looking, so a change after the look wakes it.
            changed.as_mut().enable();
            if let Some(answer) = batch.answer(i) {
                return answer;
            }
            if self.claim(batch) {
                // Whatever happens in the Txn (a panic, or this caller going away), the
                // next batch gets its turn and this one an answer: nobody waits for ever.
                let mut landing = Landing { confirms: self, batch, outcomes: None };
                let marks = lock(&batch.marks).clone();
                landing.outcomes = Some(run(marks).await);
                drop(landing);
                return batch.answer(i).unwrap_or(Some(Err(unanswered())));
            }
            changed.await;
        }
    }

    /// Close `batch` and mark it in flight, if it is the one waiting and no Txn is.
    fn claim(&self, batch: &Arc<Batch>) -> bool {
        let mut state = lock(&self.state);
        if state.in_flight || !state.waiting.as_ref().is_some_and(|w| Arc::ptr_eq(w, batch)) {
            return false;
        }
        // Closed: whoever comes now starts the next batch.
        state.in_flight = true;
        state.waiting = None;
        true
    }
}

/// The end of a batch's Txn: its callers are answered (with an error if the Txn
/// panicked; told to join another batch if its runner went away) and the next batch
/// is told the store is free.
struct Landing<'a> {
    confirms: &'a Confirms,
    batch: &'a Batch,
    outcomes: Option<Vec<Outcome>>,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.confirms.state);
        state.in_flight = false;
        let next = state.waiting.clone();
        drop(state);
        self.batch.land(match self.outcomes.take() {
            Some(outcomes) => Landed::Answered(outcomes),
            None if std::thread::panicking() => Landed::Answered(Vec::new()),
            None => Landed::Abandoned,
        });
        if let Some(next) = next {
            next.changed.notify_waiters();
        }
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
    use crate::wait::block_on;
    use std::future::ready;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;
    use std::task::{Context, Poll, Waker};

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
                block_on(confirms.confirm("r", &token("5"), |marks| {
                    lock(&txns).push(marks);
                    started.wait();
                    release.wait();
                    // etcd's mark when this Txn ran: 5.
                    ready(vec![Ok(Some(token("5")))])
                }))
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
                    block_on(confirms.confirm(resource, &token(mark), |marks| {
                        let outcomes =
                            marks.iter().map(|(r, _)| Ok(Some(token(if r == "r" { "7" } else { "3" })))).collect();
                        lock(&txns).push(marks);
                        ready(outcomes)
                    }))
                })
            })
            .collect();
        // Every later caller is queued before the first Txn returns: the waiting batch
        // is held by the state and the six that joined it.
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
            let got = block_on(confirms.confirm("r", &token("5"), |marks| {
                runs.fetch_add(1, Ordering::SeqCst);
                assert_eq!(marks, [("r".to_owned(), token("5"))]);
                ready(vec![Ok(Some(token("5")))])
            }));
            assert_eq!(got.ok(), Some(Swap::Swapped));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    /// A Txn that panics leaves no caller waiting: the next batch runs, and the
    /// panicking batch's other callers get an error.
    #[test]
    fn a_panicking_txn_strands_nobody() {
        let confirms = Arc::new(Confirms::default());
        let panicked =
            {
                let confirms = confirms.clone();
                std::thread::spawn(move || {
                    block_on(confirms.confirm("r", &token("5"), |_| -> std::future::Ready<Vec<Outcome>> {
                        panic!("the Txn panicked")
                    }))
                })
                .join()
            };
        assert!(panicked.is_err());
        assert!(!lock(&confirms.state).in_flight, "the store is not left in flight");
        let got = block_on(confirms.confirm("r", &token("5"), |_| ready(vec![Ok(Some(token("5")))])));
        assert_eq!(got.ok(), Some(Swap::Swapped));
        // A run that answers too few resources fails the ones it left out.
        let batch = Batch::default();
        batch.join("a", &token("1"));
        batch.land(Landed::Answered(vec![]));
        assert!(matches!(batch.answer(0), Some(Some(Err(StoreError::Unavailable(_))))));
    }

    /// A batch answers each caller for its own mark, and shares a failure.
    #[test]
    fn each_caller_is_answered_for_its_own_mark_and_errors_are_shared() {
        let confirms = Confirms::default();
        let got = block_on(confirms.confirm("r", &token("3"), |_| ready(vec![Ok(Some(token("4")))])));
        assert!(matches!(got, Ok(Swap::Conflict(Some(m))) if m == token("4")));
        let got = block_on(confirms.confirm("r", &token("4"), |_| ready(vec![Ok(None)])));
        assert!(matches!(got, Ok(Swap::Conflict(None))));
        let got =
            block_on(confirms.confirm("r", &token("4"), |_| ready(vec![Err(StoreError::Unavailable("down".into()))])));
        assert!(matches!(got, Err(StoreError::Unavailable(ref why)) if why == "down"));
        assert_eq!(answer(Ok(Some(token("4"))), &token("4")).ok(), Some(Swap::Swapped));
    }

    /// A caller that goes away while its batch's Txn is in flight (a request dropped
    /// mid-admit) neither strands nor fails the others: the next batch runs, and the
    /// callers of a batch whose runner went away join another and are answered by it.
    #[test]
    fn a_caller_that_goes_away_mid_txn_leaves_the_others_answered() {
        let confirms = Confirms::default();
        let mut cx = Context::from_waker(Waker::noop());
        let runs = Mutex::new(Vec::new());
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let released = Mutex::new(Some(released));
        // `x` runs a Txn that answers when released; `a` one that never answers.
        let run = |marks: Vec<(String, Token)>| {
            let (first, n) = (marks[0].0.clone(), marks.len());
            lock(&runs).push(marks.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>());
            let wait = if first == "x" { lock(&released).take() } else { None };
            async move {
                match first.as_str() {
                    "x" => {
                        if let Some(wait) = wait {
                            let _ = wait.await;
                        }
                    }
                    "a" => std::future::pending::<()>().await,
                    _ => {}
                }
                (0..n).map(|_| Ok(Some(token("5")))).collect::<Vec<Outcome>>()
            }
        };
        let five = token("5");
        let mut x = std::pin::pin!(confirms.confirm("x", &five, run));
        assert!(x.as_mut().poll(&mut cx).is_pending(), "x runs its Txn at once");
        // `a` and `c` queue in one batch behind it.
        let mut a = Box::pin(confirms.confirm("a", &five, run));
        let mut c = std::pin::pin!(confirms.confirm("c", &five, run));
        assert!(a.as_mut().poll(&mut cx).is_pending() && c.as_mut().poll(&mut cx).is_pending());
        release.send(()).unwrap();
        assert!(matches!(x.as_mut().poll(&mut cx), Poll::Ready(Ok(Swap::Swapped))));
        // `a` finds the store free first and runs the batch of both; then it goes away.
        assert!(a.as_mut().poll(&mut cx).is_pending());
        drop(a);
        assert!(!lock(&confirms.state).in_flight, "the store is not left in flight");
        // `c` joins a new batch of its own and is answered by it.
        assert!(matches!(c.as_mut().poll(&mut cx), Poll::Ready(Ok(Swap::Swapped))));
        assert_eq!(*lock(&runs), [vec!["x"], vec!["a", "c"], vec!["c"]]);
    }
}
