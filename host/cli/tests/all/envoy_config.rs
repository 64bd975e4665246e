//! `fencekeeper envoy-config` output, pinned by golden files (re-bless with
//! `BLESS=1 cargo test --release -p fencekeeper-cli --test all envoy_config::`).
//! tests/tests/all/e2e_envoy_config.rs runs `envoy --mode validate` on the same output.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::process::Command;

fn generate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fencekeeper")).arg("envoy-config").args(args).output().unwrap()
}

fn golden(name: &str, args: &[&str]) {
    crate::nginx_config::matches_golden(name, &generate(args));
}

// A fixed --filter path: the default depends on where the checkout lives.
const FILTER: &str = "/opt/fencekeeper/fencekeeper_filter.wasm";

#[test]
fn default_config_fences_the_path_in_correctness_mode_with_etcd() {
    golden("envoy-config-default.yaml", &["--upstream", "127.0.0.1:8080", "--filter", FILTER]);
}

#[test]
fn provenance_is_weak_with_etcd_by_default_and_strong_names_the_lock_prefix() {
    let value = |args: &[&str]| {
        let out = generate(&[&["--upstream", "127.0.0.1:8080", "--filter", FILTER][..], args].concat());
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        let yaml = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = yaml.lines().find(|l| l.trim_start().starts_with("value: '")).map(str::trim).unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(&line["value: '".len()..line.len() - 1]).expect("JSON");
        (json["provenance"].as_str().map(str::to_owned), json["lock_prefix"].as_str().map(str::to_owned))
    };
    assert_eq!(value(&[]), (Some("weak".into()), None));
    assert_eq!(value(&["--provenance", "off"]), (Some("off".into()), None));
    assert_eq!(
        value(&["--provenance", "strong", "--lock-prefix", "/locks/"]),
        (Some("strong".into()), Some("/locks/".into()))
    );
    for (args, needle) in [
        (&["--provenance", "strong"][..], "needs --lock-prefix"),
        (&["--lock-prefix", "/l/"][..], "goes with --provenance strong"),
        (&["--provenance", "weak", "--no-etcd", "--mode", "efficiency"][..], "it needs etcd"),
    ] {
        let out = generate(&[&["--upstream", "127.0.0.1:8080", "--filter", FILTER][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(needle),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn efficiency_config_without_etcd_keeps_marks_in_shared_data() {
    golden(
        "envoy-config-efficiency.yaml",
        &[
            "--upstream",
            "store.internal:80",
            "--filter",
            FILTER,
            "--mode",
            "efficiency",
            "--no-etcd",
            "--resource-header",
            "x-object",
            "--strict",
        ],
    );
}

#[test]
fn correctness_mode_without_etcd_is_refused_with_a_reason() {
    let out = generate(&["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--no-etcd"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-etcd needs --mode efficiency"));
}

/// Several members: every one an endpoint, health-checked so a member without a
/// leader (etcd's /health answers 503) is skipped after two misses, not the first.
#[test]
fn an_etcd_cluster_lists_every_member_health_checked() {
    golden(
        "envoy-config-etcd-cluster.yaml",
        &["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--etcd", "10.0.0.1:2379,10.0.0.2:2379, 10.0.0.3:2379"],
    );
}

#[test]
fn a_bad_etcd_member_is_refused_naming_the_list() {
    let out = generate(&["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--etcd", "10.0.0.1:2379,10.0.0.2"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--etcd \"10.0.0.1:2379,10.0.0.2\"") && err.contains("\"10.0.0.2\" is not HOST:PORT"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// etcd authentication: the user and the name of the variable holding the password
/// go into the configuration, and Envoy is told to pass that variable to the VM; the
/// password itself is never an argument.
#[test]
fn etcd_auth_names_the_user_and_the_password_variable_only() {
    golden(
        "envoy-config-etcd-auth.yaml",
        &[
            "--upstream",
            "127.0.0.1:8080",
            "--filter",
            FILTER,
            "--etcd-user",
            "fencekeeper",
            "--etcd-password-env",
            "FK_ETCD_PASSWORD",
        ],
    );
    for (args, needle) in [
        (&["--etcd-user", "fk"][..], "--etcd-password-env"),
        (&["--etcd-password-env", "P"][..], "--etcd-user"),
        (&["--etcd-user", "fk", "--etcd-password-env", "A=B"][..], "not an environment variable name"),
        (&["--etcd-user", "fk", "--etcd-password-env", "P", "--no-etcd", "--mode", "efficiency"][..], "--no-etcd"),
    ] {
        let out = generate(&[&["--upstream", "127.0.0.1:8080", "--filter", FILTER][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Only the listed methods enter the filter, matched in any case; every other
/// request skips it on a route that removes a client's `fencing-admitted-token`.
/// The filter is told the same list.
#[test]
fn fenced_methods_route_only_those_through_the_filter() {
    golden(
        "envoy-config-fenced-methods.yaml",
        &["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--fenced-methods", "put, delete,MKCOL"],
    );
    for (list, needle) in [("", "nothing would be fenced"), (" , ", "nothing would be fenced"), ("PUT,P(T", "\"P(T\"")]
    {
        let out = generate(&["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--fenced-methods", list]);
        assert_eq!(out.status.code(), Some(2), "{list:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle) && err.contains("--fenced-methods"), "{list:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn webdav_routes_its_reads_past_the_filter_and_tells_the_filter_the_protocol() {
    golden("envoy-config-webdav.yaml", &["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--protocol", "webdav"]);
    let out = generate(&["--upstream", "127.0.0.1:8080", "--protocol", "webdav", "--resource-header", "x-r"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--protocol") && err.contains("--resource-header"), "{err}");
}

#[test]
fn s3_tells_the_filter_the_protocol_and_routes_http_reads_past_it() {
    let out = generate(&["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--protocol", "s3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(yaml.contains(r#""protocol":"s3""#), "{yaml}");
    assert!(yaml.contains("(GET, HEAD, OPTIONS: the filter's default for --protocol s3)"), "{yaml}");
}

/// Envoy's own answers (the store out of reach or late, a held body over the limit)
/// are the gateway's: S3's error document with the engine's `Code` for S3 clients, a
/// one-line text for plain ones, the engine's gRPC status for gRPC ones. They are
/// picked out by Envoy's response flags or reply details only, never by status: the
/// filter's own answers, local replies too, must pass every mapper unchanged.
#[test]
fn envoy_s_own_answers_take_the_client_s_form_and_leave_the_filter_s_alone() {
    let yaml = |args: &[&str]| {
        let out = generate(&[&["--upstream", "127.0.0.1:8080", "--filter", FILTER][..], args].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let s3 = yaml(&["--protocol", "s3", "--conditional-writes", "--precondition-probe", "off"]);
    for code in ["BadGateway", "GatewayTimeout", "EntityTooLarge"] {
        assert!(s3.contains(&format!("<Code>{code}</Code>")), "{code}:\n{s3}");
    }
    assert!(s3.contains("content_type: \"application/xml\""), "{s3}");
    assert!(s3.contains("response.code_details == 'request_payload_too_large'"), "{s3}");
    let plain = yaml(&["--request-timeout", "3s"]);
    assert!(plain.contains("did not answer within 3s"), "{plain}");
    assert!(!plain.contains("<Code>") && !plain.contains("request_payload_too_large"), "{plain}");
    for status in ["502", "504"] {
        assert!(plain.contains(&format!("status_code: {status}")), "{status}:\n{plain}");
    }
    for grpc in ["14", "4"] {
        assert!(plain.contains(&format!("key: grpc-status, value: \"{grpc}\"")), "{grpc}:\n{plain}");
    }
    for yaml in [&s3, &plain] {
        assert!(yaml.contains("local_reply_config:") && !yaml.contains("status_code_filter"), "{yaml}");
    }
}

#[test]
fn bad_upstream_is_refused_with_a_reason() {
    let out = generate(&["--upstream", "nohostport", "--filter", FILTER]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not HOST:PORT"));
    for (url, says) in [
        ("https://127.0.0.1:8443", "needs the CA of its certificate (--upstream-cacert)"),
        ("ftp://127.0.0.1:21", "ftp:// upstream is not supported"),
        ("127.0.0.1:8080/b", "path"),
    ] {
        let out = generate(&["--upstream", url, "--filter", FILTER]);
        assert_eq!(out.status.code(), Some(2), "{url}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{url}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn an_http_url_upstream_is_taken_as_its_host_and_port() {
    // The gateway's --upstream form: the cluster's address must be the host, never the URL.
    let url = generate(&["--upstream", "http://127.0.0.1:8080/", "--filter", FILTER]);
    let bare = generate(&["--upstream", "127.0.0.1:8080", "--filter", FILTER]);
    assert!(url.status.success(), "{}", String::from_utf8_lossy(&url.stderr));
    assert_eq!(url.stdout, bare.stdout);
    assert!(!String::from_utf8_lossy(&url.stdout).contains("http://127.0.0.1"));
}

#[test]
fn an_https_upstream_is_reached_over_tls_checked_against_its_ca_alone() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("store-ca.pem");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n").unwrap();
    let ca = ca.canonicalize().unwrap();
    let ca_arg = ca.to_str().unwrap();
    let out = generate(&["--upstream", "https://127.0.0.1:8443", "--upstream-cacert", ca_arg, "--filter", FILTER]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout);
    let clusters = &yaml[yaml.find("\n  clusters:").unwrap()..];
    let store = &clusters[clusters.find("  - name: store").unwrap()..];
    let store = &store[..store[1..].find("\n  - name:").map_or(store.len(), |i| i + 1)];
    for line in [
        "socket_address: { address: 127.0.0.1, port_value: 8443 }",
        "UpstreamTlsContext",
        "alpn_protocols: [http/1.1]",
        &format!("trusted_ca: {{ filename: '{}' }}", ca.display()),
        "- san_type: IP_ADDRESS",
        "matcher: { exact: '127.0.0.1' }",
    ] {
        assert!(store.contains(line), "{line}:\n{store}");
    }
    // A CA for a plain upstream is refused: never plaintext where TLS was meant.
    let plain = generate(&["--upstream", "127.0.0.1:8080", "--upstream-cacert", ca_arg, "--filter", FILTER]);
    assert!(String::from_utf8_lossy(&plain.stderr).contains("write https://"), "{plain:?}");
}
