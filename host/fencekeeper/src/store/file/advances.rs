//! Advances: the file store's group commit over its journal. A batch of
//! compare-and-swaps is decided against the marks (the journal's latest, then redb's)
//! and its advances made durable in one journal frame; the journal is folded into redb
//! as it fills, before a repair or a compaction, and when the store is closed; and the
//! store's file records which journal is its own and whether it may hold advances.

use super::journal::{self, Frames, Journal};
use super::{contained, corrupt, Advance, FileStore, JOURNAL, JOURNAL_ROW, MARKS};
use crate::store::group::Commits;
use crate::store::retention::clears;
use crate::store::{raises, StoreError, Swap};
use fencekeeper_core::resource::MAX_KEY_BYTES;
use fencekeeper_core::{record, Token};
use redb::{ReadableDatabase, ReadableTable};
use std::collections::HashMap;
use std::fs;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

/// The file store's group commit: a batch of compare-and-swaps decided together, each
/// against the marks as the ones before it left them, and the advances among them made
/// durable in one journal frame (one write, one `fdatasync`) before any is answered.
/// A damaged record fails only the swap that read it; a failed write fails every
/// advance of the batch. The frame is written twice, so it needs no commit after it
/// to seal it, as a redb commit does.
impl Commits<Advance, Result<Swap, StoreError>> for FileStore {
    fn apply(&self, batch: Vec<Advance>) -> Vec<Result<Swap, StoreError>> {
        let mut slot = self.lock_journal();
        let Some(journal) = slot.as_mut() else {
            let e = StoreError::Unavailable(format!("mark store {}: it has no journal open", self.path.display()));
            return batch.iter().map(|_| Err(e.again())).collect();
        };
        // Folded in before it fills, or after a failed write before it takes another;
        // while folding fails, frames go on as long as they fit.
        let unfolded = (journal.broken() || journal.end() > journal::CHECKPOINT_AT)
            .then(|| self.checkpoint(journal).err())
            .flatten();
        let (mut answers, advances) = match self.decide(&batch) {
            Ok(decided) => decided,
            // A fold that failed is the first cause (an I/O error makes redb refuse
            // every transaction until it is reopened).
            Err(e) => {
                let e = unfolded.unwrap_or(e);
                return batch.iter().map(|_| Err(e.again())).collect();
            }
        };
        if advances.is_empty() {
            return answers;
        }
        if let Err(e) = self.make_durable(journal, &advances, unfolded) {
            for answer in answers.iter_mut().filter(|a| matches!(a, Ok(Swap::Swapped))) {
                *answer = Err(e.again());
            }
        }
        answers
    }
}

impl FileStore {
    /// Make `advances` durable: a journal frame, once the store's file says the journal
    /// may hold some. More than the journal has left is folded in first; more than a
    /// whole journal holds (a group of many long keys), or a key longer than a resource
    /// key may be, goes to redb itself after the fold, sealed, as a fold does. `unfolded`: why an earlier fold failed, the cause when the journal
    /// then cannot take the frame.
    fn make_durable(
        &self,
        journal: &mut Journal,
        advances: &[(String, Token)],
        unfolded: Option<StoreError>,
    ) -> Result<(), StoreError> {
        // A key longer than any resource key (only a caller of the store itself can
        // make one) goes to redb, which took every key before the journal did.
        let journaled = advances.iter().all(|(r, _)| r.len() <= MAX_KEY_BYTES);
        let frames = Frames::of(advances);
        if !journaled || !journal.fits(&frames) {
            self.checkpoint(journal)?;
            if !journaled || !journal.fits(&frames) {
                return self.put_marks(advances);
            }
        }
        if !self.journal_holds.load(Ordering::Acquire) {
            self.set_journal_row(journal.id(), true)?;
            self.journal_holds.store(true, Ordering::Release);
        }
        journal.append(&frames).map_err(|e| unfolded.unwrap_or(e))?;
        self.recent.write().unwrap_or_else(|p| p.into_inner()).extend(advances.iter().cloned());
        Ok(())
    }

    /// Decide a batch of compare-and-swaps against the marks (the journal's, then
    /// redb's), each after the ones before it: the answers, and the advances to write.
    #[allow(clippy::type_complexity)]
    fn decide(&self, batch: &[Advance]) -> Result<(Vec<Result<Swap, StoreError>>, Vec<(String, Token)>), StoreError> {
        contained(&self.path, || {
            let txn = self.db()?.begin_read().map_err(|e| self.error(e))?;
            let table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            let recent = self.recent.read().unwrap_or_else(|p| p.into_inner());
            let mut decided: HashMap<&str, Token> = HashMap::new();
            let mut answers = Vec::with_capacity(batch.len());
            let mut advances = Vec::new();
            let mut floor: Option<Result<Option<Token>, StoreError>> = None;
            for a in batch {
                let known = decided.get(a.resource.as_str()).or_else(|| recent.get(&a.resource)).copied();
                let current = match known {
                    Some(t) => Some(t),
                    None => match table.get(a.resource.as_bytes()).map_err(|e| self.error(e))? {
                        Some(v) => match self.decode(&a.resource, v.value()) {
                            Ok(t) => Some(t),
                            Err(e) => {
                                answers.push(Err(e));
                                continue;
                            }
                        },
                        None => None,
                    },
                };
                // Nothing slips between this check and the write: the journal is held
                // from here until the frame is durable. A non-raising swap is refused as a
                // conflict too: this store never lowers a mark, whatever its caller asks.
                if current != a.expected || !raises(current.as_ref(), &a.new) {
                    answers.push(Ok(Swap::Conflict(current)));
                    continue;
                }
                // A first mark clears the retention floor, read after the mark was found
                // absent: a compaction raises it in the transaction that forgets a mark,
                // so a mark forgotten before that read lies under the floor it returns.
                if current.is_none() {
                    match floor.get_or_insert_with(|| self.read_floor()) {
                        Ok(f) if clears(f.as_ref(), &a.new) => {}
                        Ok(_) => {
                            answers.push(Ok(Swap::Conflict(None)));
                            continue;
                        }
                        Err(e) => {
                            answers.push(Err(e.again()));
                            continue;
                        }
                    }
                }
                decided.insert(&a.resource, a.new);
                advances.push((a.resource.clone(), a.new));
                answers.push(Ok(Swap::Swapped));
            }
            Ok((answers, advances))
        })
    }

    pub(super) fn lock_journal(&self) -> MutexGuard<'_, Option<Journal>> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fold the journal into redb: every mark it holds in one sealed commit, then the
    /// journal starts over. A crash between the two replays marks redb already has.
    pub(super) fn checkpoint(&self, journal: &mut Journal) -> Result<(), StoreError> {
        let mut marks: Vec<(String, Token)> = {
            let recent = self.recent.read().unwrap_or_else(|p| p.into_inner());
            recent.iter().map(|(r, t)| (r.clone(), *t)).collect()
        };
        // In key order, as redb's tree is: inserted in the map's order, a fold of new
        // keys left its leaves about half full (143 bytes a mark at 10^6 against 76).
        marks.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if !marks.is_empty() {
            self.put_marks(&marks)?;
        }
        if !journal.is_empty() || journal.broken() {
            journal.restart()?;
        }
        self.recent.write().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(())
    }

    /// Write `marks` into redb in one sealed commit. Each raised redb's mark when it was
    /// decided; a damaged record there is replaced, a higher one (only by hand) kept.
    fn put_marks(&self, marks: &[(String, Token)]) -> Result<(), StoreError> {
        self.write(|txn| {
            let mut table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            for (resource, token) in marks {
                let stored = table.get(resource.as_bytes()).map_err(|e| self.error(e))?;
                let current = stored.and_then(|v| self.decode(resource, v.value()).ok());
                if current.is_none_or(|c| c == *token || raises(Some(&c), token)) {
                    let value = record::encode(resource.as_bytes(), token);
                    table.insert(resource.as_bytes(), value.as_bytes()).map_err(|e| self.error(e))?;
                }
            }
            Ok(((), true))
        })
    }

    /// Run `change` with no advance in progress and the journal folded in, so that it
    /// sees (and may change) every mark in redb alone: repairs, compactions.
    pub(super) fn exclusive<T>(&self, change: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut slot = self.lock_journal();
        if let Some(journal) = slot.as_mut() {
            self.checkpoint(journal)?;
        }
        change()
    }

    /// Open the store's journal (made when there is none and none can hold advances),
    /// and read the advances it holds.
    pub(super) fn attach_journal(&self) -> Result<(), StoreError> {
        let path = journal::path_of(&self.path);
        let row = self.read_one(JOURNAL, JOURNAL_ROW, |v| self.decode_journal_row(v))?;
        let (journal, entries) = match Journal::open(&path) {
            // A journal the store has no record of, holding advances: another store's
            // (one made at this path before, then removed), not this one's to take.
            Ok((_, entries)) if row.is_none() && !entries.is_empty() => {
                return Err(corrupt(
                    &path,
                    format!(
                        "the journal holds advances but {} has no record of it (a journal of a store that was \
                         removed?); move it aside",
                        self.path.display()
                    ),
                ))
            }
            Ok((journal, entries)) => {
                if let Some((id, _)) = row.filter(|(id, _)| *id != journal.id()) {
                    return Err(corrupt(
                        &path,
                        format!(
                            "the journal belongs to another store (its id is {:016x}, {}'s is {id:016x})",
                            journal.id(),
                            self.path.display()
                        ),
                    ));
                }
                (journal, entries)
            }
            // A journal of an earlier development build that the store records as its
            // own, holding no advance (the store was closed, or folded it in): made
            // again in this format. One it has no record of may be another store's.
            Err(e) if journal::earlier_format(&e) && matches!(row, Some((_, false))) => {
                fs::remove_file(&path).map_err(|error| StoreError::Io { path: path.clone(), error })?;
                (Journal::create(&path, row.map_or_else(new_id, |(id, _)| id))?, Vec::new())
            }
            Err(e) if journal::missing(&e) => {
                if let Some((_, true)) = row {
                    return Err(corrupt(
                        &path,
                        "the store's journal is missing, and it may hold advances made since the store was last \
                         closed; put it back beside the store (a copy of a store in use is both files)",
                    ));
                }
                (Journal::create(&path, row.map_or_else(new_id, |(id, _)| id))?, Vec::new())
            }
            Err(e) => return Err(e),
        };
        let mut recent = HashMap::new();
        for (resource, token) in entries {
            recent.insert(resource, token); // each raised the one before it
        }
        // What redb holds is never lowered by what the journal says (it cannot be higher
        // but for a repair by hand, which folds the journal in first).
        for resource in recent.keys().cloned().collect::<Vec<_>>() {
            let stored = self.read_one(MARKS, resource.as_bytes(), |v| Ok(self.decode(&resource, v).ok()))?;
            if let (Some(Some(stored)), Some(token)) = (stored, recent.get(&resource)) {
                if stored != *token && !raises(Some(&stored), token) {
                    recent.remove(&resource);
                }
            }
        }
        // The store records which journal is its own as soon as it has one; that the
        // journal may hold advances, before the first is written to it (`apply`).
        let holds = row.is_some_and(|(_, holds)| holds) || !recent.is_empty();
        if row.map(|(id, _)| id) != Some(journal.id()) || row.is_some_and(|(_, h)| h) != holds {
            self.set_journal_row(journal.id(), holds)?;
        }
        self.journal_holds.store(holds, Ordering::Release);
        *self.recent.write().unwrap_or_else(|p| p.into_inner()) = recent;
        *self.lock_journal() = Some(journal);
        Ok(())
    }

    pub(super) fn set_journal_row(&self, id: u64, may_hold: bool) -> Result<(), StoreError> {
        let mut value = id.to_le_bytes().to_vec();
        value.push(u8::from(may_hold));
        let crc = record::checksum(JOURNAL_ROW.as_bytes(), &value);
        value.extend_from_slice(&crc.to_le_bytes());
        self.write(|txn| {
            let mut table = txn.open_table(JOURNAL).map_err(|e| self.error(e))?;
            table.insert(JOURNAL_ROW, value.as_slice()).map_err(|e| self.error(e))?;
            Ok(((), true))
        })
    }

    fn decode_journal_row(&self, value: &[u8]) -> Result<(u64, bool), StoreError> {
        let damaged = || corrupt(&self.path, "the record of its journal is damaged");
        let (body, crc) = value.split_last_chunk::<4>().ok_or_else(damaged)?;
        let (id, state) = body.split_first_chunk::<8>().ok_or_else(damaged)?;
        if record::checksum(JOURNAL_ROW.as_bytes(), body) != u32::from_le_bytes(*crc)
            || state.len() != 1
            || state[0] > 1
        {
            return Err(damaged());
        }
        Ok((u64::from_le_bytes(*id), state[0] == 1))
    }
}

/// A fresh journal id: random, so that another store's journal is never taken for
/// this one's.
fn new_id() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::MarkStore;

    /// A group of advances larger than a whole journal (many long keys at once) is
    /// written to redb itself, sealed, and every one is answered and kept.
    #[test]
    fn a_group_larger_than_the_journal_goes_to_the_store_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.redb");
        let store = FileStore::open(&path).unwrap();
        let one = Token::parse("1").unwrap();
        let keys: Vec<String> = (0..300).map(|i| format!("{i:04}/{}", "k".repeat(1000))).collect();
        let batch = keys.iter().map(|k| Advance { resource: k.clone(), expected: None, new: one }).collect();
        let answers = Commits::apply(&store, batch);
        assert!(answers.iter().all(|a| matches!(a, Ok(Swap::Swapped))), "{:?}", answers.first());
        let journal = store.lock_journal();
        assert!(journal.as_ref().is_some_and(|j| j.is_empty()), "the journal holds none of them");
        drop(journal);
        assert_eq!(MarkStore::list(&store).unwrap().len(), 300);
        drop(store);
        std::fs::remove_file(journal::path_of(&path)).unwrap();
        assert_eq!(MarkStore::get(&FileStore::open(&path).unwrap(), &keys[299]).unwrap(), Some(one));
    }

    /// Keys no resource has (empty, or longer than a resource key may be: only a caller
    /// of the store itself makes them) are kept as before the journal, and the store
    /// opens again after them, with or without a clean close.
    #[test]
    fn keys_no_resource_has_are_kept_and_the_store_opens_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.redb");
        let (one, two) = (Token::parse("1").unwrap(), Token::parse("2").unwrap());
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let store = FileStore::open(&path).unwrap();
        for key in ["", long.as_str(), &"x".repeat(70_000)] {
            assert_eq!(store.compare_and_swap(key, None, &one).unwrap(), Swap::Swapped);
        }
        assert_eq!(store.compare_and_swap("", Some(&one), &two).unwrap(), Swap::Swapped);
        // Without a clean close: what the journal holds is read back at the next open.
        let kept = std::fs::read(journal::path_of(&path)).unwrap();
        let file = std::fs::read(&path).unwrap();
        drop(store);
        std::fs::write(&path, file).unwrap();
        std::fs::write(journal::path_of(&path), kept).unwrap();
        let store = FileStore::open(&path).unwrap();
        assert_eq!(MarkStore::get(&store, "").unwrap(), Some(two));
        assert_eq!(MarkStore::get(&store, &long).unwrap(), Some(one));
        assert_eq!(MarkStore::list(&store).unwrap().len(), 3);
    }
}
