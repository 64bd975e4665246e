//! The etcd mark store against a real etcd: compare-and-swap semantics, the shared
//! key scheme (checked with etcdctl, as any other client of the etcd would see it),
//! and concurrent guards on one resource ending at the highest admitted token.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::store::EtcdStore;
use fencekeeper::{Guard, MarkStore, NativeDecider, Policy, Swap, Token};
use fencekeeper_harness::services::Etcd;
use std::sync::Arc;
use std::time::Duration;

fn t(s: &str) -> Token {
    Token::parse(s).unwrap()
}

#[test]
fn compare_and_swap_creates_raises_and_reports_the_current_mark_on_conflict() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    assert_eq!(store.get("a").unwrap(), None);
    assert_eq!(store.compare_and_swap("a", None, &t("5")).unwrap(), Swap::Swapped);
    assert_eq!(store.compare_and_swap("a", None, &t("6")).unwrap(), Swap::Conflict(Some(t("5"))));
    assert_eq!(store.compare_and_swap("a", Some(&t("4")), &t("6")).unwrap(), Swap::Conflict(Some(t("5"))));
    assert_eq!(store.compare_and_swap("a", Some(&t("5")), &t("7.0")).unwrap(), Swap::Swapped);
    assert_eq!(store.get("a").unwrap(), Some(t("7.0")));
    assert_eq!(store.compare_and_swap("b/c", None, &t("0009")).unwrap(), Swap::Swapped);
    let other = EtcdStore::with_options(&etcd.url(), "/elsewhere/", Duration::from_secs(2)).unwrap();
    assert_eq!(other.compare_and_swap("z", None, &t("1")).unwrap(), Swap::Swapped);
    let listed = store.list().unwrap();
    assert_eq!(listed, vec![("a".to_owned(), t("7.0")), ("b/c".to_owned(), t("9"))], "only this prefix's marks");
}

#[test]
fn marks_live_under_the_shared_key_scheme_as_canonical_text() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    assert_eq!(store.compare_and_swap("/import/a", None, &t("0034")).unwrap(), Swap::Swapped);
    let out = std::process::Command::new("etcdctl")
        .args(["--endpoints", &etcd.url(), "get", "/fencekeeper/marks//import/a", "--print-value-only"])
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "34");
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
    assert_eq!(store.get("r").unwrap(), Some(t("160")));
}
