//! `fencekeeper-pg-importer`: the importer of the PostgreSQL import story
//! (tests/tests/all/postgres_import.rs), run by a lock client (`fencekeeper lock`) with
//! its fencing token in `FENCING_TOKEN`.
//!
//! It imports the lines of one batch into a table, one INSERT each, carrying its
//! token in the row. Like a real importer that resumes an interrupted import, it
//! starts after the last line already imported; then it keeps its own count, as a
//! process paused mid-import would. After `--pause-after` lines it waits for the
//! file named by `FK_WORKER_GO` (the test pauses it there). With `--amend` it then
//! amends each line of its run, as a tool that never heard of the token column would:
//! `UPDATE ... SET importer = NAME` for the line, the token column left as it is. One
//! stdout line per event: `holding TOKEN pid PID`, then per line and per amend
//! `wrote 201` (written), `wrote 409` (refused as stale or replayed), `wrote 428`
//! (refused as missing its token) or `wrote 500` (any other error).
//!
//! Exit codes: 0 after its lines (whatever they were answered), 2 on an error.

use anyhow::{Context, Result};
use clap::Parser;
use fencekeeper_harness::holder::{await_go, report};
use fencekeeper_harness::pg_wire::{literal, Client};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Import a batch's lines into a PostgreSQL table with the lock's token.
#[derive(Parser)]
#[command(name = "fencekeeper-pg-importer")]
struct Args {
    /// The server, `127.0.0.1:PORT`.
    #[arg(long)]
    postgres: std::net::SocketAddr,
    /// The role to connect as.
    #[arg(long)]
    user: String,
    /// The table: columns batch, line, importer, token.
    #[arg(long)]
    table: String,
    /// The batch (the fenced resource).
    #[arg(long)]
    batch: String,
    /// Lines in the batch.
    #[arg(long)]
    lines: u32,
    /// Wait for FK_WORKER_GO after this many lines of this run.
    #[arg(long)]
    pause_after: u32,
    /// After its lines, amend each line of its run without setting the token column.
    #[arg(long)]
    amend: bool,
    /// The importer's name, written into its rows.
    name: String,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencekeeper-pg-importer: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<()> {
    let token = std::env::var("FENCING_TOKEN").context("no FENCING_TOKEN")?;
    let go = PathBuf::from(std::env::var_os("FK_WORKER_GO").context("no FK_WORKER_GO")?);
    report(&format!("holding {token} pid {}", std::process::id()))?;
    let mut db = Client::connect(args.postgres, &args.user, "postgres")?;
    let (table, batch) = (&args.table, literal(&args.batch));
    let resume = db.value(format!("SELECT coalesce(max(line) + 1, 0) FROM {table} WHERE batch = {batch}"))?;
    let first: u32 = resume.context("no resume point")?.parse()?;
    for (written, line) in (first..args.lines).enumerate() {
        if written == args.pause_after as usize {
            await_go(&go)?;
        }
        let insert = format!(
            "INSERT INTO {table} (batch, line, importer, token) VALUES ({batch}, {line}, {}, {})",
            literal(&args.name),
            literal(&token)
        );
        report(&format!("wrote {}", status(&mut db, line, insert)))?;
        std::thread::sleep(Duration::from_millis(10));
    }
    if args.amend {
        for line in first..args.lines {
            let amend = format!(
                "UPDATE {table} SET importer = {} WHERE batch = {batch} AND line = {line}",
                literal(&args.name)
            );
            report(&format!("wrote {}", status(&mut db, line, amend)))?;
        }
    }
    Ok(())
}

/// Run `sql`, the write of `line`, and say how it was answered, as HTTP would.
fn status(db: &mut Client, line: u32, sql: String) -> u16 {
    match db.query(sql) {
        Ok(_) => 201,
        Err(e) if matches!(e.code(), Some("FK001" | "FK002")) => 409,
        Err(e) if e.code() == Some("FK003") => 428,
        Err(e) => {
            eprintln!("line {line}: {e}");
            500
        }
    }
}
