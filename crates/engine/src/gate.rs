//! The ordering gate's and the start grace's answers, once for both hosts. The rule
//! that orders writes is the core's (`fencekeeper_core::gate`); what a host does
//! around it is here: how long a write may wait and how long a write given up on
//! holds its resource by default, what a flight's end means, whether a fresh
//! instance is still in its start grace, the two refusals the gate makes itself (503
//! with `Retry-After`), and which counter each of these moves.
//!
//! The clock is the host's: every function takes the time it read (milliseconds on
//! its own clock, or what has elapsed since the start). Waiting, waking and keeping
//! flights stay in the hosts (tokio in the gateway, shared data and ticks in Envoy).

use crate::answer::{retry_after_seconds, Answer, Form};
use fencekeeper_core::refusal::{resolve, Action, NoVerdict, Reason};
use fencekeeper_core::{Malformed, Mode};
use std::time::Duration;

/// The longest an admitted write waits at the gate for lower-token writes, by
/// default (`--gate-timeout`, `gate.budget_ms`): then 503.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the store may still apply a write after the host gave up on it, by
/// default (`--store-apply-bound`, `gate.apply_bound_ms`). A bound too short lets a
/// late write land after a newer one; one too long only keeps a resource held
/// longer after a write the host gave up on. So the longer of the hosts' former
/// defaults: 60 s, the common stores' own request timeouts (nginx's body and proxy
/// timeouts, Apache's `Timeout`).
pub const STORE_APPLY_BOUND: Duration = Duration::from_secs(60);

/// The Retry-After of a write held past the gate's timeout by a write still
/// unanswered: when it ends cannot be known, so soon.
const UNANSWERED_RETRY: Duration = Duration::from_secs(1);

/// What a count of the gate's moves (the gateway's `fencekeeper_gateway_gate_*` and
/// `_start_grace_total`, the filter's `gate.*` and `start_grace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An admitted write waited for lower-token writes.
    Waited,
    /// A write waited past the gate's timeout and was refused (503).
    TimedOut,
    /// A write sent was given up on (not answered: [`end`]); it holds its resource
    /// for the apply bound, if there is one.
    GivenUp,
    /// A fenced write arrived in the start grace and was refused (503).
    StartGrace,
}

/// A host setting, as its operator names and sets it, for the reasons that name it
/// (`--start-grace`, `start_grace_ms`).
#[derive(Clone, Copy, Debug)]
pub struct Knob<'a> {
    /// Its name where the operator sets it.
    pub name: &'a str,
    /// Its value.
    pub value: Duration,
}

/// A refusal the gate makes itself: never forwarded, in either mode, with when to
/// retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The resolved refusal (class `undecided`, 503).
    pub action: Action,
    /// The one-line reason, naming the host's setting.
    pub reason: String,
    /// When a retry may succeed.
    pub retry_after: Duration,
    /// The counter it moves, besides its class's.
    pub event: Event,
}

impl Refused {
    /// `Retry-After` in whole seconds.
    pub fn retry_after_seconds(&self) -> u64 {
        retry_after_seconds(self.retry_after)
    }

    /// The exact answer, in `form`.
    pub fn answer(&self, form: Form) -> Answer {
        Answer::refusal(&self.action, &self.reason, form, Some(self.retry_after_seconds()))
    }
}

fn undecided(mode: Mode) -> Action {
    resolve::<Malformed>(mode, Err(NoVerdict::Refused))
}

/// How much of the start `grace` is left `elapsed` after the host started; `None`
/// once it is over, or when there is none.
pub fn grace_left(grace: Duration, elapsed: Duration) -> Option<Duration> {
    grace.checked_sub(elapsed).filter(|left| !left.is_zero())
}

/// A fenced write on `resource` that arrived with `left` of the start `grace` to go:
/// refused before any admit (the mark is not touched), so the same token is good for
/// the retry, once what a previous run had in flight can no longer land.
pub fn in_start_grace(mode: Mode, resource: &str, grace: Knob<'_>, left: Duration) -> Refused {
    let since = grace.value.saturating_sub(left);
    let reason = format!(
        "cannot decide on {resource:?} yet: this instance started {:.1}s ago and refuses fenced writes for its \
         start grace of {:.1}s ({}), while writes a previous run had in flight may still reach the store; \
         nothing was admitted, retry with the same token after Retry-After",
        since.as_secs_f64(),
        grace.value.as_secs_f64(),
        grace.name,
    );
    Refused { action: undecided(mode), reason, retry_after: left, event: Event::StartGrace }
}

/// A write on `resource` held longer than the gate's `timeout` by lower-token
/// writes, at `now_ms`: 503, never forwarded. `held_until` is when the last of them
/// stops holding the resource when every one was given up on (the core's
/// `Passage::Wait`), the moment to retry; while one is unanswered, soon.
pub fn timed_out(mode: Mode, resource: &str, timeout: Knob<'_>, held_until: Option<u64>, now_ms: u64) -> Refused {
    let cause = format!(
        "waited {:.1}s ({}) at the ordering gate for lower-token writes that the store may still apply (in \
         flight, or given up on within the store apply bound)",
        timeout.value.as_secs_f64(),
        timeout.name,
    );
    let reason = Reason::<Malformed> { verdict: None, resource, cause: &cause }.to_string();
    let retry_after = held_until.map_or(UNANSWERED_RETRY, |at| Duration::from_millis(at.saturating_sub(now_ms)));
    Refused { action: undecided(mode), reason, retry_after, event: Event::TimedOut }
}

/// What ends a write's flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// It is over: the store answered it, it was never sent, or there is no bound.
    Now,
    /// The host gave up on it after sending it: the store may still apply it until
    /// then (milliseconds on the host's clock), and it holds its resource until then.
    At(u64),
}

/// The end of a flight at `now_ms`: `answered` when the store answered it (or it
/// never left the host), else given up on, holding for `apply_bound`.
pub fn end(answered: bool, now_ms: u64, apply_bound: Duration) -> End {
    if answered || apply_bound.is_zero() {
        return End::Now;
    }
    End::At(now_ms.saturating_add(u64::try_from(apply_bound.as_millis()).unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencekeeper_core::Class;

    const GRACE: Knob<'static> = Knob { name: "--start-grace", value: Duration::from_secs(10) };

    #[test]
    fn the_grace_is_on_until_it_has_passed_and_off_when_zero() {
        assert_eq!(grace_left(GRACE.value, Duration::from_millis(9_500)), Some(Duration::from_millis(500)));
        assert_eq!(grace_left(GRACE.value, GRACE.value), None);
        assert_eq!(grace_left(GRACE.value, Duration::from_secs(11)), None);
        assert_eq!(grace_left(Duration::ZERO, Duration::ZERO), None);
    }

    #[test]
    fn a_write_in_the_start_grace_is_503_in_both_modes_naming_the_knob_with_the_time_left() {
        for mode in [Mode::Correctness, Mode::Efficiency] {
            let r = in_start_grace(mode, "r", GRACE, Duration::from_millis(7_250));
            assert_eq!((r.action.class, r.action.forward, r.event), (Class::Undecided, false, Event::StartGrace));
            let a = r.answer(Form::Text);
            assert_eq!((a.status, a.header("retry-after")), (503, Some("8")));
            assert!(a.reason.starts_with("cannot decide on \"r\" yet: this instance started 2.8s ago"), "{}", a.reason);
            assert!(a.reason.contains("start grace of 10.0s (--start-grace)"), "{}", a.reason);
            assert!(a.reason.ends_with("retry with the same token after Retry-After"), "{}", a.reason);
        }
    }

    #[test]
    fn a_write_held_past_the_timeout_retries_when_the_writes_given_up_on_stop_holding() {
        let timeout = Knob { name: "gate.budget_ms", value: Duration::from_millis(200) };
        let r = timed_out(Mode::Efficiency, "r", timeout, Some(9_300), 1_000);
        assert_eq!((r.action.class, r.action.forward, r.event), (Class::Undecided, false, Event::TimedOut));
        assert_eq!(r.answer(Form::Text).header("retry-after"), Some("9"));
        assert!(r.reason.starts_with("cannot decide on \"r\": waited 0.2s (gate.budget_ms) at the ordering gate"));
        // One still unanswered: no end to tell, so soon; a deadline already past: soon.
        assert_eq!(timed_out(Mode::Correctness, "r", timeout, None, 1_000).retry_after_seconds(), 1);
        assert_eq!(timed_out(Mode::Correctness, "r", timeout, Some(5), 1_000).retry_after_seconds(), 1);
    }

    #[test]
    fn a_flight_given_up_on_holds_for_the_bound_and_an_answered_one_ends_now() {
        let bound = Duration::from_secs(3);
        assert_eq!(end(true, 1_000, bound), End::Now);
        assert_eq!(end(false, 1_000, bound), End::At(4_000));
        assert_eq!(end(false, 1_000, Duration::ZERO), End::Now, "no bound: the store never applies late");
    }

    #[test]
    fn the_defaults_let_a_write_wait_less_than_a_write_given_up_on_holds() {
        assert!(GATE_TIMEOUT < STORE_APPLY_BOUND);
        assert_eq!((GATE_TIMEOUT.as_millis(), STORE_APPLY_BOUND.as_millis()), (5_000, 60_000));
    }
}
