//! Answers the gateway gives itself: the engine's [`Answer`] (a refusal under the
//! refusal contract, or a failure such as 413 or 502, in the form the client reads),
//! written out as a hyper response. What an answer says is decided in
//! `fencekeeper-engine`, the same for the Envoy filter; this only moves its bytes.

use crate::Body;
use fencekeeper_core::http::GrpcMessage;
use fencekeeper_core::refusal::Action;
pub use fencekeeper_engine::{Answer, Failure, Form};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// The response refusing a request: `action`'s refusal, with `reason`, in `form`,
/// with `Retry-After: retry_after` seconds when given.
pub fn refuse(action: &Action, reason: &str, form: Form, retry_after: Option<u64>) -> Response<Body> {
    render(Answer::refusal(action, reason, form, retry_after))
}

/// The response to a failure that is not a verdict on the token (413, 408, 501, 502,
/// 504, ...), with `reason`, in `form`.
pub fn fail(failure: Failure, reason: &str, form: Form) -> Response<Body> {
    render(Answer::failure(failure, reason, form))
}

/// `answer` as a hyper response. A gRPC answer is Trailers-Only: status 200, the gRPC
/// status and message as headers.
pub fn render(answer: Answer) -> Response<Body> {
    let mut response = Response::new(full(answer.body));
    let headers = response.headers_mut();
    for (name, value) in &answer.headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    match answer.grpc_status {
        Some(status) => {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert("grpc-status", HeaderValue::from(status));
            if let Ok(message) = HeaderValue::from_str(&GrpcMessage(&answer.reason).to_string()) {
                headers.insert("grpc-message", message);
            }
        }
        None => *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
    }
    response
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::http::HIGHEST_HEADER;
    use fencekeeper_core::refusal::resolve;
    use fencekeeper_core::{Mode, Token, Verdict};

    #[test]
    fn stale_refusal_is_409_with_the_mark_or_grpc_failed_precondition() {
        let stale: Verdict =
            Verdict::Stale { mark: Token::parse("34").unwrap(), presented: Token::parse("33").unwrap() };
        let action = resolve(Mode::Correctness, Ok(&stale));
        let http = refuse(&action, "stale", Form::Text, None);
        assert_eq!(http.status(), 409);
        assert_eq!(http.headers().get(HIGHEST_HEADER).map(|v| v.as_bytes()), Some(&b"34"[..]));
        let grpc = refuse(&action, "stale \"x\" 100%", Form::Grpc, Some(2));
        assert_eq!(grpc.status(), 200);
        assert_eq!(grpc.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"9"[..]));
        assert_eq!(grpc.headers().get("grpc-message").map(|v| v.as_bytes()), Some(&b"stale \"x\" 100%25"[..]));
        assert_eq!(grpc.headers().get("retry-after").map(|v| v.as_bytes()), Some(&b"2"[..]));
        let s3 = refuse(&action, "stale", Form::S3, None);
        assert_eq!(
            (s3.status(), s3.headers().get(CONTENT_TYPE)),
            (StatusCode::CONFLICT, Some(&HeaderValue::from_static("application/xml")))
        );
        let big = fail(Failure::TooLarge, "too large", Form::S3);
        assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
}
