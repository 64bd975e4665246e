//! The checker. It reads only the logs a run wrote (record.rs: the clients' history,
//! the store's log, the nemesis's log, the run's shape) and judges five rules
//! ([`rules`]); it shares no state and no code path with what it checks, except the
//! max-register checker it reuses from the harness and the record types.
//!
//! Each answer is first classified from its raw form ([`classify`]): status, the
//! `fencing-highest` header, the body's first words, a transport error.

pub mod rules;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;

use crate::record::{read_lines, Event, Fault, Landed, RunInfo, Snapshot, Write};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// What an answer says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// 2xx: admitted, and the store stored it.
    Stored,
    /// 409 with `fencing-highest`: refused as stale.
    Stale,
    /// 428: refused, no token.
    Missing,
    /// 400: refused, malformed.
    Malformed,
    /// 503 "cannot decide": refused, undecided (the mark may still have advanced).
    Undecided,
    /// Admitted and forwarded, but the store failed: its own injected error.
    UpstreamError,
    /// Admitted and forwarded, but the proxy got no answer from the store (502, 504,
    /// Envoy's "upstream connect error").
    UpstreamFailed,
    /// Never sent (connection refused).
    Unreachable,
    /// Sent, no answer (a timeout, a reset, a worker killed mid-write).
    Unknown,
    /// 409 "cannot write": admitted, but refused for the store's version (conditional
    /// writes: the store refused the precondition, or the version is not known); not
    /// applied. Only a write the store applied late, after a fault, explains it.
    Conflict,
    /// 503 "cannot write": a conditional write refused because too many writes given up
    /// on are lent on its resource's chain (each may still be applied by the store) until
    /// an operator releases them. Admitted (the mark may have advanced), never applied.
    /// Only writes given up on during earlier faults explain it, and it lasts past them.
    Lent,
    /// Anything else: unaccounted for.
    Other,
}

impl Class {
    /// The fence admitted the token (the mark is at least the token).
    pub fn admitted(self) -> bool {
        matches!(self, Class::Stored | Class::UpstreamError | Class::UpstreamFailed)
    }

    /// Answers that only a fault explains.
    pub fn disturbed(self) -> bool {
        matches!(
            self,
            Class::Undecided
                | Class::UpstreamError
                | Class::UpstreamFailed
                | Class::Unreachable
                | Class::Unknown
                | Class::Conflict
        )
    }

    /// A word for tables.
    pub fn word(self) -> &'static str {
        match self {
            Class::Stored => "stored",
            Class::Stale => "stale",
            Class::Missing => "missing",
            Class::Malformed => "malformed",
            Class::Undecided => "undecided",
            Class::UpstreamError => "upstream-error",
            Class::UpstreamFailed => "upstream-failed",
            Class::Unreachable => "unreachable",
            Class::Unknown => "unknown",
            Class::Conflict => "conflict",
            Class::Lent => "lent",
            Class::Other => "other",
        }
    }
}

/// What a refusal for writes left lent on a resource says (`fencekeeper-chain`'s
/// `Refusal::TooManyLent`).
const LENT: &str = "writes given up on may still be applied by the store";

/// Classify one recorded answer.
pub fn classify(w: &Write) -> Class {
    match (&w.error, w.status) {
        (Some(e), _) if e == "refused" => Class::Unreachable,
        (Some(_), _) => Class::Unknown,
        (None, 0) => Class::Unknown,
        (None, 200..=299) => Class::Stored,
        (None, _) if w.upstream_error => Class::UpstreamError,
        (None, 409) if w.highest.is_some() => Class::Stale,
        // Writes left lent: 503 from the gateway and the Envoy filter alike (the filter
        // answered 409 before, and a log of then still reads so).
        (None, 409 | 503) if w.body.starts_with("cannot write") && w.body.contains(LENT) => Class::Lent,
        (None, 409) if w.body.starts_with("cannot write") => Class::Conflict,
        (None, 428) => Class::Missing,
        (None, 400) => Class::Malformed,
        (None, 503) if w.body.starts_with("cannot decide") => Class::Undecided,
        (None, 503) if w.body.starts_with("cannot write") => Class::Lent,
        (None, 502 | 504) => Class::UpstreamFailed,
        (None, 503) if w.body.starts_with("upstream connect error") => Class::UpstreamFailed,
        // Envoy's own 503 with no body: the filter's VM failed (a trap) or is being
        // reloaded. A request already forwarded when its VM trapped gets it too, after
        // the store applied it: so it says nothing about what happened.
        (None, 503) if w.body.is_empty() => Class::Unknown,
        _ => Class::Other,
    }
}

/// Everything a run wrote.
pub struct Input {
    /// The run's shape.
    pub info: RunInfo,
    /// Every write sent (the last record per id: a pending one was never answered).
    pub writes: Vec<Write>,
    /// Every write applied, by arrival.
    pub landed: Vec<Landed>,
    /// Every fault.
    pub faults: Vec<Fault>,
    /// Every read-back of marks.
    pub snapshots: Vec<Snapshot>,
}

impl Input {
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
        let mut landed: Vec<Landed> = read_lines(&dir.join("store.jsonl"))?;
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

    /// The group a resource belongs to (its path is `/t/<group>/...`).
    pub fn group_of(&self, resource: &str) -> Option<&crate::record::Group> {
        let name = resource.strip_prefix("/t/")?.split('/').next()?;
        self.info.groups.iter().find(|g| g.name == name)
    }
}
