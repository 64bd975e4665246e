//! Tokens from etcd, end to end: `fencekeeper lock --etcd` and `etcdctl lock` (an
//! independent client, etcd's own `concurrency.Mutex`) take turns on one lock with a
//! real etcd, and write through the real gateway to nginx WebDAV.
//!
//! Both clients hand their command the revision at which they saw themselves holding
//! the lock (`etcdctl`: `ETCD_LOCK_REV`; `fencekeeper lock`: `FENCING_TOKEN`), so the
//! tokens of one lock are comparable whichever client took it. The paused-holder story
//! is told in both directions; a queue of both clients shows why the token is not the
//! lock key's create revision (docs/tokens.md).

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::holder::{fencekeeper_lock, pause_past_lease, stored, token, worker, Holder, ACQUIRE_WITHIN};
use fencekeeper_harness::services::{poll_until, Etcd, NginxDav, Process};
use fencekeeper_harness::workspace_bin;
use std::process::Command;
use std::time::{Duration, Instant};

/// The lease TTL of every client here, seconds (etcd's shortest is about 2).
const TTL: &str = "2";

struct Stage {
    etcd: Etcd,
    nginx: NginxDav,
    gateway: Gateway,
}

fn stage() -> Stage {
    let etcd = Etcd::start().unwrap();
    let nginx = NginxDav::start().unwrap();
    let gateway = Gateway::start(&nginx.url(), &[]).unwrap();
    Stage { etcd, nginx, gateway }
}

/// `etcdctl lock --ttl 2 NAME -- WORKER... --token-from ETCD_LOCK_REV --resource R`.
fn etcdctl_lock(stage: &Stage, name: &str, resource: &str, who: &str) -> Command {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3").args(["--endpoints", &stage.etcd.client.to_string(), "lock", "--ttl", TTL, name, "--"]);
    cmd.args(worker(&stage.gateway.url(), who, &["--token-from", "ETCD_LOCK_REV", "--resource", resource]).unwrap());
    cmd
}

/// `fencekeeper lock --etcd ... --ttl 2 --on-loss none --resource R NAME -- WORKER...`.
fn fencekeeper_etcd_lock(stage: &Stage, name: &str, resource: &str, who: &str) -> Command {
    let etcd = stage.etcd.client.to_string();
    let args = ["--etcd", &etcd, "--ttl", TTL, "--on-loss", "none", "--resource", resource, name];
    fencekeeper_lock(&args, &worker(&stage.gateway.url(), who, &[]).unwrap()).unwrap()
}

/// The keys under the lock's prefix (one per holder or waiter).
fn lock_keys(stage: &Stage, name: &str) -> Vec<String> {
    let out = Command::new("etcdctl")
        .args(["--endpoints", &stage.etcd.client.to_string(), "get", "--prefix", "--keys-only", &format!("{name}/")])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().lines().filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// B could not acquire before A's lease, 2 s renewed every 2/3 s, had run out.
const B_WAITS: Duration = Duration::from_secs(1);

#[test]
fn etcdctl_holder_paused_past_its_lease_is_refused_once_fencekeeper_lock_took_over() {
    let stage = stage();
    let resource = "/orders/etcdctl-paused.csv";
    let a = etcdctl_lock(&stage, "orders", resource, "A");
    let b = fencekeeper_etcd_lock(&stage, "orders", resource, "B");
    let mut story = pause_past_lease(a, b).unwrap();
    story.check_fenced(B_WAITS).unwrap();
    story.finish_b(&stage.nginx, &stage.gateway, resource).unwrap();
}

#[test]
fn fencekeeper_lock_holder_paused_past_its_lease_is_refused_and_exits_75_saying_so() {
    let stage = stage();
    let resource = "/orders/fencekeeper-paused.csv";
    let a = fencekeeper_etcd_lock(&stage, "orders", resource, "A");
    let b = etcdctl_lock(&stage, "orders", resource, "B");
    let mut story = pause_past_lease(a, b).unwrap();
    story.check_fenced(B_WAITS).unwrap();
    assert_eq!(story.a_exit.code(), Some(75), "{}", story.a.stderr());
    let said = story.a.stderr();
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.starts_with(&format!("fencekeeper: lost lock \"orders\" (token {})", story.a.token)), "{said}");
    // Seen by the keep-alive while A's worker ran on, or by the last renewal after it
    // ended (it can finish first once resumed): a loss either way.
    let how = said.contains("--on-loss none") || said.contains("the command had already exited");
    assert!(said.contains("expired") && how, "{said}");
    // A's release on exit touched only its own lease: B's key is still there.
    assert_eq!(lock_keys(&stage, "orders").len(), 1);
    story.finish_b(&stage.nginx, &stage.gateway, resource).unwrap();
    assert!(lock_keys(&stage, "orders").is_empty());
}

/// Holders queued behind one another, by both clients: each gets a token above the
/// one before. Had `fencekeeper lock` used its key's create revision, the last
/// holder's token (its key was created while the first holder held the lock) would
/// fall below the etcdctl holder's acquisition revision, and its writes be refused.
#[test]
fn queued_holders_get_growing_tokens_whichever_client_queued() {
    let stage = stage();
    let resource = "/orders/queued.csv";
    let mut first =
        Holder::start("first", fencekeeper_etcd_lock(&stage, "q", resource, "first"), ACQUIRE_WITHIN).unwrap();
    let mut second = Holder::spawn("second", etcdctl_lock(&stage, "q", resource, "second")).unwrap();
    wait_for_keys(&stage, "q", 2);
    let mut third = Holder::spawn("third", fencekeeper_etcd_lock(&stage, "q", resource, "third")).unwrap();
    wait_for_keys(&stage, "q", 3);
    assert!(!second.has_acquired() && !third.has_acquired(), "a waiter acquired while the first held the lock");

    let mut tokens = vec![];
    for holder in [&mut first, &mut second, &mut third] {
        if holder.token.is_empty() {
            holder.acquired(ACQUIRE_WITHIN).unwrap();
        }
        assert!(stored(holder.wrote().unwrap()), "{}'s first write", holder.name);
        let (status, exit) = holder.finish().unwrap();
        assert!(stored(status) && exit.success(), "{}: {status} {exit} {}", holder.name, holder.stderr());
        tokens.push(token(&holder.token).unwrap());
    }
    assert!(tokens[0] < tokens[1] && tokens[1] < tokens[2], "{tokens:?}");
}

fn wait_for_keys(stage: &Stage, name: &str, n: usize) {
    poll_until(&format!("{n} keys under {name}/"), Duration::from_secs(20), || lock_keys(stage, name).len() >= n)
        .unwrap();
}

/// `fencekeeper lock ARGS...` run to its end: (exit code, stderr).
fn run_lock(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(workspace_bin("fencekeeper").unwrap()).arg("lock").args(args).output().unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn a_revoked_lease_is_reported_and_the_command_terminated() {
    let stage = stage();
    let etcd = stage.etcd.client.to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(workspace_bin("fencekeeper").unwrap());
    cmd.args(["lock", "--etcd", &etcd, "--ttl", "6", "jobs", "--", "sleep", "600"]);
    let mut holder = Process::spawn("fencekeeper lock", cmd, &dir.path().join("lock.log")).unwrap();
    wait_for_keys(&stage, "jobs", 1);
    // The key is NAME/<lease ID in hex>, as etcdctl names it.
    let key = lock_keys(&stage, "jobs").remove(0);
    let lease = key.strip_prefix("jobs/").unwrap();
    let revoked = Command::new("etcdctl").args(["--endpoints", &etcd, "lease", "revoke", lease]).status().unwrap();
    assert!(revoked.success());
    let since = Instant::now();
    poll_until("fencekeeper lock exits", Duration::from_secs(20), || holder.child.try_wait().unwrap().is_some())
        .unwrap();
    let status = holder.child.wait().unwrap();
    // Seen at the next renewal, a third of the TTL apart; not 600 s of sleep.
    assert!(since.elapsed() < Duration::from_secs(6), "{:?}", since.elapsed());
    assert_eq!(status.code(), Some(75));
    let said = std::fs::read_to_string(&holder.log).unwrap();
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains(&format!("etcd lease {lease} expired; sent SIGTERM to the command")), "{said}");
}

#[test]
fn the_command_exit_code_passes_through_and_a_busy_lock_is_exit_2_after_wait() {
    let stage = stage();
    let etcd = stage.etcd.client.to_string();
    let (code, said) = run_lock(&["--etcd", &etcd, "--resource", "/r", "free", "--", "sh", "-c", "exit 7"]);
    assert_eq!(code, Some(7), "{said}");
    assert!(said.is_empty(), "{said}");
    assert!(lock_keys(&stage, "free").is_empty(), "the lock was not released");

    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("etcdctl");
    cmd.args(["--endpoints", &etcd, "lock", "busy", "--", "sleep", "600"]);
    let _holder = Process::spawn("etcdctl lock", cmd, &dir.path().join("etcdctl.log")).unwrap();
    wait_for_keys(&stage, "busy", 1);
    let (code, said) = run_lock(&["--etcd", &etcd, "--wait", "1", "busy", "--", "true"]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.starts_with("fencekeeper: taking lock \"busy\" in etcd at http://"), "{said}");
    assert!(said.contains("still held by someone else after --wait 1s"), "{said}");
    // It left the queue: only the holder's key is left.
    assert_eq!(lock_keys(&stage, "busy").len(), 1);
}
