//! The paused holder, with the check inside Redis: two workers hold a Redis lock
//! through `fencekeeper lock --redis` (a real redis-server as the lock service) and
//! write to another real redis-server that loads the module, with `FENCE.SET` and
//! the lock's token. A is frozen with SIGSTOP past its key's TTL, B takes the lock
//! and writes, A is resumed and writes with its old token: refused (`STALE`), and
//! the store keeps B's value. The control: the same story with plain `SET`s, where
//! A's late write lands over B's.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::holder::{fencekeeper_lock, pause_past_lease, worker};
use fencekeeper_harness::redis::Redis;
use fencekeeper_harness::resp::Reply;
use std::process::Command;
use std::time::Duration;

/// B could not acquire before A's key, 2 s renewed every 2/3 s, had expired.
const B_WAITS: Duration = Duration::from_secs(1);

/// `fencekeeper lock --redis LOCK ... -- fencekeeper-lock-worker --target redis://STORE WHO`.
fn holder(lock: &Redis, store: &Redis, resource: &str, who: &str, plain: bool) -> Command {
    let address = lock.address();
    let args = ["--redis", &address, "--ttl", "2", "--on-loss", "none", "--resource", resource, "orders"];
    let extra: &[&str] = if plain { &["--plain"] } else { &[] };
    fencekeeper_lock(&args, &worker(&format!("redis://{}", store.address()), who, extra).unwrap()).unwrap()
}

/// The lock service, and the store with the module.
fn stage() -> (Redis, Redis) {
    (Redis::start().unwrap(), Redis::with_module(&[], &["--save", "", "--appendonly", "no"]).unwrap())
}

#[test]
fn a_holder_paused_past_its_lease_is_refused_by_the_module_and_the_store_keeps_the_new_value() {
    let (lock, store) = stage();
    let resource = "/orders/2026-11.csv";
    let a = holder(&lock, &store, resource, "A", false);
    let b = holder(&lock, &store, resource, "B", false);
    let mut story = pause_past_lease(a, b).unwrap();
    story.check_fenced(B_WAITS).unwrap();
    let (status, exit) = story.b.finish().unwrap();
    assert_eq!(status, 204, "B's second write");
    assert!(exit.success(), "{}", story.b.stderr());

    let mut c = store.client().unwrap();
    let kept = c.cmd(&["GET", resource]).unwrap().text().unwrap();
    assert_eq!(kept, format!("B wrote its second write with token {}\n", story.b.token));
    let mark = c.cmd(&["FENCE.MARK", &format!("fence:{resource}")]).unwrap().text().unwrap();
    assert_eq!(mark, story.b.token);
}

#[test]
fn without_the_module_the_paused_holders_late_write_lands_over_the_new_one() {
    let (lock, store) = stage();
    let resource = "/orders/control.csv";
    let a = holder(&lock, &store, resource, "A", true);
    let b = holder(&lock, &store, resource, "B", true);
    let story = pause_past_lease(a, b).unwrap();
    assert_eq!((story.a_first, story.b_first, story.a_late), (204, 204, 204));
    let mut c = store.client().unwrap();
    let kept = c.cmd(&["GET", resource]).unwrap().text().unwrap();
    assert_eq!(kept, format!("A wrote its second write with token {}\n", story.a.token), "A overwrote B");
    assert_eq!(c.cmd(&["EXISTS", &format!("fence:{resource}")]).unwrap(), Reply::Integer(0));
}
