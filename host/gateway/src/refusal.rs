//! Refusal responses, under the contract of DESIGN.md: the status comes from the
//! core's [`Class`], the current mark goes in `fencing-highest`, the body is the
//! one-line reason. gRPC requests get a Trailers-Only answer with the class's gRPC
//! status instead, so gRPC clients see FAILED_PRECONDITION, INVALID_ARGUMENT or
//! UNAVAILABLE rather than a transport error.

use crate::Body;
use fencekeeper_core::refusal::{Action, HIGHEST_HEADER};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// True for a gRPC request (its content type is `application/grpc...`).
pub fn is_grpc<B>(request: &hyper::Request<B>) -> bool {
    request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/grpc"))
}

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// The response refusing a request: `action`'s class, with `reason` as the body.
pub fn refuse(action: &Action, reason: &str, grpc: bool) -> Response<Body> {
    let status = StatusCode::from_u16(action.class.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = if grpc {
        let mut r = Response::new(full(Bytes::new()));
        let headers = r.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from(action.class.grpc_status()));
        if let Ok(message) = HeaderValue::from_str(&grpc_message(reason)) {
            headers.insert("grpc-message", message);
        }
        r
    } else {
        let mut r = Response::new(full(format!("{reason}\n")));
        *r.status_mut() = status;
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        r
    };
    if let Some(mark) = action.token.filter(|_| !action.forward) {
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

/// gRPC's `grpc-message` is percent-encoded outside printable ASCII (and `%`).
fn grpc_message(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    for byte in reason.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
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
        let http = refuse(&action, "stale", false);
        assert_eq!(http.status(), 409);
        assert_eq!(http.headers().get(HIGHEST_HEADER).map(|v| v.as_bytes()), Some(&b"34"[..]));
        let grpc = refuse(&action, "stale \"x\" 100%", true);
        assert_eq!(grpc.status(), 200);
        assert_eq!(grpc.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"9"[..]));
        assert_eq!(grpc.headers().get("grpc-message").map(|v| v.as_bytes()), Some(&b"stale \"x\" 100%25"[..]));
    }
}
