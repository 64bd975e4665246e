//! Envoy accepts what `fencekeeper envoy-config` prints (`envoy --mode validate`).

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::{envoy_binary, generate, Envoy};
use fencekeeper_harness::services::free_port;
use std::process::Command;

fn validate(args: &[&str]) {
    validate_in_env(args, &[]);
}

/// [`validate`] with `env` in Envoy's environment: validation runs the filter's
/// `on_configure`, which reads the etcd password's variable.
fn validate_in_env(args: &[&str], env: &[(&str, &str)]) {
    let yaml = generate(10000, 9901, args).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("envoy.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(envoy_binary())
        .envs(env.iter().copied())
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
        "--provenance",
        "strong",
        "--lock-prefix",
        "/locks",
    ]);
    validate(&["--upstream", "127.0.0.1:8080", "--mode", "efficiency", "--no-etcd", "--resource-header", "x-object"]);
    validate(&["--upstream", "127.0.0.1:8080", "--etcd", "127.0.0.1:2379,127.0.0.2:2379,etcd-3.internal:2379"]);
    validate(&["--upstream", "127.0.0.1:8080", "--fenced-methods", "PUT,delete,VERSION-CONTROL"]);
    // S3's error documents for Envoy's own answers, and the 413 mapper's CEL filter.
    validate(&[
        "--upstream",
        "127.0.0.1:8080",
        "--protocol",
        "s3",
        "--conditional-writes",
        "--precondition-probe",
        "off",
    ]);
    validate_in_env(
        &["--upstream", "127.0.0.1:8080", "--etcd-user", "fencekeeper", "--etcd-password-env", "FK_ETCD_PASSWORD"],
        &[("FK_ETCD_PASSWORD", "secret")],
    );
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

/// An installed binary is enough: a copy of `fencekeeper` outside the checkout, run
/// from another directory, writes the filter it carries beside the configuration,
/// and Envoy accepts both. (scripts/test.sh also runs `cargo install` and this.)
#[test]
fn an_installed_binary_writes_its_filter_and_envoy_accepts_the_config() {
    let install = tempfile::tempdir().unwrap();
    let bin = install.path().join("fencekeeper");
    // A hard link, not a copy: executing a file this process just wrote can fail with
    // "text file busy" while another test thread forks (the child holds the fd until
    // its exec). A link is never open for writing.
    let built = fencekeeper_harness::workspace_bin("fencekeeper").unwrap();
    if std::fs::hard_link(&built, &bin).is_err() {
        std::fs::copy(&built, &bin).unwrap();
    }
    let elsewhere = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| Command::new(&bin).args(args).current_dir(elsewhere.path()).output().unwrap();
    let lost = run(&["envoy-config", "--upstream", "127.0.0.1:8080"]);
    assert_eq!(lost.status.code(), Some(2), "no checkout here: the filter must be asked for");
    assert!(String::from_utf8_lossy(&lost.stderr).contains("--write-filter"));
    let out = run(&["envoy-config", "--upstream", "127.0.0.1:8080", "--write-filter", "envoy/fencekeeper_filter.wasm"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let written = elsewhere.path().join("envoy/fencekeeper_filter.wasm");
    let committed = fencekeeper_harness::repo_root().join("guest/artifacts/fencekeeper_filter.wasm");
    assert_eq!(std::fs::read(&written).unwrap(), std::fs::read(committed).unwrap());
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(yaml.contains(&written.canonicalize().unwrap().display().to_string()), "{yaml}");
    assert!(!yaml.contains(&fencekeeper_harness::repo_root().display().to_string()), "points into the checkout");
    let file = elsewhere.path().join("envoy/envoy.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let check = Command::new(envoy_binary())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&file)
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout).into_owned() + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success() && text.contains("OK"), "{text}");
}
