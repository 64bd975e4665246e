//! Retention in etcd (`fencekeeper_etcd_wire::retention`): the floor beside the
//! marks, first marks that compare it, and compactions that tell idle marks by the
//! revision that last changed them against checkpoints of earlier compactions.

use super::EtcdStore;
use crate::store::retention::{plan, Compaction, Retention};
use crate::store::{StoreError, Swap};
use fencekeeper_core::Token;
use fencekeeper_etcd_wire::retention::{self as wire, Checkpoint, CreateError};
use fencekeeper_etcd_wire::{grpc, Expect, Op, Range, MAX_CONFIRMS_PER_TXN};
use std::sync::MutexGuard;
use std::time::Duration;

/// What the floor's record is checked as, in messages.
const FLOOR_NAME: &str = "(the retention floor)";

impl EtcdStore {
    fn floor_key(&self) -> String {
        wire::floor_key(&self.prefix)
    }

    pub(super) fn cached_floor(&self) -> MutexGuard<'_, Option<Token>> {
        self.floor.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Read the floor from etcd (a linearizable read), and keep it.
    pub(super) fn read_floor(&self) -> Result<Option<Token>, StoreError> {
        let key = self.floor_key();
        let kvs = self.range(&key)?;
        let floor = wire::floor_of(&key, &kvs).map_err(|e| self.mark_error(FLOOR_NAME, &key, e))?;
        *self.cached_floor() = floor;
        Ok(floor)
    }

    /// Give `resource` its first mark `new`, if it still has none and the floor is
    /// still the one last read; else read both back, so the guard decides again
    /// against the mark or the floor etcd holds.
    pub(super) async fn create(&self, resource: &str, new: &Token) -> Result<Swap, StoreError> {
        let (key, floor_key) = (self.key(resource), self.floor_key());
        let floor = *self.cached_floor();
        let answer = self.txn_async(wire::create_txn(&key, resource, &floor_key, floor.as_ref(), new)).await?;
        match wire::created(&answer, resource, &floor_key) {
            Ok(None) => {
                self.seen.set(resource, Some(*new));
                Ok(Swap::Swapped)
            }
            Ok(Some((mark, floor))) => {
                *self.cached_floor() = floor;
                self.seen.set(resource, mark);
                Ok(Swap::Conflict(mark))
            }
            Err(CreateError::Wire(e)) => Err(self.unavailable(e)),
            Err(CreateError::Mark(e)) => Err(self.mark_error(resource, &key, e)),
            Err(CreateError::Floor(e)) => Err(self.mark_error(FLOOR_NAME, &floor_key, e)),
        }
    }

    /// Forget `marks` (resource, key, the value read), all in one Txn when none moved,
    /// else one by one: those that moved are kept. Returns those forgotten.
    fn forget(&self, marks: &[(String, Vec<u8>, Token)]) -> Result<Vec<(String, Token)>, StoreError> {
        let keys: Vec<String> = marks.iter().map(|(r, _, _)| self.key(r)).collect();
        let all: Vec<(&[u8], &[u8])> =
            keys.iter().zip(marks).map(|(k, (_, v, _))| (k.as_bytes(), v.as_slice())).collect();
        let forgotten = |which: &[usize]| which.iter().map(|&i| (marks[i].0.clone(), marks[i].2)).collect::<Vec<_>>();
        if self.txn(wire::forget_txn(&all))?.succeeded {
            return Ok(forgotten(&(0..marks.len()).collect::<Vec<_>>()));
        }
        let mut gone = Vec::new();
        for (i, one) in all.iter().enumerate() {
            if self.txn(wire::forget_txn(std::slice::from_ref(one)))?.succeeded {
                gone.push(i);
            }
        }
        Ok(forgotten(&gone))
    }
}

impl Retention for EtcdStore {
    fn compact(&self, idle_for: Duration, now_unix_secs: u64) -> Result<Compaction, StoreError> {
        let (floor_key, checkpoints_key) = (self.floor_key(), wire::checkpoints_key(&self.prefix));
        // The floor and the checkpoints at one revision: now's.
        let reads = [Op::Range(Range::of(floor_key.as_bytes())), Op::Range(Range::of(checkpoints_key.as_bytes()))];
        let answer = self.txn(grpc::txn(&[], &reads, &[]))?;
        let floor_kvs = answer.read(0).map_err(|e| self.unavailable(e))?;
        let floor_before =
            wire::floor_of(&floor_key, &floor_kvs).map_err(|e| self.mark_error(FLOOR_NAME, &floor_key, e))?;
        let stored = answer.read(1).map_err(|e| self.unavailable(e))?.into_iter().next().map(|kv| kv.value);
        let checkpoints = match &stored {
            Some(value) => wire::decode_checkpoints(&checkpoints_key, value).map_err(|detail| StoreError::Damaged {
                resource: "(the retention checkpoints)".to_owned(),
                store: format!("etcd at {} key {checkpoints_key:?}", self.client.endpoint()),
                detail,
            })?,
            None => Vec::new(),
        };
        let now = Checkpoint { unix_secs: now_unix_secs, revision: answer.revision };
        let mut compaction = Compaction { floor_before, floor: floor_before, ..Compaction::default() };
        match wire::idle_below(&checkpoints, now, idle_for.as_secs()) {
            None => {
                compaction.kept = self.range_all_kv()?.len();
                compaction.not_yet = Some(format!(
                    "no compaction of these marks is {}s old yet, so none is known to be idle that long: this one \
                     recorded etcd's revision {} for the next; run again once it is",
                    idle_for.as_secs(),
                    now.revision
                ));
            }
            Some(below) => {
                let mut idle = Vec::new();
                let mut values = std::collections::HashMap::new();
                for kv in self.range_all_kv()? {
                    let resource = String::from_utf8_lossy(&kv.key);
                    let resource = resource.strip_prefix(&self.prefix).unwrap_or(&resource).to_owned();
                    match self.verify(&resource, &kv.value) {
                        Ok(mark) if kv.mod_revision <= below => {
                            values.insert(resource.clone(), kv.value);
                            idle.push((resource, mark));
                        }
                        // Active, or damaged (its token cannot be trusted for the floor).
                        _ => compaction.kept += 1,
                    }
                }
                let plan = plan(floor_before, idle);
                compaction.other_arity = plan.other_arity;
                compaction.kept += plan.other_arity;
                // The floor first, with a compare-and-swap: from here on, a resource
                // whose mark goes is held to it.
                if plan.floor != floor_before {
                    let old = floor_before.map(|f| wire::floor_record(&floor_key, &f));
                    let new = plan.floor.map(|f| wire::floor_record(&floor_key, &f));
                    let expect = old.as_ref().map_or(Expect::Absent, |r| Expect::Value(r.as_bytes()));
                    let put = new.as_ref().map(|r| r.as_bytes());
                    if !self.txn(grpc::replace_txn(floor_key.as_bytes(), expect, put))?.succeeded {
                        return Err(self.unavailable(
                            "another compaction raised the retention floor meanwhile; nothing was forgotten, run again",
                        ));
                    }
                    *self.cached_floor() = plan.floor;
                }
                compaction.floor = plan.floor;
                let forget: Vec<(String, Vec<u8>, Token)> = plan
                    .forget
                    .into_iter()
                    .map(|(r, t)| {
                        let value = values.remove(&r).unwrap_or_default();
                        (r, value, t)
                    })
                    .collect();
                for chunk in forget.chunks(MAX_CONFIRMS_PER_TXN) {
                    let gone = self.forget(chunk)?;
                    compaction.kept += chunk.len() - gone.len();
                    for (resource, _) in &gone {
                        self.seen.forget(resource);
                    }
                    compaction.forgotten.extend(gone);
                }
            }
        }
        // This compaction's checkpoint, for the next; lost to a concurrent one, which
        // recorded its own.
        let list = wire::encode_checkpoints(&checkpoints_key, &wire::with_checkpoint(checkpoints, now));
        let expect = stored.as_deref().map_or(Expect::Absent, Expect::Value);
        self.txn(grpc::replace_txn(checkpoints_key.as_bytes(), expect, Some(list.as_bytes())))?;
        Ok(compaction)
    }
}
