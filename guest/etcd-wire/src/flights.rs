//! The shared in-flight registry: the writes every host sharing one etcd has sent
//! to the store, so that a higher-token write through one instance waits for a
//! lower-token write still in flight through another (the ordering gate across
//! instances; `fencekeeper_core::gate` is the rule).
//!
//! Keys and values, written by the gateway and the Envoy filter alike:
//!
//! ```text
//! key    = prefix ‖ len(resource) as 4 hex digits ‖ resource ‖ instance (16 hex) ‖ sequence (16 hex)
//! value  = the core's record of the write's token, checked against the key
//! lease  = the instance's lease: a host that dies loses its flights when it expires
//! ```
//!
//! The length makes one resource's keys a prefix of no other resource's. The record
//! (`fencekeeper_core::record`, with the flight's key in the CRC) makes a damaged or
//! moved value an error, never a lower token.
//!
//! One Txn registers a write and reads the others, under the same compare that
//! proves the write is not stale:
//!
//! ```text
//! compare: value(mark key) == record(resource, token)   the mark is still the write's token
//! success: put(flight key, record, lease), range(the resource's flights)
//! failure: range(mark key)                               a higher token was admitted: stale
//! ```
//!
//! A write that finds a lower flight waits and sends the same Txn again (the put is
//! idempotent): it stays registered while it waits, so a still higher write waits
//! for it too, and the compare refuses it as soon as a higher token is admitted.
//! When the store has answered a write, its host deletes its key; when the host gave
//! up on it, the host deletes it once the store apply bound has passed; when the host
//! died, its lease expires.

use crate::{grpc, mark_of, Expect, KeyValue, MarkError, Op, Range, TxnAnswer, WireError};
use fencekeeper_core::gate::{pass, Flight, Passage, Until};
use fencekeeper_core::record;
use fencekeeper_core::Token;

/// The default key prefix of flights.
pub const DEFAULT_FLIGHT_PREFIX: &str = "/fencekeeper/flights/";

/// The key prefix of `resource`'s flights.
pub fn resource_prefix(prefix: &str, resource: &str) -> String {
    format!("{prefix}{:04x}{resource}", resource.len())
}

/// The key of one flight: instance `instance`'s write number `sequence` on `resource`.
pub fn flight_key(prefix: &str, resource: &str, instance: u64, sequence: u64) -> String {
    format!("{}{instance:016x}{sequence:016x}", resource_prefix(prefix, resource))
}

/// The registering Txn (a `TxnRequest`) of a write admitted with `token` on
/// `resource` (its mark at `mark_key`), as flight `key` under `lease`.
pub fn register_txn(prefix: &str, mark_key: &str, resource: &str, token: &Token, key: &str, lease: i64) -> Vec<u8> {
    let mark = record::encode(resource.as_bytes(), token);
    let value = record::encode(key.as_bytes(), token);
    let flights = resource_prefix(prefix, resource);
    let put = Op::Put { key: key.as_bytes(), value: value.as_bytes(), lease: Some(lease) };
    let read = Op::Range(Range { key: flights.as_bytes(), prefix: true, ..Range::default() });
    let read_mark = Op::Range(Range { key: mark_key.as_bytes(), ..Range::default() });
    grpc::txn(&[(mark_key.as_bytes(), Expect::Value(mark.as_bytes()))], &[put, read], &[read_mark])
}

/// The Txn that deletes flight `key` (the write is over).
pub fn end_txn(key: &str) -> Vec<u8> {
    grpc::txn(&[], &[Op::Delete { key: key.as_bytes() }], &[])
}

/// What registering a write found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// Registered, and no lower-token write may still reach the store: send it.
    Go,
    /// Registered, and a lower-token write is still in flight: ask again later.
    Wait,
    /// The mark is above the write's token (or a higher write is in flight): stale,
    /// and this is the higher token. The write was not registered, or is to be ended.
    Stale(Token),
    /// The mark is no longer the write's token but not above it (an operator lowered
    /// or cleared it): nothing can be said, the write is refused for a retry.
    Moved(Option<Token>),
}

/// Read the answer to [`register_txn`] for the write `token` on `resource`
/// registered as `key`. A flight or mark whose record does not check is an error.
pub fn registered(answer: &TxnAnswer, resource: &str, token: &Token, key: &str) -> Result<Registration, WireError> {
    if !answer.succeeded {
        let mark = match answer.read(0)?.first() {
            None => None,
            Some(kv) => Some(mark_of(resource, &kv.value).map_err(|e| bad_mark(resource, e))?),
        };
        return Ok(match mark {
            Some(m) if m > *token => Registration::Stale(m),
            other => Registration::Moved(other),
        });
    }
    let flights = answer.read(1)?;
    let mut others = Vec::with_capacity(flights.len());
    for kv in flights.iter().filter(|kv| kv.key != key.as_bytes()) {
        others.push(Flight { token: flight_token(kv)?, until: Until::Answered });
    }
    // Other instances' clocks are not ours: a flight holds until its key is gone.
    Ok(match pass(token, None, others, 0) {
        Passage::Go => Registration::Go,
        Passage::Wait { .. } => Registration::Wait,
        Passage::Stale(higher) => Registration::Stale(higher),
    })
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: &str) -> Token {
        s.parse().unwrap()
    }

    fn flight(resource: &str, instance: u64, token: &str) -> KeyValue {
        let key = flight_key(DEFAULT_FLIGHT_PREFIX, resource, instance, 1);
        let value = record::encode(key.as_bytes(), &t(token)).as_bytes().to_vec();
        KeyValue { key: key.into_bytes(), value, create_revision: 1 }
    }

    fn answer(succeeded: bool, reads: &[&[KeyValue]]) -> TxnAnswer {
        let mut ops: Vec<Option<&[KeyValue]>> = Vec::new();
        if succeeded {
            ops.push(None); // the put
        }
        ops.extend(reads.iter().map(|r| Some(*r)));
        grpc::parse_txn(&grpc::txn_answer(succeeded, 9, &ops)).unwrap()
    }

    #[test]
    fn one_resource_s_keys_prefix_no_other_resource_s() {
        let a = resource_prefix(DEFAULT_FLIGHT_PREFIX, "ab");
        for other in ["a", "abc", "ab\u{0}", "b"] {
            let k = flight_key(DEFAULT_FLIGHT_PREFIX, other, 7, 1);
            assert!(!k.starts_with(&a), "{other:?}: {k}");
        }
        assert!(flight_key(DEFAULT_FLIGHT_PREFIX, "ab", 7, 1).starts_with(&a));
    }

    #[test]
    fn a_lower_flight_elsewhere_makes_the_write_wait_and_its_own_key_is_not_counted() {
        let own = flight("/r", 1, "34");
        let key = String::from_utf8(own.key.clone()).unwrap();
        let waits = answer(true, &[&[flight("/r", 2, "33"), own.clone()]]);
        assert_eq!(registered(&waits, "/r", &t("34"), &key).unwrap(), Registration::Wait);
        let goes = answer(true, &[&[own.clone(), flight("/r", 3, "34")]]);
        assert_eq!(registered(&goes, "/r", &t("34"), &key).unwrap(), Registration::Go);
    }

    #[test]
    fn a_failed_compare_is_stale_above_the_token_and_moved_otherwise() {
        let mark = |token: &str| KeyValue {
            key: b"/fencekeeper/marks//r".to_vec(),
            value: record::encode(b"/r", &t(token)).as_bytes().to_vec(),
            create_revision: 1,
        };
        let r = |a: &TxnAnswer| registered(a, "/r", &t("34"), "k").unwrap();
        assert_eq!(r(&answer(false, &[&[mark("35")]])), Registration::Stale(t("35")));
        assert_eq!(r(&answer(false, &[&[mark("30")]])), Registration::Moved(Some(t("30"))));
        assert_eq!(r(&answer(false, &[&[]])), Registration::Moved(None));
    }

    #[test]
    fn a_damaged_flight_or_mark_is_an_error_never_a_pass() {
        let mut bad = flight("/r", 2, "33");
        bad.value[4] = b'9';
        let e = registered(&answer(true, &[&[bad]]), "/r", &t("34"), "k").unwrap_err();
        assert!(e.0.contains("does not check"), "{e}");
        let mut moved = flight("/r", 2, "33");
        moved.key = flight_key(DEFAULT_FLIGHT_PREFIX, "/r", 3, 1).into_bytes();
        assert!(registered(&answer(true, &[&[moved]]), "/r", &t("34"), "k").is_err(), "a value moved to another key");
        let damaged = KeyValue { key: b"m".to_vec(), value: b"fk2 99 00000000".to_vec(), create_revision: 1 };
        assert!(registered(&answer(false, &[&[damaged]]), "/r", &t("34"), "k").is_err());
    }
}
