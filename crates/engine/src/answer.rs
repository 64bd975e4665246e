//! Every answer the fence gives itself instead of forwarding: a refusal under the
//! refusal contract (409, 428, 400, 403, 503), or a failure that is not about the
//! token (a body too large, a write that cannot be conditional, the store out of
//! reach). One value, status, headers and body, that a host sends as it is, so the
//! same refusal reads the same through every host and every client sees it in the
//! form it parses:
//!
//! * plain clients: the one-line reason as a text body;
//! * S3 clients (protocol s3): S3's XML error document, whose `Code` and `Message` the
//!   aws CLI and the SDKs show (a plain-text body shows them only the status text);
//! * gRPC clients: a Trailers-Only answer with the gRPC status, so they see
//!   FAILED_PRECONDITION, INVALID_ARGUMENT or UNAVAILABLE rather than a transport
//!   error.

use fencekeeper_core::http::{is_grpc, Refusal, S3Error, S3ErrorDocument, HIGHEST_HEADER, S3_ERROR_CONTENT_TYPE};
use fencekeeper_core::refusal::Action;
use fencekeeper_core::{Class, Protocol};
use std::time::Duration;

/// The content type of a text answer.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// How an answer is written, by what the client understands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Form {
    /// The reason as a plain-text body.
    #[default]
    Text,
    /// A gRPC Trailers-Only answer.
    Grpc,
    /// S3's XML error document.
    S3,
}

impl Form {
    /// The form for a request with `content_type` to a store speaking `protocol`: gRPC
    /// by the request's content type, whatever the store; else S3's document for an
    /// S3 store; else text.
    pub fn of(content_type: Option<&[u8]>, protocol: Protocol) -> Form {
        match (content_type.is_some_and(is_grpc), protocol) {
            (true, _) => Form::Grpc,
            (false, Protocol::S3) => Form::S3,
            (false, _) => Form::Text,
        }
    }
}

/// A failure the fence answers itself that is not a verdict on the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The request could not be read, or names no target the fence can forward (400).
    BadRequest,
    /// The body did not arrive in time (408).
    BodyTimeout,
    /// A conditional write refused for its version, not its token (409).
    VersionConflict,
    /// The body is larger than the fence holds (413).
    TooLarge,
    /// The fence failed on its own side (500).
    Internal,
    /// A write the configured mode cannot fence (501): not conditional, a copy.
    NotImplemented,
    /// The store could not be reached, or failed the exchange (502).
    UpstreamFailed,
    /// The fence cannot decide for a reason a retry may mend (503).
    Unavailable,
    /// The store did not answer in time (504).
    UpstreamTimeout,
}

impl Failure {
    /// The HTTP status.
    pub fn http_status(self) -> u16 {
        match self {
            Failure::BadRequest => 400,
            Failure::BodyTimeout => 408,
            Failure::VersionConflict => 409,
            Failure::TooLarge => 413,
            Failure::Internal => 500,
            Failure::NotImplemented => 501,
            Failure::UpstreamFailed => 502,
            Failure::Unavailable => 503,
            Failure::UpstreamTimeout => 504,
        }
    }

    /// The gRPC status a gRPC client gets instead.
    pub fn grpc_status(self) -> u32 {
        match self {
            Failure::BadRequest => 3,                             // INVALID_ARGUMENT
            Failure::BodyTimeout | Failure::UpstreamTimeout => 4, // DEADLINE_EXCEEDED
            Failure::TooLarge => 8,                               // RESOURCE_EXHAUSTED
            Failure::VersionConflict => 10,                       // ABORTED
            Failure::NotImplemented => 12,                        // UNIMPLEMENTED
            Failure::Internal => 13,                              // INTERNAL
            Failure::Unavailable | Failure::UpstreamFailed => 14, // UNAVAILABLE
        }
    }

    /// The `Code` of S3's error document: S3's own where S3 has one, so that S3
    /// clients treat it as they treat S3's.
    pub fn s3_code(self) -> &'static str {
        match self {
            Failure::BadRequest => "InvalidRequest",
            Failure::BodyTimeout => "RequestTimeout",
            Failure::VersionConflict => "FencingVersionConflict",
            Failure::TooLarge => "EntityTooLarge",
            Failure::Internal => "InternalError",
            Failure::NotImplemented => "NotImplemented",
            Failure::UpstreamFailed => "BadGateway",
            Failure::Unavailable => "FencingUnavailable",
            Failure::UpstreamTimeout => "GatewayTimeout",
        }
    }
}

/// One answer, ready to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status; a gRPC answer is sent with 200 and [`Answer::grpc_status`].
    pub status: u16,
    /// For a gRPC client: the gRPC status of a Trailers-Only answer, whose
    /// `grpc-message` is [`Answer::reason`] (percent-encoded by
    /// [`fencekeeper_core::http::GrpcMessage`], or by the proxy).
    pub grpc_status: Option<u32>,
    /// The headers, lower-case names: `content-type` (not for gRPC, whose host writes
    /// its own), `fencing-highest`, `retry-after`.
    pub headers: Vec<(&'static str, String)>,
    /// The body (empty for gRPC).
    pub body: String,
    /// The one-line reason.
    pub reason: String,
}

impl Answer {
    /// The refusal of `action` (a resolved verdict that does not forward), with
    /// `reason`, in `form`; `Retry-After: retry_after` seconds when given (the gate's
    /// own refusals: the start grace, a write held past the gate's wait). An action
    /// that forwards is never refused: given one, this answers 503, never panics.
    pub fn refusal(action: &Action, reason: &str, form: Form, retry_after: Option<u64>) -> Answer {
        let refusal = Refusal::of(action).unwrap_or(Refusal {
            class: Class::Undecided,
            http_status: Class::Undecided.http_status(),
            grpc_status: Class::Undecided.grpc_status(),
            highest: None,
        });
        let s3 = || S3Error { class: refusal.class, reason }.to_string();
        let mut answer = Answer::new(refusal.http_status, refusal.grpc_status, reason, form, s3);
        if let Some(mark) = refusal.highest {
            answer.headers.push((HIGHEST_HEADER, mark.to_string()));
        }
        if let Some(seconds) = retry_after {
            answer.headers.push(("retry-after", seconds.to_string()));
        }
        answer
    }

    /// The answer to `failure`, with `reason`, in `form`.
    pub fn failure(failure: Failure, reason: &str, form: Form) -> Answer {
        let s3 = || S3ErrorDocument { code: failure.s3_code(), reason }.to_string();
        Answer::new(failure.http_status(), failure.grpc_status(), reason, form, s3)
    }

    fn new(status: u16, grpc: u32, reason: &str, form: Form, s3: impl FnOnce() -> String) -> Answer {
        // A reason is one line: a cause that carried a line break (a store's error
        // text) must not split a text body or a log line.
        let reason: String = reason.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        let (grpc_status, content_type, body) = match form {
            Form::Grpc => (Some(grpc), None, String::new()),
            Form::S3 => (None, Some(S3_ERROR_CONTENT_TYPE), s3()),
            Form::Text => (None, Some(TEXT_CONTENT_TYPE), format!("{reason}\n")),
        };
        let headers = content_type.map(|t| ("content-type", t.to_owned())).into_iter().collect();
        Answer { status, grpc_status, headers, body, reason }
    }

    /// The value of header `name`, if the answer has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

/// Retry-After in whole seconds for a wait of `left`: rounded up, at least 1, so a
/// client that waits this long is past it.
pub fn retry_after_seconds(left: Duration) -> u64 {
    (left.as_secs() + u64::from(left.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::refusal::{resolve, NoVerdict};
    use fencekeeper_core::{Mode, Token, Verdict};

    fn stale() -> Action {
        let verdict: Verdict =
            Verdict::Stale { mark: Token::parse("34").unwrap(), presented: Token::parse("33").unwrap() };
        resolve(Mode::Correctness, Ok(&verdict))
    }

    #[test]
    fn a_stale_refusal_is_409_with_the_mark_in_every_form() {
        let text = Answer::refusal(&stale(), "stale", Form::Text, None);
        assert_eq!((text.status, text.grpc_status, text.body.as_str()), (409, None, "stale\n"));
        assert_eq!(
            (text.header("fencing-highest"), text.header("content-type")),
            (Some("34"), Some(TEXT_CONTENT_TYPE))
        );
        let s3 = Answer::refusal(&stale(), "stale <34>", Form::S3, None);
        assert_eq!((s3.status, s3.header("content-type")), (409, Some("application/xml")));
        assert!(s3.body.contains("<Code>FencingTokenStale</Code><Message>stale &lt;34&gt;</Message>"), "{}", s3.body);
        let grpc = Answer::refusal(&stale(), "stale", Form::Grpc, None);
        assert_eq!((grpc.grpc_status, grpc.header("content-type"), grpc.body.as_str()), (Some(9), None, ""));
        assert_eq!(grpc.header("fencing-highest"), Some("34"), "gRPC clients get the mark as metadata");
    }

    #[test]
    fn failures_are_s3_documents_for_s3_clients_and_grpc_statuses_for_grpc_clients() {
        let big = Answer::failure(Failure::TooLarge, "too large", Form::S3);
        assert_eq!(big.status, 413);
        assert!(big.body.contains("<Code>EntityTooLarge</Code>"), "{}", big.body);
        let unconditional = Answer::failure(Failure::NotImplemented, "a copy", Form::S3);
        assert!(unconditional.body.contains("<Code>NotImplemented</Code>"), "{}", unconditional.body);
        let text = Answer::failure(Failure::UpstreamTimeout, "late", Form::Text);
        assert_eq!((text.status, text.body.as_str()), (504, "late\n"));
        assert_eq!(Answer::failure(Failure::TooLarge, "x", Form::Grpc).grpc_status, Some(8));
    }

    #[test]
    fn a_reason_is_one_line_in_every_form() {
        let a = Answer::failure(Failure::UpstreamFailed, "upstream said\nno\r\n", Form::Text);
        assert_eq!(a.body.lines().count(), 1, "{:?}", a.body);
        assert_eq!(a.reason, "upstream said no  ");
    }

    #[test]
    fn a_forwarding_action_is_never_refused_as_anything_but_undecided() {
        let admit: Verdict = Verdict::Admit { mark: Token::parse("1").unwrap(), advanced: true };
        let a = Answer::refusal(&resolve(Mode::Correctness, Ok(&admit)), "x", Form::Text, None);
        assert_eq!(a.status, 503);
        let down = resolve::<()>(Mode::Correctness, Err(NoVerdict::StoreUnreachable));
        let r = Answer::refusal(&down, "down", Form::Text, Some(retry_after_seconds(Duration::from_millis(1))));
        assert_eq!((r.status, r.header("retry-after"), r.header("fencing-highest")), (503, Some("1"), None));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!([0, 1, 999, 1000, 1001].map(|ms| retry_after_seconds(Duration::from_millis(ms))), [1, 1, 1, 1, 2]);
    }

    #[test]
    fn the_form_follows_the_content_type_then_the_protocol() {
        assert_eq!(Form::of(Some(b"application/grpc+proto"), Protocol::S3), Form::Grpc);
        assert_eq!(Form::of(Some(b"text/plain"), Protocol::S3), Form::S3);
        assert_eq!(Form::of(None, Protocol::Http), Form::Text);
    }
}
