//! The parsed and validated configuration, and the rules that validate it.
//!
//! An empty configuration means: token in `fencing-token`, resource = the request
//! path, every method but GET/HEAD/OPTIONS fenced, correctness mode, not strict,
//! marks in etcd through the Envoy cluster `fencekeeper_etcd`, no provenance check
//! (`fencekeeper envoy-config` writes `"provenance": "weak"`), the ordering gate on.
//! docs/envoy.md is the reference for each field.

use crate::settings::{
    EtcdApiName, EtcdSettings, GateSettings, HostName, KeyFrom, ModeName, ProtocolName, ProvenanceName,
    ResourceSettings, Settings, Switch,
};
use fencekeeper_core::http;
use fencekeeper_core::protocol::METADATA_PREFIX;
use fencekeeper_core::s3;
use fencekeeper_core::{Mode, Policy, Protocol, Writes};
use fencekeeper_engine::gate;
use std::fmt;

/// Conditional writes' settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conditional {
    /// The store was seen honouring `If-Match` on DELETE (`fencekeeper envoy-config`'s
    /// probe): deletes are sent conditionally; else they are refused.
    pub deletes: bool,
    /// The largest body a conditional write may have: the filter holds a PUT's body
    /// whole (its MD5 is the version it makes) and refuses a larger one (413) before
    /// any of it reaches the store.
    pub max_body: u64,
    /// How long after it is sent the store may still apply a write: Envoy's route
    /// timeout plus the store apply bound. A write given up on stays lent on its
    /// chain that long, then ends by itself.
    pub lend_ms: u64,
    /// The proxy's cluster of the store (the route's own): the filter asks the store
    /// itself for a version it does not know, with a HEAD of the object through it.
    /// `None`: only a client's read through the proxy tells it.
    pub store_cluster: Option<String>,
}

/// `conditional_max_body`'s default: 16 MiB.
pub const DEFAULT_CONDITIONAL_MAX_BODY: u64 = 16 << 20;
/// `conditional_lend_ms`'s default: Envoy's default route timeout in
/// `fencekeeper envoy-config` (60 s) plus the engine's store apply bound (60 s).
pub const DEFAULT_CONDITIONAL_LEND_MS: u64 = 60_000 + gate::STORE_APPLY_BOUND.as_millis() as u64;

/// The parsed and validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The request header carrying the token (lower case).
    pub token_header: String,
    /// With protocol s3, the object metadata header that may carry it too
    /// (`x-amz-meta-` + the token header); derived from the two, never set alone.
    pub token_metadata_header: Option<String>,
    /// How the resource key is derived from a request.
    pub resource: ResourceFrom,
    /// The store's protocol: which methods read, which resources a write names.
    pub protocol: Protocol,
    /// With protocol s3, the store's S3 domain (`fencekeeper_core::s3`): a request to
    /// `BUCKET.` + it names its bucket in `:authority`. `None`: a domain name there is
    /// refused.
    pub s3_domain: Option<String>,
    /// Methods that are fenced; `None` = every method but the protocol's reads.
    pub fenced_methods: Option<Vec<String>>,
    /// Mode and strictness, for the core.
    pub policy: Policy,
    /// The durable shared mark store; `None` = proxy shared data only.
    pub etcd: Option<Etcd>,
    /// How many shared-data slot keys hold the local marks.
    pub shared_slots: u32,
    /// With etcd, the most marks the shared-data copy holds, a cache of etcd's: past
    /// it, the marks of resources with no write in flight are evicted, and a miss
    /// asks etcd. `None` without etcd: the shared data then holds the only copy, and
    /// forgetting a mark would let a stale writer in, so nothing is evicted.
    pub shared_marks_max: Option<u32>,
    /// Whether etcd must vouch for a token before it advances a mark.
    pub provenance: Provenance,
    /// The ordering gate (`gate`); `None`: off (UNSAFE: a slow lower-token write can
    /// land after a higher one).
    pub gate: Option<GateConfig>,
    /// For this long after the process's shared data was made (Envoy's start), fenced
    /// writes are refused (503, `Retry-After`): writes a previous Envoy had in flight
    /// when it died may still reach the store, and its gate died with it. 0: off.
    pub start_grace_ms: u64,
    /// Conditional writes: the store's own compare-and-swap enforces the order. Each
    /// admitted PUT or DELETE is lent on its resource's version chain in etcd and goes
    /// with `If-Match` on the version the store gave the last write (`If-None-Match: *`
    /// while absent); the store's answer settles the chain. `None`: off.
    pub conditional: Option<Conditional>,
    /// What the proxy-wasm host provides (docs/proxy-wasm-hosts.md).
    pub host: Host,
    /// Testing only (the `faults` build, `test-guests/filter_faults.wasm`): a request
    /// carrying this header makes the filter trap. The shipped filter has no such
    /// field and refuses a configuration that sets it.
    #[cfg(feature = "faults")]
    pub test_fault_header: Option<String>,
}

/// What the proxy-wasm host provides, as far as the filter relies on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Host {
    /// Envoy's behaviour: a shared queue of any name, whose enqueues call
    /// `on_queue_ready` on the worker that registered it; gRPC calls (etcd);
    /// `proxy_set_effective_context`, with which the root answers and resumes a
    /// request it holds; `response.code_details`.
    #[default]
    Envoy,
    /// Only what every proxy-wasm host provides (ngx_wasm_module, Kong): no shared
    /// queue is registered (a host may trap on a name it was not given), no gRPC call
    /// is made (marks in etcd are refused per write, 503), a write that would wait at
    /// the ordering gate is refused at once (503, `Retry-After`: nothing can resume it
    /// later), and whether an answer was the store's is read from its status.
    Portable,
}

impl Host {
    /// Whether the host makes gRPC calls (`proxy_grpc_call`).
    pub fn grpc_calls(self) -> bool {
        self == Host::Envoy
    }

    /// The etcd API the filter calls on this host unless told: gRPC where the host
    /// makes gRPC calls (half etcd's CPU a call), else etcd's JSON gateway.
    pub fn etcd_api(self) -> EtcdApi {
        if self.grpc_calls() {
            EtcdApi::Grpc
        } else {
            EtcdApi::Json
        }
    }
}

/// Which of etcd's APIs the filter calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtcdApi {
    /// gRPC (`etcdserverpb.KV/Txn` ...) through `proxy_grpc_call`: the cluster speaks
    /// HTTP/2 to etcd's client port.
    Grpc,
    /// etcd's JSON gateway (`POST /v3/kv/txn` ...) through `proxy_http_call`: the
    /// cluster speaks HTTP/1.1 to etcd's client port (on ngx_wasm_module, the cluster
    /// is `host:port`).
    Json,
}

/// Where the resource key comes from: the core's rule, shared with the gateway.
pub type ResourceFrom = http::ResourceFrom<String>;

/// How the filter reaches etcd's gRPC API.
#[derive(Clone, Debug, PartialEq)]
pub struct Etcd {
    /// The Envoy cluster that routes to etcd's client port (HTTP/2).
    pub cluster: String,
    /// The `:authority` sent to etcd.
    pub authority: String,
    /// Both, as the upstream of a gRPC call ([`service`]).
    pub service: String,
    /// Which of etcd's APIs the calls go to.
    pub api: EtcdApi,
    /// Prefix of mark keys; the resource key follows it.
    pub key_prefix: String,
    /// Prefix of the shared in-flight registry's keys (`gate.shared`).
    pub flight_prefix: String,
    /// How long one etcd call may take before the request is undecided.
    pub timeout_ms: u64,
    /// etcd's user/password authentication; `None`: no authentication.
    pub auth: Option<EtcdAuth>,
    /// Concurrent checks of a token equal to the mark, on one resource, share one
    /// etcd Txn (`confirms`). Off with etcd authentication (a batch's Txn is the
    /// VM's, not a request's, and carries no token).
    pub batch_confirms: bool,
}

/// The ordering gate's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateConfig {
    /// The longest an admitted write is held back for lower-token writes (then 503
    /// with `Retry-After`). Default: the engine's `GATE_TIMEOUT`, 5 s.
    pub budget_ms: u64,
    /// The store apply bound: how long after the filter gave up on a write (a timeout,
    /// a reset, a client gone, a worker gone) the store may still apply it. Until
    /// then the write holds its resource. Set it at or above the store's own request
    /// timeout. Default: the engine's `STORE_APPLY_BOUND`, 60 s (the gateway's too).
    pub apply_bound_ms: u64,
    /// How often each worker's root re-checks the writes it holds and stamps its
    /// heartbeat.
    pub tick_ms: u64,
    /// Order writes across instances too, through the in-flight registry in etcd
    /// (`shared`): for a store written through several Envoys and gateways. On by
    /// default whenever the marks are in etcd: marks go there so that instances can
    /// share them, and instances that share marks but not the gate lose the order of
    /// a slow write (`"shared": false` opts out, for a resource written through one
    /// instance only).
    pub shared: bool,
    /// With `shared`: the longest Envoy takes to give up on a write it sent (the
    /// route timeout). A worker's lease in etcd outlives each of its flights by this
    /// plus the apply bound.
    pub flight_ms: u64,
}

impl Default for GateConfig {
    fn default() -> GateConfig {
        // The gate timeout and the store apply bound are the engine's, as the gateway's.
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        GateConfig {
            budget_ms: ms(gate::GATE_TIMEOUT),
            apply_bound_ms: ms(gate::STORE_APPLY_BOUND),
            tick_ms: 100,
            // As with the default mark store, etcd; without etcd the default is off.
            shared: true,
            flight_ms: 60_000,
        }
    }
}

/// The etcd user the filter authenticates as. The password is not in the
/// configuration (Envoy shows that to anyone with its admin `/config_dump`): it is
/// read from the VM's environment, which Envoy fills from its own process
/// environment with the variables `vm_config.environment_variables.host_env_keys`
/// names.
#[derive(Clone, Debug, PartialEq)]
pub struct EtcdAuth {
    /// The etcd user name.
    pub user: String,
    /// The environment variable that holds the password.
    pub password_env: String,
}

/// The longest etcd user name or environment variable name accepted.
const MAX_NAME_BYTES: usize = 256;

/// The provenance check: before a token advances a mark, ask the marks' etcd whether
/// it issued it (`fencekeeper_etcd_wire::provenance` holds the rules).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// No check.
    Off,
    /// The token is not above etcd's revision.
    Weak,
    /// The token is the current holder's, of the lock `lock_prefix + resource`.
    Strong {
        /// Prepended to the resource to name its lock.
        lock_prefix: String,
    },
}

/// Why a configuration was refused.
#[derive(Debug, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The etcd key prefix shared with the gateway (host/fencekeeper's etcd store).
pub const DEFAULT_KEY_PREFIX: &str = fencekeeper_etcd_wire::DEFAULT_PREFIX;
/// The default name of the etcd cluster in the Envoy configuration.
pub const DEFAULT_ETCD_CLUSTER: &str = "fencekeeper_etcd";

/// The longest budget, apply bound or start grace accepted: a day. Longer is a typo.
const MAX_GATE_MS: u64 = 86_400_000;
/// The default `:authority` of the filter's calls to etcd.
const DEFAULT_AUTHORITY: &str = "etcd";
/// The default bound on one etcd call.
const DEFAULT_ETCD_TIMEOUT_MS: u64 = 1000;
/// The default number of shared-data slot keys.
const DEFAULT_SHARED_SLOTS: u32 = 256;
/// The default bound on the shared-data copy of etcd's marks: 256 marks a slot with
/// the default slots (every request decodes its slot whole), a few MiB in all.
const DEFAULT_SHARED_MARKS_MAX: u32 = 65_536;

/// The gRPC upstream of the filter's calls to etcd, as proxy-wasm's
/// `dispatch_grpc_call` takes it: a serialized `envoy.config.core.v3.GrpcService`
/// naming the cluster and the `:authority` (Envoy's own `GrpcService` field order).
/// Envoy would take a bare cluster name too, but only after failing to parse it as
/// this message, and some names parse. Both are short (the configuration bounds
/// them to [`MAX_SERVICE_NAME_BYTES`]), so every length is one byte and the message
/// is ASCII.
pub fn service(cluster: &str, authority: &str) -> String {
    // GrpcService { envoy_grpc (1): EnvoyGrpc { cluster_name (1), authority (2) } }
    let mut inner = String::new();
    for (field, text) in [(1u8, cluster), (2, authority)] {
        if !text.is_empty() {
            inner.push(char::from(field << 3 | 2));
            inner.push(char::from(text.len() as u8));
            inner.push_str(text);
        }
    }
    format!("{}{}{inner}", char::from(1u8 << 3 | 2), char::from(inner.len() as u8))
}

/// The longest cluster name or authority: the [`service`] message stays one with
/// one-byte lengths.
pub const MAX_SERVICE_NAME_BYTES: usize = 60;

fn etcd_auth(user: Option<String>, password_env: Option<String>) -> Result<Option<EtcdAuth>, ConfigError> {
    let (user, password_env) = match (user, password_env) {
        (None, None) => return Ok(None),
        (Some(user), Some(env)) => (user, env),
        (Some(_), None) => {
            return Err(ConfigError(
                "etcd.user needs etcd.password_env (the environment variable that holds the password)".into(),
            ))
        }
        (None, Some(_)) => return Err(ConfigError("etcd.password_env needs etcd.user".into())),
    };
    if user.is_empty() || user.len() > MAX_NAME_BYTES || user.chars().any(char::is_control) {
        return Err(ConfigError(format!("etcd.user {:?} is not a user name", fencekeeper_etcd_wire::excerpt(&user))));
    }
    // A POSIX environment variable name: what Envoy's host_env_keys can name.
    let mut bytes = password_env.bytes();
    let valid = password_env.len() <= MAX_NAME_BYTES
        && bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(ConfigError(format!(
            "etcd.password_env {} is not an environment variable name",
            fencekeeper_etcd_wire::excerpt(&password_env)
        )));
    }
    Ok(Some(EtcdAuth { user, password_env }))
}

fn header_name(what: &str, name: String) -> Result<String, ConfigError> {
    let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !valid {
        return Err(ConfigError(format!("{what} {name:?} is not an HTTP header name")));
    }
    Ok(name.to_ascii_lowercase())
}

/// serde reads a struct from a JSON array too (its fields in order): a section
/// written as `[...]` is refused, so every field a configuration sets is named.
fn sections_are_objects(value: &serde_json::Value) -> Result<(), ConfigError> {
    let serde_json::Value::Object(top) = value else {
        return Err(ConfigError("configuration is not valid: not a JSON object".into()));
    };
    for section in ["resource", "etcd", "gate"] {
        if let Some(v) = top.get(section).filter(|v| !v.is_object() && !v.is_null()) {
            let kind = if v.is_array() { "an array" } else { "not an object" };
            return Err(ConfigError(format!("configuration is not valid: {section} is {kind}, write it as {{...}}")));
        }
    }
    Ok(())
}

impl Config {
    /// Parse the plugin configuration (empty or whitespace = all defaults).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|_| ConfigError("configuration is not UTF-8".into()))?;
        if text.trim().is_empty() {
            return Config::from_settings(Settings::default());
        }
        let invalid = |e: serde_json::Error| ConfigError(format!("configuration is not valid: {e}"));
        let value: serde_json::Value = serde_json::from_str(text).map_err(invalid)?;
        sections_are_objects(&value)?;
        Config::from_settings(serde_json::from_value(value).map_err(invalid)?)
    }

    /// Validate a configuration as written, filling in the defaults.
    pub fn from_settings(settings: Settings) -> Result<Config, ConfigError> {
        let mode = match settings.mode.unwrap_or(ModeName::Correctness) {
            ModeName::Correctness => Mode::Correctness,
            ModeName::Efficiency => Mode::Efficiency,
        };
        let raw_resource = settings.resource.unwrap_or_default();
        let resource = match raw_resource.from.unwrap_or(KeyFrom::Path) {
            KeyFrom::Path => {
                if raw_resource.header.is_some() {
                    return Err(ConfigError("resource.header needs resource.from = \"header\"".into()));
                }
                ResourceFrom::Path { strip_prefix: raw_resource.strip_prefix.unwrap_or_default() }
            }
            KeyFrom::Header => {
                if raw_resource.strip_prefix.is_some() {
                    return Err(ConfigError("resource.strip_prefix needs resource.from = \"path\"".into()));
                }
                let name = raw_resource
                    .header
                    .ok_or_else(|| ConfigError("resource.from = \"header\" needs resource.header".into()))?;
                ResourceFrom::Header(header_name("resource.header", name)?)
            }
        };
        let protocol = match settings.protocol.unwrap_or(ProtocolName::Http) {
            ProtocolName::Http => Protocol::Http,
            ProtocolName::Webdav => Protocol::Webdav,
            ProtocolName::S3 => Protocol::S3,
        };
        if protocol == Protocol::Webdav && matches!(resource, ResourceFrom::Header(_)) {
            return Err(ConfigError(
                "protocol \"webdav\" names resources by path (COPY and MOVE write their Destination's path); \
                 it cannot take them from resource.header"
                    .into(),
            ));
        }
        let s3_domain = match settings.s3_domain {
            Some(_) if protocol != Protocol::S3 => {
                return Err(ConfigError("s3_domain goes with protocol \"s3\"".into()));
            }
            Some(d) => {
                s3::check_domain(&d).map_err(|why| ConfigError(format!("s3_domain {d:?}: {why}")))?;
                Some(d)
            }
            None => None,
        };
        let fenced_methods = match settings.fenced_methods {
            Some(list) if list.is_empty() => {
                return Err(ConfigError("fenced_methods is empty: nothing would be fenced".into()))
            }
            Some(list) => Some(list.into_iter().map(|m| m.to_ascii_uppercase()).collect()),
            None => None,
        };
        let host = match settings.host.unwrap_or(HostName::Envoy) {
            HostName::Envoy => Host::Envoy,
            HostName::Portable => Host::Portable,
        };
        let etcd = match settings.etcd {
            Switch::Default => Some(etcd(EtcdSettings::default(), host)?),
            Switch::On(e) => Some(etcd(e, host)?),
            Switch::Off if mode == Mode::Correctness => {
                return Err(ConfigError(
                    "correctness mode needs etcd (marks in shared data die with the proxy); set \"mode\": \"efficiency\" to run without it".into(),
                ))
            }
            Switch::Off => None,
        };
        let provenance = match (settings.provenance.unwrap_or(ProvenanceName::Off), settings.lock_prefix) {
            (ProvenanceName::Off, None) => Provenance::Off,
            (_, _) if etcd.is_none() => {
                return Err(ConfigError("provenance and lock_prefix need etcd: the check asks etcd".into()))
            }
            (ProvenanceName::Weak, None) => Provenance::Weak,
            (ProvenanceName::Strong, Some(lock_prefix)) => Provenance::Strong { lock_prefix },
            (ProvenanceName::Strong, None) => {
                return Err(ConfigError(
                    "provenance \"strong\" needs lock_prefix (a resource's lock is lock_prefix + resource)".into(),
                ))
            }
            (_, Some(_)) => return Err(ConfigError("lock_prefix goes with provenance \"strong\"".into())),
        };
        let conditional = match (settings.conditional_writes.unwrap_or(false), settings.conditional_deletes) {
            (false, _)
                if settings.conditional_deletes.is_some()
                    || settings.conditional_max_body.is_some()
                    || settings.conditional_lend_ms.is_some()
                    || settings.conditional_store_cluster.is_some() =>
            {
                return Err(ConfigError(
                    "conditional_deletes, conditional_max_body, conditional_lend_ms and conditional_store_cluster go \
                     with conditional_writes"
                        .into(),
                ))
            }
            (false, _) => None,
            (true, deletes) => {
                let max_body = settings.conditional_max_body.unwrap_or(DEFAULT_CONDITIONAL_MAX_BODY);
                if max_body == 0 {
                    return Err(ConfigError("conditional_max_body must be above 0".into()));
                }
                let lend_ms = settings.conditional_lend_ms.unwrap_or(DEFAULT_CONDITIONAL_LEND_MS);
                if !(1000..=MAX_GATE_MS).contains(&lend_ms) {
                    return Err(ConfigError(format!(
                        "conditional_lend_ms {lend_ms} is out of range: 1000 (1 s) to {MAX_GATE_MS} (a day); it is \
                         the route timeout plus how long the store may still apply a write after it"
                    )));
                }
                let store_cluster = settings.conditional_store_cluster.clone();
                if store_cluster.as_ref().is_some_and(|c| c.is_empty() || c.len() > MAX_SERVICE_NAME_BYTES) {
                    return Err(ConfigError(format!(
                        "conditional_store_cluster is 1 to {MAX_SERVICE_NAME_BYTES} bytes: the proxy's cluster of the \
                         store, which the filter asks for a version it does not know"
                    )));
                }
                Some(Conditional { deletes: deletes.unwrap_or(false), max_body, lend_ms, store_cluster })
            }
        };
        if conditional.is_some() {
            if etcd.is_none() || mode != Mode::Correctness {
                return Err(ConfigError(
                    "conditional_writes needs correctness mode and etcd: the version chains live in etcd, and a \
                     write the filter cannot lend must be refused, never sent without its precondition"
                        .into(),
                ));
            }
            if matches!(resource, ResourceFrom::Header(_)) {
                return Err(ConfigError(
                    "conditional_writes needs resources named by path: the store's version is the object's the \
                     request writes"
                        .into(),
                ));
            }
            if matches!(settings.gate, Switch::On(_)) {
                return Err(ConfigError(
                    "conditional_writes replaces the ordering gate (the store refuses a late write itself): leave \
                     gate out"
                        .into(),
                ));
            }
        }
        let gate = match settings.gate {
            Switch::Off => None,
            Switch::Default if conditional.is_some() => None,
            Switch::Default => Some(gate(GateSettings::default(), etcd.is_some())?),
            Switch::On(g) => Some(gate(g, etcd.is_some())?),
        };
        let start_grace_ms = settings.start_grace_ms.unwrap_or(0);
        if start_grace_ms > MAX_GATE_MS {
            return Err(ConfigError(format!("start_grace_ms must be at most {MAX_GATE_MS}")));
        }
        let shared_slots = settings.shared_slots.unwrap_or(DEFAULT_SHARED_SLOTS);
        if !(1..=65536).contains(&shared_slots) {
            return Err(ConfigError("shared_slots must be between 1 and 65536".into()));
        }
        let shared_marks_max = match (settings.shared_marks_max, &etcd) {
            (Some(_), None) => {
                return Err(ConfigError(
                    "shared_marks_max needs etcd: without it the shared data holds the only copy of the marks, \
                     and evicting one would admit a stale writer again"
                        .into(),
                ))
            }
            (Some(0), Some(_)) => return Err(ConfigError("shared_marks_max must be at least 1".into())),
            (max, Some(_)) => Some(max.unwrap_or(DEFAULT_SHARED_MARKS_MAX)),
            (None, None) => None,
        };
        let token_header =
            header_name("token_header", settings.token_header.unwrap_or_else(|| http::TOKEN_HEADER.to_owned()))?;
        let token_metadata_header = protocol.token_in_metadata().then(|| format!("{METADATA_PREFIX}{token_header}"));
        Ok(Config {
            token_header,
            token_metadata_header,
            resource,
            protocol,
            s3_domain,
            fenced_methods,
            policy: Policy { mode, strict: settings.strict.unwrap_or(false) },
            etcd,
            shared_slots,
            shared_marks_max,
            provenance,
            gate,
            start_grace_ms,
            conditional,
            host,
            #[cfg(feature = "faults")]
            test_fault_header: settings.test_fault_header.map(|h| header_name("test_fault_header", h)).transpose()?,
        })
    }

    /// The configuration written back, every field spelled out: it parses to itself.
    pub fn to_settings(&self) -> Settings {
        let Config {
            token_header,
            token_metadata_header: _,
            resource,
            protocol,
            s3_domain,
            fenced_methods,
            policy,
            etcd,
            shared_slots,
            shared_marks_max,
            provenance,
            gate,
            start_grace_ms,
            conditional,
            host,
            #[cfg(feature = "faults")]
            test_fault_header,
        } = self;
        let resource = match resource {
            ResourceFrom::Path { strip_prefix } => {
                ResourceSettings { from: Some(KeyFrom::Path), header: None, strip_prefix: Some(strip_prefix.clone()) }
            }
            ResourceFrom::Header(h) => {
                ResourceSettings { from: Some(KeyFrom::Header), header: Some(h.clone()), strip_prefix: None }
            }
        };
        let etcd = match etcd {
            None => Switch::Off,
            Some(e) => {
                // `service` is derived from the cluster and the authority: not written.
                let Etcd {
                    cluster,
                    authority,
                    service: _,
                    api,
                    key_prefix,
                    flight_prefix,
                    timeout_ms,
                    auth,
                    batch_confirms,
                } = e;
                Switch::On(EtcdSettings {
                    cluster: Some(cluster.clone()),
                    authority: Some(authority.clone()),
                    key_prefix: Some(key_prefix.clone()),
                    flight_prefix: Some(flight_prefix.clone()),
                    timeout_ms: Some(*timeout_ms),
                    user: auth.as_ref().map(|a| a.user.clone()),
                    password_env: auth.as_ref().map(|a| a.password_env.clone()),
                    batch_confirms: Some(*batch_confirms),
                    // The host's own is left unwritten: `envoy-config`'s output stays as it was.
                    api: (*api != host.etcd_api()).then_some(match api {
                        EtcdApi::Grpc => EtcdApiName::Grpc,
                        EtcdApi::Json => EtcdApiName::Json,
                    }),
                })
            }
        };
        let (provenance, lock_prefix) = match provenance {
            Provenance::Off => (ProvenanceName::Off, None),
            Provenance::Weak => (ProvenanceName::Weak, None),
            Provenance::Strong { lock_prefix } => (ProvenanceName::Strong, Some(lock_prefix.clone())),
        };
        let gate = match gate {
            None => Switch::Off,
            Some(GateConfig { budget_ms, apply_bound_ms, tick_ms, shared, flight_ms }) => Switch::On(GateSettings {
                budget_ms: Some(*budget_ms),
                apply_bound_ms: Some(*apply_bound_ms),
                tick_ms: Some(*tick_ms),
                shared: Some(*shared),
                flight_ms: Some(*flight_ms),
            }),
        };
        Settings {
            token_header: Some(token_header.clone()),
            resource: Some(resource),
            protocol: Some(match protocol {
                Protocol::Http => ProtocolName::Http,
                Protocol::Webdav => ProtocolName::Webdav,
                Protocol::S3 => ProtocolName::S3,
            }),
            s3_domain: s3_domain.clone(),
            fenced_methods: fenced_methods.clone(),
            mode: Some(match policy.mode {
                Mode::Correctness => ModeName::Correctness,
                Mode::Efficiency => ModeName::Efficiency,
            }),
            strict: Some(policy.strict),
            etcd,
            shared_slots: Some(*shared_slots),
            shared_marks_max: *shared_marks_max,
            provenance: Some(provenance),
            lock_prefix,
            gate,
            start_grace_ms: Some(*start_grace_ms),
            conditional_writes: conditional.as_ref().map(|_| true),
            conditional_deletes: conditional.as_ref().map(|c| c.deletes),
            conditional_max_body: conditional.as_ref().map(|c| c.max_body),
            conditional_lend_ms: conditional.as_ref().map(|c| c.lend_ms),
            conditional_store_cluster: conditional.as_ref().and_then(|c| c.store_cluster.clone()),
            // Envoy, the default, is left unwritten: `envoy-config`'s output stays as it was.
            host: (*host == Host::Portable).then_some(HostName::Portable),
            #[cfg(feature = "faults")]
            test_fault_header: test_fault_header.clone(),
        }
    }

    /// Whether the filter can reach its etcd on this host: through its JSON API
    /// anywhere, through gRPC only where the host makes gRPC calls. `false` without
    /// etcd.
    pub fn reaches_etcd(&self) -> bool {
        self.etcd.as_ref().is_some_and(|e| e.api == EtcdApi::Json || self.host.grpc_calls())
    }

    /// Whether requests with this method are fenced (the protocol's rule).
    pub fn fences(&self, method: &str) -> bool {
        self.protocol.fences(method, self.fenced_methods.as_deref())
    }

    /// The resources a fenced request with this method writes (the protocol's rule).
    pub fn writes(&self, method: &str) -> Writes {
        self.protocol.writes(method)
    }
}

fn etcd(e: EtcdSettings, host: Host) -> Result<Etcd, ConfigError> {
    let cluster = e.cluster.unwrap_or_else(|| DEFAULT_ETCD_CLUSTER.to_owned());
    let authority = e.authority.unwrap_or_else(|| DEFAULT_AUTHORITY.to_owned());
    let timeout_ms = e.timeout_ms.unwrap_or(DEFAULT_ETCD_TIMEOUT_MS);
    if cluster.is_empty() {
        return Err(ConfigError("etcd.cluster is empty".into()));
    }
    if timeout_ms == 0 {
        return Err(ConfigError("etcd.timeout_ms must be above 0".into()));
    }
    if [&cluster, &authority].iter().any(|n| n.len() > MAX_SERVICE_NAME_BYTES) {
        return Err(ConfigError(format!(
            "etcd.cluster and etcd.authority are at most {MAX_SERVICE_NAME_BYTES} bytes each"
        )));
    }
    Ok(Etcd {
        service: service(&cluster, &authority),
        api: match e.api {
            None => host.etcd_api(),
            Some(EtcdApiName::Grpc) => EtcdApi::Grpc,
            Some(EtcdApiName::Json) => EtcdApi::Json,
        },
        batch_confirms: e.batch_confirms.unwrap_or(true),
        auth: etcd_auth(e.user, e.password_env)?,
        cluster,
        authority,
        key_prefix: e.key_prefix.unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_owned()),
        flight_prefix: e
            .flight_prefix
            .unwrap_or_else(|| fencekeeper_etcd_wire::flights::DEFAULT_FLIGHT_PREFIX.to_owned()),
        timeout_ms,
    })
}

fn gate(g: GateSettings, has_etcd: bool) -> Result<GateConfig, ConfigError> {
    let d = GateConfig::default();
    let gate = GateConfig {
        budget_ms: g.budget_ms.unwrap_or(d.budget_ms),
        apply_bound_ms: g.apply_bound_ms.unwrap_or(d.apply_bound_ms),
        tick_ms: g.tick_ms.unwrap_or(d.tick_ms),
        shared: g.shared.unwrap_or(has_etcd),
        flight_ms: g.flight_ms.unwrap_or(d.flight_ms),
    };
    if gate.budget_ms == 0 || gate.budget_ms > MAX_GATE_MS {
        return Err(ConfigError(format!("gate.budget_ms must be between 1 and {MAX_GATE_MS}")));
    }
    if gate.apply_bound_ms > MAX_GATE_MS {
        return Err(ConfigError(format!("gate.apply_bound_ms must be at most {MAX_GATE_MS}")));
    }
    if !(10..=10_000).contains(&gate.tick_ms) {
        return Err(ConfigError("gate.tick_ms must be between 10 and 10000".into()));
    }
    if gate.flight_ms > MAX_GATE_MS {
        return Err(ConfigError(format!("gate.flight_ms must be at most {MAX_GATE_MS}")));
    }
    if gate.shared && !has_etcd {
        return Err(ConfigError("gate.shared needs etcd: the in-flight registry lives there".into()));
    }
    Ok(gate)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn empty_configuration_is_all_defaults() {
        let c = Config::parse(b"").unwrap();
        assert_eq!(c.token_header, "fencing-token");
        assert_eq!(c.resource, ResourceFrom::Path { strip_prefix: String::new() });
        assert_eq!(c.policy, Policy::default());
        assert_eq!(c.etcd.as_ref().unwrap().cluster, DEFAULT_ETCD_CLUSTER);
        assert_eq!(c.etcd.as_ref().unwrap().key_prefix, "/fencekeeper/marks/");
        assert!(c.fences("PUT") && c.fences("DELETE") && c.fences("POST"));
        assert!(!c.fences("GET") && !c.fences("HEAD") && !c.fences("OPTIONS"));
        assert_eq!(c.gate, Some(GateConfig::default()), "the ordering gate is on by default");
        assert_eq!(c.start_grace_ms, 0);
        assert_eq!(Config::parse(b"{}").unwrap(), c);
    }

    #[test]
    fn the_host_is_envoy_unless_portable_is_written_and_round_trips_either_way() {
        assert_eq!(Config::parse(b"{}").unwrap().host, Host::Envoy);
        assert_eq!(Config::parse(br#"{"host":"envoy"}"#).unwrap().host, Host::Envoy);
        let portable = Config::parse(br#"{"host":"portable","etcd":null,"mode":"efficiency"}"#).unwrap();
        assert_eq!(portable.host, Host::Portable);
        assert_eq!(Config::from_settings(portable.to_settings()).unwrap(), portable);
        assert_eq!(Config::parse(b"{}").unwrap().to_settings().host, None, "envoy, the default, is not written");
        assert!(Config::parse(br#"{"host":"nginx"}"#).is_err());
        assert!(Config::parse(br#"{"host":null}"#).is_err());
        // Marks in etcd on a host without gRPC calls configure: each write is refused.
        assert_eq!(Config::parse(br#"{"host":"portable"}"#).unwrap().host, Host::Portable);
    }

    #[test]
    fn etcds_api_is_the_hosts_unless_written_and_round_trips() {
        let api = |json: &[u8]| Config::parse(json).map(|c| (c.etcd.as_ref().map(|e| e.api), c.reaches_etcd()));
        assert_eq!(api(b"{}").unwrap(), (Some(EtcdApi::Grpc), true));
        assert_eq!(api(br#"{"host":"portable"}"#).unwrap(), (Some(EtcdApi::Json), true));
        assert_eq!(api(br#"{"etcd":{"api":"json"}}"#).unwrap(), (Some(EtcdApi::Json), true));
        // gRPC asked of a host without gRPC calls configures; each write is refused.
        assert_eq!(api(br#"{"host":"portable","etcd":{"api":"grpc"}}"#).unwrap(), (Some(EtcdApi::Grpc), false));
        assert_eq!(api(br#"{"etcd":null,"mode":"efficiency"}"#).unwrap(), (None, false));
        assert!(api(br#"{"etcd":{"api":"rest"}}"#).is_err());
        for json in [&br#"{"etcd":{"api":"json"}}"#[..], br#"{"host":"portable","etcd":{"api":"grpc"}}"#, b"{}"] {
            let c = Config::parse(json).unwrap();
            assert_eq!(Config::from_settings(c.to_settings()).unwrap(), c);
        }
        let default = Config::parse(b"{}").unwrap().to_settings();
        assert!(
            matches!(default.etcd, Switch::On(EtcdSettings { api: None, .. })),
            "the host's own API is not written"
        );
    }

    #[test]
    fn conditional_writes_need_etcd_correctness_and_paths_and_replace_the_gate() {
        let c = Config::parse(br#"{"protocol":"s3","conditional_writes":true}"#).unwrap();
        let lend_ms = DEFAULT_CONDITIONAL_LEND_MS;
        let default = Conditional { max_body: DEFAULT_CONDITIONAL_MAX_BODY, lend_ms, ..Conditional::default() };
        assert_eq!((c.conditional.clone(), c.gate), (Some(default), None));
        assert_eq!(Config::from_settings(c.to_settings()).unwrap(), c, "it round-trips");
        let c = Config::parse(
            br#"{"conditional_writes":true,"conditional_deletes":true,"conditional_max_body":9,"conditional_lend_ms":5000,
                "conditional_store_cluster":"store"}"#,
        )
        .unwrap();
        let store_cluster = Some("store".to_owned());
        assert_eq!(c.conditional, Some(Conditional { deletes: true, max_body: 9, lend_ms: 5000, store_cluster }));
        assert_eq!(Config::from_settings(c.to_settings()).unwrap(), c, "it round-trips");
        assert_eq!(Config::parse(br#"{"conditional_writes":false}"#).unwrap().conditional, None);
        for (bad, says) in [
            (&br#"{"conditional_deletes":true}"#[..], "go with conditional_writes"),
            (br#"{"conditional_max_body":5}"#, "go with conditional_writes"),
            (br#"{"conditional_lend_ms":5000}"#, "go with conditional_writes"),
            (br#"{"conditional_store_cluster":"store"}"#, "go with conditional_writes"),
            (br#"{"conditional_writes":true,"conditional_store_cluster":""}"#, "1 to"),
            (br#"{"conditional_writes":true,"conditional_lend_ms":999}"#, "out of range"),
            (br#"{"conditional_writes":true,"conditional_lend_ms":86400001}"#, "out of range"),
            (br#"{"conditional_writes":true,"conditional_max_body":0}"#, "above 0"),
            (br#"{"conditional_writes":true,"mode":"efficiency"}"#, "needs correctness mode and etcd"),
            (br#"{"conditional_writes":true,"mode":"efficiency","etcd":null}"#, "needs correctness mode and etcd"),
            (br#"{"conditional_writes":true,"resource":{"from":"header","header":"x-r"}}"#, "by path"),
            (br#"{"conditional_writes":true,"gate":{"budget_ms":100}}"#, "replaces the ordering gate"),
            (br#"{"conditional_writes":null}"#, "null"),
        ] {
            let e = Config::parse(bad).unwrap_err();
            assert!(e.0.contains(says), "{}: {e}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_gate_takes_its_bounds_and_only_null_turns_it_off() {
        let c = Config::parse(br#"{"gate":{"budget_ms":200,"apply_bound_ms":0},"start_grace_ms":1500}"#).unwrap();
        assert_eq!(c.gate, Some(GateConfig { budget_ms: 200, apply_bound_ms: 0, ..GateConfig::default() }));
        assert_eq!(c.start_grace_ms, 1500);
        assert_eq!(Config::parse(br#"{"gate":null}"#).unwrap().gate, None);
        assert_eq!(Config::parse(br#"{"gate":{}}"#).unwrap().gate, Some(GateConfig::default()));
        for (json, needle) in [
            (r#"{"gate":{"budget_ms":0}}"#, "gate.budget_ms"),
            (r#"{"gate":{"apply_bound_ms":86400001}}"#, "gate.apply_bound_ms"),
            (r#"{"gate":{"tick_ms":1}}"#, "gate.tick_ms"),
            (r#"{"gate":{"budget":5}}"#, "unknown field"),
            (r#"{"start_grace_ms":86400001}"#, "start_grace_ms"),
            (r#"{"mode":"efficiency","etcd":null,"gate":{"shared":true}}"#, "gate.shared needs etcd"),
        ] {
            let e = Config::parse(json.as_bytes()).unwrap_err();
            assert!(e.0.contains(needle), "{json}: {e}");
        }
    }

    #[test]
    fn efficiency_mode_may_drop_etcd_but_correctness_may_not() {
        let c = Config::parse(br#"{"mode":"efficiency","etcd":null}"#).unwrap();
        assert_eq!(c.etcd, None);
        let e = Config::parse(br#"{"etcd":null}"#).unwrap_err();
        assert!(e.0.contains("correctness mode needs etcd"), "{e}");
    }

    #[test]
    fn bad_configurations_say_why() {
        for (json, needle) in [
            (r#"{"mode":"fast"}"#, "unknown variant"),
            (r#"{"tokenheader":"x"}"#, "unknown field"),
            (r#"{"resource":{"from":"header"}}"#, "needs resource.header"),
            (r#"{"token_header":"a b"}"#, "not an HTTP header name"),
            (r#"{"fenced_methods":[]}"#, "nothing would be fenced"),
            (r#"{"shared_slots":0}"#, "shared_slots"),
            ("{", "not valid"),
        ] {
            let e = Config::parse(json.as_bytes()).unwrap_err();
            assert!(e.0.contains(needle), "{json}: {e}");
        }
    }

    #[test]
    fn provenance_is_off_by_default_and_asks_etcd_when_on() {
        assert_eq!(Config::parse(b"").unwrap().provenance, Provenance::Off);
        assert_eq!(Config::parse(br#"{"provenance":"weak"}"#).unwrap().provenance, Provenance::Weak);
        let strong = Config::parse(br#"{"provenance":"strong","lock_prefix":"/locks/"}"#).unwrap();
        assert_eq!(strong.provenance, Provenance::Strong { lock_prefix: "/locks/".into() });
        for (json, needle) in [
            (r#"{"provenance":"strong"}"#, "needs lock_prefix"),
            (r#"{"provenance":"weak","lock_prefix":"/l/"}"#, "goes with provenance"),
            (r#"{"mode":"efficiency","etcd":null,"provenance":"weak"}"#, "need etcd"),
            (r#"{"provenance":"yes"}"#, "unknown variant"),
        ] {
            let e = Config::parse(json.as_bytes()).unwrap_err();
            assert!(e.0.contains(needle), "{json}: {e}");
        }
    }

    #[test]
    fn etcd_auth_takes_a_user_and_the_variable_of_its_password_both_or_neither() {
        assert_eq!(Config::parse(b"").unwrap().etcd.unwrap().auth, None);
        let c = Config::parse(br#"{"etcd":{"user":"fk","password_env":"FK_ETCD_PASSWORD"}}"#).unwrap();
        let auth = EtcdAuth { user: "fk".into(), password_env: "FK_ETCD_PASSWORD".into() };
        assert_eq!(c.etcd.unwrap().auth, Some(auth));
        for (json, needle) in [
            (r#"{"etcd":{"user":"fk"}}"#, "etcd.user needs etcd.password_env"),
            (r#"{"etcd":{"password_env":"P"}}"#, "etcd.password_env needs etcd.user"),
            (r#"{"etcd":{"user":"","password_env":"P"}}"#, "is not a user name"),
            (r#"{"etcd":{"user":"fk","password_env":"1P"}}"#, "not an environment variable name"),
            (r#"{"etcd":{"user":"fk","password_env":"A=B"}}"#, "not an environment variable name"),
            (r#"{"etcd":{"user":"fk","password":"hunter2"}}"#, "unknown field"),
        ] {
            let e = Config::parse(json.as_bytes()).unwrap_err();
            assert!(e.0.contains(needle) && !e.0.contains('\n'), "{json}: {e}");
        }
    }

    #[test]
    fn header_resource_and_method_list() {
        let c = Config::parse(
            br#"{"resource":{"from":"header","header":"Fencing-Resource"},"fenced_methods":["put"],"strict":true}"#,
        )
        .unwrap();
        assert_eq!(c.resource, ResourceFrom::Header("fencing-resource".into()));
        assert!(c.fences("PUT") && !c.fences("DELETE"));
        assert!(c.policy.strict);
    }

    #[test]
    fn webdav_reads_pass_and_resources_come_from_paths() {
        let c = Config::parse(br#"{"protocol":"webdav"}"#).unwrap();
        assert!(!c.fences("PROPFIND") && c.fences("MKCOL") && c.fences("PUT"));
        assert_eq!(c.writes("COPY"), Writes::Destination);
        assert!(Config::parse(b"").unwrap().fences("PROPFIND"), "plain HTTP fences PROPFIND");
        let e = Config::parse(br#"{"protocol":"webdav","resource":{"from":"header","header":"x-r"}}"#).unwrap_err();
        assert!(e.0.contains("names resources by path"), "{e}");
        let s3 = Config::parse(br#"{"protocol":"s3","token_header":"Lock-Token"}"#).unwrap();
        assert_eq!(s3.token_metadata_header.as_deref(), Some("x-amz-meta-lock-token"));
        assert_eq!(Config::parse(b"").unwrap().token_metadata_header, None, "only s3 reads metadata");
        let e = Config::parse(br#"{"protocol":"s4"}"#).unwrap_err();
        assert!(e.0.contains("unknown variant"), "{e}");
    }

    #[test]
    fn the_shared_marks_are_bounded_only_where_etcd_holds_the_truth() {
        assert_eq!(Config::parse(b"").unwrap().shared_marks_max, Some(DEFAULT_SHARED_MARKS_MAX));
        assert_eq!(Config::parse(br#"{"shared_marks_max":10}"#).unwrap().shared_marks_max, Some(10));
        let alone = Config::parse(br#"{"mode":"efficiency","etcd":null}"#).unwrap();
        assert_eq!(alone.shared_marks_max, None, "the only copy is never evicted");
        let e = Config::parse(br#"{"mode":"efficiency","etcd":null,"shared_marks_max":10}"#).unwrap_err();
        assert!(e.0.contains("needs etcd"), "{e}");
        let e = Config::parse(br#"{"shared_marks_max":0}"#).unwrap_err();
        assert!(e.0.contains("at least 1"), "{e}");
    }

    #[test]
    fn an_s3_domain_is_a_dns_name_and_goes_with_s3() {
        let c = Config::parse(br#"{"protocol":"s3","s3_domain":"s3.test"}"#).unwrap();
        assert_eq!(c.s3_domain.as_deref(), Some("s3.test"));
        for (json, needle) in [
            (r#"{"s3_domain":"s3.test"}"#, "goes with protocol \"s3\""),
            (r#"{"protocol":"s3","s3_domain":"s3.test:80"}"#, "no port"),
            (r#"{"protocol":"s3","s3_domain":"S3.Test"}"#, "lower-case"),
            (r#"{"protocol":"s3","s3_domain":"s3"}"#, "two labels"),
        ] {
            let e = Config::parse(json.as_bytes()).unwrap_err();
            assert!(e.0.contains(needle), "{json}: {e}");
        }
    }

    #[test]
    fn a_section_written_as_an_array_or_a_scalar_is_refused() {
        // serde would read `[200, 0]` as the gate's first two fields.
        for (json, needle) in [
            (r#"{"gate":[200,0]}"#, "gate is an array"),
            (r#"{"etcd":["c"]}"#, "etcd is an array"),
            (r#"{"resource":["header","x"]}"#, "resource is an array"),
            (r#"{"gate":5}"#, "gate is not an object"),
            ("[]", "not a JSON object"),
            ("5", "not a JSON object"),
        ] {
            let e = Config::parse(json.as_bytes()).unwrap_err();
            assert!(e.0.contains(needle), "{json}: {e}");
        }
    }

    #[test]
    fn null_means_none_only_where_none_is_a_choice() {
        for json in [
            r#"{"mode":null}"#,
            r#"{"token_header":null}"#,
            r#"{"resource":null}"#,
            r#"{"gate":{"budget_ms":null}}"#,
            r#"{"etcd":{"cluster":null}}"#,
        ] {
            let e = Config::parse(json.as_bytes()).unwrap_err();
            assert!(e.0.contains("invalid type: null"), "{json}: {e}");
        }
        let c = Config::parse(br#"{"fenced_methods":null,"lock_prefix":null,"etcd":{"user":null}}"#).unwrap();
        assert_eq!(c, Config::parse(b"").unwrap());
    }

    #[test]
    fn the_gate_is_shared_by_default_whenever_the_marks_are_in_etcd() {
        let shared = |json: &str| Config::parse(json.as_bytes()).unwrap().gate.map(|g| g.shared);
        assert_eq!(shared(""), Some(true), "etcd is the default mark store");
        assert_eq!(shared(r#"{"mode":"efficiency"}"#), Some(true));
        assert_eq!(shared(r#"{"gate":{"shared":false}}"#), Some(false), "opted out");
        assert_eq!(shared(r#"{"mode":"efficiency","etcd":null}"#), Some(false), "no etcd, no registry");
        assert_eq!(shared(r#"{"gate":null}"#), None);
    }

    #[test]
    fn written_back_a_configuration_parses_to_itself() {
        for json in [
            "",
            r#"{"mode":"efficiency","etcd":null,"gate":null,"strict":true,"fenced_methods":["put"]}"#,
            r#"{"provenance":"strong","lock_prefix":"/l/","etcd":{"user":"u","password_env":"P"}}"#,
            r#"{"resource":{"from":"header","header":"X-R"},"gate":{"shared":true,"flight_ms":7},"start_grace_ms":9}"#,
            r#"{"protocol":"webdav","resource":{"strip_prefix":"/dav"}}"#,
            r#"{"protocol":"s3","token_header":"x-t"}"#,
            r#"{"protocol":"s3","s3_domain":"s3.example.com"}"#,
        ] {
            let c = Config::parse(json.as_bytes()).unwrap();
            let written = serde_json::to_string(&c.to_settings()).unwrap();
            assert_eq!(Config::parse(written.as_bytes()).unwrap(), c, "{json} -> {written}");
        }
    }

    #[test]
    fn absent_sections_are_not_written() {
        assert_eq!(serde_json::to_string(&Settings::default()).unwrap(), "{}");
        let off = Settings { etcd: Switch::Off, gate: Switch::Off, ..Settings::default() };
        assert_eq!(serde_json::to_value(&off).unwrap(), serde_json::json!({"etcd": null, "gate": null}));
    }

    #[test]
    fn the_upstream_names_the_cluster_and_the_authority_as_envoy_reads_it() {
        let s = service("fencekeeper_etcd", "etcd");
        assert_eq!(s.as_bytes(), b"\x0a\x18\x0a\x10fencekeeper_etcd\x12\x04etcd");
        let long = service(&"c".repeat(MAX_SERVICE_NAME_BYTES), &"a".repeat(MAX_SERVICE_NAME_BYTES));
        assert_eq!(long.as_bytes()[1] as usize, long.len() - 2, "one-byte lengths at the bounds");
        assert_eq!(service("c", "").as_bytes(), b"\x0a\x03\x0a\x01c");
    }
}
