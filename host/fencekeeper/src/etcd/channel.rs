//! etcd's gRPC API: the mark store's Txns (its reads too), the provenance check's
//! reads and the authentication.
//!
//! etcd 3.4's JSON gateway is a proxy inside etcd that decodes the JSON and calls
//! etcd's own gRPC server over a loopback connection: measured on the same Txn, it
//! cost etcd 259 µs of CPU per call against 136 µs over gRPC. Every gateway admit
//! that is not refused outright is one such Txn, so the client sends them as protobuf
//! (`fencekeeper-etcd-wire`'s `grpc` module) over one HTTP/2 connection, which every
//! call in flight shares (HTTP/2 streams).
//!
//! The connection lives on a small runtime of its own (one worker thread), or on the
//! runtime a host gives it, which reads and writes the socket whoever calls: a call is a future ([`Channel::call`]) that a
//! host on a runtime of its own awaits (the gateway's admits), and that a synchronous
//! caller blocks its thread on ([`Channel::block_on`]) until the answer or the
//! timeout. The connection is opened on first use, and again after a call on it
//! failed or timed out. A refusal (a gRPC status) keeps it, but for UNAVAILABLE (a
//! member without a leader, or going down).
//!
//! Given several members of a cluster, the channel talks to one at a time and fails
//! over: a member that refuses the connection is passed over at once, within the same
//! call (nothing was sent to it); after a call that failed, timed out or found the
//! member unavailable, the next call opens a connection to the next member. A call
//! already sent is never sent again to another member: whether it was applied is not
//! known, and the caller decides (the mark store answers it undecided).

use bytes::{Buf, Bytes};
use fencekeeper_etcd_wire::grpc::{self, Status};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// gRPC's message prefix: a compression flag and a big-endian length.
const PREFIX_BYTES: usize = 5;

/// Where the channel connects, and how.
pub(super) struct Target {
    /// `HOST:PORT`.
    pub authority: String,
    /// TLS: the client configuration (ALPN h2) and the server's name.
    pub tls: Option<(Arc<rustls::ClientConfig>, rustls::pki_types::ServerName<'static>)>,
}

/// One HTTP/2 connection to etcd, reopened after a failure.
pub(super) struct Channel {
    /// The channel's own runtime, unless the host gave one (then `None`); shut down
    /// without waiting when dropped, which is allowed anywhere, even inside another
    /// runtime's task.
    runtime: Option<tokio::runtime::Runtime>,
    shared: Arc<Shared>,
    timeout: Duration,
}

/// Why a call got no answer from etcd: one line.
pub(super) type Failure = String;

impl Channel {
    /// A channel to `targets` (the members of one cluster, tried in turn) whose calls
    /// each take at most `timeout`, its connection driven by `runtime` (a runtime of
    /// its own when `None`).
    pub(super) fn new(
        targets: Vec<Target>,
        timeout: Duration,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<Channel, Failure> {
        let (own, handle) = match runtime {
            Some(handle) => (None, handle),
            None => {
                let own = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("fencekeeper-etcd")
                    .enable_io()
                    .enable_time()
                    .build()
                    .map_err(|e| format!("cannot start the etcd client's runtime: {e}"))?;
                let handle = own.handle().clone();
                (Some(own), handle)
            }
        };
        if targets.is_empty() {
            return Err("no etcd member to connect to".to_owned());
        }
        let shared = Arc::new(Shared {
            targets: targets.into_iter().map(Arc::new).collect(),
            current: AtomicUsize::new(0),
            runtime: handle,
            sender: Default::default(),
            connect_timeout: timeout,
        });
        Ok(Channel { runtime: own, shared, timeout })
    }

    /// Call `service`/`method` with `message`: etcd's answer, or its status when it
    /// refused, or why there is neither. Awaited on any tokio runtime with a timer (the
    /// timeout's), or on a thread that may block with [`Channel::block_on`].
    pub(super) async fn call(
        &self,
        service: &str,
        method: &str,
        message: &[u8],
        token: Option<&str>,
    ) -> Result<Result<Vec<u8>, Status>, Failure> {
        self.call_within(None, service, method, message, token).await
    }

    /// [`Channel::call`] within `timeout` (`None`: the channel's own).
    pub(super) async fn call_within(
        &self,
        timeout: Option<Duration>,
        service: &str,
        method: &str,
        message: &[u8],
        token: Option<&str>,
    ) -> Result<Result<Vec<u8>, Status>, Failure> {
        let path = format!("/{service}/{method}");
        self.shared.exchange(timeout.unwrap_or(self.timeout), &path, Bytes::from(frame(message)), token).await
    }

    /// Run `future` (calls of this channel) to its end on this thread, which blocks
    /// meanwhile. This works from any thread, including one that belongs to another
    /// runtime (a gateway's blocking pool): the future's timer is the channel's.
    pub(super) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        let _timer = self.shared.runtime.enter();
        crate::wait::block_on(future)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// What the calls in flight share: the members and the open connection.
struct Shared {
    targets: Vec<Arc<Target>>,
    /// The member the next connection goes to first (an index into `targets`).
    current: AtomicUsize,
    /// The channel's runtime, where the connection is opened and driven.
    runtime: tokio::runtime::Handle,
    /// The open connection, and the member it goes to.
    sender: tokio::sync::Mutex<Option<(h2::client::SendRequest<Bytes>, usize)>>,
    /// The longest one member's connection may take to open, with several members: a
    /// frozen one must not take a call's whole budget.
    connect_timeout: Duration,
}

/// gRPC's UNAVAILABLE: etcd's for a member without a leader or shutting down.
const UNAVAILABLE: u32 = 14;

impl Shared {
    /// One call, within `timeout` (the connection's opening included).
    async fn exchange(
        &self,
        timeout: Duration,
        path: &str,
        message: Bytes,
        token: Option<&str>,
    ) -> Result<Result<Vec<u8>, Status>, Failure> {
        let call = async {
            let (sender, member) = self.ready().await?;
            send(sender, &self.targets[member], path, message, token).await
        };
        let answer = tokio::time::timeout(timeout, call)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} ms", timeout.as_millis())));
        if matches!(&answer, Err(_) | Ok(Err(Status { code: UNAVAILABLE, .. }))) {
            // The connection, or its member, may be what failed or hangs: the next call
            // opens a new one, to the next member. (When another call holds the lock it
            // is opening one already.)
            if let Ok(mut held) = self.sender.try_lock() {
                if let Some((_, member)) = held.take() {
                    self.current.store((member + 1) % self.targets.len(), Relaxed);
                }
            }
        }
        answer
    }

    /// A sender ready for a new stream: the open connection's or, when that one has
    /// closed meanwhile (etcd restarted, a proxy dropped it), a new connection's.
    /// Nothing was sent on the closed one, so opening another is safe for any call.
    /// With several members, each is tried in turn from the current one, until one
    /// accepts.
    async fn ready(&self) -> Result<(h2::client::SendRequest<Bytes>, usize), Failure> {
        let mut held = self.sender.lock().await;
        if let Some((sender, member)) = held.clone() {
            match sender.ready().await {
                Ok(ready) => return Ok((ready, member)),
                Err(_) => {
                    *held = None;
                    self.current.store((member + 1) % self.targets.len(), Relaxed);
                }
            }
        }
        let n = self.targets.len();
        let first = self.current.load(Relaxed) % n;
        let mut failures = Vec::new();
        for member in (first..n).chain(0..first) {
            // Opened on the channel's runtime, so that the connection is driven there
            // whichever runtime the call came from (and outlives it).
            let target = self.targets[member].clone();
            let opened = self.runtime.spawn(async move { connect(&target).await });
            let opened = if n > 1 {
                tokio::time::timeout(self.connect_timeout / 2, opened)
                    .await
                    .unwrap_or_else(|_| Ok(Err("no connection within half the call's timeout".to_owned())))
            } else {
                opened.await
            };
            match opened.map_err(|e| format!("opening the connection failed: {e}")).and_then(|o| o) {
                Ok(sender) => {
                    self.current.store(member, Relaxed);
                    *held = Some((sender.clone(), member));
                    return sender.ready().await.map(|ready| (ready, member)).map_err(h2_error);
                }
                Err(e) if n > 1 => failures.push(format!("{}: {e}", self.targets[member].authority)),
                Err(e) => return Err(e),
            }
        }
        Err(format!("no member answered ({})", failures.join("; ")))
    }
}

async fn connect(target: &Target) -> Result<h2::client::SendRequest<Bytes>, Failure> {
    let tcp = TcpStream::connect(&target.authority).await.map_err(|e| format!("cannot connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    match &target.tls {
        None => handshake(tcp).await,
        Some((config, name)) => {
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name.clone(), tcp)
                .await
                .map_err(|e| format!("TLS: {}", super::client::error_line(&e)))?;
            handshake(tls).await
        }
    }
}

async fn handshake<T>(io: T) -> Result<h2::client::SendRequest<Bytes>, Failure>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = h2::client::handshake(io)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}; does this endpoint speak gRPC (HTTP/2)?"))?;
    // The connection is driven by the runtime's worker until it fails or is dropped.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// One call on a sender ready for a new stream ([`Shared::ready`]).
async fn send(
    mut sender: h2::client::SendRequest<Bytes>,
    target: &Target,
    path: &str,
    message: Bytes,
    token: Option<&str>,
) -> Result<Result<Vec<u8>, Status>, Failure> {
    let h2 = h2_error;
    let scheme = if target.tls.is_some() { "https" } else { "http" };
    let mut request = http::Request::post(format!("{scheme}://{}{path}", target.authority))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header(grpc::TOKEN_METADATA, token);
    }
    let request = request.body(()).map_err(|e| format!("the request: {e}"))?;
    let (response, mut body) = sender.send_request(request, false).map_err(h2)?;
    body.send_data(message, true).map_err(h2)?;
    let response = response.await.map_err(h2)?;
    let (head, mut answer) = response.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(format!("HTTP status {} instead of gRPC's 200", head.status.as_u16()));
    }
    // A refusal may come "trailers-only", its status among the headers.
    if let Some(status) = status_of(&head.headers) {
        return Ok(Err(status));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = answer.data().await {
        let chunk = chunk.map_err(h2)?;
        let _ = answer.flow_control().release_capacity(chunk.len());
        if bytes.len() + chunk.len() > PREFIX_BYTES + grpc::MAX_ANSWER_BYTES {
            return Err(format!("an answer longer than {} bytes", grpc::MAX_ANSWER_BYTES));
        }
        bytes.extend_from_slice(chunk.chunk());
    }
    let trailers = answer.trailers().await.map_err(h2)?.unwrap_or_default();
    match status_of(&trailers) {
        Some(status) => Ok(Err(status)),
        None if trailers.contains_key("grpc-status") => unframe(bytes).map(Ok),
        None => Err("an answer without a gRPC status".to_owned()),
    }
}

/// An HTTP/2 error as one line.
fn h2_error(e: h2::Error) -> Failure {
    match e.reason() {
        // An HTTP/1.1 answer to HTTP/2's preface reads as a malformed frame.
        Some(h2::Reason::PROTOCOL_ERROR | h2::Reason::FRAME_SIZE_ERROR) if !e.is_remote() => {
            format!("HTTP/2: {e}; does this endpoint speak gRPC (HTTP/2)?")
        }
        _ => format!("HTTP/2: {e}"),
    }
}

/// A message with gRPC's prefix (uncompressed).
fn frame(message: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(PREFIX_BYTES + message.len());
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    framed
}

/// The one message of an answer.
fn unframe(mut bytes: Vec<u8>) -> Result<Vec<u8>, Failure> {
    let Some(prefix) = bytes.get(..PREFIX_BYTES) else {
        return Err(format!("an answer of {} bytes, shorter than gRPC's prefix", bytes.len()));
    };
    if prefix[0] != 0 {
        return Err("a compressed answer (none was asked for)".to_owned());
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if len != bytes.len() - PREFIX_BYTES {
        return Err(format!("an answer whose prefix says {len} bytes but carries {}", bytes.len() - PREFIX_BYTES));
    }
    bytes.drain(..PREFIX_BYTES);
    Ok(bytes)
}

/// The status a header map carries, unless it is OK or absent.
fn status_of(headers: &http::HeaderMap) -> Option<Status> {
    let code = headers.get("grpc-status")?.to_str().ok()?.trim().parse::<u32>().unwrap_or(2);
    if code == 0 {
        return None;
    }
    let message = headers.get("grpc-message").map(|m| percent_decoded(m.as_bytes())).unwrap_or_default();
    Some(Status { code, message })
}

/// `grpc-message` is percent-encoded UTF-8.
fn percent_decoded(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (raw[i], raw.get(i + 1).copied().and_then(hex), raw.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_through_the_prefix() {
        let framed = frame(b"abc");
        assert_eq!(&framed[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(unframe(framed).unwrap(), b"abc");
    }

    #[test]
    fn a_bad_prefix_is_a_one_line_failure() {
        assert!(unframe(vec![0, 0]).unwrap_err().contains("shorter"));
        assert!(unframe(vec![1, 0, 0, 0, 0]).unwrap_err().contains("compressed"));
        assert!(unframe(vec![0, 0, 0, 0, 9, 1]).unwrap_err().contains("says 9 bytes but carries 1"));
    }

    #[test]
    fn statuses_come_from_headers_or_trailers_and_ok_is_none() {
        let mut h = http::HeaderMap::new();
        assert_eq!(status_of(&h), None);
        h.insert("grpc-status", "0".parse().unwrap());
        assert_eq!(status_of(&h), None);
        h.insert("grpc-status", "16".parse().unwrap());
        h.insert("grpc-message", "etcdserver:%20invalid%20auth%20token".parse().unwrap());
        assert_eq!(status_of(&h), Some(Status { code: 16, message: "etcdserver: invalid auth token".into() }));
    }
}
