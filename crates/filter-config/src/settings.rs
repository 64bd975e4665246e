//! The configuration as it is written: the JSON object Envoy hands the filter, every
//! field optional. The filter reads it with [`crate::Config::parse`];
//! `fencekeeper envoy-config` writes it with serde from the same type, so the two
//! cannot disagree on a field's name or shape.
//!
//! A field that is absent takes its default (`Config` says which). Where a default
//! exists, JSON `null` is refused rather than read as "the default": except for
//! `etcd` and `gate`, where `null` means "none" ([`Switch::Off`]), and the fields
//! whose default is "none" anyway (`fenced_methods`, `s3_domain`, `lock_prefix`,
//! `resource.header`, `resource.strip_prefix`, `etcd.user`, `etcd.password_env`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The filter's plugin configuration, as JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The request header carrying the token.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub token_header: Option<String>,
    /// How the resource key is derived from a request.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceSettings>,
    /// The store's protocol, `http` (the default), `webdav` or `s3`: which methods
    /// read, and which resources a write names.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub protocol: Option<ProtocolName>,
    /// With `s3`, the store's S3 domain: `BUCKET.` + it in `:authority` names a bucket
    /// (virtual-hosted-style). Absent: a domain name as `:authority` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_domain: Option<String>,
    /// The fenced methods; absent or `null`: every method but the protocol's reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_methods: Option<Vec<String>>,
    /// `correctness` (fail closed, the default) or `efficiency` (fail open).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub mode: Option<ModeName>,
    /// Refuse a token equal to the mark.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
    /// The marks' etcd: absent, the default one; `null`, none (efficiency mode only).
    #[serde(default, skip_serializing_if = "Switch::is_default")]
    pub etcd: Switch<EtcdSettings>,
    /// How many shared-data slot keys hold the local marks.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub shared_slots: Option<u32>,
    /// With etcd: the most marks the shared-data copy holds (it is a cache of etcd's).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub shared_marks_max: Option<u32>,
    /// The provenance check: `off` (the default), `weak` or `strong`.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub provenance: Option<ProvenanceName>,
    /// With `strong`: a resource's lock is this prefix + the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_prefix: Option<String>,
    /// The ordering gate: absent, on with its defaults; `null`, off (UNSAFE).
    #[serde(default, skip_serializing_if = "Switch::is_default")]
    pub gate: Switch<GateSettings>,
    /// Refuse fenced writes this long after Envoy's start; 0 or absent: off.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub start_grace_ms: Option<u64>,
    /// Conditional writes: each admitted PUT or DELETE goes with `If-Match` on the
    /// version the store gave the last write (needs etcd, replaces the gate).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub conditional_writes: Option<bool>,
    /// With `conditional_writes`: the store honours `If-Match` on DELETE too (else
    /// deletes are refused).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub conditional_deletes: Option<bool>,
    /// With `conditional_writes`: the largest body a write may have, in bytes (16 MiB).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub conditional_max_body: Option<u64>,
    /// With `conditional_writes`: how long after it is sent the store may still apply
    /// a write, in ms (the route timeout plus the store apply bound; 120000). A write
    /// given up on stops holding its version chain then.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub conditional_lend_ms: Option<u64>,
    /// With `conditional_writes`: the proxy's cluster of the store (the route's own).
    /// The filter asks the store for a version it does not know with a HEAD of the
    /// object through it; unset, only a client's read through the proxy tells it.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub conditional_store_cluster: Option<String>,
    /// What the proxy-wasm host provides: `envoy` (the default: everything Envoy does)
    /// or `portable` (only what every host provides, as ngx_wasm_module does;
    /// docs/proxy-wasm-hosts.md).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub host: Option<HostName>,
    /// Testing only (the filter's `faults` build): a request carrying this header
    /// makes the filter trap.
    #[cfg(feature = "faults")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_fault_header: Option<String>,
}

/// Where the resource key comes from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceSettings {
    /// `path` (the default) or `header`.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub from: Option<KeyFrom>,
    /// With `header`: the header's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// With `path`: a prefix stripped from the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_prefix: Option<String>,
}

/// How the filter reaches etcd's gRPC API.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdSettings {
    /// The Envoy cluster that routes to etcd's client port.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The `:authority` sent to etcd.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// Prefix of mark keys.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// Prefix of the shared in-flight registry's keys.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub flight_prefix: Option<String>,
    /// How long one etcd call may take.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The etcd user the filter authenticates as (with `password_env`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The environment variable of the VM that holds the user's password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// Whether concurrent equal-token checks on a resource share one Txn.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub batch_confirms: Option<bool>,
    /// Which of etcd's APIs the filter calls: `grpc`, or `json` (etcd's JSON gateway,
    /// over HTTP/1.1, for a host without gRPC calls). Default: the host's (`grpc` on
    /// Envoy, `json` on a portable host).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub api: Option<EtcdApiName>,
}

/// etcd's API, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EtcdApiName {
    /// etcd's gRPC API (`proxy_grpc_call`, HTTP/2).
    Grpc,
    /// etcd's JSON gateway (`proxy_http_call`, HTTP/1.1, `POST /v3/kv/txn`).
    Json,
}

/// The ordering gate's settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateSettings {
    /// The longest an admitted write is held back.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub budget_ms: Option<u64>,
    /// The store apply bound.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub apply_bound_ms: Option<u64>,
    /// How often each worker re-checks the writes it holds.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub tick_ms: Option<u64>,
    /// Order writes across instances through the in-flight registry in etcd.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub shared: Option<bool>,
    /// With `shared`: the longest Envoy takes to give up on a write it sent.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub flight_ms: Option<u64>,
}

/// The mode, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    /// Fail closed.
    Correctness,
    /// Fail open.
    Efficiency,
}

/// The store's protocol, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProtocolName {
    /// Plain HTTP.
    Http,
    /// WebDAV (RFC 4918).
    Webdav,
    /// S3, path-style.
    S3,
}

/// The proxy-wasm host, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostName {
    /// Envoy: shared queues of any name with `on_queue_ready`, gRPC calls, a switch of
    /// the effective context, `response.code_details`.
    Envoy,
    /// Any proxy-wasm host: none of those relied on.
    Portable,
}

/// The provenance check, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProvenanceName {
    /// No check.
    Off,
    /// The token is not above etcd's revision.
    Weak,
    /// The token is the lock holder's.
    Strong,
}

/// Where the resource key comes from, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyFrom {
    /// The request path.
    Path,
    /// A request header.
    Header,
}

/// A section that can be left out (its defaults), set to `null` (none) or given.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Switch<T> {
    /// Absent: the section with its defaults.
    #[default]
    Default,
    /// `null`: no such section.
    Off,
    /// The section as given.
    On(T),
}

impl<T> Switch<T> {
    /// Whether the section is absent (and so is not written).
    pub fn is_default(&self) -> bool {
        matches!(self, Switch::Default)
    }
}

impl<T: Serialize> Serialize for Switch<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Switch::On(section) => section.serialize(serializer),
            Switch::Default | Switch::Off => serializer.serialize_none(),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Switch<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Switch<T>, D::Error> {
        Ok(Option::<T>::deserialize(deserializer)?.map_or(Switch::Off, Switch::On))
    }
}

/// A field that has a default when absent but must not be `null` when present.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}
