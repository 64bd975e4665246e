//! The host's check of every verdict: a decider is asked, never obeyed.
//!
//! The contract fixes the order of tokens, and the guard knows the mark it read and
//! the text the client sent. So for every verdict it can check:
//!
//! * an admit's token is the presented one, at or above the mark read, of the same
//!   arity; `advanced` is true exactly when the token is above it (or there was no
//!   mark); in strict mode an admit is above the mark;
//! * a stale verdict reports the mark read and a token below it;
//! * a replayed verdict comes from strict mode and reports the mark read;
//! * `missing` means no token was presented, and every other verdict means one was;
//! * where the presented text is in the canonical form (decimal components joined by
//!   `.`), the guest's token must be exactly what that text says. A guest may read
//!   other syntaxes its own way; that, and refusing more than the reference rules
//!   (a stricter `malformed`), is what the host cannot check: conformance is for it.
//!
//! A verdict that fails a check is a [`Breach`]. It never forwards a write, in either
//! mode: the guard answers the refusal the host can prove itself (stale when the
//! presented text is below the mark, replayed, or malformed for a wrong arity), or
//! else refuses the request as undecided.

use crate::{GuestText, Verdict};
use fencekeeper_core::{Malformed, Policy, Token};
use std::cmp::Ordering;

/// A verdict the host proved wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("validator broke the contract: {what}")]
pub struct Breach {
    /// What was wrong, in one line.
    pub what: String,
    /// The refusal the host can prove on its own, if any.
    pub proven: Option<Verdict>,
}

/// Check `verdict`, given for the presented text against the mark `read`.
pub(crate) fn check(
    policy: &Policy,
    presented: Option<&str>,
    read: Option<&Token>,
    verdict: &Verdict,
) -> Result<(), Breach> {
    let canonical = presented.and_then(|raw| Token::parse(raw).ok());
    let breach = |what: String| Breach { what, proven: provable(policy, canonical, read) };
    match (verdict, presented) {
        (Verdict::Missing, None) | (Verdict::Malformed(_), Some(_)) => Ok(()),
        (Verdict::Missing, Some(_)) => Err(breach("it answered missing for a presented token".into())),
        (_, None) => Err(breach("it decided on a token that was never presented".into())),
        (Verdict::Admit { mark: token, advanced }, Some(_)) => {
            same_as_text(*token, canonical).map_err(breach)?;
            let order = read.map(|m| token.partial_cmp(m));
            match order {
                Some(None) => Err(breach(format!("it admitted {token}, whose arity differs from the mark's"))),
                Some(Some(Ordering::Less)) => Err(breach(format!("it admitted {token} below the mark"))),
                Some(Some(Ordering::Equal)) if policy.strict => {
                    Err(breach(format!("it admitted {token}, equal to the mark, in strict mode")))
                }
                _ if *advanced != matches!(order, None | Some(Some(Ordering::Greater))) => {
                    Err(breach(format!("it admitted {token} with advanced = {advanced}")))
                }
                _ => Ok(()),
            }
        }
        (Verdict::Stale { mark, presented: token }, Some(_)) => {
            same_mark(mark, read).map_err(breach)?;
            same_as_text(*token, canonical).map_err(breach)?;
            match token.partial_cmp(mark) {
                Some(Ordering::Less) => Ok(()),
                _ => Err(breach(format!("it called {token} stale against mark {mark}"))),
            }
        }
        (Verdict::Replayed { mark }, Some(_)) => {
            same_mark(mark, read).map_err(breach)?;
            same_as_text(*mark, canonical).map_err(breach)?;
            if policy.strict {
                Ok(())
            } else {
                Err(breach("it refused a replay outside strict mode".into()))
            }
        }
    }
}

/// A breach found elsewhere (an answer of the wrong shape), with what the host can prove.
pub(crate) fn breach(policy: &Policy, presented: Option<&str>, read: Option<&Token>, what: String) -> Breach {
    let canonical = presented.and_then(|raw| Token::parse(raw).ok());
    Breach { what, proven: provable(policy, canonical, read) }
}

fn same_as_text(token: Token, canonical: Option<Token>) -> Result<(), String> {
    match canonical {
        Some(text) if text != token => Err(format!("it read the token {text} as {token}")),
        _ => Ok(()),
    }
}

fn same_mark(mark: &Token, read: Option<&Token>) -> Result<(), String> {
    match read {
        Some(m) if m == mark => Ok(()),
        Some(m) => Err(format!("it reported mark {mark}, but the mark is {m}")),
        None => Err(format!("it reported mark {mark}, but the resource has none")),
    }
}

/// The refusal the host can prove from the presented text alone.
fn provable(policy: &Policy, canonical: Option<Token>, read: Option<&Token>) -> Option<Verdict> {
    let (token, mark) = (canonical?, *read?);
    match token.partial_cmp(&mark) {
        None => Some(Verdict::Malformed(GuestText::new(
            &Malformed::ArityMismatch { mark: mark.arity(), presented: token.arity() }.to_string(),
        ))),
        Some(Ordering::Less) => Some(Verdict::Stale { mark, presented: token }),
        Some(Ordering::Equal) if policy.strict => Some(Verdict::Replayed { mark }),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::Mode;

    const LAX: Policy = Policy { mode: Mode::Efficiency, strict: false };
    const STRICT: Policy = Policy { mode: Mode::Correctness, strict: true };

    fn t(s: &str) -> Token {
        Token::parse(s).unwrap()
    }

    fn admit(s: &str, advanced: bool) -> Verdict {
        Verdict::Admit { mark: t(s), advanced }
    }

    #[test]
    fn honest_verdicts_pass() {
        assert_eq!(check(&LAX, Some("34"), None, &admit("34", true)), Ok(()));
        assert_eq!(check(&LAX, Some("34"), Some(&t("33")), &admit("34", true)), Ok(()));
        assert_eq!(check(&LAX, Some("034"), Some(&t("34")), &admit("34", false)), Ok(()));
        let stale = Verdict::Stale { mark: t("34"), presented: t("33") };
        assert_eq!(check(&LAX, Some("33"), Some(&t("34")), &stale), Ok(()));
        assert_eq!(check(&STRICT, Some("34"), Some(&t("34")), &Verdict::Replayed { mark: t("34") }), Ok(()));
        assert_eq!(check(&LAX, None, Some(&t("34")), &Verdict::Missing), Ok(()));
        // A stricter guest may call a valid token malformed: refusing more is safe.
        assert_eq!(check(&LAX, Some("34"), None, &Verdict::Malformed(GuestText::new("no"))), Ok(()));
        // Text outside the canonical form is the guest's to read.
        assert_eq!(check(&LAX, Some("0x22"), Some(&t("33")), &admit("34", true)), Ok(()));
    }

    #[test]
    fn an_admit_below_the_mark_is_proven_stale() {
        let e = check(&LAX, Some("33"), Some(&t("34")), &admit("34", false)).unwrap_err();
        assert!(e.what.contains("read the token 33 as 34"), "{e}");
        assert_eq!(e.proven, Some(Verdict::Stale { mark: t("34"), presented: t("33") }));
        let e = check(&LAX, Some("0x21"), Some(&t("34")), &admit("33", true)).unwrap_err();
        assert!(e.what.contains("below the mark"), "{e}");
        assert_eq!(e.proven, None, "the host cannot read 0x21 itself");
    }

    #[test]
    fn a_lock_out_to_the_maximum_is_caught() {
        let max = Token::from_parts(&[u64::MAX]).unwrap();
        let e = check(&LAX, Some("5"), None, &Verdict::Admit { mark: max, advanced: true }).unwrap_err();
        assert!(e.what.contains("read the token 5 as 18446744073709551615"), "{e}");
        assert_eq!(e.proven, None);
    }

    #[test]
    fn lies_about_advancing_arity_strictness_and_marks_are_caught() {
        assert!(check(&LAX, Some("35"), Some(&t("34")), &admit("35", false)).is_err());
        assert!(check(&LAX, Some("34"), Some(&t("34")), &admit("34", true)).is_err());
        let arity = check(&LAX, Some("7.1"), Some(&t("34")), &admit("7.1", true)).unwrap_err();
        assert!(matches!(arity.proven, Some(Verdict::Malformed(_))));
        let replay = check(&STRICT, Some("34"), Some(&t("34")), &admit("34", false)).unwrap_err();
        assert_eq!(replay.proven, Some(Verdict::Replayed { mark: t("34") }));
        let wrong_mark = Verdict::Stale { mark: t("99"), presented: t("33") };
        assert!(check(&LAX, Some("33"), Some(&t("34")), &wrong_mark).is_err());
        let not_lower = Verdict::Stale { mark: t("34"), presented: t("35") };
        assert!(check(&LAX, Some("35"), Some(&t("34")), &not_lower).is_err());
        assert!(check(&LAX, Some("34"), Some(&t("34")), &Verdict::Replayed { mark: t("34") }).is_err());
        assert!(check(&LAX, Some("34"), None, &Verdict::Missing).is_err());
        assert!(check(&LAX, None, None, &admit("1", true)).is_err());
    }
}
