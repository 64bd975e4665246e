//! The ordering gate inside the proxy: no admitted write goes upstream while a
//! lower-token write this Envoy sent on the same resource may still reach the store.
//!
//! The filter checks a token before the store applies the write. If write A (33) is
//! admitted and sent, then B (34) is admitted and stored, A's delayed write could
//! still land after B's. So every admitted write passes the gate, by the core's rule
//! (`fencekeeper_core::gate`), on the resource's entry in the shared-data slots that
//! every worker shares (`slots`):
//!
//! * it is registered there as a *flight* (its VM, its context, its token) in the
//!   same compare-and-swap that checks that no live flight has a lower token and none
//!   a higher one, and that raises the local mark copy to its token;
//! * a write that finds a lower flight is held (`Action::Pause`), and its worker's
//!   wake queue is added to the entry; a write that finds a higher one, or a higher
//!   mark, is stale (409);
//! * when a flight's stream ends (`on_log`, which runs for answers and resets alike),
//!   its worker removes it if the upstream answered (its response came *via
//!   upstream*), or gives it a deadline of now plus the store apply bound if the
//!   write was given up on (a timeout, a reset, a client gone): the store may still
//!   apply it until then. Removing a flight wakes the queues listed on the entry;
//! * every worker's root context ticks: it re-checks the writes it holds (a flight
//!   past its deadline no longer holds them), refuses those held past the budget
//!   (503 with `Retry-After`), and stamps the worker's heartbeat;
//! * a held write that may go is confirmed in etcd first, with marks there and no
//!   shared registry (`confirms_after_waiting`): another instance on the same etcd may
//!   have admitted a higher token while it waited;
//! * a flight whose worker stopped stamping its heartbeat (a VM that trapped and was
//!   reloaded, or died) is treated as given up at its last stamp: it holds until the
//!   stamp plus the bound, then is dropped.
//!
//! Like the gateway's gate it orders one Envoy's writes and lives as long as the
//! process's shared data; a restarted Envoy refuses fenced writes for its start grace
//! instead (`start_grace_ms`). The gate's own refusals (`refuse`), what a flight's end
//! means and the defaults are the engine's (`fencekeeper_engine::gate`), as the
//! gateway's are.

use crate::config::{GateConfig, Host};
use crate::confirms::Waiter;
use crate::reply::Reply;
use crate::shared::Shared;
use crate::slots::{self, Entry, SharedFlight, MAX_CAS_ATTEMPTS};
use crate::{wake, Filter};
use fencekeeper_core::gate::{pass, Flight, Passage, Until};
use fencekeeper_core::refusal::{resolve, NoVerdict, Reason};
use fencekeeper_core::{Malformed, Token, Verdict};

use fencekeeper_engine::gate::{self as engine, End, Event, Knob};
use proxy_wasm::hostcalls;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

/// A worker whose heartbeat is older than this is presumed gone: its flights count
/// as given up at its last stamp.
const PRESUMED_GONE_MS: u64 = 2_000;

/// The gate's state in one worker's VM.
pub struct Gate {
    /// Budget, apply bound and tick.
    pub config: GateConfig,
    /// This VM's random id: the owner of its flights, the name of its heartbeat.
    pub vm: u64,
    /// This VM's wake queue (`wake`), listed on entries it holds writes back for.
    queue: Option<u32>,
    /// Writes this VM holds back, answered by its root.
    held: RefCell<Vec<Held>>,
    /// Flights this VM registered, by request context.
    mine: RefCell<HashMap<u32, Mine>>,
    /// Flights whose end could not be written yet (the slot kept changing): retried on
    /// every tick, so a resource is never left held by a flight that ended.
    unfinished: RefCell<Vec<(String, Mine, u32)>>,
    /// The in-flight registry shared with other instances (`gate.shared`).
    pub shared: Option<Shared>,
}

/// A write held back, waiting for lower flights.
struct Held {
    context: u32,
    resource: String,
    /// The admit it carries, concluded when it passes.
    verdict: Verdict,
    token: Token,
    reply: Reply,
    /// When it is refused (503) if still held.
    deadline: u64,
}

/// A flight this VM registered.
#[derive(Clone)]
struct Mine {
    resource: String,
    /// It went upstream (else it waits in the shared registry, and its end is at once).
    forwarded: bool,
    /// Its response came from the upstream: the store will not apply it later.
    answered: bool,
}

/// What the gate says of a write.
pub enum Entered {
    /// Registered as in flight: forward it.
    Go,
    /// Held back; the root answers it later.
    Held,
    /// Stale: a higher mark or write; this is the higher token.
    Stale(Token),
    /// The gate could not be consulted (shared data failing): refuse it.
    Failed(String),
    /// It would wait, and the host cannot hold it: answered already (503).
    Refused,
}

/// One try at the gate.
enum Step {
    Go,
    Wait(Option<u64>),
    Stale(Token),
    Failed(String),
}

/// The proxy's clock in milliseconds (shared by every worker of the process).
pub fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

fn heartbeat_key(vm: u64) -> String {
    format!("fencekeeper/vm/{vm:016x}")
}

/// The last heartbeat stamp of VM `vm`, if it can be read.
fn stamp(vm: u64) -> Option<u64> {
    let (data, _) = hostcalls::get_shared_data(&heartbeat_key(vm)).ok()?;
    <[u8; 8]>::try_from(data?.as_slice()).ok().map(u64::from_le_bytes)
}

impl Gate {
    /// A VM's gate, ordering across instances too with `shared`.
    pub fn new(config: GateConfig, vm: u64, queue: Option<u32>, shared: Option<Shared>) -> Gate {
        let (held, mine, unfinished) = (RefCell::default(), RefCell::default(), RefCell::default());
        Gate { config, vm, queue, held, mine, unfinished, shared }
    }

    /// Stamp this VM's heartbeat (it alone writes its key, so creating it races no one).
    pub fn heartbeat(&self) -> Result<(), proxy_wasm::types::Status> {
        hostcalls::set_shared_data(&heartbeat_key(self.vm), Some(&now_ms().to_le_bytes()), None)
    }

    /// How long `flight` (not this request's own) holds its resource at `now`, given
    /// the last `heartbeat` stamp of a VM.
    fn until(&self, flight: &SharedFlight, now: u64, heartbeat: &impl Fn(u64) -> Option<u64>) -> Until {
        if flight.deadline != 0 {
            return Until::Deadline(flight.deadline);
        }
        if flight.owner == self.vm {
            return Until::Answered;
        }
        match heartbeat(flight.owner) {
            Some(last) if now.saturating_sub(last) > PRESUMED_GONE_MS => {
                Until::Deadline(last.saturating_add(self.config.apply_bound_ms))
            }
            // A stamp that is fresh, or missing or unreadable: the worker is taken to be
            // alive (waiting is always safe).
            _ => Until::Answered,
        }
    }

    /// The flights of `entry` other than `context`'s own that can decide anything
    /// for `token` (equal tokens never do), with how long each holds; flights that no
    /// longer hold are removed from the entry (true when any was).
    fn judged(
        &self,
        entry: &mut Entry,
        context: u32,
        token: &Token,
        now: u64,
        heartbeat: impl Fn(u64) -> Option<u64>,
    ) -> (Vec<Flight>, bool) {
        let before = entry.flights.len();
        let mut judged = Vec::new();
        entry.flights.retain(|f| {
            if f.owner == self.vm && f.context == context {
                return true;
            }
            if f.token == *token && f.deadline == 0 {
                return true;
            }
            let flight = Flight { token: f.token, until: self.until(f, now, &heartbeat) };
            let live = flight.live(now);
            if live {
                judged.push(flight);
            }
            live
        });
        (judged, entry.flights.len() != before)
    }

    /// One try to pass the gate with `token` on `resource`, for request `context`;
    /// registered as in flight when it may go, if `register`.
    fn step(&self, f: &Filter, context: u32, resource: &str, token: Token, register: bool) -> Step {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let mut read = match f.slots.read(resource) {
                Ok(r) => r,
                Err(e) => return Step::Failed(e.to_string()),
            };
            let now = now_ms();
            let entry = read.entry_mut(resource);
            let (flights, pruned) = self.judged(entry, context, &token, now, stamp);
            let passage = pass(&token, entry.mark.as_ref(), flights, now);
            let step = match passage {
                Passage::Stale(higher) if !pruned => return Step::Stale(higher),
                Passage::Stale(higher) => Step::Stale(higher),
                Passage::Wait { until } => {
                    slots::raise(entry, token);
                    if let Some(q) = self.queue.filter(|q| !entry.wakers.contains(q)) {
                        entry.wakers.push(q);
                    }
                    Step::Wait(until)
                }
                Passage::Go => {
                    slots::raise(entry, token);
                    if register {
                        entry.flights.push(SharedFlight { owner: self.vm, context, token, deadline: 0 });
                    }
                    Step::Go
                }
            };
            match f.slots.store(&mut read) {
                Ok(true) => {
                    if let (Step::Go, true) = (&step, register) {
                        let forwarded = self.shared.is_none();
                        let mine = Mine { resource: resource.to_owned(), forwarded, answered: false };
                        self.mine.borrow_mut().insert(context, mine);
                    }
                    return step;
                }
                Ok(false) => continue,
                Err(e) => return Step::Failed(e.to_string()),
            }
        }
        Step::Failed("the ordering gate's shared-data compare-and-swap kept losing".to_owned())
    }

    /// The request's response arrived from the upstream: the store applied the write
    /// (or never will), so its flight ends at once when its stream does.
    pub fn answered(&self, context: u32) {
        if let Some(m) = self.mine.borrow_mut().get_mut(&context) {
            m.answered = true;
        }
    }

    /// Whether `context` has a flight registered (its response's origin matters).
    pub fn flying(&self, context: u32) -> bool {
        self.mine.borrow().contains_key(&context)
    }

    /// The shared registry let `context`'s write go upstream.
    pub fn forwarded(&self, context: u32) {
        if let Some(m) = self.mine.borrow_mut().get_mut(&context) {
            m.forwarded = true;
        }
    }

    /// The request `context`'s stream ended: end its flight (at once if answered,
    /// after the store apply bound if given up on), or forget it if it was held.
    pub fn end(&self, f: &Filter, context: u32) {
        self.held.borrow_mut().retain(|h| h.context != context);
        let Some(mut mine) = self.mine.borrow_mut().remove(&context) else { return };
        // Never sent upstream: nothing of it can land.
        mine.answered |= !mine.forwarded;
        if !mine.answered {
            f.metrics.gate(Event::GivenUp);
        }
        let answered = mine.answered;
        if !self.land(f, &mine, context) {
            self.unfinished.borrow_mut().push((mine.resource.clone(), mine, context));
        }
        if let Some(shared) = &self.shared {
            // Its key is deleted from the root: the effective context is the root's
            // afterwards, so this comes last of what the request's callback does.
            shared.end(context, answered);
        }
    }

    /// Write a flight's end into its entry, and wake the workers waiting on it. False
    /// when the slot could not be written.
    fn land(&self, f: &Filter, mine: &Mine, context: u32) -> bool {
        let bound = Duration::from_millis(self.config.apply_bound_ms);
        for _ in 0..MAX_CAS_ATTEMPTS {
            let Ok(mut read) = f.slots.read(&mine.resource) else { return false };
            let now = now_ms();
            let entry = read.entry_mut(&mine.resource);
            let own = |fl: &SharedFlight| fl.owner == self.vm && fl.context == context;
            let removed = match engine::end(mine.answered, now, bound) {
                End::Now => {
                    entry.flights.retain(|fl| !own(fl));
                    true
                }
                End::At(until) => {
                    // 0 is "no deadline" in a slot.
                    entry.flights.iter_mut().filter(|fl| own(fl)).for_each(|fl| fl.deadline = until.max(1));
                    false
                }
            };
            // Flights given up on whose bound has passed go too.
            entry.flights.retain(|fl| fl.deadline == 0 || fl.deadline > now);
            let wakers = if removed { std::mem::take(&mut entry.wakers) } else { Vec::new() };
            match f.slots.store(&mut read) {
                Ok(true) => {
                    for q in wakers {
                        // A queue of a VM since reloaded is gone: nobody to wake there.
                        let _ = wake::wake_gate(q);
                    }
                    return true;
                }
                Ok(false) => continue,
                Err(_) => return false,
            }
        }
        false
    }

    /// The root's tick: stamp the heartbeat, finish flights left unfinished, re-check
    /// the writes held back.
    pub fn tick(&self, f: &Filter) {
        let _ = self.heartbeat();
        let unfinished = std::mem::take(&mut *self.unfinished.borrow_mut());
        for (resource, mine, context) in unfinished {
            if !self.land(f, &mine, context) {
                self.unfinished.borrow_mut().push((resource, mine, context));
            }
        }
        self.recheck(f);
        if let Some(shared) = &self.shared {
            shared.tick(f, self.config.tick_ms);
        }
    }

    /// Re-check every write held back (woken by a flight's end, or on the tick): pass
    /// the ones that may go, refuse the stale and the ones held past the budget.
    pub fn recheck(&self, f: &Filter) {
        let held = std::mem::take(&mut *self.held.borrow_mut());
        let mut keep = Vec::new();
        let mut tally = crate::Tally::default();
        let mut confirming = false;
        for h in held {
            if hostcalls::set_effective_context(h.context).is_err() {
                continue; // its stream ended meanwhile
            }
            let confirm = self.confirms_after_waiting(f);
            match self.step(f, h.context, &h.resource, h.token, !confirm) {
                Step::Go if self.shared.is_some() => {
                    if let Some(higher) = self.across(f, &h.reply, &h.resource, h.verdict, h.token) {
                        let stale = Verdict::Stale { mark: higher, presented: h.token };
                        h.reply.conclude(f, Ok(stale), &h.resource, &"", &mut tally, None);
                    }
                }
                // Confirmed in etcd first: the batch's answer enters the gate again.
                Step::Go if confirm => {
                    confirming |= f.confirms.join(&h.resource, Waiter { token: h.token, reply: h.reply });
                }
                Step::Go => {
                    let next = h.reply.conclude(f, Ok(h.verdict), &h.resource, &"", &mut tally, None);
                    if matches!(next, proxy_wasm::types::Action::Continue) {
                        let _ = hostcalls::resume_http_request();
                    }
                }
                Step::Stale(higher) => {
                    let stale = Verdict::Stale { mark: higher, presented: h.token };
                    h.reply.conclude(f, Ok(stale), &h.resource, &"", &mut tally, None);
                }
                Step::Failed(cause) => {
                    let outcome = Err(fencekeeper_core::NoVerdict::Refused);
                    h.reply.conclude(f, outcome, &h.resource, &cause, &mut tally, None);
                }
                Step::Wait(until) if now_ms() >= h.deadline => self.time_out(f, &h.reply, &h.resource, until),
                Step::Wait(_) => keep.push(h),
            }
        }
        f.metrics.add(&tally);
        self.held.borrow_mut().extend(keep);
        if confirming {
            crate::confirms::send_ready(f);
        }
    }

    /// Refuse the write of `reply`'s request on `resource`, held past the budget by
    /// lower writes (holding it until `until` when every one was given up on).
    pub fn time_out(&self, f: &Filter, reply: &Reply, resource: &str, until: Option<u64>) {
        let budget = Knob { name: "gate.budget_ms", value: Duration::from_millis(self.config.budget_ms) };
        refuse(f, reply, &engine::timed_out(f.config.policy.mode, resource, budget, until, now_ms()));
    }

    /// Refuse the write of `reply`'s request on `resource`, which would wait for lower
    /// writes (holding it until `until` when every one was given up on), on a host
    /// where nothing can resume it later: as a write held past a budget of nothing.
    fn cannot_hold(&self, f: &Filter, reply: &Reply, resource: &str, until: Option<u64>) {
        let host = match f.config.host {
            Host::Portable => "the configuration's \"host\": \"portable\"",
            Host::Envoy => "proxy_set_effective_context does not switch contexts on this proxy-wasm host",
        };
        let cause = format!(
            "a lower-token write on it may still reach the store, and this write cannot be held until then ({host}); \
             nothing was forwarded"
        );
        let reason = Reason::<Malformed> { verdict: None, resource, cause: &cause }.to_string();
        let action = resolve::<Malformed>(f.config.policy.mode, Err(NoVerdict::Refused));
        let now = now_ms();
        // Unanswered lower writes end at an unknown time: soon.
        let retry_after = Duration::from_millis(until.map_or(1_000, |at| at.saturating_sub(now)));
        refuse(f, reply, &engine::Refused { action, reason, retry_after, event: Event::TimedOut });
    }

    /// Whether a write that waited is confirmed in etcd before it goes: while it
    /// waited, another instance writing through the same etcd may have admitted a
    /// higher token, which this Envoy's shared data does not know (the gateway reads
    /// the store's mark again). A shared registry's Txn compares the mark itself;
    /// marks in shared data alone are this Envoy's own.
    fn confirms_after_waiting(&self, f: &Filter) -> bool {
        self.shared.is_none() && f.config.etcd.is_some()
    }

    /// Admitted write `verdict` (token `token`) of `reply`'s request on `resource`:
    /// go, be held, or be refused.
    pub fn enter(&self, f: &Filter, reply: &Reply, resource: &str, verdict: Verdict, token: Token) -> Entered {
        match self.step(f, reply.context, resource, token, true) {
            Step::Go if self.shared.is_some() => match self.across(f, reply, resource, verdict, token) {
                None => Entered::Held,
                Some(higher) => Entered::Stale(higher),
            },
            Step::Go => Entered::Go,
            Step::Stale(higher) => Entered::Stale(higher),
            Step::Failed(cause) => Entered::Failed(cause),
            // A host on which the root cannot act for the request later: refused now,
            // from the request's own context (`hold`).
            Step::Wait(until) if !f.hold.possible(f.root, reply.context) => {
                self.cannot_hold(f, reply, resource, until);
                Entered::Refused
            }
            Step::Wait(_) => {
                f.metrics.gate(Event::Waited);
                let deadline = now_ms().saturating_add(self.config.budget_ms);
                let h = Held {
                    context: reply.context,
                    resource: resource.to_owned(),
                    verdict,
                    token,
                    reply: *reply,
                    deadline,
                };
                self.held.borrow_mut().push(h);
                Entered::Held
            }
        }
    }

    /// A write this Envoy's gate passed goes on to the shared registry, held until it
    /// lets it go (the budget counts from now); or, when etcd already showed a mark
    /// above its token, it ends here, and the caller refuses it stale (the mark).
    fn across(&self, f: &Filter, reply: &Reply, resource: &str, verdict: Verdict, token: Token) -> Option<Token> {
        let shared = self.shared.as_ref()?;
        if let Some(higher) = shared.stale(resource, token) {
            self.end(f, reply.context);
            return Some(higher);
        }
        shared.enter(reply, resource, verdict, token, now_ms().saturating_add(self.config.budget_ms));
        None
    }

    /// Writes held back now (for the tick's cost: it reads slots only when some are).
    pub fn holding(&self) -> bool {
        !self.held.borrow().is_empty()
    }
}

/// Send a refusal the gate makes itself (a write held past the budget, one in the
/// start grace), and count it: its class and its event.
pub fn refuse(f: &Filter, reply: &Reply, refused: &engine::Refused) {
    f.metrics.gate(refused.event);
    let mut tally = crate::Tally::default();
    tally.add(refused.action.class, false);
    f.metrics.add(&tally);
    log::warn!("fencekeeper: refused a write: {}", refused.reason);
    reply.refuse(&refused.action, &refused.reason, Some(refused.retry_after_seconds()));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    fn gate() -> Gate {
        Gate::new(GateConfig::default(), 1, Some(9), None)
    }

    fn flight(owner: u64, context: u32, token: &str, deadline: u64) -> SharedFlight {
        SharedFlight { owner, context, token: token!(token), deadline }
    }

    #[test]
    fn judging_skips_the_own_flight_and_equal_tokens_and_prunes_what_is_over() {
        let g = gate();
        let mut entry = Entry {
            key: "/r".into(),
            mark: Some(token!("34")),
            flights: vec![
                flight(1, 5, "34", 0),     // the request's own
                flight(1, 6, "34", 0),     // the same holder's other write
                flight(1, 7, "33", 0),     // lower, in flight on this VM
                flight(1, 8, "32", 1_000), // lower, given up, still holding at 999
                flight(1, 9, "31", 10),    // lower, given up, over
            ],
            wakers: vec![],
        };
        let (judged, pruned) = g.judged(&mut entry, 5, &token!("34"), 999, |_| None);
        assert!(pruned);
        assert_eq!(
            judged,
            [
                Flight { token: token!("33"), until: Until::Answered },
                Flight { token: token!("32"), until: Until::Deadline(1_000) }
            ]
        );
        assert_eq!(entry.flights.len(), 4, "only the flight whose bound passed is dropped");
    }

    #[test]
    fn a_flight_of_a_worker_gone_quiet_holds_until_its_last_stamp_plus_the_bound() {
        let g = gate();
        let bound = g.config.apply_bound_ms;
        let gone = flight(2, 5, "33", 0);
        let stamp = |last: u64| move |vm: u64| (vm == 2).then_some(last);
        // Stamped recently: alive, in flight.
        assert_eq!(g.until(&gone, 10_000, &stamp(9_000)), Until::Answered);
        // Quiet for longer than a worker may be: given up at its last stamp.
        assert_eq!(g.until(&gone, 10_000, &stamp(1_000)), Until::Deadline(1_000 + bound));
        // No stamp to read: taken to be alive (waiting is safe).
        assert_eq!(g.until(&gone, 10_000, &|_| None), Until::Answered);
        // This VM's own flights, and flights given up on, need no stamp.
        assert_eq!(g.until(&flight(1, 6, "33", 0), 10_000, &stamp(0)), Until::Answered);
        assert_eq!(g.until(&flight(2, 6, "33", 77), 10_000, &stamp(0)), Until::Deadline(77));
    }
}
