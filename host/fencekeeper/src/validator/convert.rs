//! The guest's answers, as WIT values, into the host's types. Only the shape is
//! checked here (a token has 1 to 4 components); whether the verdict is true is
//! `verify`'s job, in the guard, for every decider alike.

use super::bindings::exports::fencekeeper::validator::types as wit;
use crate::{DecideError, GuestText, Verdict};
use fencekeeper_core::{Mode, Policy, Token};

/// A token the guest returned, which must have 1 to 4 components.
pub(super) fn token(t: &wit::Token, role: &str) -> Result<Token, DecideError> {
    Token::from_array([t.c0, t.c1, t.c2, t.c3], usize::from(t.arity)).map_err(|_| {
        DecideError::Contract(format!("the guest returned a {role} token of arity {}; tokens have 1 to 4", t.arity))
    })
}

/// A token as the WIT record.
pub(super) fn to_wit(t: &Token) -> wit::Token {
    let [c0, c1, c2, c3] = t.to_array();
    wit::Token { arity: t.arity() as u8, c0, c1, c2, c3 }
}

/// The policy as the WIT record.
pub(super) fn policy(p: &Policy) -> wit::Policy {
    let mode = match p.mode {
        Mode::Correctness => wit::Mode::Correctness,
        Mode::Efficiency => wit::Mode::Efficiency,
    };
    wit::Policy { mode, strict: p.strict }
}

/// The guest's verdict as the host's, its reason made safe to print.
pub(super) fn verdict(answer: wit::Verdict) -> Result<Verdict, DecideError> {
    Ok(match answer {
        wit::Verdict::Admit(a) => Verdict::Admit { mark: token(&a.token, "admitted")?, advanced: a.advanced },
        wit::Verdict::Stale(r) => {
            Verdict::Stale { mark: token(&r.mark, "stale mark")?, presented: token(&r.token, "stale")? }
        }
        wit::Verdict::Replayed(r) => replayed(&r)?,
        wit::Verdict::Malformed(reason) => Verdict::Malformed(GuestText::new(&reason)),
        wit::Verdict::Missing => Verdict::Missing,
    })
}

/// A short verdict as the host's; `None` for a malformed one, whose reason only
/// `decide` gives. Each case converted in place: this runs on every call.
pub(super) fn short_verdict(answer: &wit::ShortVerdict) -> Result<Option<Verdict>, DecideError> {
    Ok(Some(match answer {
        wit::ShortVerdict::Admit(a) => Verdict::Admit { mark: token(&a.token, "admitted")?, advanced: a.advanced },
        wit::ShortVerdict::Stale(r) => {
            Verdict::Stale { mark: token(&r.mark, "stale mark")?, presented: token(&r.token, "stale")? }
        }
        wit::ShortVerdict::Replayed(r) => replayed(r)?,
        wit::ShortVerdict::Malformed => return Ok(None),
    }))
}

/// A replay, whose token must be the mark.
fn replayed(r: &wit::Refused) -> Result<Verdict, DecideError> {
    let mark = token(&r.mark, "replayed mark")?;
    if token(&r.token, "replayed")? != mark {
        return Err(DecideError::Contract("the guest called a token replayed that differs from the mark".into()));
    }
    Ok(Verdict::Replayed { mark })
}
