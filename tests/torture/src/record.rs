//! What a run writes down, one JSON object a line, and reads back for the checker:
//!
//! * `history*.jsonl`: every write a client sent ([`Write`]), with start and end
//!   stamps from the one clock ([`crate::clock`]) and the raw answer (status, the
//!   `fencing-highest` header, the store's sequence number, a transport error);
//! * `store.jsonl`: every write the upstream store applied ([`Landed`]), in arrival
//!   order: the ground truth of what landed;
//! * `nemesis.jsonl`: every fault with its start and heal stamps ([`Fault`]), and the
//!   marks read back after restarts ([`Snapshot`]);
//! * `run.json`: the run's shape ([`RunInfo`]): seed, groups, which claim the order.
//!
//! The record types are the shared checker's (`fencekeeper_check::record`); this module
//! writes and reads them.

use anyhow::{Context, Result};
pub use fencekeeper_check::record::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write as _};
use std::path::Path;
use std::sync::Mutex;

/// A JSON-lines file written by many threads. Lines are written whole, unbuffered
/// when `durable` (a process that may be killed keeps every line it wrote).
pub struct Log {
    out: Mutex<Out>,
}

enum Out {
    Buffered(BufWriter<File>),
    Direct(File),
}

impl Log {
    /// Append to `path` (created if missing).
    pub fn append(path: &Path, durable: bool) -> Result<Log> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let out = if durable { Out::Direct(file) } else { Out::Buffered(BufWriter::with_capacity(1 << 20, file)) };
        Ok(Log { out: Mutex::new(out) })
    }

    /// Write one record as a line.
    pub fn write<T: Serialize>(&self, record: &T) -> Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *out {
            Out::Buffered(w) => w.write_all(&line)?,
            Out::Direct(f) => f.write_all(&line)?,
        }
        Ok(())
    }

    /// Flush what is buffered.
    pub fn flush(&self) -> Result<()> {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if let Out::Buffered(w) = &mut *out {
            w.flush()?;
        }
        Ok(())
    }
}

/// Every record of a JSON-lines file. A last line cut by a kill is skipped.
pub fn read_lines<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let lines: Vec<String> = BufReader::new(file).lines().collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(record) => out.push(record),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => return Err(e).with_context(|| format!("{} line {}", path.display(), i + 1)),
        }
    }
    Ok(out)
}
