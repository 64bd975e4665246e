//! The in-flight ordering gate: closes the proxy's check-then-forward window
//! (docs/gateway.md, docs/architecture.md). A proxy checks a token before the upstream
//! commits the write, so an admitted write with token 33 that is slow to reach the
//! store could land after a write with token 34 admitted later. The gate tracks, per
//! resource, the admitted writes forwarded that the store may still apply (the
//! *flights*), and lets a write go by the core's rule (`fencekeeper_core::gate`):
//!
//! * an admitted write is registered as in flight only if no higher token has been
//!   registered on the resource (else it is stale, and refused) and no lower-token
//!   write may still reach the store; this check-and-register step is atomic, so
//!   registration order is token order;
//! * a write whose token is higher than a flight waits (at most the gate timeout)
//!   until every lower-token flight on that resource is over;
//! * a flight is over when the upstream answered it, or, when the gateway gave up on
//!   it (the upstream timed out or failed after the request was sent), once the store
//!   apply bound has passed since: until then the store may still apply it;
//! * after waiting a write is checked again: against the store's mark (another
//!   instance sharing it may have admitted a higher token; with a shared registry,
//!   whose Txn compares the mark, by that Txn) and at registration, and refused as
//!   stale if a higher token got there first.
//!
//! Admits themselves (the store round trip) run concurrently; only the registration
//! step takes a lock, for microseconds.
//!
//! Hence, on one resource, the upstream receives a write only when every write it
//! received before has a token no higher, or has been answered, or was given up on
//! longer ago than the store apply bound. That bound is the one timing assumption
//! left (docs/operations.md).

use crate::ordered::{self, from_decision, Ordered};
use crate::registry::{self, Refused, Registry};
use fencekeeper::{Decision, Guard, StoreError, Verdict};
use fencekeeper_core::gate::{self as rule, Flight, Passage, Until};
use fencekeeper_core::refusal::{self, NoVerdict};
#[cfg(test)]
use fencekeeper_core::Class;
use fencekeeper_core::Token;
use fencekeeper_engine::gate::{self as engine, End};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The gate for every resource of one gateway.
pub struct Gate {
    enabled: bool,
    /// Admits may be awaited on the request's task (else always the blocking pool).
    awaiting: bool,
    timeout: Duration,
    /// How long a write given up on keeps holding its resource.
    apply_bound: Duration,
    /// The gate's clock: flights' deadlines are milliseconds since this.
    epoch: Instant,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    next_id: AtomicU64,
    waiting: AtomicUsize,
    holding: AtomicUsize,
    /// The in-flight registry shared with other instances, when configured.
    registry: Option<Arc<Registry>>,
}

/// One resource's state; lives while a request for the resource is at the gate, or
/// a write given up on still holds it.
struct Entry {
    state: Mutex<State>,
    /// Signalled whenever a flight ends.
    ended: Notify,
    /// Requests and flights holding this entry; changed only under the `entries` lock.
    users: AtomicUsize,
}

#[derive(Default)]
struct State {
    flights: Vec<(u64, Flight)>,
    /// Admitted writes waiting for lower-token writes.
    waiting: usize,
    /// The highest token admitted through this gateway while the entry lived.
    highest: Option<Token>,
}

impl State {
    fn raise(&mut self, token: Token) {
        if self.highest.is_none_or(|h| token > h) {
            self.highest = Some(token);
        }
    }
}

/// A write registered as in flight on a resource. Dropping it ends the flight and
/// wakes the writes waiting for it; [`Permit::given_up`] ends it only once the store
/// apply bound has passed.
pub struct Permit {
    id: u64,
    entry: EntryRef,
    /// Its flight in the shared registry, when there is one.
    remote: Option<registry::Flight>,
}

impl Permit {
    /// The upstream answered the write (its response head arrived): the store will not
    /// apply it later, and the writes waiting for it may go.
    pub fn answered(self) {}

    /// The gateway gave up on the write after sending it (the upstream timed out,
    /// reset or failed): the store may still apply it, so it keeps holding its
    /// resource for the store apply bound, then ends.
    pub fn given_up(mut self) {
        if let Some(remote) = self.remote.take() {
            remote.given_up();
        }
        let gate = self.entry.gate.clone();
        let End::At(until) = engine::end(false, gate.now_ms(), gate.apply_bound) else { return };
        if let Some((_, f)) = lock(&self.entry.entry.state).flights.iter_mut().find(|(id, _)| *id == self.id) {
            f.until = Until::Deadline(until);
        }
        gate.holding.fetch_add(1, Relaxed);
        let bound = gate.apply_bound;
        // The task owns the permit (and so the entry): the resource stays held, and its
        // highest token known, until the bound has passed.
        tokio::spawn(async move {
            tokio::time::sleep(bound).await;
            gate.holding.fetch_sub(1, Relaxed);
            drop(self);
        });
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        lock(&self.entry.entry.state).flights.retain(|(id, _)| *id != self.id);
        self.entry.entry.ended.notify_waiters();
    }
}

struct EntryRef {
    gate: Arc<Gate>,
    key: String,
    entry: Arc<Entry>,
}

impl Clone for EntryRef {
    fn clone(&self) -> EntryRef {
        let _entries = lock(&self.gate.entries);
        self.entry.users.fetch_add(1, Relaxed);
        EntryRef { gate: self.gate.clone(), key: self.key.clone(), entry: self.entry.clone() }
    }
}

impl Drop for EntryRef {
    fn drop(&mut self) {
        let mut entries = lock(&self.gate.entries);
        if self.entry.users.fetch_sub(1, Relaxed) == 1 {
            entries.remove(&self.key);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent; a panic elsewhere must not
    // wedge the resource.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gate {
    /// A gate whose writes wait at most `timeout`, and where a write given up on holds
    /// its resource for `apply_bound`; with a `registry`, writes are also ordered
    /// across the instances that share it. When `enabled` is false, writes are
    /// admitted and forwarded without ordering (the window stays open). Admits are
    /// awaited on the request's task when `awaiting` and the guard never blocks
    /// ([`Guard::awaits`]), else run on the blocking pool.
    pub fn new(
        enabled: bool,
        timeout: Duration,
        apply_bound: Duration,
        registry: Option<Arc<Registry>>,
        awaiting: bool,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            enabled,
            awaiting,
            timeout,
            apply_bound,
            epoch: Instant::now(),
            entries: Mutex::default(),
            next_id: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            holding: AtomicUsize::new(0),
            registry,
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The refusal of a write on `resource` held past the gate timeout, by lower
    /// writes holding it until `held_until` when every one was given up on.
    fn timed_out(&self, mode: fencekeeper_core::Mode, resource: &str, held_until: Option<u64>) -> engine::Refused {
        let timeout = engine::Knob { name: "--gate-timeout", value: self.timeout };
        engine::timed_out(mode, resource, timeout, held_until, self.now_ms())
    }

    /// Writes currently in flight on `resource`, given-up ones still holding it
    /// included (for tests and inspection).
    pub fn in_flight(&self, resource: &str) -> usize {
        lock(&self.entries).get(resource).map_or(0, |e| lock(&e.state).flights.len())
    }

    /// Admitted writes currently waiting for lower-token writes, on every resource.
    pub fn waiting_total(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Writes waiting now in the shared registry for other instances' writes.
    pub fn shared_waiting(&self) -> Option<usize> {
        self.registry.as_ref().map(|r| r.waiting())
    }

    /// Writes given up on that still hold their resource (within the apply bound).
    pub fn holding_total(&self) -> usize {
        self.holding.load(Relaxed)
    }

    /// Admitted writes on `resource` currently waiting for lower-token writes.
    pub fn waiting(&self, resource: &str) -> usize {
        lock(&self.entries).get(resource).map_or(0, |e| lock(&e.state).waiting)
    }

    fn enter(self: &Arc<Self>, resource: &str) -> EntryRef {
        let mut entries = lock(&self.entries);
        let entry = entries
            .entry(resource.to_owned())
            .or_insert_with(|| {
                Arc::new(Entry { state: Mutex::default(), ended: Notify::new(), users: AtomicUsize::new(0) })
            })
            .clone();
        entry.users.fetch_add(1, Relaxed);
        EntryRef { gate: self.clone(), key: resource.to_owned(), entry }
    }

    /// Admit a write on `resource` carrying `token` through `guard`, then order it
    /// against the writes in flight.
    pub async fn order(self: &Arc<Self>, guard: &Arc<Guard>, resource: &str, token: Option<&str>) -> Ordered {
        if !self.enabled {
            return from_decision(admit(guard, resource, token, self.awaiting).await, resource, None);
        }
        // Entered before the admit and held until the write is registered: the entry,
        // and the highest token it has registered, cannot be evicted in between. So a
        // higher token registered while this admit was deciding is seen at registration;
        // and one registered and answered before this entry existed had advanced the
        // store's mark before this admit read it.
        let entry = self.enter(resource);
        let decision = admit(guard, resource, token, self.awaiting).await;
        let advance = decision.advance;
        let mut ordered = self.order_decided(guard, entry, resource, decision).await;
        ordered.advance = advance;
        ordered
    }

    /// Order a decided write: refusals pass straight through, admits are registered.
    async fn order_decided(
        self: &Arc<Self>,
        guard: &Arc<Guard>,
        entry: EntryRef,
        resource: &str,
        decision: Decision,
    ) -> Ordered {
        let admitted = match decision.verdict {
            Some(Verdict::Admit { mark, .. }) if decision.action.forward => mark,
            // Refusals, and fail-open passes without a token, are not ordered.
            _ => return from_decision(decision, resource, None),
        };
        let mode = guard.decider().policy().mode;
        let id = self.next_id.fetch_add(1, Relaxed);
        let deadline = Instant::now() + self.timeout;
        let until = match self.register(&entry.entry, admitted, id) {
            Registered::Yes => {
                let permit = Permit { id, entry, remote: None };
                return self.across_instances(mode, decision, resource, admitted, permit, deadline, false).await;
            }
            Registered::Stale(mark) => return ordered::stale(mode, mark, admitted, resource, false),
            Registered::Wait(until) => until,
        };
        lock(&entry.entry.state).waiting += 1;
        self.waiting.fetch_add(1, Relaxed);
        let ordered = self.wait_and_recheck(guard, &entry, resource, admitted, id, decision, until, deadline).await;
        lock(&entry.entry.state).waiting -= 1;
        self.waiting.fetch_sub(1, Relaxed);
        ordered
    }

    /// A write this gateway's gate passed, ordered against the other instances' too
    /// when there is a shared registry: forwarded with `permit`, or refused.
    #[allow(clippy::too_many_arguments)]
    async fn across_instances(
        &self,
        mode: fencekeeper_core::Mode,
        decision: Decision,
        resource: &str,
        admitted: Token,
        mut permit: Permit,
        deadline: Instant,
        waited: bool,
    ) -> Ordered {
        let Some(registry) = &self.registry else {
            let mut ordered = from_decision(decision, resource, Some(permit));
            ordered.waited = waited;
            return ordered;
        };
        let refused = match registry.enter(resource, admitted, deadline.into_std()).await {
            Ok(remote) => {
                permit.remote = Some(remote);
                let mut ordered = from_decision(decision, resource, Some(permit));
                ordered.waited = waited;
                return ordered;
            }
            Err(refused) => refused,
        };
        // Never forwarded: this gateway's flight ends at once.
        permit.answered();
        match refused {
            Refused::Stale(higher) => ordered::stale(mode, higher, admitted, resource, waited),
            Refused::TimedOut => ordered::refused(self.timed_out(mode, resource, None), true),
            Refused::Unreachable(cause) => {
                ordered::gate_verdict(mode, Err(NoVerdict::StoreUnreachable), resource, &cause, waited)
            }
            Refused::Moved(cause) => ordered::gate_verdict(mode, Err(NoVerdict::Refused), resource, &cause, waited),
        }
    }

    /// The slow path: wait for the lower-token flights to end, then check the token
    /// again.
    #[allow(clippy::too_many_arguments)]
    async fn wait_and_recheck(
        &self,
        guard: &Arc<Guard>,
        entry: &EntryRef,
        resource: &str,
        admitted: Token,
        id: u64,
        decision: Decision,
        mut held_until: Option<u64>,
        deadline: Instant,
    ) -> Ordered {
        let mode = guard.decider().policy().mode;
        loop {
            if !self.wait_for_lower(&entry.entry, &admitted, deadline).await {
                return ordered::refused(self.timed_out(mode, resource, held_until), true);
            }
            // Another instance sharing the store may have admitted a higher token while
            // this one waited. With a shared registry its Txn compares the mark (as the
            // filter's does); else the store's mark is read again (the filter confirms it
            // in etcd).
            let mark = match &self.registry {
                Some(_) => Ok(None),
                None => mark_blocking(guard, resource).await,
            };
            match mark.map(|m| m.filter(|m| *m > admitted)) {
                Ok(Some(mark)) => return ordered::stale(mode, mark, admitted, resource, true),
                Err(e) => {
                    let cause = e.to_string();
                    return ordered::gate_verdict(mode, Err(NoVerdict::StoreUnreachable), resource, &cause, true);
                }
                Ok(None) => {}
            }
            match self.register(&entry.entry, admitted, id) {
                Registered::Yes => {
                    let permit = Permit { id, entry: entry.clone(), remote: None };
                    return self.across_instances(mode, decision, resource, admitted, permit, deadline, true).await;
                }
                Registered::Stale(mark) => return ordered::stale(mode, mark, admitted, resource, true),
                Registered::Wait(until) => held_until = until,
            }
        }
    }

    /// The one step that orders writes, atomic under the resource's state lock: the
    /// core's rule on the highest token registered and the flights. Registration order
    /// is therefore token order.
    fn register(&self, entry: &Entry, token: Token, id: u64) -> Registered {
        let mut state = lock(&entry.state);
        let flights = state.flights.iter().map(|(_, f)| *f);
        match rule::pass(&token, state.highest.as_ref(), flights, self.now_ms()) {
            Passage::Stale(highest) => Registered::Stale(highest),
            Passage::Wait { until } => {
                // A lower token arriving meanwhile is stale: this one was admitted.
                state.raise(token);
                Registered::Wait(until)
            }
            Passage::Go => {
                state.raise(token);
                state.flights.push((id, Flight { token, until: Until::Answered }));
                Registered::Yes
            }
        }
    }

    /// Wait until no flight with a lower token holds the resource (true), or until
    /// `deadline` (false).
    async fn wait_for_lower(&self, entry: &Entry, token: &Token, deadline: Instant) -> bool {
        loop {
            let ended = entry.ended.notified();
            tokio::pin!(ended);
            // Register for the wake-up before looking, so an end in between is not missed.
            ended.as_mut().enable();
            let flights = lock(&entry.state).flights.iter().map(|(_, f)| *f).collect::<Vec<_>>();
            if !matches!(rule::pass(token, None, flights, self.now_ms()), Passage::Wait { .. }) {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }
}

enum Registered {
    /// In flight now: forward it.
    Yes,
    /// A higher token was registered meanwhile: the write is stale.
    Stale(Token),
    /// A lower-token write may still reach the store: wait for it (until when, if
    /// every one holding the write was given up on).
    Wait(Option<u64>),
}

/// The guard's decision. Awaited on this task when the guard never blocks (an etcd
/// store: the round trip goes from this task to etcd's connection and back); else on
/// the blocking pool, off the reactor (the file store's commit, ZooKeeper's provenance
/// check).
/// A panic in the guard is an undecided write, either way.
async fn admit(guard: &Arc<Guard>, resource: &str, token: Option<&str>, awaiting: bool) -> Decision {
    let decided = if awaiting && guard.awaits() {
        Unwinding(std::pin::pin!(guard.admit_async(resource, token))).await
    } else {
        let (g, r, t) = (guard.clone(), resource.to_owned(), token.map(str::to_owned));
        tokio::task::spawn_blocking(move || g.admit(&r, t.as_deref())).await.map_err(|e| e.to_string())
    };
    decided.unwrap_or_else(|why| {
        let action = refusal::resolve::<fencekeeper::GuestText>(guard.decider().policy().mode, Err(NoVerdict::Refused));
        let cause = StoreError::Unavailable(format!("the admit task failed: {why}"));
        Decision { verdict: None, action, undecided: Some(cause.into()), advance: None, retention_floor: None }
    })
}

/// A future whose panic is its output's error, as a blocking task's would be.
struct Unwinding<F>(F);

impl<F: Future + Unpin> Future for Unwinding<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| std::pin::Pin::new(inner).poll(cx))) {
            Ok(poll) => poll.map(Ok),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned());
                std::task::Poll::Ready(Err(format!("it panicked: {}", why.unwrap_or_default())))
            }
        }
    }
}

async fn mark_blocking(guard: &Arc<Guard>, resource: &str) -> Result<Option<Token>, StoreError> {
    let (g, r) = (guard.clone(), resource.to_owned());
    tokio::task::spawn_blocking(move || g.mark(&r))
        .await
        .unwrap_or_else(|e| Err(StoreError::Unavailable(format!("the mark read failed: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencekeeper::{MemoryStore, NativeDecider, Policy};

    fn guard() -> Arc<Guard> {
        Arc::new(Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(MemoryStore::new())))
    }

    /// Poll a condition (bounded): the gate's state is the readiness signal.
    async fn until(condition: impl Fn() -> bool) {
        for _ in 0..5000 {
            if condition() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(condition(), "condition not reached");
    }

    #[tokio::test]
    async fn higher_token_waits_for_lower_in_flight_then_passes() {
        let (gate, guard) = (Gate::new(true, Duration::from_secs(5), Duration::from_secs(30), None, true), guard());
        let a = gate.order(&guard, "r", Some("33")).await;
        assert!(a.permit.is_some() && !a.waited);
        let (g2, gd2) = (gate.clone(), guard.clone());
        let b = tokio::spawn(async move { g2.order(&gd2, "r", Some("34")).await });
        until(|| gate.waiting("r") == 1).await;
        assert!(!b.is_finished());
        drop(a);
        let b = b.await.ok();
        assert!(b.as_ref().is_some_and(|b| b.waited && b.action.forward && b.permit.is_some()));
        assert_eq!(gate.in_flight("r"), 1);
        drop(b);
        assert_eq!(gate.in_flight("r"), 0);
    }

    #[tokio::test]
    async fn waiter_overtaken_by_a_higher_token_is_refused_as_stale() {
        let (gate, guard) = (Gate::new(true, Duration::from_secs(5), Duration::from_secs(30), None, true), guard());
        let a = gate.order(&guard, "r", Some("33")).await;
        let (g2, gd2) = (gate.clone(), guard.clone());
        let b = tokio::spawn(async move { g2.order(&gd2, "r", Some("34")).await });
        until(|| gate.waiting("r") == 1).await;
        let (g3, gd3) = (gate.clone(), guard.clone());
        let c = tokio::spawn(async move { g3.order(&gd3, "r", Some("35")).await });
        until(|| gate.waiting("r") == 2).await;
        drop(a);
        let (b, c) = (b.await.ok(), c.await.ok());
        let b = b.as_ref().map(|b| (b.action.class, b.action.token.map(|t| t.to_string())));
        assert_eq!(b, Some((Class::Stale, Some("35".to_owned()))));
        assert!(c.is_some_and(|c| c.action.forward));
    }

    #[tokio::test]
    async fn waiting_past_the_gate_timeout_is_undecided() {
        let (gate, guard) = (Gate::new(true, Duration::from_millis(50), Duration::from_secs(30), None, true), guard());
        let _a = gate.order(&guard, "r", Some("33")).await;
        let b = gate.order(&guard, "r", Some("34")).await;
        assert!(b.event == Some(engine::Event::TimedOut) && !b.action.forward);
        assert_eq!(b.action.class.http_status(), 503);
        assert!(b.retry_after.is_some(), "a 503 from the gate says when to retry");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_given_up_on_holds_its_resource_for_the_apply_bound() {
        let gate = Gate::new(true, Duration::from_secs(60), Duration::from_secs(10), None, true);
        let guard = guard();
        let a = gate.order(&guard, "r", Some("33")).await;
        a.permit.expect("33 in flight").given_up();
        assert_eq!(gate.holding_total(), 1);
        let (g2, gd2) = (gate.clone(), guard.clone());
        let b = tokio::spawn(async move { g2.order(&gd2, "r", Some("34")).await });
        until(|| gate.waiting("r") == 1).await;
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!b.is_finished(), "34 went while the store could still apply 33");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let b = b.await.ok();
        assert!(b.as_ref().is_some_and(|b| b.waited && b.action.forward), "34 goes once the bound has passed");
        assert_eq!(gate.holding_total(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_held_by_a_given_up_one_past_the_budget_is_told_when_to_retry() {
        let gate = Gate::new(true, Duration::from_secs(1), Duration::from_secs(10), None, true);
        let guard = guard();
        gate.order(&guard, "r", Some("33")).await.permit.expect("in flight").given_up();
        let b = gate.order(&guard, "r", Some("34")).await;
        assert!(b.event == Some(engine::Event::TimedOut) && !b.action.forward);
        let retry = b.retry_after.expect("Retry-After");
        assert!(retry > Duration::from_secs(8) && retry <= Duration::from_secs(9), "{retry:?}");
    }

    #[tokio::test]
    async fn with_no_apply_bound_a_write_given_up_on_ends_at_once() {
        let gate = Gate::new(true, Duration::from_secs(5), Duration::ZERO, None, true);
        let guard = guard();
        gate.order(&guard, "r", Some("33")).await.permit.expect("in flight").given_up();
        assert_eq!(gate.in_flight("r"), 0);
        let b = gate.order(&guard, "r", Some("34")).await;
        assert!(!b.waited && b.action.forward);
    }
}
