//! Envoy's filter authenticating to an etcd with users (`envoy-config --etcd-user
//! --etcd-password-env`): the password is in Envoy's environment, never in its
//! configuration. A real etcd with authentication on (a root user, and the filter's
//! user read-write on the marks' prefix only), a real Envoy, a real nginx.

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::{assert_admitted, store_and_etcd, Envoy, Reply};
use fencekeeper_harness::services::{http, poll_until, Etcd, NginxDav};
use std::process::Command;
use std::time::Duration;

const USER: &str = "fencekeeper";
const PASSWORD: &str = "pw-3e9a71-never-in-the-config";
const VAR: &str = "FK_TEST_ETCD_PASSWORD";
const PREFIX: &str = "/fencekeeper/marks/";
/// The in-flight registry's prefix (the shared gate, on with etcd marks).
const FLIGHTS: &str = "/fencekeeper/flights/";
/// etcd forgets a simple token this long after its last use (`--auth-token-ttl`).
const TOKEN_TTL_SECS: u64 = 2;
const AUTHENTICATED: &str = "fencekeeper: authenticated to etcd as";

/// nginx, and an etcd with users whose tokens live [`TOKEN_TTL_SECS`] (the lowest
/// bcrypt cost: the tests authenticate often).
fn store_and_etcd_with_users() -> (NginxDav, Etcd) {
    let ttl = format!("--auth-token-ttl={TOKEN_TTL_SECS}");
    let (nginx, etcd) = store_and_etcd(&[&ttl, "--bcrypt-cost=4"]).unwrap();
    etcd.enable_auth(USER, PASSWORD, &[PREFIX, FLIGHTS]).unwrap();
    (nginx, etcd)
}

/// A user granted the marks but not the in-flight registry (a role written before
/// the shared gate was the default): every write is refused, 503, with the grant
/// that mends it, and nothing reaches the store; `--local-gate` runs without the
/// registry.
#[test]
fn a_user_without_the_registrys_prefix_is_told_the_grant_it_needs_and_nothing_is_written() {
    let ttl = format!("--auth-token-ttl={TOKEN_TTL_SECS}");
    let (nginx, etcd) = store_and_etcd(&[&ttl, "--bcrypt-cost=4"]).unwrap();
    etcd.enable_auth(USER, PASSWORD, &[PREFIX]).unwrap();
    let envoy = start(&args(&nginx, &etcd.client.to_string()), &[(VAR, PASSWORD)]).unwrap();
    let refused = put(&envoy, "/orders", "34");
    assert_eq!(refused.status, 503, "{}", refused.text());
    let reason = refused.text();
    assert!(
        reason.contains("PERMISSION_DENIED")
            && reason.contains(&format!("read-write on the in-flight registry's prefix {FLIGHTS}")),
        "{reason}"
    );
    assert!(reason.contains("--local-gate"), "{reason}");
    assert_eq!(nginx.read("/orders"), None, "nothing reached the store");
    drop(envoy);
    let local = [args(&nginx, &etcd.client.to_string()), vec!["--local-gate".to_owned()]].concat();
    let envoy = start(&local, &[(VAR, PASSWORD)]).unwrap();
    assert_admitted(&put(&envoy, "/orders", "35"));
}

/// The same user through a gateway (`serve --etcd-user`): the same 503 with the grant
/// that mends it, nothing written, and `--local-gate` runs without the registry.
#[test]
fn a_gateway_whose_user_lacks_the_registrys_prefix_is_told_the_grant_it_needs() {
    use fencekeeper_harness::gateway::Gateway;
    let (nginx, etcd) = store_and_etcd(&["--bcrypt-cost=4"]).unwrap();
    etcd.enable_auth(USER, PASSWORD, &[PREFIX]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, PASSWORD).unwrap();
    let (url, password) = (etcd.url(), password.display().to_string());
    let args = ["--etcd", &url, "--etcd-user", USER, "--etcd-password-file", &password, "--provenance", "off"];
    let upstream = format!("http://{}", nginx.addr);
    let gateway = Gateway::start(&upstream, &args).unwrap();
    let refused = gateway.put("/orders", Some("34"), b"from 34").unwrap();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(
        refused.body.contains("PERMISSION_DENIED")
            && refused.body.contains(&format!("read-write on the in-flight registry's prefix {FLIGHTS}"))
            && refused.body.contains("--local-gate"),
        "{}\n{}",
        refused.body,
        gateway.log()
    );
    assert_eq!(nginx.read("/orders"), None, "nothing reached the store");
    drop(gateway);
    let local = Gateway::start(&upstream, &[&args[..], &["--local-gate"]].concat()).unwrap();
    let admitted = local.put("/orders", Some("35"), b"from 35").unwrap();
    assert!((200..300).contains(&admitted.status), "{admitted:?}");
}

/// The generated configuration's flags: marks in `etcd` as [`USER`]. The tokens are
/// made up, not etcd revisions, so the provenance check is off.
fn args(nginx: &NginxDav, etcd: &str) -> Vec<String> {
    ["--upstream", &nginx.addr.to_string(), "--etcd", etcd, "--provenance", "off"]
        .into_iter()
        .chain(["--etcd-user", USER, "--etcd-password-env", VAR])
        .map(str::to_owned)
        .collect()
}

fn start(args: &[String], env: &[(&str, &str)]) -> anyhow::Result<Envoy> {
    Envoy::start_in_env(1, &args.iter().map(String::as_str).collect::<Vec<_>>(), env)
}

/// A PUT whose body names its token.
fn put(envoy: &Envoy, path: &str, token: &str) -> Reply {
    envoy.put(path, token, format!("from {token}")).unwrap()
}

/// The mark etcd holds for `resource`, read as root.
fn mark(etcd: &Etcd, resource: &str) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd.url()))
        .args(["--user=root:root-password", "get", "--print-value-only"])
        .arg(format!("{PREFIX}{resource}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A token of [`USER`], from etcd's JSON gateway.
fn authenticate(etcd: &Etcd) -> String {
    let body = format!(r#"{{"name":"{USER}","password":"{PASSWORD}"}}"#);
    let (status, answer) = http(etcd.client, "POST", "/v3/auth/authenticate", &[], body.as_bytes()).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    answer["token"].as_str().unwrap().to_owned()
}

/// Whether etcd still takes `token` (a read under the prefix: 200, or 401 once the
/// token expired). A use renews a simple token, so each token is asked once.
fn accepted(etcd: &Etcd, token: &str) -> bool {
    // {"key": base64("/fencekeeper/marks/x")}
    let body = br#"{"key":"L2ZlbmNla2VlcGVyL21hcmtzL3g="}"#;
    let (status, answer) = http(etcd.client, "POST", "/v3/kv/range", &[("Authorization", token)], body).unwrap();
    assert!(status == 200 || status == 401, "{status} {}", String::from_utf8_lossy(&answer));
    status == 200
}

/// (a) a fenced write as the user lands in etcd and a stale one is refused; (b) the
/// password is nowhere in `/config_dump` (nor in Envoy's log); (c) after etcd has
/// forgotten the filter's token, a write still succeeds: refused once for its
/// token, the filter authenticates again and retries.
#[test]
fn envoy_fences_as_an_etcd_user_with_the_password_from_its_environment_and_survives_the_token_expiring() {
    let (nginx, etcd) = store_and_etcd_with_users();
    let envoy = start(&args(&nginx, &etcd.client.to_string()), &[(VAR, PASSWORD)]).unwrap();

    assert_admitted(&put(&envoy, "/orders", "34"));
    let stale = put(&envoy, "/orders", "33");
    assert_eq!(stale.status, 409, "{}", stale.text());
    assert!(mark(&etcd, "/orders").starts_with("fk2 34 "), "{}", mark(&etcd, "/orders"));
    assert_eq!(nginx.read("/orders").as_deref(), Some(&b"from 34"[..]));

    let (status, dump) = http(envoy.admin, "GET", "/config_dump", &[], b"").unwrap();
    let dump = String::from_utf8_lossy(&dump);
    assert_eq!(status, 200);
    assert!(dump.contains(VAR) && dump.contains(USER), "the variable's name and the user are in the config");
    assert!(!dump.contains(PASSWORD), "the password is in /config_dump");
    assert!(!envoy.log().contains(PASSWORD), "the password is in Envoy's log");
    assert_eq!(envoy.log().matches(AUTHENTICATED).count(), 1, "{}", envoy.log());

    // Wait, by asking etcd, until it has forgotten the filter's token: tokens taken
    // after the filter's last call expire no earlier than its token, and each probe is
    // asked once (asking renews it).
    let mut probes = (0..40).map(|_| authenticate(&etcd)).collect::<Vec<_>>().into_iter();
    poll_until("etcd forgets a token", Duration::from_secs(TOKEN_TTL_SECS * 5), || {
        std::thread::sleep(Duration::from_millis(150));
        probes.next().is_some_and(|t| !accepted(&etcd, &t))
    })
    .unwrap();

    assert_admitted(&put(&envoy, "/orders", "35"));
    assert!(mark(&etcd, "/orders").starts_with("fk2 35 "), "{}", mark(&etcd, "/orders"));
    // Authenticated again, by that write or, when the filter's own calls in the
    // background (the shared gate's lease grants every 5 s, its flights' deletes)
    // kept its token alive past the probes', by the first of them to find it
    // expired: a token unused for 2 s is.
    let again = || envoy.log().matches(AUTHENTICATED).count() >= 2;
    poll_until("the filter authenticates again", Duration::from_secs(15), again)
        .unwrap_or_else(|e| panic!("{e}: {}", envoy.log()));
    assert_admitted(&put(&envoy, "/orders", "36"));
    assert_eq!(envoy.stat("wasmcustom.fencekeeper.undecided").unwrap(), 0);
    assert!(!envoy.log().contains(PASSWORD));
}

/// (d) a wrong password: the write is refused 503 with a reason that says the
/// authentication failed (and not the password), counted as undecided; the store
/// sees nothing.
#[test]
fn a_wrong_password_is_a_503_saying_authentication_failed_and_nothing_reaches_the_store() {
    let (nginx, etcd) = store_and_etcd_with_users();
    let wrong = "not-the-password-5c1d";
    let envoy = start(&args(&nginx, &etcd.client.to_string()), &[(VAR, wrong)]).unwrap();
    let refused = put(&envoy, "/orders", "34");
    assert_eq!(refused.status, 503, "{}", refused.text());
    let text = refused.text();
    assert!(text.contains("etcd authentication failed for user \"fencekeeper\""), "{text}");
    assert!(!text.contains(wrong) && text.trim_end().lines().count() == 1, "{text}");
    assert_eq!(nginx.read("/orders"), None, "forwarded a write the filter could not check");
    assert_eq!(envoy.stat("wasmcustom.fencekeeper.undecided").unwrap(), 1);
    assert_eq!(mark(&etcd, "/orders"), "");
    assert!(!envoy.log().contains(wrong));
}

/// Without the variable in Envoy's environment (or with it empty) the filter refuses
/// to start, in one line naming the variable. Nothing is asked of etcd.
#[test]
fn envoy_refuses_to_start_without_the_password_in_its_environment() {
    let nginx = NginxDav::start().unwrap();
    let args = args(&nginx, "127.0.0.1:9");
    for (env, needle) in [(&[][..], "is not set"), (&[(VAR, "")][..], "is empty")] {
        let err = start(&args, env).err().expect("envoy started without the password");
        let text = format!("{err:#}");
        let line = text.lines().find(|l| l.contains("fencekeeper: cannot start")).unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains(VAR) && line.contains(needle), "{line}");
    }
}

/// The same user through etcd's JSON API (`--etcd-api json`, as a proxy-wasm host
/// without gRPC calls runs): the token travels in the `authorization` header, a
/// write is fenced with it, and a wrong password is the same one-line 503.
#[test]
fn over_etcds_json_api_the_filter_authenticates_and_a_wrong_password_is_the_same_503() {
    let (nginx, etcd) = store_and_etcd_with_users();
    let json = [args(&nginx, &etcd.client.to_string()), vec!["--etcd-api".to_owned(), "json".to_owned()]].concat();
    let envoy = start(&json, &[(VAR, PASSWORD)]).unwrap();
    assert_admitted(&put(&envoy, "/orders", "34"));
    assert_eq!(put(&envoy, "/orders", "33").status, 409);
    assert!(mark(&etcd, "/orders").starts_with("fk2 34 "), "{}", mark(&etcd, "/orders"));
    assert_eq!(envoy.log().matches(AUTHENTICATED).count(), 1, "{}", envoy.log());
    assert!(!envoy.log().contains(PASSWORD));
    drop(envoy);
    let wrong = "not-the-password-77b2";
    let envoy = start(&json, &[(VAR, wrong)]).unwrap();
    let refused = put(&envoy, "/orders", "35");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.text().contains("etcd authentication failed for user \"fencekeeper\""), "{}", refused.text());
    assert!(mark(&etcd, "/orders").starts_with("fk2 34 "), "{}", mark(&etcd, "/orders"));
}
