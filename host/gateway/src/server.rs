//! Listeners and connections. Binding happens before the runtime serves, so a taken
//! port is reported at start-up; shutdown stops accepting, lets the requests in
//! flight finish (bounded by the longest a request may take), then returns.

use crate::admin;
use crate::config::Config;
use crate::proxy::Proxy;
use crate::registry::Registry;
use fencekeeper::audit::AuditLog;
use fencekeeper::chain::ChainStore;
use fencekeeper::Guard;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

/// The gateway could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another process listens on the address.
    #[error("address {0} is in use")]
    InUse(SocketAddr),
    /// The address could not be bound for another reason.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving failed: {0}")]
    Io(#[from] std::io::Error),
    /// The audit log cannot be opened.
    #[error("{0}")]
    Audit(std::io::Error),
    /// The listener's certificate or key cannot be used.
    #[error("the listener's TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The configuration is inconsistent.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
}

/// A bound gateway, ready to [`Server::run`].
pub struct Server {
    proxy: Arc<Proxy>,
    listener: TcpListener,
    admin: Option<TcpListener>,
    tls: Option<Arc<crate::tls::Listener>>,
}

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the listener's certificate files are looked at for a change.
const TLS_RELOAD_EVERY: Duration = Duration::from_secs(1);

fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let listener = TcpListener::bind(addr).map_err(|source| match source.kind() {
        std::io::ErrorKind::AddrInUse => ServeError::InUse(addr),
        _ => ServeError::Bind { addr, source },
    })?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The proxy's and the admin's listening sockets, bound before anything else is
/// opened: an address in use then fails the start before a mark store or a journal is
/// created.
pub struct Listeners {
    listener: TcpListener,
    admin: Option<TcpListener>,
}

impl Listeners {
    /// Bind the proxy and admin addresses of `config`.
    pub fn bind(config: &Config) -> Result<Listeners, ServeError> {
        let listener = bind(config.listen)?;
        let admin = config.admin.map(bind).transpose()?;
        Ok(Listeners { listener, admin })
    }
}

impl Server {
    /// Bind the proxy and admin addresses of `config`, and open its audit log. With a
    /// `registry`, writes are ordered across every instance that shares it; with
    /// `chains`, every admitted write goes with a precondition (conditional writes).
    pub fn bind(
        config: Config,
        guard: Arc<Guard>,
        registry: Option<Arc<Registry>>,
        chains: Option<Arc<dyn ChainStore>>,
    ) -> Result<Server, ServeError> {
        let listeners = Listeners::bind(&config)?;
        Server::on(listeners, config, guard, registry, chains)
    }

    /// [`Server::bind`] on `listeners` bound already.
    pub fn on(
        listeners: Listeners,
        config: Config,
        guard: Arc<Guard>,
        registry: Option<Arc<Registry>>,
        chains: Option<Arc<dyn ChainStore>>,
    ) -> Result<Server, ServeError> {
        config.check_tls()?;
        let tls = config.tls.clone().map(crate::tls::Listener::load).transpose()?.map(Arc::new);
        let audit = config.audit.as_ref().map(AuditLog::open).transpose().map_err(ServeError::Audit)?;
        let Listeners { listener, admin } = listeners;
        let proxy = Arc::new(Proxy::new(config, guard, audit, registry, chains));
        Ok(Server { proxy, listener, admin, tls })
    }

    /// Where clients connect (with the real port when the configuration said 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Where the admin endpoints answer.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The request handler (for its metrics).
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// Serve until `shutdown` completes, then finish the requests in flight.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
        let listener = tokio::net::TcpListener::from_std(self.listener)?;
        let admin_task = match self.admin {
            Some(admin) => {
                let (admin, proxy) = (tokio::net::TcpListener::from_std(admin)?, self.proxy.clone());
                Some(tokio::spawn(serve_admin(admin, proxy)))
            }
            None => None,
        };
        let graceful = GracefulShutdown::new();
        let builder = auto::Builder::new(TokioExecutor::new());
        let reload = self.tls.clone().map(|tls| tokio::spawn(reload_certificate(tls)));
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, client) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of file descriptors and the like: keep serving the rest.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let proxy = self.proxy.clone();
                    let service = service_fn(move |request: Request<Incoming>| proxy.clone().handle(request, client));
                    let Some(tls) = &self.tls else {
                        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service).into_owned());
                        tokio::spawn(async move {
                            if let Err(e) = connection.await {
                                tracing::debug!(error = %e, "connection ended with an error");
                            }
                        });
                        continue;
                    };
                    // The handshake runs in the connection's own task: a slow client
                    // holds up nobody else.
                    let (acceptor, builder, watcher) = (tls.acceptor(), builder.clone(), graceful.watcher());
                    tokio::spawn(async move {
                        let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(e)) => return tracing::debug!(error = %e, %client, "TLS handshake failed"),
                            Err(_) => return tracing::debug!(%client, "TLS handshake timed out"),
                        };
                        let connection = watcher.watch(builder.serve_connection(TokioIo::new(stream), service).into_owned());
                        if let Err(e) = connection.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                () = &mut shutdown => break,
            }
        }
        drop(listener);
        let config = self.proxy.config();
        // A request admitted now may wait at the gate and then for the upstream.
        let bound = config.request_timeout + config.gate_timeout + Duration::from_secs(1);
        tracing::info!(connections = graceful.count(), "shutting down: finishing requests in flight");
        if tokio::time::timeout(bound, graceful.shutdown()).await.is_err() {
            tracing::warn!("requests still in flight after {bound:?}; stopping anyway");
        }
        if let Some(task) = admin_task {
            task.abort();
        }
        if let Some(task) = reload {
            task.abort();
        }
        Ok(())
    }
}

/// Look at the listener's certificate files every [`TLS_RELOAD_EVERY`]; load them
/// again when they change (a renewal), new connections then get the new certificate.
async fn reload_certificate(tls: Arc<crate::tls::Listener>) {
    loop {
        tokio::time::sleep(TLS_RELOAD_EVERY).await;
        match tls.refresh() {
            Ok(true) => tracing::info!("the listener's certificate changed: new connections get the new one"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the listener's new certificate files are not usable; keeping the old")
            }
        }
    }
}

async fn serve_admin(listener: tokio::net::TcpListener, proxy: Arc<Proxy>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    while let Ok((stream, _)) = listener.accept().await {
        let proxy = proxy.clone();
        let service = service_fn(move |request: Request<Incoming>| admin::handle(proxy.clone(), request));
        let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}
