//! One request through the gateway: unfenced requests stream straight through; a
//! fenced write is read whole (bounded by size and time), admitted through the gate,
//! and forwarded with the admitted token, or refused under the refusal contract.
//!
//! The body is read before the token is decided, so a slow uploader never holds a
//! resource's gate, and a write is forwarded in one piece the moment it is admitted.
//!
//! The client's address (from the accepted connection) goes into every refusal's log
//! line and into the audit record of every mark the gateway raises.

use crate::conditional::{Conditional, Delivery};
use crate::config::Config;
use crate::gate::{Gate, Permit};
use crate::metrics::{Event, Metrics};
use crate::ordered::{self, Ordered};
use crate::refusal::{self, full, Failure, Form};
use crate::registry::Registry;
use crate::tls::Connector;
use crate::uploads::Uploads;
use crate::Body;
use fencekeeper::audit::{self, AuditLog, Change, Entry};
use fencekeeper::chain::ChainStore;
use fencekeeper::{Advance, Guard};
use fencekeeper_core::http::ADMITTED_HEADER;
use fencekeeper_core::resource::ResourceError;
use fencekeeper_core::{Class, Malformed, Protocol};
use fencekeeper_engine::answer::retry_after_seconds;
use fencekeeper_engine::conditional::{self as rules, Refused};
use fencekeeper_engine::early::{self, Early};
use fencekeeper_engine::forward;
use fencekeeper_engine::gate;
use fencekeeper_engine::head::{Head, Presented};
use fencekeeper_engine::uploads::Step;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Hop-by-hop headers: they describe one connection and are not forwarded.
const HOP_BY_HOP: [&str; 6] =
    ["connection", "keep-alive", "proxy-connection", "upgrade", "proxy-authenticate", "proxy-authorization"];

/// The gateway's request handler, shared by every connection.
pub struct Proxy {
    config: Config,
    guard: Arc<Guard>,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
    client: Client<Connector, Body>,
    audit: Option<Arc<AuditLog>>,
    /// When this handler was made (the gateway's start, for the start grace).
    started: Instant,
    /// S3 multipart uploads and the tokens they started with (protocol s3).
    uploads: Uploads,
    /// Conditional writes (`--conditional-writes`): the version chains.
    conditional: Option<Conditional>,
}

impl Proxy {
    /// A handler fencing with `guard` under `config`, appending every mark it raises
    /// to `audit`, ordering writes across instances through `registry` when given.
    /// With `chains`, every admitted write goes with a precondition (conditional writes).
    pub fn new(
        config: Config,
        guard: Arc<Guard>,
        audit: Option<AuditLog>,
        registry: Option<Arc<Registry>>,
        chains: Option<Arc<dyn ChainStore>>,
    ) -> Proxy {
        let connector = Connector::new(config.upstream_tls.clone());
        let client = Client::builder(TokioExecutor::new()).http2_only(config.upstream_http2).build(connector);
        let gate = Gate::new(config.gate, config.gate_timeout, config.apply_bound, registry, !config.blocking_admits);
        let started = Instant::now();
        let (metrics, uploads) = (Arc::default(), Uploads::default());
        let conditional = chains.map(|chains| {
            let (wait, upstream) = (config.gate_timeout, config.upstream.clone());
            let lend_for = config.request_timeout + config.apply_bound;
            Conditional::new(chains, wait, client.clone(), upstream, config.conditional_deletes, lend_for)
        });
        Proxy { config, guard, gate, metrics, client, audit: audit.map(Arc::new), started, uploads, conditional }
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The metrics in Prometheus text, with the gate's gauge.
    pub fn render_metrics(&self) -> String {
        let name = "fencekeeper_gateway_gate_waiting";
        let waiting = self.gate.waiting_total();
        let mut gauges = format!("# HELP {name} Admitted writes waiting now for lower-token writes in flight.\n# TYPE {name} gauge\n{name} {waiting}\n");
        let name = "fencekeeper_gateway_gate_holding";
        let holding = self.gate.holding_total();
        gauges += &format!("# HELP {name} Writes given up on that still hold their resource (within the store apply bound).\n# TYPE {name} gauge\n{name} {holding}\n");
        if let Some(waiting) = self.gate.shared_waiting() {
            let name = "fencekeeper_gateway_shared_gate_waiting";
            gauges += &format!("# HELP {name} Writes waiting now for other instances' lower-token writes (--shared-gate).\n# TYPE {name} gauge\n{name} {waiting}\n");
        }
        self.metrics.render() + &gauges
    }

    /// The guard (validator and mark store).
    pub fn guard(&self) -> &Arc<Guard> {
        &self.guard
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// How much of the start grace is left (`None`: over, or none configured).
    pub fn start_grace_left(&self) -> Option<Duration> {
        if self.config.start_grace.is_zero() {
            return None; // off: no clock read on the write path
        }
        gate::grace_left(self.config.start_grace, self.started.elapsed())
    }

    /// Answer one request from `client`.
    pub async fn handle(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        client: SocketAddr,
    ) -> Result<Response<Body>, Infallible> {
        let start = Instant::now();
        // Removed before any branch can forward the request (an unfenced request, a
        // write passed failing open): only the fence says what it admitted.
        for name in forward::NEVER_FROM_CLIENTS {
            request.headers_mut().remove(name);
        }
        // Decoded once: the fenced prefix and the resource key are both judged on the
        // path as the store will see it (the engine's rules, `head`).
        let (path, fences, read) = {
            let head = self.head(request.method(), request.uri(), request.headers());
            let scope = self.config.scope();
            let path = scope.store_path(&head);
            let fences = scope.fences(&head, &path);
            // With conditional writes, a read's answer may tell an unknown version.
            let read = (!fences && self.conditional.is_some()).then(|| scope.read_of(&head, &path)).flatten();
            (path, fences, read)
        };
        let content_type = request.headers().get(hyper::header::CONTENT_TYPE).map(HeaderValue::as_bytes);
        let form = Form::of(content_type, self.config.protocol);
        let response = if fences {
            self.clone().fenced(request, path, form, client).await
        } else {
            self.metrics.event(Event::Passthrough);
            let response = self.forward(request.map(BodyExt::boxed), Vec::new(), form).await;
            if let (Some(conditional), Some(resource)) = (&self.conditional, read) {
                conditional.observe_read(&resource, response.status(), response.headers()).await;
            }
            response
        };
        self.metrics.latency(start.elapsed());
        Ok(response)
    }

    /// The parts of a request's head the engine reads, with the Host the store will
    /// see: the client's (forwarded as it is), or without one the upstream's address,
    /// which the client connection then sends.
    fn head<'a>(&'a self, method: &'a Method, uri: &'a Uri, headers: &'a HeaderMap) -> Head<'a> {
        let target = uri.path_and_query().map_or(&b"/"[..], |p| p.as_str().as_bytes());
        let upstream = || self.config.upstream.authority().map(|a| a.as_str().as_bytes());
        let host = headers.get(HOST).map(HeaderValue::as_bytes).or_else(upstream);
        self.config.head(method, target, headers, host)
    }

    async fn fenced(
        self: Arc<Self>,
        request: Request<Incoming>,
        path: Result<Vec<u8>, ResourceError>,
        form: Form,
        client: SocketAddr,
    ) -> Response<Body> {
        // What the head alone refuses, in the engine's order (`early`), before a byte
        // of the body is read: a request refused on its head is never held.
        let target = request.uri().path_and_query().map_or(&b"/"[..], |p| p.as_str().as_bytes()).to_vec();
        let checked = {
            let head = self.head(request.method(), request.uri(), request.headers());
            let header = |name: &str| request.headers().get(name).map(HeaderValue::as_bytes);
            let limits = early::Limits {
                conditional: self.conditional.as_ref().map(|c| early::Deletes(c.deletes())),
                max_body: Some(self.config.max_body as u64),
                grace_left: self.start_grace_left(),
            };
            // A later step of an S3 multipart upload that sends no token inherits the
            // token its upload was admitted with (the aws CLI can send none).
            let inherited = |path: &[u8]| self.uploads.inherited(&target, path);
            early::check(&self.config.scope(), &head, &path, inherited, header, limits)
        };
        let presented = match checked {
            Ok(presented) => presented,
            Err(refused) => return self.refused_early(refused, &path, form, client),
        };
        let limit = self.config.max_body;
        let (parts, body) = request.into_parts();
        let bytes = match tokio::time::timeout(self.config.request_timeout, Limited::new(body, limit).collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return self.too_large(limit as u64 + 1, form)
            }
            Ok(Err(e)) => {
                return refusal::fail(Failure::BadRequest, &format!("could not read the request body: {e}"), form)
            }
            Err(_) => {
                self.metrics.event(Event::TimedOut);
                let reason = format!("the request body did not arrive within {:?}", self.config.request_timeout);
                return refusal::fail(Failure::BodyTimeout, &reason, form);
            }
        };
        // Its own task: when the client goes away mid-request, the ordered and the
        // upstream exchange still run to their end, so the gate's bookkeeping is never
        // cut short and a write is never released while the store may still apply it.
        let admitted = async move { self.admit_and_forward(parts, path, target, presented, bytes, form, client).await };
        match tokio::spawn(admitted).await {
            Ok(response) => response,
            Err(e) => refusal::fail(Failure::Internal, &format!("the request task failed: {e}"), form),
        }
    }

    /// Answer a write refused on its head, and count it as the engine says.
    fn refused_early(
        &self,
        refused: Early,
        path: &Result<Vec<u8>, ResourceError>,
        form: Form,
        client: SocketAddr,
    ) -> Response<Body> {
        let mode = self.config.policy.mode;
        let resource = || path.as_deref().map(String::from_utf8_lossy).unwrap_or_default().into_owned();
        let ordered = match refused {
            Early::Malformed(m) => ordered::malformed(mode, m),
            Early::NotConditional(why) => {
                return self.conditional_refused(rules::not_conditional(&resource(), why, form), client)
            }
            Early::TooLarge { length, .. } => return self.too_large(length, form),
            Early::StartGrace(left) => {
                let knob = gate::Knob { name: "--start-grace", value: self.config.start_grace };
                ordered::refused(gate::in_start_grace(mode, &resource(), knob, left), false)
            }
        };
        self.metrics.outcome(ordered.action.class, false);
        if let Some(event) = ordered.event {
            self.metrics.event(event.into());
        }
        self.refuse(&resource(), &ordered, form, client)
    }

    #[allow(clippy::too_many_arguments)]
    async fn admit_and_forward(
        &self,
        mut parts: Parts,
        path: Result<Vec<u8>, ResourceError>,
        target: Vec<u8>,
        presented: Presented,
        bytes: Bytes,
        form: Form,
        client: SocketAddr,
    ) -> Response<Body> {
        let s3 = self.config.protocol == Protocol::S3;
        let token = presented.token;
        let (resource, ordered, permits) = self.order(presented.keys, token.as_deref(), client).await;
        let action = ordered.action;
        // A conditional write is counted once its outcome is known (the engine's
        // `conditional`: a refusal by its chain or the store counts what the client is told).
        if !(action.forward && self.conditional.is_some()) {
            self.metrics.outcome(action.class, action.forward);
        }
        if ordered.waited {
            self.metrics.event(Event::GateWait);
        }
        if let Some(event) = ordered.event {
            self.metrics.event(event.into());
        }
        if let Some(what) = &ordered.breach {
            self.metrics.event(Event::Breach);
            tracing::error!(resource, breach = what.as_str(), "validator broke the contract; refused");
        }
        if !action.forward {
            return self.refuse(&resource, &ordered, form, client);
        }
        if let Some(v) = forward::admitted(&action).and_then(|t| HeaderValue::from_str(&t.to_string()).ok()) {
            parts.headers.insert(ADMITTED_HEADER, v);
        }
        if action.class == Class::Admitted {
            tracing::debug!(resource, reason = ordered.reason, waited = ordered.waited, "admitted");
        } else {
            tracing::warn!(resource, %client, class = action.class.name(), reason = ordered.reason, "failed open");
        }
        let step = match (&path, &token) {
            (Ok(path), Some(_)) if s3 && action.class == Class::Admitted => {
                Step::of(parts.method.as_str(), &target, path)
            }
            _ => Step::Other,
        };
        parts.headers.remove(TRANSFER_ENCODING);
        parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        if let Some(conditional) = &self.conditional {
            let lent = match conditional.lend(&resource, action.token, &mut parts, &bytes, form).await {
                Ok(lent) => lent,
                Err(refused) => return self.conditional_refused(refused, client),
            };
            let request = Request::from_parts(parts, full(bytes));
            let (response, delivery) = self.send(request, permits, form, true).await;
            return match conditional.settle(lent, delivery, response.headers()).await {
                Some(refused) => self.conditional_refused(refused, client),
                None => {
                    self.metrics.outcome(Class::Admitted, false);
                    response
                }
            };
        }
        let response = self.forward(Request::from_parts(parts, full(bytes)), permits, form).await;
        match (step, token) {
            (Step::Other, _) | (_, None) => response,
            (step, Some(token)) => self.uploads.answered(step, &token, response, self.config.request_timeout).await,
        }
    }

    /// Log and answer a refusal of a write of `resource` (counted by the caller).
    fn refuse(&self, resource: &str, ordered: &Ordered, form: Form, client: SocketAddr) -> Response<Body> {
        let (action, reason) = (&ordered.action, &ordered.reason);
        match action.class {
            Class::Undecided => tracing::warn!(resource, %client, status = 503, reason, "refused"),
            // A forged token (or one from another lock service): who sent it matters.
            Class::Unverified => tracing::warn!(resource, %client, class = "unverified", reason, "refused"),
            class => tracing::info!(resource, %client, class = class.name(), reason, "refused"),
        }
        // Only the gate's own refusals (the start grace, a write held past the gate
        // timeout) say when to retry.
        refusal::refuse(action, reason, form, ordered.retry_after.map(retry_after_seconds))
    }

    /// Order a write of the resources `keys` (sorted: two writes of the same pair
    /// take them in one order) at the gate, one after the other, auditing each mark
    /// raised. The first refusal refuses the whole write; the permits taken before it
    /// end unused (nothing was sent). Admitted everywhere, the write goes with every
    /// permit. Returns the resource to log (the refused one, or all), the outcome and
    /// the permits.
    async fn order(
        &self,
        keys: Vec<String>,
        token: Option<&str>,
        client: SocketAddr,
    ) -> (String, Ordered, Vec<Permit>) {
        let mut permits = Vec::with_capacity(keys.len());
        let mut waited = false;
        let mut last = None;
        for key in &keys {
            let mut ordered = self.gate.order(&self.guard, key, token).await;
            if let Some(advance) = ordered.advance {
                self.audit(key, advance, token, client).await;
            }
            waited |= ordered.waited;
            ordered.waited = waited;
            if !ordered.action.forward {
                return (key.clone(), ordered, Vec::new());
            }
            permits.extend(ordered.permit.take());
            last = Some(ordered);
        }
        match last {
            Some(ordered) => (keys.join(" and "), ordered, permits),
            // `resources` names at least one key.
            None => {
                let empty = Malformed::Resource(ResourceError::Empty);
                (String::new(), ordered::malformed(self.config.policy.mode, empty), Vec::new())
            }
        }
    }

    /// Append the mark this request raised to the audit log, before the write is
    /// forwarded. A failure is logged and counted; the write goes on (the mark has
    /// already moved, and the log is a record of it, not a condition for it).
    async fn audit(&self, resource: &str, advance: Advance, token: Option<&str>, client: SocketAddr) {
        let Some(log) = self.audit.clone() else { return };
        let (resource, token, store) = (resource.to_owned(), token.map(str::to_owned), self.config.store.clone());
        let appended = tokio::task::spawn_blocking(move || {
            let client = client.to_string();
            log.append(&Entry {
                unix_ms: audit::now_ms(),
                host: "gateway",
                reason: Change::Advance,
                resource: &resource,
                old: advance.from,
                old_damaged: None,
                new: Some(advance.to),
                token: token.as_deref(),
                client: Some(&client),
                user: None,
                store: &store,
            })
        })
        .await;
        let error = match appended {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("the audit task failed: {e}"),
        };
        self.metrics.event(Event::AuditError);
        tracing::error!(error, "a mark's change was not written to the audit log");
    }

    /// Count a conditional write the fence refused itself, and answer it.
    fn conditional_refused(&self, refused: Refused, client: SocketAddr) -> Response<Body> {
        if let Some(class) = refused.class {
            self.metrics.outcome(class, false);
        }
        if let Some(event) = refused.event {
            self.metrics.event(event.into());
        }
        let answer = refused.answer;
        tracing::info!(%client, status = answer.status, reason = answer.reason, "refused");
        refusal::render(answer)
    }

    /// Refuse a body of `length` bytes or more, over `--max-body` (413).
    fn too_large(&self, length: u64, form: Form) -> Response<Body> {
        self.metrics.event(Event::TooLarge);
        refusal::render(rules::too_large(length, self.config.max_body as u64, "--max-body", form).answer)
    }

    /// Send `request` upstream. `permits` (the write's places at the gate, one for
    /// each resource it writes) are released once the upstream has answered, or
    /// given up on.
    async fn forward(&self, request: Request<Body>, permits: Vec<Permit>, form: Form) -> Response<Body> {
        self.send(request, permits, form, false).await.0
    }

    /// [`Proxy::forward`], telling also what became of the request. The gateway's own
    /// answers (400, 502, 504) are written in `form`. With `keep_late`, a request given
    /// up on is not cancelled: it comes back in [`Delivery::GivenUp`], still waiting
    /// for the store's answer.
    async fn send(
        &self,
        mut request: Request<Body>,
        permits: Vec<Permit>,
        form: Form,
        keep_late: bool,
    ) -> (Response<Body>, Delivery) {
        let upstream = &self.config.upstream;
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
        let target = format!("http://{}{path}", upstream.authority().map_or("", |a| a.as_str()));
        match target.parse::<Uri>() {
            Ok(uri) => *request.uri_mut() = uri,
            Err(e) => {
                let answer = refusal::fail(Failure::BadRequest, &format!("bad request target: {e}"), form);
                return (answer, Delivery::NotSent);
            }
        }
        *request.version_mut() = if self.config.upstream_http2 { Version::HTTP_2 } else { Version::HTTP_11 };
        for name in HOP_BY_HOP {
            request.headers_mut().remove(name);
        }
        let timeout = self.config.request_timeout;
        let mut pending = self.client.request(request);
        let (answer, late) = match tokio::time::timeout(timeout, &mut pending).await {
            Ok(answer) => (Some(answer), None),
            // Given up on: the request goes on in a task of its own, for its answer.
            Err(_) if keep_late => (None, Some(tokio::spawn(pending))),
            Err(_) => (None, None),
        };
        let delivery = match &answer {
            Some(Ok(response)) => Delivery::Answered(response.status()),
            Some(Err(e)) if e.is_connect() => Delivery::NotSent,
            _ => Delivery::GivenUp(late),
        };
        match &answer {
            _ if permits.is_empty() => {}
            // Its response head is here: the store has applied it, or never will.
            Some(Ok(_)) => permits.into_iter().for_each(Permit::answered),
            // No connection was made: nothing was sent, nothing can land.
            Some(Err(e)) if e.is_connect() => permits.into_iter().for_each(Permit::answered),
            // Given up on after it may have been sent: the store may still apply it,
            // so it keeps holding its resources for the store apply bound.
            _ => {
                self.metrics.event(Event::GivenUp);
                permits.into_iter().for_each(Permit::given_up);
            }
        }
        let response = match answer {
            Some(Ok(response)) => response.map(BodyExt::boxed),
            Some(Err(e)) => {
                self.metrics.event(Event::UpstreamError);
                let reason = format!("upstream {upstream} failed: {}", error_chain(&e));
                tracing::warn!(reason, "upstream error");
                refusal::fail(Failure::UpstreamFailed, &reason, form)
            }
            None => {
                self.metrics.event(Event::UpstreamError);
                let reason = format!("upstream {upstream} did not answer within {timeout:?}");
                tracing::warn!(reason, "upstream timeout");
                refusal::fail(Failure::UpstreamTimeout, &reason, form)
            }
        };
        (response, delivery)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
