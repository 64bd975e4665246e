//! One change a host makes to a resource's chain, and what it came to: the same
//! rules whether the chain is swapped in etcd by the Envoy filter or in the
//! library's chain store by the gateway. A host reads the record, applies the change
//! to it ([`Change::apply`]), and swaps it back only if it changed.

use crate::{Answer, Chain, Lend, Refusal, Term, Version};
use fencekeeper_core::Token;

/// What a write does to its resource's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Read only: what the write would be lent on, for a head that goes before its
    /// body (the body, and with it the version it makes, is not known yet).
    Peek(Token, Term),
    /// Lend the write, which makes `makes` (when told: the body's MD5, or absent for a
    /// delete). `on`: the precondition its head already carries, which the lend must
    /// be on.
    Lend {
        /// The write's token.
        token: Token,
        /// The version it makes, if told.
        makes: Option<Version>,
        /// The precondition its head carries, if it went.
        on: Option<Version>,
        /// When it is lent, and how long the store may apply it.
        term: Term,
    },
    /// The store answered lend `id` (or the write was never sent).
    Settle {
        /// The lend.
        id: u64,
        /// What the store's answer says.
        answer: Answer,
    },
    /// A read saw the store at this version.
    Learn(Version),
}

/// What a change of a chain came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    /// `Peek`: the lend the write would get. `Lend`: the lend it got.
    Lent(Lend),
    /// The chain refuses the write.
    Refused(Refusal),
    /// The lend would be on another version than the one the head carried: the
    /// store's version moved while the body arrived.
    Moved {
        /// The precondition the head carried.
        carried: Version,
        /// The version the chain has now.
        now: Version,
    },
    /// `Settle` or `Learn`: the chain after it.
    Chain(Chain),
}

impl Change {
    /// Make the change on `chain`. A refusal, a move and a peek leave it as it was;
    /// the host records the chain only when it changed.
    pub fn apply(&self, chain: &mut Chain) -> Done {
        match self {
            Change::Peek(token, term) => match chain.clone().lend(*token, None, *term) {
                Ok(lend) => Done::Lent(lend),
                Err(refusal) => Done::Refused(refusal),
            },
            Change::Lend { token, makes, on, term } => {
                let mut lent = chain.clone();
                match lent.lend(*token, makes.as_ref(), *term) {
                    Err(refusal) => Done::Refused(refusal),
                    Ok(lend) => match on.as_ref().filter(|carried| **carried != lend.on) {
                        Some(carried) => Done::Moved { carried: carried.clone(), now: lend.on },
                        None => {
                            *chain = lent;
                            Done::Lent(lend)
                        }
                    },
                }
            }
            Change::Settle { id, answer } => {
                chain.settle(*id, answer);
                Done::Chain(chain.clone())
            }
            Change::Learn(version) => {
                chain.learn(version.clone());
                Done::Chain(chain.clone())
            }
        }
    }

    /// The change made again at `now`: a lend's term starts when it is recorded.
    pub fn renewed(self, now: Term) -> Change {
        match self {
            Change::Peek(token, _) => Change::Peek(token, now),
            Change::Lend { token, makes, on, .. } => Change::Lend { token, makes, on, term: now },
            other => other,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn t(n: u64) -> Token {
        Token::from_parts(&[n]).unwrap()
    }

    const NOW: Term = Term { now_ms: 1_000, lifetime_ms: Some(60_000) };

    #[test]
    fn a_peek_and_a_refusal_and_a_move_leave_the_chain_as_it_was() {
        let mut chain = Chain::new();
        let before = chain.clone();
        assert!(matches!(Change::Peek(t(3), NOW).apply(&mut chain), Done::Lent(l) if l.on == Version::Absent));
        let tag = Version::tag(b"\"a\"").unwrap();
        let carried = Some(tag.clone());
        let moved = Change::Lend { token: t(3), makes: None, on: carried, term: NOW }.apply(&mut chain);
        assert_eq!(moved, Done::Moved { carried: tag, now: Version::Absent });
        assert_eq!(chain, before);
        let lent = Change::Lend { token: t(3), makes: None, on: None, term: NOW }.apply(&mut chain);
        assert!(matches!(lent, Done::Lent(_)) && chain.lends.len() == 1);
        let before = chain.clone();
        let stale = Change::Lend { token: t(2), makes: None, on: None, term: NOW }.apply(&mut chain);
        assert_eq!(stale, Done::Refused(Refusal::Stale(t(3))));
        assert_eq!(chain, before);
    }

    #[test]
    fn a_settle_and_a_learn_tell_the_chain_after_them() {
        let mut chain = Chain::new();
        let Done::Lent(lend) = Change::Lend { token: t(3), makes: None, on: None, term: NOW }.apply(&mut chain) else {
            panic!("lent")
        };
        let done = Change::Settle { id: lend.id, answer: Answer::Applied(None) }.apply(&mut chain);
        assert_eq!(done, Done::Chain(chain.clone()));
        assert!(chain.lends.is_empty() && chain.current.is_none());
        let tag = Version::tag(b"\"b\"").unwrap();
        assert!(matches!(Change::Learn(tag.clone()).apply(&mut chain), Done::Chain(c) if c.current == Some(tag)));
    }

    #[test]
    fn made_again_a_lend_takes_the_new_term() {
        let later = Term { now_ms: 9_000, ..NOW };
        assert_eq!(Change::Peek(t(3), NOW).renewed(later), Change::Peek(t(3), later));
        let lend = Change::Lend { token: t(3), makes: None, on: None, term: NOW };
        assert_eq!(lend.renewed(later), Change::Lend { token: t(3), makes: None, on: None, term: later });
        assert_eq!(Change::Learn(Version::Absent).renewed(later), Change::Learn(Version::Absent));
    }
}
