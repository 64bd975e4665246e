//! Retention with real etcd revisions: tokens from `fencekeeper lock --etcd` (the
//! revision etcd gave each acquisition), marks in a real etcd shared by a gateway and
//! an Envoy, and `fencekeeper marks --compact` forgetting them under a floor. Whoever
//! admits next (the gateway, whose copy still holds the forgotten mark; Envoy, whose
//! shared data holds it too; another store that never read the floor) holds a resource
//! without a mark to the floor: a token below it is refused, naming retention; the
//! lock's next holder is admitted.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::store::{EtcdStore, Retention};
use fencekeeper::{Guard, MarkStore, NativeDecider, Policy, Swap};
use fencekeeper_core::token;
use fencekeeper_harness::envoy::Envoy;
use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::holder::fencekeeper_lock;
use fencekeeper_harness::services::{poll_until, Etcd, NginxDav};
use fencekeeper_harness::workspace_bin;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// A token of lock `name`: the revision at which `fencekeeper lock --etcd` saw itself
/// holding it, as the command it runs receives it (the lock is released after).
fn lock_token(etcd: &Etcd, name: &str) -> String {
    let url = etcd.client.to_string();
    let args = ["--etcd", &url, "--ttl", "2", "--on-loss", "none", name];
    let out = fencekeeper_lock(&args, &["sh".into(), "-c".into(), "printf %s \"$FENCING_TOKEN\"".into()])
        .unwrap()
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `fencekeeper marks --etcd URL ARGS...`: (exit code, stdout, stderr).
fn marks(etcd: &Etcd, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(workspace_bin("fencekeeper").unwrap())
        .args(["marks", "--etcd", &etcd.url()])
        .args(args)
        .output()
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
}

fn etcd_get(etcd: &Etcd, key: &str) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.client.to_string(), "get", "--print-value-only", key])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn forgotten_marks_hold_every_host_to_the_floor_with_real_lock_revisions() {
    let (etcd, nginx) = (Etcd::start().unwrap(), NginxDav::start().unwrap());
    let envoy = Envoy::start(
        1,
        &["--upstream", &nginx.addr.to_string(), "--etcd", &etcd.client.to_string(), "--provenance", "off"],
    )
    .unwrap();
    let gateway = Gateway::start(&format!("http://{}", nginx.addr), &["--etcd", &etcd.url()]).unwrap();

    // Two locks, two holders; the second lock's token is the later revision.
    let (a1, b1) = (lock_token(&etcd, "locks/a"), lock_token(&etcd, "locks/b"));
    assert!(a1.parse::<u64>().unwrap() < b1.parse::<u64>().unwrap(), "{a1} {b1}");
    let put = gateway.put("/r/a", Some(&a1), b"a by its first holder").unwrap();
    assert!(matches!(put.status, 201 | 204), "{}", put.body);
    let put = envoy.put("/r/b", &b1, b"b by its first holder").unwrap();
    assert!(matches!(put.status, 201 | 204), "{}", put.text());

    let audit = tempfile::NamedTempFile::new().unwrap();
    let (code, out, err) =
        marks(&etcd, &["--compact", "--idle-for", "0s", "--json", "--audit", audit.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["forgotten"].as_array().unwrap().len(), 2, "{out}");
    assert_eq!(report["floor"].as_str(), Some(b1.as_str()), "the highest forgotten mark");
    assert!(err.contains("forgot 2 marks"), "{err}");
    assert_eq!(etcd_get(&etcd, "/fencekeeper/marks//r/a"), "", "the mark is gone from etcd");
    assert!(etcd_get(&etcd, "/fencekeeper/marks/").starts_with(&format!("fk2 {b1} ")), "the floor, at the prefix");
    let (code, listed, _) = marks(&etcd, &["--json"]);
    assert_eq!((code, listed.trim()), (0, "[]"), "the floor is no resource's mark");
    let logged = std::fs::read_to_string(audit.path()).unwrap();
    assert!(logged.contains(r#""reason":"floor""#) && logged.matches(r#""reason":"forget""#).count() == 2, "{logged}");
    let (code, out, _) = marks(&etcd, &["/r/a"]);
    assert_eq!(code, 1, "no mark of its own");
    assert!(out.contains(&format!("held to the retention floor {b1}")), "{out}");

    // The first holder of /r/a comes back: its mark is forgotten, and its token lies
    // below the floor. The gateway still has its mark in its copy; refused all the same.
    let stale = gateway.put("/r/a", Some(&a1), b"a late").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some(b1.as_str())), "{}", stale.body);
    assert!(stale.body.contains("retention floor"), "{}", stale.body);
    let stale = envoy.put("/r/a", &a1, b"a late through envoy").unwrap();
    assert_eq!(stale.status, 409, "{}", stale.text());
    assert!(stale.text().contains("retention floor"), "{}", stale.text());
    // Envoy's shared data held /r/b's mark: the holder at the floor itself is admitted.
    let again = envoy.put("/r/b", &b1, b"b again").unwrap();
    assert!(matches!(again.status, 201 | 204), "{}", again.text());
    // A resource nobody wrote is held to the floor too.
    let new = gateway.put("/r/c", Some(&a1), b"c").unwrap();
    assert_eq!(new.status, 409, "{}", new.body);
    assert_eq!(nginx.read("/r/a").as_deref(), Some(&b"a by its first holder"[..]));

    // The lock's next holder is admitted and gives /r/a its own mark again.
    let a2 = lock_token(&etcd, "locks/a");
    let put = envoy.put("/r/a", &a2, b"a by its next holder").unwrap();
    assert!(matches!(put.status, 201 | 204), "{}", put.text());
    assert_eq!(gateway.mark("/r/a").unwrap().as_deref(), Some(a2.as_str()));
    let stale = gateway.put("/r/a", Some(&b1), b"below the new mark").unwrap();
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert!(!stale.body.contains("retention"), "an ordinary stale token now: {}", stale.body);
}

/// A store that never read the floor (a second gateway, started before the
/// compaction) cannot give a resource a first mark below it: its create compares
/// the floor etcd holds, and reads it back when it moved.
#[test]
fn a_store_with_an_old_floor_cannot_create_a_mark_below_the_new_one() {
    let etcd = Etcd::start().unwrap();
    let (one, two) = (EtcdStore::connect(&etcd.url()).unwrap(), Arc::new(EtcdStore::connect(&etcd.url()).unwrap()));
    assert_eq!(one.compare_and_swap("x", None, &token!("40")).unwrap(), Swap::Swapped);
    let c = one.compact(Duration::ZERO, 1000).unwrap();
    assert_eq!((c.forgotten.len(), c.floor), (1, Some(token!("40"))));
    assert_eq!(two.floor().unwrap(), None, "two has not read it yet");
    assert_eq!(two.compare_and_swap("y", None, &token!("12")).unwrap(), Swap::Conflict(None));
    assert_eq!(two.floor().unwrap(), Some(token!("40")), "read back by the failed create");
    assert_eq!(two.get("y").unwrap(), None);
    let guard = Guard::new(
        Arc::new(NativeDecider(Policy { mode: fencekeeper::Mode::Correctness, strict: false })),
        two.clone(),
    );
    let refused = guard.admit("x", Some("39"));
    assert!(!refused.admitted() && refused.reason("x").contains("retention floor 40"), "{}", refused.reason("x"));
    assert!(guard.admit("x", Some("41")).admitted());
}

/// Idle means unchanged since a compaction at least the idle time ago: the first
/// compaction only records etcd's revision, and a mark that rose after it is kept.
#[test]
fn only_marks_unchanged_since_a_checkpoint_old_enough_are_forgotten() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    store.compare_and_swap("old", None, &token!("10")).unwrap();
    store.compare_and_swap("busy", None, &token!("11")).unwrap();
    let first = store.compact(Duration::from_secs(3600), 1_000_000).unwrap();
    assert!(first.forgotten.is_empty() && first.not_yet.is_some(), "{first:?}");
    assert_eq!(first.kept, 2);
    store.compare_and_swap("busy", Some(&token!("11")), &token!("12")).unwrap();
    let early = store.compact(Duration::from_secs(3600), 1_000_000 + 1800).unwrap();
    assert!(early.forgotten.is_empty() && early.not_yet.is_some(), "not an hour yet: {early:?}");
    let later = store.compact(Duration::from_secs(3600), 1_000_000 + 3600).unwrap();
    assert_eq!(later.forgotten, vec![("old".to_owned(), token!("10"))]);
    assert_eq!((later.kept, later.floor), (1, Some(token!("10"))));
    assert_eq!(store.get("busy").unwrap(), Some(token!("12")));
    // A damaged checkpoints record stops a compaction before it forgets anything.
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.client.to_string(), "put", "/fencekeeper/marks.retention", "fkr1 1:1 00000000"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = store.compact(Duration::ZERO, 1_000_000 + 7200).unwrap_err().to_string();
    assert!(err.contains("retention checkpoints") && err.contains("damaged"), "{err}");
    assert_eq!(store.get("busy").unwrap(), Some(token!("12")), "nothing forgotten");
}

/// The gateway's periodic form on its own file store, which `marks --compact` cannot
/// open while the gateway holds it: the compaction forgets the idle marks under a
/// floor, audited, and the gateway holds a resource without a mark to it.
#[test]
fn a_gateway_compacts_its_file_store_on_a_period_and_holds_writes_to_the_floor() {
    let nginx = NginxDav::start().unwrap();
    let audit = tempfile::NamedTempFile::new().unwrap();
    let gateway = Gateway::start(
        &format!("http://{}", nginx.addr),
        &["--compact-idle-for", "0s", "--compact-every", "100ms", "--audit", audit.path().to_str().unwrap()],
    )
    .unwrap();
    for (path, token) in [("/f/a", "30"), ("/f/b", "41")] {
        let put = gateway.put(path, Some(token), token.as_bytes()).unwrap();
        assert!(matches!(put.status, 201 | 204), "{}", put.body);
    }
    poll_until("the gateway forgets both marks", Duration::from_secs(20), || {
        gateway.mark("/f/a").unwrap().is_none() && gateway.mark("/f/b").unwrap().is_none()
    })
    .unwrap();
    let stale = gateway.put("/f/a", Some("31"), b"31").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("41")), "{}", stale.body);
    assert!(stale.body.contains("retention floor 41"), "{}", stale.body);
    let put = gateway.put("/f/new", Some("42"), b"42").unwrap();
    assert!(matches!(put.status, 201 | 204), "{}", put.body);
    assert_eq!(nginx.read("/f/a").as_deref(), Some(&b"30"[..]));
    let logged = std::fs::read_to_string(audit.path()).unwrap();
    assert!(logged.contains(r#""reason":"forget""#) && logged.contains(r#""host":"gateway""#), "{logged}");
    assert!(logged.contains(r#""reason":"floor""#) && logged.contains(r#""new":"41""#), "{logged}");
    assert!(gateway.log().contains("forgot "), "{}", gateway.log());
    assert!(gateway.metric("fencekeeper_gateway_compactions_total").unwrap() >= 1);
    assert!(gateway.metric("fencekeeper_gateway_marks_forgotten_total").unwrap() >= 2);
    assert_eq!(gateway.metric("fencekeeper_gateway_compaction_failures_total").unwrap(), 0);
    // The admin lookup of a forgotten mark names the floor it is held to (41, or 42
    // once a later run forgot /f/new too).
    let (status, body) =
        fencekeeper_harness::services::http(gateway.admin, "GET", "/fencekeeper/marks//f/b", &[], b"").unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("held to the retention floor 41 ") || body.contains("held to the retention floor 42 "),
        "{body}"
    );
}
