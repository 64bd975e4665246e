//! The shapes of an etcd transaction, whatever encodes them: what it compares a key
//! with ([`Expect`]), what its branches do ([`Op`], [`Range`]), and what it answered
//! ([`TxnAnswer`], [`KeyValue`]). [`crate::grpc`] writes and parses them.

use crate::WireError;

/// What a transaction compares a key with.
#[derive(Clone, Copy, Debug)]
pub enum Expect<'a> {
    /// The key does not exist (`create_revision == 0`).
    Absent,
    /// The key holds exactly these bytes.
    Value(&'a [u8]),
    /// The key was created at this revision.
    CreatedAt(i64),
    /// The key was last modified at this revision.
    ModifiedAt(i64),
}

/// A range read inside a transaction.
#[derive(Clone, Debug, Default)]
pub struct Range<'a> {
    /// The key, or the first key of the range.
    pub key: &'a [u8],
    /// Every key under `key` (a prefix range), not just `key`.
    pub prefix: bool,
    /// Without `prefix`: every key from `key` up to this one (excluded).
    pub end: Option<&'a [u8]>,
    /// At most this many keys (0: all).
    pub limit: u64,
    /// Sorted by create revision: ascending (`Some(true)`) or descending.
    pub by_create_revision: Option<bool>,
    /// Only keys created at or before this revision.
    pub max_create_revision: Option<i64>,
    /// Keys without their values.
    pub keys_only: bool,
}

impl<'a> Range<'a> {
    /// A read of `key` alone.
    pub fn of(key: &'a [u8]) -> Range<'a> {
        Range { key, ..Range::default() }
    }

    /// A lock queue's head, for etcd's lock recipe (`concurrency.Mutex`): the first
    /// key under `prefix` by create revision (ascending), or with `max_create` the last
    /// one created at or before it (descending).
    pub fn lock_queue_head(prefix: &'a [u8], max_create: Option<i64>) -> Range<'a> {
        Range {
            key: prefix,
            prefix: true,
            end: None,
            limit: 1,
            by_create_revision: Some(max_create.is_none()),
            max_create_revision: max_create,
            keys_only: false,
        }
    }
}

/// One operation of a transaction's branch.
#[derive(Clone, Debug)]
pub enum Op<'a> {
    /// Put a value, under a lease if given.
    Put {
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// The lease ID.
        lease: Option<i64>,
    },
    /// Read.
    Range(Range<'a>),
    /// Delete one key.
    Delete {
        /// The key.
        key: &'a [u8],
    },
}

/// The most marks one confirm transaction compares ([`crate::grpc::confirm_txn`]):
/// etcd refuses a Txn of more than `--max-txn-ops` (default 128) operations in a
/// branch.
pub const MAX_CONFIRMS_PER_TXN: usize = 64;

/// A key and its value, as a read answered them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key.
    pub create_revision: u64,
    /// The revision that last changed the key (retention tells idle marks by it).
    pub mod_revision: u64,
}

/// What a transaction answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnAnswer {
    /// The compare held.
    pub succeeded: bool,
    /// Every operation's answer, in order: a read's key-values, or `None` for an
    /// operation that is not a read.
    pub(crate) ranges: Vec<Option<Vec<KeyValue>>>,
    /// The cluster's revision after the transaction.
    pub revision: u64,
}

impl TxnAnswer {
    /// The read that operation `i` of the branch that ran answered. An answer that
    /// lacks it is an error, never "no key": a missing read-back must not pass for
    /// a resource without a mark.
    pub fn read(&self, i: usize) -> Result<Vec<KeyValue>, WireError> {
        match self.ranges.get(i) {
            Some(Some(kvs)) => Ok(kvs.clone()),
            _ => Err(WireError(format!("etcd's Txn answer lacks the read of operation {i}"))),
        }
    }

    /// The read of `key` that ends the branch that ran (one appended with
    /// [`crate::grpc::also_reading`]): its value, `None` when absent. A read that
    /// answered another key, or more than one, is an error: a record must never be
    /// taken for another key's.
    pub fn last_read(&self, key: &[u8]) -> Result<Option<Vec<u8>>, WireError> {
        let last =
            self.ranges.len().checked_sub(1).ok_or_else(|| WireError("etcd's Txn answer has no operation".into()))?;
        match self.read(last)?.as_slice() {
            [] => Ok(None),
            [kv] if kv.key == key => Ok(Some(kv.value.clone())),
            other => Err(WireError(format!(
                "etcd's Txn answer's last read gave {} key(s), not the one asked ({})",
                other.len(),
                String::from_utf8_lossy(key)
            ))),
        }
    }

    /// How many operations the branch that ran answered.
    pub fn operations(&self) -> usize {
        self.ranges.len()
    }
}
