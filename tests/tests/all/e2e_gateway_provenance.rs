//! Provenance and the audit log through the real gateway (`fencekeeper serve`), with a
//! real etcd and tokens from the real `etcdctl lock`: a forged maximum token is
//! refused 403 with `--provenance`, counted and logged with the client's address;
//! without it, the token locks the honest holders out, and `fencekeeper marks --set
//! --force` lowers the mark again while the gateway keeps running (its copy of the
//! mark is then too high, and it reads etcd before it refuses). Every mark the
//! gateway raises, and the forced set, are audit records, parsed back here.

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_core::audit::FIELDS;
use fencekeeper_harness::etcdctl_lock::EtcdctlLock;
use fencekeeper_harness::gateway::{request, start_up_error, Gateway, RecordingUpstream};
use fencekeeper_harness::services::Etcd;
use fencekeeper_harness::workspace_bin;
use std::path::Path;

const MAX: &str = "18446744073709551615";

fn records(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// (reason, old, new, token) of each record, `-` for null.
fn changes(records: &[serde_json::Value]) -> Vec<String> {
    records.iter().map(|r| ["reason", "old", "new", "token"].map(|f| r[f].as_str().unwrap_or("-")).join(" ")).collect()
}

#[test]
fn a_forged_maximum_token_is_refused_with_provenance_and_the_holder_writes_on() {
    let (etcd, upstream) = (Etcd::start().unwrap(), RecordingUpstream::start().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let audit_arg = audit.display().to_string();
    let gateway =
        Gateway::start(&upstream.url(), &["--etcd", &etcd.url(), "--provenance", "weak", "--audit", &audit_arg])
            .unwrap();
    let mut holder = EtcdctlLock::take(&etcd.url(), "orders").unwrap();
    let admitted = gateway.put("/orders.csv", Some(&holder.token), b"from the holder").unwrap();
    assert_eq!(admitted.status, 201, "{}", admitted.body);
    let forged = gateway.put("/orders.csv", Some(MAX), b"forged").unwrap();
    assert_eq!(forged.status, 403, "{}", forged.body);
    assert!(forged.body.starts_with("unverified fencing token for \"/orders.csv\": etcd has not issued token"));
    let grpc = [("content-type", "application/grpc"), ("fencing-token", MAX)];
    let denied = request(&gateway.url(), "POST", "/orders.csv", &grpc, b"").unwrap();
    assert_eq!(denied.header("grpc-status"), Some("7"), "PERMISSION_DENIED");
    assert_eq!(gateway.metric("fencekeeper_gateway_requests_total{class=\"unverified\"}").unwrap(), 2);
    let log = gateway.log();
    let refusal = log.lines().find(|l| l.contains("class=\"unverified\"")).unwrap_or_default();
    assert!(refusal.contains("client=127.0.0.1:"), "logged with the client's address: {log}");
    assert_eq!(gateway.mark("/orders.csv").unwrap().as_deref(), Some(holder.token.as_str()), "the mark stayed");
    holder.release().unwrap();
    let next = EtcdctlLock::take(&etcd.url(), "orders").unwrap();
    assert_eq!(gateway.put("/orders.csv", Some(&next.token), b"the next holder").unwrap().status, 201);
    let applied: Vec<Vec<u8>> = upstream.applied().into_iter().map(|a| a.body).collect();
    assert_eq!(applied, [b"from the holder".to_vec(), b"the next holder".to_vec()]);

    let records = records(&audit);
    assert_eq!(
        changes(&records),
        [format!("advance - {0} {0}", holder.token), format!("advance {} {1} {1}", holder.token, next.token)]
    );
    for record in &records {
        assert_eq!(record.as_object().map(|o| o.len()), Some(FIELDS.len()), "{record}");
        assert_eq!((record["host"].as_str(), record["resource"].as_str()), (Some("gateway"), Some("/orders.csv")));
        assert!(record["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{record}");
        let store = format!("etcd {} prefix /fencekeeper/marks/", etcd.url());
        assert_eq!(record["store"].as_str(), Some(store.as_str()));
        assert!(record["time"].as_str().is_some_and(|t| t.ends_with('Z')) && record["unix_ms"].as_u64().is_some());
        assert!(record["user"].is_null() && record["old_damaged"].is_null());
    }
}

#[test]
fn without_provenance_a_forged_token_locks_holders_out_until_lowered_by_force_while_the_gateway_runs() {
    let (etcd, upstream) = (Etcd::start().unwrap(), RecordingUpstream::start().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let audit_arg = audit.display().to_string();
    let gateway = Gateway::start(&upstream.url(), &["--etcd", &etcd.url(), "--audit", &audit_arg]).unwrap();
    let mut holder = EtcdctlLock::take(&etcd.url(), "orders").unwrap();
    assert_eq!(gateway.put("/orders.csv", Some(&holder.token), b"from the holder").unwrap().status, 201);
    assert_eq!(gateway.put("/orders.csv", Some(MAX), b"forged").unwrap().status, 201, "off: the forgery passes");
    holder.release().unwrap();
    let next = EtcdctlLock::take(&etcd.url(), "orders").unwrap();
    let locked_out = gateway.put("/orders.csv", Some(&next.token), b"the next holder").unwrap();
    assert_eq!((locked_out.status, locked_out.header("fencing-highest")), (409, Some(MAX)), "{}", locked_out.body);

    // The operator lowers the mark back to the last honest token, beside the running gateway.
    let set = std::process::Command::new(workspace_bin("fencekeeper").unwrap())
        .args(["marks", "--etcd", &etcd.url(), "--set", "/orders.csv", &holder.token, "--force", "--audit", &audit_arg])
        .output()
        .unwrap();
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let said = String::from_utf8_lossy(&set.stdout);
    assert!(said.contains(&format!("from {MAX} to {}", holder.token)), "old and new: {said}");
    // The gateway's copy still says the maximum; it reads etcd before refusing.
    let honest = gateway.put("/orders.csv", Some(&next.token), b"the next holder").unwrap();
    assert_eq!(honest.status, 201, "{}", honest.body);
    assert_eq!(gateway.put("/orders.csv", Some(&holder.token), b"stale").unwrap().status, 409);

    let records = records(&audit);
    assert_eq!(
        changes(&records),
        [
            format!("advance - {0} {0}", holder.token),
            format!("advance {} {MAX} {MAX}", holder.token),
            format!("set {MAX} {0} {0}", holder.token),
            format!("advance {} {1} {1}", holder.token, next.token),
        ]
    );
    let hosts: Vec<&str> = records.iter().map(|r| r["host"].as_str().unwrap_or("?")).collect();
    assert_eq!(hosts, ["gateway", "gateway", "cli", "gateway"]);
    assert!(records[2]["client"].is_null(), "{}", records[2]);
}

#[test]
fn strong_provenance_with_marks_in_a_file_admits_only_the_current_holders_token() {
    let (etcd, upstream) = (Etcd::start().unwrap(), RecordingUpstream::start().unwrap());
    let gateway = Gateway::start(
        &upstream.url(),
        &["--lock-etcd", &etcd.url(), "--provenance", "strong", "--lock-prefix", "/locks"],
    )
    .unwrap();
    let mut first = EtcdctlLock::take(&etcd.url(), "/locks/a").unwrap();
    let a = first.token.clone();
    first.release().unwrap();
    let mut second = EtcdctlLock::take(&etcd.url(), "/locks/a").unwrap();
    let late = gateway.put("/a", Some(&a), b"the first holder, late").unwrap();
    assert_eq!(late.status, 403, "{}", late.body);
    assert!(late.body.contains("belongs to an earlier holder"), "{}", late.body);
    assert_eq!(gateway.put("/a", Some(&second.token), b"the holder").unwrap().status, 201);
    assert_eq!(gateway.put("/a", Some(MAX), b"forged").unwrap().status, 403);
    let next = (second.token.parse::<u64>().unwrap() + 1).to_string();
    second.release().unwrap();
    let free = gateway.put("/a", Some(&next), b"nobody holds the lock").unwrap();
    assert_eq!(free.status, 403, "{}", free.body);
    assert!(free.body.contains("nobody holds the lock"), "{}", free.body);
}

#[test]
fn provenance_without_an_etcd_to_ask_is_a_one_line_start_up_error() {
    for (args, needle) in [
        (&["--provenance", "weak"][..], "needs the etcd that issues the tokens: --etcd or --lock-etcd"),
        (&["--provenance", "strong", "--lock-etcd", "127.0.0.1:1"][..], "needs --lock-prefix"),
        (&["--lock-etcd", "127.0.0.1:1"][..], "--lock-etcd goes with --provenance"),
    ] {
        let (code, last, stderr) = start_up_error(args).unwrap();
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(last.starts_with("fencekeeper: ") && last.contains(needle), "{args:?}: {stderr}");
    }
}

/// Safe by default: a gateway with its marks in etcd and no `--provenance` checks
/// weakly, as Envoy does: a lock holder's token (an etcd revision) advances, a forged
/// one above etcd's revision is refused 403 and the mark stays; `--provenance off`
/// takes the check away, as the help says.
#[test]
fn with_marks_in_etcd_the_gateway_checks_provenance_weakly_by_default() {
    let (etcd, upstream) = (Etcd::start().unwrap(), RecordingUpstream::start().unwrap());
    let gateway = Gateway::start_with_default_provenance(&upstream.url(), &["--etcd", &etcd.url()]).unwrap();
    assert!(gateway.log().contains("provenance=etcd ") && gateway.log().contains(" weak"), "{}", gateway.log());
    let holder = EtcdctlLock::take(&etcd.url(), "orders").unwrap();
    assert_eq!(gateway.put("/orders.csv", Some(&holder.token), b"from the holder").unwrap().status, 201);
    let forged = gateway.put("/orders.csv", Some(MAX), b"forged").unwrap();
    assert_eq!(forged.status, 403, "{}", forged.body);
    assert_eq!(gateway.mark("/orders.csv").unwrap().as_deref(), Some(holder.token.as_str()), "the mark stayed");
    let open = Gateway::start_with_default_provenance(&upstream.url(), &["--etcd", &etcd.url(), "--provenance", "off"])
        .unwrap();
    assert_eq!(open.put("/other.csv", Some(MAX), b"unchecked").unwrap().status, 201, "off: not checked");
}
