//! etcd as a cluster: `fencekeeper serve`, `marks` and `lock`, given every member of a
//! real 3-member etcd cluster (`--etcd a:2379,b:2379,c:2379`), fail over when the member
//! they talk to is killed (SIGKILL) under load. The refusals are the failover's own:
//! the writes whose etcd call was in flight or timed out on the dead member, and those
//! while the cluster elects a new leader when it was the leader; none after.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::etcd_cluster::EtcdCluster;
use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::services::{NginxDav, WorkDir};
use fencekeeper_harness::workspace_bin;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a failover may take: the call in flight on the dead member times out (the
/// gateway's etcd timeout, 2 s), then a new leader is elected if it was the leader
/// (etcd's default election timeout is 1 s; a few rounds at most), then calls go on.
const FAILOVER: Duration = Duration::from_secs(6);

#[test]
fn the_gateway_serve_marks_and_lock_fail_over_when_the_member_in_use_is_killed_under_load() {
    let mut cluster = EtcdCluster::start_in(WorkDir::temporary().unwrap(), 3).unwrap();
    let nginx = NginxDav::start().unwrap();
    let members: Vec<String> = cluster.members.iter().map(|m| m.client.to_string()).collect();
    let members = members.join(",");
    let gateway = Arc::new(Gateway::start(&nginx.url(), &["--etcd", &members]).unwrap());

    // One writer, advancing tokens on four resources, each write's answer timed.
    let start = Instant::now();
    let answers: Arc<Mutex<Vec<(Duration, u16, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (gateway, answers, stop) = (Arc::clone(&gateway), Arc::clone(&answers), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut token = 100u64;
            while !stop.load(Ordering::Relaxed) {
                token += 1;
                let path = format!("/failover/r{}", token % 4);
                let (status, text) = match gateway.put(&path, Some(&token.to_string()), b"x") {
                    Ok(r) => (r.status, r.body),
                    Err(e) => (0, format!("{e:#}")),
                };
                answers.lock().unwrap().push((start.elapsed(), status, text));
            }
        })
    };
    // The client dials the first member first: that is the one in use.
    let wait_for = |n: usize| {
        while answers.lock().unwrap().len() < n {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(50);
    let killed_at = start.elapsed();
    cluster.kill(0);
    // Writes on, well past the failover.
    let settled = killed_at + FAILOVER;
    while start.elapsed() < settled + Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    let answers = answers.lock().unwrap();
    let admitted = |s: u16| s == 201 || s == 204;
    let before: Vec<_> = answers.iter().filter(|(t, _, _)| *t < killed_at).collect();
    assert!(before.iter().all(|(_, s, _)| admitted(*s)), "before the kill: {before:?}");
    let late: Vec<_> = answers.iter().filter(|(t, s, _)| *t > settled && !admitted(*s)).collect();
    assert!(late.is_empty(), "refused after the failover's {FAILOVER:?}: {late:?}");
    let after = answers.iter().filter(|(t, s, _)| *t > settled && admitted(*s)).count();
    assert!(after >= 20, "only {after} writes admitted after the failover");
    let refused: Vec<_> = answers.iter().filter(|(_, s, _)| !admitted(*s)).collect();
    for (_, status, text) in &refused {
        // The failover's refusals: undecided, never a stale or a wrong verdict.
        assert_eq!(*status, 503, "{text}");
    }
    eprintln!("{} writes, {} refused during the failover", answers.len(), refused.len());

    // `marks` and `lock`, given the members with the first one dead, go on to the others.
    let fk = workspace_bin("fencekeeper").unwrap();
    let marks = Command::new(&fk).args(["marks", "--etcd", &members]).output().unwrap();
    let listed = String::from_utf8_lossy(&marks.stdout);
    assert!(marks.status.success(), "{}", String::from_utf8_lossy(&marks.stderr));
    assert!(listed.contains("/failover/r0") && listed.contains("/failover/r3"), "{listed}");
    let lock = Command::new(&fk)
        .args([
            "lock",
            "--etcd",
            &members,
            "--ttl",
            "5s",
            "failover-lock",
            "--",
            "sh",
            "-c",
            "test -n \"$FENCING_TOKEN\"",
        ])
        .output()
        .unwrap();
    assert!(lock.status.success(), "{}", String::from_utf8_lossy(&lock.stderr));
}
