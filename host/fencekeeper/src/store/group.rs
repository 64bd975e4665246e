//! Group commit: callers that arrive while a durable commit is running wait for the
//! next one, which carries all of them. One caller at a time (the leader) runs the
//! commits; each caller gets its own outcome. The leader keeps committing while
//! requests keep arriving, then hands the role to the next caller.
//!
//! PostgreSQL and every serious log do this; here it turns eight concurrent advancing
//! admits from eight `fdatasync`s into a few. A commit is durable when
//! [`Commits::apply`] returns (the file store's journal writes each frame twice, so
//! nothing after it has to seal it), and only then are its callers answered.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

/// How the leader commits a store's requests of type `R`, answered with `T`.
pub(crate) trait Commits<R, T> {
    /// Apply `requests` in one durable commit, each against the state the ones
    /// before it left; one answer per request, in order.
    fn apply(&self, requests: Vec<R>) -> Vec<T>;
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

    /// Submit `request` and wait for its answer, given once its commit is durable.
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

    /// Commit everything waiting until nothing is.
    fn lead<'a>(
        &'a self,
        mut state: MutexGuard<'a, State<R, T>>,
        commits: &impl Commits<R, T>,
    ) -> MutexGuard<'a, State<R, T>> {
        loop {
            let batch = std::mem::take(&mut state.waiting);
            if batch.is_empty() {
                return state;
            }
            drop(state);
            let (ids, requests): (Vec<u64>, Vec<R>) = batch.into_iter().unzip();
            let answers = commits.apply(requests);
            state = self.lock();
            self.answer(&mut state, ids, answers);
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

    /// Doubles each request; counts commits; records, per request, the commit that
    /// carried it.
    #[derive(Default)]
    struct Log {
        commits: AtomicUsize,
        applied: Mutex<HashMap<u64, usize>>,
    }

    impl Commits<u64, u64> for Log {
        fn apply(&self, requests: Vec<u64>) -> Vec<u64> {
            std::thread::sleep(std::time::Duration::from_micros(200));
            let done = self.commits.fetch_add(1, Ordering::SeqCst) + 1;
            let mut applied = self.applied.lock().unwrap();
            for r in &requests {
                applied.insert(*r, done);
            }
            requests.into_iter().map(|r| r * 2).collect()
        }
    }

    #[test]
    fn every_caller_gets_its_own_answer_only_after_its_commit_and_commits_are_shared() {
        let group = Arc::new(Group::new());
        let log = Arc::new(Log::default());
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (group, log) = (group.clone(), log.clone());
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        let request = t * 1000 + i;
                        assert_eq!(group.submit(request, &*log), request * 2);
                        let applied = log.applied.lock().unwrap()[&request];
                        assert!(log.commits.load(Ordering::SeqCst) >= applied, "request {request} answered early");
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let commits = log.commits.load(Ordering::SeqCst);
        assert!(commits < 1600, "no commit was shared: {commits}");
    }

    #[test]
    fn a_lone_caller_is_answered_after_one_commit() {
        let (group, log) = (Group::new(), Log::default());
        assert_eq!(group.submit(7, &log), 14);
        assert_eq!(log.commits.load(Ordering::SeqCst), 1);
    }
}
