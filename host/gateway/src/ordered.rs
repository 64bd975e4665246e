//! What the gateway does with one fenced write once the guard and the gate have had
//! their say ([`Ordered`]), and the refusals the gate itself makes.

use crate::gate::Permit;
use fencekeeper::{Advance, Decision, Verdict};
use fencekeeper_core::refusal::{self, Action, NoVerdict, Reason};
use fencekeeper_core::{Mode, Token};
use fencekeeper_engine::gate;
use std::time::Duration;

/// A fenced write after the guard decided on it and the gate ordered it.
pub struct Ordered {
    /// Forward or refuse, with the class to count and the header token.
    pub action: Action,
    /// The one-line reason (for a refusal body or a log line).
    pub reason: String,
    /// The validator's verdict was proven wrong (what was wrong): count and log it.
    pub breach: Option<String>,
    /// Held while the write is in flight: answer it with [`Permit::answered`] or
    /// [`Permit::given_up`] when the upstream exchange ends.
    pub permit: Option<Permit>,
    /// The write waited for lower-token writes in flight.
    pub waited: bool,
    /// The gate's own refusal's count (the start grace, the gate timeout), if it
    /// refused the write.
    pub event: Option<gate::Event>,
    /// When a retry may succeed, for `Retry-After` (a refusal that says so).
    pub retry_after: Option<Duration>,
    /// The mark the admit raised, if it raised one: for the audit log. Set whatever
    /// happened at the gate afterwards (a write refused there had still raised it).
    pub advance: Option<Advance>,
}

/// The guard's decision, as it stands: forwarded with `permit`, or refused.
pub(crate) fn from_decision(decision: Decision, resource: &str, permit: Option<Permit>) -> Ordered {
    let reason = decision.reason(resource);
    let breach = decision.breach().map(|b| b.what.clone());
    Ordered {
        action: decision.action,
        reason,
        breach,
        permit,
        waited: false,
        event: None,
        retry_after: None,
        advance: decision.advance,
    }
}

/// A verdict the gate reached itself (not the guard's).
pub(crate) fn gate_verdict(
    mode: Mode,
    outcome: Result<Verdict, NoVerdict>,
    resource: &str,
    cause: &str,
    waited: bool,
) -> Ordered {
    let action = refusal::resolve(mode, outcome.as_ref().map_err(|e| *e));
    let reason = Reason { verdict: outcome.as_ref().ok(), resource, cause: &cause }.to_string();
    Ordered { action, reason, breach: None, permit: None, waited, event: None, retry_after: None, advance: None }
}

/// A refusal the gate made itself (`fencekeeper_engine::gate`: the start grace, a
/// write held past the gate timeout), after waiting when `waited`.
pub(crate) fn refused(refused: gate::Refused, waited: bool) -> Ordered {
    let gate::Refused { action, reason, retry_after, event } = refused;
    let retry_after = Some(retry_after);
    let event = Some(event);
    Ordered { action, reason, breach: None, permit: None, waited, event, retry_after, advance: None }
}

/// A request refused as malformed on its head (its resource key or its token's
/// length), before any mark is read: not ordered.
pub fn malformed(mode: Mode, error: fencekeeper_core::Malformed) -> Ordered {
    let reason = fencekeeper::GuestText::new(&error.to_string());
    gate_verdict(mode, Ok(Verdict::Malformed(reason)), "", "", false)
}

/// The write's token fell below a higher one admitted meanwhile.
pub(crate) fn stale(mode: Mode, mark: Token, presented: Token, resource: &str, waited: bool) -> Ordered {
    gate_verdict(mode, Ok(Verdict::Stale { mark, presented }), resource, "", waited)
}
