//! Tokens from Redis, end to end: `fencekeeper lock --redis` and redis-cli running the
//! same acquisition script (`tests/clients/redis_cli_lock.sh`: the script is what
//! makes the token, any client can run it) take turns on one lock with a real
//! redis-server, and write through the real gateway to nginx WebDAV.
//!
//! The token is a counter incremented in the script that sets the lock key, so each
//! acquisition gets a higher one, on one Redis node (docs/tokens.md says what failover
//! does to it). The paused holder's key really expires (PX), and its late write is
//! refused; its release on exit leaves the next holder's key alone.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::holder::{fencekeeper_lock, pause_past_lease, worker};
use fencekeeper_harness::services::{poll_until, NginxDav, Process, Redis};
use fencekeeper_harness::{repo_root, workspace_bin};
use std::process::Command;
use std::time::{Duration, Instant};

struct Stage {
    redis: Redis,
    nginx: NginxDav,
    gateway: Gateway,
}

fn stage() -> Stage {
    let redis = Redis::start().unwrap();
    let nginx = NginxDav::start().unwrap();
    let gateway = Gateway::start(&nginx.url(), &[]).unwrap();
    Stage { redis, nginx, gateway }
}

/// `redis_cli_lock.sh HOST PORT NAME TTL_MS -- WORKER... --resource R`.
fn redis_cli_lock(stage: &Stage, name: &str, ttl_ms: &str, resource: &str, who: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg(repo_root().join("tests/clients/redis_cli_lock.sh"));
    cmd.args(["127.0.0.1", &stage.redis.addr.port().to_string(), name, ttl_ms, "--"]);
    cmd.args(worker(&stage.gateway.url(), who, &["--resource", resource]).unwrap());
    cmd
}

/// `fencekeeper lock --redis ... --ttl 2 --on-loss none --resource R NAME -- WORKER...`.
fn fencekeeper_redis_lock(stage: &Stage, name: &str, resource: &str, who: &str) -> Command {
    let address = stage.redis.address();
    let args = ["--redis", &address, "--ttl", "2", "--on-loss", "none", "--resource", resource, name];
    fencekeeper_lock(&args, &worker(&stage.gateway.url(), who, &[]).unwrap()).unwrap()
}

/// `redis-cli ARGS...`'s answer.
fn redis_cli(stage: &Stage, args: &[&str]) -> String {
    let port = stage.redis.addr.port().to_string();
    let out = Command::new("redis-cli").args(["-h", "127.0.0.1", "-p", &port, "--raw"]).args(args).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// B could not acquire before A's key, 2 s renewed every 2/3 s, had expired.
const B_WAITS: Duration = Duration::from_secs(1);

#[test]
fn fencekeeper_lock_holder_paused_past_its_key_ttl_is_refused_and_leaves_the_next_holders_key() {
    let stage = stage();
    let resource = "/orders/fencekeeper-paused.csv";
    let a = fencekeeper_redis_lock(&stage, "orders", resource, "A");
    // B's key lives 60 s: long enough to be there when A, resumed, releases on exit.
    let b = redis_cli_lock(&stage, "orders", "60000", resource, "B");
    let mut story = pause_past_lease(a, b).unwrap();
    story.check_fenced(B_WAITS).unwrap();
    assert_eq!(story.a_exit.code(), Some(75), "{}", story.a.stderr());
    let said = story.a.stderr();
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains("lost lock \"orders\"") && said.contains("expired or holds another holder's value"),
        "{said}"
    );
    // A's compare-and-delete found B's value, and deleted nothing.
    let owner = redis_cli(&stage, &["GET", "fencekeeper:lock:{orders}"]);
    assert!(owner.starts_with("redis-cli-"), "the lock key holds {owner:?}");
    story.finish_b(&stage.nginx, &stage.gateway, resource).unwrap();
}

#[test]
fn redis_cli_holder_paused_past_its_key_ttl_is_refused_once_fencekeeper_lock_took_over() {
    let stage = stage();
    let resource = "/orders/redis-cli-paused.csv";
    let a = redis_cli_lock(&stage, "orders", "2000", resource, "A");
    let b = fencekeeper_redis_lock(&stage, "orders", resource, "B");
    let mut story = pause_past_lease(a, b).unwrap();
    story.check_fenced(B_WAITS).unwrap();
    story.finish_b(&stage.nginx, &stage.gateway, resource).unwrap();
    // fencekeeper lock released its key; the counter stays for the next holder.
    assert_eq!(redis_cli(&stage, &["EXISTS", "fencekeeper:lock:{orders}"]), "0");
    assert_eq!(redis_cli(&stage, &["GET", "fencekeeper:token:{orders}"]), story.b.token);
}

/// A key that now holds another value (what a failover that lost the lock looks like
/// to the holder) is seen at the next renewal: the command is terminated.
#[test]
fn a_lock_key_taken_over_is_reported_and_the_command_terminated() {
    let stage = stage();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(workspace_bin("fencekeeper").unwrap());
    cmd.args(["lock", "--redis", &stage.redis.address(), "--ttl", "6", "jobs", "--", "sleep", "600"]);
    let mut holder = Process::spawn("fencekeeper lock", cmd, &dir.path().join("lock.log")).unwrap();
    let key = "fencekeeper:lock:{jobs}";
    poll_until("the lock key", Duration::from_secs(20), || redis_cli(&stage, &["EXISTS", key]) == "1").unwrap();
    assert_eq!(redis_cli(&stage, &["SET", key, "someone-else"]), "OK");
    let since = Instant::now();
    poll_until("fencekeeper lock exits", Duration::from_secs(20), || holder.child.try_wait().unwrap().is_some())
        .unwrap();
    assert!(since.elapsed() < Duration::from_secs(6), "{:?}", since.elapsed());
    assert_eq!(holder.child.wait().unwrap().code(), Some(75));
    let said = std::fs::read_to_string(&holder.log).unwrap();
    assert!(said.contains("holds another holder's value; sent SIGTERM to the command"), "{said}");
    // Its release left the other value alone.
    assert_eq!(redis_cli(&stage, &["GET", key]), "someone-else");
}
