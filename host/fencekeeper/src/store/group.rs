//! Group commit: callers that arrive while a durable commit is running wait for the
//! next one, which carries all of them. One caller at a time (the leader) runs the
//! commits; each caller gets its own outcome, and only after the commit that carries
//! its change has returned, so the promise "on stable storage before it is reported"
//! is exactly what it was with one commit per caller. The leader keeps committing
//! while requests keep arriving, then hands the role to the next caller.
//!
//! PostgreSQL and every serious log do this; here it turns eight concurrent advancing
//! admits from eight pairs of fsyncs into one.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

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

    /// Submit `request` and wait for its answer. `commit` runs on one thread at a
    /// time with every request waiting then (in arrival order), and returns one answer
    /// per request, in the same order.
    pub(crate) fn submit(&self, request: R, commit: impl Fn(Vec<R>) -> Vec<T>) -> T {
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
            // Lead: commit everything waiting, until nothing is (own answer included).
            state.leading = true;
            while !state.waiting.is_empty() {
                let batch = std::mem::take(&mut state.waiting);
                drop(state);
                let (ids, requests): (Vec<u64>, Vec<R>) = batch.into_iter().unzip();
                let answers = commit(requests);
                state = self.lock();
                state.answers.extend(ids.into_iter().zip(answers));
                self.answered.notify_all();
            }
            state.leading = false;
            // Another caller may have queued between the last batch and now and be
            // waiting for a leader: wake everyone to look again.
            self.answered.notify_all();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn every_caller_gets_its_own_answer_and_commits_are_shared() {
        let group = Arc::new(Group::<u64, u64>::new());
        let commits = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (group, commits) = (group.clone(), commits.clone());
                std::thread::spawn(move || {
                    (0..200u64)
                        .map(|i| {
                            let request = t * 1000 + i;
                            let answer = group.submit(request, |batch| {
                                commits.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(std::time::Duration::from_micros(200));
                                batch.into_iter().map(|r| r * 2).collect()
                            });
                            assert_eq!(answer, request * 2);
                        })
                        .count()
                })
            })
            .collect();
        let done: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(done, 1600);
        assert!(commits.load(Ordering::Relaxed) < 1600, "no commit was shared: {}", commits.load(Ordering::Relaxed));
    }
}
