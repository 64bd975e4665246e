//! `fencekeeper-pg-bench`: what the extension costs a backend, for
//! scripts/bench-postgres.sh. Against a running server with the extension created:
//!
//! * `first-call`: on `--connections` new connections each, the time of the first
//!   `fencekeeper.admit` (the library loads, the guest is compiled or inherited,
//!   the conformance vectors run, an instance starts), of the second, and of a
//!   `SELECT 1` beside them; and the backend's memory (VmRSS, and its private pages
//!   from smaps_rollup) before and after.
//! * `steady`: `--calls` admits of a token equal to the mark on one connection, and
//!   as many `SELECT 1`, the median of each round trip.
//!
//! Prints one `name value unit` line per measurement (medians), for the script to tabulate.

use anyhow::{Context, Result};
use clap::Parser;
use fencekeeper_harness::pg_wire::Client;
use std::net::SocketAddr;
use std::time::Instant;

/// Measure the extension's first call and steady-state call.
#[derive(Parser)]
#[command(name = "fencekeeper-pg-bench")]
struct Args {
    /// `first-call` or `steady`.
    what: String,
    /// The server, `127.0.0.1:PORT`.
    #[arg(long)]
    postgres: SocketAddr,
    /// The role to connect as.
    #[arg(long)]
    user: String,
    /// New connections to measure (`first-call`).
    #[arg(long, default_value_t = 20)]
    connections: usize,
    /// Calls to measure (`steady`).
    #[arg(long, default_value_t = 20_000)]
    calls: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    match args.what.as_str() {
        "first-call" => first_call(&args),
        "steady" => steady(&args),
        other => anyhow::bail!("unknown measurement {other:?}: first-call or steady"),
    }
}

fn micros(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// (VmRSS, private bytes) of a process, in KiB.
fn memory(pid: u32) -> Result<(f64, f64)> {
    let field = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading a backend's status")?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let private = field(&rollup, "Private_Clean:") + field(&rollup, "Private_Dirty:");
    Ok((field(&status, "VmRSS:"), private))
}

fn first_call(args: &Args) -> Result<()> {
    let (mut first, mut second, mut select) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rss, mut private) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for i in 0..args.connections {
        let mut c = Client::connect(args.postgres, &args.user, "postgres")?;
        let started = Instant::now();
        c.query("SELECT 1")?;
        select.push(micros(started));
        let before = memory(c.backend_pid)?;
        let started = Instant::now();
        c.query(format!("SELECT fencekeeper.admit('first-call/{i}', '1')"))?;
        first.push(micros(started));
        let started = Instant::now();
        c.query(format!("SELECT fencekeeper.admit('first-call/{i}', '1')"))?;
        second.push(micros(started));
        let after = memory(c.backend_pid)?;
        rss.0.push(before.0);
        rss.1.push(after.0);
        private.0.push(before.1);
        private.1.push(after.1);
    }
    println!("select_1_on_a_new_connection {:.0} us", median(select));
    println!("first_admit {:.0} us", median(first));
    println!("second_admit {:.0} us", median(second));
    println!("rss_before {:.0} KiB", median(rss.0));
    println!("rss_after {:.0} KiB", median(rss.1));
    println!("private_before {:.0} KiB", median(private.0));
    println!("private_after {:.0} KiB", median(private.1));
    Ok(())
}

fn steady(args: &Args) -> Result<()> {
    let mut c = Client::connect(args.postgres, &args.user, "postgres")?;
    c.query("SELECT fencekeeper.admit('steady', '1')")?;
    let (mut admit, mut select) = (Vec::with_capacity(args.calls), Vec::with_capacity(args.calls));
    for _ in 0..args.calls {
        let started = Instant::now();
        c.query("SELECT fencekeeper.admit('steady', '1')")?;
        admit.push(micros(started));
        let started = Instant::now();
        c.query("SELECT 1")?;
        select.push(micros(started));
    }
    println!("steady_admit {:.1} us", median(admit));
    println!("steady_select_1 {:.1} us", median(select));
    Ok(())
}
