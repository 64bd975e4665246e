//! `fencekeeper nginx-config` output, pinned by golden files (re-bless with `BLESS=1
//! cargo test --release -p fencekeeper-cli --test all nginx_config::`), and validated
//! the way `envoy-config`'s is run through Envoy: its plugin configuration loaded into
//! the in-process proxy-wasm host's strict profile (ngx_wasm_module's limits, with the
//! shm_kv namespace the output declares), where it must configure and fence.

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_pwhost::{Binary, CallAnswer, Callout, Profile, Proxy, Request, State};
use std::cell::RefCell;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;

const FILTER: &str = "/opt/fencekeeper/fencekeeper_filter.wasm";

fn generate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fencekeeper")).arg("nginx-config").args(args).output().unwrap()
}

/// A generated configuration, checked against golden file `name` under tests/golden
/// (rewritten instead with `BLESS` set): its text.
pub fn matches_golden(name: &str, out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    let actual = String::from_utf8(out.stdout.clone()).unwrap();
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(actual == expected, "{} differs; re-bless with BLESS=1 if intended:\n{actual}", path.display());
    actual
}

fn golden(name: &str, args: &[&str]) -> String {
    matches_golden(name, &generate(args))
}

/// The plugin configuration of a `proxy_wasm fencekeeper '...';` line.
fn plugin_json(conf: &str) -> String {
    let line = conf.lines().find(|l| l.trim_start().starts_with("proxy_wasm fencekeeper '")).unwrap();
    let quoted = line.trim().trim_start_matches("proxy_wasm fencekeeper '").trim_end_matches("';");
    quoted.replace("\\'", "'").replace("\\\\", "\\")
}

fn binary() -> Binary {
    let dir = std::env::var_os("FENCEKEEPER_GUEST_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/artifacts"), std::path::PathBuf::from);
    Binary::load(&dir.join("fencekeeper_filter.wasm")).unwrap()
}

fn strict_proxy(json: &str) -> Proxy {
    Proxy::start(&binary(), Profile::strict(), json, 2).unwrap()
}

/// With `--etcd`: the filter calls etcd's JSON API at the address given, over HTTP
/// (here answered as an etcd that is down), and never asks for a gRPC call.
#[test]
fn with_etcd_the_filter_calls_etcds_json_api_at_the_address_given() {
    let conf = golden(
        "nginx-config-etcd.conf",
        &["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--etcd", "127.0.0.1:2379", "--local-gate"],
    );
    let json: serde_json::Value = serde_json::from_str(&plugin_json(&conf)).unwrap();
    assert_eq!((json["mode"].as_str(), json["gate"]["shared"].as_bool()), (Some("correctness"), Some(false)));
    let calls: Rc<RefCell<Vec<Callout>>> = Rc::default();
    let seen = Rc::clone(&calls);
    let answerer = Box::new(move |call: &Callout| {
        seen.borrow_mut().push(call.clone());
        CallAnswer::failed()
    });
    let mut proxy = Proxy::start_answering(&binary(), Profile::strict(), &plugin_json(&conf), 1, answerer).unwrap();
    let id = proxy.send(0, Request::put("/r").token("34"));
    let State::Answered(answer) = proxy.state(id) else { panic!("{:?}", proxy.state(id)) };
    assert_eq!(answer.status, 503, "etcd down: correctness mode fails closed: {answer:?}");
    let call = calls.borrow().first().cloned().unwrap();
    assert_eq!((call.upstream.as_str(), call.header(":path").as_deref()), ("127.0.0.1:2379", Some("/v3/kv/txn")));
    assert_eq!(proxy.grpc_calls(), 0);
    // etcd needs the acknowledgement that this nginx is the store's only way in.
    let bare = generate(&["--upstream", "store:80", "--filter", FILTER, "--etcd", "127.0.0.1:2379"]);
    assert_eq!(bare.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bare.stderr).contains("--local-gate"));
    let url = generate(&["--upstream", "store:80", "--filter", FILTER, "--etcd", "http://e:2379", "--local-gate"]);
    assert!(String::from_utf8_lossy(&url.stderr).contains("HOST:PORT"), "{url:?}");
}

#[test]
fn the_nginx_config_declares_the_filters_shm_and_a_portable_configuration_that_fences_under_strict() {
    let conf = golden("nginx-config-default.conf", &["--upstream", "127.0.0.1:8080", "--filter", FILTER]);
    assert!(conf.contains("shm_kv fencekeeper 16m;"));
    let mut proxy = strict_proxy(&plugin_json(&conf));
    assert!(proxy.alive(0) && proxy.alive(1), "{:?}", proxy.violations());
    let new = proxy.send(0, Request::put("/r").token("34"));
    proxy.respond(new, 201);
    let stale = proxy.send(1, Request::put("/r").token("33"));
    let State::Answered(answer) = proxy.state(stale) else { panic!("{:?}", proxy.state(stale)) };
    assert_eq!((answer.status, answer.header("fencing-highest")), (409, Some("34")));
    assert!(proxy.violations().is_empty(), "{:?}", proxy.violations());
}

#[test]
fn the_kong_settings_name_the_filter_and_carry_the_same_configuration() {
    let conf = golden("nginx-config-kong.txt", &["--upstream", "127.0.0.1:8080", "--filter", FILTER, "--kong"]);
    assert!(conf.contains("wasm_filters_path = /opt/fencekeeper\n"));
    assert!(conf.contains("nginx_wasm_shm_kv_fencekeeper = 16m\n"));
    let chain = conf.lines().last().unwrap().trim_start_matches("# ");
    let chain: serde_json::Value = serde_json::from_str(chain).unwrap();
    assert_eq!(chain["filters"][0]["name"], "fencekeeper_filter");
    let proxy = strict_proxy(chain["filters"][0]["config"].as_str().unwrap());
    assert!(proxy.alive(0), "{:?}", proxy.violations());
}

#[test]
fn options_reach_the_plugin_configuration_and_bad_sizes_are_refused() {
    let out = generate(&[
        "--upstream",
        "store:80",
        "--filter",
        FILTER,
        "--strict",
        "--store-apply-bound",
        "30s",
        "--resource-header",
        "x-resource",
    ]);
    let conf = String::from_utf8(out.stdout).unwrap();
    let json: serde_json::Value = serde_json::from_str(&plugin_json(&conf)).unwrap();
    assert_eq!(json["host"], "portable");
    assert_eq!(json["strict"], true);
    assert_eq!(json["gate"]["apply_bound_ms"], 30000);
    assert_eq!(json["resource"]["header"], "x-resource");
    let bad = generate(&["--upstream", "store:80", "--filter", FILTER, "--shm-kv-size", "lots"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--shm-kv-size"));
}
