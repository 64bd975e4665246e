//! A conditional write through one request (`conditional_writes`), carried out for
//! the engine's machine (`fencekeeper_engine::conditional::Write`), which decides each
//! step as it does in the gateway: the lend, the store asked for a version the chain
//! does not know, the precondition, the settle, and what the client is told, counted
//! once. Here is only how each step is done in the proxy: a chain change is a Txn to
//! etcd ([`crate::conditional::Update`]), the store is asked with a `HEAD` through
//! `conditional_store_cluster`, the head goes before its body, which Envoy holds until
//! it is whole. A read's answer may teach a version too.

use super::Request;
use crate::conditional::{self, Step, Update};
use crate::etcd;
use crate::origin::Origin;
use crate::Tally;
use fencekeeper_chain::{self as chain, Change, Version};
use fencekeeper_core::{Class, Token, Verdict};
use fencekeeper_engine::conditional::{self as rules, Body, Command, Delivery, Refused, Write};
use md5::{Digest, Md5};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use std::rc::Rc;

/// A conditional write's progress: the engine's machine, and the etcd side of it.
pub(super) struct Cond {
    pub(super) write: Write,
    /// The chain change in flight in etcd.
    pub(super) update: Option<Update>,
    /// The chain's record as this request last saw or put it, for its next change to
    /// swap from without reading first.
    record: Option<Option<Vec<u8>>>,
    /// The chain's record as the admit's Txn read it beside the mark: the first
    /// change is decided on it, with no read of its own (a peek costs no call).
    read_with_admit: Option<Option<Vec<u8>>>,
}

/// How long the store has to answer the filter's HEAD: the gate timeout, as a write
/// waits at most that long for anything before it goes.
const ASK_STORE_TIMEOUT: std::time::Duration = fencekeeper_engine::gate::GATE_TIMEOUT;

/// What a command leaves the stream to do.
enum Then {
    /// Wait: a call is in flight, or the fence answered the client.
    Wait,
    /// Resume the request (its head, or its held body, may go).
    Request,
    /// Let the store's answer go on.
    Response,
    /// Nothing is in flight and nothing waits on the fence (the write concluded
    /// already): a stream goes on as it would.
    Nothing,
}

impl Request {
    /// The write with `token` on `resource` was admitted: lend it on the resource's
    /// chain before the store can apply it. A write whose body is still to come is
    /// only peeked at now (its head needs the precondition); it is lent when its body
    /// is whole ([`Request::body_whole`]).
    pub(super) fn lend(&mut self, resource: &str, token: Token, delete: bool) -> Action {
        let f = Rc::clone(&self.filter);
        let body = if delete {
            Body::Whole(Version::Absent)
        } else if self.headers_end {
            Body::Whole(chain::content_version(&Md5::digest(b"").into()))
        } else {
            Body::ToCome
        };
        let settings = f.config.conditional.as_ref();
        let lifetime_ms = settings.map(|c| c.lend_ms);
        let can_ask = settings.is_some_and(|c| c.store_cluster.is_some());
        let mut write = Write::new(resource, token, delete, self.reply.form, lifetime_ms, can_ask);
        let first = write.start(body, crate::gate::now_ms());
        let read_with_admit = self.chain_read.take();
        self.cond = Some(Cond { write, update: None, record: None, read_with_admit });
        match self.carry_out(first) {
            Then::Request => Action::Continue,
            Then::Wait | Then::Response | Then::Nothing => Action::Pause,
        }
    }

    /// The chain change in flight was answered by etcd.
    pub(super) fn on_chain(&mut self, response: &etcd::Response) {
        let f = Rc::clone(&self.filter);
        let Some(c) = self.cond.as_mut() else { return };
        let Some(update) = c.update.as_mut() else { return };
        let next = match update.answered(response) {
            Step::Send(message) => match conditional::send(&f, &message) {
                Ok(_) => return,
                Err(why) => {
                    c.update = None;
                    c.write.chain_failed(&why)
                }
            },
            Step::Done(done) => {
                c.record = update.last();
                c.update = None;
                c.write.chain_done(done, crate::gate::now_ms())
            }
            Step::Failed(why) => {
                c.update = None;
                c.write.chain_failed(&why)
            }
        };
        self.resume(next);
    }

    /// The store answered the filter's HEAD (or the call failed: no status).
    pub(super) fn on_store_version(&mut self) {
        let status = self.get_http_call_response_header(":status");
        let status = status.and_then(|s| s.parse::<u16>().ok()).unwrap_or(0);
        let etag = self.get_http_call_response_header_bytes("etag");
        let Some(c) = self.cond.as_mut() else { return };
        let next = c.write.store_told(status, etag.as_deref());
        if let Command::Chain(Change::Learn(version)) = &next {
            log::info!(
                "fencekeeper: {:?}: learned the store's version {version} from its answer to a HEAD",
                c.write.resource()
            );
        }
        self.resume(next);
    }

    /// Carry out `command` from a callback, resuming what it lets go.
    fn resume(&mut self, command: Command) {
        match self.carry_out(command) {
            Then::Request => {
                let _ = hostcalls::resume_http_request();
            }
            Then::Response => {
                let _ = hostcalls::resume_http_response();
            }
            Then::Wait | Then::Nothing => {}
        }
    }

    /// Do what the machine says, until it waits for an answer.
    fn carry_out(&mut self, mut command: Command) -> Then {
        let f = Rc::clone(&self.filter);
        loop {
            self.log_notes();
            let Some(c) = self.cond.as_mut() else { return Then::Wait };
            command = match command {
                Command::Chain(change) => {
                    let prefix = f.config.etcd.as_ref().map_or("", |e| e.key_prefix.as_str());
                    let (update, step) = match c.read_with_admit.take() {
                        Some(raw) => Update::decided_on(prefix, c.write.resource(), change, raw),
                        None => {
                            let (update, message) = Update::start(prefix, c.write.resource(), change, c.record.take());
                            (update, Step::Send(message))
                        }
                    };
                    match step {
                        Step::Send(message) => {
                            c.update = Some(update);
                            match conditional::send(&f, &message) {
                                Ok(_) => return Then::Wait,
                                Err(why) => {
                                    c.update = None;
                                    c.write.chain_failed(&why)
                                }
                            }
                        }
                        Step::Done(done) => {
                            c.record = update.last();
                            c.write.chain_done(done, crate::gate::now_ms())
                        }
                        Step::Failed(why) => c.write.chain_failed(&why),
                    }
                }
                Command::AskStore => {
                    let cluster = f.config.conditional.as_ref().and_then(|c| c.store_cluster.clone());
                    match self.ask_store(cluster.as_deref().unwrap_or_default()) {
                        Ok(_) => return Then::Wait,
                        Err(why) => {
                            log::warn!("fencekeeper: could not ask the store for a version: {why}");
                            let Some(c) = self.cond.as_mut() else { return Then::Wait };
                            c.write.store_told(0, None)
                        }
                    }
                }
                Command::Send(name, value) => {
                    if let Err(status) = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, Some(&value)) {
                        // Never sent without its precondition.
                        let why = format!("the proxy did not set the precondition {name} ({status:?})");
                        let refused = rules::unavailable(c.write.resource(), &why, self.reply.form);
                        command = c.write.conclude(Some(refused));
                        continue;
                    }
                    let (resource, token) = (c.write.resource().to_owned(), c.write.token());
                    // Admitted: the token goes as `fencing-admitted-token`; the write is
                    // counted once its outcome is known.
                    let admitted = Ok(Verdict::Admit { mark: token, advanced: false });
                    return match self.reply.answer(&f, admitted, &resource, &"", &mut Tally::default()) {
                        Action::Continue => Then::Request,
                        _ => Then::Wait,
                    };
                }
                Command::ReleaseBody => return Then::Request,
                Command::Conclude(refused) => {
                    let answers = refused.is_some();
                    self.count_and_answer(refused);
                    return if answers { Then::Wait } else { Then::Response };
                }
                Command::Idle => return Then::Nothing,
            };
        }
    }

    /// Log what the machine noted for the write.
    fn log_notes(&mut self) {
        let Some(c) = self.cond.as_mut() else { return };
        for note in c.write.notes() {
            if note.error {
                log::error!("fencekeeper: {:?}: {}", c.write.resource(), note.line);
            } else {
                log::warn!("fencekeeper: {:?}: {}", c.write.resource(), note.line);
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

    /// A conditional write's outcome is known to the filter itself (refused for what
    /// only it sees, or its stream ended): count it, once, and answer `refused`.
    pub(super) fn conclude(&mut self, refused: Option<Refused>) {
        let command = match self.cond.as_mut() {
            Some(c) => c.write.conclude(refused),
            None => Command::Conclude(refused), // refused before it was admitted
        };
        if let Command::Conclude(refused) = command {
            self.count_and_answer(refused);
        }
    }

    /// Count a conditional write's outcome, and answer `refused` if the fence refused
    /// it (`None`: the store's answer goes on, the write admitted).
    fn count_and_answer(&mut self, refused: Option<Refused>) {
        let (class, event) = refused.as_ref().map_or((Some(Class::Admitted), None), |r| (r.class, r.event));
        self.filter.metrics.conditional(class, event);
        if let Some(refused) = refused {
            self.reply.answer_itself(refused.answer);
        }
    }

    /// The store answered: a lent write's answer settles its chain, a read's may teach
    /// a version, before the answer goes on (`None`: nothing to do).
    pub(super) fn on_store_answer(&mut self) -> Option<Action> {
        if self.read_of.is_none() && self.cond.is_none() {
            return None;
        }
        // The store's answer, as the host can tell (without `response.code_details`, by
        // its status: a 5xx, 408 or 499 is taken as given up, which keeps a write lent).
        let origin = self.answer_origin();
        let via_upstream = origin == Origin::Store;
        let status = self.get_http_response_header_bytes(":status").unwrap_or_default();
        let status = std::str::from_utf8(&status).ok().and_then(|s| s.parse::<u16>().ok()).unwrap_or(0);
        let etag = self.get_http_response_header_bytes("etag");
        if let Some(resource) = self.read_of.take() {
            return self.learn(&resource, via_upstream, status, etag.as_deref());
        }
        let c = self.cond.as_mut()?;
        // Envoy's own answer (a route timeout, a reset, a 413 over its buffer) says
        // nothing of whether the store will still apply the write.
        let delivery = match origin {
            Origin::Store => Delivery::Answered(status, etag.as_deref()),
            Origin::NeverSent => Delivery::NotSent,
            Origin::Proxy => Delivery::GivenUp,
        };
        let next = c.write.delivered(delivery);
        // A local reply to a write the fence refused comes here too: it goes on.
        match self.carry_out(next) {
            Then::Wait => Some(Action::Pause),
            Then::Request | Then::Response | Then::Nothing => None,
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
        let (update, read) = Update::start(prefix, resource, Change::Learn(version), None);
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
        let next = c.write.body_whole(makes, crate::gate::now_ms());
        match self.carry_out(next) {
            Then::Request => Action::Continue,
            Then::Wait | Then::Response | Then::Nothing => Action::Pause,
        }
    }

    /// A write whose head went and whose body is held, not lent yet.
    pub(super) fn holding_body(&self) -> bool {
        self.cond.as_ref().is_some_and(|c| c.write.holding_body())
    }

    /// Whether the held body must stay held now: its lend is being made, or the store
    /// answered before it (no body goes without its lend).
    pub(super) fn body_stays_held(&self) -> bool {
        self.cond.as_ref().is_some_and(|c| c.update.is_some() || c.write.answered_early())
    }
}
