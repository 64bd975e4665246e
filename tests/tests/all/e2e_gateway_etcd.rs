//! The etcd mark store against a real etcd: compare-and-swap semantics, the shared
//! key scheme and record format (checked with etcdctl, as any other client of the
//! etcd would see it), values damaged or left bare by other writers refused, the
//! upgrade and the raise-only repair, and concurrent guards on one resource ending
//! at the highest admitted token.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::store::{EtcdStore, Previous, Raise, Repair};
use fencekeeper::{Class, Guard, MarkStore, NativeDecider, Policy, StoreError, Swap};
use fencekeeper_core::record;
use fencekeeper_core::token;
use fencekeeper_harness::services::Etcd;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn compare_and_swap_creates_raises_and_reports_the_current_mark_on_conflict() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    assert_eq!(store.get("a").unwrap(), None);
    assert_eq!(store.compare_and_swap("a", None, &token!("5")).unwrap(), Swap::Swapped);
    assert_eq!(store.compare_and_swap("a", None, &token!("6")).unwrap(), Swap::Conflict(Some(token!("5"))));
    assert_eq!(
        store.compare_and_swap("a", Some(&token!("4")), &token!("6")).unwrap(),
        Swap::Conflict(Some(token!("5")))
    );
    assert_eq!(store.compare_and_swap("a", Some(&token!("5")), &token!("7")).unwrap(), Swap::Swapped);
    assert_eq!(store.get("a").unwrap(), Some(token!("7")));
    assert_eq!(store.compare_and_swap("b/c", None, &token!("0009")).unwrap(), Swap::Swapped);
    let other = EtcdStore::with_options(&etcd.url(), "/elsewhere/", Duration::from_secs(2)).unwrap();
    assert_eq!(other.compare_and_swap("z", None, &token!("1")).unwrap(), Swap::Swapped);
    let listed = store.list().unwrap();
    assert_eq!(
        listed,
        vec![("a".to_owned(), token!("7")), ("b/c".to_owned(), token!("9"))],
        "only this prefix's marks"
    );
}

/// Run etcdctl against `etcd`, as any other client of the etcd would; its stdout.
fn etcdctl(etcd: &Etcd, args: &[&str]) -> String {
    let out = std::process::Command::new("etcdctl")
        .args(["--endpoints", &etcd.url()])
        .args(args)
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn marks_live_under_the_shared_key_scheme_as_checked_records() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    assert_eq!(store.compare_and_swap("/import/a", None, &token!("0034")).unwrap(), Swap::Swapped);
    let value = etcdctl(&etcd, &["get", "/fencekeeper/marks//import/a", "--print-value-only"]);
    assert_eq!(value, record::encode(b"/import/a", &token!("34")).as_str());
    assert!(value.starts_with("fk2 34 "), "readable with etcdctl: {value}");
}

#[test]
fn a_value_damaged_by_another_writer_is_refused_not_read_as_a_lower_mark() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    assert_eq!(store.compare_and_swap("r", None, &token!("50")).unwrap(), Swap::Swapped);
    let damaged = record::encode(b"r", &token!("50")).as_str().replacen("fk2 50", "fk2 40", 1);
    etcdctl(&etcd, &["put", "/fencekeeper/marks/r", &damaged]);
    let err = store.get("r").unwrap_err();
    assert!(matches!(err, StoreError::Damaged { ref resource, .. } if resource == "r"), "{err:?}");
    assert!(err.to_string().contains("/fencekeeper/marks/r") && !err.to_string().contains('\n'), "{err}");
    let guard = Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(store));
    let d = guard.admit("r", Some("49"));
    assert_eq!(d.class(), Class::Undecided, "{}", d.reason("r"));
    // Nor does a record moved from another resource count here.
    etcdctl(&etcd, &["put", "/fencekeeper/marks/r", record::encode(b"q", &token!("50")).as_str()]);
    assert!(matches!(guard.store().get("r"), Err(StoreError::Damaged { .. })));
}

#[test]
fn a_bare_old_value_is_refused_with_the_upgrade_command_until_upgraded() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    etcdctl(&etcd, &["put", "/fencekeeper/marks/orders/2026.csv", "34"]);
    etcdctl(&etcd, &["put", "/fencekeeper/marks/invoices/7", "7.1042"]);
    let err = store.get("orders/2026.csv").unwrap_err();
    assert!(matches!(err, StoreError::OldFormat { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("fencekeeper marks --etcd {} --upgrade", etcd.url())), "{err}");
    assert!(store.compare_and_swap("orders/2026.csv", None, &token!("35")).is_err(), "not overwritten unread");
    let upgraded = store.upgrade().unwrap();
    assert_eq!(
        upgraded,
        vec![("invoices/7".to_owned(), token!("7.1042")), ("orders/2026.csv".to_owned(), token!("34"))]
    );
    assert_eq!(store.upgrade().unwrap(), vec![], "a second upgrade changes nothing");
    assert_eq!(store.list().unwrap(), upgraded);
}

#[test]
fn scan_and_raise_repair_a_damaged_value_by_raising_only() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    assert_eq!(store.compare_and_swap("a", None, &token!("50")).unwrap(), Swap::Swapped);
    assert_eq!(store.compare_and_swap("b", None, &token!("7")).unwrap(), Swap::Swapped);
    etcdctl(&etcd, &["put", "/fencekeeper/marks/a", "fk2 40 00000000"]);
    let scan = store.scan().unwrap();
    let bad: Vec<&str> = scan.iter().filter(|s| s.mark.is_err()).map(|s| s.resource.as_str()).collect();
    assert_eq!(bad, vec!["a"]);
    assert!(matches!(store.raise("b", &token!("6")).unwrap(), Raise::Refused { .. }));
    assert!(matches!(store.raise("a", &token!("40")).unwrap(), Raise::Refused { .. }), "not below what it shows");
    assert!(matches!(store.raise("a", &token!("60")).unwrap(), Raise::Raised(Previous::Damaged(_))));
    assert_eq!(store.list().unwrap(), vec![("a".to_owned(), token!("60")), ("b".to_owned(), token!("7"))]);
}

#[test]
fn a_forced_set_lowers_or_clears_a_mark_and_another_store_on_the_etcd_follows() {
    let etcd = Etcd::start().unwrap();
    let (ours, theirs) = (EtcdStore::connect(&etcd.url()).unwrap(), EtcdStore::connect(&etcd.url()).unwrap());
    let guard = Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(theirs));
    assert!(guard.admit("r", Some("18446744073709551615")).admitted(), "a forged token raised the mark");
    assert_eq!(guard.admit("r", Some("40")).class(), Class::Stale);
    assert_eq!(ours.force("r", Some(&token!("39"))).unwrap(), Previous::Mark(token!("18446744073709551615")));
    assert_eq!(
        etcdctl(&etcd, &["get", "/fencekeeper/marks/r", "--print-value-only"]),
        record::encode(b"r", &token!("39")).as_str()
    );
    // The other store's copy still says the maximum; it reads etcd before it refuses.
    let honest = guard.admit("r", Some("40"));
    assert!(honest.admitted(), "{}", honest.reason("r"));
    assert_eq!(guard.admit("r", Some("39")).class(), Class::Stale);
    etcdctl(&etcd, &["put", "/fencekeeper/marks/q", "fk2 40 00000000"]);
    assert!(matches!(ours.force("q", None).unwrap(), Previous::Damaged(_)));
    assert_eq!(ours.force("q", None).unwrap(), Previous::None);
    assert_eq!(ours.list().unwrap(), vec![("r".to_owned(), token!("40"))]);
}

#[test]
fn concurrent_guards_on_one_resource_end_at_the_highest_admitted_token() {
    let etcd = Etcd::start().unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|i| {
            let url = etcd.url();
            std::thread::spawn(move || {
                let store = Arc::new(EtcdStore::connect(&url).unwrap());
                let guard = Guard::new(Arc::new(NativeDecider(Policy::default())), store);
                (0..20u64)
                    .map(|k| 1 + k * 8 + i)
                    .filter(|token| guard.admit("r", Some(&token.to_string())).admitted())
                    .max()
                    .unwrap_or(0)
            })
        })
        .collect();
    let highest = threads.into_iter().map(|h| h.join().unwrap()).max().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    assert_eq!(highest, 160);
    assert_eq!(store.get("r").unwrap(), Some(token!("160")));
}

/// The store's Txns go over etcd's gRPC API with the user's token in the call's
/// metadata. When etcd has forgotten the token (`--auth-token-ttl`), the next Txn is
/// refused for it (UNAUTHENTICATED); the store authenticates again and the admit
/// still succeeds, on the mark etcd holds.
#[test]
fn a_store_whose_etcd_token_expired_authenticates_again_and_admits() {
    use fencekeeper::etcd::{EtcdAuth, EtcdOptions};
    use fencekeeper_harness::services::{http, poll_until, WorkDir};
    const USER: &str = "fencekeeper";
    const PASSWORD: &str = "pw-for-the-store";
    let etcd = Etcd::start_with(WorkDir::temporary().unwrap(), &["--auth-token-ttl=1", "--bcrypt-cost=4"]).unwrap();
    etcd.enable_auth(USER, PASSWORD, &["/fencekeeper/marks/"]).unwrap();
    let options =
        EtcdOptions { auth: Some(EtcdAuth { user: USER.into(), password: PASSWORD.into() }), ..EtcdOptions::default() };
    let guard = Guard::new(
        Arc::new(NativeDecider(Policy::default())),
        Arc::new(EtcdStore::connect_with(&etcd.url(), fencekeeper::store::ETCD_DEFAULT_PREFIX, &options).unwrap()),
    );
    assert!(guard.admit("orders", Some("34")).admitted());

    // Wait, by asking etcd, until it has forgotten the store's token: tokens issued
    // after the store's last call expire no earlier than its token, and each probe is
    // asked once (asking renews it).
    let body = format!(r#"{{"name":"{USER}","password":"{PASSWORD}"}}"#);
    let token = || {
        let (_, answer) = http(etcd.client, "POST", "/v3/auth/authenticate", &[], body.as_bytes()).unwrap();
        serde_json::from_slice::<serde_json::Value>(&answer).unwrap()["token"].as_str().unwrap().to_owned()
    };
    let mut probes = (0..40).map(|_| token()).collect::<Vec<_>>().into_iter();
    // {"key": base64("/fencekeeper/marks/x")}
    let read = br#"{"key":"L2ZlbmNla2VlcGVyL21hcmtzL3g="}"#;
    poll_until("etcd forgets a token", Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(150));
        probes.next().is_some_and(|probe| {
            http(etcd.client, "POST", "/v3/kv/range", &[("Authorization", &probe)], read).unwrap().0 == 401
        })
    })
    .unwrap();

    // The holder writes again (a confirm Txn), then a newer holder advances.
    assert!(guard.admit("orders", Some("34")).admitted(), "the store did not authenticate again");
    assert!(guard.admit("orders", Some("35")).admitted());
    assert_eq!(guard.admit("orders", Some("34")).class(), Class::Stale);
}

/// An answer larger than HTTP/2's initial flow-control window (64 KiB) arrives whole:
/// 64 marks under 1000-byte keys, listed in one read of about 70 KB.
#[test]
fn an_answer_larger_than_the_http2_window_is_read_whole() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    let resources: Vec<String> = (0..64).map(|i| format!("{i:02}/{}", "k".repeat(997))).collect();
    for (i, resource) in resources.iter().enumerate() {
        assert_eq!(store.compare_and_swap(resource, None, &token!(&format!("{}", i + 1))).unwrap(), Swap::Swapped);
    }
    let listed = store.list().unwrap();
    assert_eq!(listed.len(), 64);
    for (i, (resource, mark)) in listed.iter().enumerate() {
        assert_eq!((resource, *mark), (&resources[i], token!(&format!("{}", i + 1))));
    }
}

/// Listing every mark reads in pages: 1,100 marks under 1000-byte keys (about 1.2 MB,
/// more than one gRPC answer may hold) are all listed, in order.
#[test]
fn listing_more_marks_than_one_answer_holds_reads_them_in_pages() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    let resources: Vec<String> = (0..1100).map(|i| format!("{i:04}/{}", "k".repeat(995))).collect();
    for resource in &resources {
        assert_eq!(store.compare_and_swap(resource, None, &token!("7")).unwrap(), Swap::Swapped);
    }
    let listed = store.list().unwrap();
    assert_eq!(listed.len(), resources.len());
    assert!(listed.iter().zip(&resources).all(|((r, m), want)| r == want && *m == token!("7")));
}

/// etcd 3.4 counts the whole range of a limited read, so a listing reads windows of
/// keys that share a prefix, narrowed while they hold many keys and widened while few.
/// Whatever the keys' shape (a long shared prefix, short keys, keys that are prefixes
/// of others), every mark is listed once, in order, and a compaction finds them all.
#[test]
fn a_listing_in_windows_reads_every_mark_once_in_order() {
    use fencekeeper::store::Retention;
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    let mut resources: Vec<String> = (0..7000).map(|i| format!("bucket/objects/{i:010}")).collect();
    resources.extend((0..2000).map(|i| format!("b/{i}")));
    resources.extend((0..1500).map(|i| format!("{}", i * 7)));
    resources.extend(["b".to_owned(), "bucket".to_owned(), "\u{7f}".to_owned(), "\u{10ffff}".to_owned()]);
    std::thread::scope(|s| {
        for chunk in resources.chunks(resources.len() / 8 + 1) {
            let store = &store;
            s.spawn(move || {
                for resource in chunk {
                    assert_eq!(store.compare_and_swap(resource, None, &token!("7")).unwrap(), Swap::Swapped);
                }
            });
        }
    });
    resources.sort();
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|(r, _)| r).collect();
    assert_eq!(listed.len(), resources.len());
    assert!(listed == resources, "every mark once, in order");
    let compaction = store.compact(Duration::ZERO, 1_000_000).unwrap();
    assert_eq!(compaction.forgotten.len(), resources.len());
    assert!(store.list().unwrap().is_empty());
}

/// After etcd restarts, the store's HTTP/2 connection is closed; the next call finds
/// it closed before sending anything and opens a new one, so the first admit after
/// the restart succeeds rather than failing once.
#[test]
fn the_first_call_after_an_etcd_restart_succeeds_on_a_new_connection() {
    let mut etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    assert_eq!(store.compare_and_swap("orders", None, &token!("34")).unwrap(), Swap::Swapped);
    etcd.restart().unwrap();
    // The old connection's end is seen by the client's runtime as soon as etcd is
    // gone; a restart takes far longer than that.
    assert_eq!(store.get("orders").unwrap(), Some(token!("34")));
    assert_eq!(store.compare_and_swap("orders", Some(&token!("34")), &token!("35")).unwrap(), Swap::Swapped);
}

#[test]
fn the_etcd_store_keeps_the_mark_store_contract() {
    use fencekeeper::store::contract;
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    contract::check(&store).unwrap();
    contract::check_concurrent(&store, 4, 60).unwrap();
    // A record damaged by another writer reads back as an error.
    contract::check_damaged(&store, |resource| {
        etcdctl(&etcd, &["put", &format!("/fencekeeper/marks/{resource}"), "fk2 3 00000000"]);
    })
    .unwrap();
}
