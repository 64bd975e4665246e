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
use fencekeeper_core::refusal::{self, Forgotten, NoVerdict};
#[cfg(test)]
use fencekeeper_core::Class;
use fencekeeper_core::{Mode, Token};
use fencekeeper_engine::flights::{Entered, Flights, Next, Table, WriteId};
use fencekeeper_engine::gate as engine;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The gateway's ordering gate: the engine's machine ([`Flights`]) behind a mutex,
/// with a task for each time it asks to be woken and a channel to each write it holds.
pub struct Gate {
    /// Off: writes are admitted and forwarded without ordering.
    enabled: bool,
    /// Admits are awaited on the request's task when the guard never blocks.
    awaiting: bool,
    /// How long a write waits at most (the gate timeout).
    timeout: Duration,
    /// The gate's clock: the machine's milliseconds are milliseconds since this.
    epoch: Instant,
    machine: Mutex<Machine>,
    next_id: AtomicU64,
    /// The in-flight registry shared with other instances, when configured.
    registry: Option<Arc<Registry>>,
}

/// The machine, its table, and the plumbing to what it decides.
struct Machine {
    flights: Flights,
    table: Table,
    /// The task of each write held at the gate, told what becomes of it.
    held: HashMap<WriteId, oneshot::Sender<Next>>,
    /// The times a timer task is already set for.
    wakes: BTreeSet<u64>,
}

/// A write registered as in flight on a resource. Dropping it, or
/// [`Permit::answered`], ends the flight and lets the writes held for it go;
/// [`Permit::given_up`] ends it only once the store apply bound has passed.
pub struct Permit {
    id: WriteId,
    gate: Arc<Gate>,
    /// Its flight in the shared registry, when there is one.
    remote: Option<registry::Flight>,
    given_up: bool,
}

impl Permit {
    /// The upstream answered the write (its response head arrived), or nothing was
    /// sent: the store will not apply it later, and the writes held for it may go.
    pub fn answered(self) {}

    /// The gateway gave up on the write after sending it (the upstream timed out,
    /// reset or failed): the store may still apply it, so it keeps holding its
    /// resource for the store apply bound, then ends.
    pub fn given_up(mut self) {
        if let Some(remote) = self.remote.take() {
            remote.given_up();
        }
        self.given_up = true;
        let id = self.id;
        self.gate.step(|m, now, out| m.flights.given_up(&mut m.table, now, id, out));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.given_up {
            let id = self.id;
            self.gate.step(|m, now, out| m.flights.answered(&mut m.table, now, id, out));
        }
    }
}

/// A write on its way from the admit to the gate: it holds its resource's entry (and
/// the highest token seen there) until it enters, or leaves when it is refused or
/// its task is dropped.
struct Arrival<'a> {
    gate: &'a Arc<Gate>,
    resource: &'a str,
    entered: bool,
}

/// A write held at the gate, its task awaiting the word: should the task be dropped
/// (the client went away) before the word becomes a [`Permit`], the write is taken off
/// the gate, or, were it let go already, its flight ended, so that it holds nothing.
struct Waiting<'a> {
    gate: &'a Arc<Gate>,
    id: WriteId,
    permitted: bool,
}

impl Waiting<'_> {
    /// The word was Go: the write is the permit's now.
    fn permit(mut self) -> Permit {
        self.permitted = true;
        Permit { id: self.id, gate: self.gate.clone(), remote: None, given_up: false }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.permitted {
            let id = self.id;
            self.gate.step(|m, now, out| m.flights.answered(&mut m.table, now, id, out));
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        if !self.entered {
            self.gate.step(|m, now, _| m.flights.leave(&mut m.table, now, self.resource));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent; a panic elsewhere must not
    // wedge the gate.
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
        let machine = Machine {
            flights: Flights::new(0, timeout, apply_bound),
            table: Table::default(),
            held: HashMap::new(),
            wakes: BTreeSet::new(),
        };
        Arc::new(Gate {
            enabled,
            awaiting,
            timeout,
            epoch: Instant::now(),
            machine: Mutex::new(machine),
            next_id: AtomicU64::new(0),
            registry,
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Run `f` on the machine at the time now, then carry out what it says.
    fn step<R>(self: &Arc<Self>, f: impl FnOnce(&mut Machine, u64, &mut Vec<Next>) -> R) -> R {
        let mut machine = lock(&self.machine);
        let now = self.now_ms();
        let mut out = Vec::new();
        let result = f(&mut machine, now, &mut out);
        self.carry_out(&mut machine, now, out);
        result
    }

    /// Tell held writes' tasks what became of them; set timers.
    fn carry_out(self: &Arc<Self>, m: &mut Machine, now: u64, mut out: Vec<Next>) {
        let mut i = 0;
        while let Some(next) = out.get(i).cloned() {
            i += 1;
            match next {
                Next::Go { id } | Next::Stale { id, .. } | Next::TimedOut { id, .. } => {
                    let told = m.held.remove(&id).map(|task| task.send(next));
                    // A held write whose task is gone was let go: nothing will be sent.
                    if let Some(Err(Next::Go { .. })) | None = told {
                        m.flights.answered(&mut m.table, now, id, &mut out);
                    }
                }
                Next::WakeAt(at) => {
                    if m.wakes.insert(at) {
                        let (gate, when) = (self.clone(), self.epoch + Duration::from_millis(at));
                        tokio::spawn(async move {
                            tokio::time::sleep_until(when).await;
                            gate.woken(at);
                        });
                    }
                }
                // The table is this instance's own: the shared registry tells the others.
                Next::Changed(_) => {}
            }
        }
    }

    /// A timer set for `at` fired.
    fn woken(self: &Arc<Self>, at: u64) {
        let mut machine = lock(&self.machine);
        let (now, mut out) = (self.now_ms(), Vec::new());
        let m = &mut *machine;
        m.wakes.remove(&at);
        m.flights.tick(&mut m.table, now, &mut out);
        self.carry_out(m, now, out);
    }

    /// The refusal of a write on `resource` held past the gate timeout, by lower
    /// writes holding it until `held_until` when every one was given up on.
    fn timed_out(&self, mode: Mode, resource: &str, held_until: Option<u64>) -> engine::Refused {
        let timeout = engine::Knob { name: "--gate-timeout", value: self.timeout };
        engine::timed_out(mode, resource, timeout, held_until, self.now_ms())
    }

    /// Writes currently in flight on `resource`, given-up ones still holding it
    /// included (for tests and inspection).
    pub fn in_flight(&self, resource: &str) -> usize {
        lock(&self.machine).table.in_flight(resource, self.now_ms())
    }

    /// Admitted writes currently waiting for lower-token writes, on every resource.
    pub fn waiting_total(&self) -> usize {
        lock(&self.machine).flights.waiting()
    }

    /// Writes waiting now in the shared registry for other instances' writes.
    pub fn shared_waiting(&self) -> Option<usize> {
        self.registry.as_ref().map(|r| r.waiting())
    }

    /// Writes given up on that still hold their resource (within the apply bound).
    pub fn holding_total(&self) -> usize {
        lock(&self.machine).flights.holding()
    }

    /// Admitted writes on `resource` currently waiting for lower-token writes.
    pub fn waiting(&self, resource: &str) -> usize {
        lock(&self.machine).flights.waiting_on(resource)
    }

    /// Admit a write of `resource` with `token` through `guard`, then order it at the
    /// gate: forwarded with a permit, or refused.
    pub async fn order(self: &Arc<Self>, guard: &Arc<Guard>, resource: &str, token: Option<&str>) -> Ordered {
        if !self.enabled {
            return from_decision(admit(guard, resource, token, self.awaiting).await, resource, None);
        }
        self.step(|m, _, _| m.flights.arrive(&mut m.table, resource));
        let arrival = Arrival { gate: self, resource, entered: false };
        let decision = admit(guard, resource, token, self.awaiting).await;
        let advance = decision.advance;
        let mut ordered = self.order_decided(guard, arrival, resource, decision).await;
        ordered.advance = advance;
        ordered
    }

    async fn order_decided(
        self: &Arc<Self>,
        guard: &Arc<Guard>,
        mut arrival: Arrival<'_>,
        resource: &str,
        decision: Decision,
    ) -> Ordered {
        let admitted = match decision.verdict {
            Some(Verdict::Admit { mark, .. }) if decision.action.forward => mark,
            _ => return from_decision(decision, resource, None),
        };
        arrival.entered = true;
        let mode = guard.decider().policy().mode;
        let id = self.next_id.fetch_add(1, Relaxed);
        let deadline = Instant::now() + self.timeout;
        let (task, told) = oneshot::channel();
        let entered = self.step(|m, now, out| {
            let entered = m.flights.enter(&mut m.table, now, id, resource, admitted, out);
            if entered == Entered::Held {
                m.held.insert(id, task);
            }
            entered
        });
        let waiting = Waiting { gate: self, id, permitted: false };
        match entered {
            Entered::Go => {
                let permit = waiting.permit();
                return self.across_instances(guard, mode, decision, resource, admitted, permit, deadline, false).await;
            }
            Entered::Stale(mark) => return ordered::stale(mode, mark, admitted, resource, false),
            Entered::Held => {}
        }
        match told.await {
            Ok(Next::Go { .. }) => {
                let permit = waiting.permit();
                // Another instance on the same marks may have admitted a higher token
                // while this one waited; with the registry, its Txn compares the mark.
                if self.registry.is_none() {
                    match mark_blocking(guard, resource).await.map(|m| m.filter(|m| *m > admitted)) {
                        Ok(Some(mark)) => return ordered::stale(mode, mark, admitted, resource, true),
                        Err(e) => {
                            let cause = e.to_string();
                            return ordered::gate_verdict(
                                mode,
                                Err(NoVerdict::StoreUnreachable),
                                resource,
                                &cause,
                                true,
                            );
                        }
                        Ok(None) => {}
                    }
                }
                self.across_instances(guard, mode, decision, resource, admitted, permit, deadline, true).await
            }
            Ok(Next::Stale { higher, .. }) => ordered::stale(mode, higher, admitted, resource, true),
            Ok(Next::TimedOut { until, .. }) => ordered::refused(self.timed_out(mode, resource, until), true),
            _ => {
                let cause = "the ordering gate let go of the write without a word";
                ordered::gate_verdict(mode, Err(NoVerdict::Refused), resource, cause, true)
            }
        }
    }

    /// A write this gateway's gate passed, ordered against the other instances' too
    /// when there is a shared registry: forwarded with `permit`, or refused.
    #[allow(clippy::too_many_arguments)]
    async fn across_instances(
        &self,
        guard: &Guard,
        mode: Mode,
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
        permit.answered(); // nothing was sent
        match refused {
            Refused::Stale(higher) => ordered::stale(mode, higher, admitted, resource, waited),
            Refused::BelowFloor(floor) => {
                let stale = Ok(Verdict::Stale { mark: floor, presented: admitted });
                ordered::gate_verdict(mode, stale, resource, &Forgotten { floor }.to_string(), waited)
            }
            Refused::TimedOut => ordered::refused(self.timed_out(mode, resource, None), true),
            Refused::Unreachable(cause) => {
                ordered::gate_verdict(mode, Err(NoVerdict::StoreUnreachable), resource, &cause, waited)
            }
            Refused::Moved(cause) => {
                // The mark moved under the store's copy (an operator lowered it): read
                // it, so the retry is judged on the store's mark, not on the copy the
                // pass just found wrong (an equal-token admit on the copy is confirmed
                // by the pass alone, and would be refused the same way every time).
                if let Some(store) = guard.store().awaitable() {
                    if let Err(e) = store.get(resource).await {
                        tracing::warn!(resource, error = %e, "the mark could not be read again after it moved");
                    }
                }
                ordered::gate_verdict(mode, Err(NoVerdict::Refused), resource, &cause, waited)
            }
        }
    }
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
    async fn a_held_write_dropped_as_it_is_let_go_holds_nothing() {
        let (gate, guard) = (Gate::new(true, Duration::from_secs(5), Duration::from_secs(30), None, true), guard());
        let a = gate.order(&guard, "r", Some("33")).await;
        let (g2, gd2) = (gate.clone(), guard.clone());
        let b = tokio::spawn(async move { g2.order(&gd2, "r", Some("34")).await });
        until(|| gate.waiting("r") == 1).await;
        // 33 answered: 34 is let go (registered as in flight), and its client goes
        // away before its task hears of it.
        drop(a);
        assert_eq!(gate.in_flight("r"), 1);
        b.abort();
        assert!(b.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(gate.in_flight("r"), 0, "a write nobody sends must not hold the resource");
        let c = gate.order(&guard, "r", Some("35")).await;
        assert!(!c.waited && c.action.forward);
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
