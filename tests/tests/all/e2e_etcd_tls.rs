//! etcd as production runs it, TLS with client certificates and a user: the library's
//! etcd store connects with a CA, a client certificate and a password, fences as
//! usual, and every wrong setting fails with one line, never by talking plaintext.

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::etcd::{EtcdAuth, EtcdOptions, EtcdTls};
use fencekeeper::store::{EtcdStore, ETCD_DEFAULT_PREFIX};
use fencekeeper::{Class, Guard, NativeDecider, Policy};
use fencekeeper_harness::envoy::Envoy;
use fencekeeper_harness::gateway::{Gateway, RecordingUpstream};
use fencekeeper_harness::secure_etcd::SecureEtcd;
use std::sync::Arc;

fn options(etcd: &SecureEtcd) -> EtcdOptions {
    EtcdOptions {
        tls: Some(EtcdTls {
            ca: etcd.certs.ca.clone(),
            cert: Some(etcd.certs.client.0.clone()),
            key: Some(etcd.certs.client.1.clone()),
        }),
        auth: Some(EtcdAuth { user: etcd.user.clone(), password: etcd.password.clone() }),
        ..EtcdOptions::default()
    }
}

fn error(endpoint: &str, options: &EtcdOptions) -> String {
    let text =
        EtcdStore::connect_with(endpoint, ETCD_DEFAULT_PREFIX, options).err().expect("must not connect").to_string();
    assert!(!text.contains('\n'), "one line: {text}");
    text
}

#[test]
fn a_tls_etcd_with_users_fences_and_every_wrong_setting_fails_in_one_line() {
    let etcd = SecureEtcd::start().unwrap();
    let store = EtcdStore::connect_with(&etcd.url(), ETCD_DEFAULT_PREFIX, &options(&etcd)).unwrap();
    let guard = Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(store));
    assert!(guard.admit("orders", Some("33")).admitted());
    assert!(guard.admit("orders", Some("34")).admitted());
    assert_eq!(guard.admit("orders", Some("33")).class(), Class::Stale);
    let stored = etcd.ctl(&["get", "/fencekeeper/marks/orders", "--print-value-only"]).unwrap();
    assert!(stored.starts_with("fk2 34 "), "{stored}");

    // The wrong CA: etcd's certificate does not verify.
    let mut wrong_ca = options(&etcd);
    wrong_ca.tls.as_mut().unwrap().ca = etcd.certs.other_ca.clone();
    let text = error(&etcd.url(), &wrong_ca);
    assert!(text.contains("certificate") || text.contains("UnknownIssuer"), "{text}");
    // No client certificate: etcd refuses the handshake.
    let mut no_cert = options(&etcd);
    (no_cert.tls.as_mut().unwrap().cert, no_cert.tls.as_mut().unwrap().key) = (None, None);
    assert!(error(&etcd.url(), &no_cert).contains("etcd at https://"));
    // A certificate without its key is a configuration error, before any connection.
    let mut half = options(&etcd);
    half.tls.as_mut().unwrap().key = None;
    assert!(error(&etcd.url(), &half).contains("needs both"));
    // A wrong password.
    let mut wrong_password = options(&etcd);
    wrong_password.auth.as_mut().unwrap().password = "wrong".into();
    assert!(error(&etcd.url(), &wrong_password).contains("authenticating as \"fencekeeper\""));
    // Never plaintext: TLS files with an http:// endpoint are refused outright, and an
    // https endpoint without a CA too.
    let http = etcd.url().replace("https://", "http://");
    assert!(error(&http, &options(&etcd)).contains("never plaintext"));
    let no_tls = EtcdOptions { tls: None, ..options(&etcd) };
    assert!(error(&etcd.url(), &no_tls).contains("needs the CA"));
    // And without authentication, etcd refuses the reads.
    let no_user = EtcdOptions { auth: None, ..options(&etcd) };
    let text = error(&etcd.url(), &no_user);
    assert!(text.contains("etcd at https://"), "{text}");
}

/// `fencekeeper lock` reaches the same etcd with the same TLS and user flags; with the
/// wrong CA it says so in one line and exits 2.
#[test]
fn fencekeeper_lock_takes_a_lock_in_a_tls_etcd_with_a_user() {
    let etcd = SecureEtcd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, format!("{}\n", etcd.password)).unwrap();
    let bin = fencekeeper_harness::workspace_bin("fencekeeper").unwrap();
    let lock = |ca: &std::path::Path| {
        std::process::Command::new(&bin)
            .args(["lock", "--etcd", &etcd.client.to_string(), "--ttl", "5"])
            .arg("--etcd-cacert")
            .arg(ca)
            .arg("--etcd-cert")
            .arg(&etcd.certs.client.0)
            .arg("--etcd-key")
            .arg(&etcd.certs.client.1)
            .args(["--etcd-user", &etcd.user, "--etcd-password-file"])
            .arg(&password)
            .args(["/locks/orders", "--", "sh", "-c", "echo token=$FENCING_TOKEN"])
            .output()
            .unwrap()
    };
    let held = lock(&etcd.certs.ca);
    let stdout = String::from_utf8_lossy(&held.stdout);
    assert!(held.status.success(), "{stdout}{}", String::from_utf8_lossy(&held.stderr));
    let token: u64 = stdout.trim().strip_prefix("token=").and_then(|t| t.parse().ok()).expect("a numeric token");
    assert!(token > 0);
    let refused = lock(&etcd.certs.other_ca);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("fencekeeper: ") && stderr.contains("https://"), "{stderr}");
}

/// The gateway with its marks in the TLS etcd, as a user: it fences; with the wrong CA
/// it refuses to start, in one line, exit 2.
#[test]
fn the_gateway_keeps_its_marks_in_a_tls_etcd_as_a_user() {
    let etcd = SecureEtcd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, &etcd.password).unwrap();
    let flags = |ca: &std::path::Path| -> Vec<String> {
        [
            "--etcd",
            &etcd.client.to_string(),
            "--etcd-cacert",
            &ca.display().to_string(),
            "--etcd-cert",
            &etcd.certs.client.0.display().to_string(),
            "--etcd-key",
            &etcd.certs.client.1.display().to_string(),
            "--etcd-user",
            &etcd.user,
            "--etcd-password-file",
            &password.display().to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let upstream = RecordingUpstream::start().unwrap();
    let args = flags(&etcd.certs.ca);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let gw = Gateway::start(&upstream.url(), &args).unwrap();
    assert_eq!(gw.put("/orders", Some("34"), b"new").unwrap().status, 201);
    assert_eq!(gw.put("/orders", Some("33"), b"old").unwrap().status, 409);
    assert!(etcd.ctl(&["get", "/fencekeeper/marks//orders", "--print-value-only"]).unwrap().starts_with("fk2 34 "));

    let wrong = flags(&etcd.certs.other_ca);
    let out = std::process::Command::new(fencekeeper_harness::workspace_bin("fencekeeper").unwrap())
        .args(["serve", "--upstream", &upstream.url(), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(&wrong)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("fencekeeper: ") && last.contains("https://"), "{stderr}");
}

/// Envoy reaches a TLS etcd with a client certificate (`envoy-config --etcd-cacert
/// --etcd-cert --etcd-key`): it fences as with plain etcd, and with the wrong CA it
/// cannot decide (503), never admitting.
#[test]
fn envoy_keeps_its_marks_in_a_tls_etcd() {
    let etcd = SecureEtcd::start_without_users().unwrap();
    let nginx = fencekeeper_harness::services::NginxDav::start().unwrap();
    let tls = |ca: &std::path::Path| -> Vec<String> {
        let mut a: Vec<String> = ["--upstream", &nginx.addr.to_string(), "--etcd", &etcd.client.to_string()]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        a.extend(["--provenance".to_owned(), "off".to_owned()]);
        a.extend(["--etcd-cacert".to_owned(), ca.display().to_string()]);
        a.extend(["--etcd-cert".to_owned(), etcd.certs.client.0.display().to_string()]);
        a.extend(["--etcd-key".to_owned(), etcd.certs.client.1.display().to_string()]);
        a
    };
    let args = tls(&etcd.certs.ca);
    let envoy = Envoy::start(1, &args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let put = |e: &Envoy, token: &str| e.send("PUT", "/orders", &[("fencing-token", token)], b"x").unwrap();
    assert!(matches!(put(&envoy, "34").status, 201 | 204));
    assert_eq!(put(&envoy, "33").status, 409);
    assert!(etcd.ctl(&["get", "/fencekeeper/marks//orders", "--print-value-only"]).unwrap().starts_with("fk2 34 "));
    let args = tls(&etcd.certs.other_ca);
    let wrong = Envoy::start(1, &args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let refused = put(&wrong, "35");
    assert_eq!(refused.status, 503, "{}", refused.text());
}

/// Several TLS members (the one member listed twice): the generated cluster speaks
/// HTTP/2 with ALPN h2, and its health check speaks HTTP/2 too, which etcd's TLS
/// listener serves `/health` on. Checks pass (over a protocol etcd does not serve
/// there, every one would fail), and writes are fenced.
#[test]
fn envoy_health_checks_tls_members_over_http2() {
    let etcd = SecureEtcd::start_without_users().unwrap();
    let nginx = fencekeeper_harness::services::NginxDav::start().unwrap();
    let member = etcd.client.to_string();
    let members = format!("{member},{member}");
    let args = [
        "--upstream",
        &nginx.addr.to_string(),
        "--etcd",
        &members,
        "--provenance",
        "off",
        "--etcd-cacert",
        &etcd.certs.ca.display().to_string(),
        "--etcd-cert",
        &etcd.certs.client.0.display().to_string(),
        "--etcd-key",
        &etcd.certs.client.1.display().to_string(),
    ]
    .map(|s| s.to_owned());
    let envoy = Envoy::start(1, &args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while envoy.stat("cluster.fencekeeper_etcd.health_check.success").unwrap() < 4 {
        assert!(std::time::Instant::now() < deadline, "no health check passed; log:\n{}", envoy.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Not none: on a loaded machine a check can miss its one-second timeout.
    let (passed, failed) = (
        envoy.stat("cluster.fencekeeper_etcd.health_check.success").unwrap(),
        envoy.stat("cluster.fencekeeper_etcd.health_check.failure").unwrap(),
    );
    assert!(failed < passed, "{passed} checks passed, {failed} failed; log:\n{}", envoy.log());
    let put = |token: &str| envoy.send("PUT", "/orders", &[("fencing-token", token)], b"x").unwrap();
    assert!(matches!(put("34").status, 201 | 204));
    assert_eq!(put("33").status, 409);
}
