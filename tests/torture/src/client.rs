//! The lock holders: client threads that each, over and over, take a real etcd lease
//! lock on one resource of their group ([`crate::lock`]), use its token, write several
//! times through a randomly chosen target of the group, and release it. Now and then a
//! holder "pauses": it stops renewing, waits until its lease has observably expired and
//! another holder holds the lock, then writes on with its old token, as the seed's
//! paused holder does. Every write is recorded ([`Write`]).

use crate::clock;
use crate::lock::{self, Etcd};
use crate::record::{Group, Kind, Log, Write};
use crate::rng::Rng;
use anyhow::Result;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The lease TTL of every holder, in seconds (etcd grants no less than about 2 s).
pub const TTL: u64 = 2;
/// The header that makes the filter's test build trap.
pub const FILTER_FAULT_HEADER: &str = "x-fencekeeper-fault";

/// Where each target listens, and whether it is an Envoy.
#[derive(Clone, Debug)]
pub struct Target {
    /// Its name (`gw1`, `envoy1`, ...).
    pub name: String,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Envoy with the filter (else a gateway).
    pub envoy: bool,
}

/// Tokens handed out, per resource, for the nemesis's replays.
#[derive(Default)]
pub struct Issued(Mutex<HashMap<String, Vec<(u64, Instant)>>>);

impl Issued {
    fn push(&self, resource: &str, token: u64) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let list = map.entry(resource.to_owned()).or_default();
        list.push((token, Instant::now()));
        if list.len() > 64 {
            list.remove(0);
        }
    }

    /// A token of `resource` handed out at least `age` ago, if any.
    pub fn old(&self, resource: &str, age: Duration) -> Option<u64> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(resource)?.iter().rev().find(|(_, at)| at.elapsed() >= age).map(|(t, _)| *t)
    }
}

/// A thread's HTTP client: keep-alive, every status an answer, bounded in time.
pub fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(8)))
            .timeout_connect(Some(Duration::from_secs(1)))
            .build(),
    )
}

/// What to send.
pub struct Send<'a> {
    /// The write's id (and body).
    pub id: String,
    /// The client sending it.
    pub client: &'a str,
    /// The resource's group.
    pub group: &'a str,
    /// The resource path.
    pub resource: &'a str,
    /// Why it is sent.
    pub kind: Kind,
    /// The token text, if any.
    pub token: Option<String>,
    /// The fault it belongs to.
    pub fault: Option<u64>,
}

/// The record of a write about to be sent (no answer yet).
pub fn send_record(target: &Target, what: Send<'_>) -> Write {
    let mut token = what.token;
    if what.kind == Kind::Trap && !target.envoy {
        token = Some("fault-trap".to_owned());
    }
    Write {
        id: what.id,
        client: what.client.to_owned(),
        group: what.group.to_owned(),
        resource: what.resource.to_owned(),
        target: target.name.clone(),
        kind: what.kind,
        token,
        start: clock::now(),
        end: clock::now(),
        status: 0,
        highest: None,
        seq: None,
        upstream_error: false,
        error: None,
        body: String::new(),
        fault: what.fault,
    }
}

/// Send one write through `target` and return its record.
pub fn send(agent: &ureq::Agent, target: &Target, what: Send<'_>) -> Write {
    let url = format!("{}{}", target.url, what.resource);
    let trap = what.kind == Kind::Trap && target.envoy;
    let mut write = send_record(target, what);
    let mut request = agent.put(&url).header("x-torture-target", &target.name);
    if trap {
        request = request.header(FILTER_FAULT_HEADER, "1");
    }
    if let Some(t) = &write.token {
        request = request.header("fencing-token", t);
    }
    write.start = clock::now();
    let result = request.send(write.id.as_bytes());
    write.end = clock::now();
    match result {
        Ok(mut response) => {
            let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            write.status = response.status().as_u16();
            write.highest = header("fencing-highest");
            write.seq = header("x-torture-seq").and_then(|s| s.parse().ok());
            write.upstream_error = header("x-torture-upstream").is_some();
            let body = response.body_mut().read_to_string().unwrap_or_default();
            write.body = body.chars().take(100).collect();
        }
        Err(e) => write.error = Some(error_word(&e).to_owned()),
    }
    write
}

/// What a conditional write refused because the fence lost the store's version says
/// (`fencekeeper-chain`'s `Refusal::Unknown`).
const VERSION_NOT_KNOWN: &str = "version of this object is not known";

/// Read `resource` through `target` (a HEAD), for the fence to learn its version; the
/// answer is not recorded: reads are not fenced, and the next refusal tells if it
/// was not learned.
fn read(agent: &ureq::Agent, target: &Target, resource: &str) {
    let _ = agent.head(format!("{}{resource}", target.url)).header("x-torture-target", &target.name).call();
}

/// `refused` when the request was certainly never sent; otherwise a word for the cause.
fn error_word(e: &ureq::Error) -> &'static str {
    use std::io::ErrorKind;
    match e {
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => "refused",
        ureq::Error::Io(io) if io.kind() == ErrorKind::ConnectionRefused => "refused",
        ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => "refused",
        ureq::Error::Timeout(_) => "timeout",
        ureq::Error::Io(_) => "io",
        _ => "other",
    }
}

/// What every client thread shares.
pub struct Shared {
    /// The cluster's client URLs.
    pub etcd: Vec<String>,
    /// Targets by name.
    pub targets: BTreeMap<String, Target>,
    /// The history.
    pub history: Arc<Log>,
    /// Set when the load is over.
    pub stop: AtomicBool,
    /// Tokens handed out.
    pub issued: Issued,
    /// Writes sent so far.
    pub writes: AtomicU64,
}

/// The lock's name for `resource`.
pub fn lock_name(resource: &str) -> String {
    format!("torture-lock{resource}")
}

/// One client thread: until `shared.stop`, hold locks on `group`'s resources and write.
pub fn run(shared: &Shared, group: &Group, index: usize, seed: u64) {
    let name = format!("{}#{index}", group.name);
    let mut rng = Rng::new(seed, 1000 + index as u64);
    let Ok(etcd) = Etcd::new(&shared.etcd, index) else { return };
    let agent = agent();
    let mut n = 0u64;
    while !shared.stop.load(Relaxed) {
        let resource = rng.pick(&group.resources).clone();
        let Ok(mut lock) = lock::acquire(&etcd, &lock_name(&resource), TTL, Duration::from_secs(10)) else {
            // etcd is down or slow (a fault): try again shortly.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        shared.issued.push(&resource, lock.token);
        let token = lock.token.to_string();
        let mut write = |kind: Kind, token: Option<String>, rng: &mut Rng| {
            n += 1;
            let target = &shared.targets[rng.pick(&group.targets)];
            let id = format!("{name}-{n}");
            let what = Send { id, client: &name, group: &group.name, resource: &resource, kind, token, fault: None };
            let w = send(&agent, target, what);
            shared.writes.fetch_add(1, Relaxed);
            let _ = shared.history.write(&w);
            w
        };
        for _ in 0..rng.between(4, 24) {
            if shared.stop.load(Relaxed) {
                break;
            }
            // Now and then a write without a token, or with a broken one.
            let w = match rng.below(400) {
                0 => write(Kind::Missing, None, &mut rng),
                1 => write(Kind::Malformed, Some(format!("{token}x")), &mut rng),
                _ => write(Kind::Valid, Some(token.clone()), &mut rng),
            };
            if w.status == 409 {
                if w.body.contains(VERSION_NOT_KNOWN) {
                    // What the refusal asks: a read through the fence, so that it learns the
                    // store's version (the Envoy filter does not ask the store itself).
                    read(&agent, &shared.targets[&w.target], &resource);
                }
                break;
            }
            if lock.since_renewed() >= Duration::from_millis(TTL * 1000 / 3) && lock.renew(&etcd).is_err() {
                break;
            }
        }
        if rng.chance(1, 20) && !shared.stop.load(Relaxed) {
            // The pause: no renewal until the lease has expired and another holder holds.
            let deadline = Instant::now() + Duration::from_secs(TTL * 5);
            while Instant::now() < deadline && !lock.lost(&etcd).unwrap_or(false) {
                std::thread::sleep(Duration::from_millis(50));
            }
            while Instant::now() < deadline && !lock.superseded(&etcd).unwrap_or(false) {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(rng.below(300)));
            for _ in 0..rng.between(1, 4) {
                write(Kind::Late, Some(token.clone()), &mut rng);
            }
        }
        let _ = lock.release(&etcd);
    }
}

/// A fresh write id for writes the runner sends itself.
pub fn next_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", N.fetch_add(1, Relaxed))
}

/// Read back every mark in etcd (a linearizable range).
pub fn etcd_marks(etcd: &Etcd) -> Result<BTreeMap<String, String>> {
    let prefix = fencekeeper_etcd_wire::DEFAULT_PREFIX;
    let mut marks = BTreeMap::new();
    for kv in etcd.range_prefix(prefix)? {
        let resource = String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned();
        if resource.is_empty() {
            continue; // the retention floor's key, no resource's
        }
        let mark = fencekeeper_etcd_wire::mark_of(&resource, &kv.value)
            .map(|t| t.to_string())
            .unwrap_or_else(|e| format!("damaged: {e:?}"));
        marks.insert(resource, mark);
    }
    Ok(marks)
}
