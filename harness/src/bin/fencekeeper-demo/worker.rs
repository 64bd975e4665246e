//! A worker of the scenario: acquire the lock, then import the records one write
//! each with curl, a real HTTP client, sending the lock's token with every write
//! (`curl -X PUT -H "fencing-token: T"`). It never checks its lease again, like a
//! real client that does not know it was paused. It reports progress on stdout, one
//! line per event, for the orchestrator to read. The orchestrator pauses the worker's
//! whole process group, so a curl under way is paused with it.

use super::lock::Etcd;
use anyhow::{Context, Result};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// What one worker does.
pub struct Job {
    /// The worker's name, written into every record.
    pub name: String,
    /// etcd's URL (the lock service).
    pub etcd: String,
    /// Where writes go: the store itself, or the gateway in front of it.
    pub target: String,
    /// The path prefix records are written under.
    pub prefix: String,
    /// How many records to import.
    pub records: usize,
    /// The lease TTL, seconds.
    pub ttl: u64,
    /// The pause between two writes.
    pub pace: Duration,
}

/// Run the job; one stdout line per event: `acquired T`, `sending I`, `wrote I STATUS`, `done`.
pub fn run(job: &Job) -> Result<()> {
    let etcd = Etcd::new(&job.etcd)?;
    let held = etcd.acquire(&format!("/demo/lock{}", job.prefix), &job.name, job.ttl, Duration::from_secs(60))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "acquired {}", held.token)?;
    out.flush()?;
    let token = held.token.to_string();
    for i in 0..job.records {
        let record = format!("record {i} imported by {} holding token {token}\n", job.name);
        let url = format!("{}{}record-{i:03}", job.target, job.prefix);
        writeln!(out, "sending {i}")?;
        out.flush()?;
        let status = put(&url, &token, &record)?;
        writeln!(out, "wrote {i} {status}")?;
        out.flush()?;
        std::thread::sleep(job.pace);
    }
    etcd.release(&held);
    writeln!(out, "done")?;
    Ok(())
}

/// `curl -X PUT` of `record` to `url` with the token: the answer's status, 0 when
/// none came (curl prints `000`).
fn put(url: &str, token: &str, record: &str) -> Result<u16> {
    let mut curl = Command::new("curl")
        .args(["--silent", "--show-error", "--output", "/dev/null", "--write-out", "%{http_code}"])
        .args(["--max-time", "10", "--request", "PUT", "--data-binary", "@-"])
        .args(["--header", &format!("fencing-token: {token}"), url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("running curl (scripts/install-deps.sh installs it)")?;
    curl.stdin.take().context("curl's stdin")?.write_all(record.as_bytes())?;
    let out = curl.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0))
}
