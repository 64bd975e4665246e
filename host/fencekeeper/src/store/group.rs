//! Group commit: callers that arrive while a durable commit is running wait for the
//! next one, which carries all of them. One caller at a time (the leader) runs the
//! commits; each caller gets its own outcome. The leader keeps committing while
//! requests keep arriving, then hands the role to the next caller.
//!
//! PostgreSQL and every serious log do this; here it turns eight concurrent advancing
//! admits from eight pairs of fsyncs into a few.
//!
//! **Sealed before answered.** A store may need a commit to be followed by another
//! before the first one's changes may be reported (the file store keeps redb's
//! fallback commit equal to the latest, see `file.rs`). So a batch's answers wait
//! for the next durable commit: the next batch's, when requests are waiting (one
//! commit then both carries the new batch and seals the one before), or an empty
//! one ([`Commits::seal`]) when none are. The promise "on stable storage before it
//! is reported" holds as it did with a commit and an empty one per batch, at one
//! durable commit per batch under load instead of two.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

/// How the leader commits a store's requests of type `R`, answered with `T`.
pub(crate) trait Commits<R, T> {
    /// Apply `requests` in one durable commit, each against the state the ones
    /// before it left; one answer per request, in order, and what was written.
    fn apply(&self, requests: Vec<R>) -> (Vec<T>, Written);
    /// One durable commit with nothing in it, sealing the commit before it.
    fn seal(&self) -> Result<(), String>;
    /// The answer of a request whose commit could not be sealed (`why`).
    fn unsealed(&self, why: &str) -> T;
}

/// What [`Commits::apply`] did.
pub(crate) enum Written {
    /// A durable commit with changes: it needs sealing, and it seals the one before.
    Changes,
    /// Nothing to write, and no commit: its answers need no seal.
    Nothing,
    /// The commit failed (its answers say so): the commit before stays unsealed.
    Failed(String),
}

/// Requests of type `R` committed in groups, each answered with a `T`.
pub(crate) struct Group<R, T> {
    state: Mutex<State<R, T>>,
    answered: Condvar,
}

struct State<R, T> {
    next_id: u64,
    waiting: Vec<(u64, R)>,
    answers: HashMap<u64, T>,
    leading: bool,
}

/// A batch whose commit is durable but not sealed yet: its ids and answers.
type Unsealed<T> = Option<(Vec<u64>, Vec<T>)>;

impl<R, T> Group<R, T> {
    pub(crate) fn new() -> Group<R, T> {
        Group {
            state: Mutex::new(State { next_id: 0, waiting: Vec::new(), answers: HashMap::new(), leading: false }),
            answered: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<R, T>> {
        // Every critical section leaves the state whole; a panic in a commit (which
        // the store contains) must not wedge the others.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Submit `request` and wait for its answer, given once its commit is sealed.
    /// `commits` runs on one thread at a time with every request waiting then (in
    /// arrival order).
    pub(crate) fn submit(&self, request: R, commits: &impl Commits<R, T>) -> T {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.waiting.push((id, request));
        loop {
            if let Some(answer) = state.answers.remove(&id) {
                return answer;
            }
            if state.leading {
                state = self.answered.wait(state).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            state.leading = true;
            state = self.lead(state, commits);
            state.leading = false;
            // Another caller may have queued between the last batch and now and be
            // waiting for a leader: wake everyone to look again.
            self.answered.notify_all();
        }
    }

    /// Commit everything waiting until nothing is and the last batch is sealed.
    fn lead<'a>(
        &'a self,
        mut state: MutexGuard<'a, State<R, T>>,
        commits: &impl Commits<R, T>,
    ) -> MutexGuard<'a, State<R, T>> {
        let mut unsealed: Unsealed<T> = None;
        loop {
            let batch = std::mem::take(&mut state.waiting);
            drop(state);
            if batch.is_empty() {
                let Some((ids, answers)) = unsealed.take() else { return self.lock() };
                let sealed = commits.seal();
                state = self.lock();
                let answers = match sealed {
                    Ok(()) => answers,
                    Err(why) => ids.iter().map(|_| commits.unsealed(&why)).collect(),
                };
                self.answer(&mut state, ids, answers);
                // Requests that queued during the seal are taken next.
                continue;
            }
            let (ids, requests): (Vec<u64>, Vec<R>) = batch.into_iter().unzip();
            let (answers, written) = commits.apply(requests);
            state = self.lock();
            match written {
                Written::Changes => {
                    // This commit seals the one before, and waits for its own seal.
                    if let Some((before, theirs)) = unsealed.replace((ids, answers)) {
                        self.answer(&mut state, before, theirs);
                    }
                }
                Written::Nothing => self.answer(&mut state, ids, answers),
                Written::Failed(why) => {
                    if let Some((before, _)) = unsealed.take() {
                        let failed = before.iter().map(|_| commits.unsealed(&why)).collect();
                        self.answer(&mut state, before, failed);
                    }
                    self.answer(&mut state, ids, answers);
                }
            }
        }
    }

    fn answer(&self, state: &mut State<R, T>, ids: Vec<u64>, answers: Vec<T>) {
        state.answers.extend(ids.into_iter().zip(answers));
        self.answered.notify_all();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Doubles each request; counts commits; records, per request, how many durable
    /// commits had returned when it was applied, and fails the commits it is told to.
    #[derive(Default)]
    struct Log {
        commits: AtomicUsize,
        applied: Mutex<HashMap<u64, usize>>,
        fail_seals: bool,
    }

    impl Commits<u64, Result<u64, String>> for Log {
        fn apply(&self, requests: Vec<u64>) -> (Vec<Result<u64, String>>, Written) {
            std::thread::sleep(std::time::Duration::from_micros(200));
            let done = self.commits.fetch_add(1, Ordering::SeqCst) + 1;
            let mut applied = self.applied.lock().unwrap();
            for r in &requests {
                applied.insert(*r, done);
            }
            (requests.into_iter().map(|r| Ok(r * 2)).collect(), Written::Changes)
        }
        fn seal(&self) -> Result<(), String> {
            self.commits.fetch_add(1, Ordering::SeqCst);
            if self.fail_seals {
                return Err("the disk is full".into());
            }
            Ok(())
        }
        fn unsealed(&self, why: &str) -> Result<u64, String> {
            Err(why.to_owned())
        }
    }

    #[test]
    fn every_caller_gets_its_own_answer_only_after_a_later_commit_and_commits_are_shared() {
        let group = Arc::new(Group::new());
        let log = Arc::new(Log::default());
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (group, log) = (group.clone(), log.clone());
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        let request = t * 1000 + i;
                        let answer = group.submit(request, &*log);
                        assert_eq!(answer, Ok(request * 2));
                        // Sealed: a durable commit returned after the one that applied it.
                        let applied = log.applied.lock().unwrap()[&request];
                        assert!(log.commits.load(Ordering::SeqCst) > applied, "request {request} answered unsealed");
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let commits = log.commits.load(Ordering::SeqCst);
        assert!(commits < 1600, "no commit was shared: {commits}");
    }

    #[test]
    fn a_lone_caller_is_answered_after_an_empty_seal() {
        let (group, log) = (Group::new(), Log::default());
        assert_eq!(group.submit(7, &log), Ok(14));
        assert_eq!(log.commits.load(Ordering::SeqCst), 2, "its commit and the seal");
    }

    #[test]
    fn a_failed_seal_fails_the_batch_it_was_to_seal() {
        let (group, log) = (Group::new(), Log { fail_seals: true, ..Log::default() });
        assert_eq!(group.submit(7, &log), Err("the disk is full".into()));
    }
}
