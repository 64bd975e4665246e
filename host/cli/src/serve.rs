//! `fencekeeper serve`: the fencing gateway in front of an HTTP store.
//!
//! Start-up errors (bad upstream URL, unreadable store, unreachable etcd or ZooKeeper,
//! port taken)
//! end the command with exit code 2 and one message; after that the gateway serves
//! until SIGTERM or SIGINT, then finishes the requests in flight and exits 0.

use crate::admit::DEFAULT_STORE;
use crate::protocol::ProtocolArg;
use crate::provenance::{etcd_check, zookeeper_lock_prefix, ProvenanceArg};
use anyhow::Context;
use fencekeeper::chain::ChainStore;
use fencekeeper::etcd::{EtcdClient, EtcdOptions};
use fencekeeper::provenance::{EtcdProvenance, ZooKeeperProvenance};
use fencekeeper::store::{EtcdStore, Retention};
use fencekeeper::{Decider, Guard, GuestSource, Limits, MarkStore, Mode, Policy, Provenance, Validator};
use fencekeeper_gateway::conditional;
use fencekeeper_gateway::config::{self, Config, ResourceFrom};
use fencekeeper_gateway::registry::deferred::Deferred;
use fencekeeper_gateway::registry::Registry;
use fencekeeper_gateway::{tls, Listeners, Server};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `fencekeeper serve`.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  # In front of a store on :8081, marks in a local file:
  fencekeeper serve --upstream 127.0.0.1:8081
  # Several gateways (and Envoys) on one etcd, ordered across all of them:
  fencekeeper serve --upstream 127.0.0.1:8081 --etcd 127.0.0.1:2379
  # An S3 store that honours If-Match: the store itself refuses a late write:
  fencekeeper serve --upstream 127.0.0.1:9000 --protocol s3 --etcd 127.0.0.1:2379 \\
      --conditional-writes --precondition-probe off

docs/gateway.md has every setting; docs/operations.md how to run it.")]
pub struct Args {
    /// The store to fence, `http://HOST:PORT` or `HOST:PORT`.
    #[arg(help_heading = "Where it listens and what it fences", long)]
    upstream: String,
    /// Where clients connect.
    #[arg(help_heading = "Where it listens and what it fences", long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The admin listener: /metrics, /fencekeeper/marks/<resource>, /healthz.
    #[arg(help_heading = "Where it listens and what it fences", long, default_value = "127.0.0.1:9090")]
    admin: SocketAddr,
    /// The durable embedded mark store (a file; created if missing). Default:
    /// .fencekeeper/marks.redb, where `admit` and `marks` look too.
    #[arg(help_heading = "Marks", long, value_name = "PATH", conflicts_with = "etcd")]
    store: Option<PathBuf>,
    /// Keep marks in etcd instead (`http://HOST:PORT` or `HOST:PORT`), shared by every gateway and
    /// Envoy that uses the same etcd and prefix. For a cluster, every member's, separated by commas: the
    /// gateway talks to one and fails over to the next when it stops answering.
    #[arg(help_heading = "Marks", long, value_name = "HOST:PORT[,HOST:PORT...]")]
    etcd: Option<String>,
    /// The etcd key prefix for marks.
    #[arg(help_heading = "Marks", long, default_value = fencekeeper::store::ETCD_DEFAULT_PREFIX)]
    etcd_prefix: String,
    /// Before a token advances a mark, check that the lock service issued it: off; weak
    /// (not above etcd's revision); strong (the current holder's, of the lock
    /// LOCK_PREFIX + resource). A token that fails is refused 403. Needs --etcd or
    /// --lock-etcd, or --lock-zookeeper (strong only). Default: weak with --etcd (as
    /// envoy-config's), off without; off for tokens that are not this etcd's revisions.
    #[arg(help_heading = "Provenance: tokens the lock service issued", long, value_enum)]
    provenance: Option<ProvenanceArg>,
    /// With --provenance strong: a resource's lock is this prefix + the resource (the
    /// etcd lock's name, or the ZooKeeper lock node's path).
    #[arg(help_heading = "Provenance: tokens the lock service issued", long)]
    lock_prefix: Option<String>,
    /// The etcd whose locks issue the tokens, for --provenance (default: --etcd).
    #[arg(help_heading = "Provenance: tokens the lock service issued", long, value_name = "HOST:PORT")]
    lock_etcd: Option<String>,
    /// The ZooKeeper whose locks issue the tokens (czxids, epoch.counter), for
    /// --provenance strong: the token must be the czxid of the node holding the lock
    /// LOCK_PREFIX + resource (the recipe of `fencekeeper lock --zookeeper` and kazoo).
    #[arg(
        help_heading = "Provenance: tokens the lock service issued",
        long,
        value_name = "HOST:PORT",
        conflicts_with = "lock_etcd"
    )]
    lock_zookeeper: Option<String>,
    /// Append every mark the gateway raises to this file, one JSON line each.
    #[arg(help_heading = "Decisions", long, value_name = "PATH")]
    audit: Option<PathBuf>,
    /// correctness: refuse what cannot be decided (fail closed); efficiency: let it pass, counted.
    #[arg(help_heading = "Decisions", long, value_enum, default_value_t = ModeArg::Correctness)]
    mode: ModeArg,
    /// Refuse a token equal to the mark (each token writes once).
    #[arg(help_heading = "Decisions", long)]
    strict: bool,
    /// The request header carrying the fencing token. With --protocol s3 the
    /// token may come as object metadata too: x-amz-meta- + this name.
    #[arg(help_heading = "Requests", long, default_value = fencekeeper_core::http::TOKEN_HEADER)]
    token_header: String,
    /// Take the resource key from this request header instead of the path.
    #[arg(help_heading = "Requests", long)]
    resource_header: Option<String>,
    /// Cut this prefix from the (decoded) path to form the resource key.
    #[arg(help_heading = "Requests", long, conflicts_with = "resource_header")]
    strip_prefix: Option<String>,
    /// Only paths (decoded) starting with this are fenced; others pass through.
    #[arg(help_heading = "Requests", long, default_value = "/")]
    path_prefix: String,
    /// The store's protocol: which methods read (and pass unfenced) and which
    /// resources a write names. webdav cannot take keys from --resource-header.
    #[arg(help_heading = "Requests", long, value_enum, default_value_t = ProtocolArg::Http, conflicts_with = "resource_header")]
    protocol: ProtocolArg,
    /// With --protocol s3: the store's S3 domain. A request to BUCKET.DOMAIN names
    /// its bucket in the host name (virtual-hosted-style) and is fenced as
    /// /BUCKET/KEY, like the same write path-style; one to DOMAIN or to an IP address
    /// is path-style. Without it, a Host that is a domain name is refused (400): the
    /// bucket could not be told.
    #[arg(help_heading = "Requests", long, value_name = "DOMAIN")]
    s3_domain: Option<String>,
    /// The methods that are fenced (comma-separated); others pass through.
    /// Default: every method but the protocol's reads (GET, HEAD, OPTIONS for http).
    #[arg(help_heading = "Requests", long, value_name = "METHOD[,METHOD...]")]
    fenced_methods: Option<String>,
    /// The largest request body, in bytes (k, m, g suffixes allowed); larger gets 413.
    #[arg(help_heading = "Requests", long, default_value = "16m", value_parser = parse_size)]
    max_body: usize,
    /// The longest a request may take to arrive, and the upstream to answer (ms, s, m).
    #[arg(help_heading = "Requests", long, default_value = "30s", value_parser = parse_duration)]
    request_timeout: Duration,
    /// The longest an admitted write waits for lower-token writes in flight (then 503
    /// with Retry-After). Default: 5s, the same as envoy-config's.
    #[arg(help_heading = "The ordering gate", long, value_parser = parse_duration)]
    gate_timeout: Option<Duration>,
    /// How long the store may still apply a write after the gateway gave up on it (the
    /// upstream timed out, reset or failed once it was sent): the write keeps holding its
    /// resource that long, so no higher write is forwarded before it can no longer land.
    /// The one timing assumption of the gate: keep the store's own request timeout
    /// below it (docs/operations.md). With --conditional-writes, a write given up on
    /// stays lent on its version chain for --request-timeout plus this, then ends by
    /// itself. Default: 60s, the same as Envoy's.
    #[arg(help_heading = "The ordering gate", long, value_parser = parse_duration)]
    store_apply_bound: Option<Duration>,
    /// For this long after start, refuse fenced writes (503 with Retry-After): writes
    /// a previous run of the gateway had in flight when it died (SIGKILL, a crash) may
    /// still be applied by the store, and the ordering gate no longer knows them. Set
    /// it to the store's own request timeout. 0: off.
    #[arg(help_heading = "The ordering gate", long, default_value = "0s", value_parser = parse_duration)]
    start_grace: Duration,
    /// Order writes across every gateway and Envoy that writes the same store through
    /// the same etcd (needs --etcd): each admitted write is registered in flight in
    /// etcd, under a lease of this gateway's, and waits while another instance has a
    /// lower-token write on the resource that the store may still apply. The default
    /// whenever the marks are in etcd; the flag says so explicitly.
    #[arg(help_heading = "The ordering gate", long, requires = "etcd", conflicts_with_all = ["no_gate", "local_gate"])]
    shared_gate: bool,
    /// UNSAFE with more than one instance: with --etcd, order only this gateway's own
    /// writes (no registry in etcd; faster). Two instances that share marks but not
    /// the gate let a slow lower-token write land after a higher one: use it only when
    /// every resource is written through this gateway alone.
    #[arg(help_heading = "The ordering gate", long, requires = "etcd", conflicts_with = "no_gate")]
    local_gate: bool,
    /// Run every admit on a blocking thread, and the etcd store's connection on a
    /// thread of its own, as the gateway did before it awaited etcd on the request's
    /// own task (with --etcd, and provenance off or on etcd, it does). The same decisions: for
    /// comparisons (BENCHMARKS.md), or a fallback.
    #[arg(help_heading = "The ordering gate", long)]
    blocking_admits: bool,
    /// UNSAFE: turn the in-flight ordering gate off. A slow lower-token write can then
    /// land after a higher one. For measurements and demonstrations only.
    #[arg(help_heading = "The ordering gate", long)]
    no_gate: bool,
    /// Send every admitted write with a precondition on the store's version of the
    /// object (If-Match on the ETag the store gave the last write, If-None-Match: *
    /// while it is absent), kept beside the marks: the store itself then refuses a
    /// write that arrives late, whatever the timing. Needs a store that honours
    /// If-Match on writes (docs/operations.md) and --precondition-probe. Only PUTs and
    /// DELETEs are forwarded. Replaces the ordering gate, as in Envoy.
    /// Versions are per object, so the resource key is the path (not
    /// --resource-header).
    #[arg(
        help_heading = "Conditional writes",
        long,
        requires = "precondition_probe",
        conflicts_with_all = ["no_gate", "shared_gate", "local_gate", "resource_header"]
    )]
    conditional_writes: bool,
    /// With --conditional-writes: at start-up, send a PUT of this path whose If-Match
    /// names no version, which a store that honours preconditions refuses (412 or
    /// 404) and one that does not applies; the gateway starts only after a refusal.
    /// `off`: skip it, vouching for the store (one that wants credentials the gateway
    /// does not have, such as S3 with SigV4).
    #[arg(help_heading = "Conditional writes", long, value_name = "PATH|off", requires = "conditional_writes")]
    precondition_probe: Option<String>,
    /// Retention: every --compact-every, forget the marks of resources whose mark has
    /// not risen for this long (`30d`, `12h`), under a floor at or above each (as
    /// `fencekeeper marks --compact`, which a running gateway's file store cannot take).
    /// Only for tokens ordered across resources (etcd revisions, ZooKeeper zxids);
    /// longer than any lock is held with one token. Logged, and audited with --audit.
    #[arg(help_heading = "Retention", long, value_name = "T", value_parser = parse_duration)]
    compact_idle_for: Option<Duration>,
    /// How often the gateway compacts, with --compact-idle-for.
    #[arg(help_heading = "Retention", long, value_name = "P", default_value = "1h", value_parser = parse_duration, requires = "compact_idle_for")]
    compact_every: Duration,
    /// Speak HTTP/2 (prior knowledge) to the upstream, for gRPC stores.
    #[arg(help_heading = "Requests", long)]
    upstream_http2: bool,
    /// Serve clients over TLS with this certificate chain (PEM, the gateway's own
    /// first; with --tls-key). The files are read again when they change: a renewed
    /// certificate is served to new connections without a restart.
    #[arg(help_heading = "TLS", long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(help_heading = "TLS", long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA of an https:// upstream's certificate (PEM): the only root trusted, and
    /// the upstream's host name checked against its certificate.
    #[arg(help_heading = "TLS", long, value_name = "PEM")]
    upstream_cacert: Option<PathBuf>,
    /// Check the configuration (flags, environment, TLS files, the validator) and
    /// exit: 0 with a summary when the gateway would start, 2 with the reason when
    /// not. Nothing is bound, opened or created.
    #[arg(help_heading = "Logs", long)]
    check: bool,
    /// A validator guest component to use instead of the bundled one.
    #[arg(help_heading = "Decisions", long, value_name = "COMPONENT.wasm")]
    guest: Option<PathBuf>,
    /// Log lines as text or JSON (level from RUST_LOG, default info).
    #[arg(help_heading = "Logs", long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// TLS and user for etcd (the marks' and, unless it has its own, the locks').
    #[command(flatten)]
    etcd_connection: crate::etcd_connection::EtcdConnection,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Correctness,
    Efficiency,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `--check`: what the gateway would start with, checked as far as it can be without
/// binding, opening or creating anything: the configuration, the listener's TLS
/// files and the validator. The summary, or why it would not start.
pub fn verify(args: &Args) -> anyhow::Result<String> {
    let config = configure(args)?;
    if let Some(files) = &config.tls {
        tls::Listener::load(files.clone())?;
    }
    decider(args, config.policy)?;
    let marks = match (&args.etcd, &args.store) {
        (Some(etcd), _) => format!("in etcd at {etcd}"),
        (None, Some(path)) => format!("in {}", path.display()),
        (None, None) => format!("in {DEFAULT_STORE}"),
    };
    let tls = if config.tls.is_some() { " over TLS" } else { "" };
    Ok(format!(
        "usable: clients on {}{tls}, the store at {}, marks {marks}, {} mode, provenance {}",
        config.listen,
        config.upstream,
        format!("{:?}", config.policy.mode).to_lowercase(),
        provenance(args).name()
    ))
}

/// Run the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    init_logs(args.log_format);
    if args.check {
        out!("fencekeeper serve: {}", verify(&args)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut config = configure(&args)?;
    // First: an address in use fails the start before a store or a journal is made.
    let listeners = Listeners::bind(&config)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    // Admits over etcd are awaited on the gateway's runtime, which then drives the
    // store's connection too; --blocking-admits keeps the earlier way (the blocking
    // pool, the connection on a thread of its own).
    let drives = (!args.blocking_admits).then(|| runtime.handle().clone());
    let (store, chains, retained, provenance) = open_store(&args, drives.clone())?;
    // With marks in etcd, the gate is shared unless opted out (`--local-gate`); the
    // conditional path replaces the gate.
    let shared = config.gate && (args.shared_gate || !args.local_gate) && !args.conditional_writes;
    let registry = match (&args.etcd, shared) {
        (Some(url), true) => Some(join_registry(&args, url, &config, drives)?),
        _ => None,
    };
    // Every admitted write passes the registry, whose Txn compares the mark: the
    // store's own confirm of an equal token would be a second round trip.
    let store: Store = match registry {
        Some(_) => Arc::new(Deferred::new(store)),
        None => store,
    };
    let mut guard = Guard::new(decider(&args, config.policy)?, store);
    if let Some(p) = &provenance {
        guard = guard.with_provenance(p.clone());
    }
    let chains = match args.precondition_probe.as_deref() {
        None => None,
        Some("off") => Some(chains),
        Some(path) => {
            anyhow::ensure!(
                path.starts_with('/'),
                "--precondition-probe {path:?}: give a path starting with /, or off"
            );
            let probed = runtime
                .block_on(conditional::probe(&config.upstream, config.upstream_tls.clone(), path))
                .map_err(anyhow::Error::msg)?;
            config.conditional_deletes = probed.deletes;
            Some(chains)
        }
    };
    let conditional = chains.is_some();
    let registry_on = registry.is_some();
    let server = Server::on(listeners, config.clone(), Arc::new(guard), registry, chains)?;
    if let Some(idle_for) = args.compact_idle_for {
        anyhow::ensure!(!args.compact_every.is_zero(), "--compact-every must be above 0");
        let audit = args.audit.as_ref().map(fencekeeper::audit::AuditLog::open).transpose()?;
        let metrics = server.proxy().metrics().clone();
        crate::compaction::periodic(retained, idle_for, args.compact_every, audit, config.store.clone(), metrics)
            .context("starting the compaction thread")?;
    }
    tracing::info!(
        listen = %server.local_addr()?,
        admin = %server.admin_addr().map_or("off".to_owned(), |a| a.to_string()),
        upstream = %config.upstream,
        marks = %config.store,
        provenance = %provenance.map_or("off".to_owned(), |p| p.describe()),
        audit = %args.audit.as_ref().map_or("off".to_owned(), |p| p.display().to_string()),
        gate = if !config.gate { "off" } else if registry_on { "shared through etcd" } else { "this gateway's" },
        store_apply_bound = ?config.apply_bound,
        conditional_writes = conditional,
        retention = %args.compact_idle_for.map_or("off".to_owned(), |t| {
            format!("marks idle for {}s forgotten every {}s", t.as_secs(), args.compact_every.as_secs())
        }),
        "fencekeeper gateway serving"
    );
    if !config.gate {
        tracing::warn!("the ordering gate is off (--no-gate): a slow lower-token write can land after a higher one");
    }
    runtime.block_on(server.run(shutdown_signal()))?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

fn configure(args: &Args) -> anyhow::Result<Config> {
    let mut c = Config::new(args.listen, config::upstream(&args.upstream)?);
    c.admin = Some(args.admin);
    c.upstream_http2 = args.upstream_http2;
    c.tls = args.tls_cert.clone().zip(args.tls_key.clone()).map(|(cert, key)| tls::TlsFiles { cert, key });
    c.upstream_tls =
        args.upstream_cacert.as_deref().map(|ca| tls::client_config(ca, args.upstream_http2)).transpose()?;
    c.check_tls()?;
    let mode = match args.mode {
        ModeArg::Correctness => Mode::Correctness,
        ModeArg::Efficiency => Mode::Efficiency,
    };
    c.policy = Policy { mode, strict: args.strict };
    anyhow::ensure!(
        !(args.conditional_writes && mode == Mode::Efficiency),
        "--conditional-writes needs --mode correctness: a write passed without an admit would go unconditionally"
    );
    c.token_header = config::header_name(&args.token_header)?;
    c.resource = match &args.resource_header {
        Some(name) => ResourceFrom::Header(config::header_name(name)?.as_str().to_owned()),
        None => ResourceFrom::Path { strip_prefix: args.strip_prefix.clone().unwrap_or_default() },
    };
    c.protocol = args.protocol.protocol();
    c.s3_domain = args.protocol.s3_domain(args.s3_domain.as_deref())?;
    c.path_prefix = args.path_prefix.clone();
    c.fenced_methods = args.fenced_methods.as_deref().map(config::methods).transpose()?;
    c.max_body = args.max_body;
    c.request_timeout = args.request_timeout;
    c.gate_timeout = args.gate_timeout.unwrap_or(c.gate_timeout);
    // With conditional writes the gate is off (below) and the bound is a lend's term:
    // a write given up on stays lent on its chain until it has passed.
    c.apply_bound = args.store_apply_bound.unwrap_or(c.apply_bound);
    c.start_grace = args.start_grace;
    // Nor does a write wait at the ordering gate: the chain refuses a lend below one it
    // made and the store a late write, so the gate would only spare a lower token its
    // stale refusal (the filter has none either; docs/architecture.md).
    c.gate = !args.no_gate && !args.conditional_writes;
    c.blocking_admits = args.blocking_admits;
    c.audit = args.audit.clone();
    c.store = match &args.etcd {
        Some(url) => format!("etcd {} prefix {}", config::with_scheme(url), args.etcd_prefix),
        None => format!("file {}", args.store.as_deref().unwrap_or(Path::new(DEFAULT_STORE)).display()),
    };
    Ok(c)
}

/// Where `serve` kept its marks before its default became [`DEFAULT_STORE`].
const OLD_DEFAULT_STORE: &str = "fencekeeper-marks.redb";

/// The file store at `--store`, or at the default path, its directory created. A
/// store at the old default path, with none at the new one, stops the start: opening
/// an empty store there would forget every mark, and admit tokens the old store
/// refuses.
fn file_store(args: &Args) -> anyhow::Result<fencekeeper::FileStore> {
    let path = match &args.store {
        Some(path) => path.clone(),
        None => {
            let path = PathBuf::from(DEFAULT_STORE);
            anyhow::ensure!(
                path.exists() || !Path::new(OLD_DEFAULT_STORE).exists(),
                "{OLD_DEFAULT_STORE} is here, where `serve` kept its marks before 2026-12-07, and {DEFAULT_STORE} \
                 (the default now, as for `admit` and `marks`) is not: move it there with its journal \
                 (mkdir -p .fencekeeper && mv {OLD_DEFAULT_STORE} {DEFAULT_STORE} && mv {OLD_DEFAULT_STORE}.journal \
                 {DEFAULT_STORE}.journal), or pass --store {OLD_DEFAULT_STORE}; starting on an empty store would \
                 forget every mark"
            );
            path
        }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    Ok(fencekeeper::FileStore::open(&path)?)
}

type Store = Arc<dyn MarkStore + Send + Sync>;
type Chains = Arc<dyn ChainStore>;
type Retained = Arc<dyn Retention + Send + Sync>;
/// The mark store, the chains beside its marks, the store as retention compacts
/// it, and the provenance check.
type Opened = (Store, Chains, Retained, Option<Arc<dyn Provenance>>);

/// One store, as the mark store, the store of version chains beside the marks, and
/// the store retention compacts.
fn both<S: MarkStore + ChainStore + Retention + Send + Sync + 'static>(store: S) -> (Store, Chains, Retained) {
    let store = Arc::new(store);
    (store.clone(), store.clone(), store)
}

/// The provenance check asked for, else the default: weak where the marks are in etcd
/// (whose revisions the tokens then are, as with Envoy), off elsewhere. With
/// --lock-zookeeper there is no default: it takes the strong check, named.
fn provenance(args: &Args) -> ProvenanceArg {
    args.provenance.unwrap_or(if args.etcd.is_some() && args.lock_zookeeper.is_none() {
        ProvenanceArg::Weak
    } else {
        ProvenanceArg::Off
    })
}

/// The mark store, and the provenance check: on ZooKeeper with --lock-zookeeper; else
/// on the store's own etcd when the locks live there (one connection, and the
/// revisions the store sees spare the weak check its round trip), else on --lock-etcd.
/// The etcd store's connection is driven by `runtime` when given (the gateway's, which
/// awaits its admits).
fn open_store(args: &Args, runtime: Option<tokio::runtime::Handle>) -> anyhow::Result<Opened> {
    let timeout = Duration::from_secs(2);
    let provenance = provenance(args);
    if let Some(address) = &args.lock_zookeeper {
        let lock_prefix = zookeeper_lock_prefix(provenance, args.lock_prefix.as_deref())?;
        let (store, chains, retained) = match &args.etcd {
            Some(url) => both(etcd_store(args, url, timeout, runtime.clone())?),
            None => both(file_store(args)?),
        };
        let provenance = ZooKeeperProvenance::connect(address, lock_prefix, timeout)?;
        return Ok((store, chains, retained, Some(Arc::new(provenance))));
    }
    let check = etcd_check(provenance, args.lock_prefix.as_deref())?;
    anyhow::ensure!(check.is_some() || args.lock_etcd.is_none(), "--lock-etcd goes with --provenance weak or strong");
    let separate = |check| -> anyhow::Result<Option<Arc<dyn Provenance>>> {
        let Some(url) = &args.lock_etcd else {
            let zookeeper = if provenance == ProvenanceArg::Strong { " (or --lock-zookeeper)" } else { "" };
            anyhow::bail!(
                "--provenance {} needs the etcd that issues the tokens: --etcd or --lock-etcd{zookeeper}",
                provenance.name()
            );
        };
        let options = EtcdOptions { timeout, ..args.etcd_connection.options()? };
        Ok(Some(Arc::new(EtcdProvenance::connect_with(&args.etcd_connection.endpoint(url), check, &options)?)))
    };
    let (store, chains, retained) = match &args.etcd {
        Some(url) => {
            let store = etcd_store(args, url, timeout, runtime.clone())?;
            let provenance: Option<Arc<dyn Provenance>> = match check {
                Some(check) if args.lock_etcd.is_none() => Some(Arc::new(EtcdProvenance::sharing(&store, check))),
                Some(check) => separate(check)?,
                None => None,
            };
            let (store, chains, retained) = both(store);
            return Ok((store, chains, retained, provenance));
        }
        None => both(file_store(args)?),
    };
    let provenance = match check {
        Some(check) => separate(check)?,
        None => None,
    };
    Ok((store, chains, retained, provenance))
}

/// This gateway's part of the in-flight registry in the etcd at `url` (its own
/// connection, with the marks' TLS and user, driven by `runtime` when given).
fn join_registry(
    args: &Args,
    url: &str,
    config: &Config,
    runtime: Option<tokio::runtime::Handle>,
) -> anyhow::Result<Arc<Registry>> {
    let options = EtcdOptions { timeout: Duration::from_secs(2), runtime, ..args.etcd_connection.options()? };
    let client = Arc::new(EtcdClient::new(&args.etcd_connection.endpoint(url), &options)?);
    let prefix = fencekeeper_etcd_wire::flights::DEFAULT_FLIGHT_PREFIX;
    Registry::join(client, prefix, &args.etcd_prefix, config.request_timeout, config.apply_bound)
        .context("joining the in-flight registry in etcd (--shared-gate)")
}

/// The etcd mark store at `url`, each call bounded by `timeout`, its connection driven
/// by `runtime` (by a thread of its own when `None`).
fn etcd_store(
    args: &Args,
    url: &str,
    timeout: Duration,
    runtime: Option<tokio::runtime::Handle>,
) -> anyhow::Result<EtcdStore> {
    let options = EtcdOptions { timeout, runtime, ..args.etcd_connection.options()? };
    Ok(EtcdStore::connect_with(&args.etcd_connection.endpoint(url), &args.etcd_prefix, &options)?)
}

fn decider(args: &Args, policy: Policy) -> anyhow::Result<Arc<dyn Decider>> {
    let validator = match &args.guest {
        Some(path) => Validator::load(GuestSource::Path(path), policy, Limits::default())?,
        None => Validator::bundled(policy)?,
    };
    Ok(Arc::new(validator))
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log file is for grep (the client of a refusal).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => logs.try_init(),
        LogFormat::Json => logs.json().try_init(),
    };
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// A byte count: `1048576`, `64k`, `16m`, `1g`.
fn parse_size(text: &str) -> Result<usize, String> {
    let lower = text.trim().to_ascii_lowercase();
    let (digits, unit) = match lower.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => lower.split_at(i),
        None => (lower.as_str(), ""),
    };
    let shift = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        _ => return Err(format!("bad size {text:?}; expected a number of bytes with an optional k, m or g")),
    };
    digits.parse::<usize>().ok().and_then(|n| n.checked_mul(1 << shift)).ok_or_else(|| format!("bad size {text:?}"))
}

/// A duration: `250ms`, `5s`, `2m`, `12h`, `30d`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bad = || format!("bad duration {text:?}; expected a number with ms, s, m, h or d, like 500ms, 5s or 30d");
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else if let Some(n) = t.strip_suffix('d') {
        (n, 86400.0)
    } else {
        return Err(bad());
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    Duration::try_from_secs_f64(value * scale).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse_with_units() {
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("lots").is_err());
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86400)));
        assert!(parse_duration("5").is_err());
    }
}
