//! The audit log: one JSON line per change of a mark ([`Entry`], the core's one
//! format, written by every host), appended to a file.
//!
//! A guard knows when it raised a mark ([`Decision::advance`](crate::Decision)); the
//! host that acted on the decision appends the line, with what only it knows (the
//! client's address). docs/operations.md shows how to read the log.
//!
//! Each line is one `write` on a file opened for appending, then `fdatasync`: an entry
//! is on disk before [`AuditLog::append`] returns, so a host that appends before it
//! forwards a write never forwards one whose mark change a crash could erase from the
//! log. (The mark itself changed just before; a crash between the two loses the line,
//! never the mark.)

pub use fencekeeper_core::audit::{Change, Entry, FIELDS, LOG_PREFIX};

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// An audit file, opened for appending.
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Open (or create) the file at `path` for appending. The error names the path.
    pub fn open(path: impl AsRef<Path>) -> io::Result<AuditLog> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot open the audit log {}: {e}", path.display())))?;
        Ok(AuditLog { path, file: Mutex::new(file) })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append `entry` as one line and wait until it is on disk.
    pub fn append(&self, entry: &Entry<'_>) -> io::Result<()> {
        let line = format!("{entry}\n");
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // One write of the whole line on an O_APPEND file: lines from several
        // processes sharing the file do not interleave.
        (&*file).write_all(line.as_bytes()).and_then(|()| file.sync_data()).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot append to the audit log {}: {e}", self.path.display()))
        })
    }
}

/// The time now, in milliseconds since the Unix epoch, for [`Entry::unix_ms`].
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::Token;

    #[test]
    fn appended_entries_are_whole_lines_that_parse_back() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path().join("audit.jsonl")).unwrap();
        for (token, old) in [("34", None), ("035", Token::parse("34").ok())] {
            let entry = Entry {
                unix_ms: now_ms(),
                host: "test",
                reason: Change::Advance,
                resource: "r\n",
                old,
                old_damaged: None,
                new: Token::parse(token).ok(),
                token: Some(token),
                client: None,
                user: None,
                store: "memory",
            };
            log.append(&entry).unwrap();
        }
        let text = std::fs::read_to_string(log.path()).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            (lines[1]["old"].as_str(), lines[1]["new"].as_str(), lines[1]["token"].as_str()),
            (Some("34"), Some("35"), Some("035"))
        );
        assert_eq!(lines[0]["resource"], "r\n");
        assert_eq!(lines[0].as_object().map(|o| o.len()), Some(FIELDS.len()));
        let missing = AuditLog::open(dir.path().join("no/such/dir/audit.jsonl")).err().map(|e| e.to_string());
        assert!(missing.is_some_and(|e| e.contains("cannot open the audit log")));
    }
}
