//! Forward or refuse one request, as the core resolves its verdict.
//!
//! Every call here goes to the host's *effective* context: the request's own while
//! the filter runs for it, or the one the root switched to when a batch of confirms
//! answers a request (`confirms`). So they are host calls whose failure is ignored,
//! not the SDK's context methods, which trap on one: a request whose stream ended
//! meanwhile has nobody left to answer.

use crate::gate::Entered;
use crate::{Filter, Tally};
use fencekeeper_core::http::ADMITTED_HEADER;
use fencekeeper_core::refusal::{resolve, NoVerdict, Reason, Unverified};
use fencekeeper_core::{Class, Verdict};
use fencekeeper_engine::{forward, Answer, Failure, Form};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{Action, GrpcStatusCode, MapType};

/// How to answer one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// The request's context (the ordering gate's name for its write).
    pub context: u32,
    /// How its answers are written: gRPC statuses to a gRPC client, S3's error
    /// documents to an S3 client, else text.
    pub form: Form,
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
                Entered::Refused => return Action::Pause,
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
            if let Some(t) = forward::admitted(&action) {
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

    /// Answer a refusal: the engine's answer for `action`, with `Retry-After:
    /// retry_after` seconds when given. An action that forwards is not answered.
    pub fn refuse(&self, action: &fencekeeper_core::Action, text: &str, retry_after: Option<u64>) {
        if !action.forward {
            send(Answer::refusal(action, text, self.form, retry_after));
        }
    }

    /// Answer a failure that is not a verdict on the token, logged with the client's
    /// address.
    pub fn error(&self, failure: Failure, text: &str) {
        self.answer_itself(Answer::failure(failure, text, self.form));
    }

    /// Send an answer the fence gives itself (a conditional write's refusal, from
    /// `fencekeeper_engine::conditional`), logged with the client's address.
    pub fn answer_itself(&self, answer: Answer) {
        let client = client().unwrap_or_else(|| "an unknown client".to_owned());
        log::warn!("fencekeeper: refused a write from {client} ({}): {}", answer.status, answer.reason);
        send(answer);
    }
}

/// Send `answer` to the effective context: a gRPC answer through the proxy's own gRPC
/// reply (it writes `grpc-message` from the reason), any other as it is.
fn send(answer: Answer) {
    let headers: Vec<(&str, &str)> = answer.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    match answer.grpc_status {
        Some(code) => {
            let meta: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
            let _ = hostcalls::send_grpc_response(grpc_code(code), Some(&answer.reason), meta);
        }
        None => {
            let _ = hostcalls::send_http_response(u32::from(answer.status), headers, Some(answer.body.as_bytes()));
        }
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
        4 => GrpcStatusCode::DeadlineExceeded,
        7 => GrpcStatusCode::PermissionDenied,
        8 => GrpcStatusCode::ResourceExhausted,
        9 => GrpcStatusCode::FailedPrecondition,
        10 => GrpcStatusCode::Aborted,
        12 => GrpcStatusCode::Unimplemented,
        13 => GrpcStatusCode::Internal,
        14 => GrpcStatusCode::Unavailable,
        _ => GrpcStatusCode::Unknown,
    }
}
