//! What the gateway does with one fenced write once the guard and the gate have had
//! their say ([`Ordered`]), and the refusals the gate itself makes.

use crate::gate::Permit;
use fencekeeper::{Advance, Decision, Verdict};
use fencekeeper_core::refusal::{self, Action, NoVerdict, Reason};
use fencekeeper_core::{Mode, Token};
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
    /// The write waited longer than the gate timeout.
    pub timed_out: bool,
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
        timed_out: false,
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
    Ordered { action, reason, breach: None, permit: None, waited, timed_out: false, retry_after: None, advance: None }
}

/// A write that arrived `since` after the gateway started, within its start `grace`:
/// refused in both modes, before any admit (the mark is not touched).
pub fn in_start_grace(mode: Mode, resource: &str, since: Duration, grace: Duration) -> Ordered {
    let mut ordered = gate_verdict(mode, Err(NoVerdict::Refused), resource, "", false);
    // Its own reason: the generic undecided one warns that the mark may have advanced,
    // and here nothing was admitted, so the same token is good for the retry.
    ordered.reason = format!(
        "cannot decide on {resource:?} yet: the gateway started {:.1}s ago and refuses fenced writes for its \
         start grace of {:.1}s (--start-grace), while writes a previous run had in flight may still reach the \
         store; nothing was admitted, retry with the same token after Retry-After",
        since.as_secs_f64(),
        grace.as_secs_f64()
    );
    ordered.retry_after = grace.checked_sub(since);
    ordered
}

/// A request whose resource key could not be formed: malformed, not ordered.
pub fn malformed(mode: Mode, error: fencekeeper_core::ResourceError) -> Ordered {
    let reason = fencekeeper::GuestText::new(&fencekeeper_core::Malformed::Resource(error).to_string());
    gate_verdict(mode, Ok(Verdict::Malformed(reason)), "", "", false)
}

/// The write's token fell below a higher one admitted meanwhile.
pub(crate) fn stale(mode: Mode, mark: Token, presented: Token, resource: &str, waited: bool) -> Ordered {
    gate_verdict(mode, Ok(Verdict::Stale { mark, presented }), resource, "", waited)
}

/// A write held past the gate timeout: 503, never forwarded, with when the lower
/// writes holding it may be over (`held_until`, when every one was given up on).
pub(crate) fn timed_out(mode: Mode, resource: &str, held_until: Option<Duration>) -> Ordered {
    let mut ordered = gate_verdict(mode, Err(NoVerdict::Refused), resource, TIMED_OUT, true);
    ordered.timed_out = true;
    ordered.retry_after = Some(held_until.unwrap_or(Duration::from_secs(1)));
    ordered
}

const TIMED_OUT: &str = "timed out at the ordering gate waiting for lower-token writes that the store may still \
                         apply (in flight, or given up on within the store apply bound)";
