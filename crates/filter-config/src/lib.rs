//! The Fencekeeper Envoy filter's configuration, typed once.
//!
//! Envoy hands the filter its plugin configuration as a JSON string. The filter
//! (guest/filter) parses and validates it with [`Config::parse`];
//! `fencekeeper envoy-config` writes it by serializing the same [`Settings`] type and
//! checks what it wrote with [`Config::from_settings`], so the generator cannot
//! write a field the filter does not read, or a configuration the filter refuses.
//!
//! - [`settings`]: the configuration as written (serde, every field optional).
//! - [`config`]: the validated [`Config`], its defaults and bounds, and the rules that
//!   refuse a configuration (one line each, naming the field).
//!
//! No I/O, and it builds for wasm32 as it builds natively.

pub mod config;
pub mod settings;

pub use config::{
    service, Conditional, Config, ConfigError, Etcd, EtcdApi, EtcdAuth, GateConfig, Host, Provenance, ResourceFrom,
    DEFAULT_CONDITIONAL_MAX_BODY, DEFAULT_ETCD_CLUSTER, DEFAULT_KEY_PREFIX, MAX_SERVICE_NAME_BYTES,
};
pub use settings::{
    EtcdApiName, EtcdSettings, GateSettings, HostName, KeyFrom, ModeName, ProtocolName, ProvenanceName,
    ResourceSettings, Settings, Switch,
};
