//! Where marks live. A [`MarkStore`] reads a resource's mark and swaps it only if
//! it is still what the caller read; the guard builds the admit loop on top.
//!
//! Implement the trait on your engine's transaction handle to keep marks inside
//! your own transaction (see `examples/engine_transaction.rs`).

mod awaitable;
mod contain;
pub mod contract;
#[cfg(feature = "etcd")]
mod etcd;
mod file;
mod group;
mod memory;
mod repair;
mod retention;

pub use awaitable::{AwaitableMarks, Pending};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdStore, DEFAULT_PREFIX as ETCD_DEFAULT_PREFIX};
pub use file::{FileStore, Upgrade};
pub use memory::MemoryStore;
pub use repair::{Previous, Raise, Repair, Scanned};
pub use retention::{clears, Compaction, Retention};

use fencekeeper_core::Token;
use std::path::PathBuf;

/// The result of a compare-and-swap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swap {
    /// The mark was the expected one and is now the new one (durably, where the
    /// store claims durability).
    Swapped,
    /// The mark had changed; this is what it is now.
    Conflict(Option<Token>),
}

/// A mark store failed. Never answered by pretending the store is empty: that
/// would re-admit stale writers.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store's file exists but cannot be read as a mark store.
    #[error(
        "mark store {} is corrupt or not a mark store: {detail}; restore it from a backup or move it aside \
         (starting with empty marks would re-admit stale writers)",
        path.display()
    )]
    Corrupt {
        /// The store's file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The store's file could not be opened, read or written.
    // The I/O error is part of the message, not a `source`: the guard's one-line
    // refusal reasons print errors with `Display` alone, and `{:#}` would print it twice.
    #[error("mark store {}: {error}", path.display())]
    Io {
        /// The store's file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A stored mark failed its integrity check (`fencekeeper_core::record`): the
    /// record was damaged, belongs to another resource, or is not a record. Never
    /// read as a lower mark, another resource's mark, or "no mark".
    #[error(
        "mark of resource {resource:?} in {store} is damaged: {detail}; it is not trusted \
         (restore the store from a backup, or raise the mark by hand)"
    )]
    Damaged {
        /// The resource whose record failed.
        resource: String,
        /// Where the record is: the store's file, or the etcd endpoint and key.
        store: String,
        /// What was wrong.
        detail: String,
    },
    /// The store holds marks in format 1 (bare tokens without checksums), written by
    /// an earlier version. They cannot be verified, so they are not read; the
    /// message names the command that upgrades them.
    #[error("{store} holds marks in the old format without checksums (format 1), which are not read unchecked; upgrade them with `{upgrade}`")]
    OldFormat {
        /// The store's file, or the etcd endpoint and key.
        store: String,
        /// The command that upgrades the store.
        upgrade: String,
    },
    /// A remote store could not be reached or answered an error.
    #[error("mark store unavailable: {0}")]
    Unavailable(String),
    /// The store cannot do this (e.g. list its marks).
    #[error("this mark store does not support {0}")]
    Unsupported(&'static str),
}

impl StoreError {
    /// The same error again, for each caller of a group commit that failed as one.
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::Corrupt { path, detail } => StoreError::Corrupt { path: path.clone(), detail: detail.clone() },
            StoreError::Io { path, error } => {
                StoreError::Io { path: path.clone(), error: std::io::Error::new(error.kind(), error.to_string()) }
            }
            StoreError::Damaged { resource, store, detail } => {
                StoreError::Damaged { resource: resource.clone(), store: store.clone(), detail: detail.clone() }
            }
            StoreError::OldFormat { store, upgrade } => {
                StoreError::OldFormat { store: store.clone(), upgrade: upgrade.clone() }
            }
            StoreError::Unavailable(why) => StoreError::Unavailable(why.clone()),
            StoreError::Unsupported(what) => StoreError::Unsupported(what),
        }
    }
}

/// A store of marks: one highest admitted token per resource.
///
/// Contract: `compare_and_swap` is atomic and linearizable with `get`; it only ever
/// raises a mark (the guard guarantees `new` is greater than `expected`); when it
/// returns [`Swap::Swapped`] on a durable store, the new mark is on stable storage.
pub trait MarkStore {
    /// The resource's current mark, or `None` if it has none.
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError>;

    /// Set the mark to `new` if it is still `expected`. From `None` (a first mark) in a
    /// store with a retention floor ([`MarkStore::floor`]): only if the resource still
    /// has no mark and `new` [clears](clears) the floor etcd or the file holds now,
    /// else [`Swap::Conflict`] (with `None` when only the floor stood in the way:
    /// [`MarkStore::floor`] then answers the floor that did).
    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError>;

    /// The retention floor ([`Retention`]): a resource without a mark is held to it
    /// (`None`: no compaction has forgotten a mark). It only rises, and the answer may
    /// lag the store's, never lead it: a token below it is stale, and a first mark
    /// at or above it is checked against the store's own floor by the swap that makes it.
    fn floor(&self) -> Result<Option<Token>, StoreError> {
        Ok(None)
    }

    /// Every (resource, mark), sorted by resource, for inspection.
    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        Err(StoreError::Unsupported("listing marks"))
    }

    /// A read that a remote store may answer from a local copy, to save a round trip.
    /// Marks only rise, so a copy is never above the store's mark; the guard decides
    /// on it but acts only on the store's word: it advances with a compare-and-swap
    /// from the copy, confirms an equal token with [`MarkStore::confirm`], and reads
    /// the store itself before it refuses. By default, [`MarkStore::get`].
    fn read(&self, resource: &str) -> Result<Read, StoreError> {
        Ok(Read { mark: self.get(resource)?, exact: true })
    }

    /// Check, without writing, that the mark is still `mark`: [`Swap::Swapped`] when it
    /// is, else [`Swap::Conflict`] with the mark it is. By default a [`MarkStore::get`].
    fn confirm(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError> {
        Ok(match self.get(resource)? {
            Some(m) if m == *mark => Swap::Swapped,
            other => Swap::Conflict(other),
        })
    }

    /// True when the guard must end every admit of a token equal to the mark with
    /// [`MarkStore::confirm`], even when it read the mark from the store itself. For a
    /// store inside the writer's transaction whose `confirm` holds the mark in place
    /// until the transaction ends (a database's share lock on the mark's row): then no
    /// advance commits between a write admitted at the mark and that write's commit.
    /// By default false: a read from the store itself is the store's word.
    fn confirm_equal_admits(&self) -> bool {
        false
    }

    /// The admit's calls as futures, when the store waits on a network and can be
    /// awaited rather than blocked on ([`AwaitableMarks`]; the etcd store). `None` by
    /// default: the store answers on the calling thread.
    fn awaitable(&self) -> Option<&dyn AwaitableMarks> {
        None
    }
}

/// Whether a swap from `expected` to `new` raises the mark: every store refuses one
/// that does not (a lower token, the same one, or one of another arity), whatever
/// its caller asks, so that nothing lowers a mark by accident (`contract`).
pub fn raises(expected: Option<&Token>, new: &Token) -> bool {
    expected.is_none_or(|e| e.partial_cmp(new) == Some(std::cmp::Ordering::Less))
}

/// The answer of [`MarkStore::read`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// The mark read (`None`: no mark known).
    pub mark: Option<Token>,
    /// It came from the store itself, not from a local copy.
    pub exact: bool,
}

impl<S: MarkStore + ?Sized> MarkStore for std::sync::Arc<S> {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        (**self).get(resource)
    }
    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        (**self).compare_and_swap(resource, expected, new)
    }
    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        (**self).list()
    }
    fn floor(&self) -> Result<Option<Token>, StoreError> {
        (**self).floor()
    }
    fn read(&self, resource: &str) -> Result<Read, StoreError> {
        (**self).read(resource)
    }
    fn confirm(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError> {
        (**self).confirm(resource, mark)
    }
    fn confirm_equal_admits(&self) -> bool {
        (**self).confirm_equal_admits()
    }
    fn awaitable(&self) -> Option<&dyn AwaitableMarks> {
        (**self).awaitable()
    }
}
