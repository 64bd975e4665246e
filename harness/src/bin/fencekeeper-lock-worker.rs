//! `fencekeeper-lock-worker`: the COMMAND a lock client runs in the token tests
//! (tests/tests/e2e_tokens_*.rs), whichever client it is (`fencekeeper lock`,
//! `etcdctl lock`, kazoo, redis-cli).
//!
//! It takes its fencing token from the environment (`FENCING_TOKEN`, or the variable
//! named by `--token-from`, such as etcdctl's `ETCD_LOCK_REV`) and writes twice to the
//! same resource through the gateway, sending the token each time: once at once, and
//! once more after the file named by `FK_WORKER_GO` appears. Between the two, the test
//! may pause it (and its lock client) past the lease. One stdout line per event:
//! `holding TOKEN pid PID`, `wrote STATUS`, `wrote STATUS`.
//!
//! Exit codes: 0 after both writes (whatever they were answered), 2 on an error.

use anyhow::{Context, Result};
use clap::Parser;
use fencekeeper_harness::holder::{await_go, report};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Write to one resource through the gateway with the lock's token, twice.
#[derive(Parser)]
#[command(name = "fencekeeper-lock-worker")]
struct Args {
    /// The gateway, `http://HOST:PORT`.
    #[arg(long)]
    target: String,
    /// The resource path; by default FENCING_RESOURCE.
    #[arg(long)]
    resource: Option<String>,
    /// The variable that holds the token.
    #[arg(long, default_value = "FENCING_TOKEN")]
    token_from: String,
    /// The worker's name, written into what it stores.
    name: String,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencekeeper-lock-worker: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<()> {
    let token = std::env::var(&args.token_from).with_context(|| format!("no token in {}", args.token_from))?;
    let resource = match args.resource {
        Some(resource) => resource,
        None => std::env::var("FENCING_RESOURCE").context("no --resource and no FENCING_RESOURCE")?,
    };
    let go = PathBuf::from(std::env::var_os("FK_WORKER_GO").context("no FK_WORKER_GO")?);
    report(&format!("holding {token} pid {}", std::process::id()))?;
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(10))).build(),
    );
    let url = format!("{}{resource}", args.target);
    for (write, wait) in [("first", false), ("second", true)] {
        if wait {
            await_go(&go)?;
        }
        let body = format!("{} wrote its {write} write with token {token}\n", args.name);
        let status = agent.put(&url).header("fencing-token", &token).send(body).map(|r| r.status().as_u16());
        report(&format!("wrote {}", status.unwrap_or(0)))?;
    }
    Ok(())
}
