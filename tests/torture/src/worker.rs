//! Lock holders as real processes, for the faults that pause or kill a client:
//! `fencekeeper lock --etcd MEMBER --ttl 2 NAME -- fencekeeper-torture worker ...`.
//! The lock client keeps the lease and hands the token to the worker in
//! `FENCING_TOKEN`; the worker writes with it through one target until it has written
//! enough or is told the lock was lost (SIGTERM), recording every write with a line
//! before it is sent and one after (a worker killed mid-write leaves a pending write,
//! which the checker treats as unknown).
//!
//! A [`Pool`] keeps two contenders per resource, so that when the nemesis freezes the
//! holder past its lease, the other one takes the lock and writes.

use crate::client::{self, lock_name, Target};
use crate::record::{Group, Kind, Log};
use anyhow::{Context, Result};
use fencekeeper_harness::holder::Holder;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Arguments of `fencekeeper-torture worker`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The target's URL.
    #[arg(long)]
    url: String,
    /// The target's name.
    #[arg(long)]
    target: String,
    /// The resource's group.
    #[arg(long)]
    group: String,
    /// The history file (appended, line by line).
    #[arg(long)]
    history: PathBuf,
    /// This worker's name (write ids start with it).
    #[arg(long)]
    name: String,
    /// Writes before it exits (releasing the lock).
    #[arg(long, default_value_t = 40)]
    writes: u64,
}

/// Write with `FENCING_TOKEN` until done or SIGTERM (which ends the process).
pub fn run(args: Args) -> Result<()> {
    let token = std::env::var("FENCING_TOKEN").context("no FENCING_TOKEN")?;
    let resource = std::env::var("FENCING_RESOURCE").context("no FENCING_RESOURCE")?;
    println!("holding {token} pid {}", std::process::id());
    let history = Log::append(&args.history, true)?;
    let target = Target { name: args.target.clone(), url: args.url.clone(), envoy: args.target.starts_with("envoy") };
    let agent = client::agent();
    for n in 0..args.writes {
        let id = format!("{}-{n}", args.name);
        let what = |id: String| client::Send {
            id,
            client: &args.name,
            group: &args.group,
            resource: &resource,
            kind: Kind::Valid,
            token: Some(token.clone()),
            fault: None,
        };
        let mut pending = client::send_record(&target, what(id.clone()));
        pending.end = u64::MAX;
        history.write(&pending)?;
        let write = client::send(&agent, &target, what(id));
        history.write(&write)?;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// One contender slot: the holder running now, if it holds the lock.
#[derive(Default)]
pub struct Slot {
    /// (lock client pid, worker pid) while it holds.
    pub holding: Option<(u32, u32)>,
    /// Holders that acquired in this slot.
    pub acquired: u64,
}

/// The process holders: two slots per resource of the group.
pub struct Pool {
    /// The slots, two per resource (`2r` and `2r + 1` contend on resource `r`).
    pub slots: Vec<Arc<Mutex<Slot>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Pool {
    /// Start the slots' threads; they respawn holders until `stop`.
    pub fn start(group: &Group, target: &Target, etcd: &[String], dir: PathBuf, stop: Arc<AtomicBool>) -> Result<Pool> {
        let fencekeeper = fencekeeper_harness::workspace_bin("fencekeeper")?;
        let me = std::env::current_exe()?;
        let mut slots = Vec::new();
        let mut threads = Vec::new();
        let generation = Arc::new(AtomicU64::new(0));
        for (r, resource) in group.resources.iter().enumerate() {
            for k in 0..2 {
                let slot: Arc<Mutex<Slot>> = Arc::default();
                slots.push(slot.clone());
                let (stop, generation, dir) = (stop.clone(), generation.clone(), dir.clone());
                let (fencekeeper, me, etcd) = (fencekeeper.clone(), me.clone(), etcd.to_vec());
                let (resource, group, target) = (resource.clone(), group.name.clone(), target.clone());
                threads.push(std::thread::spawn(move || {
                    let mut member = 2 * r + k;
                    while !stop.load(Relaxed) {
                        member += 1;
                        let g = generation.fetch_add(1, Relaxed);
                        let name = format!("proc{r}.{k}.{g}");
                        let mut cmd = Command::new(&fencekeeper);
                        cmd.arg("lock")
                            .args(["--etcd", &etcd[member % etcd.len()], "--ttl", &client::TTL.to_string()])
                            .args(["--wait", "20", "--resource", &resource, &lock_name(&resource), "--"])
                            .arg(&me)
                            .args(["worker", "--url", &target.url, "--target", &target.name, "--group", &group])
                            .arg("--history")
                            .arg(dir.join(format!("history-{name}.jsonl")))
                            .args(["--name", &name]);
                        let Ok(mut holder) = Holder::spawn(&name, cmd) else { break };
                        if holder.acquired(Duration::from_secs(25)).is_ok() {
                            let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
                            s.holding = Some((holder.child.id(), holder.worker));
                            s.acquired += 1;
                        }
                        while !stop.load(Relaxed) && matches!(holder.child.try_wait(), Ok(None)) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        slot.lock().unwrap_or_else(|p| p.into_inner()).holding = None;
                        // Dropping the holder kills what is left of it.
                        drop(holder);
                    }
                }));
            }
        }
        Ok(Pool { slots, threads: Mutex::new(threads) })
    }

    /// Wait for the slots' threads (after `stop` was set).
    pub fn join(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}
