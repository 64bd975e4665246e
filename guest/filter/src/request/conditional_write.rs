//! A conditional write through one request (`conditional_writes`): the chain read
//! for the precondition its headers carry, its body held until whole and lent, the
//! store's answer settled, and a read's answer learned. A version the chain does not
//! know is asked of the store itself (a HEAD through `conditional_store_cluster`)
//! before the write is refused for it. The chain changes themselves
//! are [`crate::conditional`]'s; what each outcome means for the client, and what it
//! counts, is the engine's (`fencekeeper_engine::conditional`), as in the gateway. A
//! conditional write is counted once its outcome is known, not when its headers go.

use super::Request;
use crate::conditional::{self, Change as ChainChange, Done, Step, Update};
use crate::etcd;
use crate::Tally;
use fencekeeper_chain::{self as chain, Answer, Chain, Lend, Refusal, Term, Version};
use fencekeeper_core::{Class, Token, Verdict};
use fencekeeper_engine::conditional::{self as rules, Refused, Stored};
use md5::{Digest, Md5};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType};
use std::rc::Rc;

/// A conditional write's progress ([`conditional`]).
pub(super) struct Cond {
    pub(super) resource: String,
    pub(super) token: Token,
    pub(super) delete: bool,
    /// Its body is still to come: it is lent once the body is whole.
    pub(super) body_to_come: bool,
    /// The precondition its headers carry, once they went.
    pub(super) on: Option<Version>,
    /// Its lend, once recorded.
    pub(super) lent: Option<Lend>,
    /// The chain change in flight.
    pub(super) update: Option<Update>,
    /// The store's answer, while it settles the chain.
    pub(super) stored: Option<Stored>,
    /// The chain's record as this request last saw or put it, for its next change to
    /// swap from without reading first.
    pub(super) record: Option<Option<Vec<u8>>>,
    /// The store answered before the write was lent (its body still held).
    pub(super) answered_early: bool,
    /// Its outcome was counted.
    pub(super) counted: bool,
    /// The store was asked for the version the chain did not know (once per write).
    pub(super) asked_store: bool,
    /// The change to make again once the version asked of the store is learned.
    pub(super) retry: Option<ChainChange>,
}

/// How long the store has to answer the filter's HEAD: the gate timeout, as a write
/// waits at most that long for anything before it goes.
const ASK_STORE_TIMEOUT: std::time::Duration = fencekeeper_engine::gate::GATE_TIMEOUT;

/// `change` as made again now: a lend's term starts when it is recorded.
fn renewed(change: ChainChange, now: Term) -> ChainChange {
    match change {
        ChainChange::Peek(token, _) => ChainChange::Peek(token, now),
        ChainChange::Lend { token, makes, on, .. } => ChainChange::Lend { token, makes, on, term: now },
        other => other,
    }
}

impl Request {
    /// The write with `token` on `resource` was admitted: lend it on the resource's
    /// chain before the store can apply it. A write whose body is still to come is
    /// only peeked at now (its headers need the precondition); it is lent when its
    /// body is whole ([`Request::body_whole`]).
    pub(super) fn lend(&mut self, resource: &str, token: Token, delete: bool) -> Action {
        let f = Rc::clone(&self.filter);
        let body_to_come = !delete && !self.headers_end;
        let term = conditional::term(&f);
        let change = if body_to_come {
            ChainChange::Peek(token, term)
        } else {
            let makes = if delete { Version::Absent } else { chain::content_version(&Md5::digest(b"").into()) };
            ChainChange::Lend { token, makes: Some(makes), on: None, term }
        };
        let prefix = f.config.etcd.as_ref().map_or("", |e| e.key_prefix.as_str());
        let (update, read) = Update::start(prefix, resource, change, None);
        self.cond = Some(Cond {
            resource: resource.to_owned(),
            token,
            delete,
            body_to_come,
            on: None,
            lent: None,
            update: Some(update),
            stored: None,
            record: None,
            answered_early: false,
            counted: false,
            asked_store: false,
            retry: None,
        });
        match conditional::send(&f, &read) {
            Ok(_) => Action::Pause,
            Err(why) => self.lend_failed(&why),
        }
    }

    /// The chain change in flight was answered by etcd.
    pub(super) fn on_chain(&mut self, response: &etcd::Response) {
        let f = Rc::clone(&self.filter);
        let Some(c) = self.cond.as_mut() else { return };
        let Some(update) = c.update.as_mut() else { return };
        let step = match update.answered(response) {
            Step::Send(message) => match conditional::send(&f, &message) {
                Ok(_) => return,
                Err(why) => Step::Failed(why),
            },
            step => step,
        };
        let Some(update) = c.update.take() else { return };
        let change = update.change().clone();
        if let Step::Done(_) = step {
            c.record = update.last();
        }
        let store_cluster = f.config.conditional.as_ref().and_then(|c| c.store_cluster.as_deref());
        match (change, step) {
            (
                change @ (ChainChange::Peek(..) | ChainChange::Lend { .. }),
                Step::Done(Done::Refused(Refusal::Unknown)),
            ) if !c.asked_store && store_cluster.is_some() => {
                c.asked_store = true;
                c.retry = Some(change);
                if let Err(why) = self.ask_store(store_cluster.unwrap_or_default()) {
                    log::warn!("fencekeeper: could not ask the store for a version: {why}");
                    self.not_known();
                }
            }
            (ChainChange::Learn(_), Step::Done(_)) => {
                // Learned from the store's answer to the HEAD: the write's change again.
                let Some(retry) = c.retry.take() else {
                    self.lend_failed("an unexpected version chain outcome");
                    return;
                };
                let prefix = f.config.etcd.as_ref().map_or("", |e| e.key_prefix.as_str());
                let (update, message) =
                    Update::start(prefix, &c.resource, renewed(retry, conditional::term(&f)), c.record.take());
                c.update = Some(update);
                if let Err(why) = conditional::send(&f, &message) {
                    c.update = None;
                    self.lend_failed(&why);
                }
            }
            (ChainChange::Peek(..), Step::Done(Done::Lent(lend))) => {
                // The headers go with the precondition; the body waits for the lend.
                self.send_headers(&lend.on);
            }
            (ChainChange::Lend { .. }, Step::Done(Done::Lent(lend))) => {
                let (on, id) = (lend.on.clone(), lend.id);
                c.lent = Some(lend);
                if c.answered_early {
                    // The store answered before the body went: it will not apply it.
                    self.settle(id, Answer::NotApplied);
                } else if c.on.is_some() {
                    let _ = hostcalls::resume_http_request(); // the body, held until now
                } else {
                    self.send_headers(&on);
                }
            }
            (ChainChange::Peek(..) | ChainChange::Lend { .. }, Step::Done(Done::Refused(refusal))) => {
                let refused = rules::lend_refused(&c.resource, c.token, &refusal, self.reply.form);
                self.conclude(Some(refused));
            }
            (ChainChange::Lend { .. }, Step::Done(Done::Moved { carried, now })) => {
                let refused = rules::moved(&c.resource, &carried, &now, self.reply.form);
                self.conclude(Some(refused));
            }
            (ChainChange::Settle { .. }, Step::Done(Done::Chain(chain))) => {
                if !self.settled(Some(&chain)) {
                    let _ = hostcalls::resume_http_response();
                }
            }
            (ChainChange::Settle { .. }, Step::Failed(why)) => {
                log::error!(
                    "fencekeeper: a write's answer was not recorded in the version chain of {:?}; it stays lent: \
                     {why}",
                    c.resource
                );
                if !self.settled(None) {
                    let _ = hostcalls::resume_http_response();
                }
            }
            (_, Step::Failed(why)) => {
                self.lend_failed(&why);
            }
            (_, Step::Done(_) | Step::Send(_)) => {
                // Not an outcome any change has: refused, never forwarded.
                self.lend_failed("an unexpected version chain outcome");
            }
        }
    }

    /// Ask the store for the resource's version: a HEAD of the write's own path, with
    /// its Host, through the store's cluster (`cluster`), as the gateway does. The
    /// answer comes to [`Request::on_store_version`].
    fn ask_store(&mut self, cluster: &str) -> Result<u32, String> {
        let path = self.get_http_request_header(":path").unwrap_or_else(|| "/".to_owned());
        let authority = self.get_http_request_header(":authority").unwrap_or_default();
        let headers = vec![(":method", "HEAD"), (":path", path.as_str()), (":authority", authority.as_str())];
        self.dispatch_http_call(cluster, headers, None, Vec::new(), ASK_STORE_TIMEOUT)
            .map_err(|status| format!("the proxy refused the call to cluster {cluster:?} ({status:?})"))
    }

    /// The store answered the filter's HEAD (or the call failed: no status): learn the
    /// version it tells, then make the write's change again; else refuse the write
    /// for the version the fence does not know.
    pub(super) fn on_store_version(&mut self) {
        let f = Rc::clone(&self.filter);
        let status = self.get_http_call_response_header(":status");
        let status = status.and_then(|s| s.parse::<u16>().ok()).unwrap_or(0);
        let etag = self.get_http_call_response_header_bytes("etag");
        let Some(c) = self.cond.as_mut() else { return };
        let Some(version) = rules::learned(status, etag.as_deref()) else {
            log::warn!(
                "fencekeeper: the store's answer to the filter's HEAD of {:?} ({}) tells no version: a client's read \
                 through the proxy must",
                c.resource,
                if status == 0 { "none".to_owned() } else { status.to_string() }
            );
            return self.not_known();
        };
        let prefix = f.config.etcd.as_ref().map_or("", |e| e.key_prefix.as_str());
        let (update, message) = Update::start(prefix, &c.resource, ChainChange::Learn(version), c.record.take());
        c.update = Some(update);
        if let Err(why) = conditional::send(&f, &message) {
            c.update = None;
            self.lend_failed(&why);
        }
    }

    /// The write is refused: the fence does not know the store's version (a client's
    /// read through the proxy tells it).
    fn not_known(&mut self) {
        let Some(c) = self.cond.as_ref() else { return };
        let refused = rules::lend_refused(&c.resource, c.token, &Refusal::Unknown, self.reply.form);
        self.conclude(Some(refused));
    }

    /// Put the precondition on `on` into the headers and let them go, with the admitted
    /// token (counted once the write's outcome is known: [`Request::conclude`]).
    fn send_headers(&mut self, on: &Version) {
        let f = Rc::clone(&self.filter);
        let Some(c) = self.cond.as_mut() else { return };
        c.on = Some(on.clone());
        let (name, value) = rules::precondition(on);
        let _ = hostcalls::set_map_value(proxy_wasm::types::MapType::HttpRequestHeaders, name, Some(&value));
        let (resource, token) = (c.resource.clone(), c.token);
        let admitted = Ok(Verdict::Admit { mark: token, advanced: false });
        if let Action::Continue = self.reply.answer(&f, admitted, &resource, &"", &mut Tally::default()) {
            let _ = hostcalls::resume_http_request();
        }
    }

    /// A chain could not be read or changed before the write went: refused, never
    /// sent without its lend.
    fn lend_failed(&mut self, why: &str) -> Action {
        let resource = self.cond.as_ref().map(|c| c.resource.clone()).unwrap_or_default();
        self.conclude(Some(rules::unavailable(&resource, why, self.reply.form)));
        Action::Pause
    }

    /// A conditional write's outcome is known: count it, once, and answer `refused` if
    /// the fence refused it (`None`: the store's answer goes on, the write admitted).
    pub(super) fn conclude(&mut self, refused: Option<Refused>) {
        if let Some(c) = self.cond.as_mut() {
            if c.counted {
                return;
            }
            c.counted = true;
        }
        let (class, event) = refused.as_ref().map_or((Some(Class::Admitted), None), |r| (r.class, r.event));
        self.filter.metrics.conditional(class, event);
        if let Some(refused) = refused {
            self.reply.answer_itself(refused.answer);
        }
    }

    /// The store's answer to a lent write settled its chain (`None`: it could not be
    /// recorded, and the write stays lent). True when the fence answers the client
    /// itself (a 412, a 404 to a PUT); else the store's answer goes on.
    fn settled(&mut self, chain: Option<&Chain>) -> bool {
        let form = self.reply.form;
        let Some(c) = self.cond.as_mut() else { return false };
        let Some(stored) = c.stored.take() else {
            return true; // no answer waits: an early answer's lend, ended
        };
        let refused = stored.refused(&c.resource, chain.and_then(|c| c.highest), form);
        let answers = refused.is_some();
        self.conclude(refused);
        answers
    }

    /// The store answered: a lent write's answer settles its chain, a read's may teach
    /// a version, before the answer goes on (`None`: nothing to do).
    pub(super) fn on_store_answer(&mut self) -> Option<Action> {
        if self.read_of.is_none() && self.cond.is_none() {
            return None;
        }
        let via_upstream = self.get_property(vec!["response", "code_details"]).as_deref() == Some(b"via_upstream");
        let status = self.get_http_response_header_bytes(":status").unwrap_or_default();
        let status = std::str::from_utf8(&status).ok().and_then(|s| s.parse::<u16>().ok()).unwrap_or(0);
        let etag = self.get_http_response_header_bytes("etag");
        if let Some(resource) = self.read_of.take() {
            return self.learn(&resource, via_upstream, status, etag.as_deref());
        }
        let c = self.cond.as_mut()?;
        let Some(lend) = c.lent.clone() else {
            // The store answered before the write was lent (its body still held): the
            // exchange is over and the write will not apply; a lend still in flight is
            // ended at once. Envoy's own answer (a 413 for a body over the limit) says
            // nothing of the store: the body stays held. Either answer goes on.
            c.answered_early |= via_upstream;
            self.conclude(None);
            return None;
        };
        if !via_upstream {
            log::warn!(
                "fencekeeper: gave up on a conditional write to {:?} ({status}): it stays lent, and the store \
                 refuses it if it arrives late",
                c.resource
            );
            self.conclude(None);
            return None;
        }
        let stored = Stored::of(status, etag.as_deref(), c.delete, &lend);
        if let Some(why) = &stored.unlearned {
            log::error!(
                "fencekeeper: the store applied a conditional write to {:?} without telling its version ({why}): the \
                 next write is refused until a read through the fence tells it",
                c.resource
            );
        }
        let answer = stored.settle.clone();
        c.stored = Some(stored);
        if self.settle(lend.id, answer) || self.settled(None) {
            return Some(Action::Pause);
        }
        None
    }

    /// Start settling lend `id` with `answer`; false if etcd cannot be asked (the write
    /// stays lent).
    fn settle(&mut self, id: u64, answer: Answer) -> bool {
        let f = Rc::clone(&self.filter);
        let Some(c) = self.cond.as_mut() else { return false };
        let prefix = f.config.etcd.as_ref().map_or("", |e| e.key_prefix.as_str());
        let change = ChainChange::Settle { id, answer };
        let (update, message) = Update::start(prefix, &c.resource, change, c.record.take());
        c.update = Some(update);
        match conditional::send(&f, &message) {
            Ok(_) => true,
            Err(why) => {
                c.update = None;
                log::error!("fencekeeper: cannot reach etcd for the version chain of {:?}: {why}", c.resource);
                false
            }
        }
    }

    /// A read through the fence saw `resource` at a version (a 200 with a strong ETag,
    /// or a 404): learn it, if the chain lost its own, before the answer goes on.
    fn learn(&mut self, resource: &str, via_upstream: bool, status: u16, etag: Option<&[u8]>) -> Option<Action> {
        let f = Rc::clone(&self.filter);
        let version = rules::learned(status, etag)?;
        if !via_upstream {
            return None;
        }
        let prefix = f.config.etcd.as_ref().map_or("", |e| e.key_prefix.as_str());
        let (update, read) = Update::start(prefix, resource, ChainChange::Learn(version), None);
        match conditional::send(&f, &read) {
            Ok(_) => {
                self.learning = Some(update);
                Some(Action::Pause)
            }
            Err(why) => {
                log::warn!("fencekeeper: could not learn a version from a read: {why}");
                None
            }
        }
    }

    /// etcd answered a learning read's chain change.
    pub(super) fn on_learned(&mut self, response: &etcd::Response) {
        let f = Rc::clone(&self.filter);
        let Some(update) = self.learning.as_mut() else { return };
        let failed = match update.answered(response) {
            Step::Send(message) => match conditional::send(&f, &message) {
                Ok(_) => return,
                Err(why) => Some(why),
            },
            Step::Failed(why) => Some(why),
            Step::Done(_) => None,
        };
        if let Some(why) = failed {
            log::warn!("fencekeeper: could not learn a version from a read: {why}");
        }
        self.learning = None;
        let _ = hostcalls::resume_http_response();
    }

    /// The held body of a write to be lent is whole (`size` bytes): lend it with the
    /// version its body makes, before the body goes.
    pub(super) fn body_whole(&mut self, size: usize) -> Action {
        let f = Rc::clone(&self.filter);
        let Some(c) = self.cond.as_mut() else { return Action::Continue };
        let mut md5 = Md5::new();
        let mut at = 0;
        while at < size {
            let n = (size - at).min(64 << 10);
            let piece = hostcalls::get_buffer(BufferType::HttpRequestBody, at, n).ok().flatten().unwrap_or_default();
            if piece.is_empty() {
                break;
            }
            at += piece.len();
            md5.update(&piece);
        }
        let makes = chain::content_version(&md5.finalize().into());
        let change =
            ChainChange::Lend { token: c.token, makes: Some(makes), on: c.on.clone(), term: conditional::term(&f) };
        let prefix = f.config.etcd.as_ref().map_or("", |e| e.key_prefix.as_str());
        let (update, read) = Update::start(prefix, &c.resource, change, c.record.take());
        c.update = Some(update);
        match conditional::send(&f, &read) {
            Ok(_) => Action::Pause,
            Err(why) => {
                c.update = None;
                self.lend_failed(&why)
            }
        }
    }

    /// A write to be lent whose body is still held (its lend not made).
    pub(super) fn holding_body(&self) -> bool {
        self.cond.as_ref().is_some_and(|c| c.body_to_come && c.on.is_some() && c.lent.is_none())
    }
}
