//! The harness itself: each real service starts, answers, and stores what it is given.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used)]

use fencekeeper_harness::relay::Relay;
use fencekeeper_harness::services::{four_letters, http, Etcd, NginxDav, Redis, ZooKeeper};
use std::time::Duration;

#[test]
fn nginx_dav_stores_any_put() {
    let nginx = NginxDav::start().unwrap();
    let (status, _) = http(nginx.addr, "PUT", "/a/b.txt", &[], b"hello").unwrap();
    assert!(status == 201 || status == 204, "status {status}");
    assert_eq!(nginx.read("/a/b.txt").as_deref(), Some(&b"hello"[..]));
}

#[test]
fn etcd_answers_health_and_survives_restart() {
    let mut etcd = Etcd::start().unwrap();
    let (status, _) = http(etcd.client, "GET", "/health", &[], b"").unwrap();
    assert_eq!(status, 200);
    etcd.restart().unwrap();
}

#[test]
fn zookeeper_leads_its_ensemble_of_one_in_a_new_epoch_after_a_restart() {
    let epoch = |zookeeper: &ZooKeeper| {
        let srvr = four_letters(zookeeper.addr, "srvr").unwrap();
        let zxid = srvr.lines().find_map(|l| l.strip_prefix("Zxid: 0x")).unwrap().to_owned();
        u64::from_str_radix(&zxid, 16).unwrap() >> 32
    };
    let mut zookeeper = ZooKeeper::start().unwrap();
    let first = epoch(&zookeeper);
    zookeeper.restart().unwrap();
    assert!(epoch(&zookeeper) > first);
}

#[test]
fn redis_answers_commands() {
    use std::io::{Read, Write};
    let redis = Redis::start().unwrap();
    let mut s = std::net::TcpStream::connect(redis.addr).unwrap();
    s.write_all(b"INCR n\r\n").unwrap();
    let mut answer = [0; 4];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b":1\r\n");
}

#[test]
fn relay_passes_requests_through_and_springs_its_trap_on_the_pattern_only() {
    let nginx = NginxDav::start().unwrap();
    let relay = Relay::start(nginx.addr).unwrap();
    let trap = relay.trap(b"PUT /trapped", || Ok(()));
    let (status, _) = http(relay.addr, "PUT", "/free", &[], b"one").unwrap();
    assert!(status == 201 || status == 204, "status {status}");
    assert!(trap.wait_fired(Duration::from_millis(100)).is_err(), "fired on another request");
    let (status, _) = http(relay.addr, "PUT", "/trapped", &[], b"two").unwrap();
    assert!(status == 201 || status == 204, "status {status}");
    trap.wait_fired(Duration::from_secs(5)).unwrap();
    trap.wait_client_closed(Duration::from_secs(5)).unwrap();
    let answer = trap.wait_answered(Duration::from_secs(5)).unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 201"), "{}", String::from_utf8_lossy(&answer));
    assert_eq!(nginx.read("/trapped").as_deref(), Some(&b"two"[..]));
}

#[test]
fn an_etcd_cluster_of_three_elects_a_new_leader_when_its_leader_is_killed() {
    use fencekeeper_harness::etcd_cluster::EtcdCluster;
    use fencekeeper_harness::services::{poll_until, WorkDir};
    let mut cluster = EtcdCluster::start_in(WorkDir::temporary().unwrap(), 3).unwrap();
    let old = cluster.leader().expect("a leader");
    cluster.kill(old);
    poll_until("a new leader", Duration::from_secs(30), || cluster.leader().is_some_and(|l| l != old)).unwrap();
    cluster.restart(old).unwrap();
    cluster.wait_healthy(old, Duration::from_secs(30)).unwrap();
}
