//! Refusal responses: a thin renderer of the core's `http::Refusal` (the refusal
//! contract in README.md, shared with the Envoy filter): its HTTP status, the mark in
//! `fencing-highest`, the one-line reason as the body. gRPC requests get a
//! Trailers-Only answer with the gRPC status instead, so gRPC clients see
//! FAILED_PRECONDITION, INVALID_ARGUMENT or UNAVAILABLE rather than a transport error.
//! S3 clients get S3's error document, whose code and message they show.

use crate::Body;
use fencekeeper_core::http::{GrpcMessage, Refusal, S3Error, HIGHEST_HEADER, S3_ERROR_CONTENT_TYPE};
use fencekeeper_core::refusal::Action;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// How a refusal is written, by what the client understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The reason as a plain-text body.
    Text,
    /// A gRPC Trailers-Only answer.
    Grpc,
    /// S3's XML error document (protocol s3).
    S3,
}

/// The response refusing a request: `action`'s refusal, with `reason` as the body,
/// written in `form`.
pub fn refuse(action: &Action, reason: &str, form: Form) -> Response<Body> {
    // A forwarded action is never refused; render it as undecided rather than panic.
    let refusal = Refusal::of(action).unwrap_or(Refusal {
        class: action.class,
        http_status: 503,
        grpc_status: 14,
        highest: None,
    });
    let mut response = if form == Form::Grpc {
        let mut r = Response::new(full(Bytes::new()));
        let headers = r.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from(refusal.grpc_status));
        if let Ok(message) = HeaderValue::from_str(&GrpcMessage(reason).to_string()) {
            headers.insert("grpc-message", message);
        }
        r
    } else {
        let (body, content_type) = match form {
            Form::S3 => (S3Error { class: refusal.class, reason }.to_string(), S3_ERROR_CONTENT_TYPE),
            Form::Text | Form::Grpc => (format!("{reason}\n"), "text/plain; charset=utf-8"),
        };
        let mut r = Response::new(full(body));
        *r.status_mut() = StatusCode::from_u16(refusal.http_status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        r
    };
    if let Some(mark) = refusal.highest {
        if let Ok(v) = HeaderValue::from_str(&mark.to_string()) {
            response.headers_mut().insert(HIGHEST_HEADER, v);
        }
    }
    response
}

/// A plain error answer that is not a fencing refusal (413, 408, 502, 504).
pub fn error(status: StatusCode, reason: &str) -> Response<Body> {
    let mut r = Response::new(full(format!("{reason}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::refusal::resolve;
    use fencekeeper_core::{Mode, Token, Verdict};

    #[test]
    fn stale_refusal_is_409_with_the_mark_or_grpc_failed_precondition() {
        let stale: Verdict =
            Verdict::Stale { mark: Token::parse("34").unwrap(), presented: Token::parse("33").unwrap() };
        let action = resolve(Mode::Correctness, Ok(&stale));
        let http = refuse(&action, "stale", Form::Text);
        assert_eq!(http.status(), 409);
        assert_eq!(http.headers().get(HIGHEST_HEADER).map(|v| v.as_bytes()), Some(&b"34"[..]));
        let grpc = refuse(&action, "stale \"x\" 100%", Form::Grpc);
        assert_eq!(grpc.status(), 200);
        assert_eq!(grpc.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"9"[..]));
        assert_eq!(grpc.headers().get("grpc-message").map(|v| v.as_bytes()), Some(&b"stale \"x\" 100%25"[..]));
        let s3 = refuse(&action, "stale", Form::S3);
        assert_eq!(
            (s3.status(), s3.headers().get(CONTENT_TYPE)),
            (StatusCode::CONFLICT, Some(&HeaderValue::from_static("application/xml")))
        );
    }
}
