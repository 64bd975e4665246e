//! Target 6: the Envoy filter's JSON configuration (`fencekeeper_filter_config::Config::parse`).
//!
//! Any bytes: no panic, and the same answer twice. A configuration that is
//! accepted keeps every rule docs/envoy.md states: header names are lower-case
//! HTTP tokens, a method list is non-empty and upper-case, correctness mode always
//! has etcd (with a cluster and a timeout above 0), 1 to 65536 slots; `fences`
//! follows the method list or the GET/HEAD/OPTIONS default. And written back as
//! JSON, the accepted configuration parses to itself.
#![no_main]

use fencekeeper_core::Mode;
use fencekeeper_filter_config::{Config, ResourceFrom};
use libfuzzer_sys::fuzz_target;

fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
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

    // Every field spelled out (`to_settings` destructures the whole Config).
    let written = serde_json::to_string(&config.to_settings()).expect("a configuration serializes");
    assert_eq!(Config::parse(written.as_bytes()).as_ref(), Ok(&config), "{written}");
});
