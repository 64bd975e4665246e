//! One request through the filter.
//!
//! Shared data only (efficiency mode without etcd): read the slot, decide, CAS;
//! on a lost CAS read and decide again. With etcd: the shared-data copy may refuse
//! on its own (marks only rise, so a token below it is surely stale), but only an
//! etcd transaction admits: compare the mark we expect, advance or confirm, and on
//! a failed compare decide again against the mark etcd returned.
//!
//! With a provenance check, a token that would advance the mark is first vouched
//! for ([`vouch`](crate::vouch)): by a revision already seen, or by one read that
//! also returns the exact mark. So an etcd round is one of two calls: the vouching
//! read, or the mark transaction ([`Stage`]).
//!
//! Every mark the filter raises is logged at info as an audit record
//! (`fencekeeper-audit: {json}`), with the client's address.

mod conditional_write;

use crate::conditional::Update;
use crate::config::Host;
use crate::confirms::Waiter;
use crate::etcd::{self, EtcdError, Method, Outcome, Response};
use crate::headers::Seen;
use crate::origin::{self, Origin};
use crate::reply::{self, Reply};
use crate::uploads;
use crate::vouch::{self, Next};
use crate::wake;
use crate::Filter;
use conditional_write::Cond;
use fencekeeper_core::audit::{Change, Entry, LOG_PREFIX};
use fencekeeper_core::http::ADMITTED_HEADER;
use fencekeeper_core::refusal::{Forgotten, NoVerdict};
use fencekeeper_core::{decide, decision::decide_token, Malformed, Protocol, ResourceError, Token, Verdict};
use fencekeeper_engine::conditional as rules;
use fencekeeper_engine::early::{self, Early};
use fencekeeper_engine::gate::{self as engine_gate, Knob};
use fencekeeper_engine::head::{Head, Scope};
use fencekeeper_engine::uploads::{self as upload_rules, Follow, Step, MAX_ANSWER};
use fencekeeper_engine::Form;
use fencekeeper_etcd_wire::grpc::{self, Status};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

/// Why a fenced write is refused where the marks are in etcd, the filter is told to
/// reach it over gRPC, and the host makes no gRPC calls.
const NO_GRPC: &str = "the marks are in etcd, which the filter is told to reach over gRPC (\"etcd\": {\"api\": \
                       \"grpc\"}), and this proxy-wasm host makes no gRPC calls (proxy_grpc_call; \"host\": \
                       \"portable\"): on it, leave etcd.api unset or \"json\" (docs/proxy-wasm-hosts.md)";

/// Why a fenced write is refused where the shared gate is on and the host is portable.
const NO_SHARED_GATE: &str = "the ordering gate across instances (gate.shared, on by default with etcd) passes a \
                              write from the worker's root, which then resumes it (proxy_set_effective_context), \
                              and this proxy-wasm host does not (\"host\": \"portable\"): where every write to \
                              the store passes through this one proxy, set \"gate\": {\"shared\": false} \
                              (docs/proxy-wasm-hosts.md)";

/// How many etcd transactions one request may take before it is undecided.
const MAX_ETCD_ROUNDS: u32 = 8;

/// The HTTP context of one request.
pub struct Request {
    filter: Rc<Filter>,
    /// The request's context.
    context: u32,
    pending: Option<Pending>,
    /// How it is answered.
    reply: Reply,
    /// The resource whose batch of confirms (`confirms`) it joined, answered by the root.
    batched: Option<String>,
    /// An admitted S3 write's multipart step the filter follows until the store
    /// answers, and the token it was decided with.
    upload: Option<(Step, String)>,
    /// The store's answer to a CreateMultipartUpload of the object at this path,
    /// decided with this token, is being buffered for its upload id.
    reading_upload_id: Option<(Vec<u8>, String)>,
    /// The request's headers ended it (no body follows).
    headers_end: bool,
    /// Conditional writes: a write that will be lent once admitted (`delete`).
    to_lend: Option<bool>,
    /// Conditional writes: the version chain's record (`None` inside: no record), as
    /// the mark's Txn read it in the same round trip, for the write's first change.
    chain_read: Option<Option<Vec<u8>>>,
    /// Conditional writes: the admitted write's progress on its version chain.
    cond: Option<Cond>,
    /// Conditional writes: a read whose answer may teach its resource's version.
    read_of: Option<String>,
    /// Conditional writes: the chain change a read's answer makes (learning a version).
    learning: Option<Update>,
}

/// A request waiting for etcd.
struct Pending {
    resource: String,
    token: Token,
    /// The token as the client sent it (for the audit record).
    text: String,
    expected: Option<Token>,
    rounds: u32,
    /// etcd vouched for the token (or no check is configured).
    vouched: bool,
    /// The generation of the etcd token the call in flight carries.
    generation: u64,
    /// A call was refused for its token and retried with a new one: the one retry.
    token_retried: bool,
    /// The call in flight.
    stage: Stage,
    /// The retention floor as this request's last first-mark Txn read it back: the
    /// resource has no mark and is held to it (`None`: no floor seen).
    floor: Option<Token>,
}

/// Which etcd call a request waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The vouching read: the exact mark, the revision, the lock's holder.
    Vouch,
    /// The mark transaction: compare, then advance or confirm.
    Mark,
    /// etcd's authentication, before the call that needs the token.
    Authenticate,
}

/// What an etcd answer leads to: a verdict (or why none) and its cause, or `None`
/// to call etcd again.
type Answered = Option<(Result<Verdict, NoVerdict>, String)>;

impl Request {
    /// A request of `filter`.
    pub fn new(filter: Rc<Filter>, context: u32) -> Request {
        let reply = Reply { context, ..Reply::default() };
        Request {
            filter,
            context,
            pending: None,
            reply,
            batched: None,
            upload: None,
            reading_upload_id: None,
            headers_end: false,
            to_lend: None,
            chain_read: None,
            cond: None,
            read_of: None,
            learning: None,
        }
    }

    /// Decide with the shared-data copy, then finish or go to etcd.
    fn start(&mut self, seen: Seen) -> Action {
        let f = Rc::clone(&self.filter);
        self.reply.form = Form::of(seen.content_type.as_deref(), f.config.protocol);
        let s3 = f.config.protocol == Protocol::S3;
        // What the head alone refuses, in the engine's order (`early`): malformed (a
        // key or token over its bound, a token sent twice with two values), not
        // conditional, too large, the start grace. A later step of an S3 multipart
        // upload that sends no token inherits the one its upload was admitted with
        // (the aws CLI can send none).
        let method = String::from_utf8_lossy(&seen.method);
        let (head, scope) = (head(&seen, &method), scope(&f));
        let path = scope.store_path(&head);
        let inherited =
            |path: &[u8]| upload_rules::of_step(&seen.path, path).and_then(|(p, id)| uploads::token(&p, &id));
        let limits = early::Limits {
            conditional: f.config.conditional.as_ref().map(|c| early::Deletes(c.deletes)),
            max_body: f.config.conditional.as_ref().map(|c| c.max_body),
            grace_left: grace_left(&f),
        };
        let header = |name: &str| seen.conditional(name);
        let checked = early::check(&scope, &head, &path, inherited, header, limits)
            // One resource: the scope refuses a write of two.
            .and_then(|p| match p.keys.into_iter().next() {
                Some(resource) => Ok((resource, p.token)),
                None => Err(Early::Malformed(Malformed::Resource(ResourceError::Empty))),
            });
        let (resource, presented) = match (checked, path) {
            (Ok(checked), Ok(path)) => {
                self.upload = checked
                    .1
                    .as_deref()
                    .filter(|_| s3)
                    .map(|t| (Step::of(&method, &seen.path, &path), t.to_owned()))
                    .filter(|(step, _)| *step != Step::Other);
                checked
            }
            (Err(refused), path) => return self.refused_early(refused, path.as_deref().ok()),
            // `presented` refuses what has no path.
            (Ok(_), Err(e)) => return self.finish(Ok(Verdict::Malformed(Malformed::Resource(e))), "", &""),
        };
        if f.config.etcd.is_some() && !f.config.reaches_etcd() {
            // The marks are in etcd, reached over gRPC, which this host does not call:
            // every fenced write is refused (both modes: passing it would not fence).
            return self.finish(Err(NoVerdict::Refused), &resource, &NO_GRPC);
        }
        if f.config.host == Host::Portable && f.config.gate.is_some_and(|g| g.shared) {
            // Without the shared gate the order across instances is lost; with it, on
            // this host, nothing could resume a write it passes.
            return self.finish(Err(NoVerdict::Refused), &resource, &NO_SHARED_GATE);
        }
        if f.config.conditional.is_some() {
            let length =
                seen.conditional("content-length").and_then(|l| std::str::from_utf8(l).ok()?.parse::<u64>().ok());
            let empty = length == Some(0);
            self.to_lend = Some(method == "DELETE");
            self.headers_end |= empty;
        }
        if f.config.etcd.is_none() {
            return self.shared_only(&resource, presented.as_deref());
        }
        let cached = match resource_mark(&f, &resource) {
            Ok(m) => m,
            Err(cause) => return self.finish(Err(NoVerdict::StoreUnreachable), &resource, &cause),
        };
        let shared = f.gate.as_ref().is_some_and(|g| g.shared.is_some());
        match decide(&f.config.policy, presented.as_deref(), cached.as_ref()) {
            // The holder writing again, with the gate shared through etcd: the shared
            // registry's Txn compares the mark with the token too, so it is the confirm,
            // sent after the request arrived; no batch's Txn first.
            v @ Verdict::Admit { advanced: false, .. } if shared => self.finish(Ok(v), &resource, &""),
            // The holder writing again: its check joins the worker's next batch.
            Verdict::Admit { mark: token, advanced: false } if f.wake.is_some() => self.join(resource, token),
            Verdict::Admit { mark: token, .. } => {
                let text = presented.unwrap_or_default();
                let (expected, stage) = (cached, Stage::Mark);
                self.pending = Some(Pending {
                    resource,
                    token,
                    text,
                    expected,
                    rounds: 0,
                    vouched: false,
                    generation: 0,
                    token_retried: false,
                    stage,
                    floor: None,
                });
                self.call_etcd()
            }
            refusal => self.finish(Ok(refusal), &resource, &""),
        }
    }

    /// Refuse a conditional write whose body is `length` bytes or more, over `max` (413):
    /// the filter holds a body whole, and none of this one reaches the store.
    fn too_large(&mut self, length: u64, max: u64) -> Action {
        let setting = "conditional_max_body; envoy-config --conditional-max-body";
        self.conclude(Some(rules::too_large(length, max, setting, self.reply.form)));
        Action::Pause
    }

    /// Answer a write refused on its head, and count it as the engine says. `path`:
    /// the path it writes, for the resource a refusal names.
    fn refused_early(&mut self, refused: Early, path: Option<&[u8]>) -> Action {
        let f = Rc::clone(&self.filter);
        let resource = path.map(String::from_utf8_lossy).unwrap_or_default();
        match refused {
            Early::Malformed(m) => return self.finish(Ok(Verdict::Malformed(m)), "", &""),
            Early::NotConditional(why) => self.conclude(Some(rules::not_conditional(&resource, why, self.reply.form))),
            Early::TooLarge { length, max } => return self.too_large(length, max),
            Early::StartGrace(left) => {
                let grace = Knob { name: "start_grace_ms", value: Duration::from_millis(f.config.start_grace_ms) };
                let refused = engine_gate::in_start_grace(f.config.policy.mode, &resource, grace, left);
                crate::gate::refuse(&f, &self.reply, &refused);
            }
        }
        Action::Pause
    }

    /// Wait for the next batch's Txn on `resource`, waking the root when the
    /// resource was idle (`confirms`).
    fn join(&mut self, resource: String, token: Token) -> Action {
        let f = Rc::clone(&self.filter);
        let waiter = Waiter { token, reply: self.reply };
        if f.confirms.join(&resource, waiter) {
            if let Some(Err(s)) = f.wake.map(wake::wake) {
                // Nobody will send the batch: this request, alone in it, is undecided.
                f.confirms.leave(&resource, self.context);
                let cause = format!("cannot wake the filter's root context ({s:?})");
                return self.finish(Err(NoVerdict::Refused), &resource, &cause);
            }
        }
        self.batched = Some(resource);
        Action::Pause
    }

    /// Efficiency mode without etcd: the shared data is the mark store.
    fn shared_only(&mut self, resource: &str, presented: Option<&str>) -> Action {
        let f = Rc::clone(&self.filter);
        for _ in 0..crate::slots::MAX_CAS_ATTEMPTS {
            let read = match f.slots.read(resource) {
                Ok(r) => r,
                Err(e) => return self.finish(Err(NoVerdict::StoreUnreachable), resource, &e),
            };
            let verdict = decide(&f.config.policy, presented, read.mark(resource).as_ref());
            let Verdict::Admit { mark, advanced: true } = verdict else {
                return self.finish(Ok(verdict), resource, &"");
            };
            let old = read.mark(resource);
            match f.slots.write(read, resource, mark) {
                Ok(true) => {
                    self.audit(resource, old, mark, presented.unwrap_or_default().to_owned());
                    return self.finish(Ok(verdict), resource, &"");
                }
                Ok(false) => continue,
                Err(e) => return self.finish(Err(NoVerdict::StoreUnreachable), resource, &e),
            }
        }
        self.finish(Err(NoVerdict::Refused), resource, &"shared-data compare-and-swap kept losing")
    }

    /// The next etcd call of the pending request: the vouching read while its token
    /// would advance the mark and is not vouched for yet, else the mark transaction.
    fn call_etcd(&mut self) -> Action {
        let f = Rc::clone(&self.filter);
        let (Some(p), Some(e)) = (self.pending.as_mut(), &f.config.etcd) else {
            return Action::Continue;
        };
        let advancing = p.expected.as_ref() != Some(&p.token);
        if advancing && !p.vouched {
            p.vouched = vouch::vouched_without_read(&f.config.provenance, &p.token, f.revision.get());
        }
        let key = format!("{}{}", e.key_prefix, p.resource);
        let body = if advancing && !p.vouched {
            p.stage = Stage::Vouch;
            etcd::vouch(&key, vouch::lock(&f.config.provenance, &p.resource).as_deref())
        } else {
            p.stage = Stage::Mark;
            let txn = match p.expected {
                Some(expected) => etcd::txn(&key, &p.resource, Some(&expected), &p.token),
                None => etcd::create(&e.key_prefix, &key, &p.resource, p.floor.as_ref(), &p.token),
            };
            // A write to be lent reads its version chain in the same Txn: its first
            // change (the peek for its head's precondition, or its lend) needs no
            // read of its own.
            match self.to_lend {
                Some(_) => {
                    let chain = fencekeeper_etcd_wire::chain_key(&e.key_prefix, &p.resource);
                    grpc::also_reading(txn, chain.as_bytes())
                }
                None => txn,
            }
        };
        let resource = p.resource.clone();
        // With a user: the VM's token, or first an authentication (then this call).
        let token = f.auth.as_ref().map(|a| (a, a.token()));
        let sent = match &token {
            None => etcd::call(e, Method::Txn, None, &body),
            Some((_, Some((token, generation)))) => {
                p.generation = *generation;
                etcd::call(e, Method::Txn, Some(token), &body)
            }
            Some((auth, None)) => {
                p.stage = Stage::Authenticate;
                let body = auth.body();
                let sent = etcd::call(e, Method::Authenticate, None, &body);
                // It carries the password: not left in memory the VM hands out again.
                crate::env::wipe(body);
                sent
            }
        };
        match sent {
            Ok(_) => Action::Pause,
            Err(cause) => self.finish(Err(NoVerdict::StoreUnreachable), &resource, &cause),
        }
    }

    /// The answer to an authentication: with a token, make the call that needed it.
    fn on_authenticated(&mut self, response: &Response, resource: &str) -> Action {
        let f = Rc::clone(&self.filter);
        let Some(auth) = &f.auth else { return self.unexpected(resource) };
        match auth.accept(response) {
            Ok(()) => self.call_etcd(),
            Err(failed) => self.finish(Err(NoVerdict::StoreUnreachable), resource, &failed),
        }
    }

    /// etcd refused the token a call carried (expired, or etcd restarted): drop it,
    /// and make the call again once, with a newer token or after authenticating.
    fn on_token_refused(&mut self, refusal: &Status, resource: &str) -> Action {
        let f = Rc::clone(&self.filter);
        let (Some(auth), Some(p)) = (&f.auth, self.pending.as_mut()) else { return self.unexpected(resource) };
        auth.refused(p.generation);
        if p.token_retried {
            let cause =
                format!("etcd refused the token of user {:?} again after a new one: {}", auth.user, refusal.error());
            return self.finish(Err(NoVerdict::StoreUnreachable), resource, &cause);
        }
        p.token_retried = true;
        self.call_etcd()
    }

    /// An authentication answer without a user configured, or one for no request:
    /// it cannot happen, and if it did the request is refused, never forwarded.
    fn unexpected(&mut self, resource: &str) -> Action {
        self.finish(Err(NoVerdict::Refused), resource, &"an etcd authentication answer the filter did not expect")
    }

    /// The answer to the vouching read.
    fn on_vouch(&mut self, found: Result<etcd::Found, EtcdError>) -> Answered {
        let f = Rc::clone(&self.filter);
        let p = self.pending.as_mut()?;
        let found = match found {
            // Asked for by what the request carried: refused in both modes (503).
            Err(e) => return Some((Err(NoVerdict::Refused), format!("the lock service cannot check the token: {e}"))),
            Ok(found) => found,
        };
        f.saw(found.revision);
        if let Some(m) = found.mark {
            let _ = f.slots.raise(&p.resource, m);
        }
        match vouch::judge(&f.config.provenance, &f.config.policy, &p.resource, p.token, &found) {
            Next::Decided(verdict) => Some((Ok(verdict), String::new())),
            Next::Unverified(why) => Some((Err(NoVerdict::Unverified), why)),
            Next::Advance(expected) => {
                (p.vouched, p.expected) = (true, expected);
                None
            }
        }
    }

    /// The verdict for the mark transaction's answer, or `None` to ask again. `floor`:
    /// the retention floor a first-mark Txn read back.
    fn on_etcd(&mut self, outcome: Result<(Outcome, u64), EtcdError>, floor: Option<Token>) -> Answered {
        let f = Rc::clone(&self.filter);
        let p = self.pending.as_mut()?;
        let current = match outcome {
            Err(e) => return Some((Err(NoVerdict::StoreUnreachable), e.0)),
            Ok((outcome, revision)) => {
                f.saw(revision);
                outcome
            }
        };
        let current = match current {
            Outcome::Succeeded => {
                let advanced = p.expected.as_ref() != Some(&p.token);
                let _ = f.slots.raise(&p.resource, p.token);
                return Some((Ok(Verdict::Admit { mark: p.token, advanced }), String::new()));
            }
            Outcome::Current(current) => current,
        };
        match current {
            Some(m) => {
                let _ = f.slots.raise(&p.resource, m);
            }
            // Gone from etcd (retention forgot it, or an operator cleared it): the
            // copy goes too, or every request would start from it.
            None => {
                let _ = f.slots.forget(&p.resource);
            }
        }
        // A resource without a mark is held to the retention floor the Txn read.
        p.floor = if current.is_none() { floor } else { None };
        let judged = current.or(p.floor);
        match decide_token(&f.config.policy, p.token, judged.as_ref()) {
            // The range read the mark (or the floor, with the mark's absence, in one
            // Txn) equal to the token: the holder writing again.
            v @ Verdict::Admit { advanced: false, .. } => Some((Ok(v), String::new())),
            Verdict::Admit { .. } if p.rounds + 1 >= MAX_ETCD_ROUNDS => {
                Some((Err(NoVerdict::Refused), "etcd compare-and-swap kept losing".to_owned()))
            }
            Verdict::Admit { .. } => {
                p.rounds += 1;
                p.expected = current;
                None
            }
            refusal @ Verdict::Stale { .. } if current.is_none() => {
                let cause = p.floor.map(|floor| Forgotten { floor }.to_string()).unwrap_or_default();
                Some((Ok(refusal), cause))
            }
            refusal => Some((Ok(refusal), String::new())),
        }
    }

    /// Log the mark this request raised, as an audit record at info level.
    fn audit(&self, resource: &str, old: Option<Token>, new: Token, token: String) {
        let unix_ms = self.get_current_time().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let client = reply::client();
        let entry = Entry {
            unix_ms,
            host: "envoy",
            reason: Change::Advance,
            resource,
            old,
            old_damaged: None,
            new: Some(new),
            token: Some(&token),
            client: client.as_deref(),
            user: None,
            store: &self.filter.store,
        };
        log::info!("{LOG_PREFIX}{entry}");
    }

    /// Forward or refuse, as the core resolves the verdict (or why there is none).
    fn finish(&mut self, outcome: Result<Verdict, NoVerdict>, resource: &str, cause: &dyn std::fmt::Display) -> Action {
        if let (Some(delete), Ok(Verdict::Admit { mark, .. })) = (self.to_lend.take(), &outcome) {
            return self.lend(resource, *mark, delete);
        }
        if !matches!(outcome, Ok(Verdict::Admit { .. })) {
            self.upload = None; // not admitted: its answer teaches nothing
        }
        self.reply.finish(&self.filter, outcome, resource, cause)
    }
}

impl Request {
    /// Where the response whose headers arrive now came from (`origin`). On Envoy its
    /// `response.code_details` says whether the store answered, and for a local reply
    /// its response flags whether anything was sent; a portable host is not asked for
    /// properties it may not have, and is judged by the status.
    pub(super) fn answer_origin(&self) -> Origin {
        let envoy = self.filter.config.host == Host::Envoy;
        let property = |path: Vec<&str>| hostcalls::get_property(path).ok().flatten();
        let details = if envoy { property(vec!["response", "code_details"]) } else { None };
        let status = || {
            let value = hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, ":status").ok().flatten()?;
            origin::status(&value)
        };
        let status = if details.is_none() { status() } else { None };
        match origin::of(details.as_deref(), status) {
            // Read only for Envoy's own answers: never on a write the store answered.
            Origin::Proxy if envoy => {
                let (flags, attempts) =
                    (property(vec!["response", "flags"]), property(vec!["upstream", "request_attempt_count"]));
                if origin::never_sent(flags.as_deref(), attempts.as_deref()) {
                    Origin::NeverSent
                } else {
                    Origin::Proxy
                }
            }
            origin => origin,
        }
    }
}

/// How much of the start grace is left, if any.
fn grace_left(f: &Filter) -> Option<Duration> {
    if f.grace_until == 0 {
        return None; // off: no clock read on the write path
    }
    let grace = f.config.start_grace_ms;
    let elapsed = crate::gate::now_ms().saturating_sub(f.grace_until.saturating_sub(grace));
    engine_gate::grace_left(Duration::from_millis(grace), Duration::from_millis(elapsed))
}

fn resource_mark(f: &Filter, resource: &str) -> Result<Option<Token>, String> {
    // An over-long or empty key is refused by the core; it has no slot to read.
    if fencekeeper_core::resource::check(resource).is_err() {
        return Ok(None);
    }
    f.slots.read(resource).map(|r| r.mark(resource)).map_err(|e| e.to_string())
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(resource) = &self.batched {
            // Answered already, or its stream ended first: no batch answers it now.
            self.filter.confirms.leave(resource, self.context);
        }
        // `on_log` ends the flight; this is for a host that deletes a context without it.
        if let Some(g) = &self.filter.gate {
            g.end(&self.filter, self.context);
        }
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, token: u32, _headers: usize, body_size: usize, _trailers: usize) {
        if etcd::is_json_call(token) {
            return self.on_etcd_answer(etcd::http_response(token, body_size));
        }
        // The request's other HTTP call: a conditional write's HEAD of the store.
        self.on_store_version();
    }

    fn on_grpc_call_response(&mut self, _token: u32, status_code: u32, size: usize) {
        self.on_etcd_answer(etcd::response(status_code, size));
    }
}

impl Request {
    /// etcd answered the request's call (over either API).
    fn on_etcd_answer(&mut self, response: Response) {
        if self.learning.is_some() {
            return self.on_learned(&response);
        }
        if self.cond.as_ref().is_some_and(|c| c.update.is_some()) {
            return self.on_chain(&response);
        }
        let Some(p) = self.pending.as_ref() else { return };
        let (resource, stage, creating) = (p.resource.clone(), p.stage, p.expected.is_none());
        // With a user: an authentication's answer, or a call refused for its token.
        let mut handled = None;
        if self.filter.auth.is_some() {
            if stage == Stage::Authenticate {
                handled = Some(self.on_authenticated(&response, &resource));
            } else if let Some(refusal) = response.as_ref().err().filter(|s| grpc::token_refused(s)) {
                handled = Some(self.on_token_refused(refusal, &resource));
            }
        }
        if let Some(next) = handled {
            if let Action::Continue = next {
                self.resume_http_request();
            }
            return;
        }
        if let (Stage::Mark, Some(_), Some(e)) = (stage, &self.to_lend, &self.filter.config.etcd) {
            // What the chain's read answered (an answer without it, or with another
            // key's record: read it anew).
            let chain = fencekeeper_etcd_wire::chain_key(&e.key_prefix, &resource);
            self.chain_read = etcd::txn_answer(&response).ok().and_then(|a| a.last_read(chain.as_bytes()).ok());
        }
        let answered = match stage {
            Stage::Vouch => self.on_vouch(etcd::parse_vouch(&response, &resource)),
            Stage::Mark | Stage::Authenticate => match (creating, &self.filter.config.etcd) {
                (true, Some(e)) => {
                    let created = etcd::created(&response, &e.key_prefix, &resource);
                    let floor = created.as_ref().ok().and_then(|(_, floor, _)| *floor);
                    self.on_etcd(created.map(|(outcome, _, revision)| (outcome, revision)), floor)
                }
                _ => self.on_etcd(etcd::answer(&response, &resource), None),
            },
        };
        let next = match answered {
            None => self.call_etcd(),
            Some((verdict, cause)) => {
                if let (Ok(Verdict::Admit { mark, advanced: true }), Some(p)) = (&verdict, &self.pending) {
                    // Only a committed put answers an advancing admit; `expected` is
                    // what it compared.
                    let (old, text) = (p.expected, p.text.clone());
                    self.audit(&resource, old, *mark, text);
                }
                self.finish(verdict, &resource, &cause)
            }
        };
        if let Action::Continue = next {
            self.resume_http_request();
        }
    }
}

/// What the filter guards, for the engine's rules. The proxy's routes scope it to its
/// paths (no prefix of its own). It decides one resource per request, so a write of
/// two (WebDAV's MOVE) is refused: fencing one end only would let a stale holder's
/// MOVE overwrite the other.
fn scope(f: &Filter) -> Scope<'_, String, String> {
    Scope {
        protocol: f.config.protocol,
        fenced_methods: f.config.fenced_methods.as_deref(),
        path_prefix: "",
        s3_domain: f.config.s3_domain.as_deref(),
        resource: &f.config.resource,
        two_resources: false,
    }
}

/// The parts of a request's head the engine's rules read, from the headers seen.
fn head<'a>(seen: &'a Seen, method: &'a str) -> Head<'a> {
    Head {
        method,
        target: &seen.path,
        host: seen.authority.as_deref(),
        token: seen.token.as_deref(),
        metadata_token: seen.metadata_token.as_deref(),
        resource: seen.resource.as_deref(),
        destination: seen.destination.as_deref(),
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.headers_end = end_of_stream;
        // One host call for every header the filter reads (the byte variant: the
        // String one panics on non-UTF-8 values).
        let seen = Seen::from(self.get_http_request_headers_bytes(), &self.filter);
        #[cfg(feature = "faults")]
        if seen.fault {
            // Testing only (docs/envoy.md): trap on any request that reaches the
            // filter, so the failure policy, and which requests skip the filter, can
            // be exercised.
            #[allow(clippy::panic)]
            {
                panic!("fencekeeper: test fault requested by header");
            }
        }
        self.reply.admitted_sent = seen.admitted;
        if !self.filter.config.fences(&String::from_utf8_lossy(&seen.method)) {
            // Only the filter may tell the upstream what it admitted.
            if seen.admitted {
                self.set_http_request_header(ADMITTED_HEADER, None);
            }
            if self.filter.config.conditional.is_some() && self.filter.config.reaches_etcd() {
                // Its answer may tell a version the filter lost (docs/envoy.md).
                let method = String::from_utf8_lossy(&seen.method);
                let (head, scope) = (head(&seen, &method), scope(&self.filter));
                self.read_of = scope.read_of(&head, &scope.store_path(&head));
            }
            return Action::Continue;
        }
        self.start(seen)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.holding_body() {
            return Action::Continue;
        }
        // A body sent without a length (chunked) is measured as it comes.
        let max = self.filter.config.conditional.as_ref().map_or(u64::MAX, |c| c.max_body);
        if body_size as u64 > max {
            return self.too_large(body_size as u64, max);
        }
        // Envoy buffers the body until it is whole. After the store answered early it is
        // never released: no body goes without its lend.
        if !end_of_stream || self.body_stays_held() {
            return Action::Pause;
        }
        self.body_whole(body_size)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if !self.holding_body() {
            return Action::Continue;
        }
        // Trailers would release the held body: the write is refused instead.
        let resource = self.cond.as_ref().map(|c| c.write.resource().to_owned()).unwrap_or_default();
        let why = "its body ends in trailers, which would release the body held for its lend: send it without them";
        self.conclude(Some(rules::not_conditional(&resource, why, self.reply.form)));
        Action::Pause
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(action) = self.on_store_answer() {
            return action;
        }
        // The write's flight ends at once only if the store answered it: a local reply
        // (the route's timeout, an upstream reset) says nothing of whether the store
        // will still apply it.
        let gate = self.filter.gate.as_ref().filter(|g| g.flying(self.context));
        if gate.is_none() && self.upload.is_none() {
            return Action::Continue;
        }
        let origin = self.answer_origin();
        // Answered by the store, or never sent: either way nothing of it lands later.
        if let Some(g) = gate.filter(|_| origin != Origin::Proxy) {
            g.answered(self.context);
        }
        let via_upstream = origin == Origin::Store;
        // The status is read only for a multipart step (a host call saved on every
        // other write).
        let Some((step, token)) = self.upload.take().filter(|_| via_upstream) else { return Action::Continue };
        let status = self.get_http_response_header_bytes(":status").unwrap_or_default();
        let status = std::str::from_utf8(&status).ok().and_then(|s| s.parse::<u16>().ok()).unwrap_or(0);
        match step.answered(status) {
            Follow::ReadUploadId(path) => self.reading_upload_id = Some((path, token)),
            Follow::Forget((path, id)) => {
                if let Err(e) = uploads::forget(&path, &id) {
                    log::warn!("fencekeeper: could not forget a finished multipart upload: {e}");
                }
            }
            Follow::Nothing => {}
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.reading_upload_id.is_none() {
            return Action::Continue;
        }
        if body_size > MAX_ANSWER {
            self.reading_upload_id = None;
            log::warn!(
                "fencekeeper: a CreateMultipartUpload answer over {MAX_ANSWER} bytes; its parts need their own token"
            );
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause; // Envoy buffers the answer until it is whole
        }
        let body = self.get_http_response_body(0, body_size).unwrap_or_default();
        if let (Some((path, token)), Some(id)) =
            (self.reading_upload_id.take(), upload_rules::upload_id_in_answer(&body))
        {
            if let Err(e) = uploads::remember(&path, id, &token) {
                log::warn!("fencekeeper: could not remember a multipart upload; its parts need their own token: {e}");
            }
        }
        self.reading_upload_id = None;
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.cond.is_some() {
            self.conclude(None); // a conditional write not counted yet: its answer was the store's
        }
        if let Some(g) = &self.filter.gate {
            g.end(&self.filter, self.context);
        }
    }
}
