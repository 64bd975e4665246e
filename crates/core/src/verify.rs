//! A host's check of a validator's verdict: what it can know without trusting the
//! validator.
//!
//! The contract fixes the order of tokens and their canonical text form, and the
//! host knows the mark it read and the text the client sent. So for every verdict it
//! can check that:
//!
//! * an admit's token is the presented one, at or above the mark read, of the same
//!   arity; `advanced` is true exactly when the token is above it (or there was no
//!   mark); in strict mode an admit is above the mark;
//! * a stale verdict reports the mark read and a token below it;
//! * a replayed verdict comes from strict mode and reports the mark read;
//! * `missing` means no token was presented, and every other verdict means one was;
//! * where the presented text is in the canonical form (decimal components joined by
//!   `.`), the validator's token is exactly what that text says.
//!
//! A validator may read other syntaxes its own way, and may refuse more than the
//! reference rules (a stricter `malformed`): that is what a host cannot check, and
//! what the conformance vectors are for. A verdict that fails a check is a
//! [`Breach`]; [`provable`] is the refusal the host can stand behind on its own.

use crate::decision::{Policy, Verdict};
use crate::token::{Malformed, Token};
use core::cmp::Ordering;
use core::fmt;

/// How a verdict broke the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breach {
    /// `missing` for a request that carried a token.
    MissingForPresented,
    /// A verdict on a token for a request that carried none.
    DecidedWithoutToken,
    /// The canonical text says one token, the validator another.
    Misread {
        /// What the text says.
        text: Token,
        /// What the validator said.
        read: Token,
    },
    /// An admit of a token whose arity differs from the mark's.
    AdmittedOtherArity(Token),
    /// An admit below the mark.
    AdmittedBelowMark(Token),
    /// An admit equal to the mark in strict mode.
    AdmittedReplay(Token),
    /// An admit whose `advanced` flag is wrong.
    WrongAdvance {
        /// The admitted token.
        token: Token,
        /// What the validator said.
        advanced: bool,
    },
    /// A refusal reporting a mark other than the one read.
    WrongMark {
        /// The mark reported.
        reported: Token,
        /// The mark read (`None`: the resource has none).
        read: Option<Token>,
    },
    /// A stale verdict for a token that is not below the mark.
    StaleNotBelow {
        /// The token.
        token: Token,
        /// The mark.
        mark: Token,
    },
    /// A replayed verdict outside strict mode.
    ReplayNotStrict,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Breach::MissingForPresented => f.write_str("it answered missing for a presented token"),
            Breach::DecidedWithoutToken => f.write_str("it decided on a token that was never presented"),
            Breach::Misread { text, read } => write!(f, "it read the token {text} as {read}"),
            Breach::AdmittedOtherArity(t) => write!(f, "it admitted {t}, whose arity differs from the mark's"),
            Breach::AdmittedBelowMark(t) => write!(f, "it admitted {t} below the mark"),
            Breach::AdmittedReplay(t) => write!(f, "it admitted {t}, equal to the mark, in strict mode"),
            Breach::WrongAdvance { token, advanced } => write!(f, "it admitted {token} with advanced = {advanced}"),
            Breach::WrongMark { reported, read: Some(m) } => {
                write!(f, "it reported mark {reported}, but the mark is {m}")
            }
            Breach::WrongMark { reported, read: None } => {
                write!(f, "it reported mark {reported}, but the resource has none")
            }
            Breach::StaleNotBelow { token, mark } => write!(f, "it called {token} stale against mark {mark}"),
            Breach::ReplayNotStrict => f.write_str("it refused a replay outside strict mode"),
        }
    }
}

/// Check `verdict`, given for the `presented` text against the mark `read`.
pub fn check<M>(
    policy: &Policy,
    presented: Option<&str>,
    read: Option<&Token>,
    verdict: &Verdict<M>,
) -> Result<(), Breach> {
    check_read(policy, presented, reading(presented), read, verdict)
}

/// What the presented text says in the canonical reading: the token, or `None` when
/// it is not one. A host deciding several rounds on one text reads it once.
pub fn reading(presented: Option<&str>) -> Option<Token> {
    presented.and_then(|raw| Token::parse(raw).ok())
}

/// [`check`], with the presented text's canonical reading (`reading(presented)`)
/// already made.
pub fn check_read<M>(
    policy: &Policy,
    presented: Option<&str>,
    canonical: Option<Token>,
    read: Option<&Token>,
    verdict: &Verdict<M>,
) -> Result<(), Breach> {
    match (verdict, presented) {
        (Verdict::Missing, None) | (Verdict::Malformed(_), Some(_)) => Ok(()),
        (Verdict::Missing, Some(_)) => Err(Breach::MissingForPresented),
        (_, None) => Err(Breach::DecidedWithoutToken),
        (Verdict::Admit { mark: token, advanced }, Some(_)) => {
            as_text(*token, canonical)?;
            let order = read.map(|m| token.partial_cmp(m));
            match order {
                Some(None) => Err(Breach::AdmittedOtherArity(*token)),
                Some(Some(Ordering::Less)) => Err(Breach::AdmittedBelowMark(*token)),
                Some(Some(Ordering::Equal)) if policy.strict => Err(Breach::AdmittedReplay(*token)),
                _ if *advanced != matches!(order, None | Some(Some(Ordering::Greater))) => {
                    Err(Breach::WrongAdvance { token: *token, advanced: *advanced })
                }
                _ => Ok(()),
            }
        }
        (Verdict::Stale { mark, presented: token }, Some(_)) => {
            same_mark(mark, read)?;
            as_text(*token, canonical)?;
            match token.partial_cmp(mark) {
                Some(Ordering::Less) => Ok(()),
                _ => Err(Breach::StaleNotBelow { token: *token, mark: *mark }),
            }
        }
        (Verdict::Replayed { mark }, Some(_)) => {
            same_mark(mark, read)?;
            as_text(*mark, canonical)?;
            if policy.strict {
                Ok(())
            } else {
                Err(Breach::ReplayNotStrict)
            }
        }
    }
}

/// The refusal a host can prove from the presented text and the mark alone: stale
/// when the canonical text is below the mark, replayed when equal in strict mode,
/// malformed when the arities differ. `None` when the text proves nothing (it is
/// not canonical, there is no mark, or the token is admissible).
pub fn provable(policy: &Policy, presented: Option<&str>, read: Option<&Token>) -> Option<Verdict> {
    let (token, mark) = (Token::parse(presented?).ok()?, *read?);
    match token.partial_cmp(&mark) {
        None => Some(Verdict::Malformed(Malformed::ArityMismatch { mark: mark.arity(), presented: token.arity() })),
        Some(Ordering::Less) => Some(Verdict::Stale { mark, presented: token }),
        Some(Ordering::Equal) if policy.strict => Some(Verdict::Replayed { mark }),
        _ => None,
    }
}

fn as_text(token: Token, canonical: Option<Token>) -> Result<(), Breach> {
    match canonical {
        Some(text) if text != token => Err(Breach::Misread { text, read: token }),
        _ => Ok(()),
    }
}

fn same_mark(mark: &Token, read: Option<&Token>) -> Result<(), Breach> {
    match read {
        Some(m) if m == mark => Ok(()),
        _ => Err(Breach::WrongMark { reported: *mark, read: read.copied() }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decision::Mode;
    use crate::token;

    const LAX: Policy = Policy { mode: Mode::Efficiency, strict: false };
    const STRICT: Policy = Policy { mode: Mode::Correctness, strict: true };

    fn admit(s: &str, advanced: bool) -> Verdict<()> {
        Verdict::Admit { mark: token!(s), advanced }
    }

    #[test]
    fn honest_verdicts_pass() {
        assert_eq!(check(&LAX, Some("34"), None, &admit("34", true)), Ok(()));
        assert_eq!(check(&LAX, Some("34"), Some(&token!("33")), &admit("34", true)), Ok(()));
        assert_eq!(check(&LAX, Some("034"), Some(&token!("34")), &admit("34", false)), Ok(()));
        let stale: Verdict<()> = Verdict::Stale { mark: token!("34"), presented: token!("33") };
        assert_eq!(check(&LAX, Some("33"), Some(&token!("34")), &stale), Ok(()));
        assert_eq!(
            check(&STRICT, Some("34"), Some(&token!("34")), &Verdict::<()>::Replayed { mark: token!("34") }),
            Ok(())
        );
        assert_eq!(check(&LAX, None, Some(&token!("34")), &Verdict::<()>::Missing), Ok(()));
        // A stricter validator may call a valid token malformed: refusing more is safe.
        assert_eq!(check(&LAX, Some("34"), None, &Verdict::Malformed(())), Ok(()));
        // Text outside the canonical form is the validator's to read.
        assert_eq!(check(&LAX, Some("0x22"), Some(&token!("33")), &admit("34", true)), Ok(()));
    }

    #[test]
    fn an_admit_below_the_mark_is_proven_stale() {
        let e = check(&LAX, Some("33"), Some(&token!("34")), &admit("34", false)).unwrap_err();
        assert_eq!(e, Breach::Misread { text: token!("33"), read: token!("34") });
        let stale = Verdict::Stale { mark: token!("34"), presented: token!("33") };
        assert_eq!(provable(&LAX, Some("33"), Some(&token!("34"))), Some(stale));
        let e = check(&LAX, Some("0x21"), Some(&token!("34")), &admit("33", true)).unwrap_err();
        assert_eq!(e, Breach::AdmittedBelowMark(token!("33")));
        assert_eq!(provable(&LAX, Some("0x21"), Some(&token!("34"))), None, "the host cannot read 0x21 itself");
    }

    #[test]
    fn a_lock_out_to_the_maximum_is_caught() {
        let max = Token::from_parts(&[u64::MAX]).unwrap();
        let e = check(&LAX, Some("5"), None, &Verdict::<()>::Admit { mark: max, advanced: true }).unwrap_err();
        assert_eq!(e, Breach::Misread { text: token!("5"), read: max });
        assert_eq!(provable(&LAX, Some("5"), None), None);
    }

    #[test]
    fn lies_about_advancing_arity_strictness_and_marks_are_caught() {
        assert!(check(&LAX, Some("35"), Some(&token!("34")), &admit("35", false)).is_err());
        assert!(check(&LAX, Some("34"), Some(&token!("34")), &admit("34", true)).is_err());
        assert!(check(&LAX, Some("7.1"), Some(&token!("34")), &admit("7.1", true)).is_err());
        assert!(matches!(provable(&LAX, Some("7.1"), Some(&token!("34"))), Some(Verdict::Malformed(_))));
        assert!(check(&STRICT, Some("34"), Some(&token!("34")), &admit("34", false)).is_err());
        assert_eq!(provable(&STRICT, Some("34"), Some(&token!("34"))), Some(Verdict::Replayed { mark: token!("34") }));
        let wrong_mark: Verdict<()> = Verdict::Stale { mark: token!("99"), presented: token!("33") };
        assert!(check(&LAX, Some("33"), Some(&token!("34")), &wrong_mark).is_err());
        let not_lower: Verdict<()> = Verdict::Stale { mark: token!("34"), presented: token!("35") };
        assert!(check(&LAX, Some("35"), Some(&token!("34")), &not_lower).is_err());
        assert!(check(&LAX, Some("34"), Some(&token!("34")), &Verdict::<()>::Replayed { mark: token!("34") }).is_err());
        assert!(check(&LAX, Some("34"), None, &Verdict::<()>::Missing).is_err());
        assert!(check(&LAX, None, None, &admit("1", true)).is_err());
    }
}
