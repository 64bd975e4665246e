//! The harness itself: each real service starts, answers, and stores what it is given.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

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

/// The command line of process `pid` (its arguments joined by spaces), `None` once it
/// is gone; a zombie has an empty one.
fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).split('\0').collect::<Vec<_>>().join(" ").trim().to_owned())
}

/// Every live process whose command line is `wanted`: a forked child (httpd's
/// workers) keeps its parent's.
fn processes_running(wanted: &str) -> Vec<u32> {
    // Kernel threads and zombies have an empty command line: never look for that.
    assert!(!wanted.is_empty(), "the service had already exited when its command line was read");
    let pids = std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok());
    pids.filter(|&pid: &u32| cmdline(pid).as_deref() == Some(wanted)).collect()
}

#[test]
fn a_dropped_service_leaves_no_process_behind_not_even_the_ones_it_forked() {
    let apache = fencekeeper_harness::apache::ApacheDav::start().unwrap();
    let nginx = NginxDav::start().unwrap();
    let lines = [cmdline(apache.process.child.id()).unwrap(), cmdline(nginx.process.child.id()).unwrap()];
    // httpd's event MPM forks its workers once it listens: wait for them.
    poll_until_forked(&lines[0], 2);
    drop((apache, nginx));
    for line in lines {
        assert_eq!(processes_running(&line), Vec::<u32>::new(), "left running: {line}");
    }
}

#[test]
fn a_panicking_test_leaves_no_process_behind() {
    let (send, line) = std::sync::mpsc::channel();
    let test = std::thread::spawn(move || {
        let apache = fencekeeper_harness::apache::ApacheDav::start().unwrap();
        let line = cmdline(apache.process.child.id()).unwrap();
        poll_until_forked(&line, 2);
        send.send(line).unwrap();
        panic!("a test fails with httpd running");
    });
    assert!(test.join().is_err());
    let line = line.recv().unwrap();
    assert_eq!(processes_running(&line), Vec::<u32>::new(), "left running: {line}");
}

/// Until `count` processes run `line`.
fn poll_until_forked(line: &str, count: usize) {
    fencekeeper_harness::services::poll_until("httpd's workers", Duration::from_secs(10), || {
        processes_running(line).len() >= count
    })
    .unwrap();
}
