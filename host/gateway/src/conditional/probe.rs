//! The start-up probe: does the store honour `If-Match` on PUT, and on DELETE?

use crate::refusal::full;
use crate::tls::Connector;
use crate::Body;
use fencekeeper::chain::Version;
use hyper::header::{HeaderMap, ETAG, IF_MATCH, IF_NONE_MATCH};
use hyper::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use std::time::Duration;

/// What the start-up probe found: conditional writes can be sent, and whether the
/// store was seen honouring `If-Match` on a DELETE too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probed {
    /// A DELETE with a stale `If-Match` was refused: deletes can be conditional.
    pub deletes: bool,
}

/// Why the store at `upstream` cannot take conditional writes, found with requests to
/// `path`, which the probe may create and delete:
///
/// 1. a PUT whose `If-Match` names a version no store has must be refused (412, or 404
///    for a missing object) and write nothing; a store that applies it ignores
///    preconditions, and the gateway does not start;
/// 2. the probe object is created (`If-None-Match: *`; its ETag from the answer, or a
///    HEAD when it exists already), then a DELETE of it with a stale `If-Match` must
///    be refused (412): a store that ignores `If-Match` on DELETE (MinIO does) deletes
///    it, and the gateway then refuses deletes (501) rather than send them
///    unconditionally; the probe object is deleted at the end.
///
/// `tls` checks an `https://` upstream's certificate.
pub async fn probe(
    upstream: &hyper::Uri,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    path: &str,
) -> Result<Probed, String> {
    let client: Client<Connector, Body> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build(Connector::new(tls));
    let scheme = upstream.scheme_str().unwrap_or("http").to_owned();
    let authority = upstream.authority().map_or("", |a| a.as_str()).to_owned();
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let stale = format!("\"fencekeeper-probe-{nonce}\"");
    let send = |method: Method, header: Option<(hyper::header::HeaderName, String)>, body: &'static [u8]| {
        let (client, target) = (client.clone(), format!("{scheme}://{authority}{path}"));
        async move {
            let mut request = hyper::Request::builder().method(method.clone()).uri(&target);
            if let Some((name, value)) = header {
                request = request.header(name, value);
            }
            let request =
                request.body(full(body)).map_err(|e| format!("the probe path {path:?} is not a path: {e}"))?;
            match tokio::time::timeout(Duration::from_secs(10), client.request(request)).await {
                Ok(Ok(response)) => {
                    let (status, headers) = (response.status(), response.headers().clone());
                    drop(response);
                    Ok((status, headers))
                }
                Ok(Err(e)) => Err(format!("the probe {method} of {target} failed: {e}")),
                Err(_) => Err(format!("the probe {method} of {target} was not answered within 10s")),
            }
        }
    };
    let body = &b"fencekeeper precondition probe\n"[..];
    let (status, _) = send(Method::PUT, Some((IF_MATCH, stale.clone())), body).await?;
    match status {
        StatusCode::PRECONDITION_FAILED | StatusCode::NOT_FOUND => {}
        s if s.is_success() => {
            return Err(format!(
                "the store at {authority} ignores If-Match: it applied the probe PUT to {path} ({s}) whose If-Match \
                 names no version it has, so it cannot enforce conditional writes; put --conditional-writes only in \
                 front of a store that honours If-Match (docs/operations.md)"
            ))
        }
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            return Err(format!(
                "the store at {authority} refused the probe PUT to {path} ({status}): it wants credentials the \
                 gateway does not have. If the store honours If-Match on writes (docs/operations.md lists which do), \
                 start with --precondition-probe off to vouch for it"
            ))
        }
        s => {
            return Err(format!(
                "the store at {authority} answered the probe PUT to {path} with {s}, not 412: it cannot be told to \
                 honour If-Match; choose another --precondition-probe path, or --precondition-probe off to vouch for it"
            ))
        }
    }
    // Deletes: on an object that exists, a stale If-Match must be refused.
    let (status, headers) = send(Method::PUT, Some((IF_NONE_MATCH, "*".to_owned())), body).await?;
    let etag = |headers: &HeaderMap| headers.get(ETAG).and_then(|v| Version::tag(v.as_bytes()).ok());
    let current = match status {
        s if s.is_success() => etag(&headers),
        StatusCode::PRECONDITION_FAILED => etag(&send(Method::HEAD, None, b"").await?.1),
        _ => None,
    };
    let Some(Version::Tag(current)) = current else {
        tracing::warn!(path, "the probe could not learn its object's ETag: deletes are refused (501), unverified");
        return Ok(Probed { deletes: false });
    };
    let (status, _) = send(Method::DELETE, Some((IF_MATCH, stale)), b"").await?;
    let deletes = status == StatusCode::PRECONDITION_FAILED;
    if deletes {
        let (status, _) = send(Method::DELETE, Some((IF_MATCH, current)), b"").await?;
        if !status.is_success() {
            tracing::warn!(path, %status, "the probe object could not be deleted; it stays in the store");
        }
    } else {
        tracing::warn!(
            path,
            %status,
            "the store ignores If-Match on DELETE (it answered a stale one {status}): deletes are refused (501)"
        );
    }
    Ok(Probed { deletes })
}
