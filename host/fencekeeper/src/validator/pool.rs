//! Where a validator's instances wait between calls. Each thread that calls a
//! validator keeps the instance it used last, with its verdict cache, in a
//! thread-local slot: the hot path takes no lock and shares no cache line with other
//! threads. An instance leaves its slot when the thread calls another validator (it
//! goes back to its validator's idle list) or exits (it is dropped). The idle list
//! serves threads that have no instance yet; the pool budget (`budget.rs`) caps the
//! memory of all of them together, wherever they are.

use super::bindings::FencekeeperPre;
use super::budget::State;
use super::cache::VerdictCache;
use super::instance::Instance;
use super::Limits;
use crate::{DecideError, Verdict};
use fencekeeper_core::{Policy, Token};
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use wasmtime::Engine;

/// What every thread calling one validator shares.
pub(crate) struct Shared {
    pub(crate) engine: &'static Engine,
    pub(crate) pre: FencekeeperPre<State>,
    pub(crate) limits: Limits,
    /// Bytes held by every live instance (the pool budget's meter).
    pub(crate) bytes: Arc<AtomicUsize>,
    idle: Mutex<Vec<Instance>>,
    pub(crate) cache_verdicts: bool,
}

/// One thread's instance and verdict cache for one validator.
struct Local {
    shared: Arc<Shared>,
    instance: Option<Instance>,
    cache: VerdictCache,
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(instance) = self.instance.take() {
            self.shared.park(instance);
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
}

impl Shared {
    pub(crate) fn new(
        engine: &'static Engine,
        pre: FencekeeperPre<State>,
        limits: Limits,
        bytes: Arc<AtomicUsize>,
        first: Instance,
    ) -> Shared {
        Shared { engine, pre, limits, bytes, idle: Mutex::new(vec![first]), cache_verdicts: true }
    }

    /// Put an instance back on the idle list, or drop it when the list is full.
    fn park(&self, instance: Instance) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.limits.max_idle_instances {
            idle.push(instance);
        }
    }

    fn take(&self) -> Result<Instance, DecideError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(instance) => Ok(instance),
            None => Instance::start(self.engine, &self.pre, &self.limits, &self.bytes),
        }
    }

    /// Run `f` on this thread's instance (or an idle or new one). An instance whose
    /// call failed is dropped, so a faulted guest is never called again. The
    /// instance is used where it lies in the thread's slot: moving a store into and
    /// out of the slot around every call was a measurable part of a call's cost.
    pub(crate) fn call<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Instance, &Limits) -> Result<R, DecideError>,
    ) -> Result<R, DecideError> {
        // `local` runs its closure or, when the thread has no slot (teardown), not at
        // all; `f` stays here until the closure takes it, so that case can still run it.
        let mut f = Some(f);
        let in_slot = self.local(|l| {
            let f = f.take()?;
            let instance = match l.instance.as_mut() {
                Some(instance) => instance,
                None => match self.take() {
                    Ok(instance) => l.instance.insert(instance),
                    Err(e) => return Some(Err(e)),
                },
            };
            let result = f(instance, &self.limits);
            if result.is_err() {
                l.instance = None;
            }
            Some(result)
        });
        if let Some(Some(result)) = in_slot {
            return result;
        }
        let f = f.ok_or_else(|| DecideError::GuestFault("the validator's call was lost".into()))?;
        let mut instance = self.take()?;
        let result = f(&mut instance, &self.limits);
        if result.is_ok() {
            self.park(instance);
        }
        result
    }

    /// A decision, from this thread's verdict cache or from the guest.
    pub(crate) fn decide(
        self: &Arc<Self>,
        policy: &Policy,
        presented: Option<&str>,
        mark: Option<&Token>,
    ) -> Result<Verdict, DecideError> {
        if self.cache_verdicts {
            if let Some(Some(verdict)) = self.local(|l| l.cache.get(presented, mark)) {
                return Ok(verdict);
            }
        }
        let verdict = self.call(|i, l| i.decide(l, policy, presented, mark))?;
        if self.cache_verdicts {
            self.local(|l| l.cache.put(presented, mark, &verdict));
        }
        Ok(verdict)
    }

    /// Run `f` on this thread's slot for this validator, claiming it if the thread
    /// held another validator's (whose instance goes back to its own idle list).
    /// `None` when there is no slot to use (thread teardown).
    fn local<R>(self: &Arc<Self>, f: impl FnOnce(&mut Local) -> R) -> Option<R> {
        LOCAL
            .try_with(|cell| {
                let mut slot = cell.try_borrow_mut().ok()?;
                if !slot.as_ref().is_some_and(|l| Arc::ptr_eq(&l.shared, self)) {
                    *slot = Some(Local { shared: self.clone(), instance: None, cache: VerdictCache::new() });
                }
                slot.as_mut().map(f)
            })
            .ok()
            .flatten()
    }

    /// A copy of this pool that does not cache verdicts, sharing its meter.
    pub(crate) fn uncached(&self) -> Arc<Shared> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        Arc::new(Shared {
            engine: self.engine,
            pre: self.pre.clone(),
            limits: self.limits.clone(),
            bytes: self.bytes.clone(),
            idle: std::sync::Mutex::new(idle),
            cache_verdicts: false,
        })
    }

    /// Bytes of memory and tables held now by all instances.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}
