//! `fencekeeper envoy-config`: print an Envoy v3 configuration that fences an
//! upstream with the proxy-wasm filter (docs/envoy.md).
//!
//! The output is complete: a listener, a route to the upstream, the filter with its
//! JSON configuration and the failure policy that keeps fencing on after a guest
//! fault (FAIL_RELOAD: the VM is reloaded, the shared-data marks stay), and the etcd
//! cluster the filter reaches for marks in correctness mode.
//!
//! The filter is embedded in this binary, as the validator is in the library: an
//! installed `fencekeeper` writes it next to the configuration (`--write-filter`),
//! so a generated configuration never points into a build tree.

use crate::protocol::ProtocolArg;
use crate::provenance::{etcd_check, ProvenanceArg};
use anyhow::{anyhow, bail, Context, Result};
use fencekeeper_core::Protocol;
use fencekeeper_filter_config::{
    Config, EtcdApiName, EtcdSettings, GateConfig, GateSettings, KeyFrom, ModeName, ProtocolName, ProvenanceName,
    ResourceSettings, Settings, Switch, DEFAULT_ETCD_CLUSTER,
};
use fencekeeper_gateway::config::methods;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

mod local_reply;

/// Where the committed filter lives in the repository.
const ARTIFACT: &str = "guest/artifacts/fencekeeper_filter.wasm";
/// The cluster of the store: the routes go to it, and the filter asks it for a
/// version it does not know (conditional writes).
const STORE_CLUSTER: &str = "store";

/// The filter, as committed (rebuilt byte-identically by `scripts/build-guests.sh`).
pub(crate) static EMBEDDED_FILTER: &[u8] = include_bytes!("../../../guest/artifacts/fencekeeper_filter.wasm");

/// Where a generated proxy listens, and the store behind it (`envoy-config`,
/// `nginx-config`).
#[derive(clap::Args)]
pub(crate) struct Front {
    /// The store to fence, HOST:PORT (an IP address or a DNS name); `http://HOST:PORT`
    /// is taken as the same; `https://HOST:PORT` for a store that speaks TLS (with
    /// --upstream-cacert).
    #[arg(help_heading = "Where it listens and what it fences", long, value_parser = parse_upstream)]
    pub(crate) upstream: Upstream,
    /// The CA of an https:// upstream's certificate (PEM): the only root the proxy
    /// trusts for it, and the upstream's host name checked against its certificate.
    #[arg(help_heading = "Where it listens and what it fences", long, value_name = "PEM")]
    pub(crate) upstream_cacert: Option<PathBuf>,
    /// Where clients connect: HOST:PORT (as `serve --listen`), or a port alone (on
    /// --listen-address).
    #[arg(help_heading = "Where it listens and what it fences", long, value_name = "ADDR", default_value = "127.0.0.1:10000", value_parser = parse_address)]
    listen: Address,
    /// The address of a --listen given as a port alone (the form before --listen took
    /// HOST:PORT). Default: 127.0.0.1.
    #[arg(help_heading = "Where it listens and what it fences", long, value_name = "HOST")]
    listen_address: Option<String>,
}

/// A listening address: HOST:PORT, or a port alone (its host given apart).
#[derive(Clone, Debug)]
pub(crate) struct Address {
    host: Option<String>,
    port: u16,
}

/// `--listen` and `--admin`: HOST:PORT, or a port alone.
fn parse_address(text: &str) -> Result<Address, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(Address { host: None, port });
    }
    let e = Endpoint::parse(text).map_err(|e| format!("{e:#}; write HOST:PORT, or a port"))?;
    Ok(Address { host: Some(e.host), port: e.port })
}

impl Front {
    /// The host and port the proxy listens on.
    pub(crate) fn listening(&self) -> Result<(String, u16)> {
        match (&self.listen.host, &self.listen_address) {
            (Some(_), Some(_)) => bail!("--listen-address and a --listen with a host: give --listen HOST:PORT alone"),
            (Some(host), None) | (None, Some(host)) => Ok((host.clone(), self.listen.port)),
            (None, None) => Ok(("127.0.0.1".to_owned(), self.listen.port)),
        }
    }
}

/// The store a generated proxy fences: its `HOST:PORT`, and whether it speaks TLS.
#[derive(Clone, Debug)]
pub(crate) struct Upstream {
    /// `HOST:PORT`.
    pub(crate) address: String,
    /// `https://` was written.
    pub(crate) tls: bool,
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", if self.tls { "https" } else { "http" }, self.address)
    }
}

impl Front {
    /// The upstream's CA, if it speaks TLS: required for https://, refused for http://.
    pub(crate) fn upstream_ca(&self) -> Result<Option<PathBuf>> {
        match (&self.upstream_cacert, self.upstream.tls) {
            (Some(ca), true) => {
                Ok(Some(ca.canonicalize().with_context(|| format!("--upstream-cacert: cannot read {}", ca.display()))?))
            }
            (None, true) => bail!("an https:// upstream needs the CA of its certificate (--upstream-cacert)"),
            (Some(_), false) => {
                bail!("--upstream-cacert is given but the upstream is http://; write https:// (never plaintext)")
            }
            (None, false) => Ok(None),
        }
    }
}

/// Which filter `.wasm` a generated configuration loads (`envoy-config`, `nginx-config`).
#[derive(clap::Args)]
pub(crate) struct FilterFile {
    /// An existing filter .wasm for the configuration to load. Default: the one
    /// `--write-filter` writes, else guest/artifacts/fencekeeper_filter.wasm of a
    /// checkout above this binary or the current directory.
    #[arg(help_heading = "The filter", long, conflicts_with = "write_filter")]
    filter: Option<PathBuf>,
    /// Write the filter embedded in this binary to this file (directories are
    /// created), and point the configuration at it. What an installed binary needs.
    #[arg(help_heading = "The filter", long, value_name = "PATH")]
    write_filter: Option<PathBuf>,
}

impl FilterFile {
    /// The filter's path: given, written, or found in a checkout.
    pub(crate) fn path(&self) -> Result<PathBuf> {
        match (&self.filter, &self.write_filter) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(p)) => write_filter(p),
            (None, None) => default_filter(),
        }
    }
}

/// Arguments of `fencekeeper envoy-config`.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  # Envoy on :10000 in front of a store on :8081, marks in etcd on :2379:
  fencekeeper envoy-config --upstream 127.0.0.1:8081 --write-filter /etc/envoy/fencekeeper_filter.wasm \\
      > envoy.yaml && envoy -c envoy.yaml
  # One Envoy alone, marks in its own shared data (efficiency mode):
  fencekeeper envoy-config --upstream 127.0.0.1:8081 --no-etcd --mode efficiency

docs/envoy.md has every setting and the plugin configuration it writes.")]
pub struct Args {
    #[command(flatten)]
    front: Front,
    /// Envoy's admin interface (stats, /ready): HOST:PORT (as `serve --admin`), or a
    /// port alone (on 127.0.0.1).
    #[arg(help_heading = "Where it listens and what it fences", long, value_name = "ADDR", default_value = "127.0.0.1:9901", value_parser = parse_address)]
    admin: Address,
    #[command(flatten)]
    filter: FilterFile,
    /// Have Envoy fetch the filter from this URL (`http://HOST:PORT/PATH`) instead of
    /// reading a file, and check it against --filter-sha256 before it loads it: one
    /// artifact server for many Envoys. A filter that does not match is not loaded.
    #[arg(help_heading = "The filter", long, value_name = "URL", conflicts_with_all = ["filter", "write_filter"])]
    filter_url: Option<String>,
    /// With --filter-url: the SHA-256 the fetched filter must have (64 hex digits).
    /// Default: the filter built into this binary's (`fencekeeper --version`).
    #[arg(help_heading = "The filter", long, value_name = "HEX", requires = "filter_url")]
    filter_sha256: Option<String>,
    /// etcd's client address, HOST:PORT (its v3 gRPC API holds the marks). For an
    /// etcd cluster, every member's, separated by commas: Envoy health-checks them and
    /// sends the filter's calls to members that answer.
    #[arg(help_heading = "Marks", long, default_value = "127.0.0.1:2379", value_name = "HOST:PORT[,HOST:PORT...]")]
    etcd: String,
    /// The CA of etcd's certificate (PEM): Envoy reaches etcd over TLS, checking its
    /// certificate against this CA and its address.
    #[arg(help_heading = "etcd's TLS and user", long, value_name = "PEM")]
    etcd_cacert: Option<PathBuf>,
    /// A client certificate (PEM) Envoy presents to etcd (with --etcd-key).
    #[arg(
        help_heading = "etcd's TLS and user",
        long,
        value_name = "PEM",
        requires = "etcd_key",
        requires = "etcd_cacert"
    )]
    etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(help_heading = "etcd's TLS and user", long, value_name = "PEM", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// The etcd user the filter authenticates as (with --etcd-password-env).
    #[arg(
        help_heading = "etcd's TLS and user",
        long,
        value_name = "NAME",
        requires = "etcd_password_env",
        conflicts_with = "no_etcd"
    )]
    etcd_user: Option<String>,
    /// The environment variable of Envoy's process that holds the etcd user's
    /// password. Only its name is written: Envoy passes it to the filter
    /// (vm_config.environment_variables.host_env_keys), and its admin /config_dump
    /// never shows the password. Envoy must be started with it set.
    #[arg(help_heading = "etcd's TLS and user", long, value_name = "VAR", requires = "etcd_user")]
    etcd_password_env: Option<String>,
    /// Which of etcd's APIs the filter calls: grpc (HTTP/2 to etcd; half etcd's CPU
    /// a call), or json (etcd's JSON API over HTTP/1.1, etcd 3.4 or later: what a
    /// proxy-wasm host without gRPC calls uses; BENCHMARKS.md compares the two).
    #[arg(help_heading = "Marks", long, value_enum, default_value_t = EtcdApi::Grpc, conflicts_with = "no_etcd")]
    etcd_api: EtcdApi,
    /// Keep marks in Envoy's shared data only, without etcd (efficiency mode only:
    /// a restart forgets the marks, and two Envoys do not share them).
    #[arg(help_heading = "Marks", long)]
    no_etcd: bool,
    /// With etcd: the most marks Envoy's shared-data copy holds (a cache of etcd's;
    /// past it, idle marks are evicted and a miss asks etcd). Default: the filter's,
    /// 65536. Without etcd nothing is evicted: the shared data is the only copy.
    #[arg(help_heading = "Marks", long, value_name = "N", conflicts_with = "no_etcd")]
    shared_marks_max: Option<u32>,
    /// correctness (fail closed) or efficiency (fail open).
    #[arg(help_heading = "Decisions", long, default_value = "correctness", value_parser = ["correctness", "efficiency"])]
    mode: String,
    /// Refuse a token equal to the mark (each token admits once).
    #[arg(help_heading = "Decisions", long)]
    strict: bool,
    /// Before a token advances a mark, check that etcd (the marks' etcd) issued it:
    /// weak (not above etcd's revision), strong (the current holder's, of the lock
    /// LOCK_PREFIX + resource) or off. Default: weak with etcd, off with --no-etcd.
    #[arg(help_heading = "Provenance: tokens the lock service issued", long, value_enum)]
    provenance: Option<ProvenanceArg>,
    /// With --provenance strong: a resource's lock is this prefix + the resource.
    #[arg(help_heading = "Provenance: tokens the lock service issued", long)]
    lock_prefix: Option<String>,
    /// The store's protocol: which methods read (and skip the filter) and which
    /// resources a write names. webdav cannot take keys from --resource-header.
    #[arg(help_heading = "Requests", long, value_enum, default_value_t = ProtocolArg::Http, conflicts_with = "resource_header")]
    protocol: ProtocolArg,
    /// With --protocol s3: the store's S3 domain. A request to BUCKET.DOMAIN names
    /// its bucket in the host name (virtual-hosted-style) and is fenced as
    /// /BUCKET/KEY; one to DOMAIN or to an IP address is path-style. Without it, an
    /// :authority that is a domain name is refused (400): the bucket could not be told.
    #[arg(help_heading = "Requests", long, value_name = "DOMAIN")]
    s3_domain: Option<String>,
    /// The methods that are fenced (comma-separated): only these requests enter the
    /// filter; every other one skips it on its own route. Default: every method but
    /// the protocol's reads (GET, HEAD, OPTIONS for http).
    #[arg(help_heading = "Requests", long, value_name = "METHOD[,METHOD...]")]
    fenced_methods: Option<String>,
    /// Take the resource key from this request header instead of the path.
    #[arg(help_heading = "Requests", long)]
    resource_header: Option<String>,
    /// Strip this prefix from the path to form the resource key.
    #[arg(help_heading = "Requests", long)]
    strip_prefix: Option<String>,
    /// How long Envoy waits for the store's answer to a request (the routes'
    /// `timeout`; ms, s or m), as `serve --request-timeout`. Formerly --route-timeout
    /// (still accepted), whose default was 60s.
    #[arg(help_heading = "Requests", long, alias = "route-timeout", default_value = "30s", value_parser = crate::serve::parse_duration)]
    request_timeout: Duration,
    /// How long the store may still apply a write after Envoy gave up on it (the route
    /// timed out, the store reset the stream, the client went away, a worker died):
    /// the write keeps holding its resource at the ordering gate that long. The one
    /// timing assumption of the gate: keep the store's own request timeout below it
    /// (docs/operations.md). With --conditional-writes, a write given up on stays lent
    /// on its version chain for --request-timeout plus this, then ends by itself.
    /// Default: 60s, the same as the gateway's.
    #[arg(help_heading = "The ordering gate", long, value_parser = crate::serve::parse_duration)]
    store_apply_bound: Option<Duration>,
    /// The longest an admitted write is held back for lower-token writes that the
    /// store may still apply (then 503 with Retry-After). Default: 5s, the same as
    /// the gateway's. Formerly --gate-budget (still accepted).
    #[arg(help_heading = "The ordering gate", long, alias = "gate-budget", value_parser = crate::serve::parse_duration)]
    gate_timeout: Option<Duration>,
    /// For this long after Envoy starts, refuse fenced writes (503 with Retry-After):
    /// writes a previous Envoy had in flight when it died (SIGKILL, a crash) may still
    /// be applied by the store, and the ordering gate died with it. Set it to the
    /// store apply bound. 0: off.
    #[arg(help_heading = "The ordering gate", long, default_value = "0s", value_parser = crate::serve::parse_duration)]
    start_grace: Duration,
    /// Order writes across every Envoy and gateway that writes the same store through
    /// the same etcd: each admitted write is registered in flight in etcd, under a
    /// lease of each worker's, and waits while another instance has a lower-token write
    /// on the resource that the store may still apply. The default whenever the marks
    /// are in etcd; the flag says so explicitly.
    #[arg(help_heading = "The ordering gate", long, conflicts_with_all = ["no_gate", "no_etcd", "local_gate"])]
    shared_gate: bool,
    /// UNSAFE with more than one instance: order only this Envoy's own writes (no
    /// registry in etcd; faster). Two instances that share marks but not the gate
    /// let a slow lower-token write land after a higher one: use it only when every
    /// resource is written through this Envoy alone.
    #[arg(help_heading = "The ordering gate", long, conflicts_with_all = ["no_gate", "no_etcd"])]
    local_gate: bool,
    /// UNSAFE: turn the ordering gate off. A slow lower-token write can then land after
    /// a higher one. For measurements and demonstrations only.
    #[arg(help_heading = "The ordering gate", long)]
    no_gate: bool,
    /// Conditional writes: each admitted PUT or DELETE goes to the store with
    /// `If-Match` on the version the store gave the last write (`If-None-Match: *` for
    /// a new object), lent on the resource's version chain in etcd first, so the store
    /// itself refuses a late write (412), with no ordering gate. Needs a store that
    /// honours If-Match on writes (docs/operations.md) and --precondition-probe. Reads
    /// go through the filter too: their ETag teaches a version the filter lost.
    #[arg(
        help_heading = "Conditional writes",
        long,
        requires = "precondition_probe",
        conflicts_with_all = ["no_gate", "no_etcd", "resource_header", "shared_gate", "local_gate"]
    )]
    conditional_writes: bool,
    /// With --conditional-writes: a path on the store (--upstream) that the probe may
    /// write and delete, to check now that the store refuses a stale If-Match on PUT
    /// (else no configuration is written) and on DELETE (else deletes are refused); or
    /// `off`, to vouch for the store yourself (deletes are then sent conditionally).
    #[arg(help_heading = "Conditional writes", long, requires = "conditional_writes", value_name = "PATH|off")]
    precondition_probe: Option<String>,
    /// With --conditional-writes: the largest body a write may have, in bytes. The
    /// filter holds a PUT's body in Envoy until it is whole (the version it makes is
    /// its MD5), so each write in flight may buffer this much; a larger one is refused
    /// (413) before any of it reaches the store.
    #[arg(help_heading = "Conditional writes", long, default_value_t = fencekeeper_filter_config::DEFAULT_CONDITIONAL_MAX_BODY, value_name = "BYTES", requires = "conditional_writes")]
    conditional_max_body: u64,
    /// What the probe found: the store honours If-Match on DELETE.
    #[arg(skip)]
    conditional_deletes: bool,
    /// Testing only: requests with this header make the filter trap (exercises the
    /// failure policy). Never set it in production.
    #[arg(long, hide = true)]
    test_fault_header: Option<String>,
}

/// Run the subcommand.
pub fn run(mut args: Args) -> Result<ExitCode> {
    match args.precondition_probe.as_deref() {
        None => {}
        Some("off") => args.conditional_deletes = true,
        Some(path) => {
            anyhow::ensure!(
                path.starts_with('/'),
                "--precondition-probe {path:?}: give a path starting with /, or off"
            );
            let upstream: hyper::Uri = format!("{}/", args.front.upstream)
                .parse()
                .map_err(|e| anyhow!("--upstream {} is not HOST:PORT: {e}", args.front.upstream))?;
            let tls = match args.front.upstream_ca()? {
                Some(ca) => Some(fencekeeper_gateway::tls::client_config(&ca, false)?),
                None => None,
            };
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let probed = runtime
                .block_on(fencekeeper_gateway::conditional::probe(&upstream, tls, path))
                .map_err(|e| anyhow!("--conditional-writes: {e}"))?;
            args.conditional_deletes = probed.deletes;
        }
    }
    let filter = if args.filter_url.is_some() { PathBuf::new() } else { args.filter.path()? };
    crate::output::text(render(&args, &filter)?.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// For `fencekeeper check`: whether this configuration can be written, without
/// probing the store or writing the filter.
pub fn verify(args: &Args) -> Result<String> {
    render(args, Path::new("fencekeeper_filter.wasm"))?;
    let (host, port) = args.front.listening()?;
    Ok(format!("usable: Envoy on {host}:{port} in front of {}", args.front.upstream))
}

/// Where Envoy gets the filter: `filter`, or with `--filter-url` that URL, checked
/// against its SHA-256, through the cluster [`FILTER_SOURCE`] (returned, to write).
fn filter_code(args: &Args, filter: &Path) -> Result<(String, Option<Endpoint>)> {
    let Some(url) = &args.filter_url else {
        let filter = yaml_single_quoted(&filter.display().to_string());
        return Ok((format!("                    local:\n                      filename: {filter}\n"), None));
    };
    let rest = url.strip_prefix("http://").with_context(|| {
        format!("--filter-url {url:?}: give an http://HOST:PORT/PATH URL (Envoy checks the filter's SHA-256, not TLS)")
    })?;
    let (authority, _) = rest.split_once('/').with_context(|| format!("--filter-url {url:?}: no path"))?;
    let source = Endpoint::parse(authority).with_context(|| format!("--filter-url {url:?}"))?;
    let sha256 = match &args.filter_sha256 {
        Some(hex) => {
            let hex = hex.to_ascii_lowercase();
            anyhow::ensure!(
                hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
                "--filter-sha256 {hex:?}: give the filter's SHA-256 as 64 hex digits (sha256sum prints it)"
            );
            hex
        }
        None => crate::version::sha256(EMBEDDED_FILTER),
    };
    let code = format!(
        "                    remote:\n\
         \x20                     http_uri:\n\
         \x20                       uri: {uri}\n\
         \x20                       cluster: {FILTER_SOURCE}\n\
         \x20                       timeout: 10s\n\
         \x20                     sha256: {sha256}\n\
         \x20                     retry_policy:\n\
         \x20                       num_retries: 5\n",
        uri = yaml_single_quoted(url),
        // Quoted: a hash of digits alone would be read as a number.
        sha256 = yaml_single_quoted(&sha256),
    );
    Ok((code, Some(source)))
}

/// The cluster Envoy fetches a `--filter-url` filter through.
const FILTER_SOURCE: &str = "filter_source";

fn default_filter() -> Result<PathBuf> {
    let exe = std::env::current_exe().ok();
    let cwd = std::env::current_dir().ok();
    let starts = exe.as_deref().and_then(Path::parent).into_iter().chain(cwd.as_deref());
    for start in starts {
        for dir in start.ancestors() {
            let candidate = dir.join(ARTIFACT);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "cannot find {ARTIFACT} above this binary or the current directory; \
         pass --write-filter PATH to write the filter this binary carries, or --filter PATH"
    )
}

/// Write the embedded filter to `path` (atomically: a reader never sees half a
/// file), and return its absolute path for the configuration.
fn write_filter(path: &Path) -> Result<PathBuf> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir.canonicalize().with_context(|| format!("cannot resolve {}", dir.display()))?;
    let name = path.file_name().with_context(|| format!("{} names no file", path.display()))?;
    let target = dir.join(name);
    let temp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    std::fs::write(&temp, EMBEDDED_FILTER).with_context(|| format!("cannot write {}", temp.display()))?;
    std::fs::rename(&temp, &target).with_context(|| format!("cannot write {}", target.display()))?;
    Ok(target)
}

/// `--fenced-methods`, upper-cased: the gateway's parser, so both hosts accept the
/// same lists (an empty one is refused).
fn fenced_methods(args: &Args) -> Result<Option<Vec<String>>> {
    let Some(list) = &args.fenced_methods else { return Ok(None) };
    let methods = methods(list).with_context(|| format!("--fenced-methods {list:?}"))?;
    Ok(Some(methods.iter().map(|m| m.as_str().to_owned()).collect()))
}

/// The routes: requests the filter would let through unfenced skip it, so they
/// never enter its VM (the cheapest host call is none), and a client's own
/// `fencing-admitted-token` is removed from them here instead, as the filter would.
/// With a list of fenced methods, only those enter the filter, matched without
/// regard to case as the filter matches them: a method the route lets past must be
/// one the filter would not fence, or a write would skip fencing.
fn routes(protocol: Protocol, fenced: Option<&[String]>, timeout: Duration, max_body: Option<u64>) -> String {
    let conditional = max_body.is_some();
    let timeout = envoy_duration(timeout);
    let pass = format!(
        "                route: {{ cluster: {STORE_CLUSTER}, timeout: {timeout} }}
                request_headers_to_remove: [fencing-admitted-token]
                typed_per_filter_config:
                  fencekeeper:
                    \"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig
                    disabled: true
"
    );
    let mut fence = format!("                route: {{ cluster: {STORE_CLUSTER}, timeout: {timeout} }}\n");
    if let Some(max) = max_body {
        // The filter buffers a conditional write's body: Envoy answers 413 past this.
        let _ = writeln!(fence, "                request_body_buffer_limit: {max}");
    }
    let matching = |regex: &str| {
        format!(
            "              - match:
                  prefix: \"/\"
                  headers: [{{ name: \":method\", string_match: {{ safe_regex: {{ regex: {} }} }} }}]
",
            yaml_single_quoted(regex)
        )
    };
    const EVERY: &str = "              - match: { prefix: \"/\" }\n";
    // With conditional writes GET and HEAD enter the filter (unfenced): their answers
    // teach a version the filter lost.
    let learns = |m: &&str| conditional && matches!(*m, "GET" | "HEAD");
    let skip: Vec<&str> = protocol.reads().iter().copied().filter(|m| !learns(m)).collect();
    match fenced {
        None if skip.is_empty() => format!("              # Every request enters the filter.\n{EVERY}{fence}"),
        None => format!(
            "              # Reads are not fenced ({}: the filter's default for --protocol {}).\n{}{pass}{EVERY}{fence}",
            protocol.reads().join(", "),
            protocol.name(),
            matching(&skip.join("|"))
        ),
        Some(list) => {
            // Method names are HTTP tokens, whose punctuation RE2 reads literally
            // when escaped.
            let mut names: Vec<String> = list.iter().map(|m| regex_escape(m)).collect();
            if conditional {
                names.extend(["GET".to_owned(), "HEAD".to_owned()]);
            }
            format!(
                "              # Only the fenced methods (--fenced-methods) enter the filter.\n{}{fence}{EVERY}{pass}",
                matching(&format!("(?i)(?:{})", names.join("|")))
            )
        }
    }
}

/// A duration as Envoy's YAML takes one (`60s`, `0.5s`).
fn envoy_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

/// `s` with every character but letters and digits escaped for RE2.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if !c.is_ascii_alphanumeric() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// etcd's API, as a command-line value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EtcdApi {
    /// etcd's gRPC API.
    Grpc,
    /// etcd's JSON API.
    Json,
}

/// The filter's configuration, in the type the filter parses.
fn plugin_config(args: &Args, fenced: Option<&[String]>) -> Settings {
    let etcd = if args.no_etcd {
        Switch::Off
    } else {
        Switch::On(EtcdSettings {
            cluster: Some(DEFAULT_ETCD_CLUSTER.to_owned()),
            timeout_ms: Some(1000),
            user: args.etcd_user.clone(),
            password_env: args.etcd_password_env.clone(),
            // gRPC, Envoy's default, is left unwritten.
            api: (args.etcd_api == EtcdApi::Json).then_some(EtcdApiName::Json),
            ..EtcdSettings::default()
        })
    };
    let resource = match &args.resource_header {
        Some(h) => ResourceSettings { from: Some(KeyFrom::Header), header: Some(h.clone()), strip_prefix: None },
        None => ResourceSettings { from: Some(KeyFrom::Path), header: None, strip_prefix: args.strip_prefix.clone() },
    };
    // With marks in etcd the gate is shared unless opted out (`--local-gate`).
    let shared = args.shared_gate || (!args.no_etcd && !args.local_gate);
    let gate = if args.no_gate || args.conditional_writes {
        Switch::Off
    } else {
        // Unset: the filter's defaults, which are the engine's (the gateway's too),
        // written out so that the configuration says what the filter runs with.
        let (ms, d) = (|d: Duration| d.as_millis() as u64, GateConfig::default());
        Switch::On(GateSettings {
            apply_bound_ms: Some(args.store_apply_bound.map_or(d.apply_bound_ms, ms)),
            budget_ms: Some(args.gate_timeout.map_or(d.budget_ms, ms)),
            // A worker's lease outlives each flight by the route timeout (Envoy gives
            // up by then) plus the bound.
            shared: Some(shared),
            flight_ms: shared.then_some(args.request_timeout.as_millis() as u64),
            ..GateSettings::default()
        })
    };
    Settings {
        // The filter checks the method too, in case the routes are edited.
        fenced_methods: fenced.map(<[String]>::to_vec),
        protocol: match args.protocol {
            ProtocolArg::Http => None,
            ProtocolArg::Webdav => Some(ProtocolName::Webdav),
            ProtocolArg::S3 => Some(ProtocolName::S3),
        },
        s3_domain: args.s3_domain.clone(),
        shared_marks_max: args.shared_marks_max,
        mode: Some(if args.mode == "efficiency" { ModeName::Efficiency } else { ModeName::Correctness }),
        strict: Some(args.strict),
        provenance: (!args.no_etcd).then(|| match provenance(args) {
            ProvenanceArg::Off => ProvenanceName::Off,
            ProvenanceArg::Weak => ProvenanceName::Weak,
            ProvenanceArg::Strong => ProvenanceName::Strong,
        }),
        lock_prefix: if args.no_etcd { None } else { args.lock_prefix.clone() },
        etcd,
        resource: Some(resource),
        gate,
        start_grace_ms: (!args.start_grace.is_zero()).then_some(args.start_grace.as_millis() as u64),
        conditional_writes: args.conditional_writes.then_some(true),
        conditional_deletes: args.conditional_writes.then_some(args.conditional_deletes),
        conditional_max_body: args.conditional_writes.then_some(args.conditional_max_body),
        conditional_store_cluster: args.conditional_writes.then(|| STORE_CLUSTER.to_owned()),
        conditional_lend_ms: args.conditional_writes.then(|| {
            let bound = args.store_apply_bound.map_or(GateConfig::default().apply_bound_ms, |b| b.as_millis() as u64);
            args.request_timeout.as_millis() as u64 + bound
        }),
        test_fault_header: args.test_fault_header.clone(),
        ..Settings::default()
    }
}

/// The provenance check: asked for, or weak wherever there is etcd to ask.
fn provenance(args: &Args) -> ProvenanceArg {
    args.provenance.unwrap_or(if args.no_etcd { ProvenanceArg::Off } else { ProvenanceArg::Weak })
}

/// One `HOST:PORT`: an IP address (a bracketed IPv6 one too) or a DNS name.
struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    fn parse(addr: &str) -> Result<Endpoint> {
        let (host, port) = addr.rsplit_once(':').with_context(|| format!("{addr:?} is not HOST:PORT"))?;
        let port: u16 = port.parse().with_context(|| format!("{addr:?}: bad port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            bail!("{addr:?} is not HOST:PORT: no host");
        }
        Ok(Endpoint { host: host.to_owned(), port })
    }

    fn is_ip(&self) -> bool {
        self.host.parse::<std::net::IpAddr>().is_ok()
    }
}

/// `--upstream`: HOST:PORT, or the same as an `http://` URL with no path (the
/// gateway's `--upstream` form), or an `https://` one. Anything else is refused with
/// what to write: a URL kept whole would become the cluster's host name, which never
/// resolves.
fn parse_upstream(text: &str) -> Result<Upstream, String> {
    let (bare, tls) = match text.split_once("://") {
        None => (text, false),
        Some(("http", rest)) => (rest.strip_suffix('/').unwrap_or(rest), false),
        Some(("https", rest)) => (rest.strip_suffix('/').unwrap_or(rest), true),
        Some((scheme, _)) => {
            return Err(format!(
                "{text:?}: a {scheme}:// upstream is not supported; write HOST:PORT or https://HOST:PORT"
            ))
        }
    };
    if bare.contains(['/', '?', '#']) {
        return Err(format!("{text:?} has a path: write the store as HOST:PORT (the request's path is kept)"));
    }
    Endpoint::parse(bare).map_err(|e| format!("{e:#}"))?;
    Ok(Upstream { address: bare.to_owned(), tls })
}

/// `--etcd`: one member, or every member of an etcd cluster separated by commas.
fn etcd_members(list: &str) -> Result<Vec<Endpoint>> {
    list.split(',').map(|m| Endpoint::parse(m.trim()).with_context(|| format!("--etcd {list:?}"))).collect()
}

/// The health check of an etcd cluster's members (see [`cluster`]), before its codec.
const ETCD_HEALTH_CHECK: &str = "    health_checks:
    - timeout: 1s
      interval: 0.5s
      no_traffic_interval: 0.5s
      unhealthy_threshold: 2
      healthy_threshold: 1
      http_health_check:
        path: /health
        retriable_statuses: [{ start: 503, end: 504 }]
";

/// The filter calls etcd's gRPC API: HTTP/2 to the members (its JSON API: Envoy's
/// default, HTTP/1.1).
const HTTP2: &str = "    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
";

/// A cluster of `endpoints`. Several are etcd members, health-checked on etcd's
/// `/health` (503 while the member has no leader or cannot commit a quorum read in a
/// second) so the filter's calls go to members that answer:
/// * 503 counts toward `unhealthy_threshold` like a timeout (by default Envoy
///   ejects on the first one), and two misses in a row eject: one slow check while
///   the members re-elect after a restart does not take every member away at once.
/// * Envoy's default panic threshold stays: when most members look unhealthy it
///   tries all of them rather than refusing every write without asking. That costs
///   no safety: a member without quorum refuses the Txn, and the filter then refuses
///   the write (503) as it would have.
/// * `no_traffic_interval` is the interval too: a member that fails before the
///   first write is noticed within a second, not a minute.
/// * The cluster speaks HTTP/2 (the filter's calls are gRPC); the health check
///   speaks HTTP/1.1 in plaintext, where etcd hands every HTTP/2 connection to its
///   gRPC server and `/health` is only served over HTTP/1.1, and HTTP/2 over TLS,
///   where ALPN has agreed on h2 and etcd serves `/health` on it.
fn cluster(out: &mut String, name: &str, endpoints: &[Endpoint], etcd: Option<(Tls, EtcdApi)>) -> Result<()> {
    let kind = if endpoints.iter().all(Endpoint::is_ip) { "STATIC" } else { "STRICT_DNS" };
    writeln!(out, "  - name: {name}")?;
    writeln!(out, "    type: {kind}")?;
    writeln!(out, "    connect_timeout: 1s")?;
    if let Some((tls, api)) = etcd {
        if api == EtcdApi::Grpc {
            out.push_str(HTTP2);
        }
        if endpoints.len() > 1 {
            out.push_str(ETCD_HEALTH_CHECK);
            let codec = if tls == Tls::On && api == EtcdApi::Grpc { "HTTP2" } else { "HTTP1" };
            writeln!(out, "        codec_client_type: {codec}")?;
        }
    }
    writeln!(out, "    load_assignment:")?;
    writeln!(out, "      cluster_name: {name}")?;
    writeln!(out, "      endpoints:")?;
    writeln!(out, "      - lb_endpoints:")?;
    for e in endpoints {
        writeln!(out, "        - endpoint:")?;
        writeln!(out, "            address:")?;
        writeln!(out, "              socket_address: {{ address: {}, port_value: {} }}", e.host, e.port)?;
    }
    Ok(())
}

/// Whether Envoy reaches etcd over TLS.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tls {
    On,
    Off,
}

/// TLS for the cluster just written (etcd's, or the store's): each member's
/// certificate checked against `ca` and against the address Envoy dials (an IP or a
/// DNS name in its subject alternative names: any member's will do, as the cluster's
/// members share one check), ALPN `alpn`, and a client certificate when given. A file
/// that does not exist is refused here, so a typo is not an Envoy that cannot start.
fn upstream_tls(
    out: &mut String,
    members: &[Endpoint],
    ca: &Path,
    client: Option<(&Path, &Path)>,
    alpn: &str,
) -> Result<()> {
    let absolute = |p: &Path| -> Result<String> {
        let full = p.canonicalize().with_context(|| format!("cannot read {}", p.display()))?;
        Ok(yaml_single_quoted(&full.display().to_string()))
    };
    writeln!(out, "    transport_socket:")?;
    writeln!(out, "      name: envoy.transport_sockets.tls")?;
    writeln!(out, "      typed_config:")?;
    writeln!(
        out,
        "        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
    )?;
    // SNI is per cluster: sent when every member has the same DNS name.
    if let [first, rest @ ..] = members {
        if !first.is_ip() && rest.iter().all(|m| m.host == first.host) {
            writeln!(out, "        sni: {}", first.host)?;
        }
    }
    writeln!(out, "        common_tls_context:")?;
    writeln!(out, "          alpn_protocols: [{alpn}]")?;
    if let Some((cert, key)) = client {
        writeln!(out, "          tls_certificates:")?;
        writeln!(out, "          - certificate_chain: {{ filename: {} }}", absolute(cert)?)?;
        writeln!(out, "            private_key: {{ filename: {} }}", absolute(key)?)?;
    }
    writeln!(out, "          validation_context:")?;
    writeln!(out, "            trusted_ca: {{ filename: {} }}", absolute(ca)?)?;
    writeln!(out, "            match_typed_subject_alt_names:")?;
    let mut hosts: Vec<&Endpoint> = Vec::new();
    for m in members {
        if !hosts.iter().any(|h| h.host == m.host) {
            hosts.push(m);
        }
    }
    for m in hosts {
        writeln!(out, "            - san_type: {}", if m.is_ip() { "IP_ADDRESS" } else { "DNS" })?;
        writeln!(out, "              matcher: {{ exact: {} }}", yaml_single_quoted(&m.host))?;
    }
    Ok(())
}

/// `--etcd-password-env`: a POSIX environment variable name, as the filter requires
/// (and plain in YAML).
fn check_env_name(var: &str) -> Result<()> {
    let mut bytes = var.bytes();
    let valid = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && var.len() <= 256;
    if !valid {
        bail!("--etcd-password-env {var:?} is not an environment variable name (letters, digits, _)");
    }
    Ok(())
}

fn yaml_single_quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The whole Envoy configuration.
pub fn render(args: &Args, filter: &Path) -> Result<String> {
    if args.no_etcd && args.mode == "correctness" {
        bail!("--no-etcd needs --mode efficiency: correctness mode keeps marks in etcd (shared data dies with Envoy)");
    }
    if args.no_etcd && provenance(args) != ProvenanceArg::Off {
        bail!(
            "--provenance {} asks etcd whether it issued a token: it needs etcd, not --no-etcd",
            provenance(args).name()
        );
    }
    etcd_check(provenance(args), args.lock_prefix.as_deref())?;
    if let Some(var) = &args.etcd_password_env {
        check_env_name(var)?;
    }
    if let Some(user) = args.etcd_user.as_deref().filter(|u| u.is_empty() || u.chars().any(char::is_control)) {
        bail!("--etcd-user {user:?} is not a user name");
    }
    args.protocol.s3_domain(args.s3_domain.as_deref())?;
    let fenced = fenced_methods(args)?;
    let settings = plugin_config(args, fenced.as_deref());
    // What the filter would refuse is refused here, before Envoy loads it.
    Config::from_settings(settings.clone()).map_err(|e| anyhow!("the filter would refuse this configuration: {e}"))?;
    // Keys sorted (serde_json's map), so the output is stable.
    let config = serde_json::to_value(&settings)?.to_string();
    if args.gate_timeout.is_some_and(|b| b.is_zero()) {
        bail!("--gate-timeout must be above 0 (it is how long a write may wait at the ordering gate)");
    }
    if args.request_timeout.is_zero() {
        bail!("--request-timeout must be above 0: Envoy must give up on a store that does not answer");
    }
    if args.conditional_writes && args.mode != "correctness" {
        bail!("--conditional-writes needs --mode correctness: a write that cannot be lent must be refused");
    }
    if args.conditional_writes && args.conditional_max_body == 0 {
        bail!("--conditional-max-body must be above 0");
    }
    let max_body = args.conditional_writes.then_some(args.conditional_max_body);
    let routes = routes(args.protocol.protocol(), fenced.as_deref(), args.request_timeout, max_body);
    let local_replies = local_reply::config(
        &args.front.upstream.address,
        &envoy_duration(args.request_timeout),
        args.protocol.protocol(),
        max_body,
    );
    let mut out = String::new();
    let (code, filter_source) = filter_code(args, filter)?;
    let config = yaml_single_quoted(&config);
    let (listen_address, listen) = args.front.listening()?;
    let (admin_address, admin) = (args.admin.host.clone().unwrap_or_else(|| "127.0.0.1".to_owned()), args.admin.port);
    // Only the variable's name: Envoy copies its value from its own environment into
    // the VM's, where the filter reads it; /config_dump shows the name alone.
    let environment = match &args.etcd_password_env {
        Some(var) => format!(
            "                  # The etcd password: from Envoy's environment, never in this file.\n\
             \x20                 environment_variables:\n\
             \x20                   host_env_keys: [{var}]\n"
        ),
        None => String::new(),
    };
    write!(
        out,
        r#"# Generated by `fencekeeper envoy-config`; see docs/envoy.md.
# Envoy fences the upstream store: writes must carry a fencing token, and a token
# below the highest one seen for the same resource is refused with 409.
admin:
  address:
    socket_address: {{ address: {admin_address}, port_value: {admin} }}
static_resources:
  listeners:
  - name: fencekeeper
    address:
      socket_address: {{ address: {listen_address}, port_value: {listen} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: fencekeeper
          # One spelling per file: the resource key is the normalized, decoded path.
          normalize_path: true
          merge_slashes: true
          path_with_escaped_slashes_action: REJECT_REQUEST
{local_replies}          route_config:
            virtual_hosts:
            - name: store
              domains: ["*"]
              # Requests the filter would not fence skip it and never enter its VM;
              # a client's own fencing-admitted-token is removed here instead.
              routes:
{routes}          http_filters:
          - name: fencekeeper
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: fencekeeper
                root_id: fencekeeper
                # After a guest fault the VM is reloaded and the shared-data marks
                # stay; requests meanwhile get 503 (FAIL_OPEN would bypass fencing).
                failure_policy: FAIL_RELOAD
                vm_config:
                  vm_id: fencekeeper
                  runtime: envoy.wasm.runtime.v8
                  code:
{code}{environment}                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {config}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
"#
    )?;
    let store = Endpoint::parse(&args.front.upstream.address).context("--upstream")?;
    let store_ca = args.front.upstream_ca()?;
    cluster(&mut out, STORE_CLUSTER, std::slice::from_ref(&store), None)?;
    if let Some(ca) = &store_ca {
        // The store over TLS: its certificate checked against its CA and its name.
        upstream_tls(&mut out, std::slice::from_ref(&store), ca, None, "http/1.1")?;
    }
    if let Some(source) = &filter_source {
        cluster(&mut out, FILTER_SOURCE, std::slice::from_ref(source), None)?;
    }
    if !args.no_etcd {
        let members = etcd_members(&args.etcd)?;
        let tls = if args.etcd_cacert.is_some() { Tls::On } else { Tls::Off };
        cluster(&mut out, DEFAULT_ETCD_CLUSTER, &members, Some((tls, args.etcd_api)))?;
        if let Some(ca) = &args.etcd_cacert {
            let client = args.etcd_cert.as_deref().zip(args.etcd_key.as_deref());
            // gRPC: etcd's TLS listener serves it on h2; the JSON API on HTTP/1.1.
            let alpn = if args.etcd_api == EtcdApi::Grpc { "h2" } else { "http/1.1" };
            upstream_tls(&mut out, &members, ca, client, alpn)?;
        }
    }
    Ok(out)
}
