//! A worker of the scenario: acquire the lock, then import the records one write
//! each, sending the lock's token with every write. It never checks its lease again,
//! like a real client that does not know it was paused. It reports progress on stdout,
//! one line per event, for the orchestrator to read.

use super::lock::Etcd;
use anyhow::Result;
use std::io::Write;
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
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(10))).build(),
    );
    let token = held.token.to_string();
    for i in 0..job.records {
        let record = format!("record {i} imported by {} holding token {token}\n", job.name);
        let url = format!("{}{}record-{i:03}", job.target, job.prefix);
        writeln!(out, "sending {i}")?;
        out.flush()?;
        let status = match agent.put(&url).header("fencing-token", &token).send(record) {
            Ok(response) => response.status().as_u16(),
            Err(_) => 0,
        };
        writeln!(out, "wrote {i} {status}")?;
        out.flush()?;
        std::thread::sleep(job.pace);
    }
    etcd.release(&held);
    writeln!(out, "done")?;
    Ok(())
}
