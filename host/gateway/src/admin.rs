//! The admin listener, apart from the proxied port so that no store path can collide
//! with it and it can stay on loopback while the proxy listens wider:
//!
//! * `GET /metrics`: Prometheus text;
//! * `GET /fencekeeper/marks/<resource>`: a resource's mark, read-only (`404` when it has
//!   none, naming the retention floor it is held to if a compaction raised one); the
//!   resource is the rest of the path, percent-decoded, so the path resource
//!   `/import/a` is `GET /fencekeeper/marks//import/a`;
//! * `GET /fencekeeper/marks`: every mark, one `resource<TAB>mark` line each (where the
//!   store can list);
//! * `GET /healthz`: `ok` once the gateway serves;
//! * `GET /readyz`: `ready` once it admits fenced writes, its mark store answers a
//!   read and its upstream takes a connection; `503` with the reason during its start
//!   grace (`--start-grace`), while the mark store (etcd, or the file) cannot be read
//!   (every fenced write would be refused 503), or while the upstream cannot be
//!   reached (a write would advance its mark and then fail 502), so that a load
//!   balancer can route around it meanwhile.

use crate::proxy::Proxy;
use crate::refusal::full;
use crate::Body;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;

const MARKS: &str = "/fencekeeper/marks";

/// Answer one admin request.
pub async fn handle(proxy: Arc<Proxy>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path().to_owned();
    let answer = match (request.method(), path.as_str()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, proxy.render_metrics()),
        (&Method::GET, "/healthz") => (StatusCode::OK, "ok\n".to_owned()),
        (&Method::GET, "/readyz") => match proxy.start_grace_left() {
            None => match (store_readable(&proxy).await, upstream_reachable(&proxy).await) {
                (Ok(()), Ok(())) => (StatusCode::OK, "ready\n".to_owned()),
                (Err(why), _) | (_, Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            },
            Some(left) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("in its start grace: fenced writes refused for {:.1}s more\n", left.as_secs_f64()),
            ),
        },
        (&Method::GET, MARKS) => list(&proxy).await,
        (&Method::GET, p) if p.starts_with("/fencekeeper/marks/") => match resource_key(&p[MARKS.len() + 1..]) {
            Ok(resource) => mark(&proxy, resource).await,
            Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "admin endpoints: /metrics, /fencekeeper/marks/<resource>, /healthz, /readyz\n".to_owned(),
        ),
    };
    let mut response = Response::new(full(answer.1));
    *response.status_mut() = answer.0;
    Ok(response)
}

/// How long `/readyz` waits for the mark store to answer a read.
const STORE_READ: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the mark store answers a read now (of a key no request can name: the
/// answer is no mark, or a refusal of why not).
async fn store_readable(proxy: &Proxy) -> Result<(), String> {
    let guard = proxy.guard().clone();
    let read = tokio::task::spawn_blocking(move || guard.mark("fencekeeper readyz").map(|_| ()));
    let unreadable = |why: String| format!("the mark store cannot be read: {why}");
    match tokio::time::timeout(STORE_READ, read).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(unreadable(e.to_string())),
        Ok(Err(e)) => Err(unreadable(e.to_string())),
        Err(_) => Err(unreadable(format!("no answer within {STORE_READ:?}"))),
    }
}

/// How long `/readyz` waits for the upstream to take a connection.
const UPSTREAM_CONNECT: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the upstream takes a TCP connection now (the request is not sent).
async fn upstream_reachable(proxy: &Proxy) -> Result<(), String> {
    let upstream = &proxy.config().upstream;
    let host = upstream.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let port = upstream.port_u16().unwrap_or(80);
    let unreachable = |why: String| format!("the upstream {host}:{port} cannot be reached: {why}");
    match tokio::time::timeout(UPSTREAM_CONNECT, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(unreachable(e.to_string())),
        Err(_) => Err(unreachable(format!("no connection within {UPSTREAM_CONNECT:?}"))),
    }
}

async fn mark(proxy: &Arc<Proxy>, resource: String) -> (StatusCode, String) {
    let guard = proxy.guard().clone();
    let read = tokio::task::spawn_blocking(move || {
        let mark = guard.mark(&resource)?;
        // Without a mark of its own, a resource is held to the retention floor.
        let floor = if mark.is_none() { guard.store().floor()? } else { None };
        Ok::<_, fencekeeper::StoreError>((resource, mark, floor))
    })
    .await;
    match read {
        Ok(Ok((_, Some(mark), _))) => (StatusCode::OK, format!("{mark}\n")),
        Ok(Ok((resource, None, None))) => (StatusCode::NOT_FOUND, format!("no mark for {resource:?}\n")),
        Ok(Ok((resource, None, Some(floor)))) => (
            StatusCode::NOT_FOUND,
            format!(
                "no mark for {resource:?}; it is held to the retention floor {floor} (a token below it is refused)\n"
            ),
        ),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

async fn list(proxy: &Arc<Proxy>) -> (StatusCode, String) {
    let guard = proxy.guard().clone();
    match tokio::task::spawn_blocking(move || guard.store().list()).await {
        Ok(Ok(marks)) => (StatusCode::OK, marks.iter().map(|(r, m)| format!("{r}\t{m}\n")).collect()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

/// The resource named by the rest of an admin path, decoded by the same rule as a
/// request path's key, so that the key a request is fenced on is the key looked up.
fn resource_key(rest: &str) -> Result<String, fencekeeper_core::ResourceError> {
    let bytes: Vec<u8> = fencekeeper_core::resource::path_key_bytes(rest.as_bytes()).collect();
    fencekeeper_core::resource::key_from_bytes(&bytes).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::resource_key;

    #[test]
    fn resources_are_decoded_as_request_keys_are() {
        assert_eq!(resource_key("%2Fimport%2Fa").as_deref(), Ok("/import/a"));
        assert_eq!(resource_key("/import/a b").as_deref(), Ok("/import/a b"));
        assert_eq!(resource_key("100%").as_deref(), Ok("100%"), "a lone % stays, as in request paths");
        assert!(resource_key("%FF").is_err());
    }
}
