//! Fencekeeper's etcd wire: the keys, request bodies and answers of etcd's v3 API,
//! written once for every host that talks to etcd. Two encodings of the same
//! transactions: JSON for etcd's JSON gateway (etcd 3.4: `POST /v3/kv/range`,
//! `/v3/kv/txn`, `/v3/lease/*`; keys and values base64), which the library's blocking
//! HTTP client and the lock helpers speak, and protobuf for etcd's gRPC API
//! ([`grpc`]), which the Envoy filter speaks through `dispatch_grpc_call`. No I/O: each
//! host keeps its own transport.
//!
//! Marks: key = prefix + resource (default prefix [`DEFAULT_PREFIX`]), value = the
//! mark's checked record (`fencekeeper_core::record`). Records are deterministic, so a
//! Txn that compares record bytes compares marks, and a damaged value never equals one.
//!
//! [`provenance`]: the reads and the rules that decide whether etcd issued a token
//! (the lock's holder, the cluster's revision).
//!
//! [`flights`]: the shared in-flight registry, the ordering gate across instances.

pub mod flights;
pub mod grpc;
pub mod provenance;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use fencekeeper_core::record::{self, RecordError};
use fencekeeper_core::Token;
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt;

/// The default key prefix of marks, shared by the gateway, the library and the filter.
pub const DEFAULT_PREFIX: &str = "/fencekeeper/marks/";
/// The gateway path of a range read.
pub const RANGE_PATH: &str = "/v3/kv/range";
/// The gateway path of a transaction.
pub const TXN_PATH: &str = "/v3/kv/txn";
/// The gateway path that grants a lease.
pub const LEASE_GRANT_PATH: &str = "/v3/lease/grant";
/// The gateway path that refreshes a lease.
pub const LEASE_KEEPALIVE_PATH: &str = "/v3/lease/keepalive";
/// The gateway path that revokes a lease.
pub const LEASE_REVOKE_PATH: &str = "/v3/lease/revoke";
/// The gateway path that trades a user name and password for a token.
pub const AUTH_PATH: &str = "/v3/auth/authenticate";
/// The header that carries the token on every later request.
pub const AUTH_HEADER: &str = "authorization";

/// An etcd answer that cannot be used: one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

/// The etcd key of `resource`'s mark under `prefix`.
pub fn mark_key(prefix: &str, resource: &str) -> String {
    format!("{prefix}{resource}")
}

/// The smallest key above every key that starts with `prefix` (etcd's prefix range end).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A range read of one key.
pub fn range(key: &[u8]) -> String {
    range_request(key).to_string()
}

fn range_request(key: &[u8]) -> Value {
    json!({ "key": B64.encode(key) })
}

/// A range read of every key under `prefix` (`limit` 0: all).
pub fn range_prefix(prefix: &[u8], limit: u64) -> String {
    json!({ "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)), "limit": limit }).to_string()
}

/// What a transaction compares a key with.
#[derive(Clone, Copy, Debug)]
pub enum Expect<'a> {
    /// The key does not exist (`create_revision == 0`).
    Absent,
    /// The key holds exactly these bytes.
    Value(&'a [u8]),
    /// The key was created at this revision.
    CreatedAt(i64),
    /// The key was last modified at this revision.
    ModifiedAt(i64),
}

/// A range read inside a transaction (or as the body of a range request).
#[derive(Clone, Debug, Default)]
pub struct Range<'a> {
    /// The key, or the first key of the range.
    pub key: &'a [u8],
    /// Every key under `key` (a prefix range), not just `key`.
    pub prefix: bool,
    /// Without `prefix`: every key from `key` up to this one (excluded).
    pub end: Option<&'a [u8]>,
    /// At most this many keys (0: all).
    pub limit: u64,
    /// Sorted by create revision: ascending (`Some(true)`) or descending.
    pub by_create_revision: Option<bool>,
    /// Only keys created at or before this revision.
    pub max_create_revision: Option<i64>,
    /// Keys without their values.
    pub keys_only: bool,
}

impl<'a> Range<'a> {
    /// A lock queue's head, for etcd's lock recipe (`concurrency.Mutex`): the first
    /// key under `prefix` by create revision (ascending), or with `max_create` the last
    /// one created at or before it (descending).
    pub fn lock_queue_head(prefix: &'a [u8], max_create: Option<i64>) -> Range<'a> {
        Range {
            key: prefix,
            prefix: true,
            end: None,
            limit: 1,
            by_create_revision: Some(max_create.is_none()),
            max_create_revision: max_create,
            keys_only: false,
        }
    }

    fn json(&self) -> Value {
        let mut r = json!({ "key": B64.encode(self.key) });
        if self.prefix {
            r["range_end"] = json!(B64.encode(prefix_end(self.key)));
        } else if let Some(end) = self.end {
            r["range_end"] = json!(B64.encode(end));
        }
        if self.limit > 0 {
            r["limit"] = json!(self.limit);
        }
        if let Some(ascending) = self.by_create_revision {
            r["sort_target"] = json!("CREATE");
            r["sort_order"] = json!(if ascending { "ASCEND" } else { "DESCEND" });
        }
        if let Some(max) = self.max_create_revision {
            r["max_create_revision"] = json!(max.to_string());
        }
        if self.keys_only {
            r["keys_only"] = json!(true);
        }
        r
    }

    /// The body of a range request.
    pub fn body(&self) -> String {
        self.json().to_string()
    }
}

/// One operation of a transaction's branch.
#[derive(Clone, Debug)]
pub enum Op<'a> {
    /// Put a value, under a lease if given.
    Put {
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// The lease ID.
        lease: Option<i64>,
    },
    /// Read.
    Range(Range<'a>),
    /// Delete one key.
    Delete {
        /// The key.
        key: &'a [u8],
    },
}

impl Op<'_> {
    fn json(&self) -> Value {
        match self {
            Op::Put { key, value, lease: Some(id) } => {
                // The gateway writes an int64 as a decimal string.
                json!({ "request_put": { "key": B64.encode(key), "value": B64.encode(value), "lease": id.to_string() } })
            }
            Op::Put { key, value, lease: None } => {
                json!({ "request_put": { "key": B64.encode(key), "value": B64.encode(value) } })
            }
            Op::Range(r) => json!({ "request_range": r.json() }),
            Op::Delete { key } => json!({ "request_delete_range": { "key": B64.encode(key) } }),
        }
    }
}

/// A transaction: if `key` is as `expect`s, run `success`, else `failure`.
pub fn txn_ops(key: &[u8], expect: Expect<'_>, success: &[Op<'_>], failure: &[Op<'_>]) -> String {
    txn_json(&[(key, expect)], success, failure)
}

/// A transaction: if every compare holds, run `success`, else `failure`.
fn txn_json(compares: &[(&[u8], Expect<'_>)], success: &[Op<'_>], failure: &[Op<'_>]) -> String {
    let compare = |(key, expect): &(&[u8], Expect<'_>)| {
        let k = B64.encode(key);
        match expect {
            Expect::Absent => json!({ "key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }),
            Expect::Value(v) => json!({ "key": k, "target": "VALUE", "result": "EQUAL", "value": B64.encode(v) }),
            Expect::CreatedAt(rev) => {
                json!({ "key": k, "target": "CREATE", "result": "EQUAL", "create_revision": rev.to_string() })
            }
            Expect::ModifiedAt(rev) => {
                json!({ "key": k, "target": "MOD", "result": "EQUAL", "mod_revision": rev.to_string() })
            }
        }
    };
    let ops = |list: &[Op<'_>]| Value::Array(list.iter().map(Op::json).collect());
    let compares: Vec<Value> = compares.iter().map(compare).collect();
    json!({ "compare": compares, "success": ops(success), "failure": ops(failure) }).to_string()
}

/// The most marks one confirm transaction compares ([`confirm_txn`],
/// [`grpc::confirm_txn`]): etcd refuses a Txn of more than `--max-txn-ops` (default
/// 128) operations in a branch.
pub const MAX_CONFIRMS_PER_TXN: usize = 64;

/// One read-only transaction that confirms several marks at once: each `(key,
/// resource, mark)`'s record compared with what `key` holds; when any differs,
/// every key is read back, in order (so each resource is decided on its own current
/// mark). With one mark it is [`mark_txn`]'s confirm. etcd ANDs the compares: success
/// means every mark held.
pub fn confirm_txn(marks: &[(&str, &str, &Token)]) -> String {
    confirm_ops(marks, txn_json)
}

/// [`confirm_txn`]'s compares and reads, handed to `render` (JSON or [`grpc`]).
pub(crate) fn confirm_ops<T>(
    marks: &[(&str, &str, &Token)],
    render: impl FnOnce(&[(&[u8], Expect<'_>)], &[Op<'_>], &[Op<'_>]) -> T,
) -> T {
    let records: Vec<_> = marks.iter().map(|(_, resource, mark)| record::encode(resource.as_bytes(), mark)).collect();
    let compares: Vec<(&[u8], Expect<'_>)> =
        marks.iter().zip(&records).map(|((key, _, _), r)| (key.as_bytes(), Expect::Value(r.as_bytes()))).collect();
    let reads: Vec<Op<'_>> =
        marks.iter().map(|(key, _, _)| Op::Range(Range { key: key.as_bytes(), ..Range::default() })).collect();
    render(&compares, &[], &reads)
}

/// A transaction on one key: compare it with `expect`; on success put `put` (if any,
/// under `lease` if given); on failure read the key back when `read_on_failure`, so a
/// lost race costs no second round trip.
pub fn txn(key: &[u8], expect: Expect<'_>, put: Option<&[u8]>, lease: Option<i64>, read_on_failure: bool) -> String {
    let success: Vec<Op<'_>> = put.map(|value| Op::Put { key, value, lease }).into_iter().collect();
    let failure: Vec<Op<'_>> =
        read_on_failure.then(|| Op::Range(Range { key, ..Range::default() })).into_iter().collect();
    txn_ops(key, expect, &success, &failure)
}

/// The mark transaction on `resource` at `key`: compare the expected mark's record
/// (absent when `None`), put `new`'s record, or put nothing when `new` is the expected
/// mark (a confirm), and read the current value back on failure.
pub fn mark_txn(key: &str, resource: &str, expected: Option<&Token>, new: &Token) -> String {
    mark_ops(key, resource, expected, new, |(k, expect), success, failure| txn_ops(k, expect, success, failure))
}

/// The mark transaction's compare and branches, handed to `render` (JSON or
/// [`grpc`]).
pub(crate) fn mark_ops<T>(
    key: &str,
    resource: &str,
    expected: Option<&Token>,
    new: &Token,
    render: impl FnOnce((&[u8], Expect<'_>), &[Op<'_>], &[Op<'_>]) -> T,
) -> T {
    let record_of = |t: &Token| record::encode(resource.as_bytes(), t);
    let old = expected.map(record_of);
    let expect = match &old {
        Some(r) => Expect::Value(r.as_bytes()),
        None => Expect::Absent,
    };
    let key = key.as_bytes();
    let put = (expected != Some(new)).then(|| record_of(new));
    let success: Vec<Op<'_>> = put.iter().map(|r| Op::Put { key, value: r.as_bytes(), lease: None }).collect();
    render((key, expect), &success, &[Op::Range(Range { key, ..Range::default() })])
}

/// A transaction on one key that replaces its value whatever it is, provided it is
/// still `expect`: put `new`, or delete the key when `new` is `None`. What an operator's
/// forced repair sends; it never reads back (a lost race is read again by the caller).
pub fn replace_txn(key: &[u8], expect: Expect<'_>, new: Option<&[u8]>) -> String {
    replace_ops(key, expect, new, |compare, write| txn_json(&[compare], &[write], &[]))
}

/// [`replace_txn`]'s compare and write, handed to `render` (JSON or [`grpc`]).
pub(crate) fn replace_ops<'a, T>(
    key: &'a [u8],
    expect: Expect<'a>,
    new: Option<&'a [u8]>,
    render: impl FnOnce((&'a [u8], Expect<'a>), Op<'a>) -> T,
) -> T {
    let write = match new {
        Some(value) => Op::Put { key, value, lease: None },
        None => Op::Delete { key },
    };
    render((key, expect), write)
}

/// A key and its value, decoded from base64.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key.
    pub create_revision: u64,
}

/// What a transaction answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnAnswer {
    /// The compare held.
    pub succeeded: bool,
    /// Every operation's answer, in order: a read's key-values, or `None` for an
    /// operation that is not a read.
    ranges: Vec<Option<Reads>>,
    /// The cluster's revision after the transaction.
    pub revision: u64,
}

/// A read's key-values: from the JSON gateway still base64 (decoded by
/// [`TxnAnswer::read`], only when asked for), or decoded protobuf.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reads {
    Json(Vec<RawKv>),
    Decoded(Vec<KeyValue>),
}

#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    revision: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
struct RawKv {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    create_revision: Option<String>,
}

#[derive(Deserialize)]
struct RawRange {
    #[serde(default)]
    kvs: Vec<RawKv>,
    #[serde(default)]
    header: Option<Header>,
}

/// What a range read answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeAnswer {
    /// The keys read.
    pub kvs: Vec<KeyValue>,
    /// The cluster's revision when it was read.
    pub revision: u64,
}

#[derive(Deserialize)]
struct RawOp {
    #[serde(default)]
    response_range: Option<RawRange>,
}

#[derive(Deserialize)]
struct RawTxn {
    // The JSON gateway leaves out false booleans and empty lists.
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<RawOp>,
    #[serde(default)]
    header: Option<Header>,
}

/// The most bytes of foreign text (an answer, a key) an error quotes.
pub const EXCERPT_BYTES: usize = 200;

/// `text` quoted (`{:?}`: control and formatting characters escaped, so it stays one
/// printable line) and cut to [`EXCERPT_BYTES`] at a character boundary. What etcd,
/// or a proxy in front of it, answered ends up in refusal reasons and headers.
pub fn excerpt(text: &str) -> String {
    let quoted = format!("{text:?}");
    if quoted.len() <= EXCERPT_BYTES {
        return quoted;
    }
    let end = (0..=EXCERPT_BYTES).rev().find(|&i| quoted.is_char_boundary(i)).unwrap_or(0);
    format!("{}…", &quoted[..end])
}

/// An answer that is not HTTP 200, as one bounded line.
pub fn status_error(status: u16, body: &[u8]) -> WireError {
    let text = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES)]);
    WireError(format!("etcd answered HTTP {status}: {}", excerpt(text.trim())))
}

fn number(field: Option<&str>, what: &str) -> Result<u64, WireError> {
    field.unwrap_or("0").parse().map_err(|_| WireError(format!("etcd answered a {what} that is not a number")))
}

fn decode(field: &str, what: &str) -> Result<Vec<u8>, WireError> {
    // The gateway omits empty fields: a missing value is an empty one.
    B64.decode(field).map_err(|_| WireError(format!("etcd answered a {what} that is not base64")))
}

fn key_values(raw: Vec<RawKv>) -> Result<Vec<KeyValue>, WireError> {
    raw.into_iter()
        .map(|kv| {
            Ok(KeyValue {
                key: decode(&kv.key, "key")?,
                value: decode(&kv.value, "value")?,
                create_revision: number(kv.create_revision.as_deref(), "create revision")?,
            })
        })
        .collect()
}

/// Parse the answer to [`range`] or [`range_prefix`].
pub fn parse_range(body: &[u8]) -> Result<Vec<KeyValue>, WireError> {
    parse_range_answer(body).map(|a| a.kvs)
}

/// Parse the answer to a range read with the revision it was read at.
pub fn parse_range_answer(body: &[u8]) -> Result<RangeAnswer, WireError> {
    let raw: RawRange = serde_json::from_slice(body)
        .map_err(|e| WireError(format!("etcd's range answer does not parse: {}", excerpt(&e.to_string()))))?;
    let revision = header_revision(raw.header.as_ref())?;
    Ok(RangeAnswer { kvs: key_values(raw.kvs)?, revision })
}

fn header_revision(header: Option<&Header>) -> Result<u64, WireError> {
    number(header.and_then(|h| h.revision.as_deref()), "revision")
}

/// Parse the answer to [`txn`] or [`mark_txn`].
pub fn parse_txn(body: &[u8]) -> Result<TxnAnswer, WireError> {
    let raw: RawTxn = serde_json::from_slice(body)
        .map_err(|e| WireError(format!("etcd's Txn answer does not parse: {}", excerpt(&e.to_string()))))?;
    let revision = header_revision(raw.header.as_ref())?;
    let ranges = raw.responses.into_iter().map(|op| op.response_range.map(|r| Reads::Json(r.kvs))).collect();
    Ok(TxnAnswer { succeeded: raw.succeeded, ranges, revision })
}

impl TxnAnswer {
    /// The read that operation `i` of the branch that ran answered. An answer that
    /// lacks it is an error, never "no key": a missing read-back must not pass for
    /// a resource without a mark.
    pub fn read(&self, i: usize) -> Result<Vec<KeyValue>, WireError> {
        match self.ranges.get(i) {
            Some(Some(Reads::Json(kvs))) => key_values(kvs.clone()),
            Some(Some(Reads::Decoded(kvs))) => Ok(kvs.clone()),
            _ => Err(WireError(format!("etcd's Txn answer lacks the read of operation {i}"))),
        }
    }

    /// How many operations the branch that ran answered.
    pub fn operations(&self) -> usize {
        self.ranges.len()
    }
}

/// How a stored value failed to be `resource`'s mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MarkError {
    /// A bare token of the first format, without a checksum: upgrade the store.
    OldFormat,
    /// Damaged, or another resource's record.
    Damaged(RecordError),
}

/// A value read back, verified as `resource`'s mark.
pub fn mark_of(resource: &str, value: &[u8]) -> Result<Token, MarkError> {
    record::decode(resource.as_bytes(), value).map_err(|e| match e {
        RecordError::Unchecked => MarkError::OldFormat,
        other => MarkError::Damaged(other),
    })
}

/// The body that authenticates `user` with `password`.
pub fn authenticate(user: &str, password: &str) -> String {
    json!({ "name": user, "password": password }).to_string()
}

/// The most bytes of an authentication answer (or an answer refusing a token) that
/// are parsed: etcd's answers are a few hundred bytes (a JWT token included); a longer
/// one is not etcd's, and is refused before it is parsed.
pub const MAX_AUTH_ANSWER_BYTES: usize = 8192;

/// The most bytes of a token: it goes into a header of every later request.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// The token an authentication answered. The answer is treated as hostile: bounded
/// in size, and the token must be visible ASCII (it becomes a header value, where a
/// CR or LF would split the request).
pub fn parse_token(body: &[u8]) -> Result<String, WireError> {
    if body.len() > MAX_AUTH_ANSWER_BYTES {
        return Err(WireError(format!(
            "etcd's authentication answer is {} bytes, more than the {MAX_AUTH_ANSWER_BYTES} an answer has",
            body.len()
        )));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| WireError(format!("etcd's authentication answer does not parse: {}", excerpt(&e.to_string()))))?;
    match v.get("token").and_then(Value::as_str) {
        Some(t) => checked_token(t),
        None => Err(WireError("etcd answered the authentication without a token".into())),
    }
}

/// A token fit for a header (bounded, visible ASCII).
pub(crate) fn checked_token(t: &str) -> Result<String, WireError> {
    match t {
        t if t.len() > MAX_TOKEN_BYTES => {
            Err(WireError("etcd answered the authentication with an over-long token".into()))
        }
        t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()) => Ok(t.to_owned()),
        t if !t.is_empty() => {
            Err(WireError("etcd answered the authentication with a token that is not visible ASCII".into()))
        }
        _ => Err(WireError("etcd answered the authentication without a token".into())),
    }
}

/// How an authentication was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthRefusal {
    /// etcd does not know this user with this password (etcd 3.4 answers HTTP 400,
    /// gRPC code 3, "etcdserver: authentication failed, invalid user ID or password").
    WrongCredentials(WireError),
    /// Anything else (authentication not enabled, no leader, a proxy's error page).
    Other(WireError),
}

/// The answer to [`authenticate`]: the token, or why there is none. `status` is the
/// HTTP status (`None`: no answer at all, such as a timeout).
pub fn parse_authentication(status: Option<u16>, body: &[u8]) -> Result<String, AuthRefusal> {
    match status {
        Some(200) => parse_token(body).map_err(AuthRefusal::Other),
        Some(code) => {
            let error = status_error(code, body);
            if code == 400
                && grpc_error(body)
                    .is_some_and(|(code, message)| code == 3 && message.contains("authentication failed"))
            {
                Err(AuthRefusal::WrongCredentials(error))
            } else {
                Err(AuthRefusal::Other(error))
            }
        }
        None => Err(AuthRefusal::Other(WireError("etcd did not answer the authentication".into()))),
    }
}

/// Whether an answer refused the token a request carried, so that a new token (one
/// authentication) may make the same request succeed. etcd 3.4's JSON gateway answers
/// an unknown or expired token (simple tokens live `--auth-token-ttl` seconds after
/// their last use) with HTTP 401, gRPC code 16 (UNAUTHENTICATED), "etcdserver: invalid
/// auth token"; a token older than a change to users or roles can be answered with
/// HTTP 400, "etcdserver: revision of auth store is old" (etcd's own client
/// re-authenticates on both). The request was refused before it ran.
pub fn token_refused(status: u16, body: &[u8]) -> bool {
    status == 401
        || (status == 400
            && grpc_error(body).is_some_and(|(_, message)| message.contains("revision of auth store is old")))
}

/// The gRPC code and message of a gateway error answer (`{"error", "message", "code"}`),
/// when it is one and not over-long.
fn grpc_error(body: &[u8]) -> Option<(u64, String)> {
    #[derive(Deserialize)]
    struct Raw {
        #[serde(default)]
        code: u64,
        #[serde(default)]
        message: String,
    }
    if body.len() > MAX_AUTH_ANSWER_BYTES {
        return None;
    }
    // The gateway streams an error answer with a trailer after the JSON (chunked,
    // "Grpc-Trailer-Content-Type"): only the first JSON value is the answer.
    let raw: Raw = serde_json::Deserializer::from_slice(body).into_iter().next()?.ok()?;
    Some((raw.code, raw.message))
}

/// A lease grant of `ttl` seconds.
pub fn lease_grant(ttl: u64) -> String {
    json!({ "TTL": ttl }).to_string()
}

/// The granted lease's ID (the gateway writes an int64 as a decimal string).
pub fn parse_lease_grant(body: &[u8]) -> Result<i64, WireError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| WireError(format!("etcd's lease answer does not parse: {e}")))?;
    match v.get("ID").and_then(Value::as_str) {
        Some(id) => id.parse().map_err(|_| WireError("etcd granted a lease ID that is not a number".into())),
        None => Err(WireError("etcd granted no lease ID".into())),
    }
}

/// A keep-alive or a revoke of lease `id` (the same body).
pub fn lease(id: i64) -> String {
    json!({ "ID": id.to_string() }).to_string()
}

/// The TTL a keep-alive answered: 0 when the lease is gone.
pub fn parse_keepalive(body: &[u8]) -> Result<i64, WireError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| WireError(format!("etcd's keep-alive answer does not parse: {e}")))?;
    let result = v.get("result").unwrap_or(&v);
    Ok(result.get("TTL").and_then(Value::as_str).and_then(|t| t.parse().ok()).unwrap_or(0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    fn json_of(body: &str) -> Value {
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end(b"/fencekeeper/marks/"), b"/fencekeeper/marks0".to_vec());
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }

    #[test]
    fn mark_txn_compares_records_and_confirms_without_a_put() {
        let key = mark_key(DEFAULT_PREFIX, "a");
        let body = json_of(&mark_txn(&key, "a", Some(&token!("033")), &token!("34")));
        let record = |s: &str| B64.encode(record::encode(b"a", &token!(s)).as_bytes());
        assert_eq!(body["compare"][0]["value"], record("33"));
        assert_eq!(body["success"][0]["request_put"]["value"], record("34"));
        assert_eq!(body["compare"][0]["key"], B64.encode("/fencekeeper/marks/a"));
        assert_eq!(body["failure"][0]["request_range"]["key"], B64.encode("/fencekeeper/marks/a"));
        let first = json_of(&mark_txn("k", "k", None, &token!("1")));
        assert_eq!(first["compare"][0]["target"], "CREATE");
        let confirm = json_of(&mark_txn("k", "k", Some(&token!("5")), &token!("5")));
        assert_eq!(confirm["success"], json!([]));
    }

    #[test]
    fn answers_parse_and_bad_ones_are_errors() {
        let ok = parse_txn(br#"{"header":{"revision":"9"},"succeeded":true}"#).unwrap();
        assert!(ok.succeeded && ok.operations() == 0 && ok.revision == 9);
        let none = parse_txn(br#"{"header":{},"responses":[{"response_range":{"header":{}}}]}"#).unwrap();
        assert!(!none.succeeded && none.read(0).unwrap().is_empty());
        // A failed Txn without its read-back is an error, not "no mark".
        let bare = parse_txn(br#"{"header":{"revision":"7"},"responses":[],"succeeded":false}"#).unwrap();
        assert!(bare.read(0).is_err());
        let v = B64.encode(record::encode(b"x", &token!("7.1042")).as_bytes());
        let body = format!(
            r#"{{"responses":[{{"response_range":{{"kvs":[{{"key":"eA==","value":"{v}","create_revision":"4"}}]}}}}]}}"#
        );
        let lost = parse_txn(body.as_bytes()).unwrap();
        let kv = &lost.read(0).unwrap()[0];
        assert_eq!(kv.create_revision, 4);
        assert_eq!(mark_of("x", &kv.value), Ok(token!("7.1042")));
        assert!(mark_of("y", &kv.value).is_err(), "another resource's record");
        assert_eq!(mark_of("x", b"34"), Err(MarkError::OldFormat));
        assert!(parse_txn(b"{").is_err());
        assert!(parse_range(br#"{"kvs":[{"key":"!!"}]}"#).is_err());
        assert_eq!(
            status_error(503, b"no healthy\r\nupstream\x1b[2J").0,
            r#"etcd answered HTTP 503: "no healthy\r\nupstream\u{1b}[2J""#
        );
        assert!(status_error(503, &[0x15; 4096]).0.len() < 300);
    }

    #[test]
    fn authentication_body_and_token() {
        let body = json_of(&authenticate("fk", "p\"w"));
        assert_eq!((body["name"].as_str(), body["password"].as_str()), (Some("fk"), Some("p\"w")));
        assert_eq!(parse_token(br#"{"header":{},"token":"abc.7"}"#).unwrap(), "abc.7");
        assert!(parse_token(br#"{"header":{}}"#).is_err());
    }

    #[test]
    fn an_authentication_answer_is_bounded_and_its_token_fit_for_a_header() {
        // etcd 3.4's answers, as its JSON gateway sends them.
        let ok = br#"{"header":{"cluster_id":"1","member_id":"2","revision":"1","raft_term":"2"},"token":"wdBxRxjwXFskssWu.12"}"#;
        assert_eq!(parse_authentication(Some(200), ok), Ok("wdBxRxjwXFskssWu.12".to_owned()));
        let wrong = br#"{"error":"etcdserver: authentication failed, invalid user ID or password","message":"etcdserver: authentication failed, invalid user ID or password","code":3}"#;
        let refusal = parse_authentication(Some(400), wrong);
        let Err(AuthRefusal::WrongCredentials(e)) = refusal else { unreachable!("{refusal:?}") };
        assert!(e.0.starts_with("etcd answered HTTP 400: ") && e.0.contains("invalid user ID or password"), "{e}");
        let disabled = br#"{"error":"etcdserver: authentication is not enabled","code":9}"#;
        assert!(matches!(parse_authentication(Some(400), disabled), Err(AuthRefusal::Other(_))));
        assert!(matches!(parse_authentication(Some(503), b"upstream connect error"), Err(AuthRefusal::Other(_))));
        assert!(matches!(parse_authentication(None, b""), Err(AuthRefusal::Other(_))));
        // Hostile answers: a token with CR LF (header splitting), over-long ones, garbage.
        for body in [
            br#"{"token":"abc
x-admin: 1"}"#
                .to_vec(),
            br#"{"token":"a b"}"#.to_vec(),
            br#"{"token":7}"#.to_vec(),
            format!(r#"{{"token":"{}"}}"#, "t".repeat(MAX_TOKEN_BYTES + 1)).into_bytes(),
            format!(r#"{{"pad":"{}","token":"t"}}"#, " ".repeat(MAX_AUTH_ANSWER_BYTES)).into_bytes(),
            vec![0xff; 64],
            b"{".to_vec(),
        ] {
            let refusal = parse_authentication(Some(200), &body);
            let Err(AuthRefusal::Other(e)) = refusal else { unreachable!("{body:?}: {refusal:?}") };
            assert!(e.0.len() <= 500 && !e.0.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_refused_token_is_told_from_other_errors() {
        // etcd 3.4's answers to an expired or unknown token, and to a token older
        // than a change of users or roles (the gateway appends a trailer).
        let invalid = b"{\"error\":\"etcdserver: invalid auth token\",\"message\":\"etcdserver: invalid auth token\",\"code\":16}Grpc-Trailer-Content-Type: application/grpc\r\n";
        assert!(token_refused(401, invalid));
        assert!(token_refused(401, b""));
        let old = br#"{"error":"etcdserver: revision of auth store is old","message":"etcdserver: revision of auth store is old","code":3}"#;
        assert!(token_refused(400, old));
        let denied = br#"{"error":"etcdserver: permission denied","message":"etcdserver: permission denied","code":7}"#;
        assert!(!token_refused(403, denied));
        let empty =
            br#"{"error":"etcdserver: user name is empty","message":"etcdserver: user name is empty","code":3}"#;
        assert!(!token_refused(400, empty));
        assert!(!token_refused(200, b"{}") && !token_refused(503, b"no healthy upstream"));
    }

    #[test]
    fn a_confirm_of_several_marks_compares_each_and_reads_each_back() {
        let (a, b) = (token!("5"), token!("7.2"));
        assert_eq!(confirm_txn(&[("/m/a", "a", &a)]), mark_txn("/m/a", "a", Some(&a), &a), "one mark");
        let two = json_of(&confirm_txn(&[("/m/a", "a", &a), ("/m/b", "b", &b)]));
        assert_eq!(two["compare"][1]["value"], B64.encode(record::encode(b"b", &b).as_bytes()));
        assert_eq!(two["success"], json!([]));
        assert_eq!(two["failure"][1]["request_range"]["key"], B64.encode("/m/b"));
    }

    #[test]
    fn lock_queue_transactions_carry_several_reads() {
        let first =
            Range { key: b"orders/", prefix: true, limit: 1, by_create_revision: Some(true), ..Range::default() };
        let body = json_of(&txn_ops(
            b"orders/1a",
            Expect::Absent,
            &[Op::Put { key: b"orders/1a", value: b"", lease: Some(26) }, Op::Range(first.clone())],
            &[Op::Range(Range { key: b"orders/1a", ..Range::default() }), Op::Range(first)],
        ));
        let range = &body["success"][1]["request_range"];
        assert_eq!(range["range_end"], B64.encode("orders0"));
        assert_eq!((range["sort_target"].as_str(), range["sort_order"].as_str()), (Some("CREATE"), Some("ASCEND")));
        assert_eq!(body["success"][0]["request_put"]["lease"], "26");
        let older = Range { key: b"orders/", prefix: true, max_create_revision: Some(41), ..Range::default() };
        assert_eq!(json_of(&older.body())["max_create_revision"], "41");
        let at = json_of(&txn_ops(b"k", Expect::CreatedAt(7), &[], &[]));
        assert_eq!(at["compare"][0]["create_revision"], "7");
        let v = B64.encode("v");
        let answer = format!(
            r#"{{"header":{{"revision":"12"}},"succeeded":true,"responses":[{{"response_put":{{}}}},{{"response_range":{{"kvs":[{{"key":"eA==","value":"{v}","create_revision":"11"}}]}}}}]}}"#
        );
        let parsed = parse_txn(answer.as_bytes()).unwrap();
        assert_eq!((parsed.operations(), parsed.read(1).unwrap()[0].create_revision, parsed.revision), (2, 11, 12));
        assert!(parsed.read(0).is_err(), "a put is not a read");
    }

    #[test]
    fn a_replace_puts_or_deletes_only_if_the_value_is_unchanged() {
        let set = json_of(&replace_txn(b"k", Expect::Value(b"fk2 9 x"), Some(b"fk2 3 y")));
        assert_eq!(set["compare"][0]["value"], B64.encode("fk2 9 x"));
        assert_eq!(set["success"][0]["request_put"]["value"], B64.encode("fk2 3 y"));
        let clear = json_of(&replace_txn(b"k", Expect::Value(b"v"), None));
        assert_eq!(clear["success"][0]["request_delete_range"]["key"], B64.encode("k"));
        assert_eq!(clear["failure"], json!([]), "no read-back");
        let create = json_of(&replace_txn(b"k", Expect::Absent, Some(b"v")));
        assert_eq!(create["compare"][0]["target"], "CREATE");
        let read = parse_range_answer(br#"{"header":{"revision":"41"},"kvs":[{"key":"eA==","create_revision":"7"}]}"#);
        assert_eq!(read.map(|a| (a.revision, a.kvs[0].create_revision)), Ok((41, 7)));
    }

    #[test]
    fn lease_bodies_and_answers() {
        assert_eq!(json_of(&lease_grant(2))["TTL"], 2);
        assert_eq!(parse_lease_grant(br#"{"ID":"7587","TTL":"2"}"#).unwrap(), 7587);
        assert!(parse_lease_grant(br#"{"TTL":"2"}"#).is_err());
        assert_eq!(parse_keepalive(br#"{"result":{"ID":"7587","TTL":"2"}}"#).unwrap(), 2);
        assert_eq!(parse_keepalive(br#"{"result":{"ID":"7587"}}"#).unwrap(), 0);
        let locked = json_of(&txn(b"lock", Expect::Absent, Some(b"me"), Some(7587), false));
        assert_eq!(locked["success"][0]["request_put"]["lease"], "7587");
        assert_eq!(locked["failure"], json!([]), "no read-back asked for");
    }
}
