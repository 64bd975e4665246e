//! The client: its v3 gRPC API over HTTP/2, plaintext or TLS, with a user when the
//! cluster has authentication on. The mark store and the provenance check share one
//! when they talk to the same etcd: one connection, and one record of the highest
//! revision any answer carried (revisions only grow, so a token at or below it was
//! issued; the weak provenance check then needs no round trip).

use super::channel::{Channel, Target};
use super::EtcdError;
use fencekeeper_etcd_wire::grpc::RangePage;
use fencekeeper_etcd_wire::{grpc, AuthRefusal, TxnAnswer};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How to reach etcd: the per-call timeout, and for clusters that require them, TLS
/// and a user.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// How long one call may take.
    pub timeout: Duration,
    /// TLS: required for an `https://` endpoint, refused for an `http://` one (a
    /// store configured for TLS never talks plaintext).
    pub tls: Option<EtcdTls>,
    /// etcd's user and password authentication.
    pub auth: Option<EtcdAuth>,
    /// The runtime that drives the connection. `None`: a one-thread runtime of the
    /// client's own, which serves callers on any thread. A host that awaits the
    /// client's calls on a tokio runtime of its own (the gateway) gives that runtime's
    /// handle: the connection is then read and written by the same threads that await
    /// it, with no thread hop each way. Its blocking calls must then come from other
    /// threads than that runtime's workers (its blocking pool, threads of their own).
    pub runtime: Option<tokio::runtime::Handle>,
}

impl Default for EtcdOptions {
    fn default() -> EtcdOptions {
        EtcdOptions { timeout: Duration::from_secs(2), tls: None, auth: None, runtime: None }
    }
}

/// The PEM files of a TLS connection to etcd.
#[derive(Clone, Debug)]
pub struct EtcdTls {
    /// The CA that signed etcd's server certificate (the only root trusted).
    pub ca: PathBuf,
    /// The client certificate, for a cluster that asks for one (with `key`).
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub key: Option<PathBuf>,
}

/// One member's address as the channel dials it: `http://HOST:PORT`, or
/// `https://HOST:PORT` with [`EtcdOptions::tls`].
fn target(endpoint: &str, options: &EtcdOptions) -> Result<Target, EtcdError> {
    let bad = |why: &str| EtcdError::Settings(format!("etcd endpoint {endpoint:?}: {why}"));
    let (scheme, authority) = endpoint.split_once("://").unwrap_or(("", ""));
    let (host, port) = authority.rsplit_once(':').unwrap_or(("", ""));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let mut target = Target { authority: authority.to_owned(), tls: None };
    match (scheme, &options.tls) {
        _ if host.is_empty() || authority.contains('/') || port.parse::<u16>().is_err() => {
            return Err(bad("must look like http://HOST:PORT or https://HOST:PORT"))
        }
        ("http", None) => {}
        ("http", Some(_)) => {
            return Err(bad("TLS files are given but the endpoint is http://; write https:// (never plaintext)"))
        }
        ("https", Some(tls)) => {
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| bad(&format!("{host:?} is not a name TLS can check: {e}")))?;
            target.tls = Some((rustls_config(tls)?, name));
        }
        ("https", None) => return Err(bad("https:// needs the CA of etcd's certificate (--etcd-cacert)")),
        _ => return Err(bad("must look like http://HOST:PORT or https://HOST:PORT")),
    }
    Ok(target)
}

/// An etcd user.
#[derive(Clone)]
pub struct EtcdAuth {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth").field("user", &self.user).finish_non_exhaustive()
    }
}

/// A connection to etcd's gRPC API: the endpoint, TLS, and the user's token.
pub struct EtcdClient {
    endpoint: String,
    channel: Channel,
    auth: Option<EtcdAuth>,
    /// The token of `auth`, renewed when etcd refuses it.
    token: RwLock<Option<String>>,
    /// The highest revision any answer carried (0 before the first).
    revision: AtomicU64,
}

impl EtcdClient {
    /// A client for `endpoint` (`http://HOST:PORT`, or `https://HOST:PORT` with
    /// [`EtcdOptions::tls`]), or for the members of one cluster, comma-separated
    /// (`http://10.0.0.1:2379,http://10.0.0.2:2379`): it talks to one at a time and
    /// fails over to the next. Nothing is sent yet.
    pub fn new(endpoint: &str, options: &EtcdOptions) -> Result<EtcdClient, EtcdError> {
        let endpoint = endpoint.trim().trim_end_matches('/').to_owned();
        let targets = endpoint
            .split(',')
            .map(|member| target(member.trim().trim_end_matches('/'), options))
            .collect::<Result<Vec<Target>, EtcdError>>()?;
        let bad = |why: &str| EtcdError::Settings(format!("etcd endpoint {endpoint:?}: {why}"));
        Ok(EtcdClient {
            endpoint: endpoint.clone(),
            channel: Channel::new(targets, options.timeout, options.runtime.clone()).map_err(|e| bad(&e))?,
            auth: options.auth.clone(),
            token: RwLock::new(None),
            revision: AtomicU64::new(0),
        })
    }

    /// Remember that the cluster has reached `revision`.
    pub fn saw(&self, revision: u64) {
        self.revision.fetch_max(revision, Relaxed);
    }

    /// The highest revision any answer carried (0 before the first).
    pub fn revision(&self) -> u64 {
        self.revision.load(Relaxed)
    }

    /// The endpoint, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// An error naming this etcd.
    pub fn unavailable(&self, detail: impl std::fmt::Display) -> EtcdError {
        EtcdError::Unavailable(format!("etcd at {}: {detail}", self.endpoint))
    }

    /// One Txn (`message`: a `TxnRequest`), its answer parsed; the revision it
    /// answered at is remembered ([`EtcdClient::revision`]).
    pub fn txn(&self, message: &[u8]) -> Result<TxnAnswer, EtcdError> {
        self.block_on(self.txn_async(message))
    }

    /// [`EtcdClient::txn`], awaited (on a tokio runtime with a timer) rather than
    /// blocked on.
    pub async fn txn_async(&self, message: &[u8]) -> Result<TxnAnswer, EtcdError> {
        let answer = self.unary_async(grpc::KV_SERVICE, grpc::TXN_METHOD, message).await?;
        let answer = grpc::parse_txn(&answer).map_err(|e| self.unavailable(e))?;
        self.saw(answer.revision);
        Ok(answer)
    }

    /// One plain read (`message`: a `RangeRequest`, [`grpc::range_request`]),
    /// linearizable; the revision it answered at is remembered.
    pub fn range(&self, message: &[u8]) -> Result<RangePage, EtcdError> {
        self.range_page(message, None)
    }

    /// [`EtcdClient::range`] within `timeout` instead of the client's own: for reads
    /// etcd takes longer over (a listing's, which etcd 3.4 makes count every key of
    /// its range), never on a write's path.
    pub fn range_within(&self, message: &[u8], timeout: Duration) -> Result<RangePage, EtcdError> {
        self.range_page(message, Some(timeout))
    }

    fn range_page(&self, message: &[u8], timeout: Option<Duration>) -> Result<RangePage, EtcdError> {
        let answer = self.block_on(self.unary_within(timeout, grpc::KV_SERVICE, grpc::RANGE_METHOD, message))?;
        let page = grpc::parse_range(&answer).map_err(|e| self.unavailable(e))?;
        self.saw(page.revision);
        Ok(page)
    }

    /// One call of etcd's gRPC API (`service`/`method`, e.g. [`grpc::LEASE_SERVICE`]/
    /// [`grpc::LEASE_GRANT_METHOD`]) with one request message: etcd's one answer. With
    /// a user, the call carries its token; a token etcd no longer accepts is renewed
    /// once. A refusal (a gRPC status) is an error naming it.
    pub fn unary(&self, service: &str, method: &str, message: &[u8]) -> Result<Vec<u8>, EtcdError> {
        self.block_on(self.unary_async(service, method, message))
    }

    /// [`EtcdClient::unary`], awaited (on a tokio runtime with a timer) rather than
    /// blocked on.
    pub async fn unary_async(&self, service: &str, method: &str, message: &[u8]) -> Result<Vec<u8>, EtcdError> {
        self.unary_within(None, service, method, message).await
    }

    /// [`EtcdClient::unary_async`] within `timeout` (`None`: the client's own).
    async fn unary_within(
        &self,
        timeout: Option<Duration>,
        service: &str,
        method: &str,
        message: &[u8],
    ) -> Result<Vec<u8>, EtcdError> {
        let token = match &self.auth {
            Some(_) => Some(self.token(false).await?),
            None => None,
        };
        let call = async |token: Option<&str>| {
            self.channel.call_within(timeout, service, method, message, token).await.map_err(|e| self.unavailable(e))
        };
        let refused = |status: grpc::Status| match status.code {
            grpc::PERMISSION_DENIED => EtcdError::Denied(format!("etcd at {}: {}", self.endpoint, status.error())),
            _ => self.unavailable(status.error()),
        };
        match call(token.as_deref()).await? {
            Err(status) if self.auth.is_some() && grpc::token_refused(&status) => {
                call(Some(&self.token(true).await?)).await?.map_err(refused)
            }
            answer => answer.map_err(refused),
        }
    }

    /// Run `future` (this client's calls) to its end on this thread, which blocks
    /// meanwhile; from any thread, one of another runtime's included.
    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.channel.block_on(future)
    }

    /// The user's token: the one held, or a new one when `renew` or none is held.
    async fn token(&self, renew: bool) -> Result<String, EtcdError> {
        if !renew {
            if let Some(t) = self.token.read().unwrap_or_else(|p| p.into_inner()).clone() {
                return Ok(t);
            }
        }
        let Some(auth) = &self.auth else {
            return Err(self.unavailable("no user to authenticate"));
        };
        let mut request = grpc::authenticate(&auth.user, &auth.password);
        let answer = self.channel.call(grpc::AUTH_SERVICE, grpc::AUTHENTICATE_METHOD, &request, None).await;
        // The password was in it.
        request.fill(0);
        let token = grpc::parse_authentication(answer.map_err(|e| self.unavailable(e))?.as_deref()).map_err(|e| {
            let (AuthRefusal::WrongCredentials(why) | AuthRefusal::Other(why)) = e;
            self.unavailable(format!("authenticating as {:?}: {why}", auth.user))
        })?;
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
        Ok(token)
    }
}

/// The TLS configuration of `tls`: its CA as the only root, its client certificate
/// if any, ALPN h2 (etcd serves gRPC on HTTP/2). Each file that cannot be read or
/// holds no PEM item of the right kind is one line naming it.
fn rustls_config(tls: &EtcdTls) -> Result<Arc<rustls::ClientConfig>, EtcdError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let pem_error = |path: &PathBuf, what: &str| EtcdError::Settings(format!("{} holds no PEM {what}", path.display()));
    let certs = |path: &PathBuf| -> Result<Vec<CertificateDer<'static>>, EtcdError> {
        let bytes = std::fs::read(path).map_err(|error| EtcdError::Io { path: path.clone(), error })?;
        let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes).filter_map(Result::ok).collect();
        if certs.is_empty() {
            return Err(pem_error(path, "certificate"));
        }
        Ok(certs)
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(&tls.ca)? {
        roots.add(cert).map_err(|e| EtcdError::Settings(format!("{}: {e}", tls.ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| EtcdError::Settings(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let mut config = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let bytes = std::fs::read(key).map_err(|error| EtcdError::Io { path: key.clone(), error })?;
            let private = PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| pem_error(key, "private key"))?;
            builder
                .with_client_auth_cert(certs(cert)?, private)
                .map_err(|e| EtcdError::Settings(format!("the client certificate {}: {e}", cert.display())))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(EtcdError::Settings(
                "a client certificate needs both its certificate and its key (--etcd-cert, --etcd-key)".into(),
            ))
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A transport error as one line (TLS errors come with their cause).
pub(super) fn error_line(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = s.source();
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}
