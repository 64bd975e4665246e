//! TLS, on both sides of the gateway (rustls, the ring provider the etcd client uses):
//!
//! * the listener's certificate and key ([`Listener`]), read at start, where a bad file
//!   is a one-line error, and read again when either file changes (a renewal), where a
//!   bad file keeps the certificate in use and says why in the log;
//! * the upstream's trust ([`Connector`]): an `https://` store is checked against one CA
//!   file, the only root trusted, and the name in the upstream's address.

use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::SystemTime;
use tokio::net::TcpStream;

/// Why TLS could not be set up: one line, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read. (The reason is in the line, not a source: the log
    /// of a reload prints the line alone.)
    #[error("cannot read {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A file holds no PEM item of the kind needed.
    #[error("{path} holds no PEM {what}")]
    NoPem {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
    },
    /// rustls refused what the files hold (a key that is not the certificate's, ...).
    #[error("{what}: {why}")]
    Refused {
        /// What was being set up.
        what: String,
        /// rustls's reason.
        why: String,
    },
}

/// The listener's certificate chain and private key (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's own first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Io { path: path.to_owned(), error })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsError::NoPem { path: path.to_owned(), what: "certificate" });
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn refused(what: impl Into<String>) -> impl FnOnce(rustls::Error) -> TlsError {
    let what = what.into();
    move |e| TlsError::Refused { what, why: e.to_string() }
}

/// The listener's configuration from `files`: HTTP/2 and HTTP/1.1 offered (ALPN), as
/// the listener serves both.
fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?)
        .map_err(|_| TlsError::NoPem { path: files.key.clone(), what: "private key" })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(refused("TLS"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(refused(format!("the certificate {} with the key {}", files.cert.display(), files.key.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// When the certificate and key files were last changed, and how long they are: a
/// renewal changes one.
type Stamp = Option<[(SystemTime, u64); 2]>;

fn stamp(files: &TlsFiles) -> Stamp {
    let of = |p: &Path| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
    Some([of(&files.cert)?, of(&files.key)?])
}

/// The listener's TLS: the configuration in use, replaced when the files change.
pub struct Listener {
    files: TlsFiles,
    current: RwLock<(Arc<rustls::ServerConfig>, Stamp)>,
}

impl Listener {
    /// Read `files`: an error names the file and why.
    pub fn load(files: TlsFiles) -> Result<Listener, TlsError> {
        let stamp = stamp(&files);
        let config = server_config(&files)?;
        Ok(Listener { files, current: RwLock::new((config, stamp)) })
    }

    /// What accepts a connection now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let current = self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        tokio_rustls::TlsAcceptor::from(current.0.clone())
    }

    /// Read the files again if either changed since they were read: `Ok(true)` when
    /// the new certificate is in use, `Ok(false)` when nothing changed, an error when
    /// the new files are bad (the old certificate stays; the same files are not tried
    /// again until they change once more).
    pub fn refresh(&self) -> Result<bool, TlsError> {
        let now = stamp(&self.files);
        {
            let current = self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if now == current.1 {
                return Ok(false);
            }
        }
        let loaded = server_config(&self.files);
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        current.1 = now;
        current.0 = loaded?;
        Ok(true)
    }
}

/// The client configuration for an `https://` upstream: `ca` is the only root
/// trusted; ALPN offers HTTP/2 alone when the upstream is spoken to in HTTP/2.
pub fn client_config(ca: &Path, http2: bool) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca)? {
        roots.add(cert).map_err(refused(format!("the CA {}", ca.display())))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(refused("TLS"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = if http2 { vec![b"h2".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    Ok(Arc::new(config))
}

/// How the gateway connects to the upstream: TCP, then TLS for an `https://` one.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl Connector {
    /// A connector; with `tls`, every connection is TLS, checked with it.
    pub fn new(tls: Option<Arc<rustls::ClientConfig>>) -> Connector {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        // The scheme is this connector's to honour: https is TLS over this TCP.
        http.enforce_http(false);
        Connector { http, tls: tls.map(tokio_rustls::TlsConnector::from) }
    }
}

/// A connection to the upstream.
pub enum Stream {
    /// Plain TCP.
    Plain(TokioIo<TcpStream>),
    /// TLS over TCP.
    Tls(Box<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>),
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
        let connecting = self.http.call(uri);
        Box::pin(async move {
            let tcp = connecting.await?;
            let Some(tls) = tls else { return Ok(Stream::Plain(tcp)) };
            let name = ServerName::try_from(host).map_err(|e| format!("the upstream's name: {e}"))?;
            let stream = tls.connect(name, tcp.into_inner()).await?;
            Ok(Stream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(s) => s.connected(),
            Stream::Tls(s) => {
                let h2 = s.inner().get_ref().1.alpn_protocol() == Some(b"h2");
                let connected = s.inner().get_ref().0.connected();
                if h2 {
                    connected.negotiated_h2()
                } else {
                    connected
                }
            }
        }
    }
}

impl hyper::rt::Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
