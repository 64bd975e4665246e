//! The marks an etcd store has seen: a lower bound of each (marks only rise), so the
//! guard can decide before its one round trip.

use fencekeeper_core::Token;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// Marks this store has seen in etcd, sharded so that callers on different
/// resources rarely meet on one lock. Bounded: a full shard is cleared (a miss only
/// costs a linearizable read).
pub(super) struct Seen {
    shards: Vec<Mutex<HashMap<String, Token>>>,
}

const SEEN_SHARDS: usize = 64;
const SEEN_PER_SHARD: usize = 4096;

impl Seen {
    pub(super) fn new() -> Seen {
        Seen { shards: (0..SEEN_SHARDS).map(|_| Mutex::default()).collect() }
    }

    fn shard(&self, resource: &str) -> std::sync::MutexGuard<'_, HashMap<String, Token>> {
        let mut h = DefaultHasher::new();
        resource.hash(&mut h);
        self.shards[h.finish() as usize % SEEN_SHARDS].lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn get(&self, resource: &str) -> Option<Token> {
        self.shard(resource).get(resource).copied()
    }

    /// Drop the copy of `resource`'s mark (after it was set by force, possibly lower).
    pub(super) fn forget(&self, resource: &str) {
        self.shard(resource).remove(resource);
    }

    /// Remember what etcd just said the mark is (an older answer arriving late only
    /// makes the copy lower, which costs a round, never a wrong answer).
    pub(super) fn set(&self, resource: &str, mark: Option<Token>) {
        let mut shard = self.shard(resource);
        match mark {
            Some(m) => {
                if shard.len() >= SEEN_PER_SHARD && !shard.contains_key(resource) {
                    shard.clear();
                }
                shard.insert(resource.to_owned(), m);
            }
            None => {
                shard.remove(resource);
            }
        }
    }
}
