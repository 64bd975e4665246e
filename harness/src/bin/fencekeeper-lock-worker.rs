//! `fencekeeper-lock-worker`: the COMMAND a lock client runs in the token tests
//! (tests/tests/all/e2e_tokens_*.rs), whichever client it is (`fencekeeper lock`,
//! `etcdctl lock`, kazoo, redis-cli).
//!
//! It takes its fencing token from the environment (`FENCING_TOKEN`, or the variable
//! named by `--token-from`, such as etcdctl's `ETCD_LOCK_REV`) and writes twice to the
//! same resource through the gateway, sending the token each time: once at once, and
//! once more after the file named by `FK_WORKER_GO` appears. Between the two, the test
//! may pause it (and its lock client) past the lease. One stdout line per event:
//! `holding TOKEN pid PID`, `wrote STATUS`, `wrote STATUS`.
//!
//! With a `redis://HOST:PORT` target it writes to a Redis with the Fencekeeper module
//! instead: `FENCE.SET RESOURCE fence:RESOURCE TOKEN BODY` (the data at the
//! resource's path, its mark beside it), and reports the refusal contract's HTTP
//! status for the answer: 204 for OK, 409 for STALE or REPLAYED, 428 MISSING, 400
//! MALFORMED, 403 UNVERIFIED, 503 UNDECIDED, 500 for any other error. With
//! `--plain` it writes a plain `SET RESOURCE BODY` instead: the control, unfenced.
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
    /// The gateway, `http://HOST:PORT`, or a Redis with the module, `redis://HOST:PORT`.
    #[arg(long)]
    target: String,
    /// The resource path; by default FENCING_RESOURCE.
    #[arg(long)]
    resource: Option<String>,
    /// The variable that holds the token.
    #[arg(long, default_value = "FENCING_TOKEN")]
    token_from: String,
    /// With a `redis://` target: write with a plain SET, without fencing (the control).
    #[arg(long)]
    plain: bool,
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
    let resource = match args.resource.clone() {
        Some(resource) => resource,
        None => std::env::var("FENCING_RESOURCE").context("no --resource and no FENCING_RESOURCE")?,
    };
    let go = PathBuf::from(std::env::var_os("FK_WORKER_GO").context("no FK_WORKER_GO")?);
    report(&format!("holding {token} pid {}", std::process::id()))?;
    if let Some(redis) = args.target.strip_prefix("redis://") {
        return write_to_redis(redis, &resource, &token, &args, &go);
    }
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

/// The two writes, to Redis through `FENCE.SET`.
fn write_to_redis(address: &str, resource: &str, token: &str, args: &Args, go: &std::path::Path) -> Result<()> {
    let mut redis = fencekeeper_harness::resp::Client::connect(address.parse()?)?;
    let mark = format!("fence:{resource}");
    for (write, wait) in [("first", false), ("second", true)] {
        if wait {
            await_go(go)?;
        }
        let body = format!("{} wrote its {write} write with token {token}\n", args.name);
        let command = match args.plain {
            true => vec!["SET", resource, &body],
            false => vec!["FENCE.SET", resource, &mark, token, &body],
        };
        let status = match redis.cmd(&command) {
            Ok(fencekeeper_harness::resp::Reply::Status(_)) => 204,
            Ok(reply) => match reply.error().and_then(|e| e.split(' ').next()) {
                Some("STALE" | "REPLAYED") => 409,
                Some("MISSING") => 428,
                Some("MALFORMED") => 400,
                Some("UNVERIFIED") => 403,
                Some("UNDECIDED") => 503,
                _ => 500,
            },
            Err(_) => 0,
        };
        report(&format!("wrote {status}"))?;
    }
    Ok(())
}
