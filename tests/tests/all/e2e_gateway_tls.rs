//! TLS in the gateway, against real parts: curl as the client over TLS, a real nginx
//! serving WebDAV over TLS as the store, certificates made by the test (rcgen). The
//! listener's certificate is renewed on disk while the gateway runs, and a file that
//! is not a certificate never takes the place of a good one.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::gateway::{start_up_error_in_front_of, Gateway};
use fencekeeper_harness::secure_etcd::Certs;
use fencekeeper_harness::services::{poll_until, NginxDav, WorkDir};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `curl` over TLS trusting `ca` alone: the status, or why there is none.
fn curl(ca: &Path, url: &str, token: &str, body: &str) -> Result<(u16, String), String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(ca)
        .args(["-X", "PUT", "-H", &format!("fencing-token: {token}"), "--data-binary", body])
        .args(["-w", "\n%{http_code}", url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", ""));
    Ok((status.parse().unwrap_or(0), body.to_owned()))
}

fn dir(parent: &WorkDir, name: &str) -> std::path::PathBuf {
    let d = parent.path().join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_gateway_serves_tls_renews_its_certificate_from_disk_and_fences_an_https_store() {
    let work = WorkDir::temporary().unwrap();
    let first = Certs::generate(&dir(&work, "first")).unwrap();
    let renewed = Certs::generate(&dir(&work, "renewed")).unwrap();
    let store_certs = Certs::generate(&dir(&work, "store")).unwrap();
    let nginx = NginxDav::start_tls(&store_certs.server.0, &store_certs.server.1).unwrap();
    // The gateway's certificate files, replaced in place later as a renewal would.
    let (cert, key) = (work.path().join("gateway.pem"), work.path().join("gateway-key.pem"));
    std::fs::copy(&first.server.0, &cert).unwrap();
    std::fs::copy(&first.server.1, &key).unwrap();
    let upstream = format!("https://{}", nginx.addr);
    let args = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--upstream-cacert",
        store_certs.ca.to_str().unwrap(),
    ];
    let gateway = Gateway::start(&upstream, &args).unwrap();
    let url = format!("https://127.0.0.1:{}/tls/orders.csv", gateway.addr.port());

    // Fenced over TLS on both sides: the store (nginx over TLS) keeps the newer write.
    assert_eq!(curl(&first.ca, &url, "34", "from 34").unwrap().0, 201);
    let stale = curl(&first.ca, &url, "33", "from 33, late").unwrap();
    assert_eq!(stale.0, 409, "{stale:?}");
    assert!(stale.1.starts_with("stale fencing token 33"), "{stale:?}");
    assert_eq!(nginx.read("/tls/orders.csv").as_deref(), Some(&b"from 34"[..]));
    // A client that does not trust the gateway's CA is refused by its own TLS.
    assert!(curl(&first.other_ca, &url, "35", "x").is_err());

    // A renewal: new files in place; new connections get the new certificate.
    std::fs::copy(&renewed.server.1, &key).unwrap();
    std::fs::copy(&renewed.server.0, &cert).unwrap();
    poll_until("the renewed certificate is served", Duration::from_secs(10), || {
        curl(&renewed.ca, &url, "35", "from 35").is_ok_and(|(status, _)| status == 204)
    })
    .unwrap();
    assert!(curl(&first.ca, &url, "35", "x").is_err(), "the old certificate is still served");
    // A file that is not a certificate: the gateway says so, and keeps serving the
    // renewed one.
    let refusals = || gateway.log().matches("not usable; keeping the old").count();
    let before = refusals();
    std::fs::write(&cert, "not a certificate").unwrap();
    poll_until("the bad file is looked at", Duration::from_secs(10), || refusals() > before).unwrap();
    assert_eq!(curl(&renewed.ca, &url, "36", "from 36").unwrap().0, 204);
    assert_eq!(nginx.read("/tls/orders.csv").as_deref(), Some(&b"from 36"[..]));
}

#[test]
fn tls_mistakes_are_one_line_errors_at_start_and_an_untrusted_store_gets_no_write() {
    let work = WorkDir::temporary().unwrap();
    let certs = Certs::generate(&dir(&work, "c")).unwrap();
    let missing = work.path().join("missing.pem");
    let missing = missing.to_str().unwrap();
    let cases: [(&str, Vec<&str>, &str); 4] = [
        ("127.0.0.1:9", vec!["--tls-cert", missing, "--tls-key", missing], "missing.pem"),
        (
            "127.0.0.1:9",
            vec!["--tls-cert", certs.ca.to_str().unwrap(), "--tls-key", certs.ca.to_str().unwrap()],
            "no PEM private key",
        ),
        ("https://127.0.0.1:9", vec![], "--upstream-cacert"),
        ("127.0.0.1:9", vec!["--upstream-cacert", certs.ca.to_str().unwrap()], "write https://"),
    ];
    for (upstream, args, says) in cases {
        let (code, last, stderr) = start_up_error_in_front_of(upstream, &args).unwrap();
        assert!(code.is_some_and(|c| c != 0), "{args:?}: {stderr}");
        assert!(last.contains(says), "{args:?}: {last:?} ({stderr})");
    }
    // A store whose certificate this CA did not sign: nothing is written to it.
    let nginx = NginxDav::start_tls(&certs.server.0, &certs.server.1).unwrap();
    let gateway =
        Gateway::start(&format!("https://{}", nginx.addr), &["--upstream-cacert", certs.other_ca.to_str().unwrap()])
            .unwrap();
    let reply = gateway.put("/untrusted", Some("5"), b"x").unwrap();
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert_eq!(nginx.read("/untrusted"), None);
}
