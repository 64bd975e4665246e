//! One request through the filter.
//!
//! Shared data only (efficiency mode without etcd): read the slot, decide, CAS;
//! on a lost CAS read and decide again. With etcd: the shared-data copy may refuse
//! on its own (marks only rise, so a token below it is surely stale), but only an
//! etcd transaction admits: compare the mark we expect, advance or confirm, and on
//! a failed compare decide again against the mark etcd returned.

use crate::etcd::{self, Outcome};
use crate::{resource, Filter};
use fencekeeper_core::refusal::{resolve, Reason, ADMITTED_HEADER, HIGHEST_HEADER};
use fencekeeper_core::{decide, decision::decide_token, Class, Token, Verdict};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, GrpcStatusCode};
use std::rc::Rc;
use std::time::Duration;

/// How many etcd transactions one request may take before it is undecided.
const MAX_ETCD_ROUNDS: u32 = 8;

/// The HTTP context of one request.
pub struct Request {
    filter: Rc<Filter>,
    pending: Option<Pending>,
}

/// A request waiting for etcd.
struct Pending {
    resource: String,
    token: Token,
    expected: Option<Token>,
    rounds: u32,
}

impl Request {
    /// A request of `filter`.
    pub fn new(filter: Rc<Filter>) -> Request {
        Request { filter, pending: None }
    }

    fn header(&self, name: &str) -> Option<Vec<u8>> {
        // The byte variant: the String one panics on non-UTF-8 header values.
        self.get_http_request_header_bytes(name)
    }

    /// Decide with the shared-data copy, then finish or go to etcd.
    fn start(&mut self) -> Action {
        let f = Rc::clone(&self.filter);
        let path = self.header(":path").unwrap_or_default();
        let resource = resource::derive(&f.config.resource, &path, |h| self.header(h));
        let presented = self.header(&f.config.token_header).map(|v| String::from_utf8_lossy(&v).into_owned());
        if f.config.etcd.is_none() {
            return self.shared_only(&resource, presented.as_deref());
        }
        let cached = match resource_mark(&f, &resource) {
            Ok(m) => m,
            Err(cause) => return self.finish(None, &resource, &cause),
        };
        match decide(&f.config.policy, &resource, presented.as_deref(), cached.as_ref()) {
            Verdict::Admit { mark: token, .. } => {
                self.pending = Some(Pending { resource, token, expected: cached, rounds: 0 });
                self.send_txn()
            }
            refusal => self.finish(Some(refusal), &resource, &""),
        }
    }

    /// Efficiency mode without etcd: the shared data is the mark store.
    fn shared_only(&mut self, resource: &str, presented: Option<&str>) -> Action {
        let f = Rc::clone(&self.filter);
        for _ in 0..crate::slots::MAX_CAS_ATTEMPTS {
            let read = match f.slots.read(resource) {
                Ok(r) => r,
                Err(e) => return self.finish(None, resource, &e),
            };
            let verdict = decide(&f.config.policy, resource, presented, read.mark(resource).as_ref());
            let Verdict::Admit { mark, advanced: true } = verdict else {
                return self.finish(Some(verdict), resource, &"");
            };
            match f.slots.write(read, resource, mark) {
                Ok(true) => return self.finish(Some(verdict), resource, &""),
                Ok(false) => continue,
                Err(e) => return self.finish(None, resource, &e),
            }
        }
        self.finish(None, resource, &"shared-data compare-and-swap kept losing")
    }

    fn send_txn(&mut self) -> Action {
        let (Some(p), Some(e)) = (&self.pending, &self.filter.config.etcd) else {
            return Action::Continue;
        };
        let body = etcd::txn(&format!("{}{}", e.key_prefix, p.resource), &p.resource, p.expected.as_ref(), &p.token);
        let headers = vec![
            (":method", "POST"),
            (":path", etcd::TXN_PATH),
            (":authority", e.authority.as_str()),
            ("content-type", "application/json"),
        ];
        match self.dispatch_http_call(&e.cluster, headers, Some(&body), vec![], Duration::from_millis(e.timeout_ms)) {
            Ok(_) => Action::Pause,
            Err(s) => {
                let resource = p.resource.clone();
                let cause = format!("cannot call etcd cluster {:?} ({s:?})", e.cluster);
                self.finish(None, &resource, &cause)
            }
        }
    }

    /// The verdict for an etcd answer, or `None` to ask again.
    fn on_etcd(&mut self, outcome: Result<Outcome, etcd::EtcdError>) -> Option<(Option<Verdict>, String)> {
        let f = Rc::clone(&self.filter);
        let p = self.pending.as_mut()?;
        let current = match outcome {
            Err(e) => return Some((None, e.0)),
            Ok(Outcome::Succeeded) => {
                let advanced = p.expected.as_ref() != Some(&p.token);
                let _ = f.slots.raise(&p.resource, p.token);
                return Some((Some(Verdict::Admit { mark: p.token, advanced }), String::new()));
            }
            Ok(Outcome::Current(current)) => current,
        };
        if let Some(m) = current {
            let _ = f.slots.raise(&p.resource, m);
        }
        match decide_token(&f.config.policy, p.token, current.as_ref()) {
            // The range read the mark equal to the token: the holder writing again.
            v @ Verdict::Admit { advanced: false, .. } => Some((Some(v), String::new())),
            Verdict::Admit { .. } if p.rounds + 1 >= MAX_ETCD_ROUNDS => {
                Some((None, "etcd compare-and-swap kept losing".to_owned()))
            }
            Verdict::Admit { .. } => {
                p.rounds += 1;
                p.expected = current;
                None
            }
            refusal => Some((Some(refusal), String::new())),
        }
    }

    /// Forward or refuse, as the core resolves the verdict (`None`: undecided).
    fn finish(&mut self, verdict: Option<Verdict>, resource: &str, cause: &dyn std::fmt::Display) -> Action {
        let f = Rc::clone(&self.filter);
        let action = resolve(f.config.policy.mode, verdict.as_ref());
        let failed_open = action.forward && action.class != Class::Admitted;
        f.metrics.count(action.class, failed_open);
        let reason = Reason { verdict: verdict.as_ref(), resource, cause };
        if action.forward {
            if let (Class::Admitted, Some(t)) = (action.class, action.token) {
                // Replaces any value a client sent.
                self.set_http_request_header(ADMITTED_HEADER, Some(&t.to_string()));
            } else {
                self.set_http_request_header(ADMITTED_HEADER, None);
                log::warn!("fencekeeper: passed without a decision (efficiency mode): {reason}");
            }
            return Action::Continue;
        }
        if action.class == Class::Undecided {
            log::warn!("fencekeeper: {reason}");
        }
        let text = reason.to_string();
        let highest =
            action.token.filter(|_| matches!(action.class, Class::Stale | Class::Replayed)).map(|t| t.to_string());
        let grpc = self.header("content-type").is_some_and(|c| c.starts_with(b"application/grpc"));
        if grpc {
            let code = grpc_code(action.class.grpc_status());
            let meta: Vec<(&str, &[u8])> = highest.iter().map(|h| (HIGHEST_HEADER, h.as_bytes())).collect();
            self.send_grpc_response(code, Some(&text), meta);
        } else {
            let mut headers = vec![("content-type", "text/plain; charset=utf-8")];
            if let Some(h) = &highest {
                headers.push((HIGHEST_HEADER, h.as_str()));
            }
            self.send_http_response(
                u32::from(action.class.http_status()),
                headers,
                Some(format!("{text}\n").as_bytes()),
            );
        }
        Action::Pause
    }
}

fn resource_mark(f: &Filter, resource: &str) -> Result<Option<Token>, String> {
    // An over-long or empty key is refused by the core; it has no slot to read.
    if fencekeeper_core::resource::check(resource).is_err() {
        return Ok(None);
    }
    f.slots.read(resource).map(|r| r.mark(resource)).map_err(|e| e.to_string())
}

fn grpc_code(code: u32) -> GrpcStatusCode {
    match code {
        3 => GrpcStatusCode::InvalidArgument,
        9 => GrpcStatusCode::FailedPrecondition,
        14 => GrpcStatusCode::Unavailable,
        _ => GrpcStatusCode::Unknown,
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, _token: u32, _headers: usize, body_size: usize, _trailers: usize) {
        let status = self.get_http_call_response_header(":status");
        let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
        let resource = self.pending.as_ref().map(|p| p.resource.clone()).unwrap_or_default();
        match self.on_etcd(etcd::parse(status.as_deref(), &body, &resource)) {
            None => {
                if let Action::Continue = self.send_txn() {
                    self.resume_http_request();
                }
            }
            Some((verdict, cause)) => {
                if let Action::Continue = self.finish(verdict, &resource, &cause) {
                    self.resume_http_request();
                }
            }
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let method = self.header(":method").map(|m| String::from_utf8_lossy(&m).into_owned()).unwrap_or_default();
        if !self.filter.config.fences(&method) {
            // Only the filter may tell the upstream what it admitted.
            self.set_http_request_header(ADMITTED_HEADER, None);
            return Action::Continue;
        }
        if let Some(h) = &self.filter.config.test_fault_header {
            if self.header(h).is_some() {
                // Testing only (docs/envoy.md): trap, so the failure policy is exercised.
                #[allow(clippy::panic)]
                {
                    panic!("fencekeeper: test fault requested by header {h}");
                }
            }
        }
        self.start()
    }
}
