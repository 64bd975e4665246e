//! The lock-and-pause scenario end to end, as `fencekeeper-demo` runs it: real etcd as
//! the lock service (lease lock, token = the lock key's revision), real nginx WebDAV as
//! the store, the real gateway, two worker processes; worker 1 is paused with SIGSTOP
//! past its lease and resumed with SIGCONT. The test reads the store's files itself.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::workspace_bin;
use serde_json::Value;
use std::process::Command;

#[test]
fn paused_holder_writes_land_without_fencing_and_none_land_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(workspace_bin("fencekeeper-demo").unwrap())
        .args(["--json", "--records", "12", "--pause-after", "4", "--work-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed ({}):\n{stderr}", out.status);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (without, with) = (&result["without_fencing"], &result["with_gateway"]);
    let n = |run: &Value, key: &str| run[key].as_u64().unwrap_or_else(|| panic!("{key} missing in {run}"));

    // Without fencing the window is real: each write the paused holder sends after it
    // resumes lands over the new holder's record. (8 of them, or 7 when the pause caught
    // a write in flight: that one went out with a valid lease and is not counted.)
    assert!(n(without, "stale_accepted") >= 7, "{result}");
    assert_eq!(n(without, "stale_landed"), n(without, "stale_accepted"), "{result}");
    // Through the gateway none land, and the gateway counted every refusal.
    assert!(n(with, "token_2") > n(with, "token_1"), "{result}");
    assert_eq!(n(with, "stale_accepted"), 0, "{result}");
    assert_eq!(n(with, "stale_landed"), 0, "{result}");
    assert!(n(with, "stale_refused") >= 7, "{result}");
    assert_eq!(n(with, "gateway_refusals"), n(with, "stale_refused"), "{result}");

    // The store's own files agree: every fenced record holds worker 2's import.
    let token_2 = n(with, "token_2").to_string();
    for i in 0..12 {
        let file = dir.path().join(format!("data/fenced/record-{i:03}"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(text.contains("worker-2") && text.trim_end().ends_with(&token_2), "{}: {text}", file.display());
    }
}
