//! One running guest: a store holding one instance and its checker, reused across
//! calls until the guest faults, then thrown away.

use super::bindings::exports::fencekeeper::validator::types as wit;
use super::bindings::{Fencekeeper, FencekeeperPre};
use super::load::one_line;
use super::Limits;
use crate::DecideError;
use fencekeeper_core::{Mode, Policy};
use wasmtime::component::ResourceAny;
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder, Trap};

/// What a store carries: only its limits (the guest gets no host state).
pub(crate) struct State {
    limits: StoreLimits,
}

/// A guest instance with its checker, ready for calls.
pub(crate) struct Instance {
    store: Store<State>,
    guest: Fencekeeper,
    checker: ResourceAny,
}

impl Instance {
    /// Instantiate the guest in a fresh store and construct its checker.
    pub(crate) fn start(
        engine: &Engine,
        pre: &FencekeeperPre<State>,
        policy: Policy,
        limits: &Limits,
    ) -> Result<Instance, DecideError> {
        let state = State {
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes)
                // One component instance holds a few core instances (the guest and
                // wit-component's shims); nothing more is ever needed.
                .instances(16)
                // Fail the guest's memory.grow as a trap, so a runaway allocation
                // ends now with a clear reason instead of in a confused guest.
                .trap_on_grow_failure(true)
                .build(),
        };
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_fuel(limits.fuel).map_err(|e| fault(&e, limits))?;
        let guest = pre.instantiate(&mut store).map_err(|e| fault(&e, limits))?;
        let wit_policy = wit::Policy {
            mode: match policy.mode {
                Mode::Correctness => wit::Mode::Correctness,
                Mode::Efficiency => wit::Mode::Efficiency,
            },
            strict: policy.strict,
        };
        let checker = guest
            .fencekeeper_validator_validator()
            .checker()
            .call_constructor(&mut store, wit_policy)
            .map_err(|e| fault(&e, limits))?;
        Ok(Instance { store, guest, checker })
    }

    /// Refill the fuel tank before a call: each call gets the whole budget.
    fn refuel(&mut self, limits: &Limits) -> Result<(), DecideError> {
        self.store.set_fuel(limits.fuel).map_err(|e| fault(&e, limits))
    }

    pub(crate) fn decide(
        &mut self,
        limits: &Limits,
        resource: &str,
        presented: Option<&str>,
        mark: Option<&[u64]>,
    ) -> Result<wit::Verdict, DecideError> {
        self.refuel(limits)?;
        // The generated binding takes the list as a Vec.
        let mark = mark.map(<[u64]>::to_vec);
        self.guest
            .fencekeeper_validator_validator()
            .checker()
            .call_decide(&mut self.store, self.checker, resource, presented, mark.as_ref())
            .map_err(|e| fault(&e, limits))
    }

    pub(crate) fn parse(&mut self, limits: &Limits, raw: &str) -> Result<Result<Vec<u64>, String>, DecideError> {
        self.refuel(limits)?;
        self.guest
            .fencekeeper_validator_validator()
            .checker()
            .call_parse(&mut self.store, self.checker, raw)
            .map_err(|e| fault(&e, limits))
    }

    pub(crate) fn describe(&mut self, limits: &Limits) -> Result<wit::Info, DecideError> {
        self.refuel(limits)?;
        self.guest.fencekeeper_validator_validator().call_describe(&mut self.store).map_err(|e| fault(&e, limits))
    }

    /// Fuel the last call used (for measuring what a budget should be).
    pub(crate) fn fuel_used(&self, limits: &Limits) -> u64 {
        limits.fuel.saturating_sub(self.store.get_fuel().unwrap_or(0))
    }
}

/// A failed call as a one-line guest fault, naming the limit that stopped it.
fn fault(error: &wasmtime::Error, limits: &Limits) -> DecideError {
    let why = match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => format!("ran out of fuel (budget {} units per call)", limits.fuel),
        Some(Trap::UnreachableCodeReached) => "trapped: it executed `unreachable` (a guest panic or bug)".to_owned(),
        Some(Trap::StackOverflow) => "trapped: stack overflow".to_owned(),
        Some(trap) => format!("trapped: {trap}"),
        None if error.chain().any(|c| c.to_string().contains("growing memory")) => {
            format!("exceeded its memory limit of {} bytes", limits.memory_bytes)
        }
        None => one_line(error),
    };
    DecideError::GuestFault(why)
}
