//! The guard: the atomic read -> decide -> verify -> compare-and-swap loop.
//!
//! Check the request's bounds (key length, token length) before anything else, read
//! the mark, ask the decider, check its verdict against what the host knows
//! (`verify`), and when the verdict advances the mark, swap it in only if nobody
//! changed it meanwhile; on a lost race, decide again against the mark that won.
//! Admits that reuse the current mark touch the store only to read. Because every
//! advance is a compare-and-swap from the value the decision saw, the admits on one
//! resource are linearizable against a max-register.

use crate::decider::{DecideError, Decider};
use crate::store::{MarkStore, StoreError, Swap};
use crate::verify::{self, Breach};
use crate::{GuestText, Verdict};
use fencekeeper_core::refusal::{self, Action, NoVerdict, Reason};
use fencekeeper_core::{Class, Token};
use std::sync::Arc;

/// How many lost compare-and-swap races one admit tolerates before it gives up as
/// undecided. Marks only rise, so each lost race means a higher token won; running
/// out takes a sustained stream of ever-higher tokens on one resource.
const MAX_ROUNDS: usize = 64;

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum Undecided {
    /// The mark store failed. The one cause efficiency mode fails open on.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The decider failed (trap, fuel, memory, a malformed answer).
    #[error(transparent)]
    Decide(#[from] DecideError),
    /// The decider's verdict was proven wrong by the host.
    #[error(transparent)]
    Breach(#[from] Breach),
    /// Too many concurrent advances on one resource.
    #[error("gave up after {MAX_ROUNDS} lost compare-and-swap races on one resource")]
    Contention,
}

impl Undecided {
    /// How the mode treats this failure.
    pub fn no_verdict(&self) -> NoVerdict {
        match self {
            Undecided::Store(_) => NoVerdict::StoreUnreachable,
            _ => NoVerdict::Refused,
        }
    }
}

/// The outcome of one admit: the verdict (if one was reached) and what to do.
#[derive(Debug)]
pub struct Decision {
    /// The verdict, or `None` when the request could not be decided. After a
    /// breach this is the refusal the host proved on its own, if it could.
    pub verdict: Option<Verdict>,
    /// Forward or refuse, with the class to count and the header token.
    pub action: Action,
    /// Why the request could not be decided (or which contract was broken).
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

    /// The decider broke the contract on this request (to count and log).
    pub fn breach(&self) -> Option<&Breach> {
        match &self.undecided {
            Some(Undecided::Breach(b)) => Some(b),
            _ => None,
        }
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

/// Fencing for one set of resources: a decider and a mark store. It keeps no state
/// of its own (no counters, no locks): the admit path shares nothing between
/// callers but the mark. Callers count the [`Decision`]s they act on.
pub struct Guard {
    decider: Arc<dyn Decider>,
    store: Arc<dyn MarkStore + Send + Sync>,
}

impl Guard {
    /// A guard deciding with `decider` against marks in `store`.
    pub fn new(decider: Arc<dyn Decider>, store: Arc<dyn MarkStore + Send + Sync>) -> Guard {
        Guard { decider, store }
    }

    /// Decide on a write to `resource` carrying `presented` (None: no token), and
    /// advance the mark in the guard's store when the token is admitted and higher.
    pub fn admit(&self, resource: &str, presented: Option<&str>) -> Decision {
        self.admit_in(&*self.store, resource, presented)
    }

    /// [`Guard::admit`] against another store, such as a view of your engine's open
    /// transaction, so that the mark commits or rolls back with the write itself.
    pub fn admit_in(&self, store: &dyn MarkStore, resource: &str, presented: Option<&str>) -> Decision {
        let mode = self.decider.policy().mode;
        match self.decide_and_swap(store, resource, presented) {
            Ok(verdict) => {
                Decision { action: refusal::resolve(mode, Ok(&verdict)), verdict: Some(verdict), undecided: None }
            }
            Err(Undecided::Breach(breach)) => {
                let verdict = breach.proven.clone();
                // Only refusals are ever proven, so a breach never forwards; the
                // guard says so rather than rely on it.
                let mut action = match &verdict {
                    Some(v) => refusal::resolve(mode, Ok(v)),
                    None => refusal::resolve::<GuestText>(mode, Err(NoVerdict::Refused)),
                };
                action.forward = false;
                Decision { verdict, action, undecided: Some(Undecided::Breach(breach)) }
            }
            Err(e) => Decision {
                action: refusal::resolve::<GuestText>(mode, Err(e.no_verdict())),
                verdict: None,
                undecided: Some(e),
            },
        }
    }

    /// The resource's current mark in the guard's store.
    pub fn mark(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        self.store.get(resource)
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
        // Bounded before anything is read or asked: an over-long token never
        // reaches the validator, so no request can exhaust its fuel.
        if let Err(m) = fencekeeper_core::precheck(resource, presented) {
            return Ok(Verdict::Malformed(GuestText::new(&m.to_string())));
        }
        let policy = self.decider.policy();
        let read = store.read(resource)?;
        let (mut mark, mut exact) = (read.mark, read.exact);
        for _ in 0..MAX_ROUNDS {
            let verdict = self.decider.decide(presented, mark.as_ref()).map_err(|e| match e {
                // An answer of the wrong shape is a broken contract like a wrong verdict.
                DecideError::Contract(what) => {
                    Undecided::Breach(verify::breach(&policy, presented, mark.as_ref(), what))
                }
                fault => Undecided::Decide(fault),
            })?;
            verify::check(&policy, presented, mark.as_ref(), &verdict)?;
            // Every answer rests on the store's own word (a read, a swap or a
            // confirm), never on a local copy alone: the admits stay linearizable.
            let swap = match verdict {
                Verdict::Admit { mark: new, advanced: true } => {
                    store.compare_and_swap(resource, mark.as_ref(), &new)?
                }
                Verdict::Admit { mark: same, advanced: false } if !exact => store.confirm(resource, &same)?,
                Verdict::Missing => return Ok(verdict),
                _ if !exact => Swap::Conflict(store.get(resource)?),
                _ => return Ok(verdict),
            };
            match swap {
                Swap::Swapped => return Ok(verdict),
                Swap::Conflict(current) => (mark, exact) = (current, true),
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
        assert!(d.reason("f").contains("stale fencing token 33"), "{}", d.reason("f"));
        assert_eq!(g.mark("f").unwrap().map(|t| t.to_string()), Some("34".into()));
    }

    #[test]
    fn missing_token_is_refused_in_both_modes() {
        for mode in [Mode::Correctness, Mode::Efficiency] {
            let g = guard(mode);
            let d = g.admit("f", None);
            assert!(!d.admitted() && d.class() == Class::Missing, "{mode:?}");
            assert!(!d.action.failed_open());
        }
    }

    #[test]
    fn over_long_tokens_and_keys_are_malformed_before_the_decider_is_asked() {
        struct Unreachable;
        impl Decider for Unreachable {
            fn policy(&self) -> Policy {
                Policy { mode: Mode::Efficiency, strict: false }
            }
            fn decide(&self, _: Option<&str>, _: Option<&Token>) -> Result<Verdict, DecideError> {
                Err(DecideError::GuestFault("asked".into()))
            }
        }
        let g = Guard::new(Arc::new(Unreachable), Arc::new(MemoryStore::new()));
        let long = format!("{}33", "0".repeat(fencekeeper_core::token::MAX_TOKEN_BYTES));
        for (resource, token) in [("f", long.as_str()), ("", "33")] {
            let d = g.admit(resource, Some(token));
            assert_eq!(d.class(), Class::Malformed);
            assert!(!d.admitted());
        }
    }
}
