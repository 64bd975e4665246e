//! The host's check of every verdict: a decider is asked, never obeyed.
//!
//! The rules are the core's (`fencekeeper_core::verify`), shared by every host; this
//! module carries their result into the host's types. A verdict that fails a check,
//! or an answer of the wrong shape, is a [`Breach`]. It never forwards a write, in
//! either mode: the guard answers the refusal the host can prove on its own (stale
//! when the presented text is below the mark, replayed, or malformed for a wrong
//! arity), or else refuses the request as undecided.

use crate::{GuestText, Verdict};
use fencekeeper_core::verify as rules;
use fencekeeper_core::{Policy, Token};

/// A verdict the host proved wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("validator broke the contract: {what}")]
pub struct Breach {
    /// What was wrong, in one line.
    pub what: String,
    /// The refusal the host can prove on its own, if any.
    pub proven: Option<Verdict>,
}

/// The presented text's canonical reading, made once per admit.
pub(crate) use rules::reading;

/// Check `verdict`, given for the presented text (read as `canonical`) against the
/// mark `read`.
pub(crate) fn check_read(
    policy: &Policy,
    presented: Option<&str>,
    canonical: Option<Token>,
    read: Option<&Token>,
    verdict: &Verdict,
) -> Result<(), Breach> {
    rules::check_read(policy, presented, canonical, read, verdict)
        .map_err(|b| breach(policy, presented, read, b.to_string()))
}

/// A breach described by `what`, with what the host can prove.
pub(crate) fn breach(policy: &Policy, presented: Option<&str>, read: Option<&Token>, what: String) -> Breach {
    let proven = rules::provable(policy, presented, read).map(|v| v.map_malformed(|m| GuestText::new(&m.to_string())));
    Breach { what, proven }
}
