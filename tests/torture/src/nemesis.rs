//! The nemesis: faults drawn from a table, one at a time, each recorded with its start
//! and heal stamps ([`Fault`]); after each heal, marks are read back where a restart
//! could have lost them ([`Snapshot`]), and a fresh lock holder probes every target the
//! fault disturbed until a write is stored (liveness). The schedule is a seeded
//! shuffle of the whole table, round after round, so every kind is injected in every
//! round and `--seed` replays the same kinds, victims and durations.

use crate::client::{self, Send, Shared};
use crate::clock;
use crate::lock::{self, Etcd};
use crate::record::{Event, Fault, Group, Kind, Log, Snapshot};
use crate::rng::Rng;
use crate::system::System;
use crate::worker::Pool;
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Every fault kind, in table order (tests/README.md has one row for each).
pub const KINDS: [&str; 26] = [
    "etcd-kill-leader",
    "etcd-kill-follower",
    "etcd-stop-leader",
    "etcd-stop-follower",
    "etcd-quorum-loss-kill",
    "etcd-quorum-loss-stop",
    "etcd-restart-all",
    "gateway-kill",
    "gateway-stop",
    "gateway-term",
    "gateway-kill-slow-upstream",
    "file-gateway-kill",
    "envoy-kill",
    "envoy-stop",
    "upstream-slow",
    "upstream-past-bound",
    "upstream-5xx",
    "upstream-restart",
    "disk-full",
    "gateway-guest-trap",
    "filter-trap",
    "client-stop",
    "client-kill",
    "malformed-tokens",
    "missing-tokens",
    "replay-old-token",
];

/// After a fault heals, a fresh holder's write is stored within this bound: an instance
/// that died may hold the resources it had in flight until its lease in the shared
/// registry expires ([`crate::system::LINGER`]).
pub const LIVENESS_BOUND: Duration = Duration::from_secs(30);

/// Faults that take an instance of the shared gate away (killed, frozen, trapped,
/// stopped): its flights keep the resources they are on held until its lease
/// expires, so every target's writes on them may wait, and be refused at the gate.
const TAKES_AN_INSTANCE: [&str; 7] = [
    "gateway-kill",
    "gateway-stop",
    "gateway-term",
    "gateway-kill-slow-upstream",
    "envoy-kill",
    "envoy-stop",
    "filter-trap",
];

/// The nemesis and what it acts on.
pub struct Nemesis<'a> {
    /// The services.
    pub system: &'a mut System,
    /// The clients' shared state (targets, history, stop flag, issued tokens).
    pub shared: &'a Shared,
    /// The process holders.
    pub pool: Option<&'a Pool>,
    /// Resource groups (for replays).
    pub groups: &'a [Group],
    /// `nemesis.jsonl`.
    pub log: &'a Log,
    /// The schedule's generator.
    pub rng: Rng,
    /// The etcd client for snapshots and probes.
    pub etcd: Etcd,
    /// The nemesis's HTTP client.
    pub agent: ureq::Agent,
    /// Faults so far.
    pub n: u64,
    /// The fault kinds drawn from (the table, or those asked for).
    pub kinds: Vec<String>,
    /// When the load began (a stamp), for the fault lines' times into the run.
    pub load_start: u64,
}

/// What injecting a fault did; the runner stamps and logs it.
struct Done {
    targets: Vec<String>,
    detail: String,
    injected: bool,
    /// Marks may have been lost here: read them back.
    snapshot: bool,
}

fn done(targets: Vec<String>, detail: String, snapshot: bool) -> Done {
    Done { targets, detail, injected: true, snapshot }
}

impl Nemesis<'_> {
    /// Inject faults until `enough` says the load is over, then return how many.
    pub fn run(&mut self, enough: &dyn Fn() -> bool) -> Result<u64> {
        if let Some(unknown) = self.kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
            anyhow::bail!("no fault kind {unknown:?}; the kinds are {}", KINDS.join(", "));
        }
        let kinds = self.kinds.clone();
        let mut round: Vec<&str> = Vec::new();
        while !enough() {
            if round.is_empty() {
                round = kinds.iter().map(String::as_str).collect();
                for i in (1..round.len()).rev() {
                    round.swap(i, self.rng.below(i as u64 + 1) as usize);
                }
            }
            let kind = round.remove(0);
            self.one(kind)?;
            // A quiet gap, so that every fault heals into a calm system.
            std::thread::sleep(Duration::from_millis(self.rng.between(300, 1200)));
        }
        Ok(self.n)
    }

    fn hold(&mut self) -> Duration {
        Duration::from_millis(self.rng.between(1000, 3000))
    }

    fn etcd_targets(&self) -> Vec<String> {
        self.shared.targets.keys().filter(|t| crate::system::marks_in_etcd(t)).cloned().collect()
    }

    fn one(&mut self, kind: &str) -> Result<()> {
        self.n += 1;
        let n = self.n;
        let start = clock::now();
        let done = self.inject(kind, n).with_context(|| format!("fault {n} ({kind})"))?;
        let healed = clock::now();
        // Writes given up on meanwhile hold their resources for the store apply bound,
        // an instance taken away holds its flights until its lease expires; writes that
        // wait for them past the gate timeout are refused.
        let (lingers, targets) = if TAKES_AN_INSTANCE.contains(&kind) && done.injected {
            (crate::system::LINGER, self.all_targets())
        } else {
            (crate::system::APPLY_BOUND + crate::system::GATE_TIMEOUT, done.targets.clone())
        };
        let fault = Fault {
            n,
            kind: kind.to_owned(),
            targets: targets.clone(),
            start,
            healed,
            injected: done.injected,
            detail: done.detail,
            lingers_ms: lingers.as_millis() as u64,
            observed: false,
        };
        eprintln!(
            "torture: fault {n} {kind}{} at {:.1} s ({:.1} s): {}",
            if done.injected { "" } else { " NOT INJECTED" },
            start.saturating_sub(self.load_start) as f64 / 1e9,
            (healed - start) as f64 / 1e9,
            fault.detail
        );
        self.log.write(&Event::Fault(fault))?;
        if done.snapshot {
            self.snapshots(Some(n))?;
        }
        let probed = if targets.is_empty() {
            vec![self.rng.pick(&self.shared.targets.keys().cloned().collect::<Vec<_>>()).clone()]
        } else {
            targets
        };
        for target in probed {
            self.probe(&target, n);
        }
        Ok(())
    }

    fn inject(&mut self, kind: &str, n: u64) -> Result<Done> {
        match kind {
            "etcd-kill-leader" | "etcd-kill-follower" | "etcd-stop-leader" | "etcd-stop-follower" => {
                let leader = self.wait_leader()?;
                let victim =
                    if kind.ends_with("leader") { leader } else { (leader + 1 + self.rng.below(2) as usize) % 3 };
                let name = self.system.etcd.members[victim].name.clone();
                let hold = self.hold() + Duration::from_millis(1000);
                if kind.starts_with("etcd-kill") {
                    self.system.etcd.kill(victim);
                    std::thread::sleep(hold);
                    self.system.etcd.restart(victim)?;
                } else {
                    self.system.etcd.freeze(victim)?;
                    std::thread::sleep(hold);
                    self.system.etcd.thaw(victim)?;
                }
                self.etcd_healthy()?;
                Ok(done(self.etcd_targets(), format!("member {name} (leader was m{leader}), {hold:?}"), true))
            }
            "etcd-quorum-loss-kill" | "etcd-quorum-loss-stop" => {
                let keep = self.rng.below(3) as usize;
                let victims: Vec<usize> = (0..3).filter(|&i| i != keep).collect();
                let hold = self.hold();
                for &v in &victims {
                    if kind.ends_with("kill") {
                        self.system.etcd.kill(v);
                    } else {
                        self.system.etcd.freeze(v)?;
                    }
                }
                std::thread::sleep(hold);
                for &v in &victims {
                    if kind.ends_with("kill") {
                        self.system.etcd.restart(v)?;
                    } else {
                        self.system.etcd.thaw(v)?;
                    }
                }
                self.etcd_healthy()?;
                Ok(done(self.etcd_targets(), format!("members {victims:?} down, m{keep} alone, {hold:?}"), true))
            }
            "etcd-restart-all" => {
                for v in 0..3 {
                    self.system.etcd.kill(v);
                }
                for v in 0..3 {
                    self.system.etcd.restart(v)?;
                }
                self.etcd_healthy()?;
                Ok(done(self.etcd_targets(), "every member SIGKILLed and restarted".into(), true))
            }
            "gateway-kill-slow-upstream" => {
                // A gateway dies with writes in flight to a slow store: its ordering gate
                // (in memory) is gone while the store may still apply them.
                let names: Vec<String> = ["gw1", "gw2"]
                    .iter()
                    .map(|s| s.to_string())
                    .filter(|g| self.shared.targets.contains_key(g))
                    .collect();
                if names.is_empty() {
                    return Ok(not_injected("no etcd gateway in this run"));
                }
                let name = self.rng.pick(&names).clone();
                let knobs = "delay_pct=50&delay_min_ms=1000&delay_max_ms=4000";
                self.system.upstream.knobs(knobs)?;
                std::thread::sleep(Duration::from_millis(1500));
                let hold = Duration::from_millis(self.rng.between(200, 1000));
                let gateway = self.system.gateway(&name).context("gateway")?;
                gateway.kill();
                std::thread::sleep(hold);
                gateway.restart()?;
                std::thread::sleep(Duration::from_millis(1500));
                self.system.upstream.knobs("")?;
                std::thread::sleep(Duration::from_millis(4000));
                Ok(done(self.all_targets(), format!("{name} killed under {knobs}, down {hold:?}"), true))
            }
            "gateway-kill" | "gateway-stop" | "gateway-term" | "file-gateway-kill" => {
                let names: Vec<String> = if kind == "file-gateway-kill" { &["gwfile"][..] } else { &["gw1", "gw2"] }
                    .iter()
                    .map(|s| s.to_string())
                    .filter(|g| self.shared.targets.contains_key(g))
                    .collect();
                let Some(name) = (!names.is_empty()).then(|| self.rng.pick(&names).clone()) else {
                    return Ok(not_injected("that gateway is not running in this run"));
                };
                let hold = self.hold();
                let gateway = self.system.gateway(&name).context("gateway")?;
                match kind {
                    "gateway-stop" => {
                        gateway.process.freeze()?;
                        std::thread::sleep(hold);
                        gateway.process.signal("CONT")?;
                    }
                    "gateway-term" => {
                        gateway.terminate(Duration::from_secs(60))?;
                        gateway.restart()?;
                    }
                    _ => {
                        gateway.kill();
                        std::thread::sleep(hold);
                        gateway.restart()?;
                    }
                }
                Ok(done(vec![name.clone()], format!("{name}, {hold:?}"), kind != "gateway-stop"))
            }
            "envoy-kill" | "envoy-stop" => {
                let names: Vec<String> = self.system.envoys.iter().map(|(n, _)| n.clone()).collect();
                if names.is_empty() {
                    return Ok(not_injected("no Envoy in this run"));
                }
                let name = self.rng.pick(&names).clone();
                let hold = self.hold();
                let envoy = self.system.envoy(&name).context("envoy")?;
                if kind == "envoy-kill" {
                    envoy.kill();
                    std::thread::sleep(hold);
                    envoy.restart()?;
                } else {
                    envoy.process.freeze()?;
                    std::thread::sleep(hold);
                    envoy.process.signal("CONT")?;
                }
                Ok(done(vec![name.clone()], format!("{name}, {hold:?}"), kind == "envoy-kill"))
            }
            "upstream-slow" | "upstream-5xx" => {
                let knobs = if kind == "upstream-slow" {
                    "delay_pct=25&delay_min_ms=500&delay_max_ms=4000"
                } else {
                    "error_pct=30"
                };
                let hold = self.hold() + Duration::from_secs(2);
                self.system.upstream.knobs(knobs)?;
                std::thread::sleep(hold);
                self.system.upstream.knobs("")?;
                // Writes delayed until now are still in flight: the fault lasts until
                // the longest delay has passed.
                std::thread::sleep(Duration::from_millis(if kind == "upstream-slow" { 4000 } else { 0 }));
                Ok(done(self.all_targets(), format!("{knobs}, {hold:?}"), false))
            }
            "upstream-past-bound" => {
                // The store breaks its promise: a share of writes waits longer than the
                // hosts' request timeout plus the store apply bound before it applies
                // them. A host cannot tell such a write from one that will never land;
                // one that lands after a newer write is the bound's limit, counted apart.
                let over = crate::system::REQUEST_TIMEOUT + crate::system::APPLY_BOUND;
                let (min, max) = (over.as_millis() as u64 + 1000, over.as_millis() as u64 + 4000);
                let knobs = format!("delay_pct=25&delay_min_ms={min}&delay_max_ms={max}");
                let hold = self.hold();
                self.system.upstream.knobs(&knobs)?;
                std::thread::sleep(hold);
                self.system.upstream.knobs("")?;
                std::thread::sleep(Duration::from_millis(max));
                Ok(done(self.all_targets(), format!("{knobs}, {hold:?}"), false))
            }
            "upstream-restart" => {
                let hold = self.hold();
                self.system.upstream.process.kill();
                std::thread::sleep(hold);
                self.system.upstream.restart()?;
                Ok(done(self.all_targets(), format!("SIGKILL, down {hold:?}"), false))
            }
            "disk-full" => {
                let Some(disk) = &self.system.disk else {
                    return Ok(not_injected(&format!(
                        "no size-limited tmpfs: {}",
                        self.system.no_disk.clone().unwrap_or_default()
                    )));
                };
                let filler = disk.path.join("filler");
                let filled = fill(&filler);
                // The store's file does not grow while the same marks are rewritten:
                // first marks of new resources make it ask the full disk for pages.
                // Each such write goes into the history.
                let deadline = Instant::now() + self.hold();
                let fresh = || -> Result<u16> {
                    let resource = format!("/t/fresh/{}", client::next_id("r"));
                    let what = Send {
                        id: client::next_id("nemesis"),
                        client: "nemesis",
                        group: "fresh",
                        resource: &resource,
                        kind: Kind::Valid,
                        token: Some("1".into()),
                        fault: Some(n),
                    };
                    let w = client::send(&self.agent, &self.shared.targets["gwfile"], what);
                    self.shared.history.write(&w)?;
                    Ok(w.status)
                };
                let mut answers: BTreeMap<u16, u64> = BTreeMap::new();
                while Instant::now() < deadline {
                    *answers.entry(fresh()?).or_default() += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                std::fs::remove_file(&filler)?;
                // Found by an earlier run: redb refuses every transaction after an I/O
                // error until the database is reopened, and the gateway stayed 503 until
                // restarted. The store now reopens itself (at most once a second), so the
                // heal is only the freed space, no restart: fresh writes until one is
                // stored, each in the history; none within 10 s fails the run.
                let freed = Instant::now();
                let healed = loop {
                    let status = fresh()?;
                    if (200..300).contains(&status) {
                        break format!("writes stored again {:?} after freeing, no restart", freed.elapsed());
                    }
                    if freed.elapsed() > Duration::from_secs(10) {
                        anyhow::bail!(
                            "gwfile still answers {status} 10 s after its disk had room: the file store did not reopen"
                        );
                    }
                    std::thread::sleep(Duration::from_millis(100));
                };
                Ok(done(
                    vec!["gwfile".into()],
                    format!("{filled} bytes filled the tmpfs; first writes answered {answers:?}; {healed}"),
                    true,
                ))
            }
            "filter-trap" => self.filter_trap(n),
            "gateway-guest-trap" | "malformed-tokens" | "missing-tokens" | "replay-old-token" => {
                self.bad_writes(kind, n)
            }
            "client-stop" | "client-kill" => self.client_fault(kind),
            other => anyhow::bail!("unknown fault kind {other}"),
        }
    }

    fn all_targets(&self) -> Vec<String> {
        self.shared.targets.keys().cloned().collect()
    }

    fn wait_leader(&self) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self.system.etcd.leader() {
                return Ok(l);
            }
            anyhow::ensure!(Instant::now() < deadline, "no etcd leader for 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn etcd_healthy(&self) -> Result<()> {
        for i in 0..3 {
            self.system.etcd.wait_healthy(i, Duration::from_secs(60))?;
        }
        Ok(())
    }

    /// Writes the nemesis sends itself for a while: traps, broken tokens, old tokens.
    fn bad_writes(&mut self, kind: &str, n: u64) -> Result<Done> {
        let candidates: Vec<String> = match kind {
            "gateway-guest-trap" => self.shared.targets.values().filter(|t| !t.envoy).map(|t| t.name.clone()).collect(),
            _ => self.all_targets(),
        };
        if candidates.is_empty() {
            return Ok(not_injected("no such target in this run"));
        }
        let target = self.rng.pick(&candidates).clone();
        let groups: Vec<&Group> = self
            .groups
            .iter()
            .filter(|g| {
                g.targets.contains(&target)
                    && !g.resources.is_empty()
                    && !g.name.starts_with("probe-")
                    && !g.name.starts_with("proc-")
            })
            .collect();
        if groups.is_empty() {
            return Ok(not_injected("no bulk group through that target"));
        }
        let group = *self.rng.pick(&groups);
        let deadline = Instant::now() + self.hold();
        let (mut sent, mut replayed) = (0, None);
        while Instant::now() < deadline {
            let resource = self.rng.pick(&group.resources).clone();
            let (k, token) = match kind {
                "gateway-guest-trap" => (Kind::Trap, Some("1".to_owned())),
                "malformed-tokens" => (
                    Kind::Malformed,
                    Some(self.rng.pick(&["-1", "abc", "1..2", "18446744073709551616", "1.2.3.4.5"]).to_string()),
                ),
                "missing-tokens" => (Kind::Missing, None),
                _ => match self.shared.issued.old(&resource, Duration::from_secs(10)) {
                    Some(t) => {
                        replayed = Some(t);
                        (Kind::Replay, Some(t.to_string()))
                    }
                    None => {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                },
            };
            let t = &self.shared.targets[&target];
            let what = Send {
                id: client::next_id("nemesis"),
                client: "nemesis",
                group: &group.name,
                resource: &resource,
                kind: k,
                token,
                fault: Some(n),
            };
            let w = client::send(&self.agent, t, what);
            self.shared.history.write(&w)?;
            self.shared.writes.fetch_add(1, Relaxed);
            sent += 1;
            std::thread::sleep(Duration::from_millis(if k == Kind::Trap { 150 } else { 20 }));
        }
        let disturbed = if kind == "gateway-guest-trap" { vec![target.clone()] } else { vec![] };
        let detail = format!(
            "{sent} writes through {target} on {}{}",
            group.name,
            replayed.map(|t| format!(", e.g. token {t}")).unwrap_or_default()
        );
        if kind == "replay-old-token" && replayed.is_none() {
            return Ok(not_injected("no token old enough yet"));
        }
        Ok(done(disturbed, detail, false))
    }

    /// One request that makes the filter trap in one of an Envoy's workers; healed once
    /// Envoy has reloaded that worker's VM (FAIL_RELOAD: about a second, on the next
    /// request it gets).
    fn filter_trap(&mut self, n: u64) -> Result<Done> {
        let names: Vec<String> = self.system.envoys.iter().map(|(n, _)| n.clone()).collect();
        if names.is_empty() {
            return Ok(not_injected("no Envoy in this run"));
        }
        let name = self.rng.pick(&names).clone();
        const RELOADS: &str = "wasm.fencekeeper.vm_reload_success";
        let before = self.system.envoy(&name).context("envoy")?.stat(RELOADS)?;
        let group = self.groups.iter().find(|g| g.name == "envoy").context("no envoy group")?;
        let resource = self.rng.pick(&group.resources).clone();
        let what = Send {
            id: client::next_id("nemesis"),
            client: "nemesis",
            group: &group.name,
            resource: &resource,
            kind: Kind::Trap,
            token: Some("1".into()),
            fault: Some(n),
        };
        let w = client::send(&self.agent, &self.shared.targets[&name], what);
        self.shared.history.write(&w)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let after = self.system.envoy(&name).context("envoy")?.stat(RELOADS)?;
            if after > before {
                return Ok(done(
                    vec![name.clone()],
                    format!("{name}: one trap (answered {}), reloaded", w.status),
                    false,
                ));
            }
            anyhow::ensure!(Instant::now() < deadline, "{name} did not reload its filter within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn client_fault(&mut self, kind: &str) -> Result<Done> {
        let Some(pool) = self.pool else { return Ok(not_injected("no process holders in this run")) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let (slot, pids, acquired_partner) = loop {
            let holding: Vec<(usize, (u32, u32))> = pool
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.lock().unwrap_or_else(|p| p.into_inner()).holding.map(|h| (i, h)))
                .collect();
            if let Some(&(i, pids)) = holding.first() {
                let partner = pool.slots[i ^ 1].lock().unwrap_or_else(|p| p.into_inner()).acquired;
                break (i, pids, partner);
            }
            if Instant::now() > deadline {
                return Ok(not_injected("no process holder held its lock for 10 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let (client_pid, worker_pid) = pids;
        if kind == "client-kill" {
            for pid in [worker_pid, client_pid] {
                signal(pid, "KILL");
            }
            return Ok(done(vec![], format!("slot {slot}: lock client {client_pid} and worker {worker_pid}"), false));
        }
        // The slot said "holding" a moment ago; its worker may have finished and exited
        // since. A process that is gone cannot be frozen: the fault is not injected.
        let mut stopped = Vec::new();
        for pid in [client_pid, worker_pid] {
            if let Err(e) = fencekeeper_harness::services::freeze(pid) {
                for p in &stopped {
                    signal(*p, "CONT");
                }
                if gone(pid) {
                    return Ok(not_injected(&format!("slot {slot}: process {pid} ended before it was frozen")));
                }
                return Err(e);
            }
            stopped.push(pid);
        }
        let frozen = Instant::now();
        // Past the lease: until the other contender holds the lock (bounded).
        let taken = loop {
            if pool.slots[slot ^ 1].lock().unwrap_or_else(|p| p.into_inner()).acquired > acquired_partner {
                break true;
            }
            if frozen.elapsed() > Duration::from_secs(15) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(Duration::from_millis(300));
        for pid in [client_pid, worker_pid] {
            signal(pid, "CONT");
        }
        Ok(done(
            vec![],
            format!(
                "slot {slot} frozen {:?}; the other contender {} the lock meanwhile",
                frozen.elapsed(),
                if taken { "took" } else { "did not take" }
            ),
            false,
        ))
    }

    /// Read back the marks where they live: etcd, and each file-store gateway.
    pub fn snapshots(&mut self, after: Option<u64>) -> Result<()> {
        if !self.etcd_targets().is_empty() {
            let start = clock::now();
            let marks = client::etcd_marks(&self.etcd)?;
            let end = clock::now();
            self.log.write(&Event::Snapshot(Snapshot {
                after_fault: after,
                source: "etcd".into(),
                start,
                end,
                marks,
            }))?;
        }
        if let Some(g) = self.system.gateway("gwfile") {
            let start = clock::now();
            let (status, body) = fencekeeper_harness::services::http(g.admin, "GET", "/fencekeeper/marks", &[], b"")?;
            let end = clock::now();
            anyhow::ensure!(status == 200, "gwfile's marks: {status}");
            let marks: BTreeMap<String, String> = String::from_utf8_lossy(&body)
                .lines()
                .filter_map(|l| l.split_once('\t'))
                .map(|(r, m)| (r.to_owned(), m.to_owned()))
                .collect();
            self.log.write(&Event::Snapshot(Snapshot {
                after_fault: after,
                source: "gwfile".into(),
                start,
                end,
                marks,
            }))?;
        }
        Ok(())
    }

    /// A fresh holder of the probe resource of `target` writes until one write is
    /// stored, or the liveness bound passes (the checker judges).
    fn probe(&mut self, target: &str, n: u64) {
        let resource = probe_resource(target);
        let group = format!("probe-{target}");
        let deadline = Instant::now() + LIVENESS_BOUND;
        while Instant::now() < deadline {
            let Ok(held) =
                lock::acquire(&self.etcd, &client::lock_name(&resource), client::TTL, Duration::from_secs(5))
            else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let t = &self.shared.targets[target];
            let mut stored = false;
            while Instant::now() < deadline {
                let what = Send {
                    id: client::next_id("probe"),
                    client: "probe",
                    group: &group,
                    resource: &resource,
                    kind: Kind::Probe,
                    token: Some(held.token.to_string()),
                    fault: Some(n),
                };
                let w = client::send(&self.agent, t, what);
                let _ = self.shared.history.write(&w);
                stored = (200..300).contains(&w.status);
                if stored || w.status == 409 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = held.release(&self.etcd);
            if stored {
                return;
            }
        }
    }
}

/// Signal a process that may have exited meanwhile (then nothing happens).
fn signal(pid: u32, name: &str) {
    let _ = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// The process has exited (no `/proc` entry, or a zombie waiting to be reaped).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "PID (comm) STATE ...": the state follows the last ')'.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

fn not_injected(why: &str) -> Done {
    Done { targets: vec![], detail: why.to_owned(), injected: false, snapshot: false }
}

/// The probe resource of a target.
pub fn probe_resource(target: &str) -> String {
    format!("/t/probe-{target}/0")
}

/// Write zeros to `path` until the file system is full; the bytes written.
fn fill(path: &std::path::Path) -> u64 {
    use std::io::Write;
    let Ok(mut f) = std::fs::File::create(path) else { return 0 };
    let chunk = vec![0u8; 64 * 1024];
    let mut total = 0;
    while f.write_all(&chunk).is_ok() {
        total += chunk.len() as u64;
    }
    let mut small = [0u8; 512];
    while f.write_all(&small).is_ok() {
        total += 512;
        small[0] = 0;
    }
    let _ = f.sync_all();
    total
}
