//! Fencekeeper's harness for local services: real etcd, nginx with WebDAV, Envoy and
//! the gateway (`fencekeeper serve`), each a child process on loopback, on a free port,
//! in its own directory, stopped when its handle drops. Readiness is always checked (a
//! health request or a TCP accept), never slept for.
//!
//! One harness serves every place that needs the services: the integration and
//! end-to-end tests (`tests/`, tiers in tests/README.md), the benchmark scripts
//! (`fencekeeper-services`) and the lock-and-pause demo (`fencekeeper-demo`, run by
//! scripts/demo.sh). It is not published: nothing shipped depends on it.
//!
//! # Layout
//!
//! * [`services`]: a child process that dies with its handle (and can be frozen), free
//!   ports, readiness polling, a minimal HTTP client; etcd, nginx WebDAV,
//!   and the other lock service, ZooKeeper.
//! * [`redis`]: redis-server, as a lock service and as the host of the Fencekeeper
//!   module (`--loadmodule`, AOF, replicas, restarts in place); [`resp`]: a small
//!   client for it.
//! * [`apache`]: Apache httpd with mod_dav, a full WebDAV server (what nginx's module
//!   is not), for real WebDAV clients; [`rclone`]: one of them.
//! * [`gateway`]: `fencekeeper serve` as a child process, a client that sees response
//!   headers, and an upstream store the caller controls.
//! * [`envoy`]: Envoy configured by `fencekeeper envoy-config`.
//! * [`holder`]: a lock client running `fencekeeper-lock-worker`, which writes with
//!   its token; the paused-holder story told with two of them (the token tests).
//! * [`etcdctl_lock`]: a lock held by the real `etcdctl lock`, and its token.
//! * [`max_register`]: the linearizability checker of admits against a max-register,
//!   shared by the concurrency tests and the torture harness.
//! * [`postgres`]: PostgreSQL 15 (initdb in a temporary directory, a free port), for
//!   the extension's tests; [`pg_wire`]: the small client they talk to it with;
//!   [`commit_order`]: the check that no row committed below its resource's mark.
//! * [`etcd_cluster`]: a 3-member etcd cluster (real Raft: a leader to kill).
//! * [`http_table`]: the HTTP contract table (`tests/contract/http.json`), its rules and the check of a row
//! * [`token_table`]: the token contract every host runs (`tests/contract/tokens.json`)
//!   and the driver its Rust-side runners share.
//! * [`rng`]: a small deterministic generator (one seed replays a schedule), for the
//!   torture harness and the tests' random schedules.
//! * [`relay`]: a TCP relay in front of a service that can act when one request
//!   reaches it (freeze etcd exactly when a Txn arrives).
//! * `src/bin/fencekeeper-services.rs`: etcd and nginx WebDAV for shell scripts, kept
//!   until the script stops it.
//! * `src/bin/fencekeeper-lock-worker.rs`: the command a lock client runs in the
//!   token tests: two writes through the gateway with the token it was given.
//! * `src/bin/fencekeeper-demo`: the lock-and-pause scenario with and without fencing;
//!   its lease-lock client (`lock.rs`) speaks etcd's gRPC API through the library's
//!   `EtcdClient`.

pub mod apache;
pub mod commit_order;
pub mod envoy;
pub mod etcd_cluster;
pub mod etcdctl_lock;
pub mod gateway;
pub mod holder;
pub mod http_table;
pub mod max_register;
pub mod moto;
pub mod pg_wire;
pub mod postgres;
pub mod prometheus;
pub mod rclone;
pub mod recorder;
pub mod redis;
pub mod relay;
pub mod resp;
pub mod rng;
pub mod s3;
pub mod secure_etcd;
pub mod services;
pub mod token_table;

/// The repository root (the workspace directory).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(|p| p.to_path_buf()).unwrap_or_default()
}

/// A binary built by this workspace (e.g. `fencekeeper`), in the same profile as the
/// running program: a test binary (`target/<profile>/deps/`) or one of the harness's
/// own binaries (`target/<profile>/`). scripts/test.sh builds every binary before the
/// tests run.
pub fn workspace_bin(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let mut profile_dir = exe.parent().ok_or_else(|| anyhow::anyhow!("odd binary path {}", exe.display()))?;
    if profile_dir.ends_with("deps") {
        profile_dir = profile_dir.parent().ok_or_else(|| anyhow::anyhow!("odd test binary path {}", exe.display()))?;
    }
    let bin = profile_dir.join(name);
    anyhow::ensure!(
        bin.exists(),
        "{} not found; build it first: cargo build --release --workspace --bins",
        bin.display()
    );
    Ok(bin)
}
