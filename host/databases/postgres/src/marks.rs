//! The marks as the writing transaction sees them: `MarkStore` over SPI on
//! `fencekeeper.marks`, one checked record per resource (`fencekeeper_core::record`).
//!
//! Locks, and why row locks: the guard decides on a mark, then acts on the store, and
//! each action takes the row lock that makes it hold until the transaction ends.
//! * An advance is a compare-and-swap: `UPDATE ... WHERE record = <the record read>`
//!   (or `INSERT ... ON CONFLICT DO NOTHING` for a first mark). It waits for any
//!   transaction holding the row, then compares against what that one committed;
//!   lost, the guard decides again on the new mark. The updated row stays locked
//!   until commit, so a rollback takes the advance back and nobody acts on it before.
//! * A write at the mark (the holder writing again) ends with a confirm,
//!   `SELECT ... FOR SHARE`: writers at the same mark share the lock, and an advance
//!   past it waits until they have committed or rolled back. So no row commits with a
//!   token below the mark at its commit, whatever the interleaving.
//! * The decision itself is made on a read that takes no lock (this backend's copy of
//!   the mark when it has one, else a plain `SELECT`): a lock taken before deciding
//!   would have to be upgraded by an advance, and two writers upgrading the same
//!   shared lock deadlock.
//!
//! Row locks rather than advisory locks: the lock is on the mark itself, so it is
//! released with the transaction, follows savepoints, is seen by the deadlock detector
//! and `pg_locks`, and needs no key scheme that another application could collide
//! with. Under REPEATABLE READ or SERIALIZABLE a concurrent advance surfaces as the
//! server's serialization failure (40001): retry the transaction.
//!
//! Each backend keeps a copy of the marks it has seen, to save a statement: the
//! common write (the holder writing again) is then one `FOR SHARE`, an advance one
//! `UPDATE`. The copy is only a hint. A rolled-back advance can even leave it above the
//! table; it never decides alone: an advance is swapped from what it says, an equal
//! token confirmed, a refusal read again from the table.

use fencekeeper::store::Read;
use fencekeeper::{MarkStore, StoreError, Swap, Token};
use fencekeeper_core::record;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;

/// Where the marks are, in messages.
pub const TABLE: &str = "fencekeeper.marks";

/// Marks copied per backend before the copy starts over.
const COPIED: usize = 4096;

/// The statements, prepared once per backend (the server re-plans them when the
/// table changes, and they name every object with its schema).
pub struct Statements {
    read: OwnedPreparedStatement,
    confirm: OwnedPreparedStatement,
    insert: OwnedPreparedStatement,
    update: OwnedPreparedStatement,
    /// The audit's insert (`audit.rs`).
    pub audit: OwnedPreparedStatement,
}

const READ: &str = "SELECT record FROM fencekeeper.marks WHERE resource OPERATOR(pg_catalog.=) $1";
const CONFIRM: &str = "SELECT record FROM fencekeeper.marks WHERE resource OPERATOR(pg_catalog.=) $1 FOR SHARE";
const INSERT: &str =
    "INSERT INTO fencekeeper.marks (resource, record) VALUES ($1, $2) ON CONFLICT (resource) DO NOTHING";
const UPDATE: &str = "UPDATE fencekeeper.marks SET record = $3 \
                      WHERE resource OPERATOR(pg_catalog.=) $1 AND record OPERATOR(pg_catalog.=) $2";
const AUDIT: &str = "INSERT INTO fencekeeper.audit (resource, entry) VALUES ($1, $2::pg_catalog.json)";

thread_local! {
    static STATEMENTS: RefCell<Option<std::rc::Rc<Statements>>> = const { RefCell::new(None) };
    static COPY: RefCell<HashMap<String, Token>> = RefCell::new(HashMap::new());
}

impl Statements {
    /// This backend's statements, prepared on `client` the first time.
    pub fn get(client: &SpiClient<'_>) -> Result<std::rc::Rc<Statements>, StoreError> {
        if let Some(kept) = STATEMENTS.with_borrow(|s| s.clone()) {
            return Ok(kept);
        }
        let text = PgOid::from(pg_sys::TEXTOID);
        let prepare = |query: &str, args: usize| {
            client.prepare_mut(query, &vec![text; args]).map(|s| s.keep()).map_err(spi_error)
        };
        let statements = std::rc::Rc::new(Statements {
            read: prepare(READ, 1)?,
            confirm: prepare(CONFIRM, 1)?,
            insert: prepare(INSERT, 2)?,
            update: prepare(UPDATE, 3)?,
            audit: prepare(AUDIT, 2)?,
        });
        STATEMENTS.with_borrow_mut(|s| *s = Some(statements.clone()));
        Ok(statements)
    }
}

/// The marks through one SPI connection, inside the writer's transaction.
pub struct Marks<'a, 'conn> {
    client: &'a SpiClient<'conn>,
    statements: std::rc::Rc<Statements>,
}

impl<'a, 'conn> Marks<'a, 'conn> {
    /// The marks through `client`.
    pub fn new(client: &'a SpiClient<'conn>) -> Result<Marks<'a, 'conn>, StoreError> {
        Ok(Marks { statements: Statements::get(client)?, client })
    }

    /// The statements (for the audit's insert).
    pub fn statements(&self) -> &Statements {
        &self.statements
    }

    /// Run `statement` with text parameters.
    pub fn run(&self, statement: &OwnedPreparedStatement, args: &[&[u8]]) -> Result<SpiTupleTable<'conn>, StoreError> {
        let args: Vec<DatumWithOid<'_>> = args
            .iter()
            // SAFETY: a byte slice becomes a varlena, the representation of text too;
            // the bytes are server text (keys converted by `text::to_server`, records
            // ASCII) and the statement declares every parameter as text.
            .map(|bytes| unsafe { DatumWithOid::new(*bytes, pg_sys::TEXTOID) })
            .collect();
        self.client.select(statement, None, &args).map_err(spi_error)
    }

    /// The record in the first row of `table`, checked for `resource`.
    fn record(resource: &str, table: SpiTupleTable<'_>) -> Result<Option<Token>, StoreError> {
        if table.is_empty() {
            return Ok(None);
        }
        let datum = table.first().get_datum_by_ordinal(1).map_err(spi_error)?;
        let value = match datum {
            // SAFETY: column 1 of every marks statement is `record`, a text column.
            Some(datum) => unsafe { crate::text::datum_bytes(datum, pg_sys::TEXTOID) },
            None => Vec::new(),
        };
        record::decode(resource.as_bytes(), &value).map(Some).map_err(|e| StoreError::Damaged {
            resource: resource.to_owned(),
            store: format!("table {TABLE}"),
            detail: e.to_string(),
        })
    }

    fn key(resource: &str) -> std::borrow::Cow<'_, [u8]> {
        crate::text::to_server(resource)
    }

    fn remember(resource: &str, mark: Option<Token>) {
        COPY.with_borrow_mut(|copy| match mark {
            Some(mark) => {
                if copy.len() >= COPIED && !copy.contains_key(resource) {
                    copy.clear();
                }
                copy.insert(resource.to_owned(), mark);
            }
            None => {
                copy.remove(resource);
            }
        });
    }
}

impl MarkStore for Marks<'_, '_> {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        let table = self.run(&self.statements.read, &[&Self::key(resource)])?;
        let mark = Self::record(resource, table)?;
        Self::remember(resource, mark);
        Ok(mark)
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        // The statements compare record bytes, not tokens: a swap that would not raise
        // the mark is refused here, whatever its caller asks.
        if !fencekeeper::store::raises(expected, new) {
            return Ok(Swap::Conflict(self.get(resource)?));
        }
        let key = Self::key(resource);
        let new_record = record::encode(resource.as_bytes(), new);
        let changed = match expected {
            None => self.run(&self.statements.insert, &[&key, new_record.as_bytes()])?.len(),
            Some(old) => {
                let old_record = record::encode(resource.as_bytes(), old);
                self.run(&self.statements.update, &[&key, old_record.as_bytes(), new_record.as_bytes()])?.len()
            }
        };
        if changed == 1 {
            Self::remember(resource, Some(*new));
            return Ok(Swap::Swapped);
        }
        Ok(Swap::Conflict(self.get(resource)?))
    }

    fn read(&self, resource: &str) -> Result<Read, StoreError> {
        match COPY.with_borrow(|copy| copy.get(resource).copied()) {
            Some(mark) => Ok(Read { mark: Some(mark), exact: false }),
            None => Ok(Read { mark: self.get(resource)?, exact: true }),
        }
    }

    fn confirm(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError> {
        let table = self.run(&self.statements.confirm, &[&Self::key(resource)])?;
        let current = Self::record(resource, table)?;
        Self::remember(resource, current);
        Ok(if current.as_ref() == Some(mark) { Swap::Swapped } else { Swap::Conflict(current) })
    }

    /// Every write at the mark ends with the `FOR SHARE` confirm: the lock that keeps
    /// an advance from committing before this write does.
    fn confirm_equal_admits(&self) -> bool {
        true
    }
}

fn spi_error(e: pgrx::spi::SpiError) -> StoreError {
    StoreError::Unavailable(format!("{TABLE}: {e}"))
}
