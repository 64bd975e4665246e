//! One running guest: a store holding one instance, reused across calls until the
//! guest faults, then thrown away.

use super::bindings::exports::fencekeeper::validator::types as wit;
use super::bindings::exports::fencekeeper::validator::validator::Guest;
use super::bindings::{Fencekeeper, FencekeeperPre};
use super::budget::{LimitHit, State};
use super::{convert, one_line, Limits};
use crate::{DecideError, Verdict};
use fencekeeper_core::{short_text, Policy, Token};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use wasmtime::{Engine, Store, Trap};

/// A guest instance, ready for calls.
pub(crate) struct Instance {
    store: Store<State>,
    guest: Fencekeeper,
}

impl Instance {
    /// Instantiate the guest in a fresh store whose memory counts against `pool`.
    pub(crate) fn start(
        engine: &Engine,
        pre: &FencekeeperPre<State>,
        limits: &Limits,
        pool: &Arc<AtomicUsize>,
    ) -> Result<Instance, DecideError> {
        let mut store = Store::new(engine, State::new(limits, pool.clone()));
        store.limiter(|s| s.limiter());
        store.set_fuel(limits.fuel).map_err(|e| fault(&e, limits))?;
        let guest = pre.instantiate(&mut store).map_err(|e| fault(&e, limits))?;
        Ok(Instance { store, guest })
    }

    /// One call into the guest with the whole fuel budget (each call gets all of
    /// it); a trap or a limit hit is a one-line guest fault.
    fn call<R>(
        &mut self,
        limits: &Limits,
        f: impl FnOnce(&Guest, &mut Store<State>) -> wasmtime::Result<R>,
    ) -> Result<R, DecideError> {
        self.store.set_fuel(limits.fuel).map_err(|e| fault(&e, limits))?;
        f(self.guest.fencekeeper_validator_validator(), &mut self.store).map_err(|e| fault(&e, limits))
    }

    /// The guest's verdict: through `decide-short` when the text fits in a short
    /// text (no allocation in the guest, no post-return call), else, and for the
    /// reason of a malformed short text, through `decide`.
    pub(crate) fn decide(
        &mut self,
        limits: &Limits,
        policy: &Policy,
        presented: Option<&str>,
        mark: Option<&Token>,
    ) -> Result<Verdict, DecideError> {
        let Some((len, [w0, w1, w2, w3, w4, w5, w6])) = presented.and_then(|t| short_text::pack(t.as_bytes())) else {
            return self.decide_full(limits, policy, presented, mark);
        };
        let text = wit::ShortText { len, w0, w1, w2, w3, w4, w5, w6 };
        let (policy_wit, mark_wit) = (convert::policy(policy), mark.map(convert::to_wit));
        let answer = self.call(limits, |g, store| g.call_decide_short(store, policy_wit, text, mark_wit))?;
        if let Some(verdict) = convert::short_verdict(&answer)? {
            return Ok(verdict);
        }
        match self.decide_full(limits, policy, presented, mark)? {
            malformed @ Verdict::Malformed(_) => Ok(malformed),
            _ => Err(DecideError::Contract(
                "the guest's decide-short called the token malformed and its decide did not".into(),
            )),
        }
    }

    /// The guest's verdict through `decide`, whatever the text's length.
    pub(crate) fn decide_full(
        &mut self,
        limits: &Limits,
        policy: &Policy,
        presented: Option<&str>,
        mark: Option<&Token>,
    ) -> Result<Verdict, DecideError> {
        let (policy, mark) = (convert::policy(policy), mark.map(convert::to_wit));
        convert::verdict(self.call(limits, |g, store| g.call_decide(store, policy, presented, mark))?)
    }

    pub(crate) fn parse(&mut self, limits: &Limits, raw: &str) -> Result<Result<wit::Token, String>, DecideError> {
        self.call(limits, |g, store| g.call_parse(store, raw))
    }

    pub(crate) fn describe(&mut self, limits: &Limits) -> Result<wit::Info, DecideError> {
        self.call(limits, |g, store| g.call_describe(store))
    }

    /// Fuel the last call used (for measuring what a budget should be).
    pub(crate) fn fuel_used(&self, limits: &Limits) -> u64 {
        limits.fuel.saturating_sub(self.store.get_fuel().unwrap_or(0))
    }
}

/// A failed call as a one-line guest fault, naming the limit that stopped it.
pub(crate) fn fault(error: &wasmtime::Error, limits: &Limits) -> DecideError {
    let why = if let Some(hit) = error.chain().find_map(|c| c.downcast_ref::<LimitHit>()) {
        hit.0.clone()
    } else {
        match error.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => format!("ran out of fuel (budget {} units per call)", limits.fuel),
            Some(Trap::UnreachableCodeReached) => {
                "trapped: it executed `unreachable` (a guest panic or bug)".to_owned()
            }
            Some(Trap::StackOverflow) => "trapped: stack overflow".to_owned(),
            Some(trap) => format!("trapped: {trap}"),
            None => one_line(error),
        }
    };
    DecideError::GuestFault(why)
}
