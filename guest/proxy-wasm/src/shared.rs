//! The ordering gate across instances, in the filter: the in-flight registry in
//! etcd (`fencekeeper_etcd_wire::flights`), shared with other Envoys and gateways
//! writing the same store through the same etcd (`gate.shared`).
//!
//! A write that passed this Envoy's gate (`gate`) is registered in etcd before it
//! goes upstream: one Txn, from the request's context, that proves the mark is still
//! its token, puts its flight under this worker's lease and reads the resource's
//! other flights. A write that finds a lower one stays held and asks again on each
//! tick of the worker's root. The root also keeps the worker's lease alive (one
//! keepalive a second; a write goes only while the lease is known to outlive it by
//! the flight's longest life and the store apply bound) and deletes flights: at once
//! when the store answered, after the bound when the write was given up on. Deletes
//! and lease calls are the root's, whose context lives as long as the VM; a worker
//! that dies loses its flights when its lease expires.

use crate::etcd::{self, Method, Response};
use crate::gate::now_ms;
use crate::reply::Reply;
use crate::{Filter, Tally};
use fencekeeper_core::refusal::NoVerdict;
use fencekeeper_core::{Token, Verdict};
use fencekeeper_etcd_wire::flights::{self, Registration};
use fencekeeper_etcd_wire::grpc;
use proxy_wasm::hostcalls;
use proxy_wasm::types::Action;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// How often the root keeps the lease alive (ms).
const KEEPALIVE_MS: u64 = 1_000;
/// What the lease's TTL adds to what a flight needs (ms): several keepalives may fail.
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
    sequence: Cell<u64>,
    lease: Cell<Option<Lease>>,
    /// The lease call in flight from the root (a grant or a keepalive), and when it
    /// was sent.
    lease_call: Cell<Option<(u32, u64)>>,
    last_keepalive: Cell<u64>,
    /// Writes being registered, by request context.
    pending: RefCell<HashMap<u32, Pending>>,
    /// Flights given up on: deleted when their time comes (ms).
    later: RefCell<Vec<(u64, String)>>,
    /// Keys of writes that went upstream, by request context.
    sent: RefCell<HashMap<u32, String>>,
}

#[derive(Clone, Copy)]
struct Lease {
    id: i64,
    /// It lasts at least until then (ms): the last keepalive's send plus the TTL.
    until: u64,
}

/// A write being registered.
struct Pending {
    resource: String,
    token: Token,
    verdict: Verdict,
    reply: Reply,
    key: String,
    deadline: u64,
    /// The registering call in flight, if any (else it is sent on the next tick).
    call: Option<u32>,
    /// Another instance's lower write held it at least once (counted once).
    waited: bool,
}

/// What a registering answer leads to.
pub enum Next {
    /// Not a registering call of this request.
    NotMine,
    /// Still held: asked again on the next tick, or answered already.
    Held,
    /// Passed the registry: forward it.
    Continue,
}

impl Shared {
    /// A worker's part of the registry under `prefix`.
    pub fn new(prefix: String, flight_ms: u64, apply_bound_ms: u64, instance: u64) -> Shared {
        Shared {
            prefix,
            needed_ms: flight_ms.saturating_add(apply_bound_ms),
            apply_bound_ms,
            instance,
            sequence: Cell::new(0),
            lease: Cell::new(None),
            lease_call: Cell::new(None),
            last_keepalive: Cell::new(0),
            pending: RefCell::default(),
            later: RefCell::default(),
            sent: RefCell::default(),
        }
    }

    fn ttl_secs(&self) -> u64 {
        (self.needed_ms + LEASE_MARGIN_MS).div_ceil(1000)
    }

    /// Register a write this Envoy's gate passed (`reply`'s request, `verdict`
    /// admitting `token` on `resource`); it is held until the registry lets it go.
    pub fn enter(&self, f: &Filter, reply: &Reply, resource: &str, verdict: Verdict, token: Token, deadline: u64) {
        let n = self.sequence.get();
        self.sequence.set(n + 1);
        let key = flights::flight_key(&self.prefix, resource, self.instance, n);
        let pending = Pending {
            resource: resource.to_owned(),
            token,
            verdict,
            reply: *reply,
            key,
            deadline,
            call: None,
            waited: false,
        };
        self.pending.borrow_mut().insert(reply.context, pending);
        // From the request's own context: the answer comes back to it.
        self.send(f, reply.context);
    }

    /// Send `context`'s registering Txn, if the lease allows a write now; else it
    /// waits for the next tick.
    fn send(&self, f: &Filter, context: u32) {
        let Some(e) = &f.config.etcd else { return };
        let Some(lease) = self.lease.get().filter(|l| l.until >= now_ms().saturating_add(self.needed_ms)) else {
            return;
        };
        let mut pending = self.pending.borrow_mut();
        let Some(p) = pending.get_mut(&context) else { return };
        let mark_key = format!("{}{}", e.key_prefix, p.resource);
        let message = flights::register_txn(&self.prefix, &mark_key, &p.resource, &p.token, &p.key, lease.id);
        let token = f.auth.as_ref().and_then(|a| a.token()).map(|(t, _)| t);
        p.call = etcd::call(e, Method::Txn, token.as_deref(), &message).ok();
    }

    /// The answer to call `token` on request `context`, if it is a registering one.
    pub fn answer(&self, f: &Filter, context: u32, token: u32, response: &Response) -> Next {
        let mut pending = self.pending.borrow_mut();
        let Some(p) = pending.get_mut(&context).filter(|p| p.call == Some(token)) else { return Next::NotMine };
        p.call = None;
        let registration = match response {
            Ok(bytes) => grpc::parse_txn(bytes)
                .and_then(|a| flights::registered(&a, &p.resource, &p.token, &p.key))
                .map_err(|e| e.0),
            Err(status) => Err(status.error().0),
        };
        let refusal: (Result<Verdict, NoVerdict>, String) = match registration {
            Ok(Registration::Go) => {
                let Some(p) = pending.remove(&context) else { return Next::Held };
                drop(pending);
                let mut tally = Tally::default();
                let next = p.reply.conclude(f, Ok(p.verdict), &p.resource, &"", &mut tally, None);
                f.metrics.add(&tally);
                if let Some(g) = &f.gate {
                    g.forwarded(context);
                }
                self.sent.borrow_mut().insert(context, p.key);
                return if matches!(next, Action::Continue) { Next::Continue } else { Next::Held };
            }
            Ok(Registration::Wait) if now_ms() < p.deadline => {
                if !std::mem::replace(&mut p.waited, true) {
                    f.metrics.shared_waited();
                }
                return Next::Held;
            }
            Ok(Registration::Wait) => (Err(NoVerdict::Refused), TIMED_OUT.to_owned()),
            Ok(Registration::Stale(higher)) => (Ok(Verdict::Stale { mark: higher, presented: p.token }), String::new()),
            Ok(Registration::Moved(mark)) => (
                Err(NoVerdict::Refused),
                format!(
                    "the mark moved below the admitted token {} (it is {}: lowered by an operator?) while it was \
                     registered in flight; retry",
                    p.token,
                    mark.map_or("none".to_owned(), |m| m.to_string())
                ),
            ),
            Err(cause) => (Err(NoVerdict::StoreUnreachable), format!("the in-flight registry: {cause}")),
        };
        let Some(p) = pending.remove(&context) else { return Next::Held };
        drop(pending);
        self.refuse(f, p, refusal.0, &refusal.1);
        Next::Held
    }

    /// Refuse a write being registered (the request's context is the effective
    /// one): its local flight ends, then its key is deleted (from the root).
    fn refuse(&self, f: &Filter, p: Pending, outcome: Result<Verdict, NoVerdict>, cause: &str) {
        if let Some(g) = &f.gate {
            g.end(f, p.reply.context);
        }
        let mut tally = Tally::default();
        let retry = matches!(outcome, Err(NoVerdict::Refused)).then_some(1);
        p.reply.conclude(f, outcome, &p.resource, &cause, &mut tally, retry);
        f.metrics.add(&tally);
        self.delete(f, p.key);
    }

    /// Request `context`'s stream ended: a write it sent keeps its flight for the
    /// store apply bound unless the store `answered` it; one still being registered
    /// never went upstream.
    pub fn end(&self, f: &Filter, context: u32, answered: bool) {
        if let Some(p) = self.pending.borrow_mut().remove(&context) {
            self.delete(f, p.key);
        }
        let Some(key) = self.sent.borrow_mut().remove(&context) else { return };
        if answered || self.apply_bound_ms == 0 {
            self.delete(f, key);
        } else {
            self.later.borrow_mut().push((now_ms().saturating_add(self.apply_bound_ms), key));
        }
    }

    /// Delete flight `key`, from the root (whose context outlives any request; it is
    /// the effective context afterwards). A delete that fails leaves the key to the
    /// lease: the resource waits longer, never less.
    fn delete(&self, f: &Filter, key: String) {
        let Some(e) = &f.config.etcd else { return };
        if hostcalls::set_effective_context(f.root).is_ok() {
            let token = f.auth.as_ref().and_then(|a| a.token()).map(|(t, _)| t);
            let _ = etcd::call(e, Method::Txn, token.as_deref(), &flights::end_txn(&key));
        }
    }

    /// The root's tick: keep the lease, delete flights whose time came, ask again for
    /// the writes still held, refuse those past their deadline.
    pub fn tick(&self, f: &Filter) {
        let now = now_ms();
        self.keep_lease(f, now);
        let due: Vec<String> = {
            let mut later = self.later.borrow_mut();
            let (due, keep): (Vec<_>, Vec<_>) = later.drain(..).partition(|(at, _)| *at <= now);
            *later = keep;
            due.into_iter().map(|(_, k)| k).collect()
        };
        for key in due {
            self.delete(f, key);
        }
        let contexts: Vec<(u32, bool)> = self
            .pending
            .borrow()
            .iter()
            .filter(|(_, p)| p.call.is_none())
            .map(|(c, p)| (*c, now >= p.deadline))
            .collect();
        for (context, late) in contexts {
            if hostcalls::set_effective_context(context).is_err() {
                // Its stream ended: nothing went upstream.
                if let Some(p) = self.pending.borrow_mut().remove(&context) {
                    self.delete(f, p.key);
                }
                continue;
            }
            if late {
                if let Some(p) = self.pending.borrow_mut().remove(&context) {
                    f.metrics.gate_timed_out();
                    self.refuse(f, p, Err(NoVerdict::Refused), TIMED_OUT);
                }
                continue;
            }
            self.send(f, context);
        }
    }

    fn keep_lease(&self, f: &Filter, now: u64) {
        let Some(e) = &f.config.etcd else { return };
        // A call in flight is waited for, up to two periods (then it is given up on).
        if self.lease_call.get().is_some_and(|(_, sent)| now < sent.saturating_add(2 * KEEPALIVE_MS)) {
            return;
        }
        let (method, message) = match self.lease.get() {
            None => (Method::LeaseGrant, grpc::lease_grant(self.ttl_secs())),
            Some(_) if now < self.last_keepalive.get().saturating_add(KEEPALIVE_MS) => return,
            Some(l) => (Method::LeaseKeepAlive, grpc::lease(l.id)),
        };
        if hostcalls::set_effective_context(f.root).is_err() {
            return;
        }
        let token = f.auth.as_ref().and_then(|a| a.token()).map(|(t, _)| t);
        self.lease_call.set(etcd::call(e, method, token.as_deref(), &message).ok().map(|c| (c, now)));
        self.last_keepalive.set(now);
    }

    /// The answer to call `token` that reached the root: a registering call the root
    /// sent for a request (the SDK hands an answer to the context whose callback made
    /// the call, whatever the effective one was), or a lease call. True when it was
    /// one of those.
    pub fn on_root_answer(&self, f: &Filter, token: u32, response: &Response) -> bool {
        let context = self.pending.borrow().iter().find(|(_, p)| p.call == Some(token)).map(|(c, _)| *c);
        if let Some(context) = context {
            if hostcalls::set_effective_context(context).is_err() {
                // Its stream ended: nothing went upstream.
                if let Some(p) = self.pending.borrow_mut().remove(&context) {
                    self.delete(f, p.key);
                }
            } else if let Next::Continue = self.answer(f, context, token, response) {
                let _ = hostcalls::resume_http_request();
            }
            return true;
        }
        self.lease_answer(token, response)
    }

    fn lease_answer(&self, token: u32, response: &Response) -> bool {
        let Some((_, sent)) = self.lease_call.get().filter(|(c, _)| *c == token) else { return false };
        self.lease_call.set(None);
        let Ok(answer) = response else {
            log::warn!("fencekeeper: cannot keep the in-flight registry's lease in etcd: {}", response_error(response));
            return true;
        };
        match self.lease.get() {
            None => match grpc::parse_lease_grant(answer) {
                Ok(id) => self.lease.set(Some(Lease { id, until: sent.saturating_add(self.ttl_secs() * 1000) })),
                Err(e) => log::warn!("fencekeeper: the in-flight registry's lease was not granted: {e}"),
            },
            Some(lease) => match grpc::parse_keepalive(answer) {
                Ok(ttl) if ttl > 0 => {
                    self.lease.set(Some(Lease { id: lease.id, until: sent.saturating_add(ttl as u64 * 1000) }))
                }
                Ok(_) => {
                    // It expired while etcd could not be reached: a new one on the next tick.
                    log::warn!(
                        "fencekeeper: the in-flight registry's lease {:x} expired; granting a new one",
                        lease.id
                    );
                    self.lease.set(None);
                }
                Err(e) => log::warn!("fencekeeper: the in-flight registry's lease was not kept alive: {e}"),
            },
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

const TIMED_OUT: &str = "timed out at the ordering gate waiting for lower-token writes in flight through another \
                         instance (the shared registry in etcd)";
