//! Envoy in front of a store that speaks TLS (`envoy-config --upstream https://...
//! --upstream-cacert`): a real nginx serving WebDAV over TLS, certificates made by the
//! test. The store's certificate is checked against its CA alone.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::{assert_admitted, Envoy};
use fencekeeper_harness::secure_etcd::Certs;
use fencekeeper_harness::services::{NginxDav, WorkDir};

#[test]
fn envoy_fences_a_store_over_tls_and_sends_nothing_to_one_its_ca_did_not_sign() {
    let work = WorkDir::temporary().unwrap();
    let certs = Certs::generate(work.path()).unwrap();
    let nginx = NginxDav::start_tls(&certs.server.0, &certs.server.1).unwrap();
    let upstream = format!("https://{}", nginx.addr);
    let args = |ca: &std::path::Path| {
        let ca = ca.to_str().unwrap().to_owned();
        vec!["--upstream".to_owned(), upstream.clone(), "--upstream-cacert".to_owned(), ca]
            .into_iter()
            .chain(["--no-etcd", "--mode", "efficiency"].map(str::to_owned))
            .collect::<Vec<_>>()
    };
    let trusted = args(&certs.ca);
    let envoy = Envoy::start(1, &trusted.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert_admitted(&envoy.put("/tls/orders.csv", "34", "from 34").unwrap());
    let stale = envoy.put("/tls/orders.csv", "33", "from 33, late").unwrap();
    assert_eq!(stale.status, 409, "{}", stale.text());
    assert_eq!(nginx.read("/tls/orders.csv").as_deref(), Some(&b"from 34"[..]));
    drop(envoy);

    let untrusted = args(&certs.other_ca);
    let envoy = Envoy::start(1, &untrusted.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let refused = envoy.put("/tls/other.csv", "5", "x").unwrap();
    assert!(refused.status >= 500, "{} {}", refused.status, refused.text());
    assert_eq!(nginx.read("/tls/other.csv"), None, "a store whose certificate the CA did not sign got the write");
}
