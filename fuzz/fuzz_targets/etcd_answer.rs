//! Target 5: the Envoy filter's parser of etcd's JSON answers (`etcd::parse`).
//!
//! An input that starts with `{` is a body etcd answered with status 200 (the seeds
//! are real answers of etcd 3.4); any other input is read as one of the cases
//! below.
//!
//! * Any status and body: no panic; anything but a 200 is an error; and every
//!   error is one printable line of bounded length, since it becomes the cause in
//!   a refusal's reason (a response body, a log line, a `grpc-message`).
//! * Answers shaped like etcd's (`succeeded`, `responses[].response_range.kvs[]`,
//!   base64 values), serialized by serde_json: the outcome is the one the shape
//!   says: a committed transaction, the mark the first range read holds (the
//!   model's token, or an error for any value that is not one), or no mark.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use fencekeeper_core::Token;
use fencekeeper_filter::etcd::{parse, Outcome};
use fencekeeper_fuzz::header::is_printable_line;
use fencekeeper_fuzz::input::TokenText;
use fencekeeper_fuzz::model;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

/// The longest error text: the cause of a reason, which may become a header.
const MAX_ERROR_BYTES: usize = 512;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any body, under a status Envoy could report (`:status` is three digits).
    Raw { status: Option<u16>, body: Vec<u8> },
    /// A body shaped like etcd's answer to a transaction, status 200.
    Shaped(Answer),
}

#[derive(Arbitrary, Debug)]
struct Answer {
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
    Token(TokenText),
    Text(String),
    Bytes(Vec<u8>),
    NotBase64(String),
    NoValue,
}

impl Kv {
    fn json(&self) -> Value {
        match self {
            Kv::Token(t) => json!({"key": "eA==", "value": B64.encode(t.text()), "version": "1"}),
            Kv::Text(s) => json!({"key": "eA==", "value": B64.encode(s)}),
            Kv::Bytes(b) => json!({"key": "eA==", "value": B64.encode(b)}),
            Kv::NotBase64(s) => json!({"key": "eA==", "value": s}),
            Kv::NoValue => json!({"key": "eA=="}),
        }
    }

    /// The mark this value holds, or `None` when it is not one.
    fn mark(&self) -> Option<Token> {
        let raw = match self {
            Kv::Token(t) => B64.encode(t.text()),
            Kv::Text(s) => B64.encode(s),
            Kv::Bytes(b) => B64.encode(b),
            Kv::NotBase64(s) => s.clone(),
            Kv::NoValue => String::new(),
        };
        let text = String::from_utf8(B64.decode(raw).ok()?).ok()?;
        let parts = model::token(&text).ok()?;
        Some(Token::from_parts(&parts).expect("the model's token"))
    }
}

impl Answer {
    fn json(&self) -> Value {
        let responses: Vec<Value> = self
            .responses
            .iter()
            .map(|op| match op {
                Op::Range(kvs) => {
                    let kvs: Vec<Value> = kvs.iter().map(Kv::json).collect();
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
        let kvs = self.responses.iter().find_map(|op| match op {
            Op::Range(kvs) => Some(kvs),
            _ => None,
        })?;
        match kvs.first() {
            None => Some(Outcome::Current(None)),
            Some(kv) => kv.mark().map(|m| Outcome::Current(Some(m))),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let input = if data.first() == Some(&b'{') {
        Input::Raw { status: Some(200), body: data.to_vec() }
    } else {
        let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
        input
    };
    let result = match &input {
        Input::Raw { status, body } => {
            let status = status.map(|s| format!("{:03}", s % 1000));
            let result = parse(status.as_deref(), body);
            if status.as_deref() != Some("200") {
                assert!(result.is_err(), "status {status:?} gave {result:?}");
            }
            result
        }
        Input::Shaped(answer) => {
            let body = answer.json().to_string();
            let result = parse(Some("200"), body.as_bytes());
            assert_eq!(result.as_ref().ok(), answer.outcome().as_ref(), "{body}");
            result
        }
    };
    if let Err(e) = result {
        assert!(is_printable_line(&e.0) && e.0.len() <= MAX_ERROR_BYTES, "{:?}", e.0);
    }
});
