//! An in-memory mark store: concurrent, sharded by resource hash. Marks die with
//! the process, so use it for tests, caches and efficiency-mode deployments only.

use super::{MarkStore, StoreError, Swap};
use fencekeeper_core::Token;
use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 64;

/// A concurrent in-memory [`MarkStore`].
pub struct MemoryStore {
    shards: Vec<Mutex<HashMap<String, Token>>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore { shards: (0..SHARDS).map(|_| Mutex::default()).collect() }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn shard(&self, resource: &str) -> std::sync::MutexGuard<'_, HashMap<String, Token>> {
        let mut h = DefaultHasher::new();
        resource.hash(&mut h);
        // A poisoned shard only means another thread panicked between two map
        // operations; each operation leaves the map consistent, so keep serving.
        self.shards[h.finish() as usize % SHARDS].lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl MarkStore for MemoryStore {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        Ok(self.shard(resource).get(resource).copied())
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        let mut shard = self.shard(resource);
        match shard.entry(resource.to_owned()) {
            // A non-raising swap is refused as a conflict: this store never lowers a
            // mark, whatever its caller asks (the contract, `store::contract`).
            Entry::Occupied(e) if !super::raises(Some(e.get()), new) => Ok(Swap::Conflict(Some(*e.get()))),
            Entry::Occupied(mut e) if Some(e.get()) == expected => {
                e.insert(*new);
                Ok(Swap::Swapped)
            }
            Entry::Occupied(e) => Ok(Swap::Conflict(Some(*e.get()))),
            Entry::Vacant(e) if expected.is_none() => {
                e.insert(*new);
                Ok(Swap::Swapped)
            }
            Entry::Vacant(_) => Ok(Swap::Conflict(None)),
        }
    }

    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        let mut all: Vec<(String, Token)> = self
            .shards
            .iter()
            .flat_map(|s| {
                s.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(all)
    }
}
