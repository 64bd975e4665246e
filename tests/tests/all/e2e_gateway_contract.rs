//! The gateway's refusal contract and operations, against the real binary: statuses and
//! headers, gRPC statuses, limits, metrics, mark lookup, start-up errors, graceful stop.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::gateway::{request, Gateway, RecordingUpstream};
use fencekeeper_harness::workspace_bin;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[test]
fn refusals_follow_the_contract_and_admits_carry_the_admitted_token() {
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &[]).unwrap();
    let missing = gw.put("/f", None, b"x").unwrap();
    assert_eq!(missing.status, 428, "{}", missing.body);
    let malformed = gw.put("/f", Some("3x"), b"x").unwrap();
    assert_eq!(malformed.status, 400, "{}", malformed.body);
    assert_eq!(gw.put("/f", Some("034"), b"new").unwrap().status, 201);
    let stale = gw.put("/f", Some("33"), b"old").unwrap();
    assert_eq!(stale.status, 409);
    assert_eq!(stale.header("fencing-highest"), Some("34"));
    assert_eq!(stale.body.trim().lines().count(), 1, "{}", stale.body);
    assert!(stale.body.contains("stale"), "{}", stale.body);
    let applied = upstream.applied();
    assert_eq!(applied.len(), 1, "only the admitted write reaches the store");
    assert_eq!((applied[0].token.as_str(), &applied[0].body[..]), ("34", &b"new"[..]));
    assert_eq!(gw.mark("/f").unwrap().as_deref(), Some("34"));
    assert_eq!(gw.mark("/never").unwrap(), None);
    for (class, n) in [("admitted", 1), ("stale", 1), ("malformed", 1), ("missing", 1), ("undecided", 0)] {
        assert_eq!(
            gw.metric(&format!("fencekeeper_gateway_requests_total{{class=\"{class}\"}}")).unwrap(),
            n,
            "{class}"
        );
    }
    assert_eq!(gw.metric("fencekeeper_gateway_request_duration_seconds_count").unwrap(), 4);
}

/// Regression: the gateway forwarded a client's own `fencing-admitted-token` on
/// unfenced requests (and on writes passed failing open), so a store that trusts the
/// header could be told a token nobody admitted.
#[test]
fn a_clients_own_admitted_token_header_is_never_forwarded() {
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &["--path-prefix", "/data/"]).unwrap();
    let forged = ("fencing-admitted-token", "999");
    for (method, path) in [("GET", "/data/f"), ("HEAD", "/data/f"), ("PUT", "/elsewhere/f")] {
        let r = request(&gw.url(), method, path, &[forged], b"").unwrap();
        assert_eq!(r.status, 201, "{method} {path}: {}", r.body);
        let last = upstream.applied().pop().unwrap();
        assert_eq!(
            (last.path.as_str(), last.token.as_str()),
            (path, ""),
            "{method} {path} forwarded the client's value"
        );
    }
    let admitted = request(&gw.url(), "PUT", "/data/f", &[("fencing-token", "42"), forged], b"x").unwrap();
    assert_eq!(admitted.status, 201, "{}", admitted.body);
    assert_eq!(upstream.applied().pop().unwrap().token, "42", "the admitted token replaces the client's");
    let stale = request(&gw.url(), "PUT", "/data/f", &[("fencing-token", "41"), forged], b"x").unwrap();
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert_eq!(upstream.applied().len(), 4, "a refused write reaches the store in no form");
}

#[test]
fn grpc_requests_get_grpc_statuses() {
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &["--fenced-methods", "POST"]).unwrap();
    let grpc = |token: &str| {
        let headers = [("content-type", "application/grpc"), ("fencing-token", token)];
        request(&gw.url(), "POST", "/pkg.Store/Put", &headers, b"").unwrap()
    };
    assert_eq!(grpc("34").status, 201);
    let stale = grpc("33");
    assert_eq!((stale.status, stale.header("grpc-status")), (200, Some("9")));
    assert_eq!(stale.header("fencing-highest"), Some("34"));
    assert_eq!(grpc("x").header("grpc-status"), Some("3"));
}

#[test]
fn reads_and_paths_outside_the_prefix_pass_through_unfenced() {
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &["--path-prefix", "/data/"]).unwrap();
    assert_eq!(request(&gw.url(), "GET", "/data/f", &[], b"").unwrap().status, 201);
    assert_eq!(gw.put("/public/f", None, b"x").unwrap().status, 201);
    assert_eq!(gw.put("/data/f", None, b"x").unwrap().status, 428);
    assert_eq!(gw.metric("fencekeeper_gateway_passthrough_total").unwrap(), 2);
}

/// Regression: the gateway keyed marks on the raw path, so a stale writer could
/// re-encode `/data/f` as `/data/%66` (one file to the store) and get a fresh mark,
/// or as `/dat%61/f` and slip out of the fenced prefix.
#[test]
fn a_re_encoded_path_cannot_dodge_its_mark_or_the_prefix() {
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &["--path-prefix", "/data/", "--strip-prefix", "/data/"]).unwrap();
    assert_eq!(gw.put("/data/f", Some("34"), b"new").unwrap().status, 201);
    assert_eq!(gw.put("/data/%66", Some("33"), b"old").unwrap().status, 409);
    assert_eq!(gw.put("/dat%61/f?v=2", Some("33"), b"old").unwrap().status, 409);
    assert_eq!(gw.mark("f").unwrap().as_deref(), Some("34"), "the key is the decoded path minus the stripped prefix");
    assert_eq!(upstream.applied().len(), 1);
}

#[test]
fn resource_can_come_from_a_header() {
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &["--resource-header", "x-resource"]).unwrap();
    let put = |path: &str, resource: &str, token: &str| {
        let headers = [("x-resource", resource), ("fencing-token", token)];
        request(&gw.url(), "PUT", path, &headers, b"").unwrap().status
    };
    assert_eq!(put("/a", "table-7", "5"), 201);
    assert_eq!(put("/b", "table-7", "4"), 409, "a different path, the same resource");
    assert_eq!(put("/b", "table-8", "4"), 201);
    assert_eq!(gw.put("/c", Some("9"), b"").unwrap().status, 400, "no resource header is malformed");
}

#[test]
fn efficiency_mode_refuses_whatever_a_request_carries() {
    // Efficiency mode fails open only when the mark store cannot be reached
    // (e2e_gateway_faults.rs); a missing, stale or over-long token is refused.
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &["--mode", "efficiency"]).unwrap();
    assert_eq!(gw.put("/f", None, b"x").unwrap().status, 428, "a writer cannot dodge its mark by sending no token");
    assert_eq!(gw.put("/f", Some("50"), b"x").unwrap().status, 201);
    assert_eq!(gw.put("/f", Some("4"), b"x").unwrap().status, 409, "stale is refused in every mode");
    // A stale token padded with leading zeros past the limit once exhausted the
    // guest's fuel, and efficiency mode forwarded it.
    let padded = format!("{}49", "0".repeat(4096));
    let long = gw.put("/f", Some(&padded), b"x").unwrap();
    assert_eq!(long.status, 400, "{}", long.body);
    assert!(long.body.contains("the limit is 128"), "{}", long.body);
    assert_eq!(gw.metric("fencekeeper_gateway_failed_open_total").unwrap(), 0);
    assert_eq!(upstream.applied().len(), 1, "only the admitted write reached the store");
}

#[test]
fn paths_that_are_not_utf8_are_malformed_never_merged() {
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &[]).unwrap();
    // Lossily decoded, both would be "/\u{fffd}\u{fffd}": one mark for two files.
    for path in ["/%FF%FE", "/%FE%FF"] {
        let reply = gw.put(path, Some("5"), b"x").unwrap();
        assert_eq!(reply.status, 400, "{path}: {}", reply.body);
        assert!(reply.body.contains("not UTF-8"), "{}", reply.body);
    }
    assert!(upstream.applied().is_empty());
    assert_eq!(gw.put("/b%C3%BCcher", Some("5"), b"x").unwrap().status, 201, "UTF-8 paths decode as before");
}

/// `/readyz` says not ready while the upstream takes no connection (a write would
/// advance its mark and then fail 502), and ready once it does.
#[test]
fn readyz_is_not_ready_while_the_upstream_cannot_be_reached() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let gateway = Gateway::start(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
    let (status, body) = fencekeeper_harness::services::http(gateway.admin, "GET", "/readyz", &[], b"").unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(&format!("the upstream 127.0.0.1:{port} cannot be reached")), "{body}");
    // The same port, now listening.
    let _upstream = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    assert!(gateway.ready_for_writes(), "ready once the upstream takes connections");
}

/// `/readyz` says not ready while the mark store cannot be read (every fenced write
/// would be refused 503), naming it, and ready once it can: here etcd, frozen.
#[test]
fn readyz_is_not_ready_while_the_mark_store_cannot_be_read() {
    let etcd = fencekeeper_harness::services::Etcd::start().unwrap();
    let upstream = RecordingUpstream::start().unwrap();
    let gateway = Gateway::start(&upstream.url(), &["--etcd", &etcd.client.to_string()]).unwrap();
    assert!(gateway.ready_for_writes());
    etcd.process.signal("SIGSTOP").unwrap();
    let (status, body) = fencekeeper_harness::services::http(gateway.admin, "GET", "/readyz", &[], b"").unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("the mark store cannot be read"), "{body}");
    etcd.process.signal("SIGCONT").unwrap();
    let ready = || gateway.ready_for_writes();
    fencekeeper_harness::services::poll_until("ready once etcd answers", Duration::from_secs(30), ready).unwrap();
}

#[test]
fn body_over_the_limit_gets_413_and_slow_upstream_gets_504() {
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &["--max-body", "1k", "--request-timeout", "300ms"]).unwrap();
    let big = gw.put("/f", Some("1"), &[b'x'; 2048]).unwrap();
    assert_eq!(big.status, 413, "{}", big.body);
    assert!(upstream.applied().is_empty());
    upstream.hold("2");
    let slow = gw.put("/f", Some("2"), b"x").unwrap();
    assert_eq!(slow.status, 504, "{}", slow.body);
    upstream.release("2");
    assert_eq!(gw.metric("fencekeeper_gateway_too_large_total").unwrap(), 1);
    assert_eq!(gw.metric("fencekeeper_gateway_upstream_errors_total").unwrap(), 1);
}

#[test]
fn sigterm_finishes_the_write_in_flight_then_exits_zero() {
    let upstream = RecordingUpstream::start().unwrap();
    let mut gw = Gateway::start(&upstream.url(), &[]).unwrap();
    upstream.hold("7");
    let url = gw.url();
    let client = std::thread::spawn(move || request(&url, "PUT", "/f", &[("fencing-token", "7")], b"x"));
    upstream.wait_held("7").unwrap();
    gw.process.signal("TERM").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw.log().contains("shutting down") {
        assert!(Instant::now() < deadline, "no shutdown in the log:\n{}", gw.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    upstream.release("7");
    assert_eq!(client.join().unwrap().unwrap().status, 201);
    assert!(gw.terminate(Duration::from_secs(10)).unwrap().success());
}

/// Run `fencekeeper serve` expecting it to fail at start-up (bounded wait).
fn serve_fails(args: &[&str]) -> Output {
    let mut child = Command::new(workspace_bin("fencekeeper").unwrap())
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("fencekeeper serve {args:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn start_up_errors_exit_2_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("m.redb").display().to_string();
    let bad = serve_fails(&["--upstream", "localhost", "--store", &store]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("bad upstream URL \"localhost\": no port"), "{}", stderr(&bad));

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let busy = serve_fails(&["--upstream", "http://127.0.0.1:1", "--listen", &addr, "--store", &store]);
    assert_eq!(busy.status.code(), Some(2));
    assert!(stderr(&busy).contains(&format!("address {addr} is in use")), "{}", stderr(&busy));
    // Nothing was made before the start failed: no store, no journal beside it.
    let made: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(made.is_empty(), "a start that failed left {made:?}");

    let garbage = dir.path().join("garbage.redb");
    std::fs::write(&garbage, b"not a mark store at all").unwrap();
    let corrupt = serve_fails(&["--upstream", "http://127.0.0.1:1", "--store", &garbage.display().to_string()]);
    assert_eq!(corrupt.status.code(), Some(2));
    assert!(stderr(&corrupt).contains("is corrupt or not a mark store"), "{}", stderr(&corrupt));
    assert_eq!(stderr(&corrupt).trim().lines().count(), 1, "{}", stderr(&corrupt));

    let etcd = serve_fails(&["--upstream", "http://127.0.0.1:1", "--etcd", "http://127.0.0.1:1"]);
    assert_eq!(etcd.status.code(), Some(2));
    assert!(stderr(&etcd).contains("mark store unavailable: etcd at http://127.0.0.1:1"), "{}", stderr(&etcd));
}

/// The fault-injection guest (guest/validator/src/faults.rs): canonical tokens
/// 64023.K.*.* make it lie, `fault-trap` makes it trap.
fn fault_guest() -> String {
    fencekeeper::validator::guest_path("test-guests/guest_faults.wasm").display().to_string()
}

#[test]
fn a_lying_guest_never_gets_a_write_through_and_each_lie_is_counted() {
    let upstream = RecordingUpstream::start().unwrap();
    for mode in ["correctness", "efficiency"] {
        let gw = Gateway::start(&upstream.url(), &["--guest", &fault_guest(), "--mode", mode]).unwrap();
        let file = format!("/{mode}");
        // Kind 9 is honest; kind 3 answers "admitted, mark unchanged" for anything.
        assert_eq!(gw.put(&file, Some("64023.9.0.0"), b"nine").unwrap().status, 201);
        let lie = gw.put(&file, Some("64023.3.0.5"), b"five").unwrap();
        assert_eq!(lie.status, 409, "{mode}: the gateway proves it stale: {}", lie.body);
        assert_eq!(lie.header("fencing-highest"), Some("64023.9.0.0"));
        // The guest admits 64023.2.0.1 as the maximum token: nothing the host can
        // prove but the lie, so 503, and no lock-out.
        let max = gw.put(&format!("{file}-max"), Some("64023.2.0.1"), b"max").unwrap();
        assert_eq!(max.status, 503, "{mode}: {}", max.body);
        assert_eq!(gw.mark(&format!("{file}-max")).unwrap(), None);
        let trap = gw.put(&file, Some("fault-trap"), b"trap").unwrap();
        assert_eq!(trap.status, 503, "{mode}: a guest fault is refused in every mode: {}", trap.body);
        assert_eq!(gw.metric("fencekeeper_gateway_contract_breaches_total").unwrap(), 2);
        assert_eq!(gw.metric("fencekeeper_gateway_failed_open_total").unwrap(), 0);
        assert!(gw.log().contains("validator broke the contract"), "{}", gw.log());
    }
    let bodies: Vec<Vec<u8>> = upstream.applied().into_iter().map(|a| a.body).collect();
    assert_eq!(bodies, vec![b"nine".to_vec(), b"nine".to_vec()], "only the honest writes landed");
}
