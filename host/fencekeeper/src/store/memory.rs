//! An in-memory mark store: concurrent, sharded by resource hash. Marks die with
//! the process, so use it for tests, caches and efficiency-mode deployments only.
//!
//! It keeps retention's floor too ([`Retention`]), so that an embedding that bounds
//! its memory can forget idle marks without admitting below them.

use super::retention::{clears, plan, Compaction, Retention};
use super::{MarkStore, StoreError, Swap};
use fencekeeper_core::Token;
use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

const SHARDS: usize = 64;

/// A concurrent in-memory [`MarkStore`].
pub struct MemoryStore {
    shards: Vec<Mutex<HashMap<String, Token>>>,
    /// The retention floor. Locked after a shard, never before one.
    floor: Mutex<Option<Token>>,
    /// Each mark as a compaction last saw it, and since when (Unix seconds): a mark
    /// still equal to it has not risen since.
    since: Mutex<HashMap<String, (Token, u64)>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            floor: Mutex::default(),
            since: Mutex::default(),
        }
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
            // The shard's lock is held from the check to the insert: no compaction can
            // forget this resource's mark in between (it needs the lock to remove one).
            Entry::Vacant(e) if expected.is_none() && clears(lock(&self.floor).as_ref(), new) => {
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

    fn floor(&self) -> Result<Option<Token>, StoreError> {
        Ok(*lock(&self.floor))
    }
}

impl Retention for MemoryStore {
    fn compact(&self, idle_for: Duration, now_unix_secs: u64) -> Result<Compaction, StoreError> {
        let marks = self.list()?;
        let mut since = lock(&self.since);
        let (idle, not_idle) = idle_since(&mut since, &marks, idle_for, now_unix_secs);
        let floor_before = *lock(&self.floor);
        let plan = plan(floor_before, idle);
        // The floor first: from here on, a resource whose mark goes is held to it.
        *lock(&self.floor) = plan.floor;
        let mut forgotten = Vec::with_capacity(plan.forget.len());
        let mut kept = not_idle + plan.other_arity;
        for (resource, mark) in plan.forget {
            let mut shard = self.shard(&resource);
            if shard.get(&resource) == Some(&mark) {
                shard.remove(&resource);
                since.remove(&resource);
                forgotten.push((resource, mark));
            } else {
                kept += 1; // it rose meanwhile
            }
        }
        Ok(Compaction {
            forgotten,
            floor_before,
            floor: plan.floor,
            kept,
            other_arity: plan.other_arity,
            not_yet: None,
        })
    }
}

/// The marks idle for `idle_for` at `now` by `since` (each mark as a compaction last saw
/// it), which is brought up to date: a mark seen for the first time, or risen since,
/// is idle from now. Returns the idle marks and how many others there are.
pub(crate) fn idle_since(
    since: &mut HashMap<String, (Token, u64)>,
    marks: &[(String, Token)],
    idle_for: Duration,
    now: u64,
) -> (Vec<(String, Token)>, usize) {
    let mut idle = Vec::new();
    for (resource, mark) in marks {
        let seen = since.entry(resource.clone()).or_insert((*mark, now));
        if seen.0 != *mark {
            *seen = (*mark, now);
        }
        if now.saturating_sub(seen.1) >= idle_for.as_secs() {
            idle.push((resource.clone(), *mark));
        }
    }
    // Marks gone since (cleared by hand) are forgotten here too.
    if since.len() > marks.len() {
        let present: std::collections::HashSet<&str> = marks.iter().map(|(r, _)| r.as_str()).collect();
        since.retain(|r, _| present.contains(r.as_str()));
    }
    let others = marks.len() - idle.len();
    (idle, others)
}

/// A lock whose holder panicked is still consistent: each operation completes under it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
