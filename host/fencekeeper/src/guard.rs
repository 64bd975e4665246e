//! The guard: the atomic read -> decide -> compare-and-swap loop.
//!
//! Read the mark, ask the decider, and when the verdict advances the mark, swap it
//! in only if nobody changed it meanwhile; on a lost race, decide again against the
//! mark that won. Admits that reuse the current mark touch the store only to read.
//! Because every advance is a compare-and-swap from the value the decision saw, the
//! admits on one resource are linearizable against a max-register.

use crate::decider::{DecideError, Decider};
use crate::store::{MarkStore, StoreError, Swap};
use fencekeeper_core::refusal::{self, Action, Reason};
use fencekeeper_core::{Class, Token, Verdict};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How many lost compare-and-swap races one admit tolerates before it gives up as
/// undecided. Marks only rise, so each lost race means a higher token won; running
/// out takes a sustained stream of ever-higher tokens on one resource.
const MAX_ROUNDS: usize = 64;

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum Undecided {
    /// The mark store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The decider failed.
    #[error(transparent)]
    Decide(#[from] DecideError),
    /// The decider answered an admit that would lower or keep a mark it claims to advance.
    #[error("validator guest broke the contract: it admitted {new} as advancing over mark {old}")]
    NotAdvancing {
        /// The mark the guest saw.
        old: Token,
        /// The mark it proposed.
        new: Token,
    },
    /// Too many concurrent advances on one resource.
    #[error("gave up after {MAX_ROUNDS} lost compare-and-swap races on one resource")]
    Contention,
}

/// The outcome of one admit: the verdict (if one was reached) and what to do.
#[derive(Debug)]
pub struct Decision {
    /// The verdict, or `None` when the request could not be decided.
    pub verdict: Option<Verdict>,
    /// Forward or refuse, with the class to count and the header token.
    pub action: Action,
    /// Why the request could not be decided, when it could not.
    pub undecided: Option<Undecided>,
}

impl Decision {
    /// True when the write may proceed.
    pub fn admitted(&self) -> bool {
        self.action.forward
    }

    /// The class of the outcome.
    pub fn class(&self) -> Class {
        self.action.class
    }

    /// The one-line reason, for a response body or a log line.
    pub fn reason(&self, resource: &str) -> String {
        let cause: &dyn std::fmt::Display = match &self.undecided {
            Some(e) => e,
            None => &"",
        };
        Reason { verdict: self.verdict.as_ref(), resource, cause }.to_string()
    }
}

/// Counts of outcomes by class, plus requests passed because efficiency mode failed open.
#[derive(Debug, Default)]
pub struct Counters {
    by_class: [AtomicU64; Class::ALL.len()],
    failed_open: AtomicU64,
}

impl Counters {
    fn record(&self, action: &Action) {
        self.by_class[class_index(action.class)].fetch_add(1, Ordering::Relaxed);
        if action.forward && action.class != Class::Admitted {
            self.failed_open.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many outcomes of `class` were recorded.
    pub fn get(&self, class: Class) -> u64 {
        self.by_class[class_index(class)].load(Ordering::Relaxed)
    }

    /// How many requests passed without a verdict that admitted them (efficiency mode).
    pub fn failed_open(&self) -> u64 {
        self.failed_open.load(Ordering::Relaxed)
    }
}

fn class_index(class: Class) -> usize {
    Class::ALL.iter().position(|c| *c == class).unwrap_or(0)
}

/// Fencing for one set of resources: a decider, a mark store and counters.
pub struct Guard {
    decider: Arc<dyn Decider>,
    store: Arc<dyn MarkStore + Send + Sync>,
    counters: Counters,
}

impl Guard {
    /// A guard deciding with `decider` against marks in `store`.
    pub fn new(decider: Arc<dyn Decider>, store: Arc<dyn MarkStore + Send + Sync>) -> Guard {
        Guard { decider, store, counters: Counters::default() }
    }

    /// Decide on a write to `resource` carrying `presented` (None: no token), and
    /// advance the mark in the guard's store when the token is admitted and higher.
    pub fn admit(&self, resource: &str, presented: Option<&str>) -> Decision {
        self.admit_in(&*self.store, resource, presented)
    }

    /// [`Guard::admit`] against another store, such as a view of your engine's open
    /// transaction, so that the mark commits or rolls back with the write itself.
    pub fn admit_in(&self, store: &dyn MarkStore, resource: &str, presented: Option<&str>) -> Decision {
        let (verdict, undecided) = match self.decide_and_swap(store, resource, presented) {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e)),
        };
        let action = refusal::resolve(self.decider.policy().mode, verdict.as_ref());
        self.counters.record(&action);
        Decision { verdict, action, undecided }
    }

    /// The resource's current mark in the guard's store.
    pub fn mark(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        self.store.get(resource)
    }

    /// The outcome counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The decider.
    pub fn decider(&self) -> &dyn Decider {
        &*self.decider
    }

    /// The mark store.
    pub fn store(&self) -> &(dyn MarkStore + Send + Sync) {
        &*self.store
    }

    fn decide_and_swap(
        &self,
        store: &dyn MarkStore,
        resource: &str,
        presented: Option<&str>,
    ) -> Result<Verdict, Undecided> {
        let mut mark = store.get(resource)?;
        for _ in 0..MAX_ROUNDS {
            let verdict = self.decider.decide(resource, presented, mark.as_ref())?;
            let Verdict::Admit { mark: new, advanced } = verdict else {
                return Ok(verdict);
            };
            // A user-supplied guest is not trusted to keep the invariant: the host
            // checks that an admit never lowers the mark, whatever the guest says.
            match (mark, advanced) {
                (Some(old), true) if new.partial_cmp(&old) != Some(std::cmp::Ordering::Greater) => {
                    return Err(Undecided::NotAdvancing { old, new })
                }
                (Some(old), false) if new != old => return Err(Undecided::NotAdvancing { old, new }),
                (None, false) => return Err(DecideError::Contract("admitted without a mark to keep".into()).into()),
                (_, false) => return Ok(verdict),
                (_, true) => {}
            }
            match store.compare_and_swap(resource, mark.as_ref(), &new)? {
                Swap::Swapped => return Ok(verdict),
                Swap::Conflict(current) => mark = current,
            }
        }
        Err(Undecided::Contention)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{MemoryStore, NativeDecider};
    use fencekeeper_core::{Mode, Policy};

    fn guard(mode: Mode) -> Guard {
        Guard::new(Arc::new(NativeDecider(Policy { mode, strict: false })), Arc::new(MemoryStore::new()))
    }

    #[test]
    fn stale_token_is_refused_after_a_newer_admit() {
        let g = guard(Mode::Correctness);
        assert!(g.admit("f", Some("33")).admitted());
        assert!(g.admit("f", Some("34")).admitted());
        let d = g.admit("f", Some("33"));
        assert_eq!(d.class(), Class::Stale);
        assert_eq!(d.action.token.map(|t| t.to_string()), Some("34".into()));
        assert_eq!(g.mark("f").unwrap().map(|t| t.to_string()), Some("34".into()));
        assert_eq!(g.counters().get(Class::Stale), 1);
    }

    #[test]
    fn missing_token_fails_closed_in_correctness_and_open_in_efficiency() {
        assert!(!guard(Mode::Correctness).admit("f", None).admitted());
        let g = guard(Mode::Efficiency);
        assert!(g.admit("f", None).admitted());
        assert_eq!(g.counters().failed_open(), 1);
    }
}
