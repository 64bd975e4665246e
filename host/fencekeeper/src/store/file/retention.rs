//! Retention in the file store (`crate::store::retention`): the floor, a since table
//! of each mark as a compaction last saw it, and compactions in chunks.

use super::{contained, FileStore, MARKS};
use crate::store::retention::{plan, Compaction, Retention};
use crate::store::StoreError;
use fencekeeper_core::{record, Token};
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use std::time::Duration;

/// Retention: the floor, and each mark as a compaction last saw
/// it. Tables of their own, made by the first compaction; an advance never writes
/// them, so retention costs the write path nothing but a first mark's floor read.
const RETENTION: TableDefinition<&str, &[u8]> = TableDefinition::new("fencekeeper_retention_v1");
/// The floor's row in [`RETENTION`]; its record is checked under this name.
const FLOOR: &str = "floor";
/// resource -> Unix seconds (8 bytes, little-endian) ‖ the mark's record, as a
/// compaction last saw it: a mark with the same record has not risen since.
const SINCE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("fencekeeper_retention_since_v1");

impl FileStore {
    fn decode_floor(&self, value: &[u8]) -> Result<Token, StoreError> {
        record::decode(FLOOR.as_bytes(), value).map_err(|e| self.damaged("(the retention floor)", e))
    }

    /// The floor, in a read transaction of its own.
    pub(super) fn read_floor(&self) -> Result<Option<Token>, StoreError> {
        self.read_one(RETENTION, FLOOR, |value| self.decode_floor(value))
    }

    /// The floor, read inside a write transaction (no table is made for it).
    pub(super) fn floor_in(&self, txn: &WriteTransaction) -> Result<Option<Token>, StoreError> {
        let exists = txn.list_tables().map_err(|e| self.error(e))?.any(|t| t.name() == RETENTION.name());
        if !exists {
            return Ok(None);
        }
        let table = txn.open_table(RETENTION).map_err(|e| self.error(e))?;
        let value = table.get(FLOOR).map_err(|e| self.error(e))?;
        value.map(|v| self.decode_floor(v.value())).transpose()
    }
}

/// Marks a compaction reads and decides on at a time: each chunk is one read and one
/// short write transaction, so advances never wait for a whole compaction (a single
/// transaction over 10^7 marks held every writer for 25 s: BENCHMARKS.md).
const COMPACT_CHUNK: usize = 4096;

/// A chunk of a compaction, read: each mark (its key, its verified token or none when
/// its record is damaged, its record's bytes), and the since rows of the same keys.
struct Chunk {
    marks: Vec<(Vec<u8>, Option<Token>, Vec<u8>)>,
    since: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    /// Since rows in the chunk's span whose marks are gone (removed by hand).
    gone: Vec<Vec<u8>>,
    /// Where the next chunk starts (`None`: this was the last).
    next: Option<Vec<u8>>,
}

impl FileStore {
    /// Read the chunk of marks from `from` on (and the since rows of its span) in one
    /// read transaction.
    fn compaction_chunk(&self, from: &[u8]) -> Result<Chunk, StoreError> {
        contained(&self.path, || {
            let txn = self.db()?.begin_read().map_err(|e| self.error(e))?;
            let table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            let mut marks = Vec::with_capacity(COMPACT_CHUNK);
            let mut next = None;
            for entry in table.range::<&[u8]>(from..).map_err(|e| self.error(e))? {
                let (key, value) = entry.map_err(|e| self.error(e))?;
                if marks.len() == COMPACT_CHUNK {
                    next = Some(key.value().to_vec());
                    break;
                }
                let token = std::str::from_utf8(key.value()).ok().and_then(|r| self.decode(r, value.value()).ok());
                marks.push((key.value().to_vec(), token, value.value().to_vec()));
            }
            let (mut since, mut gone) = (std::collections::HashMap::new(), Vec::new());
            let rows = match txn.open_table(SINCE) {
                Ok(rows) => Some(rows),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(self.error(e)),
            };
            if let Some(rows) = rows {
                let present: std::collections::HashSet<&[u8]> = marks.iter().map(|(k, _, _)| k.as_slice()).collect();
                let span = match &next {
                    Some(end) => rows.range::<&[u8]>(from..end.as_slice()),
                    None => rows.range::<&[u8]>(from..),
                };
                for entry in span.map_err(|e| self.error(e))? {
                    let (key, value) = entry.map_err(|e| self.error(e))?;
                    if present.contains(key.value()) {
                        since.insert(key.value().to_vec(), value.value().to_vec());
                    } else {
                        gone.push(key.value().to_vec());
                    }
                }
            }
            Ok(Chunk { marks, since, gone, next })
        })
    }
}

/// Chunk by chunk ([`COMPACT_CHUNK`] marks in key order): a read transaction decides
/// which marks are idle (by the since table) and which since rows to write; then one
/// write transaction stamps those rows, and forgets the idle marks that are still what
/// was read, raising the floor over them in the same transaction. A damaged record is
/// kept (its token cannot be trusted for the floor) and counted as kept.
impl Retention for FileStore {
    fn compact(&self, idle_for: Duration, now_unix_secs: u64) -> Result<Compaction, StoreError> {
        // The journal folded in first, so that a mark that rose there is not seen idle.
        // Advances made during the compaction go to the journal again: one it then
        // forgets from redb is still the journal's, and the next fold puts it back.
        self.exclusive(|| Ok(()))?;
        let floor_before = self.read_floor()?;
        let mut c = Compaction { floor_before, floor: floor_before, ..Compaction::default() };
        let mut from: Vec<u8> = Vec::new();
        loop {
            let chunk = self.compaction_chunk(&from)?;
            let mut stamps = Vec::new();
            let mut idle = Vec::new();
            for (key, token, record) in &chunk.marks {
                let Some(token) = token else {
                    c.kept += 1;
                    continue;
                };
                let stored = chunk.since.get(key).and_then(|v| v.split_first_chunk::<8>());
                let since = match stored {
                    Some((secs, seen)) if seen == record.as_slice() => u64::from_le_bytes(*secs),
                    _ => {
                        let mut row = now_unix_secs.to_le_bytes().to_vec();
                        row.extend_from_slice(record);
                        stamps.push((key.clone(), row));
                        now_unix_secs
                    }
                };
                if now_unix_secs.saturating_sub(since) >= idle_for.as_secs() {
                    idle.push((key.clone(), *token, record.clone()));
                } else {
                    c.kept += 1;
                }
            }
            self.compact_chunk(&stamps, &idle, &chunk.gone, &mut c)?;
            match chunk.next {
                Some(next) => from = next,
                None => break,
            }
        }
        c.forgotten.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(c)
    }
}

impl FileStore {
    /// One chunk's write transaction: stamp the since rows, drop those of marks that
    /// are gone, and forget the idle marks still as read, the floor raised over them
    /// first within the same transaction.
    fn compact_chunk(
        &self,
        stamps: &[(Vec<u8>, Vec<u8>)],
        idle: &[(Vec<u8>, Token, Vec<u8>)],
        gone: &[Vec<u8>],
        c: &mut Compaction,
    ) -> Result<(), StoreError> {
        if stamps.is_empty() && idle.is_empty() && gone.is_empty() {
            return Ok(());
        }
        let (forgotten, kept, other_arity, floor) = self.write(|txn| {
            let mut table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            let mut since = txn.open_table(SINCE).map_err(|e| self.error(e))?;
            for (key, row) in stamps {
                since.insert(key.as_slice(), row.as_slice()).map_err(|e| self.error(e))?;
            }
            for key in gone {
                since.remove(key.as_slice()).map_err(|e| self.error(e))?;
            }
            // Only marks still as read: one that rose meanwhile is active again.
            let mut unchanged = Vec::new();
            let mut kept = 0;
            for (key, token, record) in idle {
                let now = table.get(key.as_slice()).map_err(|e| self.error(e))?.map(|v| v.value().to_vec());
                match (now, std::str::from_utf8(key)) {
                    (Some(now), Ok(resource)) if now == *record => unchanged.push((resource.to_owned(), *token)),
                    _ => kept += 1,
                }
            }
            let floor_before = self.floor_in(txn)?;
            let plan = plan(floor_before, unchanged);
            if plan.floor != floor_before {
                if let Some(floor) = &plan.floor {
                    let mut retention = txn.open_table(RETENTION).map_err(|e| self.error(e))?;
                    let value = record::encode(FLOOR.as_bytes(), floor);
                    retention.insert(FLOOR, value.as_bytes()).map_err(|e| self.error(e))?;
                }
            }
            for (resource, _) in &plan.forget {
                table.remove(resource.as_bytes()).map_err(|e| self.error(e))?;
                since.remove(resource.as_bytes()).map_err(|e| self.error(e))?;
            }
            Ok(((plan.forget, kept, plan.other_arity, plan.floor), true))
        })?;
        c.kept += kept + other_arity;
        c.other_arity += other_arity;
        c.floor = floor;
        c.forgotten.extend(forgotten);
        Ok(())
    }
}
