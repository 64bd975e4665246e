//! The checker. It reads only the logs a run wrote (record.rs: the clients' history,
//! the store's log, the nemesis's log, the run's shape) into the shared checker's
//! [`Input`], whose rules (`fencekeeper_check::rules`, five of them) judge it; it shares
//! no state and no code path with what it checks.

pub use fencekeeper_check::{classify, rules, Class, Input};

use crate::record::{read_lines, Event, RunInfo, Write};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Read a run's directory.
pub fn load(dir: &Path) -> Result<Input> {
    let info: RunInfo = serde_json::from_slice(&std::fs::read(dir.join("run.json")).context("run.json")?)?;
    let mut by_id: BTreeMap<String, Write> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if name.starts_with("history") && name.ends_with(".jsonl") {
            for w in read_lines::<Write>(&path)? {
                by_id.insert(w.id.clone(), w);
            }
        }
    }
    let mut writes: Vec<Write> = by_id.into_values().collect();
    writes.sort_by_key(|w| w.start);
    let mut landed: Vec<crate::record::Landed> = read_lines(&dir.join("store.jsonl"))?;
    landed.sort_by_key(|l| l.seq);
    let (mut faults, mut snapshots) = (Vec::new(), Vec::new());
    for event in read_lines::<Event>(&dir.join("nemesis.jsonl"))? {
        match event {
            Event::Fault(f) => faults.push(f),
            Event::Snapshot(s) => snapshots.push(s),
        }
    }
    Ok(Input { info, writes, landed, faults, snapshots })
}
