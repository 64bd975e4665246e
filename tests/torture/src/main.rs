//! `fencekeeper-torture`: the seed's failure story at scale, with real processes, real
//! faults and a checker (issue 9; tests/README.md, "Torture").
//!
//! `run` starts a 3-member etcd cluster, two gateways and two Envoys with marks in it,
//! a gateway with the file store, and an instrumented store; lock holders (threads,
//! and a few real processes the nemesis can pause) take etcd lease locks and write
//! through them while the nemesis injects faults; then the checker reads the logs.
//! `check DIR` checks a finished run's logs again. `upstream` and `worker` are the
//! store and the process holders' command, started by `run`.
//!
//! # Layout
//!
//! * `system.rs`: what a run starts; `upstream.rs`: the instrumented store.
//! * `lock.rs`: the holders' etcd lock; `client.rs`: the holder threads and one write;
//!   `worker.rs`: holders as processes (`fencekeeper lock` running `worker`).
//! * `nemesis.rs`: the fault table and schedule, snapshots, liveness probes.
//! * `record.rs`: the logs; `check/`: the checker; `svg.rs`, `report.rs`: its output.
//! * `clock.rs`, `rng.rs`: one clock across processes, one seed for a schedule.

mod check;
mod client;
mod clock;
mod lock;
mod nemesis;
mod record;
mod report;
mod stall;
use fencekeeper_harness::rng;
mod svg;
mod system;
mod upstream;
mod worker;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use record::{Group, Log, RunInfo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "fencekeeper-torture", about = "Many lock holders, a nemesis, every write recorded, and a checker.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start everything, run the load and the nemesis, then check.
    Run(RunArgs),
    /// Check a finished run's directory again.
    Check {
        /// The run's directory (its logs).
        dir: PathBuf,
    },
    /// The instrumented store (started by `run`).
    #[command(hide = true)]
    Upstream(upstream::Args),
    /// A process holder's worker (started by `run` under `fencekeeper lock`).
    #[command(hide = true)]
    Worker(worker::Args),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Seconds of load under faults.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The seed of the fault schedule and the clients (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Which targets: a comma list of `gateways` (gw1, gw2 on etcd), `envoys`, `file`
    /// (the file-store gateway), or `all`.
    #[arg(long, default_value = "all")]
    target: String,
    /// Where the logs go (default: a new directory under the temporary directory).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep the load going past `--seconds` until this many writes were sent (at most
    /// `--max-seconds`); fail if fewer were checked.
    #[arg(long, default_value_t = 0)]
    min_writes: u64,
    /// The longest the load may run to reach `--min-writes` (default: twice `--seconds`).
    #[arg(long)]
    max_seconds: Option<u64>,
    /// Only these fault kinds (a comma list; default: the whole table).
    #[arg(long)]
    faults: Option<String>,
    /// Holder threads per resource.
    #[arg(long, default_value_t = 2)]
    holders: usize,
    /// Run the gateways and Envoys with conditional writes in front of an upstream that
    /// honours If-Match, with no store apply bound, no start grace and no ordering gate
    /// in Envoy: every write that lands out of order on a claimed group is then a
    /// violation, whatever its timing.
    #[arg(long)]
    conditional: bool,
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run(args) => run(args),
        Command::Check { dir } => check(&dir),
        Command::Upstream(args) => upstream::run(args).map(|()| true),
        Command::Worker(args) => worker::run(args).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("fencekeeper-torture: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn check(dir: &Path) -> Result<bool> {
    let input = check::load(dir)?;
    let report = check::rules::check(&input);
    report::write(dir, &input, &report)?;
    Ok(report.violations.is_empty())
}

/// The resource groups for the targets running: which targets each writes through,
/// and whether the store-order claim holds for it.
fn groups(targets: &BTreeMap<String, client::Target>) -> Vec<Group> {
    let has = |t: &str| targets.contains_key(t);
    let mut out = Vec::new();
    let mut group = |name: &str, via: &[&str], claims: bool, count: usize| {
        if via.iter().all(|t| has(t)) {
            let resources = (0..count).map(|i| format!("/t/{name}/{i}")).collect();
            let targets = via.iter().map(|s| s.to_string()).collect();
            out.push(Group { name: name.to_owned(), targets, claims_order: claims, resources });
        }
    };
    // Every group claims store order: one host's gate, or the gates of several
    // sharing the in-flight registry in etcd.
    group("pin-gw1", &["gw1"], true, 6);
    group("pin-gw2", &["gw2"], true, 6);
    group("gw-both", &["gw1", "gw2"], true, 4);
    group("envoy", &["envoy1", "envoy2"], true, 6);
    group("mixed", &["gw1", "gw2", "envoy1", "envoy2"], true, 4);
    group("file", &["gwfile"], true, 6);
    group("proc-gw1", &["gw1"], true, 1);
    // Fresh resources the nemesis writes while gwfile's disk is full (each a new key).
    group("fresh", &["gwfile"], true, 0);
    for t in targets.values() {
        let name = format!("probe-{}", t.name);
        out.push(Group {
            name,
            targets: vec![t.name.clone()],
            claims_order: true,
            resources: vec![nemesis::probe_resource(&t.name)],
        });
    }
    out
}

/// Sets the load's stop flags when dropped.
struct StopOnExit<'a>([&'a AtomicBool; 2]);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        for flag in self.0 {
            flag.store(true, Relaxed);
        }
    }
}

fn run(args: RunArgs) -> Result<bool> {
    let seed = args.seed.unwrap_or_else(clock::now);
    println!("torture: seed {seed} (replay its fault schedule with --seed {seed})");
    let parts: Vec<&str> = args.target.split(',').map(str::trim).collect();
    let all = parts.contains(&"all");
    let choice = system::Choice {
        gateways: all || parts.contains(&"gateways"),
        envoys: all || parts.contains(&"envoys"),
        file: all || parts.contains(&"file"),
        conditional: args.conditional,
    };
    let dir = match &args.out {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("fencekeeper-torture-{seed}-{}", std::process::id())),
    };
    // The checker reads every log in the directory: an earlier run's would be judged
    // with this one's (its write ids repeat), so only an empty or new one will do.
    if std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some()) {
        anyhow::bail!("--out {}: the directory is not empty; give a new or empty one", dir.display());
    }
    std::fs::create_dir_all(&dir)?;
    println!("torture: logs in {}", dir.display());
    let started = Instant::now();
    let mut system = system::System::start(&dir, choice, seed).context("starting the services")?;
    eprintln!("torture: services up in {:.1} s", started.elapsed().as_secs_f64());
    let targets: BTreeMap<String, client::Target> = system.targets().into_iter().map(|t| (t.name.clone(), t)).collect();
    let groups = groups(&targets);
    let shared = client::Shared {
        etcd: system.etcd.urls(),
        targets: targets.clone(),
        history: Arc::new(Log::append(&dir.join("history.jsonl"), false)?),
        stop: AtomicBool::new(false),
        issued: client::Issued::default(),
        writes: AtomicU64::new(0),
    };
    let nemesis_log = Log::append(&dir.join("nemesis.jsonl"), true)?;
    let load_start = clock::now();
    let stop_procs = Arc::new(AtomicBool::new(false));
    let outcome = std::thread::scope(|s| -> Result<u64> {
        // However this body ends (an error, a panic in the nemesis), the load stops:
        // the scope waits for every holder before it returns or unwinds.
        let stop_load = StopOnExit([&shared.stop, &*stop_procs]);
        let mut index = 0;
        let mut holders = Vec::new();
        for g in groups.iter().filter(|g| !g.name.starts_with("probe-") && !g.name.starts_with("proc-")) {
            for _ in 0..g.resources.len() * args.holders {
                let (shared, g) = (&shared, g);
                holders.push(s.spawn(move || client::run(shared, g, index, seed)));
                index += 1;
            }
        }
        let pool = match groups.iter().find(|g| g.name == "proc-gw1") {
            Some(g) => {
                Some(worker::Pool::start(g, &targets[&g.targets[0]], &shared.etcd, dir.clone(), stop_procs.clone())?)
            }
            None => None,
        };
        let watch_etcd = lock::Etcd::new(&shared.etcd, 1)?;
        let (shared_ref, log_ref) = (&shared, &nemesis_log);
        let watch = s.spawn(move || {
            let shared = shared_ref;
            let all: Vec<String> = shared.targets.keys().cloned().collect();
            let etcd_targets: Vec<String> = all.iter().filter(|t| system::marks_in_etcd(t)).cloned().collect();
            let lingers = system::APPLY_BOUND + system::GATE_TIMEOUT;
            stall::watch(&watch_etcd, log_ref, &shared.stop, &etcd_targets, &all, lingers, load_start)
        });
        let progress = s.spawn(|| {
            let begun = Instant::now();
            while !shared.stop.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(250));
                if begun.elapsed().as_secs().is_multiple_of(15) && begun.elapsed().subsec_millis() < 250 {
                    let n = shared.writes.load(Relaxed);
                    eprintln!("torture: {n} writes, {:.0}/s", n as f64 / begun.elapsed().as_secs_f64());
                }
            }
        });
        let mut nemesis = nemesis::Nemesis {
            system: &mut system,
            shared: &shared,
            pool: pool.as_ref(),
            groups: &groups,
            log: &nemesis_log,
            rng: rng::Rng::new(seed, 0),
            etcd: lock::Etcd::new(&shared.etcd, 2)?,
            agent: client::agent(),
            n: 0,
            kinds: match &args.faults {
                Some(list) => list.split(',').map(|k| k.trim().to_owned()).collect(),
                None => nemesis::KINDS.iter().map(|k| k.to_string()).collect(),
            },
            load_start,
        };
        let begun = Instant::now();
        let hard = begun + Duration::from_secs(args.max_seconds.unwrap_or(2 * args.seconds).max(args.seconds));
        let enough = || {
            let now = Instant::now();
            now >= hard
                || now >= begun + Duration::from_secs(args.seconds) && shared.writes.load(Relaxed) >= args.min_writes
        };
        let faults = nemesis.run(&enough);
        if faults.is_ok() {
            while !enough() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        drop(stop_load);
        if let Some(pool) = &pool {
            pool.join();
        }
        // Every write has ended before the marks are read back for the last time.
        for h in holders {
            let _ = h.join();
        }
        let _ = progress.join();
        let _ = watch.join();
        let faults = faults?;
        nemesis.snapshots(None)?;
        Ok(faults)
    });
    let load_end = clock::now();
    shared.history.flush()?;
    let faults = outcome?;
    let info = RunInfo {
        seed,
        seconds: args.seconds,
        groups: groups.clone(),
        targets: targets.keys().map(|t| (t.clone(), system::marks_in_etcd(t))).collect(),
        liveness_bound_ms: nemesis::LIVENESS_BOUND.as_millis() as u64,
        start_grace_ms: if args.conditional { 0 } else { system::START_GRACE.as_millis() as u64 },
        apply_bound_ms: system::apply_bound(choice).as_millis() as u64,
        conditional: args.conditional,
        start: load_start,
        end: load_end,
    };
    std::fs::write(dir.join("run.json"), serde_json::to_vec_pretty(&info)?)?;
    drop(system);
    eprintln!("torture: {faults} faults injected; checking");
    let clean = check(&dir)?;
    let writes = check::load(&dir)?.writes.len() as u64;
    if writes < args.min_writes {
        println!("torture: only {writes} writes checked, fewer than --min-writes {}", args.min_writes);
        return Ok(false);
    }
    Ok(clean)
}
