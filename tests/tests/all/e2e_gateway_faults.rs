//! The gateway under concurrent load and faults: the ordering invariant holds in the
//! store's recorded history; SIGKILL loses no acknowledged mark; an etcd outage is
//! refused with 503 (never a wrong admit) and the gateway recovers when etcd returns.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::gateway::{request, Gateway, RecordingUpstream};
use fencekeeper_harness::services::Etcd;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RESOURCES: usize = 8;

/// xorshift, seeded per client thread: reproducible schedules without a dependency.
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Per resource: the highest token handed out so far (the "lock service").
fn issuer() -> Arc<Vec<AtomicU64>> {
    Arc::new((0..RESOURCES).map(|_| AtomicU64::new(10)).collect())
}

/// A token for resource `r`: mostly a fresh, higher one (random jumps), sometimes an
/// old one, as a paused holder would send.
fn next_token(issued: &[AtomicU64], r: usize, random: &mut Random) -> u64 {
    if random.below(10) < 7 {
        issued[r].fetch_add(1 + random.below(3), Ordering::SeqCst) + 1
    } else {
        issued[r].load(Ordering::SeqCst).saturating_sub(random.below(5))
    }
}

type Acked = Arc<Mutex<HashMap<String, u64>>>;

fn ack(acked: &Acked, path: &str, token: u64) {
    let mut acked = acked.lock().unwrap();
    let highest = acked.entry(path.to_owned()).or_insert(0);
    *highest = (*highest).max(token);
}

#[test]
fn concurrent_clients_with_random_token_jumps_keep_every_resource_ordered() {
    ordered_under_load(&[]);
}

#[test]
fn concurrent_clients_keep_every_resource_ordered_with_marks_in_etcd() {
    let etcd = Etcd::start().unwrap();
    ordered_under_load(&["--etcd", &etcd.url()]);
}

/// 16 clients x 150 writes on 8 resources, tokens mostly fresh (random jumps) and
/// sometimes old, against a store that applies writes after a random delay.
fn ordered_under_load(gateway_args: &[&str]) {
    let upstream = RecordingUpstream::start_jittered(Duration::from_millis(2)).unwrap();
    let gw = Gateway::start(&upstream.url(), gateway_args).unwrap();
    let (issued, acked): (_, Acked) = (issuer(), Acked::default());
    let (admitted, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..16u64)
        .map(|c| {
            let (url, issued, acked) = (gw.url(), issued.clone(), acked.clone());
            let (admitted, refused) = (admitted.clone(), refused.clone());
            std::thread::spawn(move || {
                let mut random = Random(c * 7919 + 1);
                for _ in 0..150 {
                    let r = random.below(RESOURCES as u64) as usize;
                    let (path, token) = (format!("/res-{r}"), next_token(&issued, r, &mut random).to_string());
                    let reply = request(&url, "PUT", &path, &[("fencing-token", &token)], token.as_bytes()).unwrap();
                    match reply.status {
                        201 => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                            ack(&acked, &path, token.parse().unwrap());
                        }
                        409 => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        other => panic!("unexpected {other}: {}", reply.body),
                    }
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    let applied = upstream.applied();
    assert_eq!(applied.len() as u64, admitted.load(Ordering::SeqCst), "every 2xx was applied once, nothing else");
    assert!(refused.load(Ordering::SeqCst) > 0 && admitted.load(Ordering::SeqCst) > 0);
    let mut last: HashMap<&str, u64> = HashMap::new();
    for write in &applied {
        let token: u64 = write.token.parse().unwrap();
        let previous = last.insert(&write.path, token).unwrap_or(0);
        assert!(token >= previous, "{}: token {token} applied after {previous}", write.path);
    }
    for (path, highest) in acked.lock().unwrap().iter() {
        assert_eq!(last.get(path.as_str()), Some(highest), "{path}: the store's final write is the highest admitted");
        assert_eq!(gw.mark(path).unwrap(), Some(highest.to_string()), "{path}: the mark is the highest admitted");
    }
}

#[test]
fn sigkill_during_load_loses_no_acknowledged_mark() {
    let upstream = RecordingUpstream::start().unwrap();
    let mut gw = Gateway::start(&upstream.url(), &[]).unwrap();
    let (issued, acked): (_, Acked) = (issuer(), Acked::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8u64)
        .map(|c| {
            let (url, issued, acked, stop) = (gw.url(), issued.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut random = Random(c * 104_729 + 3);
                while !stop.load(Ordering::SeqCst) {
                    let r = random.below(RESOURCES as u64) as usize;
                    let (path, token) = (format!("/res-{r}"), next_token(&issued, r, &mut random));
                    let headers = [("fencing-token", token.to_string())];
                    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    // Refused connections after the kill are expected; keep going.
                    if let Ok(reply) = request(&url, "PUT", &path, &headers, b"x") {
                        if reply.status == 201 {
                            ack(&acked, &path, token);
                        }
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while upstream.applied().len() < 300 {
        assert!(Instant::now() < deadline, "load never reached 300 writes");
        std::thread::sleep(Duration::from_millis(5));
    }
    gw.kill();
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.join().unwrap();
    }
    gw.restart().unwrap();
    let acked = acked.lock().unwrap();
    assert!(!acked.is_empty());
    for (path, highest) in acked.iter() {
        let mark: u64 = gw.mark(path).unwrap().expect("a mark").parse().unwrap();
        assert!(mark >= *highest, "{path}: mark {mark} below acknowledged {highest}");
        let below = gw.put(path, Some(&(highest - 1).to_string()), b"late").unwrap();
        assert_eq!(below.status, 409, "{path}: token {} after restart: {}", highest - 1, below.body);
    }
}

#[test]
fn etcd_outage_gets_503_with_no_wrong_admit_and_recovers_when_etcd_returns() {
    let mut etcd = Etcd::start().unwrap();
    let upstream = RecordingUpstream::start().unwrap();
    let gw = Gateway::start(&upstream.url(), &["--etcd", &etcd.url()]).unwrap();
    assert_eq!(gw.put("/f", Some("10"), b"a").unwrap().status, 201);
    etcd.stop();
    for token in ["11", "9", "10"] {
        let reply = gw.put("/f", Some(token), b"during outage").unwrap();
        assert_eq!(reply.status, 503, "token {token}: {}", reply.body);
        assert!(reply.body.contains("etcd"), "{}", reply.body);
    }
    assert_eq!(upstream.applied().len(), 1, "nothing reached the store while etcd was down");
    assert_eq!(gw.metric("fencekeeper_gateway_requests_total{class=\"undecided\"}").unwrap(), 3);
    etcd.restart().unwrap();
    assert_eq!(gw.put("/f", Some("11"), b"b").unwrap().status, 201);
    let stale = gw.put("/f", Some("10"), b"c").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("11")));
}

#[test]
fn gateways_sharing_etcd_agree_on_marks() {
    let etcd = Etcd::start().unwrap();
    let upstream = RecordingUpstream::start().unwrap();
    let one = Gateway::start(&upstream.url(), &["--etcd", &etcd.url()]).unwrap();
    let two = Gateway::start(&upstream.url(), &["--etcd", &etcd.url()]).unwrap();
    assert_eq!(one.put("/f", Some("34"), b"new").unwrap().status, 201);
    let stale = two.put("/f", Some("33"), b"old").unwrap();
    assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("34")));
    assert_eq!(two.mark("/f").unwrap().as_deref(), Some("34"));
    assert_eq!(two.put("/f", Some("35"), b"newer").unwrap().status, 201);
    assert_eq!(one.put("/f", Some("34"), b"old again").unwrap().status, 409);
}
