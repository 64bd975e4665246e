//! Where marks live. A [`MarkStore`] reads a resource's mark and swaps it only if
//! it is still what the caller read; the guard builds the admit loop on top.
//!
//! Implement the trait on your engine's transaction handle to keep marks inside
//! your own transaction (see `examples/engine_transaction.rs`).

#[cfg(feature = "etcd")]
mod etcd;
mod file;
mod memory;

#[cfg(feature = "etcd")]
pub use etcd::{EtcdStore, DEFAULT_PREFIX as ETCD_DEFAULT_PREFIX};
pub use file::FileStore;
pub use memory::MemoryStore;

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
    /// A stored mark is not a valid token.
    #[error("stored mark for resource {resource:?} is not a valid token ({detail}); the store is damaged")]
    BadMark {
        /// The resource.
        resource: String,
        /// Why the mark is unreadable.
        detail: String,
    },
    /// A remote store could not be reached or answered an error.
    #[error("mark store unavailable: {0}")]
    Unavailable(String),
    /// The store cannot do this (e.g. list its marks).
    #[error("this mark store does not support {0}")]
    Unsupported(&'static str),
}

/// A store of marks: one highest admitted token per resource.
///
/// Contract: `compare_and_swap` is atomic and linearizable with `get`; it only ever
/// raises a mark (the guard guarantees `new` is greater than `expected`); when it
/// returns [`Swap::Swapped`] on a durable store, the new mark is on stable storage.
pub trait MarkStore {
    /// The resource's current mark, or `None` if it has none.
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError>;

    /// Set the mark to `new` if it is still `expected`.
    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError>;

    /// Every (resource, mark), sorted by resource, for inspection.
    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        Err(StoreError::Unsupported("listing marks"))
    }
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
}
