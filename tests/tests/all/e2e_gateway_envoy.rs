//! A gateway and an Envoy with the Fencekeeper filter in front of one store, sharing
//! marks through one etcd (the shared key scheme): each refuses the tokens the other
//! has made stale; a gateway that runs its admits on the blocking pool decides the
//! same.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::Envoy;
use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::services::{Etcd, NginxDav};

#[test]
fn gateway_and_envoy_sharing_etcd_refuse_each_others_stale_tokens() {
    let (etcd, nginx) = (Etcd::start().unwrap(), NginxDav::start().unwrap());
    // Made-up tokens, not etcd revisions: no provenance check (e2e_envoy_provenance.rs).
    let envoy = Envoy::start(
        1,
        &["--upstream", &nginx.addr.to_string(), "--etcd", &etcd.client.to_string(), "--provenance", "off"],
    )
    .unwrap();
    let gateway = Gateway::start(&format!("http://{}", nginx.addr), &["--etcd", &etcd.url()]).unwrap();

    let via_envoy = envoy.send("PUT", "/shared/a", &[("fencing-token", "34")], b"envoy 34").unwrap();
    assert!(matches!(via_envoy.status, 201 | 204), "{}", via_envoy.text());
    let stale = gateway.put("/shared/a", Some("33"), b"gateway 33").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("34")), "{}", stale.body);
    assert_eq!(gateway.mark("/shared/a").unwrap().as_deref(), Some("34"));

    let newer = gateway.put("/shared/a", Some("35"), b"gateway 35").unwrap();
    assert!(matches!(newer.status, 201 | 204), "{}", newer.body);
    let stale = envoy.send("PUT", "/shared/a", &[("fencing-token", "34")], b"envoy 34 again").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("35")), "{}", stale.text());
    assert_eq!(nginx.read("/shared/a").as_deref(), Some(&b"gateway 35"[..]));

    // A gateway that runs its admits on the blocking pool (the earlier way) decides
    // the same against the same etcd, and the awaiting one follows its advance.
    let blocking =
        Gateway::start(&format!("http://{}", nginx.addr), &["--etcd", &etcd.url(), "--blocking-admits"]).unwrap();
    let stale = blocking.put("/shared/a", Some("34"), b"blocking 34").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("35")), "{}", stale.body);
    let again = blocking.put("/shared/a", Some("35"), b"blocking 35").unwrap();
    assert!(matches!(again.status, 201 | 204), "{}", again.body);
    let newer = blocking.put("/shared/a", Some("36"), b"blocking 36").unwrap();
    assert!(matches!(newer.status, 201 | 204), "{}", newer.body);
    let stale = gateway.put("/shared/a", Some("35"), b"gateway 35 again").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("36")), "{}", stale.body);
    assert_eq!(nginx.read("/shared/a").as_deref(), Some(&b"blocking 36"[..]));
}
