//! The harness behind Fencekeeper's integration and end-to-end tests: real services
//! (etcd, nginx with WebDAV, Envoy) started on loopback, on free ports, in temporary
//! directories, and stopped when their handle drops. See tests/README.md for tiers.

pub mod envoy;
pub mod gateway;
pub mod services;

/// The repository root (the workspace directory).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(|p| p.to_path_buf()).unwrap_or_default()
}

/// A binary built by this workspace (e.g. `fencekeeper`), in the same profile as the
/// running test. scripts/test.sh builds every binary before the tests run.
pub fn workspace_bin(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test-binary> -> target/<profile>/<name>
    let profile_dir = exe.parent().and_then(|d| d.parent()).ok_or_else(|| anyhow::anyhow!("odd test binary path"))?;
    let bin = profile_dir.join(name);
    anyhow::ensure!(
        bin.exists(),
        "{} not found; build it first: cargo build --release --workspace --bins",
        bin.display()
    );
    Ok(bin)
}
