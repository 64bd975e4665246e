//! etcd's gRPC API: transactions ([`Expect`], [`Op`], [`Range`]) as protobuf
//! messages (`etcdserverpb.KV/Txn`), the transactions Fencekeeper sends (a mark's
//! advance or confirm, several confirms at once, a vouching read, a forced repair),
//! leases (`etcdserverpb.Lease`), the authentication (`etcdserverpb.Auth`), and their
//! answers parsed as hostile bytes into a [`TxnAnswer`].
//!
//! Why gRPC and not etcd's JSON gateway: the gateway decodes the JSON and then calls
//! etcd's own gRPC server, so a Txn through it costs etcd about twice the CPU of the
//! same Txn over gRPC (260 against 140 µs, measured with etcd 3.4; BENCHMARKS.md).
//!
//! A message is the protobuf encoding alone; the transport (Envoy's gRPC client)
//! frames it. Only the fields Fencekeeper writes and reads are known here (field
//! numbers of etcd's `rpc.proto` and `kv.proto`, unchanged since etcd 3.0); an
//! answer's other fields are skipped, as protobuf requires, and a known field with
//! the wrong wire type, a truncated field or an over-long answer is an error.

pub(crate) mod protobuf;

use crate::auth::checked_token;
use crate::provenance::{holder_keys, holder_op, VouchAnswer};
pub use crate::MAX_CONFIRMS_PER_TXN;
use crate::{excerpt, prefix_end, AuthRefusal, Expect, KeyValue, Op, Range, TxnAnswer, WireError};
use fencekeeper_core::record;
use fencekeeper_core::Token;
use protobuf::{fields, wrong_type, Message, Value};

/// etcd's key-value service.
pub const KV_SERVICE: &str = "etcdserverpb.KV";
/// Its transaction method.
pub const TXN_METHOD: &str = "Txn";
/// etcd's authentication service.
pub const AUTH_SERVICE: &str = "etcdserverpb.Auth";
/// Its method that trades a user name and password for a token.
pub const AUTHENTICATE_METHOD: &str = "Authenticate";
/// The metadata key that carries the token on every later call.
pub const TOKEN_METADATA: &str = "token";
/// The largest answer parsed: a mark Txn's answer is a few hundred bytes, a
/// [`confirm_txn`]'s that failed at most [`MAX_CONFIRMS_PER_TXN`] keys of up to 1 KiB
/// (the resource key's bound, plus the prefix) with their records, under 100 KiB.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// gRPC's status codes by number, for errors a person reads.
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];
const INVALID_ARGUMENT: u32 = 3;
const UNAUTHENTICATED: u32 = 16;
/// gRPC's PERMISSION_DENIED: etcd's authentication refused the user the key.
pub const PERMISSION_DENIED: u32 = 7;

/// A call's status other than OK, as etcd or the proxy between answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The gRPC status code.
    pub code: u32,
    /// Its message (`grpc-message`), as sent.
    pub message: String,
}

impl Status {
    /// As one bounded printable line.
    pub fn error(&self) -> WireError {
        let name = CODES.get(self.code as usize).copied().unwrap_or("unknown code");
        WireError(format!("etcd answered gRPC status {} ({name}): {}", self.code, excerpt(self.message.trim())))
    }
}

// Enum values of etcd's rpc.proto.
const TARGET_CREATE: u64 = 1;
const TARGET_MOD: u64 = 2;
const TARGET_VALUE: u64 = 3;
const SORT_ASCEND: u64 = 1;
const SORT_DESCEND: u64 = 2;
const SORT_BY_CREATE: u64 = 2;

fn compare(key: &[u8], expect: Expect<'_>) -> Message {
    // `Compare`: result 1 (EQUAL is 0, left out), target 2, key 3, and one of
    // create_revision 5, mod_revision 6 or value 7.
    let mut c = Message::default();
    match expect {
        Expect::Absent => {
            c.uint(2, TARGET_CREATE);
            c.bytes(3, key);
            c.set_uint(5, 0);
        }
        Expect::CreatedAt(rev) => {
            c.uint(2, TARGET_CREATE);
            c.bytes(3, key);
            c.set_uint(5, rev as u64);
        }
        Expect::ModifiedAt(rev) => {
            c.uint(2, TARGET_MOD);
            c.bytes(3, key);
            c.set_uint(6, rev as u64);
        }
        Expect::Value(v) => {
            c.uint(2, TARGET_VALUE);
            c.bytes(3, key);
            c.set_bytes(7, v);
        }
    }
    c
}

fn range(r: &Range<'_>) -> Message {
    // `RangeRequest`: key 1, range_end 2, limit 3, sort_order 5, sort_target 6,
    // keys_only 8, max_create_revision 13.
    let mut m = Message::default();
    m.bytes(1, r.key);
    if r.prefix {
        m.bytes(2, &prefix_end(r.key));
    } else if let Some(end) = r.end {
        m.bytes(2, end);
    }
    m.uint(3, r.limit);
    if let Some(ascending) = r.by_create_revision {
        m.uint(5, if ascending { SORT_ASCEND } else { SORT_DESCEND });
        m.uint(6, SORT_BY_CREATE);
    }
    m.uint(8, u64::from(r.keys_only));
    if let Some(max) = r.max_create_revision {
        m.int(13, max);
    }
    m
}

fn op(o: &Op<'_>) -> Message {
    // `RequestOp`: one of request_range 1, request_put 2, request_delete_range 3.
    let mut m = Message::default();
    match o {
        Op::Range(r) => m.message(1, range(r)),
        Op::Put { key, value, lease } => {
            // `PutRequest`: key 1, value 2, lease 3.
            let mut put = Message::default();
            put.bytes(1, key);
            put.bytes(2, value);
            put.int(3, lease.unwrap_or(0));
            m.message(2, put);
        }
        Op::Delete { key } => {
            let mut delete = Message::default();
            delete.bytes(1, key);
            m.message(3, delete);
        }
    }
    m
}

/// A `TxnRequest`: if every compare holds (none: `success` runs), run `success`,
/// else `failure`.
pub fn txn(compares: &[(&[u8], Expect<'_>)], success: &[Op<'_>], failure: &[Op<'_>]) -> Vec<u8> {
    let mut m = Message::default();
    for (key, expect) in compares {
        m.message(1, compare(key, *expect));
    }
    for o in success {
        m.message(2, op(o));
    }
    for o in failure {
        m.message(3, op(o));
    }
    m.0
}

/// The mark transaction on `resource` at `key`: compare the expected mark's record
/// (absent when `None`), put `new`'s record, or put nothing when `new` is the expected
/// mark (a confirm), and read the current value back on failure, so a lost race costs
/// no second round trip.
pub fn mark_txn(key: &str, resource: &str, expected: Option<&Token>, new: &Token) -> Vec<u8> {
    let record_of = |t: &Token| record::encode(resource.as_bytes(), t);
    let old = expected.map(record_of);
    let expect = match &old {
        Some(r) => Expect::Value(r.as_bytes()),
        None => Expect::Absent,
    };
    let key = key.as_bytes();
    let put = (expected != Some(new)).then(|| record_of(new));
    let success: Vec<Op<'_>> = put.iter().map(|r| Op::Put { key, value: r.as_bytes(), lease: None }).collect();
    txn(&[(key, expect)], &success, &[Op::Range(Range::of(key))])
}

/// One read-only transaction that reads `mark_key` and, for the strong check, the
/// holder of lock `lock` ([`holder_op`]): what the Envoy filter sends before it
/// advances a mark, so the exact mark, the revision and the holder come back in one
/// round trip.
pub fn vouch_txn(mark_key: &str, lock: Option<&str>) -> Vec<u8> {
    let keys = lock.map(holder_keys);
    let mut reads = vec![Op::Range(Range::of(mark_key.as_bytes()))];
    reads.extend(keys.as_deref().map(holder_op));
    txn(&[], &reads, &[])
}

/// One read-only transaction that confirms several marks at once: each `(key,
/// resource, mark)`'s record compared with what `key` holds; when any differs, every
/// key is read back, in order (so each resource is decided on its own current mark).
/// With one mark it is [`mark_txn`]'s confirm. etcd ANDs the compares: success means
/// every mark held.
pub fn confirm_txn(marks: &[(&str, &str, &Token)]) -> Vec<u8> {
    let records: Vec<_> = marks.iter().map(|(_, resource, mark)| record::encode(resource.as_bytes(), mark)).collect();
    let compares: Vec<(&[u8], Expect<'_>)> =
        marks.iter().zip(&records).map(|((key, _, _), r)| (key.as_bytes(), Expect::Value(r.as_bytes()))).collect();
    let reads: Vec<Op<'_>> = marks.iter().map(|(key, _, _)| Op::Range(Range::of(key.as_bytes()))).collect();
    txn(&compares, &[], &reads)
}

/// An `AuthenticateRequest` (name 1, password 2). The caller wipes it once sent.
pub fn authenticate(user: &str, password: &str) -> Vec<u8> {
    let mut m = Message::default();
    m.bytes(1, user.as_bytes());
    m.bytes(2, password.as_bytes());
    m.0
}

/// An etcd `TxnResponse` as etcd writes it: `revision` in the header, `succeeded`,
/// and each operation's answer (`Some`: a read's key-values; `None`: a put's). What
/// the parsers here read; for tests, fuzzing and stand-ins for etcd.
pub fn txn_answer(succeeded: bool, revision: i64, operations: &[Option<&[KeyValue]>]) -> Vec<u8> {
    let header = |m: &mut Message| {
        let mut h = Message::default();
        h.uint(1, 7); // cluster_id
        h.int(3, revision);
        m.message(1, h);
    };
    let mut m = Message::default();
    header(&mut m);
    m.uint(2, u64::from(succeeded));
    for operation in operations {
        let mut op = Message::default();
        match operation {
            Some(kvs) => {
                let mut r = Message::default();
                header(&mut r);
                for kv in kvs.iter() {
                    let mut k = Message::default();
                    k.bytes(1, &kv.key);
                    k.uint(2, kv.create_revision);
                    k.uint(3, kv.mod_revision);
                    k.uint(4, 1); // version
                    k.bytes(5, &kv.value);
                    r.message(2, k);
                }
                r.uint(4, kvs.len() as u64); // count
                op.message(1, r);
            }
            None => {
                let mut put = Message::default();
                header(&mut put);
                op.message(2, put);
            }
        }
        m.message(3, op);
    }
    m.0
}

/// An etcd `AuthenticateResponse` carrying `token`: for tests and fuzzing.
pub fn authentication_answer(token: &[u8]) -> Vec<u8> {
    let mut m = Message::default();
    m.message(1, Message::default());
    m.bytes(2, token);
    m.0
}

/// An int64 that must not be negative (a revision).
fn revision(v: u64, what: &str) -> Result<u64, WireError> {
    i64::try_from(v).map(|_| v).map_err(|_| WireError(format!("etcd answered a negative {what}")))
}

/// `ResponseHeader.revision` (field 3).
fn header_revision(header: &[u8]) -> Result<u64, WireError> {
    let mut rev = 0;
    for f in fields(header, "header") {
        match f? {
            (3, Value::Varint(v)) => rev = revision(v, "revision")?,
            (3, _) => return Err(wrong_type("header", 3)),
            _ => {}
        }
    }
    Ok(rev)
}

/// `KeyValue`: key 1, create_revision 2, mod_revision 3, value 5.
fn key_value(bytes: &[u8]) -> Result<KeyValue, WireError> {
    let mut kv = KeyValue { key: Vec::new(), value: Vec::new(), create_revision: 0, mod_revision: 0 };
    for f in fields(bytes, "key-value") {
        match f? {
            (1, Value::Bytes(b)) => kv.key = b.to_vec(),
            (2, Value::Varint(v)) => kv.create_revision = revision(v, "create revision")?,
            (3, Value::Varint(v)) => kv.mod_revision = revision(v, "mod revision")?,
            (5, Value::Bytes(b)) => kv.value = b.to_vec(),
            (n @ (1 | 2 | 3 | 5), _) => return Err(wrong_type("key-value", n)),
            _ => {}
        }
    }
    Ok(kv)
}

/// `RangeResponse.kvs` (field 2), and its header's revision.
fn range_response(bytes: &[u8]) -> Result<(Vec<KeyValue>, u64), WireError> {
    range_page(bytes).map(|page| (page.kvs, page.revision))
}

/// A `RangeResponse`: header 1, kvs 2, more 3, count 4.
fn range_page(bytes: &[u8]) -> Result<RangePage, WireError> {
    let mut page = RangePage::default();
    for f in fields(bytes, "range") {
        match f? {
            (1, Value::Bytes(h)) => page.revision = header_revision(h)?,
            (2, Value::Bytes(kv)) => page.kvs.push(key_value(kv)?),
            (3, Value::Varint(v)) => page.more = v != 0,
            (4, Value::Varint(v)) => page.count = revision(v, "count")?,
            (n @ (1..=4), _) => return Err(wrong_type("range", n)),
            _ => {}
        }
    }
    Ok(page)
}

/// What a plain `Range` answered ([`parse_range`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangePage {
    /// The key-values read (at most the request's limit).
    pub kvs: Vec<KeyValue>,
    /// The revision it answered at.
    pub revision: u64,
    /// More keys lie in the range past the limit.
    pub more: bool,
    /// How many keys the whole range holds (etcd counts them all, whatever the limit).
    pub count: u64,
}

/// `ResponseOp`: a read's key-values (`response_range`, field 1), or `None` for
/// any other operation's answer.
fn response_op(bytes: &[u8]) -> Result<Option<Vec<KeyValue>>, WireError> {
    let mut read = None;
    for f in fields(bytes, "Txn") {
        match f? {
            (1, Value::Bytes(r)) => read = Some(range_response(r)?.0),
            (1, _) => return Err(wrong_type("Txn", 1)),
            _ => {}
        }
    }
    Ok(read)
}

fn bounded<'a>(answer: &'a [u8], what: &str) -> Result<&'a [u8], WireError> {
    if answer.len() > MAX_ANSWER_BYTES {
        return Err(WireError(format!(
            "etcd's {what} answer is {} bytes, more than the {MAX_ANSWER_BYTES} one of Fencekeeper's calls gets",
            answer.len()
        )));
    }
    Ok(answer)
}

/// Parse a `TxnResponse`: header 1, succeeded 2, responses 3.
pub fn parse_txn(answer: &[u8]) -> Result<TxnAnswer, WireError> {
    let mut parsed = TxnAnswer { succeeded: false, ranges: Vec::new(), revision: 0 };
    for f in fields(bounded(answer, "Txn")?, "Txn") {
        match f? {
            (1, Value::Bytes(h)) => parsed.revision = header_revision(h)?,
            (2, Value::Varint(v)) => parsed.succeeded = v != 0,
            (3, Value::Bytes(op)) => parsed.ranges.push(response_op(op)?),
            (n @ (1..=3), _) => return Err(wrong_type("Txn", n)),
            _ => {}
        }
    }
    Ok(parsed)
}

/// Parse the answer to [`vouch_txn`]. A missing read is an error: etcd answers every
/// operation of the branch that ran.
pub fn parse_vouch_txn(answer: &[u8]) -> Result<VouchAnswer, WireError> {
    let parsed = parse_txn(answer)?;
    let first = |i| parsed.read(i).map(|kvs| kvs.into_iter().next());
    let mark = first(0)?;
    let holder = if parsed.operations() > 1 { first(1)? } else { None };
    Ok(VouchAnswer { mark, holder, revision: parsed.revision })
}

/// The answer to [`authenticate`]: the token (`AuthenticateResponse.token`, field 2),
/// or why there is none.
pub fn parse_authentication(answer: Result<&[u8], &Status>) -> Result<String, AuthRefusal> {
    let answer = match answer {
        Ok(answer) => answer,
        Err(s) if s.code == INVALID_ARGUMENT && s.message.contains("authentication failed") => {
            return Err(AuthRefusal::WrongCredentials(s.error()))
        }
        Err(s) => return Err(AuthRefusal::Other(s.error())),
    };
    let answer = bounded(answer, "authentication").map_err(AuthRefusal::Other)?;
    let mut token = None;
    for f in fields(answer, "authentication") {
        match f.map_err(AuthRefusal::Other)? {
            (2, Value::Bytes(t)) => token = Some(t),
            (2, _) => return Err(AuthRefusal::Other(wrong_type("authentication", 2))),
            _ => {}
        }
    }
    let text = token.map(|t| std::str::from_utf8(t).map_err(|_| ()));
    match text {
        Some(Ok(t)) => checked_token(t).map_err(AuthRefusal::Other),
        Some(Err(())) => {
            Err(AuthRefusal::Other(WireError("etcd answered the authentication with a token that is not UTF-8".into())))
        }
        None => Err(AuthRefusal::Other(WireError("etcd answered the authentication without a token".into()))),
    }
}

/// Whether a call was refused for the token it carried, so that a new token may
/// make it succeed: etcd answers an unknown or expired token with UNAUTHENTICATED
/// ("etcdserver: invalid auth token"), and a token older than a change to users or
/// roles with INVALID_ARGUMENT ("etcdserver: revision of auth store is old").
pub fn token_refused(status: &Status) -> bool {
    status.code == UNAUTHENTICATED
        || (status.code == INVALID_ARGUMENT && status.message.contains("revision of auth store is old"))
}

/// A transaction on one key that replaces its value whatever it is, provided it is
/// still as `expect`ed: put `new`, or delete the key when `new` is `None`. What an
/// operator's forced repair sends; it never reads back (a lost race is read again by
/// the caller).
pub fn replace_txn(key: &[u8], expect: Expect<'_>, new: Option<&[u8]>) -> Vec<u8> {
    let write = match new {
        Some(value) => Op::Put { key, value, lease: None },
        None => Op::Delete { key },
    };
    txn(&[(key, expect)], &[write], &[])
}

/// A read-only transaction that reads `key`: a linearizable read through the one
/// method (`Txn`) a host already calls.
pub fn read_txn(key: &[u8]) -> Vec<u8> {
    txn(&[], &[Op::Range(Range::of(key))], &[])
}

/// `message`, a Txn request, that also reads `key` last in whichever branch runs, so
/// that one round trip answers the Txn and a read of another key (a conditional
/// write's admit reads its version chain with its mark). Appended as protobuf
/// merges repeated fields: the Txn's own operations keep their places, and the read
/// is the answer's last operation ([`crate::txn::TxnAnswer::last_read`]).
pub fn also_reading(mut message: Vec<u8>, key: &[u8]) -> Vec<u8> {
    let mut m = Message::default();
    m.message(2, op(&Op::Range(Range::of(key))));
    m.message(3, op(&Op::Range(Range::of(key))));
    message.extend_from_slice(&m.0);
    message
}

/// Put `new` at `key` if it still holds `expected` (`None`: absent), else read it
/// back in the same round trip (the failure branch's one read).
pub fn swap_txn(key: &[u8], expected: Option<&[u8]>, new: &[u8]) -> Vec<u8> {
    let expect = expected.map_or(Expect::Absent, Expect::Value);
    txn(&[(key, expect)], &[Op::Put { key, value: new, lease: None }], &[Op::Range(Range::of(key))])
}

/// The KV service's plain read.
pub const RANGE_METHOD: &str = "Range";

/// A `RangeRequest`: a linearizable read of `range` by itself, whose answer carries
/// `more` and `count` (a listing sizes its windows by them).
pub fn range_request(range: &Range<'_>) -> Vec<u8> {
    self::range(range).0
}

/// A `RangeResponse`, parsed.
pub fn parse_range(answer: &[u8]) -> Result<RangePage, WireError> {
    range_page(answer)
}

/// etcd's lease service (`fencekeeper lock --etcd`).
pub const LEASE_SERVICE: &str = "etcdserverpb.Lease";
/// Its method that grants a lease with a TTL.
pub const LEASE_GRANT_METHOD: &str = "LeaseGrant";
/// Its method that revokes a lease (and deletes the keys put under it).
pub const LEASE_REVOKE_METHOD: &str = "LeaseRevoke";
/// Its keep-alive: a stream in etcd's API, used here one request and its one answer
/// per call.
pub const LEASE_KEEPALIVE_METHOD: &str = "LeaseKeepAlive";

/// A `LeaseGrantRequest`: TTL 1 (seconds); ID 2 left out, so etcd chooses it.
pub fn lease_grant(ttl_secs: u64) -> Vec<u8> {
    let mut m = Message::default();
    m.uint(1, ttl_secs);
    m.0
}

/// A `LeaseRevokeRequest` or a `LeaseKeepAliveRequest` of lease `id` (ID 1 in both).
pub fn lease(id: i64) -> Vec<u8> {
    let mut m = Message::default();
    m.int(1, id);
    m.0
}

/// The lease a `LeaseGrantResponse` granted (ID 2; error 4 is etcd's refusal).
pub fn parse_lease_grant(answer: &[u8]) -> Result<i64, WireError> {
    let (mut id, mut error) = (0u64, None);
    for f in fields(bounded(answer, "lease")?, "lease") {
        match f? {
            (2, Value::Varint(v)) => id = v,
            (4, Value::Bytes(e)) => error = Some(String::from_utf8_lossy(e).into_owned()),
            (n @ (2 | 4), _) => return Err(wrong_type("lease", n)),
            _ => {}
        }
    }
    match (i64::try_from(id), error) {
        (_, Some(e)) if !e.is_empty() => Err(WireError(format!("etcd refused the lease: {}", excerpt(e.trim())))),
        (Ok(id), _) if id > 0 => Ok(id),
        _ => Err(WireError("etcd granted no lease ID".into())),
    }
}

/// The TTL a `LeaseKeepAliveResponse` answered (TTL 3): 0 when the lease is gone.
pub fn parse_keepalive(answer: &[u8]) -> Result<i64, WireError> {
    let mut ttl = 0;
    for f in fields(bounded(answer, "keep-alive")?, "keep-alive") {
        match f? {
            (3, Value::Varint(v)) => ttl = v as i64,
            (3, _) => return Err(wrong_type("keep-alive", 3)),
            _ => {}
        }
    }
    Ok(ttl)
}

/// A `LeaseGrantResponse` (`id`, `ttl`, `error`) or, with `id` 0 and no error, a
/// `LeaseKeepAliveResponse`'s fields: for tests and fuzzing.
pub fn lease_answer(id: i64, ttl: i64, error: &str) -> Vec<u8> {
    let mut m = Message::default();
    m.message(1, Message::default());
    m.int(2, id);
    m.int(3, ttl);
    m.bytes(4, error.as_bytes());
    m.0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::protobuf::tests::decoded;
    use super::*;
    use fencekeeper_core::token;

    fn nested(m: &[u8], field: u64) -> Vec<Vec<u8>> {
        decoded(m).into_iter().filter(|(n, _)| *n == field).filter_map(|(_, v)| v.err()).collect()
    }

    #[test]
    fn the_mark_txn_compares_the_record_and_reads_back() {
        // Field numbers as etcd's rpc.proto gives them (the e2e tests run these against etcd).
        let confirm = mark_txn("/k", "k", Some(&token!("5")), &token!("5"));
        let compare = &nested(&confirm, 1)[0];
        let value = record::encode(b"k", &token!("5"));
        assert_eq!(decoded(compare), vec![(2, Ok(3)), (3, Err(b"/k".to_vec())), (7, Err(value.as_bytes().to_vec()))]);
        assert!(nested(&confirm, 2).is_empty(), "a confirm puts nothing");
        let read = &nested(&confirm, 3)[0];
        assert_eq!(nested(read, 1), vec![vec![0x0a, 2, b'/', b'k']]);

        let first = mark_txn("/k", "k", None, &token!("1"));
        assert_eq!(decoded(&nested(&first, 1)[0]), vec![(2, Ok(1)), (3, Err(b"/k".to_vec())), (5, Ok(0))]);
        let put = &nested(&nested(&first, 2)[0], 2)[0];
        let new = record::encode(b"k", &token!("1"));
        assert_eq!(decoded(put), vec![(1, Err(b"/k".to_vec())), (2, Err(new.as_bytes().to_vec()))]);
    }

    #[test]
    fn a_txn_also_reading_a_key_reads_it_last_in_both_branches_and_the_answer_gives_it() {
        let m = also_reading(mark_txn("/m/r", "r", Some(&token!("5")), &token!("6")), b"/c/r");
        let key_of = |op: &Vec<u8>| nested(&nested(op, 1)[0], 1)[0].clone();
        let success = nested(&m, 2);
        assert_eq!(success.len(), 2, "the put, then the read");
        assert!(nested(&success[0], 1).is_empty() && !nested(&success[0], 2).is_empty(), "the put stays first");
        assert_eq!(key_of(&success[1]), b"/c/r".to_vec());
        let failure: Vec<Vec<u8>> = nested(&m, 3).iter().map(key_of).collect();
        assert_eq!(failure, [b"/m/r".to_vec(), b"/c/r".to_vec()], "the mark's read-back keeps its place");
        // Over etcd's JSON API, each branch one array, in that order.
        let json = crate::json::request(crate::json::Call::Txn, &m).unwrap();
        let text = String::from_utf8(json).unwrap();
        let (m64, c64) = ("L20vcg==", "L2Mvcg==");
        let failure = &text[text.find("\"failure\"").unwrap()..];
        assert!(failure.find(m64).unwrap() < failure.find(c64).unwrap(), "{text}");
        // The answer: the chain's record is the last read, or none.
        let kv = KeyValue { key: b"/c/r".to_vec(), value: b"chain".to_vec(), create_revision: 3, mod_revision: 8 };
        let mark = KeyValue { key: b"/m/r".to_vec(), value: b"mark".to_vec(), create_revision: 2, mod_revision: 7 };
        let lost = parse_txn(&txn_answer(false, 9, &[Some(&[mark]), Some(&[kv])])).unwrap();
        assert_eq!(lost.last_read(b"/c/r").unwrap(), Some(b"chain".to_vec()));
        let won = parse_txn(&txn_answer(true, 9, &[None, Some(&[])])).unwrap();
        assert_eq!(won.last_read(b"/c/r").unwrap(), None, "no chain yet");
        assert!(parse_txn(&txn_answer(true, 9, &[])).unwrap().last_read(b"/c/r").is_err(), "no read: an error");
        // An answer whose last read is another key's (the mark's, say) is never taken
        // for the chain's record, nor is one with two records.
        let other = KeyValue { key: b"/m/r".to_vec(), value: b"mark".to_vec(), create_revision: 2, mod_revision: 7 };
        assert!(lost.last_read(b"/c/other").is_err(), "another key's record");
        assert!(parse_txn(&txn_answer(false, 9, &[Some(&[other.clone()])])).unwrap().last_read(b"/c/r").is_err());
        let kv = KeyValue { key: b"/c/r".to_vec(), value: b"chain".to_vec(), create_revision: 3, mod_revision: 8 };
        let two = parse_txn(&txn_answer(false, 9, &[Some(&[kv, other])])).unwrap();
        assert!(two.last_read(b"/c/r").is_err(), "two records");
    }

    #[test]
    fn a_confirm_of_several_marks_compares_each_and_reads_each_back() {
        let (a, b) = (token!("5"), token!("7.2"));
        let one = confirm_txn(&[("/m/a", "a", &a)]);
        assert_eq!(one, mark_txn("/m/a", "a", Some(&a), &a), "one mark: the mark Txn's confirm");
        let two = confirm_txn(&[("/m/a", "a", &a), ("/m/b", "b", &b)]);
        let compares = nested(&two, 1);
        assert_eq!(compares.len(), 2);
        assert_eq!(nested(&compares[1], 7), vec![record::encode(b"b", &b).as_bytes().to_vec()]);
        assert!(nested(&two, 2).is_empty(), "nothing is written");
        let reads: Vec<Vec<u8>> = nested(&two, 3).iter().map(|op| nested(&nested(op, 1)[0], 1)[0].clone()).collect();
        assert_eq!(reads, [b"/m/a".to_vec(), b"/m/b".to_vec()]);
    }

    #[test]
    fn the_vouching_read_has_no_compare_and_asks_for_the_lock_queue_head() {
        let m = vouch_txn("/m/r", Some("/locks/r"));
        assert!(nested(&m, 1).is_empty());
        let reads = nested(&m, 2);
        assert_eq!(reads.len(), 2);
        let holder = &nested(&reads[1], 1)[0];
        assert_eq!(
            decoded(holder),
            vec![
                (1, Err(b"/locks/r/".to_vec())),
                (2, Err(b"/locks/r0".to_vec())),
                (3, Ok(1)),
                (5, Ok(SORT_ASCEND)),
                (6, Ok(SORT_BY_CREATE)),
                (8, Ok(1)),
            ]
        );
    }

    #[test]
    fn a_lock_queue_read_sorts_by_create_revision_and_bounds_it() {
        let head = op(&Op::Range(Range::lock_queue_head(b"orders/", None))).0;
        let range = &nested(&head, 1)[0];
        assert_eq!(
            decoded(range),
            vec![
                (1, Err(b"orders/".to_vec())),
                (2, Err(b"orders0".to_vec())),
                (3, Ok(1)),
                (5, Ok(SORT_ASCEND)),
                (6, Ok(SORT_BY_CREATE))
            ]
        );
        let earlier = op(&Op::Range(Range::lock_queue_head(b"orders/", Some(41)))).0;
        let range = decoded(&nested(&earlier, 1)[0]);
        assert!(range.contains(&(5, Ok(SORT_DESCEND))) && range.contains(&(13, Ok(41))), "{range:?}");
        let put = op(&Op::Put { key: b"orders/1a", value: b"", lease: Some(26) }).0;
        assert_eq!(decoded(&nested(&put, 2)[0]), vec![(1, Err(b"orders/1a".to_vec())), (3, Ok(26))]);
    }

    /// A key, its value and its create revision.
    type Kv<'a> = (&'a [u8], &'a [u8], u64);

    /// An answer as etcd writes it.
    fn answer(succeeded: bool, reads: &[&[Kv<'_>]]) -> Vec<u8> {
        let kvs: Vec<Vec<KeyValue>> = reads
            .iter()
            .map(|r| {
                r.iter()
                    .map(|(key, value, create)| KeyValue {
                        key: key.to_vec(),
                        value: value.to_vec(),
                        create_revision: *create,
                        mod_revision: *create,
                    })
                    .collect()
            })
            .collect();
        let ops: Vec<Option<&[KeyValue]>> = kvs.iter().map(|k| Some(k.as_slice())).collect();
        txn_answer(succeeded, 42, &ops)
    }

    #[test]
    fn answers_parse_into_the_same_txn_answer() {
        let ok = parse_txn(&answer(true, &[])).unwrap();
        assert!(ok.succeeded && ok.operations() == 0 && ok.revision == 42);
        let value = record::encode(b"x", &token!("7.1042"));
        let lost = parse_txn(&answer(false, &[&[(b"/x", value.as_bytes(), 4)]])).unwrap();
        let kv = &lost.read(0).unwrap()[0];
        assert_eq!((kv.key.as_slice(), kv.create_revision), (b"/x".as_slice(), 4));
        assert_eq!(crate::mark_of("x", &kv.value), Ok(token!("7.1042")));
        let none = parse_txn(&answer(false, &[&[]])).unwrap();
        assert_eq!(none.read(0), Ok(vec![]));
        // A failed compare without its read-back is an error, never "no mark".
        assert!(parse_txn(&answer(false, &[])).unwrap().read(0).is_err());
        // A put's answer is not a read.
        assert!(parse_txn(&txn_answer(true, 3, &[None])).unwrap().read(0).is_err());
    }

    #[test]
    fn hostile_answers_are_errors_on_one_bounded_line() {
        let good = answer(false, &[&[(b"/x", b"fk2 1 x", 4)]]);
        for cut in 1..good.len() {
            if let Ok(a) = parse_txn(&good[..cut]) {
                // A cut at a field boundary is a shorter valid message; it must not
                // invent a read it lacks.
                assert!(a.read(0).map_or(true, |kvs| kvs.is_empty() || kvs[0].key == b"/x"));
            }
        }
        let mut kv = Message::default();
        kv.bytes(1, b"/x");
        kv.int(2, -1); // create_revision
        let (mut range, mut op, mut negative) = (Message::default(), Message::default(), Message::default());
        range.message(2, kv);
        op.message(1, range);
        negative.message(3, op);
        assert!(parse_txn(&negative.0).unwrap_err().0.contains("negative"));
        for bad in [
            vec![0x0a],                    // a length without the bytes
            vec![0x10],                    // a varint cut short
            vec![0x0b, 0x00],              // a group
            vec![0x10; 11],                // a varint longer than ten bytes
            vec![0x08, 0x01],              // the header (1) as a varint
            vec![0x12, 0x01, 0x00],        // field 2 (succeeded) as bytes
            vec![0; MAX_ANSWER_BYTES + 1], // over-long
        ] {
            let e = parse_txn(&bad).unwrap_err();
            assert!(e.0.len() < 200 && !e.0.contains('\n'), "{e}");
        }
    }

    #[test]
    fn authentication_and_refused_tokens() {
        let ok = authentication_answer(b"wdBxRxjwXFskssWu.12");
        assert_eq!(parse_authentication(Ok(&ok)), Ok("wdBxRxjwXFskssWu.12".to_owned()));
        let split = authentication_answer(b"abc\r\nx-admin: 1");
        assert!(matches!(parse_authentication(Ok(&split)), Err(AuthRefusal::Other(_))));
        assert!(matches!(parse_authentication(Ok(&[])), Err(AuthRefusal::Other(_))));
        let wrong =
            Status { code: 3, message: "etcdserver: authentication failed, invalid user ID or password".into() };
        let Err(AuthRefusal::WrongCredentials(e)) = parse_authentication(Err(&wrong)) else { unreachable!() };
        assert!(e.0.starts_with("etcd answered gRPC status 3 (INVALID_ARGUMENT): "), "{e}");
        let status = |code, m: &str| Status { code, message: m.into() };
        assert!(token_refused(&status(16, "etcdserver: invalid auth token")));
        assert!(token_refused(&status(3, "etcdserver: revision of auth store is old")));
        assert!(!token_refused(&status(3, "etcdserver: user name is empty")));
        assert!(!token_refused(&status(14, "no healthy upstream")));
        let long = status(99, &"\u{202e}\r\n".repeat(500)).error();
        assert!(long.0.len() < 300 && !long.0.contains('\n') && !long.0.contains('\u{202e}'), "{long}");
    }

    #[test]
    fn lease_messages_round_trip_and_a_refusal_is_an_error() {
        assert_eq!(lease_grant(10), vec![0x08, 10]);
        assert_eq!(lease(0x1234), vec![0x08, 0xb4, 0x24]);
        assert_eq!(parse_lease_grant(&lease_answer(0x7fee, 10, "")).unwrap(), 0x7fee);
        let refused = parse_lease_grant(&lease_answer(0, 0, "etcdserver: too many requests")).unwrap_err();
        assert!(refused.0.contains(r#"refused the lease: "etcdserver: too many requests""#), "{refused}");
        assert!(parse_lease_grant(&lease_answer(0, 10, "")).unwrap_err().0.contains("no lease ID"));
        assert_eq!(parse_keepalive(&lease_answer(0x7fee, 7, "")).unwrap(), 7);
        assert_eq!(parse_keepalive(&lease_answer(0x7fee, 0, "")).unwrap(), 0);
        assert!(parse_keepalive(&[0x1a, 0x01]).is_err(), "TTL as bytes");
    }
    #[test]
    fn a_replace_puts_or_deletes_under_its_compare() {
        let (key, expect) = (&b"/m/a"[..], Expect::Value(b"old"));
        let put = Op::Put { key, value: b"new", lease: None };
        assert_eq!(replace_txn(key, expect, Some(b"new")), txn(&[(key, expect)], &[put], &[]));
        assert_eq!(replace_txn(key, expect, None), txn(&[(key, expect)], &[Op::Delete { key }], &[]));
    }
}
