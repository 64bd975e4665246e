//! The in-flight ordering gate: closes the proxy's check-then-forward window
//! (docs/gateway.md, docs/architecture.md). A proxy checks a token before the upstream commits the write, so an
//! admitted write with token 33 that is slow to reach the store could land after a
//! write with token 34 admitted later. The gate tracks, per resource, the admitted
//! writes forwarded but not yet answered by the upstream:
//!
//! * an admitted write is registered as in flight only if no higher token has been
//!   registered on the resource (else it is stale, and refused) and no lower-token
//!   write is in flight; this check-and-register step is atomic, so registration
//!   order is token order;
//! * a write whose token is higher than a write in flight waits (at most the gate
//!   timeout) until every lower-token write on that resource has been answered;
//! * after waiting it is checked again: against the store's mark (another gateway
//!   sharing it may have admitted a higher token) and at registration, and refused
//!   as stale if a higher token got there first.
//!
//! Admits themselves (the store round trip) run concurrently; only the registration
//! step takes a lock, for microseconds.
//!
//! Hence, on one resource, the upstream receives a write only when every write it
//! received before has a token no higher, or has been answered. What remains: a write
//! whose upstream exchange timed out is released from the gate, and a store that still
//! applies it afterwards can apply it out of order (docs/gateway.md).

use fencekeeper::{Advance, Decision, Guard, StoreError, Verdict};
use fencekeeper_core::refusal::{self, Action, NoVerdict, Reason};
#[cfg(test)]
use fencekeeper_core::Class;
use fencekeeper_core::{Mode, Token};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A fenced write after the guard decided on it and the gate ordered it.
pub struct Ordered {
    /// Forward or refuse, with the class to count and the header token.
    pub action: Action,
    /// The one-line reason (for a refusal body or a log line).
    pub reason: String,
    /// The validator's verdict was proven wrong (what was wrong): count and log it.
    pub breach: Option<String>,
    /// Held while the write is in flight; drop it when the upstream has answered.
    pub permit: Option<Permit>,
    /// The write waited for lower-token writes in flight.
    pub waited: bool,
    /// The write waited longer than the gate timeout.
    pub timed_out: bool,
    /// The mark the admit raised, if it raised one: for the audit log. Set whatever
    /// happened at the gate afterwards (a write refused there had still raised it).
    pub advance: Option<Advance>,
}

/// The gate for every resource of one gateway.
pub struct Gate {
    enabled: bool,
    timeout: Duration,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    next_id: AtomicU64,
    waiting: AtomicUsize,
}

/// One resource's state; lives while a request for the resource is at the gate.
struct Entry {
    state: Mutex<State>,
    /// Signalled whenever a write in flight is answered.
    answered: Notify,
    /// Requests holding this entry; changed only under the `entries` lock.
    users: AtomicUsize,
}

#[derive(Default)]
struct State {
    in_flight: Vec<(u64, Token)>,
    /// Admitted writes waiting for lower-token writes.
    waiting: usize,
    /// The highest token admitted through this gateway while the entry lived.
    highest: Option<Token>,
}

impl State {
    fn lower_in_flight(&self, token: &Token) -> bool {
        self.in_flight.iter().any(|(_, t)| t < token)
    }

    fn raise(&mut self, token: Token) {
        if self.highest.is_none_or(|h| token > h) {
            self.highest = Some(token);
        }
    }
}

/// A write registered as in flight on a resource. Dropping it wakes the writes waiting
/// for it.
pub struct Permit {
    id: u64,
    entry: EntryRef,
}

impl Drop for Permit {
    fn drop(&mut self) {
        lock(&self.entry.entry.state).in_flight.retain(|(id, _)| *id != self.id);
        self.entry.entry.answered.notify_waiters();
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
    /// A gate whose writes wait at most `timeout`; when `enabled` is false, writes are
    /// admitted and forwarded without ordering (the window stays open).
    pub fn new(enabled: bool, timeout: Duration) -> Arc<Gate> {
        Arc::new(Gate {
            enabled,
            timeout,
            entries: Mutex::default(),
            next_id: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Writes currently in flight on `resource` (for tests and inspection).
    pub fn in_flight(&self, resource: &str) -> usize {
        lock(&self.entries).get(resource).map_or(0, |e| lock(&e.state).in_flight.len())
    }

    /// Admitted writes currently waiting for lower-token writes, on every resource.
    pub fn waiting_total(&self) -> usize {
        self.waiting.load(Relaxed)
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
                Arc::new(Entry { state: Mutex::default(), answered: Notify::new(), users: AtomicUsize::new(0) })
            })
            .clone();
        entry.users.fetch_add(1, Relaxed);
        EntryRef { gate: self.clone(), key: resource.to_owned(), entry }
    }

    /// Admit a write on `resource` carrying `token` through `guard`, then order it
    /// against the writes in flight.
    pub async fn order(self: &Arc<Self>, guard: &Arc<Guard>, resource: &str, token: Option<&str>) -> Ordered {
        if !self.enabled {
            return from_decision(admit_blocking(guard, resource, token).await, resource, None);
        }
        // Entered before the admit and held until the write is registered: the entry,
        // and the highest token it has registered, cannot be evicted in between. So a
        // higher token registered while this admit was deciding is seen at registration;
        // and one registered and answered before this entry existed had advanced the
        // store's mark before this admit read it.
        let entry = self.enter(resource);
        let decision = admit_blocking(guard, resource, token).await;
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
        match register(&entry.entry, admitted, id) {
            Registered::Yes => return from_decision(decision, resource, Some(Permit { id, entry })),
            Registered::Stale(mark) => return stale(mode, mark, admitted, resource, false),
            Registered::Wait => {}
        }
        lock(&entry.entry.state).waiting += 1;
        self.waiting.fetch_add(1, Relaxed);
        let ordered = self.wait_and_recheck(guard, &entry, resource, admitted, id, decision).await;
        lock(&entry.entry.state).waiting -= 1;
        self.waiting.fetch_sub(1, Relaxed);
        ordered
    }

    /// The slow path: wait for the lower-token writes, then check the token again.
    async fn wait_and_recheck(
        &self,
        guard: &Arc<Guard>,
        entry: &EntryRef,
        resource: &str,
        admitted: Token,
        id: u64,
        decision: Decision,
    ) -> Ordered {
        let mode = guard.decider().policy().mode;
        let deadline = Instant::now() + self.timeout;
        loop {
            if !wait_for_lower(&entry.entry, &admitted, deadline).await {
                let mut ordered = gate_verdict(mode, Err(NoVerdict::Refused), resource, TIMED_OUT, true);
                ordered.timed_out = true;
                return ordered;
            }
            // Another gateway sharing the store may have admitted a higher token.
            match mark_blocking(guard, resource).await.map(|m| m.filter(|m| *m > admitted)) {
                Ok(Some(mark)) => return stale(mode, mark, admitted, resource, true),
                Err(e) => return gate_verdict(mode, Err(NoVerdict::StoreUnreachable), resource, &e.to_string(), true),
                Ok(None) => {}
            }
            match register(&entry.entry, admitted, id) {
                Registered::Yes => {
                    let mut ordered = from_decision(decision, resource, Some(Permit { id, entry: entry.clone() }));
                    ordered.waited = true;
                    return ordered;
                }
                Registered::Stale(mark) => return stale(mode, mark, admitted, resource, true),
                Registered::Wait => {}
            }
        }
    }
}

enum Registered {
    /// In flight now: forward it.
    Yes,
    /// A higher token was registered meanwhile: the write is stale.
    Stale(Token),
    /// A lower-token write is in flight: wait for it.
    Wait,
}

/// The one step that orders writes, atomic under the resource's state lock: refuse a
/// token below one already registered, and register a token only when no lower one is
/// in flight. Registration order is therefore token order.
fn register(entry: &Entry, token: Token, id: u64) -> Registered {
    let mut state = lock(&entry.state);
    if let Some(highest) = state.highest.filter(|h| *h > token) {
        return Registered::Stale(highest);
    }
    state.raise(token);
    if state.lower_in_flight(&token) {
        return Registered::Wait;
    }
    state.in_flight.push((id, token));
    Registered::Yes
}

const TIMED_OUT: &str = "timed out at the ordering gate waiting for lower-token writes in flight";

/// Wait until no write with a lower token is in flight (true), or until `deadline` (false).
async fn wait_for_lower(entry: &Entry, token: &Token, deadline: Instant) -> bool {
    loop {
        let answered = entry.answered.notified();
        tokio::pin!(answered);
        // Register for the wake-up before looking, so an answer in between is not missed.
        answered.as_mut().enable();
        if !lock(&entry.state).lower_in_flight(token) {
            return true;
        }
        if tokio::time::timeout_at(deadline, answered).await.is_err() {
            return false;
        }
    }
}

fn from_decision(decision: Decision, resource: &str, permit: Option<Permit>) -> Ordered {
    let reason = decision.reason(resource);
    let breach = decision.breach().map(|b| b.what.clone());
    Ordered {
        action: decision.action,
        reason,
        breach,
        permit,
        waited: false,
        timed_out: false,
        advance: decision.advance,
    }
}

fn gate_verdict(mode: Mode, outcome: Result<Verdict, NoVerdict>, resource: &str, cause: &str, waited: bool) -> Ordered {
    let action = refusal::resolve(mode, outcome.as_ref().map_err(|e| *e));
    let reason = Reason { verdict: outcome.as_ref().ok(), resource, cause: &cause }.to_string();
    Ordered { action, reason, breach: None, permit: None, waited, timed_out: false, advance: None }
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
    ordered
}

/// A request whose resource key could not be formed: malformed, not ordered.
pub fn malformed(mode: Mode, error: fencekeeper_core::ResourceError) -> Ordered {
    let reason = fencekeeper::GuestText::new(&fencekeeper_core::Malformed::Resource(error).to_string());
    gate_verdict(mode, Ok(Verdict::Malformed(reason)), "", "", false)
}

/// The write's token fell below a higher one admitted meanwhile.
fn stale(mode: Mode, mark: Token, presented: Token, resource: &str, waited: bool) -> Ordered {
    gate_verdict(mode, Ok(Verdict::Stale { mark, presented }), resource, "", waited)
}

/// The guard is synchronous (wasm and a blocking store): run it off the reactor.
async fn admit_blocking(guard: &Arc<Guard>, resource: &str, token: Option<&str>) -> Decision {
    let (g, r, t) = (guard.clone(), resource.to_owned(), token.map(str::to_owned));
    match tokio::task::spawn_blocking(move || g.admit(&r, t.as_deref())).await {
        Ok(decision) => decision,
        Err(e) => {
            let action =
                refusal::resolve::<fencekeeper::GuestText>(guard.decider().policy().mode, Err(NoVerdict::Refused));
            let cause = StoreError::Unavailable(format!("the admit task failed: {e}"));
            Decision { verdict: None, action, undecided: Some(cause.into()), advance: None }
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
        let (gate, guard) = (Gate::new(true, Duration::from_secs(5)), guard());
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
        let (gate, guard) = (Gate::new(true, Duration::from_secs(5)), guard());
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
        let (gate, guard) = (Gate::new(true, Duration::from_millis(50)), guard());
        let _a = gate.order(&guard, "r", Some("33")).await;
        let b = gate.order(&guard, "r", Some("34")).await;
        assert!(b.timed_out && !b.action.forward);
        assert_eq!(b.action.class.http_status(), 503);
    }
}
