//! Retention in etcd: the floor under forgotten marks, and the checkpoints that tell
//! which marks are idle.
//!
//! A compaction forgets the marks of idle resources and keeps one floor at or above
//! every mark it forgot; a resource without a mark is then held to the floor.
//!
//! * The floor lives at the marks' prefix itself (`/fencekeeper/marks/`): the key of
//!   the empty resource, which no resource has (keys are 1 byte or more). So every host
//!   that may read and write the marks' prefix (an etcd role granted on it) reads the
//!   floor too; listings skip it. Its value is a checked record of the floor token,
//!   the floor key standing for the resource in its checksum, so it never passes for
//!   a mark.
//! * The checkpoints live at the prefix with `.retention` in place of its last `/`
//!   (`/fencekeeper/marks.retention`), outside the marks' range: only a compaction
//!   reads them. When each compaction ran and etcd's revision then, `fkr1 SECS:REV ...
//!   CRC`. etcd keeps no time, so "idle for T" is "not changed since the revision of a
//!   checkpoint at least T old".
//!
//! Every writer that creates a mark compares the floor in the same Txn
//! ([`create_txn`]): a compaction that raised the floor meanwhile fails the create, and
//! its failure branch reads the floor back. So a create is never judged against a
//! floor older than the one etcd holds when it commits.

use crate::grpc;
use crate::mark::{mark_of, MarkError};
use crate::txn::{Expect, KeyValue, Op, Range, TxnAnswer};
use crate::WireError;
use fencekeeper_core::record;
use fencekeeper_core::Token;

/// The etcd key of the retention floor of the marks under `prefix`: the prefix itself.
pub fn floor_key(prefix: &str) -> String {
    prefix.to_owned()
}

/// The etcd key of the retention checkpoints of the marks under `prefix`.
pub fn checkpoints_key(prefix: &str) -> String {
    format!("{}.retention", prefix.trim_end_matches('/'))
}

/// The value that records `floor` at `floor_key`.
pub fn floor_record(floor_key: &str, floor: &Token) -> record::Record {
    record::encode(floor_key.as_bytes(), floor)
}

/// The floor a read of `floor_key` returned (`None`: no compaction ever raised one).
/// A value that is not the key's checked record is an error, never "no floor".
pub fn floor_of(floor_key: &str, kvs: &[KeyValue]) -> Result<Option<Token>, MarkError> {
    kvs.first().map(|kv| mark_of(floor_key, &kv.value)).transpose()
}

/// The Txn that gives `resource` (at `key`) its first mark `new`: compare that the key
/// is absent and that the floor at `floor_key` is still `floor` (absent when `None`),
/// then put; on failure read the key and the floor back, in that order.
pub fn create_txn(key: &str, resource: &str, floor_key: &str, floor: Option<&Token>, new: &Token) -> Vec<u8> {
    let put = record::encode(resource.as_bytes(), new);
    let seen = floor.map(|f| floor_record(floor_key, f));
    let floor_expect = seen.as_ref().map_or(Expect::Absent, |r| Expect::Value(r.as_bytes()));
    let (key, floor_key) = (key.as_bytes(), floor_key.as_bytes());
    grpc::txn(
        &[(key, Expect::Absent), (floor_key, floor_expect)],
        &[Op::Put { key, value: put.as_bytes(), lease: None }],
        &[Op::Range(Range::of(key)), Op::Range(Range::of(floor_key))],
    )
}

/// What a lost [`create_txn`] read back: the resource's mark and the floor, each
/// `None` when absent.
pub type Standing = (Option<Token>, Option<Token>);

/// The answer to [`create_txn`]: `Ok(None)` when the mark was created, else the
/// resource's current mark and the current floor.
pub fn created(answer: &TxnAnswer, resource: &str, floor_key: &str) -> Result<Option<Standing>, CreateError> {
    if answer.succeeded {
        return Ok(None);
    }
    let mark = answer.read(0)?;
    let mark = mark.first().map(|kv| mark_of(resource, &kv.value)).transpose().map_err(CreateError::Mark)?;
    let floor = floor_of(floor_key, &answer.read(1)?).map_err(CreateError::Floor)?;
    Ok(Some((mark, floor)))
}

/// Why an answer to [`create_txn`] could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// The answer lacks a read or is malformed.
    Wire(WireError),
    /// The resource's value is not its verified mark.
    Mark(MarkError),
    /// The floor's value is not its verified record.
    Floor(MarkError),
}

impl From<WireError> for CreateError {
    fn from(e: WireError) -> CreateError {
        CreateError::Wire(e)
    }
}

/// The most checkpoints kept: the newest, one per compaction. A compaction that runs
/// every few minutes keeps hours of them, which covers any `--idle-for` it is run with
/// as often as it runs.
pub const MAX_CHECKPOINTS: usize = 256;

/// What every checkpoints value starts with.
const CHECKPOINTS_TAG: &str = "fkr1";

/// One compaction's checkpoint: when it ran (seconds since the Unix epoch, the
/// compacting host's clock) and etcd's revision then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Seconds since the Unix epoch.
    pub unix_secs: u64,
    /// etcd's revision.
    pub revision: u64,
}

/// The checkpoints value: oldest first, checksummed under `key`.
pub fn encode_checkpoints(key: &str, checkpoints: &[Checkpoint]) -> String {
    let mut text = String::from(CHECKPOINTS_TAG);
    for c in checkpoints {
        text.push_str(&format!(" {}:{}", c.unix_secs, c.revision));
    }
    text.push(' ');
    let crc = record::checksum(key.as_bytes(), text.as_bytes());
    format!("{text}{crc:08x}")
}

/// The checkpoints a value at `key` records, checked. Anything but what
/// [`encode_checkpoints`] writes is an error: a damaged list could make a compaction
/// take an active mark for an idle one.
pub fn decode_checkpoints(key: &str, value: &[u8]) -> Result<Vec<Checkpoint>, String> {
    let bad = |why: &str| format!("the retention checkpoints at {key:?} are damaged: {why}");
    let text = std::str::from_utf8(value).map_err(|_| bad("not text"))?;
    let (body, crc) = text.rsplit_once(' ').ok_or_else(|| bad("no checksum"))?;
    let checked = &text[..body.len() + 1];
    if crc.len() != 8 || u32::from_str_radix(crc, 16).ok() != Some(record::checksum(key.as_bytes(), checked.as_bytes()))
    {
        return Err(bad("the checksum does not match"));
    }
    let mut words = body.split(' ');
    if words.next() != Some(CHECKPOINTS_TAG) {
        return Err(bad("not a checkpoints record"));
    }
    let checkpoints = words
        .map(|w| {
            let (secs, rev) = w.split_once(':')?;
            Some(Checkpoint { unix_secs: secs.parse().ok()?, revision: rev.parse().ok()? })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("an entry is not SECS:REVISION"))?;
    if checkpoints.len() > MAX_CHECKPOINTS || checkpoints.windows(2).any(|w| w[0].revision > w[1].revision) {
        return Err(bad("too many entries, or out of order"));
    }
    Ok(checkpoints)
}

/// The revision below which a mark has not changed for `idle_secs`: that of the newest
/// checkpoint at least `idle_secs` old, or `now`'s own revision when `idle_secs` is 0.
/// `None` when no checkpoint is that old yet (nothing is idle long enough to know).
pub fn idle_below(checkpoints: &[Checkpoint], now: Checkpoint, idle_secs: u64) -> Option<u64> {
    let cutoff = now.unix_secs.checked_sub(idle_secs)?;
    checkpoints.iter().chain([&now]).filter(|c| c.unix_secs <= cutoff).map(|c| c.revision).max()
}

/// The checkpoints after a compaction at `now`: the old ones and `now`, the newest
/// [`MAX_CHECKPOINTS`] kept.
pub fn with_checkpoint(mut checkpoints: Vec<Checkpoint>, now: Checkpoint) -> Vec<Checkpoint> {
    checkpoints.retain(|c| c.revision <= now.revision);
    checkpoints.push(now);
    let excess = checkpoints.len().saturating_sub(MAX_CHECKPOINTS);
    checkpoints.drain(..excess);
    checkpoints
}

/// The Txn that forgets the marks `(key, value)`: each deleted only if it still holds
/// the value read (marks only rise, so an equal value is an unchanged mark), all or
/// none.
pub fn forget_txn(marks: &[(&[u8], &[u8])]) -> Vec<u8> {
    let compares: Vec<(&[u8], Expect<'_>)> = marks.iter().map(|(key, value)| (*key, Expect::Value(value))).collect();
    let deletes: Vec<Op<'_>> = marks.iter().map(|(key, _)| Op::Delete { key }).collect();
    grpc::txn(&compares, &deletes, &[])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    #[test]
    fn the_floor_is_the_empty_resources_key_and_the_checkpoints_lie_outside_the_range() {
        assert_eq!(floor_key("/fencekeeper/marks/"), "/fencekeeper/marks/");
        assert_eq!(floor_key("/p/"), crate::mark_key("/p/", ""), "no resource is empty");
        assert_eq!(checkpoints_key("/fencekeeper/marks/"), "/fencekeeper/marks.retention");
        assert!(!checkpoints_key("/p/").starts_with("/p/"));
        // The floor's record is not the empty resource's mark.
        let floor = floor_record(&floor_key("/p/"), &token!("9"));
        assert!(mark_of("", floor.as_bytes()).is_err());
    }

    #[test]
    fn a_floor_reads_back_checked() {
        let key = floor_key("/p/");
        let value = floor_record(&key, &token!("40")).as_bytes().to_vec();
        let kv = KeyValue { key: key.clone().into_bytes(), value: value.clone(), create_revision: 1, mod_revision: 1 };
        assert_eq!(floor_of(&key, std::slice::from_ref(&kv)), Ok(Some(token!("40"))));
        assert_eq!(floor_of(&key, &[]), Ok(None));
        let mut damaged = kv;
        damaged.value[4] ^= 1;
        assert!(floor_of(&key, &[damaged]).is_err(), "a damaged floor is never no floor");
        // A mark's record moved to the floor key does not pass.
        let moved = KeyValue {
            key: key.clone().into_bytes(),
            value: record::encode(b"r", &token!("40")).as_bytes().to_vec(),
            create_revision: 1,
            mod_revision: 1,
        };
        assert!(floor_of(&key, &[moved]).is_err());
    }

    #[test]
    fn checkpoints_round_trip_and_refuse_damage() {
        let key = "/p.retention";
        let list = vec![Checkpoint { unix_secs: 100, revision: 7 }, Checkpoint { unix_secs: 200, revision: 9 }];
        let value = encode_checkpoints(key, &list);
        assert!(value.starts_with("fkr1 100:7 200:9 "), "{value}");
        assert_eq!(decode_checkpoints(key, value.as_bytes()), Ok(list.clone()));
        assert_eq!(decode_checkpoints(key, encode_checkpoints(key, &[]).as_bytes()), Ok(vec![]));
        for i in 0..value.len() {
            let mut damaged = value.clone().into_bytes();
            damaged[i] ^= 0x04;
            assert!(decode_checkpoints(key, &damaged).is_err(), "byte {i}");
        }
        assert!(decode_checkpoints("/other", value.as_bytes()).is_err());
    }

    #[test]
    fn idle_marks_are_those_unchanged_since_a_checkpoint_old_enough() {
        let list = [Checkpoint { unix_secs: 100, revision: 7 }, Checkpoint { unix_secs: 200, revision: 9 }];
        let now = Checkpoint { unix_secs: 1000, revision: 50 };
        assert_eq!(idle_below(&list, now, 0), Some(50), "idle for 0: every mark");
        assert_eq!(idle_below(&list, now, 800), Some(9));
        assert_eq!(idle_below(&list, now, 850), Some(7));
        assert_eq!(idle_below(&list, now, 901), None, "no checkpoint that old");
        assert_eq!(idle_below(&list, now, 5000), None);
        let kept = with_checkpoint((0..300).map(|i| Checkpoint { unix_secs: i, revision: i }).collect(), now);
        assert_eq!(kept.len(), 52, "a checkpoint above now's revision (a restored etcd) is dropped");
        let later = Checkpoint { unix_secs: 1000, revision: 5000 };
        let kept = with_checkpoint((0..300).map(|i| Checkpoint { unix_secs: i, revision: i }).collect(), later);
        assert_eq!(kept.len(), MAX_CHECKPOINTS);
        assert_eq!(kept.last(), Some(&later));
    }

    #[test]
    fn a_create_compares_the_floor_and_reads_both_back() {
        let body = create_txn("/p/r", "r", "/p/", Some(&token!("9")), &token!("12"));
        let floor = floor_record("/p/", &token!("9"));
        let expected = grpc::txn(
            &[(b"/p/r", Expect::Absent), (b"/p/", Expect::Value(floor.as_bytes()))],
            &[Op::Put { key: b"/p/r", value: record::encode(b"r", &token!("12")).as_bytes(), lease: None }],
            &[Op::Range(Range::of(b"/p/r")), Op::Range(Range::of(b"/p/"))],
        );
        assert_eq!(body, expected);
        let lost = grpc::parse_txn(&grpc::txn_answer(
            false,
            5,
            &[
                Some(&[]),
                Some(&[KeyValue {
                    key: b"/p/".to_vec(),
                    value: floor_record("/p/", &token!("20")).as_bytes().to_vec(),
                    create_revision: 3,
                    mod_revision: 4,
                }]),
            ],
        ))
        .unwrap();
        assert_eq!(created(&lost, "r", "/p/"), Ok(Some((None, Some(token!("20"))))));
        let won = grpc::parse_txn(&grpc::txn_answer(true, 5, &[None])).unwrap();
        assert_eq!(created(&won, "r", "/p/"), Ok(None));
    }
}
