//! What ships for deployment outside a checkout, checked as an operator's tools check
//! it: the systemd unit of the gateway (`deploy/systemd`), with `systemd-analyze`; the
//! example settings file (`deploy/fencekeeper.toml`), with `fencekeeper check`.

// A test states its expectations by panicking.
#![allow(clippy::panic, clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_fencekeeper");

/// The shipped unit, pointed at this build's binary and a settings file that exists
/// (`verify` checks both), in `dir`.
fn unit_in(dir: &Path) -> std::path::PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd/fencekeeper-gateway.service");
    let text = std::fs::read_to_string(shipped).unwrap();
    assert!(text.contains("ExecStart=/usr/local/bin/fencekeeper serve\n"), "{text}");
    let env = dir.join("gateway.env");
    std::fs::write(&env, "FENCEKEEPER_UPSTREAM=127.0.0.1:8000\n").unwrap();
    let text = text
        .replace("/usr/local/bin/fencekeeper", BIN)
        .replace("EnvironmentFile=/etc/fencekeeper/gateway.env", &format!("EnvironmentFile={}", env.display()));
    let unit = dir.join("fencekeeper-gateway.service");
    std::fs::write(&unit, text).unwrap();
    unit
}

#[test]
fn the_gateways_systemd_unit_verifies_and_exposes_little() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_in(dir.path());
    // The man page is the operator's to install (`fencekeeper man --dir`).
    let verify = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&unit).output().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));
    let security = Command::new("systemd-analyze").args(["security", "--offline=true"]).arg(&unit).output().unwrap();
    let report = String::from_utf8_lossy(&security.stdout);
    let level = report
        .lines()
        .find_map(|l| l.split("Overall exposure level for fencekeeper-gateway.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no exposure level: {report}"));
    // systemd rates 0 (nothing exposed) to 10; below 2 is "OK".
    assert!(level < 2.0, "exposure {level}:\n{report}");
}

#[test]
fn the_shipped_settings_file_is_usable_by_every_command_that_reads_one() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fencekeeper.toml");
    let out = Command::new(BIN).arg("check").arg(&file).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    for command in ["serve", "envoy-config", "nginx-config"] {
        assert!(said.contains(&format!("{command}: usable: ")), "{said}");
    }
}
