//! The filter's plugin configuration: JSON, every field optional.
//!
//! An empty configuration means: token in `fencing-token`, resource = the request
//! path, every method but GET/HEAD/OPTIONS fenced, correctness mode, not strict,
//! marks in etcd through the Envoy cluster `fencekeeper_etcd`, no provenance check
//! (`fencekeeper envoy-config` writes `"provenance": "weak"`). docs/envoy.md is the
//! reference for each field.

use crate::etcd::MAX_SERVICE_NAME_BYTES;
use fencekeeper_core::http;
use fencekeeper_core::{Mode, Policy};
use serde::Deserialize;
use std::fmt;

/// The parsed and validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The request header carrying the token (lower case).
    pub token_header: String,
    /// How the resource key is derived from a request.
    pub resource: ResourceFrom,
    /// Methods that are fenced; `None` = every method but GET, HEAD and OPTIONS.
    pub fenced_methods: Option<Vec<String>>,
    /// Mode and strictness, for the core.
    pub policy: Policy,
    /// The durable shared mark store; `None` = proxy shared data only.
    pub etcd: Option<Etcd>,
    /// How many shared-data slot keys hold the local marks.
    pub shared_slots: u32,
    /// Whether etcd must vouch for a token before it advances a mark.
    pub provenance: Provenance,
    /// The ordering gate (`gate`); `None`: off (UNSAFE: a slow lower-token write can
    /// land after a higher one).
    pub gate: Option<GateConfig>,
    /// For this long after the process's shared data was made (Envoy's start), fenced
    /// writes are refused (503, `Retry-After`): writes a previous Envoy had in flight
    /// when it died may still reach the store, and its gate died with it. 0: off.
    pub start_grace_ms: u64,
    /// Testing only (the `faults` build, `test-guests/filter_faults.wasm`): a request
    /// carrying this header makes the filter trap. The shipped filter has no such
    /// field and refuses a configuration that sets it.
    #[cfg(feature = "faults")]
    pub test_fault_header: Option<String>,
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
    /// Both, as the upstream of a gRPC call (`etcd::service`).
    pub service: String,
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
    /// with `Retry-After`).
    pub budget_ms: u64,
    /// The store apply bound: how long after the filter gave up on a write (a timeout,
    /// a reset, a client gone, a worker gone) the store may still apply it. Until
    /// then the write holds its resource. Set it at or above the store's own request
    /// timeout; `fencekeeper envoy-config` writes the route's timeout.
    pub apply_bound_ms: u64,
    /// How often each worker's root re-checks the writes it holds and stamps its
    /// heartbeat.
    pub tick_ms: u64,
    /// Order writes across instances too, through the in-flight registry in etcd
    /// (`shared`): for a store written through several Envoys and gateways.
    pub shared: bool,
    /// With `shared`: the longest Envoy takes to give up on a write it sent (the
    /// route timeout). A worker's lease in etcd outlives each of its flights by this
    /// plus the apply bound.
    pub flight_ms: u64,
}

impl Default for GateConfig {
    fn default() -> GateConfig {
        GateConfig { budget_ms: 5_000, apply_bound_ms: 60_000, tick_ms: 100, shared: false, flight_ms: 60_000 }
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default = "default_token_header")]
    token_header: String,
    #[serde(default)]
    resource: RawResource,
    #[serde(default)]
    fenced_methods: Option<Vec<String>>,
    #[serde(default)]
    mode: RawMode,
    #[serde(default)]
    strict: bool,
    // Absent = the default etcd; JSON null = no etcd (efficiency mode only).
    #[serde(default = "default_etcd")]
    etcd: Option<RawEtcd>,
    #[serde(default = "default_slots")]
    shared_slots: u32,
    #[serde(default)]
    provenance: RawProvenance,
    #[serde(default)]
    lock_prefix: Option<String>,
    // Absent = the default gate; JSON null = no gate.
    #[serde(default = "default_gate")]
    gate: Option<RawGate>,
    #[serde(default)]
    start_grace_ms: u64,
    #[cfg(feature = "faults")]
    #[serde(default)]
    test_fault_header: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawResource {
    #[serde(default)]
    from: RawFrom,
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    strip_prefix: Option<String>,
}

#[derive(Deserialize, Default, PartialEq)]
#[serde(rename_all = "lowercase")]
enum RawFrom {
    #[default]
    Path,
    Header,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum RawMode {
    #[default]
    Correctness,
    Efficiency,
}

#[derive(Deserialize, Default, PartialEq)]
#[serde(rename_all = "lowercase")]
enum RawProvenance {
    #[default]
    Off,
    Weak,
    Strong,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGate {
    #[serde(default = "default_budget")]
    budget_ms: u64,
    #[serde(default = "default_apply_bound")]
    apply_bound_ms: u64,
    #[serde(default = "default_tick")]
    tick_ms: u64,
    #[serde(default)]
    shared: bool,
    #[serde(default = "default_flight")]
    flight_ms: u64,
}

fn default_gate() -> Option<RawGate> {
    let d = GateConfig::default();
    Some(RawGate {
        budget_ms: d.budget_ms,
        apply_bound_ms: d.apply_bound_ms,
        tick_ms: d.tick_ms,
        shared: d.shared,
        flight_ms: d.flight_ms,
    })
}
fn default_flight() -> u64 {
    GateConfig::default().flight_ms
}
fn default_budget() -> u64 {
    GateConfig::default().budget_ms
}
fn default_apply_bound() -> u64 {
    GateConfig::default().apply_bound_ms
}
fn default_tick() -> u64 {
    GateConfig::default().tick_ms
}

/// The longest budget, apply bound or start grace accepted: a day. Longer is a typo.
const MAX_GATE_MS: u64 = 86_400_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEtcd {
    #[serde(default = "default_cluster")]
    cluster: String,
    #[serde(default = "default_authority")]
    authority: String,
    #[serde(default = "default_prefix")]
    key_prefix: String,
    #[serde(default = "default_flight_prefix")]
    flight_prefix: String,
    #[serde(default = "default_timeout")]
    timeout_ms: u64,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    password_env: Option<String>,
    #[serde(default = "default_batch")]
    batch_confirms: bool,
}

fn default_token_header() -> String {
    http::TOKEN_HEADER.to_owned()
}
fn default_cluster() -> String {
    DEFAULT_ETCD_CLUSTER.to_owned()
}
fn default_authority() -> String {
    "etcd".to_owned()
}
fn default_prefix() -> String {
    DEFAULT_KEY_PREFIX.to_owned()
}
fn default_flight_prefix() -> String {
    fencekeeper_etcd_wire::flights::DEFAULT_FLIGHT_PREFIX.to_owned()
}
fn default_timeout() -> u64 {
    1000
}
fn default_batch() -> bool {
    true
}
fn default_slots() -> u32 {
    256
}
fn default_etcd() -> Option<RawEtcd> {
    Some(RawEtcd {
        cluster: default_cluster(),
        authority: default_authority(),
        key_prefix: default_prefix(),
        flight_prefix: default_flight_prefix(),
        timeout_ms: default_timeout(),
        user: None,
        password_env: None,
        batch_confirms: default_batch(),
    })
}

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

impl Config {
    /// Parse the plugin configuration (empty or whitespace = all defaults).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|_| ConfigError("configuration is not UTF-8".into()))?;
        let raw: Raw = if text.trim().is_empty() { serde_json::from_str("{}") } else { serde_json::from_str(text) }
            .map_err(|e| ConfigError(format!("configuration is not valid: {e}")))?;
        Config::validate(raw)
    }

    fn validate(raw: Raw) -> Result<Config, ConfigError> {
        let mode = match raw.mode {
            RawMode::Correctness => Mode::Correctness,
            RawMode::Efficiency => Mode::Efficiency,
        };
        let resource = match raw.resource.from {
            RawFrom::Path => {
                if raw.resource.header.is_some() {
                    return Err(ConfigError("resource.header needs resource.from = \"header\"".into()));
                }
                ResourceFrom::Path { strip_prefix: raw.resource.strip_prefix.unwrap_or_default() }
            }
            RawFrom::Header => {
                if raw.resource.strip_prefix.is_some() {
                    return Err(ConfigError("resource.strip_prefix needs resource.from = \"path\"".into()));
                }
                let name = raw
                    .resource
                    .header
                    .ok_or_else(|| ConfigError("resource.from = \"header\" needs resource.header".into()))?;
                ResourceFrom::Header(header_name("resource.header", name)?)
            }
        };
        let fenced_methods = match raw.fenced_methods {
            Some(list) if list.is_empty() => {
                return Err(ConfigError("fenced_methods is empty: nothing would be fenced".into()))
            }
            Some(list) => Some(list.into_iter().map(|m| m.to_ascii_uppercase()).collect()),
            None => None,
        };
        let etcd = match raw.etcd {
            Some(e) if e.cluster.is_empty() => return Err(ConfigError("etcd.cluster is empty".into())),
            Some(e) if e.timeout_ms == 0 => return Err(ConfigError("etcd.timeout_ms must be above 0".into())),
            Some(e) if [&e.cluster, &e.authority].iter().any(|n| n.len() > MAX_SERVICE_NAME_BYTES) => {
                return Err(ConfigError(format!(
                    "etcd.cluster and etcd.authority are at most {MAX_SERVICE_NAME_BYTES} bytes each"
                )))
            }
            Some(e) => Some(Etcd {
                service: crate::etcd::service(&e.cluster, &e.authority),
                batch_confirms: e.batch_confirms,
                auth: etcd_auth(e.user, e.password_env)?,
                cluster: e.cluster,
                authority: e.authority,
                key_prefix: e.key_prefix,
                flight_prefix: e.flight_prefix,
                timeout_ms: e.timeout_ms,
            }),
            None if mode == Mode::Correctness => {
                return Err(ConfigError(
                    "correctness mode needs etcd (marks in shared data die with the proxy); set \"mode\": \"efficiency\" to run without it".into(),
                ))
            }
            None => None,
        };
        let provenance = match (raw.provenance, raw.lock_prefix) {
            (RawProvenance::Off, None) => Provenance::Off,
            (_, _) if etcd.is_none() => {
                return Err(ConfigError("provenance and lock_prefix need etcd: the check asks etcd".into()))
            }
            (RawProvenance::Weak, None) => Provenance::Weak,
            (RawProvenance::Strong, Some(lock_prefix)) => Provenance::Strong { lock_prefix },
            (RawProvenance::Strong, None) => {
                return Err(ConfigError(
                    "provenance \"strong\" needs lock_prefix (a resource's lock is lock_prefix + resource)".into(),
                ))
            }
            (_, Some(_)) => return Err(ConfigError("lock_prefix goes with provenance \"strong\"".into())),
        };
        let gate = match raw.gate {
            None => None,
            Some(g) if g.budget_ms == 0 || g.budget_ms > MAX_GATE_MS => {
                return Err(ConfigError(format!("gate.budget_ms must be between 1 and {MAX_GATE_MS}")))
            }
            Some(g) if g.apply_bound_ms > MAX_GATE_MS => {
                return Err(ConfigError(format!("gate.apply_bound_ms must be at most {MAX_GATE_MS}")))
            }
            Some(g) if !(10..=10_000).contains(&g.tick_ms) => {
                return Err(ConfigError("gate.tick_ms must be between 10 and 10000".into()))
            }
            Some(g) if g.flight_ms > MAX_GATE_MS => {
                return Err(ConfigError(format!("gate.flight_ms must be at most {MAX_GATE_MS}")))
            }
            Some(g) if g.shared && etcd.is_none() => {
                return Err(ConfigError("gate.shared needs etcd: the in-flight registry lives there".into()))
            }
            Some(g) => Some(GateConfig {
                budget_ms: g.budget_ms,
                apply_bound_ms: g.apply_bound_ms,
                tick_ms: g.tick_ms,
                shared: g.shared,
                flight_ms: g.flight_ms,
            }),
        };
        if raw.start_grace_ms > MAX_GATE_MS {
            return Err(ConfigError(format!("start_grace_ms must be at most {MAX_GATE_MS}")));
        }
        if !(1..=65536).contains(&raw.shared_slots) {
            return Err(ConfigError("shared_slots must be between 1 and 65536".into()));
        }
        Ok(Config {
            token_header: header_name("token_header", raw.token_header)?,
            resource,
            fenced_methods,
            policy: Policy { mode, strict: raw.strict },
            etcd,
            shared_slots: raw.shared_slots,
            provenance,
            gate,
            start_grace_ms: raw.start_grace_ms,
            #[cfg(feature = "faults")]
            test_fault_header: raw.test_fault_header.map(|h| header_name("test_fault_header", h)).transpose()?,
        })
    }

    /// Whether requests with this method are fenced (the core's rule).
    pub fn fences(&self, method: &str) -> bool {
        http::fences(method, self.fenced_methods.as_deref())
    }
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
}
