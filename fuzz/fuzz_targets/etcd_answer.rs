//! Target 5: the Envoy filter's parser of etcd's JSON answers (`etcd::parse`), and
//! the etcd wire's parser of an authentication's answer (`parse_authentication`).
//!
//! An input that starts with `{` is a body etcd answered with status 200 (the seeds
//! are real answers of etcd 3.4) for resource `orders/2026.csv`; any other input is
//! read as one of the cases below.
//!
//! * Any status and body: no panic; anything but a 200 is an error; and every
//!   error is one printable line, no longer than a bound plus the quoted resource
//!   key, since it becomes the cause in a refusal's reason (a response body, a log
//!   line, a `grpc-message`).
//! * Answers shaped like etcd's (`succeeded`, `responses[].response_range.kvs[]`,
//!   base64 values), serialized by serde_json: the outcome is the one the shape
//!   says: a committed transaction, the mark the first range read holds (an error
//!   for any value that holds none), or no mark.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use fencekeeper_etcd_wire as wire;
use fencekeeper_filter::etcd::Outcome;
use fencekeeper_fuzz::etcd::{mark, parse, stored};
use fencekeeper_fuzz::header::is_printable_line;
use fencekeeper_fuzz::input::TokenText;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

/// The longest error text, besides the resource key it may quote: the cause of a
/// reason, which may become a header.
const MAX_ERROR_BYTES: usize = 512;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any body, under a status Envoy could report (`:status` is three digits).
    Raw { status: Option<u16>, body: Vec<u8>, resource: String },
    /// A body shaped like etcd's answer to a transaction, status 200.
    Shaped(Answer),
}

#[derive(Arbitrary, Debug)]
struct Answer {
    resource: String,
    succeeded: Option<bool>,
    responses: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Range(Vec<Kv>),
    Put,
    Empty,
}

#[derive(Arbitrary, Debug)]
enum Kv {
    /// What a writer stores for this token.
    Token(TokenText),
    /// What another writer stored for this token under another resource.
    Moved(TokenText, String),
    Bytes(Vec<u8>),
    NotBase64(String),
    NoValue,
}

impl Kv {
    /// The base64 value field, if any.
    fn value(&self, resource: &str) -> Option<String> {
        match self {
            Kv::Token(t) => Some(B64.encode(stored(resource, &t.token.token()))),
            Kv::Moved(t, other) => Some(B64.encode(stored(other, &t.token.token()))),
            Kv::Bytes(b) => Some(B64.encode(b)),
            Kv::NotBase64(s) => Some(s.clone()),
            Kv::NoValue => None,
        }
    }

    fn json(&self, resource: &str) -> Value {
        match self.value(resource) {
            Some(v) => json!({"key": "eA==", "value": v, "version": "1"}),
            None => json!({"key": "eA=="}),
        }
    }
}

impl Answer {
    fn json(&self) -> Value {
        let responses: Vec<Value> = self
            .responses
            .iter()
            .map(|op| match op {
                Op::Range(kvs) => {
                    let kvs: Vec<Value> = kvs.iter().map(|kv| kv.json(&self.resource)).collect();
                    json!({"response_range": {"header": {"revision": "7"}, "kvs": kvs, "count": "1"}})
                }
                Op::Put => json!({"response_put": {"header": {"revision": "7"}}}),
                Op::Empty => json!({}),
            })
            .collect();
        let mut body = json!({"header": {"cluster_id": "1", "revision": "7"}, "responses": responses});
        if let Some(s) = self.succeeded {
            body["succeeded"] = json!(s);
        }
        body
    }

    /// `None`: an error is expected.
    fn outcome(&self) -> Option<Outcome> {
        if self.succeeded == Some(true) {
            return Some(Outcome::Succeeded);
        }
        // The mark Txn's failure branch is one read: the answer's first operation
        // must be that read; anything else is an error, never "no mark".
        let kvs = match self.responses.first()? {
            Op::Range(kvs) => kvs,
            _ => return None,
        };
        // Every key-value of the read must decode: garbage anywhere in the read is an
        // error, not a reason to look at the first entry alone.
        if kvs.iter().any(|kv| B64.decode(kv.value(&self.resource).unwrap_or_default()).is_err()) {
            return None;
        }
        let Some(kv) = kvs.first() else {
            return Some(Outcome::Current(None));
        };
        let value = B64.decode(kv.value(&self.resource).unwrap_or_default()).ok()?;
        mark(&self.resource, &value).map(|m| Outcome::Current(Some(m)))
    }
}

/// The same answer read as etcd's answer to an authentication (`etcd.user`): no
/// panic; a token fit for a header (visible ASCII, bounded); an error one printable
/// bounded line.
fn authentication(status: Option<u16>, body: &[u8]) {
    let _ = wire::token_refused(status.unwrap_or(0), body);
    match wire::parse_authentication(status, body) {
        Ok(token) => {
            assert_eq!(status, Some(200));
            assert!(!token.is_empty() && token.len() <= wire::MAX_TOKEN_BYTES, "{token:?}");
            assert!(token.bytes().all(|b| b.is_ascii_graphic()), "{token:?}");
        }
        Err(wire::AuthRefusal::WrongCredentials(e) | wire::AuthRefusal::Other(e)) => {
            assert!(is_printable_line(&e.0) && e.0.len() <= MAX_ERROR_BYTES, "{:?}", e.0);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let input = if data.first() == Some(&b'{') {
        Input::Raw { status: Some(200), body: data.to_vec(), resource: "orders/2026.csv".to_owned() }
    } else {
        let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
        input
    };
    let (result, resource) = match &input {
        Input::Raw { status, body, resource } => {
            let status = status.map(|s| format!("{:03}", s % 1000));
            let result = parse(status.as_deref(), body, resource);
            if status.as_deref() != Some("200") {
                assert!(result.is_err(), "status {status:?} gave {result:?}");
            }
            authentication(status.as_deref().and_then(|s| s.parse().ok()), body);
            (result, resource)
        }
        Input::Shaped(answer) => {
            let body = answer.json().to_string();
            let result = parse(Some("200"), body.as_bytes(), &answer.resource);
            assert_eq!(result.as_ref().ok(), answer.outcome().as_ref(), "{body}");
            (result, &answer.resource)
        }
    };
    if let Err(e) = result {
        let bound = MAX_ERROR_BYTES + format!("{resource:?}").len();
        assert!(is_printable_line(&e.0) && e.0.len() <= bound, "{:?}", e.0);
    }
});
