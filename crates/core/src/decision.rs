//! The fencing decision: a presented token against a resource's mark.
//!
//! no mark -> admit, mark := p; p > m -> admit, mark := p (advanced);
//! p == m -> admit (the holder writing again), or refuse as replayed when strict;
//! p < m -> refuse as stale, reporting m. Tokens whose arity differs from the
//! mark's are malformed. The decision never lowers a mark.

use crate::resource;
use crate::token::{Malformed, Token};
use core::cmp::Ordering;

/// What a host does when the validator cannot decide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Fail closed (default): missing tokens and undecidable requests are refused.
    #[default]
    Correctness,
    /// Fail open: stale tokens are still refused, but requests without a token and
    /// requests the validator cannot decide pass, and are counted.
    Efficiency,
}

/// How a validator decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Correctness (fail closed) or efficiency (fail open).
    pub mode: Mode,
    /// Refuse a token equal to the mark as replayed instead of admitting it.
    pub strict: bool,
}

/// The decision on one presented token.
///
/// `M` is what a malformed verdict carries: the core's own [`Malformed`] value, or,
/// in a host, the reason text a guest gave (hosts must carry a guest's own reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict<M = Malformed> {
    /// Admit. `mark` is the presented token, which is the mark after the admit; when
    /// `advanced` the host must store it (compare-and-swap) before reporting the admit.
    Admit {
        /// The mark after this admit (the presented token).
        mark: Token,
        /// The mark rose.
        advanced: bool,
    },
    /// The token is lower than the mark.
    Stale {
        /// The current mark.
        mark: Token,
        /// The presented token, as parsed.
        presented: Token,
    },
    /// Strict mode: the token equals the mark.
    Replayed {
        /// The current mark (and the presented token).
        mark: Token,
    },
    /// The token or the resource key is malformed.
    Malformed(M),
    /// No token was presented.
    Missing,
}

impl<M> Verdict<M> {
    /// The token this verdict raises the mark to: `Some` for an admit that advances it,
    /// the one kind of verdict a provenance check (is this token one the lock service
    /// issued?) must vouch for before the host stores it. An admit of a token equal to
    /// the mark needs no check: that token was vouched for when it became the mark.
    pub fn advance(&self) -> Option<&Token> {
        match self {
            Verdict::Admit { mark, advanced: true } => Some(mark),
            _ => None,
        }
    }

    /// The same verdict with its malformed payload mapped by `f`.
    pub fn map_malformed<N>(self, f: impl FnOnce(M) -> N) -> Verdict<N> {
        match self {
            Verdict::Admit { mark, advanced } => Verdict::Admit { mark, advanced },
            Verdict::Stale { mark, presented } => Verdict::Stale { mark, presented },
            Verdict::Replayed { mark } => Verdict::Replayed { mark },
            Verdict::Malformed(m) => Verdict::Malformed(f(m)),
            Verdict::Missing => Verdict::Missing,
        }
    }
}

/// The bounds every host checks before a validator sees a request: the resource key
/// (1 to 1024 bytes) and the token text's length ([`MAX_TOKEN_BYTES`](crate::token::MAX_TOKEN_BYTES)).
/// A request that fails them is malformed without asking the validator, so no
/// request a client can craft makes a validator do unbounded work.
pub fn precheck(resource: &str, presented: Option<&str>) -> Result<(), Malformed> {
    resource::check(resource).map_err(Malformed::Resource)?;
    match presented {
        Some(raw) => crate::token::check_length(raw),
        None => Ok(()),
    }
}

/// Decide on `presented` (raw text; `None` when the request carried no token)
/// against the resource's current mark (`None` before its first admit). The
/// resource key is not an input: hosts [`precheck`] it, and the decision is a pure
/// function of (policy, presented token, mark).
pub fn decide(policy: &Policy, presented: Option<&str>, mark: Option<&Token>) -> Verdict {
    let Some(raw) = presented else {
        return Verdict::Missing;
    };
    match Token::parse(raw) {
        Ok(token) => decide_token(policy, token, mark),
        Err(e) => Verdict::Malformed(e),
    }
}

/// [`decide`] for a token that is already parsed.
pub fn decide_token(policy: &Policy, presented: Token, mark: Option<&Token>) -> Verdict {
    let Some(mark) = mark else {
        return Verdict::Admit { mark: presented, advanced: true };
    };
    match presented.partial_cmp(mark) {
        None => Verdict::Malformed(Malformed::ArityMismatch { mark: mark.arity(), presented: presented.arity() }),
        Some(Ordering::Greater) => Verdict::Admit { mark: presented, advanced: true },
        Some(Ordering::Equal) if policy.strict => Verdict::Replayed { mark: *mark },
        Some(Ordering::Equal) => Verdict::Admit { mark: *mark, advanced: false },
        Some(Ordering::Less) => Verdict::Stale { mark: *mark, presented },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::token;
    use proptest::prelude::*;

    const LAX: Policy = Policy { mode: Mode::Correctness, strict: false };
    const STRICT: Policy = Policy { mode: Mode::Correctness, strict: true };

    #[test]
    fn seed_scenario_refuses_the_paused_holder() {
        let mark = token!("34");
        assert_eq!(decide(&LAX, Some("33"), Some(&mark)), Verdict::Stale { mark, presented: token!("33") });
    }

    #[test]
    fn equal_token_is_admitted_without_advancing_unless_strict() {
        let mark = token!("34");
        assert_eq!(decide(&LAX, Some("034"), Some(&mark)), Verdict::Admit { mark, advanced: false });
        assert_eq!(decide(&STRICT, Some("34"), Some(&mark)), Verdict::Replayed { mark });
    }

    #[test]
    fn only_an_advancing_admit_needs_a_provenance_check() {
        let mark = token!("34");
        assert_eq!(decide(&LAX, Some("35"), Some(&mark)).advance(), Some(&token!("35")));
        assert_eq!(decide(&LAX, Some("7"), None).advance(), Some(&token!("7")), "a first mark advances");
        assert_eq!(decide(&LAX, Some("34"), Some(&mark)).advance(), None, "equal to the mark");
        assert_eq!(decide(&LAX, Some("33"), Some(&mark)).advance(), None);
        assert_eq!(decide(&LAX, None, Some(&mark)).advance(), None);
    }

    #[test]
    fn first_token_is_admitted_and_fixes_arity() {
        assert_eq!(decide(&STRICT, Some("7.1"), None), Verdict::Admit { mark: token!("7.1"), advanced: true });
        assert_eq!(
            decide(&LAX, Some("8"), Some(&token!("7.1"))),
            Verdict::Malformed(Malformed::ArityMismatch { mark: 2, presented: 1 })
        );
    }

    #[test]
    fn missing_token_and_bad_keys_are_reported() {
        assert_eq!(decide(&LAX, None, None), Verdict::Missing);
        assert!(matches!(precheck("", Some("1")), Err(Malformed::Resource(_))));
        let long = "k".repeat(1025);
        assert!(matches!(precheck(&long, Some("1")), Err(Malformed::Resource(_))));
        assert_eq!(precheck(&long[..1024], Some("1")), Ok(()));
        assert_eq!(precheck("f", None), Ok(()));
    }

    #[test]
    fn precheck_bounds_the_token_text_before_any_validator_parses_it() {
        let long = "0".repeat(crate::token::MAX_TOKEN_BYTES + 1);
        assert_eq!(precheck("f", Some(&long)), Err(Malformed::TooLong(long.len())));
        assert_eq!(precheck("f", Some(&long[1..])), Ok(()));
    }

    fn token_strategy(arity: usize) -> impl Strategy<Value = Token> {
        proptest::collection::vec(any::<u64>(), arity).prop_map(|v| Token::from_parts(&v).unwrap())
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_round_trips(raw in ".{0,64}") {
            if let Ok(tok) = Token::parse(&raw) {
                prop_assert_eq!(Token::parse(&std::format!("{tok}")), Ok(tok));
            }
        }

        #[test]
        fn canonical_text_round_trips(tok in (1usize..=4).prop_flat_map(token_strategy)) {
            prop_assert_eq!(Token::parse(&std::format!("{tok}")), Ok(tok));
        }

        #[test]
        fn applying_verdicts_never_lowers_the_mark(
            strict in any::<bool>(),
            steps in proptest::collection::vec(0u64..20, 1..64),
        ) {
            let policy = Policy { mode: Mode::Correctness, strict };
            let mut mark: Option<Token> = None;
            for step in steps {
                let presented = Token::from_parts(&[step]).unwrap();
                let verdict = decide_token(&policy, presented, mark.as_ref());
                match verdict {
                    Verdict::Admit { mark: new, advanced } => {
                        prop_assert!(mark.is_none_or(|m| new >= m));
                        prop_assert_eq!(advanced, mark.is_none_or(|m| new > m));
                        prop_assert_eq!(new, presented);
                        mark = Some(new);
                    }
                    Verdict::Stale { mark: m, presented: p } => prop_assert!(p == presented && presented < m && Some(m) == mark),
                    Verdict::Replayed { mark: m } => prop_assert!(strict && presented == m),
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
            }
        }

        #[test]
        fn comparison_is_lexicographic(a in token_strategy(2), b in token_strategy(2)) {
            prop_assert_eq!(a.partial_cmp(&b), Some(a.parts().cmp(b.parts())));
        }
    }
}
