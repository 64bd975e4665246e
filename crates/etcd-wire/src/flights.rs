//! The shared in-flight registry: the writes every host sharing one etcd has sent to
//! the store, so that a higher-token write through one instance waits for a
//! lower-token write still in flight through another (the ordering gate across
//! instances; `fencekeeper_core::gate` is the rule).
//!
//! An instance (a gateway, an Envoy worker) registers each token it has writes in
//! flight with on a resource, once, however many such writes there are:
//!
//! ```text
//! key    = prefix ‖ len(resource) as 4 hex digits ‖ resource ‖ instance (16 hex) ‖ token
//! value  = the core's record of the token, checked against the key
//! lease  = one of the instance's leases, each granted for a few seconds' worth of
//!          puts and never kept alive: a key lives at most its lease's TTL
//! ```
//!
//! The length makes one resource's keys a prefix of no other resource's. The record
//! (`fencekeeper_core::record`, with the key in the CRC) makes a damaged or moved value
//! an error, never a lower token.
//!
//! One Txn passes a write, under the compare that proves it is not stale:
//!
//! ```text
//! compare: value(mark key) == record(resource, token)   the mark is still the write's token
//! success: [put(flight key, record, lease)], range(the resource's flights)
//! failure: range(mark key)                               a higher token was admitted: stale
//! ```
//!
//! The put is there only for the first write of a token, and again when the lease of
//! its last put would end before a write sent now could be over (the [`Ledger`]
//! knows): a holder writing again with its token mostly costs etcd a read-only Txn,
//! and a put every few seconds under a newer lease. A write that finds
//! another instance's lower flight waits and asks again; the compare refuses it as
//! soon as a higher token is admitted. When the last write of a token is over (the
//! store answered it, or the store apply bound passed after the instance gave up on
//! it), the instance deletes the key a little later, if no new write of that token
//! came meanwhile, and only if nobody put it since ([`end_txn`] compares its
//! revision).
//!
//! Whatever the instance fails to delete goes with its lease: a delete etcd never
//! answered, a put whose answer was lost (etcd may still apply it seconds later), an
//! instance that died. That is why no lease is kept alive: a key nobody deletes would
//! otherwise hold its resource for as long as its instance lives, and every other
//! instance's higher-token writes on it would wait and be refused. A host grants a
//! new lease every few seconds (its TTL: the longest a write needs its key, plus that
//! period, plus margin) and puts under the newest; a write is sent only while the
//! lease of its key lasts until the write can no longer reach the store.

use crate::retention::{floor_key, floor_of, floor_record};
use crate::{grpc, mark_key, mark_of, Expect, KeyValue, MarkError, Op, Range, TxnAnswer, WireError};
use fencekeeper_core::gate::{pass, Flight, Passage, Until};
use fencekeeper_core::record;
use fencekeeper_core::Token;
use std::collections::HashMap;

/// How many times a pass asks again for having asked the wrong question (the mark
/// or the floor moved under it, [`Registration::Again`]) before the write is refused
/// for a retry: the same in every host.
pub const MAX_ASKED_AGAIN: u32 = 4;

/// What to add to etcd's PERMISSION_DENIED on the in-flight registry under `prefix`:
/// the grant that mends it, or the opt-out (`local_gate`, the host's own words for it).
pub fn denied_hint(prefix: &str, local_gate: &str) -> String {
    format!(
        "give the etcd user read-write on the in-flight registry's prefix {prefix} (the shared gate, on with marks in \
         etcd), or order only this instance's writes with {local_gate}"
    )
}

/// The default key prefix of flights.
pub const DEFAULT_FLIGHT_PREFIX: &str = "/fencekeeper/flights/";

/// The key prefix of `resource`'s flights.
pub fn resource_prefix(prefix: &str, resource: &str) -> String {
    format!("{prefix}{:04x}{resource}", resource.len())
}

/// The key prefix of `instance`'s flights on `resource`.
pub fn instance_prefix(prefix: &str, resource: &str, instance: u64) -> String {
    format!("{}{instance:016x}", resource_prefix(prefix, resource))
}

/// The key of `instance`'s writes with `token` on `resource`.
pub fn flight_key(prefix: &str, resource: &str, instance: u64, token: &Token) -> String {
    format!("{}{token}", instance_prefix(prefix, resource, instance))
}

/// The Txn (a `TxnRequest`) that passes a write admitted with `token` on `resource`
/// (its mark under `marks_prefix`) for `instance`, putting its flight under `lease`
/// when `put` (its first write of that token). `at_floor`: the resource has no mark
/// and is held to the retention floor, which is the write's token (a holder writing
/// again after a compaction forgot its mark); the compare proves that instead.
pub fn pass_txn(
    prefix: &str,
    marks_prefix: &str,
    resource: &str,
    token: &Token,
    instance: u64,
    put: Option<i64>,
    at_floor: bool,
) -> Vec<u8> {
    let (mark_key, floor_key) = (mark_key(marks_prefix, resource), floor_key(marks_prefix));
    let mark = record::encode(resource.as_bytes(), token);
    let floor = floor_record(&floor_key, token);
    let key = flight_key(prefix, resource, instance, token);
    let value = record::encode(key.as_bytes(), token);
    let flights = resource_prefix(prefix, resource);
    let read = Op::Range(Range { key: flights.as_bytes(), prefix: true, ..Range::default() });
    let put = put.map(|lease| Op::Put { key: key.as_bytes(), value: value.as_bytes(), lease: Some(lease) });
    let success: Vec<Op<'_>> = put.into_iter().chain([read]).collect();
    let (mark_key, floor_key) = (mark_key.as_bytes(), floor_key.as_bytes());
    let read_back = [Op::Range(Range::of(mark_key)), Op::Range(Range::of(floor_key))];
    if at_floor {
        let compare = [(mark_key, Expect::Absent), (floor_key, Expect::Value(floor.as_bytes()))];
        grpc::txn(&compare, &success, &read_back)
    } else {
        grpc::txn(&[(mark_key, Expect::Value(mark.as_bytes()))], &success, &read_back)
    }
}

/// The Txn that puts `instance`'s flight of `token` on `resource` again, under
/// `lease`: a write still in flight whose key's lease may end before the write is
/// over (Envoy streams a slow upload upstream for longer than its route timeout).
pub fn refresh_txn(prefix: &str, resource: &str, instance: u64, token: &Token, lease: i64) -> Vec<u8> {
    let key = flight_key(prefix, resource, instance, token);
    let value = record::encode(key.as_bytes(), token);
    grpc::txn(&[], &[Op::Put { key: key.as_bytes(), value: value.as_bytes(), lease: Some(lease) }], &[])
}

/// The Txn that deletes `instance`'s flight of `token` on `resource`, if it is still
/// the one put at `revision` (a later put of the same token keeps it).
pub fn end_txn(prefix: &str, resource: &str, instance: u64, token: &Token, revision: u64) -> Vec<u8> {
    let key = flight_key(prefix, resource, instance, token);
    let compare = [(key.as_bytes(), Expect::ModifiedAt(revision as i64))];
    grpc::txn(&compare, &[Op::Delete { key: key.as_bytes() }], &[])
}

/// What passing a write found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// No other instance has a lower-token write on the resource in flight: send it.
    Go,
    /// Another instance's lower-token write is still in flight: ask again later.
    Wait,
    /// The mark is above the write's token (or another instance has a higher write in
    /// flight): stale, and this is the higher token.
    Stale(Token),
    /// The mark is no longer the write's token but not above it (an operator lowered
    /// or cleared it): nothing can be said, the write is refused for a retry.
    Moved(Option<Token>),
    /// The resource has no mark of its own (a compaction forgot it) and the retention
    /// floor, which holds it, is above the write's token: stale, judged against the
    /// floor.
    BelowFloor(Token),
    /// The compare asked the wrong question: ask again at once.
    Again {
        /// Ask with [`pass_txn`]'s `at_floor` (the resource has no mark and its floor
        /// is the token), or without (its mark is the token).
        at_floor: bool,
    },
}

/// Read the answer to [`pass_txn`] for `instance`'s write `token` on `resource`
/// (marks under `marks_prefix`; `put`: the Txn put its flight). With it, the
/// revision the flight was put at, when it was. A flight, mark or floor whose record
/// does not check is an error.
pub fn passed(
    answer: &TxnAnswer,
    prefix: &str,
    marks_prefix: &str,
    resource: &str,
    token: &Token,
    instance: u64,
    put: bool,
) -> Result<(Registration, Option<u64>), WireError> {
    if !answer.succeeded {
        let mark = match answer.read(0)?.first() {
            None => None,
            Some(kv) => Some(mark_of(resource, &kv.value).map_err(|e| bad_mark(resource, e))?),
        };
        let floor_key = floor_key(marks_prefix);
        let floor = floor_of(&floor_key, &answer.read(1)?).map_err(|e| bad_mark(&floor_key, e))?;
        let registration = match (mark, floor) {
            (Some(m), _) if m > *token => Registration::Stale(m),
            (Some(m), _) if m == *token => Registration::Again { at_floor: false },
            (None, Some(f)) if f > *token => Registration::BelowFloor(f),
            (None, Some(f)) if f == *token => Registration::Again { at_floor: true },
            (other, _) => Registration::Moved(other),
        };
        return Ok((registration, None));
    }
    let flights = answer.read(usize::from(put))?;
    // This instance's own writes are ordered by its own gate.
    let own = instance_prefix(prefix, resource, instance);
    let mut others = Vec::with_capacity(flights.len());
    for kv in flights.iter().filter(|kv| !kv.key.starts_with(own.as_bytes())) {
        others.push(Flight { token: flight_token(kv)?, until: Until::Answered });
    }
    // Other instances' clocks are not ours: a flight holds until its key is gone.
    let registration = match pass(token, None, others, 0) {
        Passage::Go => Registration::Go,
        Passage::Wait { .. } => Registration::Wait,
        Passage::Stale(higher) => Registration::Stale(higher),
    };
    Ok((registration, put.then_some(answer.revision)))
}

fn flight_token(kv: &KeyValue) -> Result<Token, WireError> {
    record::decode(&kv.key, &kv.value).map_err(|e| {
        WireError(format!(
            "the in-flight registry's key {} holds a value that does not check ({e}); delete it with etcdctl once no \
             write it stands for can reach the store",
            crate::excerpt(&String::from_utf8_lossy(&kv.key))
        ))
    })
}

fn bad_mark(resource: &str, e: MarkError) -> WireError {
    WireError(format!("the mark of {:?} read back from etcd does not check: {e:?}", crate::excerpt(resource)))
}

/// One instance's account of its flights: which tokens it has writes in flight with
/// on which resource, whether etcd holds their keys and under a lease lasting until
/// when, and when an idle key is deleted. No I/O: the host sends what it says.
#[derive(Default)]
pub struct Ledger {
    entries: HashMap<(String, Token), Entry>,
}

#[derive(Default)]
struct Entry {
    /// Writes of this token in flight (being passed, sent, or given up on and within
    /// the bound).
    writes: usize,
    /// The latest put known to have landed.
    put: Option<Put>,
    /// When the key goes, once no write of it is left (milliseconds, the host's clock).
    idle_since: Option<u64>,
    /// A higher mark a Txn of this token found in etcd: every write of it is stale.
    superseded: Option<Token>,
}

/// A put of a flight that landed.
#[derive(Clone, Copy)]
struct Put {
    /// The revision etcd put the key at.
    revision: u64,
    /// The lease it was put under lasts at least until then (the host's clock).
    lease_until: u64,
}

impl Ledger {
    /// A write of `token` on `resource` begins.
    pub fn begin(&mut self, resource: &str, token: Token) {
        let e = self.entries.entry((resource.to_owned(), token)).or_default();
        e.writes += 1;
        e.idle_since = None;
    }

    /// The higher mark etcd showed a write of `token` on `resource` while its flight
    /// is known here ([`Ledger::superseded`]): a new write of it is stale, refused
    /// without a Txn and never begun. Marks only rise, so the answer holds; and a
    /// holder writing on with a token the lock moved past must not keep its flight,
    /// and the next holder's write waiting on it, alive with writes that are all
    /// refused.
    pub fn stale(&self, resource: &str, token: Token) -> Option<Token> {
        self.entries.get(&(resource.to_owned(), token)).and_then(|e| e.superseded)
    }

    /// A Txn of a write of `token` on `resource` found the mark at `higher`.
    pub fn superseded(&mut self, resource: &str, token: Token, higher: Token) {
        if let Some(e) = self.entries.get_mut(&(resource.to_owned(), token)) {
            if e.superseded.is_none_or(|seen| higher > seen) {
                e.superseded = Some(higher);
            }
        }
    }

    /// Whether a Txn sent now for a write of `token` on `resource` must put the
    /// flight: no put of it is known to have landed, or the lease of the last one may
    /// end before `needed_until` (when a write sent now can no longer reach the store).
    pub fn must_put(&self, resource: &str, token: Token, needed_until: u64) -> bool {
        let put = self.entries.get(&(resource.to_owned(), token)).and_then(|e| e.put);
        put.is_none_or(|p| p.lease_until < needed_until)
    }

    /// A put of the flight landed at `revision`, under a lease lasting until
    /// `lease_until`.
    pub fn put(&mut self, resource: &str, token: Token, revision: u64, lease_until: u64) {
        if let Some(e) = self.entries.get_mut(&(resource.to_owned(), token)) {
            if e.put.is_none_or(|p| revision >= p.revision) {
                e.put = Some(Put { revision, lease_until });
            }
        }
    }

    /// A write of `token` on `resource` is over (answered, refused before it was sent,
    /// or its bound passed) at `now`.
    pub fn end(&mut self, resource: &str, token: Token, now: u64) {
        let key = (resource.to_owned(), token);
        let Some(e) = self.entries.get_mut(&key) else { return };
        e.writes = e.writes.saturating_sub(1);
        if e.writes == 0 {
            if e.put.is_some() {
                e.idle_since = Some(now);
            } else {
                self.entries.remove(&key);
            }
        }
    }

    /// The flights that writes still use whose lease may end before `needed_until`:
    /// to put again under a newer lease ([`refresh_txn`]).
    pub fn expiring(&self, needed_until: u64) -> Vec<(String, Token)> {
        self.entries
            .iter()
            .filter(|(_, e)| e.writes > 0 && e.put.is_some_and(|p| p.lease_until < needed_until))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The flights idle since `delay` before `now`, forgotten: each one's resource,
    /// token and the revision to delete it at ([`end_txn`]). A write of the same
    /// token that begins afterwards puts its flight again.
    pub fn idle(&mut self, now: u64, delay: u64) -> Vec<(String, Token, u64)> {
        let due: Vec<(String, Token)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.idle_since.is_some_and(|at| now.saturating_sub(at) >= delay))
            .map(|(k, _)| k.clone())
            .collect();
        due.into_iter()
            .filter_map(|k| {
                let e = self.entries.remove(&k)?;
                Some((k.0, k.1, e.put?.revision))
            })
            .collect()
    }

    /// Whether nothing is in flight or waiting to be deleted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    const P: &str = DEFAULT_FLIGHT_PREFIX;
    const M: &str = crate::DEFAULT_PREFIX;

    fn flight(resource: &str, instance: u64, token: &str) -> KeyValue {
        let key = flight_key(P, resource, instance, &token!(token));
        let value = record::encode(key.as_bytes(), &token!(token)).as_bytes().to_vec();
        KeyValue { key: key.into_bytes(), value, create_revision: 1, mod_revision: 1 }
    }

    fn answer(succeeded: bool, put: bool, reads: &[&[KeyValue]]) -> TxnAnswer {
        let mut ops: Vec<Option<&[KeyValue]>> = Vec::new();
        if succeeded && put {
            ops.push(None);
        }
        ops.extend(reads.iter().map(|r| Some(*r)));
        grpc::parse_txn(&grpc::txn_answer(succeeded, 9, &ops)).unwrap()
    }

    #[test]
    fn one_resource_s_keys_prefix_no_other_resource_s() {
        let a = resource_prefix(P, "ab");
        for other in ["a", "abc", "ab\u{0}", "b"] {
            let k = flight_key(P, other, 7, &token!("1"));
            assert!(!k.starts_with(&a), "{other:?}: {k}");
        }
        assert!(flight_key(P, "ab", 7, &token!("1")).starts_with(&a));
        assert!(!flight_key(P, "ab", 70, &token!("1")).starts_with(&instance_prefix(P, "ab", 7)));
    }

    #[test]
    fn another_instance_s_lower_flight_makes_the_write_wait_and_its_own_never_do() {
        let r = |a: &TxnAnswer, put| passed(a, P, M, "/r", &token!("34"), 1, put).unwrap();
        let waits = answer(true, true, &[&[flight("/r", 2, "33"), flight("/r", 1, "34")]]);
        assert_eq!(r(&waits, true), (Registration::Wait, Some(9)));
        let own_lower = answer(true, false, &[&[flight("/r", 1, "33"), flight("/r", 3, "34")]]);
        assert_eq!(r(&own_lower, false), (Registration::Go, None));
    }

    #[test]
    fn a_failed_compare_is_stale_above_the_token_and_moved_otherwise() {
        let mark = |token: &str| KeyValue {
            key: b"/fencekeeper/marks//r".to_vec(),
            value: record::encode(b"/r", &token!(token)).as_bytes().to_vec(),
            create_revision: 1,
            mod_revision: 1,
        };
        let r = |a: &TxnAnswer| passed(a, P, M, "/r", &token!("34"), 1, true).unwrap().0;
        let floor = |token: &str| KeyValue {
            key: M.as_bytes().to_vec(),
            value: floor_record(M, &token!(token)).as_bytes().to_vec(),
            create_revision: 1,
            mod_revision: 1,
        };
        assert_eq!(r(&answer(false, true, &[&[mark("35")], &[]])), Registration::Stale(token!("35")));
        assert_eq!(r(&answer(false, true, &[&[mark("30")], &[]])), Registration::Moved(Some(token!("30"))));
        assert_eq!(r(&answer(false, true, &[&[], &[]])), Registration::Moved(None));
        // No mark: the retention floor holds the resource.
        assert_eq!(r(&answer(false, true, &[&[], &[floor("36")]])), Registration::BelowFloor(token!("36")));
        assert_eq!(r(&answer(false, true, &[&[], &[floor("30")]])), Registration::Moved(None));
        // The wrong question: the floor is the token (ask with `at_floor`), or the
        // mark is (ask without).
        assert_eq!(r(&answer(false, true, &[&[], &[floor("34")]])), Registration::Again { at_floor: true });
        assert_eq!(r(&answer(false, true, &[&[mark("34")], &[floor("34")]])), Registration::Again { at_floor: false });
        // A mark above the floor decides.
        assert_eq!(r(&answer(false, true, &[&[mark("35")], &[floor("34")]])), Registration::Stale(token!("35")));
    }

    #[test]
    fn a_damaged_flight_or_mark_is_an_error_never_a_pass() {
        let mut bad = flight("/r", 2, "33");
        bad.value[4] = b'9';
        let e = passed(&answer(true, false, &[&[bad]]), P, M, "/r", &token!("34"), 1, false).unwrap_err();
        assert!(e.0.contains("does not check"), "{e}");
        let mut moved = flight("/r", 2, "33");
        moved.key = flight_key(P, "/r", 3, &token!("33")).into_bytes();
        assert!(
            passed(&answer(true, false, &[&[moved]]), P, M, "/r", &token!("34"), 1, false).is_err(),
            "a value moved"
        );
        let damaged =
            KeyValue { key: b"m".to_vec(), value: b"fk2 99 00000000".to_vec(), create_revision: 1, mod_revision: 1 };
        assert!(passed(
            &answer(false, true, &[std::slice::from_ref(&damaged), &[]]),
            P,
            M,
            "/r",
            &token!("34"),
            1,
            true
        )
        .is_err());
        let floor = KeyValue { key: M.as_bytes().to_vec(), value: b"fk2 99 00000000".to_vec(), ..damaged };
        let e = passed(&answer(false, true, &[&[], &[floor]]), P, M, "/r", &token!("34"), 1, true).unwrap_err();
        assert!(e.0.contains(M), "a damaged floor is named: {e}");
    }

    #[test]
    fn a_token_is_put_once_while_its_writes_overlap_and_deleted_once_idle() {
        let mut l = Ledger::default();
        l.begin("/r", token!("5"));
        assert!(l.must_put("/r", token!("5"), 50), "the first write puts");
        l.put("/r", token!("5"), 40, 1_000);
        l.begin("/r", token!("5"));
        assert!(!l.must_put("/r", token!("5"), 50), "a second one rides on the put");
        l.end("/r", token!("5"), 100);
        l.end("/r", token!("5"), 110);
        assert!(l.idle(150, 100).is_empty(), "not idle long enough");
        // A write of the token within the delay keeps the key: no delete, no put.
        l.begin("/r", token!("5"));
        assert!(!l.must_put("/r", token!("5"), 250));
        l.end("/r", token!("5"), 200);
        assert_eq!(l.idle(300, 100), vec![("/r".to_owned(), token!("5"), 40)]);
        assert!(l.is_empty());
        l.begin("/r", token!("5"));
        assert!(l.must_put("/r", token!("5"), 350), "after the delete, a write puts again");
    }

    #[test]
    fn a_write_puts_again_when_the_lease_of_the_last_put_may_end_before_it_is_over() {
        let mut l = Ledger::default();
        l.begin("/r", token!("5"));
        l.put("/r", token!("5"), 40, 1_000);
        assert!(!l.must_put("/r", token!("5"), 1_000), "the lease lasts until the write is over");
        assert!(l.must_put("/r", token!("5"), 1_001), "it may not: put again, under a newer lease");
        // The newer put's lease counts, whatever order the answers come in.
        l.put("/r", token!("5"), 60, 2_000);
        l.put("/r", token!("5"), 50, 1_500);
        assert!(!l.must_put("/r", token!("5"), 2_000));
        l.end("/r", token!("5"), 0);
        assert_eq!(l.idle(10, 10), vec![("/r".to_owned(), token!("5"), 60)], "deleted at the latest put");
    }

    #[test]
    fn flights_in_use_whose_lease_ends_too_soon_are_put_again_and_idle_ones_are_not() {
        let mut l = Ledger::default();
        l.begin("/r", token!("5"));
        l.put("/r", token!("5"), 40, 1_000);
        l.begin("/r", token!("6"));
        l.put("/r", token!("6"), 41, 3_000);
        l.begin("/r", token!("7"));
        assert_eq!(l.expiring(2_000), vec![("/r".to_owned(), token!("5"))], "7 has no put yet: its Txn puts");
        l.put("/r", token!("5"), 50, 4_000);
        assert!(l.expiring(2_000).is_empty());
        l.end("/r", token!("6"), 0);
        assert!(l.expiring(3_500).is_empty(), "6 is idle: deleted, not refreshed");
    }

    #[test]
    fn a_write_that_ends_before_any_put_landed_leaves_nothing_to_delete() {
        let mut l = Ledger::default();
        l.begin("/r", token!("5"));
        l.end("/r", token!("5"), 0);
        assert!(l.is_empty());
        // A put that lands late, after its write ended, is still deleted: its lease
        // takes it otherwise.
        l.begin("/r", token!("6"));
        l.begin("/r", token!("6"));
        l.put("/r", token!("6"), 7, 100);
        l.put("/r", token!("6"), 9, 100);
        l.end("/r", token!("6"), 0);
        l.end("/r", token!("6"), 0);
        assert_eq!(l.idle(10, 10), vec![("/r".to_owned(), token!("6"), 9)], "the latest put's revision");
    }

    #[test]
    fn a_token_etcd_showed_a_higher_mark_for_is_stale_until_its_flight_is_deleted() {
        let mut l = Ledger::default();
        assert_eq!(l.stale("/r", token!("5")), None, "nothing known");
        l.begin("/r", token!("5"));
        l.put("/r", token!("5"), 40, 1_000);
        l.begin("/r", token!("5"));
        l.superseded("/r", token!("5"), token!("6"));
        l.superseded("/r", token!("5"), token!("7"));
        l.superseded("/r", token!("5"), token!("6"));
        assert_eq!(l.stale("/r", token!("5")), Some(token!("7")), "the highest mark seen");
        assert_eq!(l.stale("/r", token!("6")), None, "another token");
        assert_eq!(l.stale("/q", token!("5")), None, "another resource");
        // The writes already begun end; none begins after: the flight goes idle and
        // is deleted, so another instance's write waiting for it can go.
        l.end("/r", token!("5"), 100);
        l.end("/r", token!("5"), 100);
        assert_eq!(l.stale("/r", token!("5")), Some(token!("7")), "still known while its key is");
        assert_eq!(l.idle(200, 100), vec![("/r".to_owned(), token!("5"), 40)]);
        assert_eq!(l.stale("/r", token!("5")), None, "forgotten with the flight: a Txn asks again");
    }
}
