//! Provenance through a real Envoy (the filter's etcd check, configured by
//! `fencekeeper envoy-config`), with tokens from the real `etcdctl lock` and a forged
//! one: `fencing-token: 18446744073709551615`. With the check (weak, the generated
//! default; strong with a lock prefix) the forged token is refused 403 and counted;
//! without it, the same token locks the resource's honest holders out. Every mark the
//! filter raises is an audit record in Envoy's log.

#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::{assert_admitted, store_and_etcd, Envoy, Reply};
use fencekeeper_harness::etcdctl_lock::EtcdctlLock;
use fencekeeper_harness::services::{Etcd, NginxDav};
use std::time::{Duration, Instant};

const MAX: &str = "18446744073709551615";
const UNVERIFIED: &str = "wasmcustom.fencekeeper.unverified";

fn envoy(nginx: &NginxDav, etcd: &Etcd, extra: &[&str]) -> Envoy {
    let (upstream, etcd) = (nginx.addr.to_string(), etcd.client.to_string());
    Envoy::start(1, &[&["--upstream", &upstream, "--etcd", &etcd][..], extra].concat()).unwrap()
}

fn assert_unverified(r: &Reply) {
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().starts_with("unverified fencing token for"), "{}", r.text());
    assert_eq!(r.header("fencing-highest"), None);
}

#[test]
fn a_forged_maximum_token_is_refused_with_the_generated_weak_check_and_the_holder_writes_on() {
    let (nginx, etcd) = store_and_etcd(&[]).unwrap();
    let envoy = envoy(&nginx, &etcd, &[]);
    let mut holder = EtcdctlLock::take(&etcd.url(), "report").unwrap();
    assert_admitted(&envoy.put("/report.txt", &holder.token, "from the holder").unwrap());
    let forged = envoy.put("/report.txt", MAX, "forged").unwrap();
    assert_unverified(&forged);
    assert!(forged.text().contains("above the cluster's revision"), "{}", forged.text());
    let grpc = [("content-type", "application/grpc"), ("fencing-token", MAX)];
    let denied = envoy.send("POST", "/report.txt", &grpc, b"").unwrap();
    assert_eq!(denied.header("grpc-status"), Some("7"), "PERMISSION_DENIED");
    assert_eq!(envoy.stat(UNVERIFIED).unwrap(), 2);
    assert!(envoy.log().contains("fencekeeper: refused a token from 127.0.0.1:"), "logged with the client's address");
    // The mark did not move: the holder writes again, the next holder after it.
    assert_admitted(&envoy.put("/report.txt", &holder.token, "the holder again").unwrap());
    holder.release().unwrap();
    let next = EtcdctlLock::take(&etcd.url(), "report").unwrap();
    assert_admitted(&envoy.put("/report.txt", &next.token, "the next holder").unwrap());
    assert_eq!(nginx.read("/report.txt").as_deref(), Some(&b"the next holder"[..]));
}

#[test]
fn without_the_check_the_same_forged_token_locks_every_honest_holder_out() {
    let (nginx, etcd) = store_and_etcd(&[]).unwrap();
    let envoy = envoy(&nginx, &etcd, &["--provenance", "off"]);
    let mut holder = EtcdctlLock::take(&etcd.url(), "report").unwrap();
    assert_admitted(&envoy.put("/report.txt", &holder.token, "from the holder").unwrap());
    assert_admitted(&envoy.put("/report.txt", MAX, "forged").unwrap());
    holder.release().unwrap();
    let next = EtcdctlLock::take(&etcd.url(), "report").unwrap();
    let locked_out = envoy.put("/report.txt", &next.token, "the next holder").unwrap();
    assert_eq!((locked_out.status, locked_out.header("fencing-highest")), (409, Some(MAX)), "{}", locked_out.text());
    assert_eq!(nginx.read("/report.txt").as_deref(), Some(&b"forged"[..]));
}

#[test]
fn the_strong_check_admits_only_the_current_holder_of_the_resources_lock() {
    let (nginx, etcd) = store_and_etcd(&[]).unwrap();
    let envoy = envoy(&nginx, &etcd, &["--provenance", "strong", "--lock-prefix", "/locks"]);
    let mut first = EtcdctlLock::take(&etcd.url(), "/locks/a.txt").unwrap();
    let a = first.token.clone();
    assert_unverified(&envoy.put("/b.txt", &a, "not b's holder").unwrap());
    first.release().unwrap();
    let second = EtcdctlLock::take(&etcd.url(), "/locks/a.txt").unwrap();
    // The first holder never wrote, and wakes up now: its token is above the mark
    // (there is none) and below the current revision, yet not the holder's.
    let late = envoy.put("/a.txt", &a, "the first holder, late").unwrap();
    assert_unverified(&late);
    assert!(late.text().contains("belongs to an earlier holder"), "{}", late.text());
    assert_admitted(&envoy.put("/a.txt", &second.token, "the holder").unwrap());
    assert_unverified(&envoy.put("/a.txt", MAX, "forged").unwrap());
    assert_eq!(nginx.read("/a.txt").as_deref(), Some(&b"the holder"[..]));
}

#[test]
fn every_mark_the_filter_raises_is_an_audit_record_in_envoys_log() {
    let (nginx, etcd) = store_and_etcd(&[]).unwrap();
    let envoy = envoy(&nginx, &etcd, &[]);
    let mut first = EtcdctlLock::take(&etcd.url(), "audited").unwrap();
    let one = first.token.clone();
    assert_admitted(&envoy.put("/audited", &one, "one").unwrap());
    assert_admitted(&envoy.put("/audited", &one, "one again: no change, no record").unwrap());
    first.release().unwrap();
    let second = EtcdctlLock::take(&etcd.url(), "audited").unwrap();
    let padded = format!("00{}", second.token);
    assert_admitted(&envoy.put("/audited", &padded, "two").unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    let records = loop {
        let records: Vec<serde_json::Value> = envoy
            .log()
            .lines()
            .filter_map(|l| l.split_once(fencekeeper_core::audit::LOG_PREFIX))
            .map(|(_, json)| serde_json::from_str(json).unwrap())
            .collect();
        if records.len() >= 2 || Instant::now() > deadline {
            break records;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(records.len(), 2, "one record per raised mark: {records:?}");
    let changes: Vec<String> =
        records.iter().map(|r| ["old", "new", "token"].map(|f| r[f].as_str().unwrap_or("-")).join(" ")).collect();
    assert_eq!(changes, [format!("- {one} {one}"), format!("{one} {} {padded}", second.token)]);
    for record in &records {
        assert_eq!(record.as_object().map(|o| o.len()), Some(fencekeeper_core::audit::FIELDS.len()), "{record}");
        assert_eq!((record["host"].as_str(), record["reason"].as_str()), (Some("envoy"), Some("advance")));
        assert_eq!(record["resource"].as_str(), Some("/audited"));
        assert!(record["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{record}");
        assert_eq!(record["store"].as_str(), Some("etcd cluster fencekeeper_etcd prefix /fencekeeper/marks/"));
        assert!(record["time"].as_str().is_some_and(|t| t.ends_with('Z')) && record["unix_ms"].as_u64().is_some());
        assert!(record["user"].is_null() && record["old_damaged"].is_null());
    }
}
