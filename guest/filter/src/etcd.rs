//! Marks in etcd, over etcd's gRPC API (`etcdserverpb.KV/Txn`) through an Envoy
//! cluster that speaks HTTP/2 to etcd's client port, or on a host without gRPC calls
//! over etcd's JSON API (`POST /v3/kv/txn`, `etcd.api: "json"`) through an HTTP/1.1
//! call: the same messages, transcoded (`fencekeeper_etcd_wire::json`), so that one
//! set of parsers below judges both.
//!
//! Key scheme and value format shared with the gateway (so an Envoy and a gateway
//! can share one etcd): key = prefix + resource (default prefix
//! `/fencekeeper/marks/`), value = the mark's record from the core
//! (`fencekeeper_core::record`; `fk2 34 fc4dab37` for mark 34 of `orders/2026.csv`), whose CRC32C covers the resource
//! and the token. One transaction per step:
//!
//! ```text
//! compare: value(key) == record(expected)  (create_revision(key) == 0 when no mark)
//! success: put(key, record(token))         (nothing when token == expected: a confirm)
//! failure: range(key)                      (the current mark, to decide again)
//! ```
//!
//! Records are deterministic, so comparing record bytes compares marks. A value read
//! back is verified against the resource: one damaged by another writer, moved from
//! another key or left bare by an earlier version (format 1) is an error, and the
//! request is undecided, never admitted against a lower mark.
//!
//! Why gRPC where the host has it: the JSON gateway decodes the JSON and calls etcd's
//! own gRPC server, so the same Txn costs etcd about twice the CPU (BENCHMARKS.md),
//! and in front of a store every admit is one.

use crate::config::{Etcd, EtcdApi};
use fencekeeper_core::Token;
use fencekeeper_etcd_wire::grpc::{self, Status};
use fencekeeper_etcd_wire::json;
use fencekeeper_etcd_wire::retention::{self, CreateError};
use fencekeeper_etcd_wire::{self as wire, Expect, KeyValue, MarkError, Op, Range};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// Which etcd method a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `etcdserverpb.KV/Txn`: the mark transaction and the vouching read.
    Txn,
    /// `etcdserverpb.Auth/Authenticate`.
    Authenticate,
    /// `etcdserverpb.Lease/LeaseGrant`: the in-flight registry's leases.
    LeaseGrant,
}

/// Send `message` (protobuf) to etcd's `method` through the configured cluster, with
/// `token` (etcd's authentication) as metadata when given, over the configured API.
/// The host answers in `on_grpc_call_response` (gRPC) or `on_http_call_response`
/// (JSON, read with [`http_response`]) of the context the SDK has active when this is
/// called (the request's own, or the root's for a batch); it returns the call's id.
pub fn call(e: &Etcd, method: Method, token: Option<&str>, message: &[u8]) -> Result<u32, String> {
    let timeout = Duration::from_millis(e.timeout_ms);
    match e.api {
        EtcdApi::Grpc => {
            let (service, name) = match method {
                Method::Txn => (grpc::KV_SERVICE, grpc::TXN_METHOD),
                Method::Authenticate => (grpc::AUTH_SERVICE, grpc::AUTHENTICATE_METHOD),
                Method::LeaseGrant => (grpc::LEASE_SERVICE, grpc::LEASE_GRANT_METHOD),
            };
            let metadata = token.map(|t| (grpc::TOKEN_METADATA, t.as_bytes())).into_iter().collect();
            hostcalls::dispatch_grpc_call(&e.service, service, name, metadata, Some(message), timeout).map_err(|s| {
                format!("cannot call etcd cluster {:?} ({s:?}): is it a cluster of Envoy's configuration?", e.cluster)
            })
        }
        EtcdApi::Json => {
            let call = json_call(method);
            let body = json::request(call, message).map_err(|e| e.0)?;
            let mut headers = vec![
                (":method", "POST"),
                (":path", call.path()),
                (":authority", e.authority.as_str()),
                ("content-type", json::CONTENT_TYPE),
            ];
            if let Some(t) = token {
                headers.push((json::TOKEN_HEADER, t));
            }
            let sent = hostcalls::dispatch_http_call(&e.cluster, headers, Some(&body), Vec::new(), timeout);
            if method == Method::Authenticate {
                // It carries the password.
                crate::env::wipe(body);
            }
            let id = sent.map_err(|s| {
                format!(
                    "cannot call etcd's JSON API through {:?} ({s:?}): is it a cluster of the proxy's configuration \
                     (on ngx_wasm_module, host:port)?",
                    e.cluster
                )
            })?;
            JSON_CALLS.with(|calls| {
                let mut calls = calls.borrow_mut();
                // A call whose context went before its answer is never answered: its
                // entry goes once no answer can come.
                let now = crate::gate::now_ms();
                calls.retain(|_, (_, sent)| now.saturating_sub(*sent) <= e.timeout_ms + FORGET_CALL_MS);
                calls.insert(id, (call, now));
            });
            Ok(id)
        }
    }
}

fn json_call(method: Method) -> json::Call {
    match method {
        Method::Txn => json::Call::Txn,
        Method::Authenticate => json::Call::Authenticate,
        Method::LeaseGrant => json::Call::LeaseGrant,
    }
}

/// How long past its timeout a JSON call's entry is kept for an answer (ms).
const FORGET_CALL_MS: u64 = 60_000;

thread_local! {
    /// The JSON calls awaiting an answer, by id: which call, to read its answer as,
    /// and when it was sent (ms).
    static JSON_CALLS: RefCell<HashMap<u32, (json::Call, u64)>> = RefCell::new(HashMap::new());
}

/// Whether `id` is an etcd call over the JSON API awaiting its answer (a request's
/// other HTTP call, the store's HEAD, is not).
pub fn is_json_call(id: u32) -> bool {
    JSON_CALLS.with(|calls| calls.borrow().contains_key(&id))
}

/// The answer to the JSON call `id`, whose `on_http_call_response` runs now
/// (`body_size` as the host reported it), as the protobuf a gRPC call would have
/// answered, or the status it failed with. Reads at most one byte more than an
/// answer may have.
pub fn http_response(id: u32, body_size: usize) -> Response {
    let call = JSON_CALLS.with(|calls| calls.borrow_mut().remove(&id)).map_or(json::Call::Txn, |(call, _)| call);
    let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| s.parse::<u16>().ok())
        .unwrap_or(0);
    let size = body_size.min(json::MAX_ANSWER_BYTES + 1);
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size).ok().flatten().unwrap_or_default();
    json::answer(call, status, &body)
}

/// What etcd answered a call: its message, or a status other than OK (etcd's, or
/// Envoy's own when it could not reach etcd).
pub type Response = Result<Vec<u8>, Status>;

/// The answer to the call whose callback runs now (`status_code` and `size` as the
/// host reported them). Reads at most one byte more than an answer may have.
pub fn response(status_code: u32, size: usize) -> Response {
    if status_code != 0 {
        return Err(Status { code: status_code, message: status_message() });
    }
    let size = size.min(grpc::MAX_ANSWER_BYTES + 1);
    Ok(hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size).ok().flatten().unwrap_or_default())
}

/// The message of the failed call whose callback runs now. Read with the ABI call
/// itself: the SDK's `get_grpc_status` panics (traps the VM) on a message that is
/// not UTF-8, and the message comes from whoever answered.
#[cfg(target_arch = "wasm32")]
fn status_message() -> String {
    #[link(wasm_import_module = "env")]
    extern "C" {
        fn proxy_get_status(code: *mut u32, data: *mut *mut u8, size: *mut usize) -> u32;
    }
    let (mut code, mut data, mut size) = (0u32, std::ptr::null_mut(), 0usize);
    // SAFETY: three valid out-pointers. On success the host has allocated `size`
    // bytes at `data` through the SDK's `proxy_on_memory_allocate`, a `Vec<u8>` of
    // exactly that capacity, which is ours to free.
    let status = unsafe { proxy_get_status(&mut code, &mut data, &mut size) };
    if status != 0 || data.is_null() {
        return String::new();
    }
    // SAFETY: see above: `data` came from a `Vec<u8>` with capacity `size`.
    let bytes = unsafe { Vec::from_raw_parts(data, size, size) };
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(not(target_arch = "wasm32"))]
fn status_message() -> String {
    String::new()
}

/// The message of one compare-and-advance (or compare-and-confirm) transaction on
/// `resource`'s mark at `key`.
pub fn txn(key: &str, resource: &str, expected: Option<&Token>, token: &Token) -> Vec<u8> {
    grpc::mark_txn(key, resource, expected, token)
}

/// The message of the transaction that gives `resource` (at `key`) its first mark
/// `token`: it compares the retention floor beside the marks under `prefix` with
/// `floor` (the one this request last read; `None`: none), and reads the mark and the
/// floor back when either moved (`fencekeeper_etcd_wire::retention`).
pub fn create(prefix: &str, key: &str, resource: &str, floor: Option<&Token>, token: &Token) -> Vec<u8> {
    retention::create_txn(key, resource, &retention::floor_key(prefix), floor, token)
}

/// Parse etcd's answer to [`create`]: the outcome, the floor it read back (when the
/// compare failed), and the cluster's revision.
pub fn created(response: &Response, prefix: &str, resource: &str) -> Result<(Outcome, Option<Token>, u64), EtcdError> {
    let answer = grpc::parse_txn(ok(response)?).map_err(|e| EtcdError(e.0))?;
    let floor_key = retention::floor_key(prefix);
    match retention::created(&answer, resource, &floor_key) {
        Ok(None) => Ok((Outcome::Succeeded, None, answer.revision)),
        Ok(Some((mark, floor))) => Ok((Outcome::Current(mark), floor, answer.revision)),
        Err(CreateError::Wire(e)) => Err(EtcdError(e.0)),
        Err(CreateError::Mark(_)) => Err(read_back(&answer, 0, resource)
            .err()
            .unwrap_or_else(|| EtcdError(format!("etcd holds a damaged mark for {}", wire::excerpt(resource))))),
        Err(CreateError::Floor(e)) => Err(EtcdError(format!(
            "etcd holds a damaged retention floor at {floor_key:?} ({e:?}); no first mark is made under it until \
             an operator repairs it"
        ))),
    }
}

/// What a transaction answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The compare held: the put (if any) is committed.
    Succeeded,
    /// The compare failed; this is the current mark (`None`: no key).
    Current(Option<Token>),
}

/// Why an etcd answer could not be used.
#[derive(Clone, Debug, PartialEq)]
pub struct EtcdError(pub String);

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parse etcd's answer to [`txn`] on `resource`'s mark.
pub fn parse(response: &Response, resource: &str) -> Result<Outcome, EtcdError> {
    answer(response, resource).map(|(outcome, _)| outcome)
}

/// [`parse`], with the cluster's revision the answer carried.
pub fn answer(response: &Response, resource: &str) -> Result<(Outcome, u64), EtcdError> {
    let answer = grpc::parse_txn(ok(response)?).map_err(|e| EtcdError(e.0))?;
    if answer.succeeded {
        return Ok((Outcome::Succeeded, answer.revision));
    }
    // The failure branch's one read.
    Ok((Outcome::Current(read_back(&answer, 0, resource)?), answer.revision))
}

/// The message of one Txn that confirms several resources' marks at once (`(resource,
/// mark)`, keys under `prefix`): each compared; when any moved, each read back, and
/// the retention floor after them (a mark that left etcd is held to it).
pub fn confirms(prefix: &str, marks: &[(&str, Token)]) -> Vec<u8> {
    let keys: Vec<String> = marks.iter().map(|(resource, _)| format!("{prefix}{resource}")).collect();
    let records: Vec<_> =
        marks.iter().map(|(resource, mark)| fencekeeper_core::record::encode(resource.as_bytes(), mark)).collect();
    let compares: Vec<(&[u8], Expect<'_>)> =
        keys.iter().zip(&records).map(|(key, r)| (key.as_bytes(), Expect::Value(r.as_bytes()))).collect();
    let floor_key = retention::floor_key(prefix);
    let reads: Vec<Op<'_>> = keys
        .iter()
        .map(|key| Op::Range(Range::of(key.as_bytes())))
        .chain([Op::Range(Range::of(floor_key.as_bytes()))])
        .collect();
    grpc::txn(&compares, &[], &reads)
}

/// What a batch's Txn answered: each resource's outcome, in the order sent (a value
/// that is not that resource's verified record fails it alone), the retention floor
/// it read when any moved (an error fails only the resources without a mark), and
/// the cluster's revision.
pub type Confirmed = (Vec<Result<Outcome, EtcdError>>, Result<Option<Token>, EtcdError>, u64);

/// Parse the answer to [`confirms`] on `resources` under `prefix`.
pub fn confirmed(response: &Response, prefix: &str, resources: &[String]) -> Result<Confirmed, EtcdError> {
    let answer = grpc::parse_txn(ok(response)?).map_err(|e| EtcdError(e.0))?;
    if answer.succeeded {
        return Ok((resources.iter().map(|_| Ok(Outcome::Succeeded)).collect(), Ok(None), answer.revision));
    }
    let outcomes = resources
        .iter()
        .enumerate()
        .map(|(i, resource)| Ok(Outcome::Current(read_back(&answer, i, resource)?)))
        .collect();
    let floor_key = retention::floor_key(prefix);
    let floor = answer.read(resources.len()).map_err(|e| EtcdError(e.0)).and_then(|kvs| {
        retention::floor_of(&floor_key, &kvs)
            .map_err(|e| EtcdError(format!("etcd holds a damaged retention floor at {floor_key:?} ({e:?})")))
    });
    Ok((outcomes, floor, answer.revision))
}

/// `resource`'s verified mark as operation `i` of a failed Txn read it back. An
/// answer without that read is an error, never "no mark".
fn read_back(answer: &wire::TxnAnswer, i: usize, resource: &str) -> Result<Option<Token>, EtcdError> {
    let read = answer.read(i).map_err(|e| EtcdError(e.0))?;
    read.first().map(|kv| verified(resource, &kv.value)).transpose()
}

/// Any Txn's answer, parsed (a conditional write's chain read or swap).
pub fn txn_answer(response: &Response) -> Result<wire::TxnAnswer, EtcdError> {
    grpc::parse_txn(ok(response)?).map_err(|e| EtcdError(e.0))
}

fn ok(response: &Response) -> Result<&[u8], EtcdError> {
    response.as_deref().map_err(|s| {
        let error = s.error().0;
        if s.code == UNIMPLEMENTED {
            // What an etcd cluster of HTTP/1.1 in Envoy's configuration gets.
            EtcdError(format!("{error}; does the etcd cluster speak HTTP/2 (docs/envoy.md)?"))
        } else {
            EtcdError(error)
        }
    })
}

/// gRPC's status for a method the server does not have.
const UNIMPLEMENTED: u32 = 12;

/// A value read back, as `resource`'s mark. A value that is not this resource's
/// verified record is a store fault, never a reason to admit. The resource is quoted
/// and cut: an error is one bounded line.
fn verified(resource: &str, value: &[u8]) -> Result<Token, EtcdError> {
    let quoted = wire::excerpt(resource);
    wire::mark_of(resource, value).map_err(|e| {
        EtcdError(match e {
            MarkError::OldFormat => format!(
                "etcd holds the mark of {quoted} in the old format without a checksum; \
                 upgrade it with `fencekeeper marks --etcd URL --upgrade`"
            ),
            MarkError::Damaged(other) => format!("etcd holds a damaged mark for {quoted}: {other}"),
        })
    })
}

/// The message of the vouching read before an advance: `resource`'s mark at `key`,
/// and with `lock` (the strong check) the holder of that lock, in one read-only Txn.
pub fn vouch(key: &str, lock: Option<&str>) -> Vec<u8> {
    grpc::vouch_txn(key, lock)
}

/// What the vouching read found.
#[derive(Debug, PartialEq)]
pub struct Found {
    /// `resource`'s mark, verified (`None`: no mark).
    pub mark: Option<Token>,
    /// The lock's holder, when the lock was read and is held.
    pub holder: Option<KeyValue>,
    /// The cluster's revision at the read.
    pub revision: u64,
}

/// Parse the answer to [`vouch`] on `resource`.
pub fn parse_vouch(response: &Response, resource: &str) -> Result<Found, EtcdError> {
    let answer = grpc::parse_vouch_txn(ok(response)?).map_err(|e| EtcdError(e.0))?;
    let mark = answer.mark.map(|kv| verified(resource, &kv.value)).transpose()?;
    Ok(Found { mark, holder: answer.holder, revision: answer.revision })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::record;
    use fencekeeper_core::token;

    fn kv(key: &str, value: &[u8], create_revision: u64) -> KeyValue {
        KeyValue { key: key.as_bytes().to_vec(), value: value.to_vec(), create_revision, mod_revision: create_revision }
    }

    fn value(resource: &str, token: &str) -> Vec<u8> {
        record::encode(resource.as_bytes(), &token!(token)).as_bytes().to_vec()
    }

    /// etcd's answer to a failed compare whose read-back found `value`.
    fn lost(value: &[u8]) -> Response {
        Ok(grpc::txn_answer(false, 7, &[Some(&[kv("x", value, 3)])]))
    }

    #[test]
    fn a_damaged_moved_or_bare_value_is_an_error_not_a_lower_mark() {
        let mut damaged = value("r", "50");
        damaged[4] = b'4'; // "fk2 40 ..."
        let err = parse(&lost(&damaged), "r").unwrap_err();
        assert!(err.0.contains("damaged mark for \"r\""), "{err}");
        assert!(parse(&lost(&value("q", "50")), "r").is_err(), "another resource's record");
        let bare = parse(&lost(b"34"), "r").unwrap_err();
        assert!(bare.0.contains("old format") && bare.0.contains("--upgrade"), "{bare}");
    }

    #[test]
    fn the_vouching_read_gives_the_verified_mark_the_holder_and_the_revision() {
        let holder = kv("/locks/r/694d", b"", 40);
        let answer = Ok(grpc::txn_answer(true, 57, &[Some(&[kv("x", &value("r", "33"), 3)]), Some(&[holder])]));
        let found = parse_vouch(&answer, "r").unwrap();
        assert_eq!((found.mark, found.revision), (Some(token!("33")), 57));
        assert_eq!(found.holder.map(|h| h.create_revision), Some(40));
        assert!(parse_vouch(&answer, "q").is_err(), "another resource's record");
        let unavailable = Err(Status { code: 14, message: "no healthy upstream".into() });
        assert!(parse_vouch(&unavailable, "r").is_err());
        let nobody = Ok(grpc::txn_answer(true, 9, &[Some(&[]), Some(&[])]));
        let found = parse_vouch(&nobody, "r").unwrap();
        assert_eq!((found.mark, found.holder, found.revision), (None, None, 9));
        // The read etcd must answer is missing: an error, not "no mark".
        assert!(parse_vouch(&Ok(grpc::txn_answer(true, 9, &[])), "r").is_err());
    }

    #[test]
    fn answers_parse_and_bad_ones_are_errors() {
        let committed = Ok(grpc::txn_answer(true, 9, &[]));
        assert_eq!(answer(&committed, "x"), Ok((Outcome::Succeeded, 9)));
        assert_eq!(parse(&Ok(grpc::txn_answer(false, 9, &[Some(&[])])), "x"), Ok(Outcome::Current(None)));
        assert_eq!(parse(&lost(&value("x", "7.1042")), "x"), Ok(Outcome::Current(Some(token!("7.1042")))));
        let timeout = Err(Status { code: 4, message: "upstream request timeout".into() });
        let e = parse(&timeout, "x").unwrap_err();
        assert_eq!(e.0, r#"etcd answered gRPC status 4 (DEADLINE_EXCEEDED): "upstream request timeout""#);
        assert!(parse(&Ok(vec![0x0a]), "x").is_err());
        let http1 = Err(Status { code: 12, message: "via_upstream".into() });
        assert!(parse(&http1, "x").unwrap_err().0.ends_with("does the etcd cluster speak HTTP/2 (docs/envoy.md)?"));
        assert!(parse(&lost(b"x"), "x").unwrap_err().0.contains("damaged mark"));
    }

    #[test]
    fn a_first_mark_reads_the_floor_back_and_a_damaged_floor_is_an_error() {
        let floor_key = retention::floor_key("/p/");
        let floor = |token: &str| kv(&floor_key, retention::floor_record(&floor_key, &token!(token)).as_bytes(), 2);
        let lost = Ok(grpc::txn_answer(false, 9, &[Some(&[]), Some(&[floor("40")])]));
        assert_eq!(created(&lost, "/p/", "r"), Ok((Outcome::Current(None), Some(token!("40")), 9)));
        let won = Ok(grpc::txn_answer(true, 9, &[None]));
        assert_eq!(created(&won, "/p/", "r"), Ok((Outcome::Succeeded, None, 9)));
        let damaged = Ok(grpc::txn_answer(false, 9, &[Some(&[]), Some(&[kv(&floor_key, b"fk2 40 00000000", 2)])]));
        assert!(created(&damaged, "/p/", "r").unwrap_err().0.contains("damaged retention floor"));
        // The message compares the floor this request last saw.
        let body = create("/p/", "/p/r", "r", Some(&token!("40")), &token!("41"));
        assert_eq!(body, retention::create_txn("/p/r", "r", &floor_key, Some(&token!("40")), &token!("41")));
    }

    #[test]
    fn errors_quote_what_answered_on_one_bounded_line() {
        // A proxy's error text with CR LF or control bytes, or of any length, goes
        // into the refusal's reason (a header, a grpc-message): quoted and cut.
        let page = Err(Status { code: 14, message: "<html>\r\n<head>\x1b[2J</head>\r\n".into() });
        let e = parse(&page, "r").unwrap_err();
        assert_eq!(e.0, r#"etcd answered gRPC status 14 (UNAVAILABLE): "<html>\r\n<head>\u{1b}[2J</head>""#);
        let long = parse(&Err(Status { code: 2, message: "\u{15}".repeat(4096) }), "r").unwrap_err();
        let holds = lost("\u{202e}".repeat(1000).as_bytes());
        let holds = parse(&holds, &"k".repeat(1024)).unwrap_err();
        let unparsable = parse(&Ok(vec![0x12; 4096]), "r").unwrap_err();
        for e in [long, holds, unparsable] {
            assert!(e.0.len() <= 500 && !e.0.chars().any(|c| c.is_control() || c == '\u{202e}'), "{e}");
        }
    }

    #[test]
    fn a_confirm_of_several_resources_decides_each_on_its_own_read() {
        let resources = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let all = confirmed(&Ok(grpc::txn_answer(true, 9, &[])), "/p/", &resources).unwrap();
        assert_eq!(all, (vec![Ok(Outcome::Succeeded); 3], Ok(None), 9));
        // "b" moved on; "c" holds another resource's record: each is decided alone.
        let reads = [
            vec![kv("x", &value("a", "5"), 3)],
            vec![kv("x", &value("b", "9"), 3)],
            vec![kv("x", &value("a", "5"), 3)],
        ];
        let ops: Vec<Option<&[KeyValue]>> = reads.iter().map(|r| Some(r.as_slice())).collect();
        let (outcomes, floor, revision) = confirmed(&Ok(grpc::txn_answer(false, 12, &ops)), "/p/", &resources).unwrap();
        assert_eq!(revision, 12);
        assert!(floor.is_err(), "the floor's read is missing: an error, never no floor");
        assert_eq!(outcomes[0], Ok(Outcome::Current(Some(token!("5")))));
        assert_eq!(outcomes[1], Ok(Outcome::Current(Some(token!("9")))));
        assert!(outcomes[2].as_ref().unwrap_err().0.contains("damaged mark for \"c\""));
        // A read missing from the answer fails its resource, not "no mark".
        let short = confirmed(&Ok(grpc::txn_answer(false, 12, &ops[..2])), "/p/", &resources).unwrap();
        assert!(short.0[2].as_ref().unwrap_err().0.contains("lacks the read"));
        assert!(confirmed(&Err(Status { code: 14, message: "down".into() }), "/p/", &resources).is_err());
        // The largest confirm: 64 resources of the longest keys, every one read back.
        let long: Vec<String> = (0..64).map(|i| format!("{i:02}{}", "k".repeat(1022))).collect();
        let reads: Vec<Vec<KeyValue>> =
            long.iter().map(|r| vec![kv(&format!("/fencekeeper/marks/{r}"), &value(r, "5"), 3)]).collect();
        let ops: Vec<Option<&[KeyValue]>> = reads.iter().map(|r| Some(r.as_slice())).collect();
        let answer = grpc::txn_answer(false, 12, &ops);
        assert!(answer.len() > 64 * 1024);
        let (outcomes, _, _) = confirmed(&Ok(answer), "/fencekeeper/marks/", &long).unwrap();
        assert!(outcomes.iter().all(|o| *o == Ok(Outcome::Current(Some(token!("5"))))));
        // The library's confirm, and the floor read after the marks.
        let message = confirms("/p/", &[("a", token!("5")), ("b", token!("9"))]);
        let (a, b) = (
            fencekeeper_core::record::encode(b"a", &token!("5")),
            fencekeeper_core::record::encode(b"b", &token!("9")),
        );
        let expected = grpc::txn(
            &[(b"/p/a", Expect::Value(a.as_bytes())), (b"/p/b", Expect::Value(b.as_bytes()))],
            &[],
            &[Op::Range(Range::of(b"/p/a")), Op::Range(Range::of(b"/p/b")), Op::Range(Range::of(b"/p/"))],
        );
        assert_eq!(message, expected);
        // With every read back: the floor's too.
        let floor = kv("/p/", retention::floor_record("/p/", &token!("7")).as_bytes(), 2);
        let answer = grpc::txn_answer(false, 12, &[Some(&[]), Some(&[]), Some(std::slice::from_ref(&floor))]);
        let (_, floor, _) = confirmed(&Ok(answer), "/p/", &["a".to_owned(), "b".to_owned()]).unwrap();
        assert_eq!(floor, Ok(Some(token!("7"))));
    }

    #[test]
    fn a_failed_txn_without_its_read_back_is_an_error_not_no_mark() {
        let bare = Ok(grpc::txn_answer(false, 7, &[]));
        let e = parse(&bare, "r").unwrap_err();
        assert!(e.0.contains("lacks the read"), "{e}");
    }
}
