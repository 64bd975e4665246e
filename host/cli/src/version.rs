//! `fencekeeper --version`: the release, the commit it was built from, and the
//! SHA-256 of each guest bundled in the binary, so an operator can tell which filter
//! `envoy-config` writes and which validator admits, and match them to a release's
//! artifacts.

use sha2::{Digest, Sha256};

/// The SHA-256 of `bytes`, in lower-case hex.
pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The long version text (`--version`).
pub fn long() -> String {
    let sha = sha256;
    format!(
        "{}\ncommit {}\nfilter sha256:{} (fencekeeper_filter.wasm, {} bytes)\nvalidator sha256:{} \
         (fencekeeper_validator.wasm, {} bytes)",
        env!("CARGO_PKG_VERSION"),
        env!("FENCEKEEPER_COMMIT"),
        sha(crate::envoy_config::EMBEDDED_FILTER),
        crate::envoy_config::EMBEDDED_FILTER.len(),
        sha(fencekeeper::validator::bundled_component()),
        fencekeeper::validator::bundled_component().len(),
    )
}
