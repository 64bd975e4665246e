//! Target 6: the Envoy filter's JSON configuration (`Config::parse`).
//!
//! Any bytes: no panic, and the same answer twice. A configuration that is
//! accepted keeps every rule docs/envoy.md states: header names are lower-case
//! HTTP tokens, a method list is non-empty and upper-case, correctness mode always
//! has etcd (with a cluster and a timeout above 0), 1 to 65536 slots; `fences`
//! follows the method list or the GET/HEAD/OPTIONS default. And written back as
//! JSON, the accepted configuration parses to itself.
#![no_main]

use fencekeeper_core::Mode;
use fencekeeper_filter::config::{Config, Provenance, ResourceFrom};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// The accepted configuration as JSON, every field spelled out (a field added to
/// `Config` and left out here fails the round trip below: keep the two together).
fn to_json(c: &Config) -> Value {
    let resource = match &c.resource {
        ResourceFrom::Path { strip_prefix } => json!({"from": "path", "strip_prefix": strip_prefix}),
        ResourceFrom::Header(h) => json!({"from": "header", "header": h}),
    };
    let etcd = c.etcd.as_ref().map(|e| {
        json!({
            "cluster": e.cluster,
            "authority": e.authority,
            "key_prefix": e.key_prefix,
            "flight_prefix": e.flight_prefix,
            "timeout_ms": e.timeout_ms,
            "user": e.auth.as_ref().map(|a| &a.user),
            "password_env": e.auth.as_ref().map(|a| &a.password_env),
            "batch_confirms": e.batch_confirms,
        })
    });
    let (provenance, lock_prefix) = match &c.provenance {
        Provenance::Off => ("off", None),
        Provenance::Weak => ("weak", None),
        Provenance::Strong { lock_prefix } => ("strong", Some(lock_prefix)),
    };
    let gate = c.gate.map(|g| {
        json!({
            "budget_ms": g.budget_ms,
            "apply_bound_ms": g.apply_bound_ms,
            "tick_ms": g.tick_ms,
            "shared": g.shared,
            "flight_ms": g.flight_ms,
        })
    });
    json!({
        "token_header": c.token_header,
        "resource": resource,
        "fenced_methods": c.fenced_methods,
        "mode": if c.policy.mode == Mode::Efficiency { "efficiency" } else { "correctness" },
        "strict": c.policy.strict,
        "etcd": etcd,
        "shared_slots": c.shared_slots,
        "provenance": provenance,
        "lock_prefix": lock_prefix,
        "gate": gate,
        "start_grace_ms": c.start_grace_ms,
    })
}

fuzz_target!(|data: &[u8]| {
    let parsed = Config::parse(data);
    assert_eq!(Config::parse(data), parsed);
    let Ok(config) = parsed else { return };

    assert!(is_header_name(&config.token_header), "{config:?}");
    if let ResourceFrom::Header(h) = &config.resource {
        assert!(is_header_name(h), "{config:?}");
    }
    match &config.fenced_methods {
        Some(list) => {
            assert!(!list.is_empty() && list.iter().all(|m| *m == m.to_ascii_uppercase()), "{config:?}");
            for m in list {
                assert!(config.fences(m) && config.fences(&m.to_ascii_lowercase()));
            }
        }
        None => {
            assert!(!config.fences("GET") && !config.fences("HEAD") && !config.fences("OPTIONS"));
            assert!(config.fences("PUT") && config.fences("DELETE") && config.fences("POST"));
        }
    }
    match &config.etcd {
        Some(e) => assert!(!e.cluster.is_empty() && e.timeout_ms > 0, "{config:?}"),
        None => assert_eq!(config.policy.mode, Mode::Efficiency),
    }
    assert!((1..=65536).contains(&config.shared_slots));

    let written = to_json(&config).to_string();
    assert_eq!(Config::parse(written.as_bytes()).as_ref(), Ok(&config), "{written}");
});
