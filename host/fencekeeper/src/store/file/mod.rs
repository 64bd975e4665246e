//! A durable mark store in one file, an embedded redb database, with a journal
//! beside it (`STORE.journal`) where advances are made durable first.
//!
//! Why redb rather than a home-made append log for the marks: it is a real embedded
//! database with checksummed pages, copy-on-write commits that are fsync'd before
//! `commit` returns (`Durability::Immediate`), crash recovery that falls back to
//! the last committed root, and a file lock against a second writer process. The
//! journal (`journal.rs`) is the one small log beside it, for the one thing a redb
//! commit does slowly: one advance alone. It only ever holds the latest advances,
//! and is folded into redb as it fills and when the store is closed.
//!
//! The one promise above all: a store that cannot be read is an error, never an
//! empty store and never a lower mark, because either re-admits stale writers.
//! What keeps it:
//!
//! * **Checked records.** Table `fencekeeper_marks_v2` maps the resource's bytes to
//!   a record (`fencekeeper_core::record`, `fk2 TOKEN CRC`) whose CRC32C covers the
//!   key and the token. Every read verifies it: a damaged digit or a damaged key is
//!   [`StoreError::Damaged`], never a lower mark or another resource's mark. Keys
//!   and values are raw bytes, so damaged UTF-8 is ours to report, not redb's to
//!   panic on.
//! * **Every page verified at open.** redb checks the checksum of every page of
//!   the committed trees before the store is used, so a damaged page (a key that no
//!   longer sorts where it did, a record cut from a leaf, a garbage branch) fails
//!   the open instead of making a lookup miss or panic. This reads the whole file:
//!   opening costs time in proportion to the store's size. The journal is read and
//!   checked whole at open too.
//! * **Two copies of everything reported.** redb keeps the previous commit as a
//!   fallback for a damaged or torn latest one, and its header byte that picks
//!   between them has no checksum. So every redb commit that changes marks (a fold,
//!   a repair) is followed by an empty one before it returns: the fallback then
//!   holds every mark, and neither a damaged slot nor that byte can bring back a
//!   lower one. An advance goes to the journal instead, as a frame written twice
//!   and made durable by one `fdatasync` before it is reported; concurrent advances
//!   share a frame (group commit, `advances.rs` over `group.rs`).
//! * **A journal never done without.** The store's file records which journal is
//!   its own and whether it may hold advances not folded in; such a store without
//!   its journal, or with another store's, does not open.
//! * **No panic escapes.** Every call into redb runs inside a panic boundary
//!   (`contain`): damage that reaches redb after the open is the one-line store
//!   error of this file.
//! * **No half-made store.** Opening an existing file never creates anything but
//!   its journal when it has none; a new file is built under a temporary name and
//!   linked into place only when complete, so a crash during creation leaves
//!   nothing that would read as empty.
//! * **Reopened after an I/O error.** redb refuses every transaction after one I/O
//!   error (a full disk, an EIO) until the database is closed and opened again. The
//!   store does that itself, at most once a second while it fails, through the same
//!   verified open: so writes resume once the disk has room, without restarting the
//!   process. Nothing is lost by it: a commit that failed answered an error, never
//!   [`Swap::Swapped`], and the reopened file holds the last durable commit. A
//!   journal whose write failed takes no frame until it was folded in and started
//!   over.
//!
//! Retention (`retention.rs`) keeps two more tables, made by the first compaction:
//! the floor, and each mark as a compaction last saw it. An advance never writes them.
//!
//! A file of format 1 (table `fencekeeper_marks`, bare token text, no checksums) is
//! refused with [`StoreError::OldFormat`]; [`FileStore::upgrade`] converts it in one
//! transaction.

mod advances;
mod journal;
mod retention;

use super::contain::contained;
use super::group::Group;
use super::repair::{judge, previous, Previous, Raise, Repair, Scanned};
use super::{MarkStore, StoreError, Swap};
use crate::chain::ChainStore;
use fencekeeper_core::{record, Token};
use journal::Journal;
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, StorageError, TableDefinition, TableHandle,
    WriteTransaction,
};
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Format 2: resource bytes -> record (`fk2 TOKEN CRC`).
const MARKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("fencekeeper_marks_v2");

/// The journal this store's advances go to first (`journal.rs`), under [`JOURNAL_ROW`]:
/// its id (8 bytes, little-endian) ‖ whether it may hold advances not yet folded in
/// (1) or was folded in when the store was closed (0) ‖ a CRC32C of both.
const JOURNAL: TableDefinition<&str, &[u8]> = TableDefinition::new("fencekeeper_journal_v1");
const JOURNAL_ROW: &str = "journal";

/// Format 1, read only by [`FileStore::upgrade`]: resource -> bare token text.
const FORMAT1: TableDefinition<&str, &str> = TableDefinition::new("fencekeeper_marks");

/// redb's page cache; marks are small and the OS caches the file too.
const CACHE_BYTES: usize = 16 << 20;

/// How often a store whose database failed with an I/O error tries to reopen it (a
/// verified open reads the whole file).
const REOPEN_INTERVAL: Duration = Duration::from_secs(1);

/// A durable [`MarkStore`] in one redb file. An advancing compare-and-swap is on
/// stable storage before it returns [`Swap::Swapped`]; reads cost no I/O beyond
/// the page cache. Safe to share between threads; one process at a time.
pub struct FileStore {
    /// `Some` but while it is being reopened (or could not be) and once dropped:
    /// taken out to close it inside the panic boundary (closing commits, so it reads
    /// the file too). Each call holds a clone for its duration.
    db: RwLock<Option<Arc<Database>>>,
    path: PathBuf,
    /// Concurrent advances, committed together (group commit).
    advances: Group<Advance, Result<Swap, StoreError>>,
    /// An I/O error failed a call: the database must be reopened before the next.
    failed: AtomicBool,
    /// When the last reopen was tried.
    reopened: Mutex<Option<Instant>>,
    /// Where advances are made durable first (`None` only while the store is being
    /// created or upgraded). Held by whoever changes marks: the group commit's
    /// leader, a checkpoint, a repair.
    journal: Mutex<Option<Journal>>,
    /// The marks the journal holds that redb does not have yet: the latest of each.
    recent: RwLock<HashMap<String, Token>>,
    /// The store's file records that the journal may hold advances: set before the
    /// first frame, cleared when the store is closed with the journal folded in. A
    /// store only read writes nothing.
    journal_holds: AtomicBool,
}

/// One compare-and-swap waiting for the next commit.
struct Advance {
    resource: String,
    expected: Option<Token>,
    new: Token,
}

impl Drop for FileStore {
    fn drop(&mut self) {
        // Closed cleanly: the journal folded in, so that the file alone holds every mark.
        if let Some(mut journal) = self.journal.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            if self.journal_holds.load(Ordering::Acquire) && self.checkpoint(&mut journal).is_ok() {
                let _ = self.set_journal_row(journal.id(), false);
            }
        }
        let db = self.db.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        // A failure to close leaves the file for the next open to recover and verify.
        let _ = contained(&self.path, || {
            drop(db);
            Ok(())
        });
    }
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore").field("path", &self.path).finish_non_exhaustive()
    }
}

/// The marks a format-1 store held, now in format 2 (see [`FileStore::upgrade`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Upgrade {
    /// The store was upgraded; these are its marks, sorted by resource.
    Upgraded(Vec<(String, Token)>),
    /// The store was already in format 2; nothing was written.
    Current,
}

impl FileStore {
    /// Open the store at `path`, creating it (and its directory) when no file exists.
    /// An existing file that is empty, damaged, not a mark store or in the old
    /// format is an error, and is left as it is.
    pub fn open(path: impl AsRef<Path>) -> Result<FileStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        match fs::metadata(&path) {
            Ok(meta) if meta.len() == 0 => {
                return Err(corrupt(&path, "the file is empty (zero bytes), so its marks are lost"))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => create(&path)?,
            Err(error) => return Err(StoreError::Io { path, error }),
        }
        let store = FileStore::with(open_verified(&path)?, path);
        match store.format()? {
            Format::Two => {
                store.attach_journal()?;
                Ok(store)
            }
            Format::One => Err(StoreError::OldFormat {
                store: format!("mark store {}", store.path.display()),
                upgrade: format!("fencekeeper marks --store {} --upgrade", store.path.display()),
            }),
        }
    }

    /// Convert a format-1 store (bare tokens, no checksums) to format 2 in place, in
    /// one durable transaction: afterwards the file holds the same marks as checked
    /// records and no old table; if anything fails, or the process dies, it holds
    /// the old table unchanged. A stored value that is not a token fails the whole
    /// upgrade. Format 1 had no checksums, so damage it already held cannot be told
    /// apart: compare the marks returned with a backup or the lock service.
    pub fn upgrade(path: impl AsRef<Path>) -> Result<Upgrade, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Err(error) = fs::metadata(&path) {
            return Err(StoreError::Io { path, error });
        }
        let store = FileStore::with(open_verified(&path)?, path);
        if store.format()? == Format::Two {
            return Ok(Upgrade::Current);
        }
        store.write(|txn| {
            let mut marks = Vec::new();
            {
                let old = txn.open_table(FORMAT1).map_err(|e| store.error(e))?;
                for entry in old.iter().map_err(|e| store.error(e))? {
                    let (key, value) = entry.map_err(|e| store.error(e))?;
                    let resource = key.value().to_owned();
                    let mark = Token::parse(value.value()).map_err(|e| StoreError::Damaged {
                        resource: resource.clone(),
                        store: store.describe(),
                        detail: format!(
                            "its format-1 value {:?} is not a token ({e}); nothing was upgraded",
                            value.value()
                        ),
                    })?;
                    marks.push((resource, mark));
                }
            }
            let mut table = txn.open_table(MARKS).map_err(|e| store.error(e))?;
            for (resource, mark) in &marks {
                let value = record::encode(resource.as_bytes(), mark);
                table.insert(resource.as_bytes(), value.as_bytes()).map_err(|e| store.error(e))?;
            }
            drop(table);
            txn.delete_table(FORMAT1).map_err(|e| store.error(e))?;
            Ok((Upgrade::Upgraded(marks), true))
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The journal of the store at `store`: `STORE.journal`, beside it. Advances are
    /// durable there first and folded into the store's file as it fills and when the
    /// store is closed. A copy of a store in use is both files; a store closed cleanly
    /// is its file alone.
    pub fn journal_path(store: impl AsRef<Path>) -> PathBuf {
        journal::path_of(store.as_ref())
    }

    fn with(db: Database, path: PathBuf) -> FileStore {
        FileStore {
            db: RwLock::new(Some(Arc::new(db))),
            path,
            advances: Group::new(),
            failed: AtomicBool::new(false),
            reopened: Mutex::new(None),
            journal: Mutex::new(None),
            recent: RwLock::new(HashMap::new()),
            journal_holds: AtomicBool::new(false),
        }
    }

    /// The database, reopened first when an I/O error failed an earlier call.
    fn db(&self) -> Result<Arc<Database>, StoreError> {
        if self.failed.load(Ordering::Acquire) {
            self.reopen()?;
        }
        let slot = self.db.read().unwrap_or_else(|p| p.into_inner());
        slot.clone().ok_or_else(|| corrupt(&self.path, "the store is closed"))
    }

    /// Close the failed database and open the file again, verified: at most once per
    /// [`REOPEN_INTERVAL`], and only when no call still holds the old one.
    fn reopen(&self) -> Result<(), StoreError> {
        let busy = |why: &str| {
            StoreError::Unavailable(format!("mark store {}: an I/O error stopped it; {why}", self.path.display()))
        };
        let mut last = self.reopened.lock().unwrap_or_else(|p| p.into_inner());
        if !self.failed.load(Ordering::Acquire) {
            return Ok(()); // another call reopened it meanwhile
        }
        if last.is_some_and(|t| t.elapsed() < REOPEN_INTERVAL) {
            return Err(busy("it is reopened at most once a second"));
        }
        *last = Some(Instant::now());
        let mut slot = self.db.write().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|db| Arc::strong_count(db) > 1) {
            return Err(busy("a call still uses the database, so it is reopened later"));
        }
        let old = slot.take();
        let _ = contained(&self.path, || {
            drop(old);
            Ok(())
        });
        let db = open_verified(&self.path).map_err(|e| match e {
            // Damage found by the verified open is what it is, not a passing fault.
            e @ StoreError::Corrupt { .. } => e,
            e => busy(&format!("reopening it failed: {e}")),
        })?;
        *slot = Some(Arc::new(db));
        self.failed.store(false, Ordering::Release);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("mark store {}", self.path.display())
    }

    fn error(&self, e: impl Into<redb::Error>) -> StoreError {
        let e = e.into();
        if matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo) {
            // redb refuses every transaction after this until it is reopened.
            self.failed.store(true, Ordering::Release);
        }
        redb_error(&self.path, e)
    }

    fn damaged(&self, resource: &str, detail: impl std::fmt::Display) -> StoreError {
        StoreError::Damaged { resource: resource.to_owned(), store: self.describe(), detail: detail.to_string() }
    }

    fn decode(&self, resource: &str, value: &[u8]) -> Result<Token, StoreError> {
        record::decode(resource.as_bytes(), value).map_err(|e| self.damaged(resource, e))
    }

    /// Which format the file holds. A redb file with neither table is some other
    /// database, not an empty store.
    fn format(&self) -> Result<Format, StoreError> {
        contained(&self.path, || {
            let txn = self.db()?.begin_read().map_err(|e| self.error(e))?;
            let names: Vec<String> =
                txn.list_tables().map_err(|e| self.error(e))?.map(|t| t.name().to_owned()).collect();
            let has = |t: &str| names.iter().any(|n| n == t);
            match (has(MARKS.name()), has(FORMAT1.name())) {
                (true, false) => {
                    // The right name with other types is not ours either.
                    txn.open_table(MARKS).map_err(|e| self.error(e))?;
                    Ok(Format::Two)
                }
                (false, true) => Ok(Format::One),
                (true, true) => Err(corrupt(&self.path, "it holds both the old and the new marks table")),
                (false, false) => {
                    Err(corrupt(&self.path, "it is a redb database without a fencekeeper_marks_v2 table"))
                }
            }
        })
    }

    /// Run `change` in a durable write transaction; when it reports that it changed
    /// something, commit, then commit once more with nothing in it, so that redb's
    /// previous commit (its fallback) holds the same marks as the latest.
    fn write<T>(
        &self,
        change: impl FnOnce(&WriteTransaction) -> Result<(T, bool), StoreError>,
    ) -> Result<T, StoreError> {
        contained(&self.path, || {
            let txn = self.begin_write()?;
            let (answer, changed) = change(&txn)?;
            if changed {
                txn.commit().map_err(|e| self.error(e))?;
                self.begin_write()?.commit().map_err(|e| self.error(e))?;
            }
            Ok(answer)
        })
    }

    fn begin_write(&self) -> Result<WriteTransaction, StoreError> {
        let mut txn = self.db()?.begin_write().map_err(|e| self.error(e))?;
        // Fsync'd before commit returns: the admit is durable before it is reported.
        txn.set_durability(Durability::Immediate).map_err(|e| self.error(e))?;
        Ok(txn)
    }

    /// Every record, verified one by one.
    fn records(&self) -> Result<Vec<Scanned>, StoreError> {
        contained(&self.path, || {
            let txn = self.db()?.begin_read().map_err(|e| self.error(e))?;
            let table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            let mut all = Vec::new();
            for entry in table.iter().map_err(|e| self.error(e))? {
                let (key, value) = entry.map_err(|e| self.error(e))?;
                let mark = match std::str::from_utf8(key.value()) {
                    Ok(resource) => self.decode(resource, value.value()),
                    Err(_) => Err(self.damaged(&String::from_utf8_lossy(key.value()), "its key is not UTF-8")),
                };
                all.push(Scanned { resource: String::from_utf8_lossy(key.value()).into_owned(), mark });
            }
            // The journal's marks are newer than redb's (a few thousand at most: one
            // lookup a record, and what is left added).
            let mut recent = self.recent.read().unwrap_or_else(|p| p.into_inner()).clone();
            if recent.is_empty() {
                return Ok(all);
            }
            for s in all.iter_mut() {
                if let Some(t) = recent.remove(&s.resource) {
                    s.mark = Ok(t);
                }
            }
            if !recent.is_empty() {
                all.extend(recent.into_iter().map(|(resource, t)| Scanned { resource, mark: Ok(t) }));
                all.sort_by(|a, b| a.resource.cmp(&b.resource));
            }
            Ok(all)
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    One,
    Two,
}

impl MarkStore for FileStore {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        if let Some(t) = self.recent.read().unwrap_or_else(|p| p.into_inner()).get(resource) {
            return Ok(Some(*t));
        }
        contained(&self.path, || {
            let txn = self.db()?.begin_read().map_err(|e| self.error(e))?;
            let table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            let value = table.get(resource.as_bytes()).map_err(|e| self.error(e))?;
            value.map(|v| self.decode(resource, v.value())).transpose()
        })
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        let advance = Advance { resource: resource.to_owned(), expected: expected.copied(), new: *new };
        self.advances.submit(advance, self)
    }

    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        self.records()?.into_iter().map(|s| Ok((s.resource, s.mark?))).collect()
    }

    fn floor(&self) -> Result<Option<Token>, StoreError> {
        self.read_floor()
    }
}

impl FileStore {
    /// `key`'s value in `table`, decoded, in a read transaction of its own; `None`
    /// when the key is absent, or the table (made by its first write) is.
    fn read_one<K: redb::Key + 'static, T>(
        &self,
        table: TableDefinition<'_, K, &'static [u8]>,
        key: K::SelfType<'_>,
        decode: impl FnOnce(&[u8]) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        contained(&self.path, || {
            let txn = self.db()?.begin_read().map_err(|e| self.error(e))?;
            let table = match txn.open_table(table) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(self.error(e)),
            };
            let value = table.get(key).map_err(|e| self.error(e))?;
            value.map(|v| decode(v.value())).transpose()
        })
    }
}

/// Version chains of conditional writes (`crate::chain`), in a table of their own
/// beside the marks: as durable as a mark (sealed by an empty commit, like one).
const CHAINS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("fencekeeper_chains_v1");

impl ChainStore for FileStore {
    fn get(&self, resource: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read_one(CHAINS, resource.as_bytes(), |value| Ok(value.to_vec()))
    }

    fn swap(&self, resource: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool, StoreError> {
        self.write(|txn| {
            let mut table = txn.open_table(CHAINS).map_err(|e| self.error(e))?;
            let value = table.get(resource.as_bytes()).map_err(|e| self.error(e))?.map(|v| v.value().to_vec());
            if value.as_deref() != expected {
                return Ok((false, false));
            }
            table.insert(resource.as_bytes(), new).map_err(|e| self.error(e))?;
            Ok((true, true))
        })
    }

    fn describe(&self) -> String {
        FileStore::describe(self)
    }
}

impl Repair for FileStore {
    fn scan(&self) -> Result<Vec<Scanned>, StoreError> {
        self.records()
    }

    fn raise(&self, resource: &str, to: &Token) -> Result<Raise, StoreError> {
        self.exclusive(|| self.raise_folded(resource, to))
    }

    fn force(&self, resource: &str, to: Option<&Token>) -> Result<Previous, StoreError> {
        self.exclusive(|| self.force_folded(resource, to))
    }
}

impl FileStore {
    fn raise_folded(&self, resource: &str, to: &Token) -> Result<Raise, StoreError> {
        self.write(|txn| {
            let mut table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            let value = table.get(resource.as_bytes()).map_err(|e| self.error(e))?.map(|v| v.value().to_vec());
            let (previous, floor) = judge(resource, value.as_deref(), to);
            if let Some(floor) = floor {
                return Ok((Raise::Refused { floor, previous }, false));
            }
            let value = record::encode(resource.as_bytes(), to);
            table.insert(resource.as_bytes(), value.as_bytes()).map_err(|e| self.error(e))?;
            Ok((Raise::Raised(previous), true))
        })
    }

    fn force_folded(&self, resource: &str, to: Option<&Token>) -> Result<Previous, StoreError> {
        self.write(|txn| {
            let mut table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            let value = table.get(resource.as_bytes()).map_err(|e| self.error(e))?.map(|v| v.value().to_vec());
            let before = previous(resource, value.as_deref());
            match to {
                Some(to) => {
                    let value = record::encode(resource.as_bytes(), to);
                    table.insert(resource.as_bytes(), value.as_bytes()).map_err(|e| self.error(e))?;
                }
                None => {
                    table.remove(resource.as_bytes()).map_err(|e| self.error(e))?;
                }
            }
            let changed = value.is_some() || to.is_some();
            Ok((before, changed))
        })
    }
}

/// Open an existing file, verifying the checksum of every page first.
fn open_verified(path: &Path) -> Result<Database, StoreError> {
    contained(path, || {
        Database::builder()
            .set_cache_size(CACHE_BYTES)
            .set_check_integrity_on_open(true)
            .open(path)
            .map_err(|e| database_error(path, e))
    })
}

/// Create an empty store at `path` atomically (someone else's, made meanwhile, is
/// used instead).
fn create(path: &Path) -> Result<(), StoreError> {
    let made = create_whole(path, |temp| {
        contained(path, || {
            let db =
                Database::builder().set_cache_size(CACHE_BYTES).create(temp).map_err(|e| database_error(path, e))?;
            let store = FileStore::with(db, path.to_owned());
            store.write(|txn| {
                txn.open_table(MARKS).map_err(|e| store.error(e))?;
                Ok(((), true))
            })
        })
    });
    match made {
        // Someone else created the store first: use theirs.
        Err(StoreError::Io { error, .. }) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Make a new file at `path` whole, or not at all: `build` writes it, durable, under
/// a temporary name beside `path`; it is then hard-linked into place, which fails
/// with [`io::ErrorKind::AlreadyExists`] rather than replace a file another process
/// made meanwhile, and the new directory entry is made durable. A crash at any point
/// leaves no half-made file where `path` is looked for.
fn create_whole(path: &Path, build: impl FnOnce(&Path) -> Result<(), StoreError>) -> Result<(), StoreError> {
    let io_err = |error| StoreError::Io { path: path.to_owned(), error };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(io_err)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&temp);
    let linked = build(&temp).and_then(|()| fs::hard_link(&temp, path).map_err(io_err));
    let _ = fs::remove_file(&temp);
    linked?;
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err)
}

fn corrupt(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt { path: path.to_owned(), detail: detail.into() }
}

fn database_error(path: &Path, e: DatabaseError) -> StoreError {
    match e {
        DatabaseError::DatabaseAlreadyOpen => StoreError::Io {
            path: path.to_owned(),
            error: io::Error::new(
                io::ErrorKind::ResourceBusy,
                "the store is in use by another process (or is already open in this one); \
                 one process at a time owns a file store",
            ),
        },
        DatabaseError::UpgradeRequired(v) => {
            corrupt(path, format!("it is in redb file format {v}, which this version cannot read"))
        }
        DatabaseError::Storage(s) => storage_error(path, s),
        other => corrupt(path, other.to_string()),
    }
}

fn storage_error(path: &Path, e: StorageError) -> StoreError {
    match e {
        StorageError::Io(source) if source.kind() == io::ErrorKind::UnexpectedEof => {
            corrupt(path, "the file is shorter than its own header says (truncated?)")
        }
        StorageError::Io(source) if source.kind() == io::ErrorKind::InvalidData => corrupt(path, source.to_string()),
        StorageError::Io(error) => StoreError::Io { path: path.to_owned(), error },
        other => corrupt(path, other.to_string()),
    }
}

fn redb_error(path: &Path, e: redb::Error) -> StoreError {
    match e {
        redb::Error::DatabaseAlreadyOpen => database_error(path, DatabaseError::DatabaseAlreadyOpen),
        redb::Error::Io(source) => storage_error(path, StorageError::Io(source)),
        redb::Error::Corrupted(detail) => corrupt(path, detail),
        // Our table under our name with other types, or gone: not a store we wrote.
        e @ (redb::Error::TableTypeMismatch { .. }
        | redb::Error::TypeDefinitionChanged { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableDoesNotExist(_)) => corrupt(path, e.to_string()),
        other => StoreError::Unavailable(format!("mark store {}: {other}", path.display())),
    }
}
