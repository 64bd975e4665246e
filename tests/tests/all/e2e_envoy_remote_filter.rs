//! Envoy fetching the filter over HTTP (`envoy-config --filter-url URL
//! --filter-sha256 HEX`), as a fleet of Envoys would from one artifact server: a real
//! Envoy, an HTTP server of the test's own serving the filter's bytes, and the check
//! of the SHA-256 that Envoy makes before it loads what it fetched.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::{assert_admitted, filter_path, generate, Envoy};
use fencekeeper_harness::services::{free_port, http, poll_until, NginxDav};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Serve `bytes` to every GET on a free loopback port: its address, and how many
/// fetches came.
fn artifact_server(bytes: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fetches = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&fetches);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            counted.fetch_add(1, Ordering::Relaxed);
            let header = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/wasm\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                bytes.len()
            );
            let _ = stream.write_all(header.as_bytes());
            let _ = stream.write_all(&bytes);
        }
    });
    (addr, fetches)
}

fn sha256(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, bytes).unwrap();
    let out = std::process::Command::new("sha256sum").arg(&path).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_owned()
}

#[test]
fn envoy_loads_a_fetched_filter_whose_sha256_matches_and_refuses_one_that_does_not() {
    let nginx = NginxDav::start().unwrap();
    let bytes = std::fs::read(filter_path()).unwrap();
    let (server, fetches) = artifact_server(bytes.clone());
    let url = format!("http://{server}/fencekeeper_filter.wasm");
    let sha = sha256(&bytes);
    let upstream = nginx.addr.to_string();
    let base = ["--upstream", &upstream, "--no-etcd", "--mode", "efficiency", "--filter-url", &url];

    let good = [&base[..], &["--filter-sha256", &sha]].concat();
    let envoy = Envoy::start(1, &good).unwrap();
    assert!(fetches.load(Ordering::Relaxed) >= 1, "Envoy never fetched the filter");
    assert_admitted(&envoy.put("/remote/f", "34", "from 34").unwrap());
    let stale = envoy.put("/remote/f", "33", "from 33").unwrap();
    assert_eq!(stale.status, 409, "the fetched filter fences: {}", stale.text());
    drop(envoy);

    // The bytes served are not the ones named: Envoy does not run them, and nothing
    // passes unfenced.
    let wrong = "0".repeat(64);
    let bad = [&base[..], &["--filter-sha256", &wrong]].concat();
    let (listen, admin) = (free_port().unwrap(), free_port().unwrap());
    let yaml = generate(listen, admin, &bad).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, yaml).unwrap();
    let log = dir.path().join("envoy.log");
    let mut cmd = std::process::Command::new(fencekeeper_harness::envoy::envoy_binary());
    cmd.arg("-c").arg(&config).args(["--concurrency", "1", "--disable-hot-restart", "--log-level", "warn"]);
    let mut process = fencekeeper_harness::services::Process::spawn("envoy", cmd, &log).unwrap();
    // Envoy fetches it, finds the hash wrong (and fetches again, 5 retries), and gives
    // up on the filter: configured to fail closed, it serves no write without it.
    let gave_up = || std::fs::read_to_string(&log).unwrap_or_default().contains("Plugin fencekeeper failed to load");
    poll_until("Envoy gives up on the filter", Duration::from_secs(60), gave_up).unwrap();
    assert!(fetches.load(Ordering::Relaxed) >= 2, "the wrong filter was fetched");
    let reply = http(([127, 0, 0, 1], listen).into(), "PUT", "/remote/g", &[("fencing-token", "5")], b"x");
    let status = reply.as_ref().map(|(s, _)| *s).unwrap_or(0);
    assert!(status != 201 && status != 204, "a write passed Envoy without the filter: {reply:?}");
    assert_eq!(nginx.read("/remote/g"), None);
    process.kill();
}
