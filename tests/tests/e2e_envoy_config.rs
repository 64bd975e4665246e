//! Envoy accepts what `fencekeeper envoy-config` prints (`envoy --mode validate`).

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::{envoy_binary, generate, Envoy};
use fencekeeper_harness::services::free_port;
use std::process::Command;

fn validate(args: &[&str]) {
    let yaml = generate(10000, 9901, args).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("envoy.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(envoy_binary())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("OK"), "envoy --mode validate refused {args:?}:\n{text}");
}

#[test]
fn envoy_validates_the_generated_configs() {
    validate(&["--upstream", "127.0.0.1:8080"]);
    validate(&[
        "--upstream",
        "store.internal:80",
        "--etcd",
        "etcd.internal:2379",
        "--strict",
        "--strip-prefix",
        "/data/",
    ]);
    validate(&["--upstream", "127.0.0.1:8080", "--mode", "efficiency", "--no-etcd", "--resource-header", "x-object"]);
}

#[test]
fn envoy_refuses_to_start_on_a_bad_plugin_configuration_and_logs_why() {
    let (listen, admin) = (free_port().unwrap(), free_port().unwrap());
    let yaml = generate(listen, admin, &["--upstream", "127.0.0.1:9", "--mode", "efficiency", "--no-etcd"]).unwrap();
    let bad = yaml.replace(r#""strict":false"#, r#""strict":"yes""#);
    assert_ne!(bad, yaml);
    let err = Envoy::start_with(1, listen, admin, &bad).err().expect("envoy started on a bad configuration");
    let text = format!("{err:#}");
    assert!(text.contains("fencekeeper: bad plugin configuration"), "{text}");
}
