//! Where the two HTTP hosts must differ, shown: a fenced write's body.
//!
//! The gateway reads a fenced body whole before it decides (bounded by `--max-body`
//! and `--request-timeout`), so a slow uploader never holds a resource's gate and an
//! admitted write goes to the store in one piece. Envoy's filter decides on the
//! request's head and lets Envoy stream the body (a conditional write's body excepted:
//! the filter holds it to hash it, `http_contract`'s `s3-conditional` rows). Both are
//! by design (docs/architecture.md, "The HTTP engine"); the contract table holds every
//! other behaviour alike. Each test runs the same requests through both hosts, in
//! efficiency mode with marks local to the host (no etcd to start), in front of the
//! recording store.

use anyhow::{Context, Result};
use fencekeeper_harness::envoy::{exchange, Envoy, Reply};
use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::recorder::Recorder;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A host (kept running while this lives) and the store behind it.
struct Fenced {
    addr: SocketAddr,
    store: Recorder,
    _host: Box<dyn std::any::Any>,
}

impl Fenced {
    fn gateway(extra: &[&str]) -> Result<Fenced> {
        let store = Recorder::start()?;
        let mut args = vec!["--mode", "efficiency"];
        args.extend(extra);
        let g = Gateway::start(&store.url(), &args)?;
        Ok(Fenced { addr: g.addr, store, _host: Box::new(g) })
    }

    fn envoy() -> Result<Fenced> {
        let store = Recorder::start()?;
        let upstream = store.authority();
        let e = Envoy::start(1, &["--upstream", &upstream, "--mode", "efficiency", "--no-etcd"])?;
        Ok(Fenced { addr: e.listen, store, _host: Box::new(e) })
    }

    fn put(&self, path: &str, token: &str, body: &[u8]) -> Result<Reply> {
        exchange(self.addr, "PUT", path, &[("fencing-token", token)], body)
    }
}

/// Send a PUT's head announcing `length` bytes and only the first `sent` of them, then
/// read the answer's status line (the connection stays open, the body unfinished).
/// Returns the status and how long the answer took.
fn stall_body(addr: SocketAddr, path: &str, token: &str, length: usize, sent: usize) -> Result<(u16, Duration)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: fencekeeper\r\nfencing-token: {token}\r\nContent-Length: {length}\r\n\r\n"
    );
    let started = Instant::now();
    s.write_all(head.as_bytes())?;
    s.write_all(&vec![b'x'; sent])?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    while !got.windows(2).any(|w| w == b"\r\n") {
        let n = s.read(&mut chunk).context("no answer while the body was unfinished")?;
        anyhow::ensure!(n > 0, "the connection closed without an answer");
        got.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&got);
    let status = line.split_whitespace().nth(1).context("no status")?.parse()?;
    Ok((status, started.elapsed()))
}

/// A stale write whose body never finishes: Envoy's filter refuses it on its head (409)
/// at once; the gateway, which decides only on a whole body, answers 408 when the body
/// has not come within `--request-timeout`. Neither lets any of it reach the store.
#[test]
fn a_stale_write_is_refused_on_its_head_by_envoy_and_only_after_its_body_by_the_gateway() -> Result<()> {
    let timeout = Duration::from_secs(1);
    let gateway = Fenced::gateway(&["--request-timeout", "1s"])?;
    let envoy = Fenced::envoy()?;
    for host in [&gateway, &envoy] {
        assert_eq!(host.put("/bodies/slow.txt", "34", b"from 34")?.status, 201);
        host.store.take();
    }

    let (status, took) = stall_body(envoy.addr, "/bodies/slow.txt", "33", 1 << 20, 10)?;
    assert_eq!(status, 409, "Envoy decides on the head");
    assert!(took < timeout, "Envoy answered in {took:?}, not before the body was due");

    let (status, took) = stall_body(gateway.addr, "/bodies/slow.txt", "33", 1 << 20, 10)?;
    assert_eq!(status, 408, "the gateway waits for the whole body before it decides");
    assert!(took >= timeout, "the gateway answered in {took:?}, before its request timeout");

    for host in [&gateway, &envoy] {
        assert!(host.store.take().is_empty(), "nothing of a refused write reaches the store");
    }
    Ok(())
}

/// An admitted write over the gateway's `--max-body`: the gateway refuses it (413,
/// nothing forwarded) because it would hold it whole; Envoy streams it to the store.
#[test]
fn a_body_over_the_gateways_limit_is_refused_by_the_gateway_and_streamed_by_envoy() -> Result<()> {
    let gateway = Fenced::gateway(&["--max-body", "1024"])?;
    let envoy = Fenced::envoy()?;
    let body = vec![b'b'; 64 * 1024];

    let refused = gateway.put("/bodies/large.bin", "7", &body)?;
    assert_eq!(refused.status, 413, "{}", refused.text());
    assert!(refused.text().contains("1024"), "the reason names the limit: {}", refused.text());
    assert!(gateway.store.take().is_empty(), "a refused body reaches the store in no part");

    let streamed = envoy.put("/bodies/large.bin", "7", &body)?;
    assert_eq!(streamed.status, 201, "{}", streamed.text());
    let seen = envoy.store.take();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body.len(), body.len(), "the whole body reached the store");
    assert_eq!(seen[0].values("fencing-admitted-token"), ["7"]);
    Ok(())
}
