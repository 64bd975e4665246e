//! Where chains live: beside the marks, in the same store. The file store keeps them
//! in a table of its database, the etcd store under a key prefix of its own, so a
//! chain is as durable, and as shared between gateways, as the marks are.

use crate::store::StoreError;
use std::collections::HashMap;
use std::sync::Mutex;

/// A store of version chains: raw records, changed only by compare-and-swap.
///
/// Contract: `swap` is atomic and linearizable with `get`; when it returns true on a
/// durable store, the new record is on stable storage.
pub trait ChainStore: Send + Sync {
    /// The record stored for `resource`, if any.
    fn get(&self, resource: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Store `new` for `resource` if its record is still `expected` (`None`: none).
    fn swap(&self, resource: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool, StoreError>;

    /// Where the chains are, for messages.
    fn describe(&self) -> String;
}

/// Chains in memory: lost with the process, like [`crate::MemoryStore`]'s marks.
#[derive(Default)]
pub struct MemoryChains {
    records: Mutex<HashMap<String, Vec<u8>>>,
}

impl ChainStore for MemoryChains {
    fn get(&self, resource: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.records.lock().unwrap_or_else(|p| p.into_inner()).get(resource).cloned())
    }

    fn swap(&self, resource: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool, StoreError> {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if records.get(resource).map(Vec::as_slice) != expected {
            return Ok(false);
        }
        records.insert(resource.to_owned(), new.to_vec());
        Ok(true)
    }

    fn describe(&self) -> String {
        "memory".to_owned()
    }
}
