//! The gateway over a damaged mark: a record that fails its check is a store error,
//! never a lower mark. In correctness mode the write gets 503 and the upstream never
//! sees it; efficiency mode lets it pass as for an unreachable store, counted. Other
//! resources keep working. The same for a value damaged in etcd by another writer.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::{FileStore, Guard, NativeDecider, Policy, Token};
use fencekeeper_core::record;
use fencekeeper_harness::gateway::{request, Gateway, RecordingUpstream};
use fencekeeper_harness::services::{Etcd, WorkDir};
use redb::ReadableTable;
use std::path::Path;
use std::sync::Arc;

/// A store with mark 50 on "/a", whose record is then damaged to read "fk2 40 ..."
/// (through redb, so the file's pages stay valid and only the record is wrong).
fn damaged_store(path: &Path) {
    let g = Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(FileStore::open(path).unwrap()));
    assert!(g.admit("/a", Some("50")).admitted());
    drop(g);
    let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("fencekeeper_marks_v2");
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(def).unwrap();
        let mut value = table.get(&b"/a"[..]).unwrap().unwrap().value().to_vec();
        value[4] ^= 0x01;
        table.insert(&b"/a"[..], value.as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

#[test]
fn a_damaged_record_in_the_file_store_is_503_in_correctness_mode_and_fails_open_in_efficiency_mode() {
    let upstream = RecordingUpstream::start().unwrap();
    let dir = WorkDir::temporary().unwrap();
    let store = dir.path().join("marks.redb");
    damaged_store(&store);
    let mut gateway = Gateway::start_in(dir, store.clone(), &upstream.url(), &[]).unwrap();
    let refused = gateway.put("/a", Some("49"), b"stale").unwrap();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.body.contains("damaged") && refused.body.contains("\"/a\""), "{}", refused.body);
    assert!(gateway.mark("/a").is_err(), "the admin lookup does not show a damaged mark as a mark");
    let other = gateway.put("/b", Some("1"), b"fine").unwrap();
    assert!(matches!(other.status, 200..=204), "{}", other.body);
    gateway.kill();

    let dir = WorkDir::temporary().unwrap();
    let mut efficiency = Gateway::start_in(dir, store, &upstream.url(), &["--mode", "efficiency"]).unwrap();
    // A client's own admitted-token header does not ride along on a write passed
    // without a decision: nothing was admitted (the gateway once forwarded it).
    let headers = [("fencing-token", "49"), ("fencing-admitted-token", "999")];
    let passed = request(&efficiency.url(), "PUT", "/a", &headers, b"passes, counted").unwrap();
    assert!(matches!(passed.status, 200..=204), "{}", passed.body);
    assert_eq!(efficiency.metric("fencekeeper_gateway_failed_open_total").unwrap(), 1);
    let last = upstream.applied().pop().unwrap();
    assert_eq!((last.path.as_str(), last.token.as_str()), ("/a", ""), "failed open with the client's admitted token");
    efficiency.kill();
}

#[test]
fn a_value_damaged_in_etcd_is_503_through_the_gateway() {
    let etcd = Etcd::start().unwrap();
    let upstream = RecordingUpstream::start().unwrap();
    let gateway = Gateway::start(&upstream.url(), &["--etcd", &etcd.url()]).unwrap();
    assert!(matches!(gateway.put("/a", Some("50"), b"50").unwrap().status, 200..=204));
    let fifty = record::encode(b"/a", &Token::parse("50").unwrap());
    let damaged = fifty.as_str().replacen("fk2 50", "fk2 40", 1);
    let out = std::process::Command::new("etcdctl")
        .args(["--endpoints", &etcd.url(), "put", "/fencekeeper/marks//a", &damaged])
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let refused = gateway.put("/a", Some("49"), b"stale").unwrap();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.body.contains("damaged"), "{}", refused.body);
}
