//! etcd as production runs it, TLS with client certificates and a user: the library's
//! etcd store connects with a CA, a client certificate and a password, fences as
//! usual, and every wrong setting fails with one line, never by talking plaintext.

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::store::{EtcdAuth, EtcdOptions, EtcdStore, EtcdTls};
use fencekeeper::{Class, Guard, NativeDecider, Policy};
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
    let text = EtcdStore::connect_with(endpoint, options).err().expect("must not connect").to_string();
    assert!(!text.contains('\n'), "one line: {text}");
    text
}

#[test]
fn a_tls_etcd_with_users_fences_and_every_wrong_setting_fails_in_one_line() {
    let etcd = SecureEtcd::start().unwrap();
    let store = EtcdStore::connect_with(&etcd.url(), &options(&etcd)).unwrap();
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
