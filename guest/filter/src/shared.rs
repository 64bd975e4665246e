//! The ordering gate across instances, in the filter: the in-flight registry in
//! etcd (`fencekeeper_etcd_wire::flights`), shared with other Envoys and gateways
//! writing the same store through the same etcd (`gate.shared`).
//!
//! A write that passed this Envoy's gate (`gate`) is passed by the registry before it
//! goes upstream: one Txn that proves the mark is still its token and reads the
//! resource's flights, putting this worker's flight of that token first when no
//! write of it is registered yet (the ledger, `flights::Ledger`): a holder writing
//! again costs etcd a read-only Txn. A write that finds another instance's lower
//! flight stays held and asks again on each tick.
//!
//! Every call of the registry belongs to the worker's root context, whose context
//! lives as long as the VM (a request's call would be cancelled with its stream, and
//! a put's answer lost): a request hands its write to the root through the worker's
//! wake queue. The root also grants the worker a new lease every few seconds, never
//! kept alive, and puts flights under the newest (a write goes only while the lease
//! of its key is known to outlive it by the flight's longest life and the store apply
//! bound; else its Txn puts the key again), and deletes a token's flight a little
//! after its last write is over (the store answered it, or the bound passed after
//! Envoy gave up on it). What is not deleted goes with its lease: the flights of a
//! worker that died, a delete etcd never answered, a put answered too late.

use crate::etcd::{self, Method, Response};
use crate::gate::now_ms;
use crate::reply::Reply;
use crate::{wake, Filter, Tally};
use fencekeeper_core::refusal::NoVerdict;
use fencekeeper_core::{Token, Verdict};
use fencekeeper_etcd_wire::flights::{self, Ledger, Registration, MAX_ASKED_AGAIN};
use fencekeeper_etcd_wire::grpc;
use proxy_wasm::hostcalls;
use proxy_wasm::types::Action;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

/// How often the root grants a new lease (ms).
const LEASE_EVERY_MS: u64 = 5_000;
/// How soon a grant that failed is tried again (ms).
const GRANT_RETRY_MS: u64 = 1_000;
/// What a lease's TTL adds to what a flight needs and the period (ms): several grants
/// may fail before writes are refused.
const LEASE_MARGIN_MS: u64 = 5_000;

/// One worker's part of the registry.
pub struct Shared {
    /// The key prefix of flights.
    prefix: String,
    /// The longest a flight may need to outlive its write's forwarding: the longest
    /// Envoy may take to give up on it, plus the store apply bound.
    needed_ms: u64,
    /// The store apply bound.
    apply_bound_ms: u64,
    /// This worker's VM id, in its flights' keys.
    instance: u64,
    /// This worker's wake queue: a request hands its write to the root through it
    /// (`None`: the root's next tick sends it).
    queue: Option<u32>,
    /// The newest lease.
    lease: Cell<Option<Lease>>,
    /// The grant in flight from the root, and when it was sent.
    lease_call: Cell<Option<(u32, u64)>>,
    /// When the last grant was sent, and whether etcd granted it.
    last_grant: Cell<(u64, bool)>,
    /// Which tokens this worker has flights of.
    ledger: RefCell<Ledger>,
    /// Writes being passed, by request context.
    pending: RefCell<HashMap<u32, Pending>>,
    /// Writes that went upstream, by request context.
    sent: RefCell<HashMap<u32, (String, Token)>>,
    /// Writes given up on: out of the ledger when their bound has passed (ms).
    later: RefCell<Vec<(u64, String, Token)>>,
    /// Flights being put again under a newer lease, by call: the resource, the token
    /// and until when that lease lasts (ms).
    refreshing: RefCell<HashMap<u32, (String, Token, u64)>>,
    /// Deletes of idle flights in flight, by call.
    deleting: RefCell<HashMap<u32, Deletion>>,
    /// Deletes that failed, sent again on the next tick until their key's lease
    /// could have expired: a key left to its lease holds its resource, for every
    /// other instance, for up to a TTL after an etcd blip.
    undeleted: RefCell<Vec<Deletion>>,
}

/// An idle flight to delete at its revision, and until when trying is worth it (ms):
/// past then its lease, which was granted before the delete was first sent, is over.
#[derive(Clone)]
struct Deletion {
    resource: String,
    token: Token,
    revision: u64,
    until: u64,
}

#[derive(Clone, Copy)]
struct Lease {
    id: i64,
    /// It lasts at least until then (ms): its grant's send plus the TTL.
    until: u64,
}

/// A write being passed.
struct Pending {
    resource: String,
    token: Token,
    verdict: Verdict,
    reply: Reply,
    deadline: u64,
    /// Its Txn (the one in flight, or the last sent) puts the flight under a lease
    /// lasting until then (ms): the ledger said it must.
    put: Option<u64>,
    /// Its call in flight, if any (else the root sends it on the next wake or tick).
    call: Option<u32>,
    /// Another instance's lower write held it at least once (counted once).
    waited: bool,
    /// Its stream ended while its call was in flight: the answer only settles the
    /// ledger.
    gone: bool,
    /// Its Txn proves the retention floor is its token, the resource having no mark
    /// (`flights::Registration::Again`).
    at_floor: bool,
    /// How many times it was asked again so.
    asked_again: u32,
}

impl Shared {
    /// A worker's part of the registry under `prefix`, woken through `queue`.
    pub fn new(prefix: String, flight_ms: u64, apply_bound_ms: u64, instance: u64, queue: Option<u32>) -> Shared {
        Shared {
            prefix,
            needed_ms: flight_ms.saturating_add(apply_bound_ms),
            apply_bound_ms,
            instance,
            queue,
            lease: Cell::new(None),
            lease_call: Cell::new(None),
            last_grant: Cell::new((0, false)),
            ledger: RefCell::default(),
            pending: RefCell::default(),
            sent: RefCell::default(),
            later: RefCell::default(),
            refreshing: RefCell::default(),
            deleting: RefCell::default(),
            undeleted: RefCell::default(),
        }
    }

    fn ttl_secs(&self) -> u64 {
        (self.needed_ms + LEASE_EVERY_MS + LEASE_MARGIN_MS).div_ceil(1000)
    }

    /// The higher mark etcd already showed a write of `token` on `resource` (the
    /// ledger's [`Ledger::stale`]): such a write is refused stale before it enters.
    pub fn stale(&self, resource: &str, token: Token) -> Option<Token> {
        self.ledger.borrow().stale(resource, token)
    }

    /// Pass a write this Envoy's gate passed (`reply`'s request, `verdict` admitting
    /// `token` on `resource`): it is held until the registry lets it go.
    pub fn enter(&self, reply: &Reply, resource: &str, verdict: Verdict, token: Token, deadline: u64) {
        self.ledger.borrow_mut().begin(resource, token);
        let pending = Pending {
            resource: resource.to_owned(),
            token,
            verdict,
            reply: *reply,
            deadline,
            put: None,
            call: None,
            waited: false,
            gone: false,
            at_floor: false,
            asked_again: 0,
        };
        self.pending.borrow_mut().insert(reply.context, pending);
        // The root sends it: a wake of this worker's own queue runs the root next
        // (without a queue, the root's tick).
        if self.queue.is_some_and(|q| wake::wake_gate(q).is_err()) {
            log::warn!("fencekeeper: cannot wake the root to pass a write through the in-flight registry");
        }
    }

    /// Send the Txns of the pending writes not in flight (from the root), if the
    /// lease allows a write now; else they wait for the next tick.
    ///
    /// Writes of one token on one resource share a Txn, as confirms share a batch: its
    /// answer holds for each of them because it was sent after each arrived. A write
    /// whose token and resource have a Txn in flight waits for the next one, sent as
    /// soon as that answer comes (`on_root_answer`): a holder writing again on many
    /// connections costs etcd a Txn per round trip, not one per write.
    pub fn send(&self, f: &Filter) {
        self.send_some(f, false);
    }

    /// [`Shared::send`]; without the writes that another instance's lower write held
    /// when `not_waiting` (they ask again on the tick, not on every answer).
    fn send_some(&self, f: &Filter, not_waiting: bool) {
        let Some(e) = &f.config.etcd else { return };
        let needed_until = now_ms().saturating_add(self.needed_ms);
        let Some(lease) = self.lease.get().filter(|l| l.until >= needed_until) else {
            return;
        };
        if hostcalls::set_effective_context(f.root).is_err() {
            return;
        }
        let token = f.auth.as_ref().and_then(|a| a.token()).map(|(t, _)| t);
        let mut pending = self.pending.borrow_mut();
        // The Txn each (resource, token, at_floor) has in flight, and its put.
        let mut calls: HashMap<(String, Token, bool), (u32, Option<u64>)> = HashMap::new();
        let mut busy: HashSet<(String, Token, bool)> = HashSet::new();
        for p in pending.values().filter(|p| p.call.is_some()) {
            busy.insert((p.resource.clone(), p.token, p.at_floor));
        }
        for p in pending.values_mut().filter(|p| p.call.is_none() && !p.gone && !(not_waiting && p.waited)) {
            let key = (p.resource.clone(), p.token, p.at_floor);
            if let Some(&(call, put)) = calls.get(&key) {
                (p.call, p.put) = (Some(call), put);
                continue;
            }
            if busy.contains(&key) {
                continue;
            }
            p.put = self.ledger.borrow().must_put(&p.resource, p.token, needed_until).then_some(lease.until);
            let put = p.put.map(|_| lease.id);
            let (prefix, marks) = (&self.prefix, &e.key_prefix);
            let message = flights::pass_txn(prefix, marks, &p.resource, &p.token, self.instance, put, p.at_floor);
            p.call = etcd::call(e, Method::Txn, token.as_deref(), &message).ok();
            if let Some(call) = p.call {
                calls.insert(key, (call, p.put));
            }
        }
    }

    /// The answer to root call `token`, if it is the registry's: true when it was.
    pub fn on_root_answer(&self, f: &Filter, token: u32, response: &Response) -> bool {
        let contexts: Vec<u32> =
            self.pending.borrow().iter().filter(|(_, p)| p.call == Some(token)).map(|(c, _)| *c).collect();
        match contexts.is_empty() {
            false => {
                for context in contexts {
                    self.answer(f, context, response);
                }
                // The writes that waited for this Txn go in the next.
                self.send_some(f, true);
                true
            }
            true => {
                self.refresh_answer(token, response)
                    || self.delete_answer(token, response)
                    || self.lease_answer(token, response)
            }
        }
    }

    /// The answer to `context`'s Txn: settle the ledger, then forward, hold or refuse.
    fn answer(&self, f: &Filter, context: u32, response: &Response) -> bool {
        let mut pending = self.pending.borrow_mut();
        let Some(p) = pending.get_mut(&context) else { return true };
        p.call = None;
        let passed = match response {
            Ok(bytes) => grpc::parse_txn(bytes)
                .and_then(|a| {
                    let marks = f.config.etcd.as_ref().map_or("", |e| &e.key_prefix);
                    flights::passed(&a, &self.prefix, marks, &p.resource, &p.token, self.instance, p.put.is_some())
                })
                .map_err(|e| e.0),
            // etcd's authentication lets the user touch the marks but not the
            // registry: say what grants it.
            Err(status) if status.code == grpc::PERMISSION_DENIED => Err(format!(
                "{}; {}",
                status.error().0,
                flights::denied_hint(&self.prefix, "--local-gate (\"gate\": {\"shared\": false})")
            )),
            Err(status) => Err(status.error().0),
        };
        if let (Ok((_, Some(revision))), Some(lease_until)) = (&passed, p.put) {
            self.ledger.borrow_mut().put(&p.resource, p.token, *revision, lease_until);
        }
        if p.gone || hostcalls::set_effective_context(context).is_err() {
            // Its stream ended: nothing went upstream.
            let (resource, token) = (p.resource.clone(), p.token);
            pending.remove(&context);
            drop(pending);
            self.ledger.borrow_mut().end(&resource, token, now_ms());
            return true;
        }
        let refusal: (Result<Verdict, NoVerdict>, String) = match passed.map(|(r, _)| r) {
            Ok(Registration::Go) => {
                let Some(p) = pending.remove(&context) else { return true };
                drop(pending);
                let mut tally = Tally::default();
                let next = p.reply.conclude(f, Ok(p.verdict), &p.resource, &"", &mut tally, None);
                f.metrics.add(&tally);
                if let Some(g) = &f.gate {
                    g.forwarded(context);
                }
                self.sent.borrow_mut().insert(context, (p.resource, p.token));
                if matches!(next, Action::Continue) {
                    let _ = hostcalls::resume_http_request();
                }
                return true;
            }
            // Sent again by the next wake or tick, within its deadline.
            Ok(Registration::Again { at_floor }) if p.asked_again < MAX_ASKED_AGAIN => {
                p.at_floor = at_floor;
                p.asked_again += 1;
                return true;
            }
            Ok(Registration::Again { .. }) => (
                Err(NoVerdict::Refused),
                format!(
                    "the mark and the retention floor kept changing while the admitted token {} was registered in \
                     flight; retry",
                    p.token
                ),
            ),
            Ok(Registration::Wait) if now_ms() < p.deadline => {
                if !std::mem::replace(&mut p.waited, true) {
                    f.metrics.shared_waited();
                }
                return true;
            }
            Ok(Registration::Wait) => {
                let Some(p) = pending.remove(&context) else { return true };
                drop(pending);
                self.time_out(f, p);
                return true;
            }
            Ok(Registration::Stale(higher)) => {
                self.ledger.borrow_mut().superseded(&p.resource, p.token, higher);
                (Ok(Verdict::Stale { mark: higher, presented: p.token }), String::new())
            }
            Ok(Registration::BelowFloor(floor)) => (
                Ok(Verdict::Stale { mark: floor, presented: p.token }),
                fencekeeper_core::refusal::Forgotten { floor }.to_string(),
            ),
            Ok(Registration::Moved(mark)) => {
                // The shared-data copy names a mark etcd no longer holds (an operator
                // lowered or cleared it): dropped, so the retry reads etcd's and is
                // judged on it, not refused the same way every time.
                let _ = f.slots.forget(&p.resource);
                (
                    Err(NoVerdict::Refused),
                    format!(
                        "the mark moved below the admitted token {} (it is {}: lowered by an operator?) while it was \
                         registered in flight; retry",
                        p.token,
                        mark.map_or("none".to_owned(), |m| m.to_string())
                    ),
                )
            }
            Err(cause) => (Err(NoVerdict::StoreUnreachable), format!("the in-flight registry: {cause}")),
        };
        let Some(p) = pending.remove(&context) else { return true };
        drop(pending);
        self.refuse(f, p, refusal.0, &refusal.1);
        true
    }

    /// Refuse a write being passed (its request's context is the effective one): its
    /// local flight ends, and it leaves the ledger.
    fn refuse(&self, f: &Filter, p: Pending, outcome: Result<Verdict, NoVerdict>, cause: &str) {
        self.forget(f, &p);
        let mut tally = Tally::default();
        let retry = matches!(outcome, Err(NoVerdict::Refused)).then_some(1);
        p.reply.conclude(f, outcome, &p.resource, &cause, &mut tally, retry);
        f.metrics.add(&tally);
    }

    /// Refuse a write that another instance's lower write held past its budget: the
    /// gate's own 503 (`gate::Gate::time_out`), as the gateway's.
    fn time_out(&self, f: &Filter, p: Pending) {
        self.forget(f, &p);
        if let Some(g) = &f.gate {
            g.time_out(f, &p.reply, &p.resource, None);
        }
    }

    /// A write being passed is refused: its local flight ends, and it leaves the ledger.
    fn forget(&self, f: &Filter, p: &Pending) {
        if let Some(g) = &f.gate {
            g.end(f, p.reply.context);
        }
        self.ledger.borrow_mut().end(&p.resource, p.token, now_ms());
    }

    /// Request `context`'s stream ended: a write it sent stays in the ledger for the
    /// store apply bound unless the store `answered` it; one still being passed never
    /// went upstream.
    pub fn end(&self, context: u32, answered: bool) {
        let now = now_ms();
        let mut pending = self.pending.borrow_mut();
        if let Some(p) = pending.get_mut(&context) {
            if p.call.is_some() {
                p.gone = true; // its answer settles the ledger
            } else if let Some(p) = pending.remove(&context) {
                self.ledger.borrow_mut().end(&p.resource, p.token, now);
            }
        }
        drop(pending);
        let Some((resource, token)) = self.sent.borrow_mut().remove(&context) else { return };
        if answered || self.apply_bound_ms == 0 {
            self.ledger.borrow_mut().end(&resource, token, now);
        } else {
            self.later.borrow_mut().push((now.saturating_add(self.apply_bound_ms), resource, token));
        }
    }

    /// The root's tick: keep the lease, end the writes whose bound passed, delete the
    /// flights idle for a tick, refuse the writes past their deadline, send the rest.
    pub fn tick(&self, f: &Filter, tick_ms: u64) {
        let now = now_ms();
        self.keep_lease(f, now);
        let due: Vec<(String, Token)> = {
            let mut later = self.later.borrow_mut();
            let (due, keep): (Vec<_>, Vec<_>) = later.drain(..).partition(|(at, _, _)| *at <= now);
            *later = keep;
            due.into_iter().map(|(_, r, t)| (r, t)).collect()
        };
        for (resource, token) in due {
            self.ledger.borrow_mut().end(&resource, token, now);
        }
        self.delete_idle(f, now, tick_ms);
        self.refresh(f, now);
        let late: Vec<u32> = self
            .pending
            .borrow()
            .iter()
            .filter(|(_, p)| p.call.is_none() && !p.gone && now >= p.deadline)
            .map(|(c, _)| *c)
            .collect();
        for context in late {
            let Some(p) = self.pending.borrow_mut().remove(&context) else { continue };
            if hostcalls::set_effective_context(context).is_err() {
                self.ledger.borrow_mut().end(&p.resource, p.token, now);
                continue;
            }
            self.time_out(f, p);
        }
        self.send(f);
    }

    /// Delete the flights no write has used for `delay` (each only if still the one
    /// put at its revision), and again those whose delete failed, from the root.
    fn delete_idle(&self, f: &Filter, now: u64, delay: u64) {
        let until = now.saturating_add(self.ttl_secs() * 1000);
        let idle = self.ledger.borrow_mut().idle(now, delay);
        let mut due: Vec<Deletion> = std::mem::take(&mut *self.undeleted.borrow_mut());
        due.retain(|d| d.until > now);
        due.extend(idle.into_iter().map(|(resource, token, revision)| Deletion { resource, token, revision, until }));
        let Some(e) = f.config.etcd.as_ref().filter(|_| !due.is_empty()) else { return };
        if hostcalls::set_effective_context(f.root).is_err() {
            self.undeleted.borrow_mut().extend(due);
            return;
        }
        let auth = f.auth.as_ref().and_then(|a| a.token()).map(|(t, _)| t);
        // A delete that keeps failing leaves the key to its lease, which nobody keeps
        // alive: the resource waits at most a TTL longer, never less.
        for d in due {
            let message = flights::end_txn(&self.prefix, &d.resource, self.instance, &d.token, d.revision);
            match etcd::call(e, Method::Txn, auth.as_deref(), &message) {
                Ok(call) => drop(self.deleting.borrow_mut().insert(call, d)),
                Err(_) => self.undeleted.borrow_mut().push(d),
            }
        }
    }

    /// The answer to a delete, if `token` is one's: true when it was. A failed one
    /// is sent again; one whose compare failed (the key is gone, or put again since)
    /// is done.
    fn delete_answer(&self, token: u32, response: &Response) -> bool {
        let Some(d) = self.deleting.borrow_mut().remove(&token) else { return false };
        if let Err(e) = response.as_ref().map_err(|s| s.error().0).and_then(|b| grpc::parse_txn(b).map_err(|e| e.0)) {
            log::warn!("fencekeeper: a flight could not be deleted from the in-flight registry (sent again): {e}");
            self.undeleted.borrow_mut().push(d);
        }
        true
    }

    /// Put again, under the newest lease, the flights whose writes may outlive their
    /// key's lease (a write Envoy streams upstream for longer than the route timeout,
    /// or gives up on late). A put that fails leaves the old lease: the next tick tries
    /// again while the key lasts.
    fn refresh(&self, f: &Filter, now: u64) {
        let Some(e) = &f.config.etcd else { return };
        let needed_until = now.saturating_add(self.needed_ms);
        let Some(lease) = self.lease.get().filter(|l| l.until >= needed_until) else { return };
        let due: Vec<(String, Token)> = {
            let refreshing = self.refreshing.borrow();
            let busy = |r: &str, t: &Token| refreshing.values().any(|(br, bt, _)| br == r && bt == t);
            self.ledger.borrow().expiring(needed_until).into_iter().filter(|(r, t)| !busy(r, t)).collect()
        };
        if due.is_empty() || hostcalls::set_effective_context(f.root).is_err() {
            return;
        }
        let auth = f.auth.as_ref().and_then(|a| a.token()).map(|(t, _)| t);
        for (resource, token) in due {
            let message = flights::refresh_txn(&self.prefix, &resource, self.instance, &token, lease.id);
            if let Ok(call) = etcd::call(e, Method::Txn, auth.as_deref(), &message) {
                self.refreshing.borrow_mut().insert(call, (resource, token, lease.until));
            }
        }
    }

    /// The answer to a refresh put, if `token` is one's: true when it was.
    fn refresh_answer(&self, token: u32, response: &Response) -> bool {
        let Some((resource, flight, lease_until)) = self.refreshing.borrow_mut().remove(&token) else {
            return false;
        };
        match response.as_ref().map_err(|s| s.error().0).and_then(|b| grpc::parse_txn(b).map_err(|e| e.0)) {
            Ok(answer) => self.ledger.borrow_mut().put(&resource, flight, answer.revision, lease_until),
            Err(e) => log::warn!("fencekeeper: a flight in the in-flight registry could not be put again: {e}"),
        }
        true
    }

    /// Grant a new lease every [`LEASE_EVERY_MS`] (a grant that failed is tried again
    /// after [`GRANT_RETRY_MS`]); the old ones are left to expire.
    fn keep_lease(&self, f: &Filter, now: u64) {
        let Some(e) = &f.config.etcd else { return };
        // A grant in flight is waited for, up to two retry periods (then given up on).
        if self.lease_call.get().is_some_and(|(_, sent)| now < sent.saturating_add(2 * GRANT_RETRY_MS)) {
            return;
        }
        let (sent, granted) = self.last_grant.get();
        let every = if granted { LEASE_EVERY_MS } else { GRANT_RETRY_MS };
        if self.lease.get().is_some() && now < sent.saturating_add(every) {
            return;
        }
        if hostcalls::set_effective_context(f.root).is_err() {
            return;
        }
        let token = f.auth.as_ref().and_then(|a| a.token()).map(|(t, _)| t);
        let message = grpc::lease_grant(self.ttl_secs());
        self.lease_call.set(etcd::call(e, Method::LeaseGrant, token.as_deref(), &message).ok().map(|c| (c, now)));
        self.last_grant.set((now, false));
    }

    fn lease_answer(&self, token: u32, response: &Response) -> bool {
        let Some((_, sent)) = self.lease_call.get().filter(|(c, _)| *c == token) else { return false };
        self.lease_call.set(None);
        let granted = match response {
            Ok(answer) => grpc::parse_lease_grant(answer).map_err(|e| e.0),
            Err(_) => Err(response_error(response)),
        };
        match granted {
            Ok(id) => {
                self.lease.set(Some(Lease { id, until: sent.saturating_add(self.ttl_secs() * 1000) }));
                self.last_grant.set((sent, true));
            }
            Err(e) => log::warn!("fencekeeper: etcd granted the in-flight registry no new lease: {e}"),
        }
        true
    }
}

fn response_error(response: &Response) -> String {
    match response {
        Ok(_) => String::new(),
        Err(s) => s.error().0,
    }
}
