//! Provenance against a real etcd, with tokens from the real `etcdctl lock`
//! (`ETCD_LOCK_REV`, the revision at which it saw that it holds the lock): which
//! tokens each check admits. Weak: any revision etcd has reached, nothing above.
//! Strong: only the current holder's, of the lock named prefix + resource.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::provenance::{EtcdCheck, EtcdProvenance};
use fencekeeper::store::EtcdStore;
use fencekeeper::{Class, Guard, MemoryStore, Mode, NativeDecider, Origin, Policy, Provenance};
use fencekeeper_core::token;
use fencekeeper_harness::etcdctl_lock::EtcdctlLock;
use fencekeeper_harness::services::Etcd;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const MAX: &str = "18446744073709551615";

/// A lock held by the real `etcdctl lock` on the etcd at `endpoint`.
fn hold(endpoint: &str, name: &str) -> EtcdctlLock {
    EtcdctlLock::take(endpoint, name).unwrap()
}

/// etcdctl's stdout, as another client of the etcd sees it.
fn etcdctl(etcd: &Etcd, args: &[&str]) -> String {
    let out = Command::new("etcdctl").args(["--endpoints", &etcd.url()]).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn vouches(p: &dyn Provenance, resource: &str, token: &str) -> bool {
    match p.check(resource, &token!(token)).unwrap() {
        Origin::Issued => true,
        Origin::Unverified(why) => {
            assert!(why.contains(&token!(token).to_string()), "the reason names the token: {why}");
            false
        }
    }
}

#[test]
fn weak_admits_every_etcdctl_lock_token_and_nothing_above_the_clusters_revision() {
    let etcd = Etcd::start().unwrap();
    let mut first = hold(&etcd.url(), "/locks/r");
    let a = first.token.clone();
    first.release().unwrap();
    let second = hold(&etcd.url(), "/locks/r");
    let b = second.token.clone();
    assert!(token!(&b) > token!(&a), "etcdctl's tokens grow: {a} then {b}");
    let weak = EtcdProvenance::connect(&etcd.url(), EtcdCheck::Weak, Duration::from_secs(2)).unwrap();
    assert!(vouches(&weak, "r", &a) && vouches(&weak, "r", &b));
    assert!(!vouches(&weak, "r", MAX));
    assert!(!vouches(&weak, "r", "1000000"), "a revision etcd has not reached yet");
    assert!(
        matches!(weak.check("r", &token!("3.1")).unwrap(), Origin::Unverified(why) if why.contains("one component"))
    );
}

#[test]
fn strong_admits_only_the_current_holders_token() {
    let etcd = Etcd::start().unwrap();
    let strong = EtcdProvenance::connect(
        &etcd.url(),
        EtcdCheck::Strong { lock_prefix: "/locks/".into() },
        Duration::from_secs(2),
    )
    .unwrap();
    let mut first = hold(&etcd.url(), "/locks//orders/a.csv");
    // A second client queues behind the first (its key is there, below the holder's
    // in create order), so its token will be above its key's create revision.
    let endpoint = etcd.url();
    let queued = std::thread::spawn(move || hold(&endpoint, "/locks//orders/a.csv"));
    let keys = || etcdctl(&etcd, &["get", "--prefix", "/locks//orders/a.csv/", "--keys-only"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while keys().lines().filter(|l| !l.is_empty()).count() < 2 {
        assert!(std::time::Instant::now() < deadline, "the second etcdctl lock never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(vouches(&strong, "/orders/a.csv", &first.token), "the holder's token");
    assert!(!vouches(&strong, "/orders/b.csv", &first.token), "another resource's lock is not held");
    assert!(!vouches(&strong, "/orders/a.csv", MAX));
    let a = first.token.clone();
    first.release().unwrap();
    let mut second = queued.join().unwrap();
    assert!(vouches(&strong, "/orders/a.csv", &second.token), "the queued holder's token, once it holds");
    let weak = EtcdProvenance::connect(&etcd.url(), EtcdCheck::Weak, Duration::from_secs(2)).unwrap();
    assert!(vouches(&weak, "/orders/a.csv", &a), "weak still admits the earlier holder's token");
    assert!(!vouches(&strong, "/orders/a.csv", &a), "strong does not: it belongs to an earlier holder");
    let b = second.token.clone();
    second.release().unwrap();
    assert!(!vouches(&strong, "/orders/a.csv", &b), "nor a token whose holder has released the lock");
}

#[test]
fn a_guard_with_provenance_on_a_shared_etcd_refuses_a_forged_token_and_admits_the_holders() {
    let etcd = Etcd::start().unwrap();
    let store = EtcdStore::connect(&etcd.url()).unwrap();
    let provenance = Arc::new(EtcdProvenance::sharing(&store, EtcdCheck::Weak));
    let guard = Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(store)).with_provenance(provenance);
    let holder = hold(&etcd.url(), "/locks/r");
    let forged = guard.admit("r", Some(MAX));
    assert_eq!((forged.class(), forged.class().http_status()), (Class::Unverified, 403), "{}", forged.reason("r"));
    let honest = guard.admit("r", Some(&holder.token));
    assert!(honest.admitted() && honest.advance.is_some(), "{}", honest.reason("r"));
    assert_eq!(guard.mark("r").unwrap(), Some(token!(&holder.token)));
    assert!(guard.admit("r", Some(&holder.token)).admitted(), "the holder writing again");
}

#[test]
fn an_unreachable_lock_service_refuses_an_advance_with_503_even_in_efficiency_mode() {
    let mut etcd = Etcd::start().unwrap();
    let strong = EtcdProvenance::connect(
        &etcd.url(),
        EtcdCheck::Strong { lock_prefix: "/locks/".into() },
        Duration::from_secs(2),
    )
    .unwrap();
    etcd.stop();
    // The marks are reachable (memory): only the lock service is down.
    let decider = Arc::new(NativeDecider(Policy { mode: Mode::Efficiency, strict: false }));
    let guard = Guard::new(decider, Arc::new(MemoryStore::new())).with_provenance(Arc::new(strong));
    let d = guard.admit("r", Some("5"));
    assert!(!d.admitted() && !d.action.failed_open(), "{}", d.reason("r"));
    assert_eq!((d.class(), d.class().http_status()), (Class::Undecided, 503));
    assert!(d.reason("r").contains("the lock service cannot check the token: etcd at"), "{}", d.reason("r"));
}
