//! `fencekeeper lock` without a lock service: every way it can fail before COMMAND
//! runs is one `fencekeeper:` line and exit 2, and COMMAND never runs. With real
//! services it is tested in tests/tests/all/e2e_tokens_*.rs.

// A test states its expectations by panicking.
#![allow(clippy::panic)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_fencekeeper");

/// Run `fencekeeper lock ARGS...`: (exit code, stdout, stderr).
fn lock(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).arg("lock").args(args).output().unwrap_or_else(|e| panic!("run fencekeeper: {e}"));
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// A loopback port nothing listens on.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(1);
    drop(listener);
    format!("127.0.0.1:{port}")
}

#[test]
fn an_unreachable_lock_service_is_one_line_and_exit_2_and_the_command_never_runs() {
    let address = closed_port();
    for service in ["--etcd", "--zookeeper", "--redis"] {
        let (code, stdout, stderr) = lock(&[service, &address, "orders", "--", "echo", "ran"]);
        assert_eq!(code, Some(2), "{service}: {stderr}");
        assert!(stdout.is_empty(), "{service}: the command ran: {stdout}");
        assert_eq!(stderr.lines().count(), 1, "{service}: {stderr}");
        assert!(stderr.starts_with("fencekeeper: taking lock "), "{service}: {stderr}");
        assert!(stderr.contains(&address), "{service}: {stderr}");
    }
}

#[test]
fn a_bad_command_line_is_one_line_and_exit_2() {
    let address = closed_port();
    let cases: [(&[&str], &str); 4] = [
        (&["orders", "--", "true"], "--etcd"),
        (&["--etcd", &address, "orders"], "<COMMAND>"),
        (&["--etcd", &address, "--redis", &address, "orders", "--", "true"], "cannot be used with"),
        (&["--etcd", &address, "--on-loss", "SIGSEGV", "orders", "--", "true"], "not a signal this command sends"),
    ];
    for (args, says) in cases {
        let (code, _, stderr) = lock(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("fencekeeper: ") && stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn a_zookeeper_lock_name_that_is_no_path_is_refused_before_connecting() {
    let (code, _, stderr) = lock(&["--zookeeper", &closed_port(), "a//b", "--", "true"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is not a ZooKeeper path for a lock"), "{stderr}");
}
