//! `fencekeeper-demo`: the lock-and-pause scenario, with real processes.
//!
//! etcd is the lock service (a lease lock; the token is the lock key's revision), nginx
//! with WebDAV is a store that accepts any write. Two worker processes import the same
//! records, one `curl -X PUT` each, the lock's token in a header. Worker 1 acquires, writes a few records and is paused with
//! SIGSTOP past its lease; worker 2 acquires (a higher token) and imports everything;
//! worker 1 is resumed with SIGCONT and keeps writing with its old token. The scenario
//! runs twice: straight to nginx, then through `fencekeeper serve`; a table compares.
//!
//! The services are the harness's, as the tests start them; the gateway is the
//! `fencekeeper` binary beside this one (`scripts/demo.sh` builds both). The workers
//! are this binary too (`fencekeeper-demo --worker NAME ...`, hidden).
//!
//! Exit codes: 0 when no stale write landed through the gateway, 1 when one did, 2 on
//! an error (printed whole, once).

mod lock;
mod worker;

use anyhow::{bail, Context, Result};
use clap::Parser;
use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::services::{Etcd, NginxDav, WorkDir};
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

/// Two workers import the same records under an etcd lease lock; one is paused past
/// its lease. Runs the story straight to the store, then through the gateway.
#[derive(Parser)]
#[command(name = "fencekeeper-demo", version)]
struct Args {
    /// Records each worker imports.
    #[arg(long, default_value_t = 24)]
    records: usize,
    /// Pause worker 1 after this many records.
    #[arg(long, default_value_t = 8)]
    pause_after: usize,
    /// The lock's lease TTL, seconds (etcd's shortest is about 2).
    #[arg(long, default_value_t = 2)]
    ttl: u64,
    /// Keep the services' files and logs in this directory (default: a temporary one, removed).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Print the result as JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[arg(long, hide = true)]
    worker: Option<String>,
    #[arg(long, hide = true)]
    etcd: Option<String>,
    #[arg(long, hide = true)]
    target: Option<String>,
    #[arg(long, hide = true)]
    prefix: Option<String>,
    #[arg(long, hide = true, default_value_t = 25)]
    pace_ms: u64,
}

/// What one run of the scenario did.
#[derive(Serialize)]
struct Run {
    /// Worker 1's token (the paused holder).
    token_1: u64,
    /// Worker 2's token (the new holder).
    token_2: u64,
    /// Worker 1's writes after it was resumed that the target accepted (2xx).
    stale_accepted: usize,
    /// Worker 1's writes after it was resumed that the target refused with 409.
    stale_refused: usize,
    /// Records whose final content was written by worker 1 after worker 2's import.
    stale_landed: usize,
    /// The gateway's stale refusals from its /metrics (None without the gateway).
    gateway_refusals: Option<u64>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencekeeper-demo: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<ExitCode> {
    if let Some(name) = &args.worker {
        let job = worker::Job {
            name: name.clone(),
            etcd: args.etcd.clone().context("--etcd")?,
            target: args.target.clone().context("--target")?,
            prefix: args.prefix.clone().context("--prefix")?,
            records: args.records,
            ttl: args.ttl,
            pace: Duration::from_millis(args.pace_ms),
        };
        worker::run(&job)?;
        return Ok(ExitCode::SUCCESS);
    }
    anyhow::ensure!(args.pause_after < args.records, "--pause-after must be below --records");
    let (dir, keep) = match &args.work_dir {
        Some(d) => (d.clone(), true),
        None => (std::env::temp_dir().join(format!("fencekeeper-demo-{}", std::process::id())), false),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = scenario_pair(&args, &dir);
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (without, with) = result?;
    if args.json {
        println!("{}", serde_json::json!({ "without_fencing": without, "with_gateway": with }));
    } else {
        print_table(&args, &without, &with);
    }
    Ok(if with.stale_landed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn scenario_pair(args: &Args, dir: &Path) -> Result<(Run, Run)> {
    eprintln!("starting etcd, nginx (WebDAV) and the gateway under {}", dir.display());
    let etcd = Etcd::start_in(WorkDir::kept(dir)?)?;
    let nginx = NginxDav::start_in(WorkDir::kept(dir)?)?;
    let gateway = Gateway::start_in(WorkDir::kept(dir)?, dir.join("marks.redb"), &nginx.url(), &[])
        .context("starting the gateway from the fencekeeper binary beside this one (scripts/demo.sh builds both)")?;
    eprintln!("run 1: workers write straight to nginx at {}", nginx.url());
    let without = scenario(args, &etcd.url(), &nginx.url(), "/plain/", &nginx.root)?;
    eprintln!("run 2: workers write through the gateway at {}", gateway.url());
    let mut with = scenario(args, &etcd.url(), &gateway.url(), "/fenced/", &nginx.root)?;
    with.gateway_refusals = Some(gateway.metric("fencekeeper_gateway_requests_total{class=\"stale\"}")?);
    Ok((without, with))
}

fn scenario(args: &Args, etcd: &str, target: &str, prefix: &str, root: &Path) -> Result<Run> {
    let mut one = Worker::spawn(args, "worker-1", etcd, target, prefix)?;
    let token_1 = one.acquired()?;
    let mut written = 0;
    while written < args.pause_after {
        if let Event::Wrote(..) = one.event()? {
            written += 1;
        }
    }
    signal(&one.child, "STOP")?;
    eprintln!("  worker-1 (token {token_1}) paused with SIGSTOP after {written} records");
    let mut two = Worker::spawn(args, "worker-2", etcd, target, prefix)?;
    let token_2 = two.acquired()?;
    eprintln!("  worker-1's lease expired; worker-2 acquired token {token_2} and imports");
    while two.event()? != Event::Done {}
    // What worker 1 reported before it stopped (the reader thread has had seconds to
    // pass it on): a write sent but not answered when it stopped went out with a valid
    // lease, so it is not counted as stale.
    let mut in_flight = None;
    for event in one.drain() {
        match event {
            Event::Sending(i) => in_flight = Some(i),
            Event::Wrote(i, _) if in_flight == Some(i) => in_flight = None,
            _ => {}
        }
    }
    signal(&one.child, "CONT")?;
    eprintln!("  worker-1 resumed with SIGCONT; it keeps writing with token {token_1}");
    let (mut stale_accepted, mut stale_refused) = (0, 0);
    loop {
        match one.event()? {
            Event::Wrote(i, _) if in_flight == Some(i) => {}
            Event::Wrote(_, 200..=299) => stale_accepted += 1,
            Event::Wrote(_, 409) => stale_refused += 1,
            Event::Done => break,
            _ => {}
        }
    }
    let stale_landed = (0..args.records)
        .filter(|i| {
            let file = root.join(prefix.trim_matches('/')).join(format!("record-{i:03}"));
            std::fs::read_to_string(file).is_ok_and(|text| text.contains("worker-1"))
        })
        .count();
    Ok(Run { token_1, token_2, stale_accepted, stale_refused, stale_landed, gateway_refusals: None })
}

/// One line of a worker's progress.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    Acquired(u64),
    Sending(usize),
    Wrote(usize, u16),
    Done,
}

fn parse_event(line: &str) -> Option<Event> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["acquired", token] => Some(Event::Acquired(token.parse().ok()?)),
        ["sending", i] => Some(Event::Sending(i.parse().ok()?)),
        ["wrote", i, status] => Some(Event::Wrote(i.parse().ok()?, status.parse().ok()?)),
        ["done"] => Some(Event::Done),
        _ => None,
    }
}

/// A worker process and its progress lines.
struct Worker {
    child: Child,
    lines: Receiver<String>,
    name: &'static str,
}

impl Worker {
    fn spawn(args: &Args, name: &'static str, etcd: &str, target: &str, prefix: &str) -> Result<Worker> {
        // A process group of its own: SIGSTOP pauses the worker and the curl it runs.
        let mut child = Command::new(std::env::current_exe()?)
            .process_group(0)
            .args(["--worker", name, "--etcd", etcd, "--target", target, "--prefix", prefix])
            .args(["--records", &args.records.to_string(), "--ttl", &args.ttl.to_string()])
            .args(["--pace-ms", &args.pace_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker { child, lines, name })
    }

    /// The next event; bounded: worker 2 waits for worker 1's lease (seconds), never longer.
    fn event(&mut self) -> Result<Event> {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .with_context(|| format!("{} stopped reporting", self.name))?;
        parse_event(&line).with_context(|| format!("{}: unexpected line {line:?}", self.name))
    }

    /// The events already reported, without waiting.
    fn drain(&mut self) -> Vec<Event> {
        self.lines.try_iter().filter_map(|line| parse_event(&line)).collect()
    }

    fn acquired(&mut self) -> Result<u64> {
        match self.event()? {
            Event::Acquired(token) => Ok(token),
            other => bail!("{}: expected `acquired`, got {other:?}", self.name),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The group: a curl of a worker that was still paused goes too.
        let _ = signal(&self.child, "KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Signal the worker's process group (the worker and the curl it may be running).
fn signal(child: &Child, name: &str) -> Result<()> {
    let status = Command::new("kill").arg(format!("-{name}")).arg("--").arg(format!("-{}", child.id())).status()?;
    anyhow::ensure!(status.success(), "kill -{name} failed");
    Ok(())
}

fn print_table(args: &Args, without: &Run, with: &Run) {
    println!(
        "\nTwo workers import {} records. Worker 1 is paused (SIGSTOP) after {} of them, past its {} s lease;\n\
         worker 2 acquires a newer token and imports; worker 1 resumes (SIGCONT) with its old token.\n",
        args.records, args.pause_after, args.ttl
    );
    let gateway = |r: &Run| r.gateway_refusals.map_or("-".to_owned(), |n| n.to_string());
    let rows: [(&str, String, String); 6] = [
        ("token of worker 1 (paused)", without.token_1.to_string(), with.token_1.to_string()),
        ("token of worker 2", without.token_2.to_string(), with.token_2.to_string()),
        ("stale writes accepted", without.stale_accepted.to_string(), with.stale_accepted.to_string()),
        ("records left holding stale data", without.stale_landed.to_string(), with.stale_landed.to_string()),
        ("stale writes refused (409)", without.stale_refused.to_string(), with.stale_refused.to_string()),
        ("gateway stale refusals (/metrics)", gateway(without), gateway(with)),
    ];
    println!("{:<36}{:>18}{:>22}", "", "without fencing", "through the gateway");
    for (label, a, b) in rows {
        println!("{label:<36}{a:>18}{b:>22}");
    }
}
