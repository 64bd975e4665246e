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

/// One settings file for both hosts: the gateway reads it with `serve --config`, Envoy
/// runs what `envoy-config --config` makes of it. The shared keys (the store, etcd,
/// strict, provenance) reach both, a command's table reaches it alone, and a flag
/// wins over the file.
#[test]
fn one_settings_file_configures_the_gateway_and_envoy_alike() {
    let (etcd, nginx) = (Etcd::start().unwrap(), NginxDav::start().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fencekeeper.toml");
    std::fs::write(
        &file,
        format!(
            "upstream = \"{store}\"\netcd = [\"{etcd}\"]\nstrict = true\nprovenance = \"off\"\n\
             [serve]\ntoken-header = \"x-fence\"\n[envoy-config]\ngate-timeout = \"2s\"\n",
            store = nginx.addr,
            etcd = etcd.client,
        ),
    )
    .unwrap();
    let config = file.display().to_string();
    let gateway = Gateway::start(&nginx.addr.to_string(), &["--config", &config]).unwrap();
    let envoy = Envoy::start(1, &["--config", &config]).unwrap();

    // The gateway takes its token from the file's header, and its marks from etcd.
    let put = |token: &str, body: &str| {
        fencekeeper_harness::gateway::request(
            &gateway.url(),
            "PUT",
            "/shared/f",
            &[("x-fence", token)],
            body.as_bytes(),
        )
    };
    let first = put("40", "gateway 40").unwrap();
    assert!(matches!(first.status, 201 | 204), "{}", first.body);
    assert_eq!(gateway.put("/shared/f", Some("41"), b"default header").unwrap().status, 428, "[serve]'s header only");
    // Strict on both: the same token again is replayed, through either host.
    let again = put("40", "gateway 40 again").unwrap();
    assert_eq!((again.status, again.header("fencing-highest")), (409, Some("40")), "{}", again.body);
    let replayed = envoy.send("PUT", "/shared/f", &[("fencing-token", "40")], b"envoy 40").unwrap();
    assert_eq!((replayed.status, replayed.header("fencing-highest")), (409, Some("40")), "{}", replayed.text());
    // Provenance off from the file: a made-up token advances through Envoy.
    let newer = envoy.send("PUT", "/shared/f", &[("fencing-token", "41")], b"envoy 41").unwrap();
    assert!(matches!(newer.status, 201 | 204), "{}", newer.text());
    let stale = put("40", "gateway 40 late").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("41")), "{}", stale.body);
    assert_eq!(nginx.read("/shared/f").as_deref(), Some(&b"envoy 41"[..]));
    // [envoy-config]'s key reached the filter's configuration, and the flag wins over
    // the file.
    let yaml = fencekeeper_harness::envoy::generate(10000, 9901, &["--config", &config]).unwrap();
    assert!(yaml.contains("\"budget_ms\":2000"), "{yaml}");
    let yaml =
        fencekeeper_harness::envoy::generate(10000, 9901, &["--config", &config, "--gate-timeout", "3s"]).unwrap();
    assert!(yaml.contains("\"budget_ms\":3000"), "{yaml}");
}
