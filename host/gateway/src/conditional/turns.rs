//! One conditional write at a time per resource: two writes of one holder would
//! otherwise race on one version, and one of them fail.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::OwnedMutexGuard;

/// Every resource's turn that is held or waited for.
#[derive(Default)]
pub struct Turns {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A resource's turn: one conditional write at a time. Dropped, it lets the next go,
/// and forgets the resource once nobody waits.
pub struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    key: String,
    turns: Arc<Turns>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut map = lock(&self.turns.map);
        drop(self.guard.take());
        // Only the map's reference is left (a waiter holds one inside its lock): nobody
        // holds or waits for the turn. Under the map's lock, so nobody can take one
        // between the count and the removal.
        if map.get(&self.key).is_some_and(|m| Arc::strong_count(m) <= 1) {
            map.remove(&self.key);
        }
    }
}

impl Turns {
    /// `resource`'s turn, waiting at most `wait` for it (`None`: not free in time).
    pub async fn take(self: &Arc<Self>, resource: &str, wait: Duration) -> Option<Turn> {
        let mutex = lock(&self.map).entry(resource.to_owned()).or_default().clone();
        let guard = tokio::time::timeout(wait, mutex.lock_owned()).await.ok();
        // Made even when the wait failed, so that the map entry is forgotten.
        let turn = Turn { guard, key: resource.to_owned(), turns: self.clone() };
        turn.guard.is_some().then_some(turn)
    }

    /// How many resources have a turn held or waited for.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).len()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
