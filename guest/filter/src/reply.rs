//! Forward or refuse one request, as the core resolves its verdict.
//!
//! Every call here goes to the host's *effective* context: the request's own while
//! the filter runs for it, or the one the root switched to when a batch of confirms
//! answers a request (`confirms`). So they are host calls whose failure is ignored,
//! not the SDK's context methods, which trap on one: a request whose stream ended
//! meanwhile has nobody left to answer.

use crate::gate::Entered;
use crate::{Filter, Tally};
use fencekeeper_core::http::{
    Refusal, S3Error, S3ErrorDocument, ADMITTED_HEADER, HIGHEST_HEADER, S3_ERROR_CONTENT_TYPE,
};
use fencekeeper_core::refusal::{resolve, NoVerdict, Reason, Unverified};
use fencekeeper_core::{Class, Verdict};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{Action, GrpcStatusCode, MapType};

/// How to answer one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// The request's context (the ordering gate's name for its write).
    pub context: u32,
    /// The request is gRPC (its refusals are gRPC statuses).
    pub grpc: bool,
    /// The store speaks S3 (its refusals are S3 error documents).
    pub s3: bool,
    /// The client sent a `fencing-admitted-token` of its own (to be removed).
    pub admitted_sent: bool,
}

impl Reply {
    /// Forward or refuse, as the core resolves the verdict (or why there is none),
    /// and count it. `Action::Continue`: the caller resumes or continues the request.
    pub fn finish(
        &self,
        f: &Filter,
        outcome: Result<Verdict, NoVerdict>,
        resource: &str,
        cause: &dyn std::fmt::Display,
    ) -> Action {
        let mut tally = Tally::default();
        let next = self.answer(f, outcome, resource, cause, &mut tally);
        f.metrics.add(&tally);
        next
    }

    /// [`Reply::finish`], counted in `tally` (the caller adds it to the stats). An
    /// admitted write passes the ordering gate first (`gate`): it may be held there
    /// (`Action::Pause`, not counted yet: the gate concludes it later) or refused.
    pub fn answer(
        &self,
        f: &Filter,
        outcome: Result<Verdict, NoVerdict>,
        resource: &str,
        cause: &dyn std::fmt::Display,
        tally: &mut Tally,
    ) -> Action {
        if let (Some(gate), Ok(verdict @ Verdict::Admit { mark: token, .. })) = (&f.gate, &outcome) {
            match gate.enter(f, self, resource, *verdict, *token) {
                Entered::Go => {}
                Entered::Held => return Action::Pause,
                Entered::Stale(higher) => {
                    let stale = Verdict::Stale { mark: higher, presented: *token };
                    return self.conclude(f, Ok(stale), resource, &"", tally, None);
                }
                Entered::Failed(why) => return self.conclude(f, Err(NoVerdict::Refused), resource, &why, tally, None),
            }
        }
        self.conclude(f, outcome, resource, cause, tally, None)
    }

    /// Forward or refuse, past the gate: resolve, count in `tally`, log, answer. A
    /// refusal carries `Retry-After: retry_after` seconds when given.
    pub fn conclude(
        &self,
        f: &Filter,
        outcome: Result<Verdict, NoVerdict>,
        resource: &str,
        cause: &dyn std::fmt::Display,
        tally: &mut Tally,
        retry_after: Option<u64>,
    ) -> Action {
        let action = resolve(f.config.policy.mode, outcome.as_ref().map_err(|e| *e));
        tally.add(action.class, action.failed_open());
        if outcome == Err(NoVerdict::Unverified) {
            let reason = Unverified { resource, cause }.to_string();
            let client = client().unwrap_or_else(|| "an unknown client".to_owned());
            log::warn!("fencekeeper: refused a token from {client}: {reason}");
            self.refuse(&action, &reason, None);
            return Action::Pause;
        }
        let reason = Reason { verdict: outcome.as_ref().ok(), resource, cause };
        if action.forward {
            if let (Class::Admitted, Some(t)) = (action.class, action.token) {
                // Replaces any value a client sent.
                let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, ADMITTED_HEADER, Some(&t.to_string()));
            } else {
                if self.admitted_sent {
                    let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, ADMITTED_HEADER, None);
                }
                log::warn!("fencekeeper: passed without a decision (efficiency mode): {reason}");
            }
            return Action::Continue;
        }
        if action.class == Class::Undecided {
            let client = client().unwrap_or_else(|| "an unknown client".to_owned());
            log::warn!("fencekeeper: refused a write from {client}: {reason}");
        }
        self.refuse(&action, &reason.to_string(), retry_after);
        Action::Pause
    }

    /// Answer a refusal: a thin renderer of the core's `http::Refusal`, with
    /// `Retry-After: retry_after` seconds when given.
    pub fn refuse(&self, action: &fencekeeper_core::Action, text: &str, retry_after: Option<u64>) {
        let Some(refusal) = Refusal::of(action) else {
            return;
        };
        let highest = refusal.highest.map(|t| t.to_string());
        let retry = retry_after.map(|s| s.to_string());
        if self.grpc {
            let meta: Vec<(&str, &[u8])> = highest.iter().map(|h| (HIGHEST_HEADER, h.as_bytes())).collect();
            // Envoy writes the text into grpc-message of its local reply.
            let _ = hostcalls::send_grpc_response(grpc_code(refusal.grpc_status), Some(text), meta);
        } else {
            let (body, content_type) = match self.s3 {
                true => (S3Error { class: refusal.class, reason: text }.to_string(), S3_ERROR_CONTENT_TYPE),
                false => (format!("{text}\n"), "text/plain; charset=utf-8"),
            };
            let mut headers = vec![("content-type", content_type)];
            if let Some(h) = &highest {
                headers.push((HIGHEST_HEADER, h.as_str()));
            }
            if let Some(r) = &retry {
                headers.push(("retry-after", r.as_str()));
            }
            let _ = hostcalls::send_http_response(u32::from(refusal.http_status), headers, Some(body.as_bytes()));
        }
    }
}

impl Reply {
    /// Answer an error that is not a fencing refusal (a conditional write's version
    /// conflict, 409, or a write that cannot be conditional, 501): `code` is its S3
    /// error code when the store speaks S3.
    pub fn error(&self, status: u32, code: &str, text: &str) {
        let client = client().unwrap_or_else(|| "an unknown client".to_owned());
        log::warn!("fencekeeper: refused a write from {client} ({status} {code}): {text}");
        let (body, content_type) = match self.s3 {
            true => (S3ErrorDocument { code, reason: text }.to_string(), S3_ERROR_CONTENT_TYPE),
            false => (format!("{text}\n"), "text/plain; charset=utf-8"),
        };
        let headers = vec![("content-type", content_type)];
        let _ = hostcalls::send_http_response(status, headers, Some(body.as_bytes()));
    }
}

/// The downstream address (`source.address`), if the host gives it.
pub fn client() -> Option<String> {
    let address = hostcalls::get_property(vec!["source", "address"]).ok()??;
    Some(String::from_utf8_lossy(&address).into_owned())
}

fn grpc_code(code: u32) -> GrpcStatusCode {
    match code {
        3 => GrpcStatusCode::InvalidArgument,
        7 => GrpcStatusCode::PermissionDenied,
        9 => GrpcStatusCode::FailedPrecondition,
        14 => GrpcStatusCode::Unavailable,
        _ => GrpcStatusCode::Unknown,
    }
}
