//! A durable mark store in one file: an embedded redb database.
//!
//! Why redb rather than a home-made append log: it is a real embedded database
//! with checksummed pages, copy-on-write commits that are fsync'd before
//! `commit` returns (`Durability::Immediate`), crash recovery that falls back to
//! the last committed root, and a file lock against a second writer process. An
//! append log would have to get every one of those right again.
//!
//! Marks are stored as their canonical text (`Token`'s `Display`) under the
//! resource key, so a store can be read with any redb tool. A value that does not
//! parse is reported ([`StoreError::BadMark`]), never skipped.
//!
//! The one promise above all: a store that cannot be read is an error, never an
//! empty store, because empty marks re-admit every stale writer. So opening an
//! existing file never creates anything, and a new file is built under a temporary
//! name and linked into place only when complete: a crash during creation leaves no
//! half-made store that would later read as empty.

use super::{MarkStore, StoreError, Swap};
use fencekeeper_core::Token;
use redb::{Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, StorageError, TableDefinition};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// resource key -> canonical token text.
const MARKS: TableDefinition<&str, &str> = TableDefinition::new("fencekeeper_marks");

/// redb's page cache; marks are small and the OS caches the file too.
const CACHE_BYTES: usize = 16 << 20;

/// A durable [`MarkStore`] in one redb file. An advancing compare-and-swap is on
/// stable storage before it returns [`Swap::Swapped`]; reads cost no I/O beyond
/// the page cache. Safe to share between threads; one process at a time.
pub struct FileStore {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore").field("path", &self.path).finish_non_exhaustive()
    }
}

impl FileStore {
    /// Open the store at `path`, creating it (and its directory) when no file exists.
    /// An existing file that is empty, damaged or not a mark store is an error.
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
        let db = Database::builder().set_cache_size(CACHE_BYTES).open(&path).map_err(|e| database_error(&path, e))?;
        let store = FileStore { db, path };
        // A redb file without our table is some other database, not an empty store.
        let txn = store.db.begin_read().map_err(|e| store.error(e))?;
        txn.open_table(MARKS).map_err(|e| match e {
            redb::TableError::TableDoesNotExist(_) => {
                corrupt(&store.path, "it is a redb database without a fencekeeper_marks table")
            }
            other => store.error(other),
        })?;
        drop(txn);
        Ok(store)
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, e: impl Into<redb::Error>) -> StoreError {
        redb_error(&self.path, e.into())
    }

    fn parse(&self, resource: &str, text: &str) -> Result<Token, StoreError> {
        Token::parse(text).map_err(|e| StoreError::BadMark { resource: resource.to_owned(), detail: e.to_string() })
    }
}

impl MarkStore for FileStore {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.error(e))?;
        let table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
        let value = table.get(resource).map_err(|e| self.error(e))?;
        value.map(|v| self.parse(resource, v.value())).transpose()
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.error(e))?;
        // Fsync'd before commit returns: the admit is durable before it is reported.
        txn.set_durability(Durability::Immediate).map_err(|e| self.error(e))?;
        {
            let mut table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
            let current = match table.get(resource).map_err(|e| self.error(e))? {
                Some(v) => Some(self.parse(resource, v.value())?),
                None => None,
            };
            // The check happens inside the write transaction, so nothing can slip
            // between it and the insert. A non-raising swap is refused as a conflict
            // too: this store never lowers a mark, whatever its caller asks.
            let raises = current.is_none_or(|c| new.partial_cmp(&c) == Some(std::cmp::Ordering::Greater));
            if current.as_ref() != expected || !raises {
                return Ok(Swap::Conflict(current));
            }
            table.insert(resource, new.to_string().as_str()).map_err(|e| self.error(e))?;
        }
        txn.commit().map_err(|e| self.error(e))?;
        Ok(Swap::Swapped)
    }

    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.error(e))?;
        let table = txn.open_table(MARKS).map_err(|e| self.error(e))?;
        let mut all = Vec::new();
        for entry in table.iter().map_err(|e| self.error(e))? {
            let (key, value) = entry.map_err(|e| self.error(e))?;
            let resource = key.value().to_owned();
            let mark = self.parse(&resource, value.value())?;
            all.push((resource, mark));
        }
        Ok(all)
    }
}

/// Create an empty store at `path` atomically: build it under a temporary name,
/// then hard-link it into place, which fails rather than replace a file another
/// process created meanwhile.
fn create(path: &Path) -> Result<(), StoreError> {
    let io_err = |error| StoreError::Io { path: path.to_owned(), error };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(io_err)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&temp);
    let built = (|| -> Result<(), StoreError> {
        let db = Database::builder().set_cache_size(CACHE_BYTES).create(&temp).map_err(|e| database_error(path, e))?;
        let mut txn = db.begin_write().map_err(|e| redb_error(path, e.into()))?;
        txn.set_durability(Durability::Immediate).map_err(|e| redb_error(path, e.into()))?;
        txn.open_table(MARKS).map_err(|e| redb_error(path, e.into()))?;
        txn.commit().map_err(|e| redb_error(path, e.into()))?;
        Ok(())
    })();
    let linked = built.and_then(|()| match fs::hard_link(&temp, path) {
        // Someone else created the store first: use theirs.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other.map_err(io_err),
    });
    let _ = fs::remove_file(&temp);
    linked?;
    // Make the new directory entry itself durable.
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
        other => StoreError::Unavailable(format!("mark store {}: {other}", path.display())),
    }
}
