//! The guest's answers, as WIT values, into the core's types. The guest is not
//! trusted to keep the contract: every token it returns is checked here, and the
//! guard checks that no admit lowers a mark.

use super::bindings::exports::fencekeeper::validator::types as wit;
use crate::DecideError;
use fencekeeper_core::{decision, Policy, Token, Verdict};

/// A token the guest returned, which must have 1 to 4 components.
pub(super) fn token(parts: &[u64], role: &str) -> Result<Token, DecideError> {
    Token::from_parts(parts).map_err(|_| {
        DecideError::Contract(format!(
            "the guest returned a {role} token with {} components; tokens have 1 to 4",
            parts.len()
        ))
    })
}

/// The guest's verdict as the core's, after checking it against the question asked.
pub(super) fn verdict(
    answer: wit::Verdict,
    policy: &Policy,
    resource: &str,
    presented: Option<&str>,
    mark: Option<&Token>,
) -> Result<Verdict, DecideError> {
    let verdict = match answer {
        wit::Verdict::Admit(a) => Verdict::Admit { mark: token(&a.mark, "admitted")?, advanced: a.advanced },
        wit::Verdict::Stale(m) => Verdict::Stale { mark: token(&m, "stale mark")? },
        wit::Verdict::Replayed(m) => Verdict::Replayed { mark: token(&m, "replayed mark")? },
        wit::Verdict::Missing => Verdict::Missing,
        // WIT carries the reason as text, the core's verdict as a value: recover the
        // value from the core itself. A guest stricter than the core (one that calls
        // a valid token malformed) cannot be expressed as a core verdict, so it is
        // reported as a contract break: undecided, refused in correctness mode.
        wit::Verdict::Malformed(reason) => match decision::decide(policy, resource, presented, mark) {
            malformed @ Verdict::Malformed(_) => malformed,
            _ => {
                return Err(DecideError::Contract(format!(
                    "the guest called the request malformed ({}) but the token is valid",
                    reason.replace('\n', " ")
                )))
            }
        },
    };
    // "missing" means exactly that no token was presented.
    match (&verdict, presented) {
        (Verdict::Missing, Some(_)) => {
            Err(DecideError::Contract("the guest answered missing for a presented token".into()))
        }
        (Verdict::Admit { .. } | Verdict::Stale { .. } | Verdict::Replayed { .. }, None) => {
            Err(DecideError::Contract("the guest decided on a token that was never presented".into()))
        }
        _ => Ok(verdict),
    }
}
