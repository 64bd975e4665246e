//! Target 5: the Envoy filter's parser of etcd's gRPC answers (`etcd::parse`), and
//! the etcd wire's parsers the library uses (Txn, vouching read, authentication,
//! leases).
//!
//! An input that starts with `0x0a` (field 1, the `ResponseHeader` every etcd answer
//! opens with) is one answer body, status OK, given to every parser (the seeds are
//! etcd's answers to Fencekeeper's calls, as etcd writes them); any other input is
//! read as one of the cases below.
//!
//! * Any status, message and body: no panic; anything but gRPC status 0 is an error;
//!   and every error is one printable line, no longer than a bound plus the quoted
//!   resource key, since it becomes the cause in a refusal's reason (a response
//!   body, a log line, a `grpc-message`).
//! * Answers shaped like etcd's (`succeeded`, `responses[].response_range.kvs[]`),
//!   written as etcd writes them: the outcome is the one the shape says: a committed
//!   transaction, the mark the first range read holds (an error for any value that
//!   holds none), or no mark.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fencekeeper_etcd_wire::grpc::{self, Status};
use fencekeeper_etcd_wire::{self as wire, KeyValue};
use fencekeeper_filter::etcd::{Outcome, Response};
use fencekeeper_fuzz::etcd::{mark, parse, stored};
use fencekeeper_fuzz::header::is_printable_line;
use fencekeeper_fuzz::input::TokenText;
use libfuzzer_sys::fuzz_target;

/// The longest error text, besides the resource key it may quote: the cause of a
/// reason, which may become a header.
const MAX_ERROR_BYTES: usize = 512;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any body under any gRPC status (0: OK) and message.
    Raw { code: u32, message: String, body: Vec<u8>, resource: String },
    /// An answer shaped like etcd's answer to a transaction, status OK.
    Shaped(Answer),
}

#[derive(Arbitrary, Debug)]
struct Answer {
    resource: String,
    succeeded: bool,
    responses: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Range(Vec<Kv>),
    Put,
}

#[derive(Arbitrary, Debug)]
enum Kv {
    /// What a writer stores for this token.
    Token(TokenText),
    /// What another writer stored for this token under another resource.
    Moved(TokenText, String),
    Bytes(Vec<u8>),
    NoValue,
}

impl Kv {
    fn value(&self, resource: &str) -> Vec<u8> {
        match self {
            Kv::Token(t) => stored(resource, &t.token.token()),
            Kv::Moved(t, other) => stored(other, &t.token.token()),
            Kv::Bytes(b) => b.clone(),
            Kv::NoValue => Vec::new(),
        }
    }
}

impl Answer {
    fn encoded(&self) -> Vec<u8> {
        let reads: Vec<Option<Vec<KeyValue>>> = self
            .responses
            .iter()
            .map(|op| match op {
                Op::Range(kvs) => Some(
                    kvs.iter()
                        .map(|kv| KeyValue {
                            key: b"x".to_vec(),
                            value: kv.value(&self.resource),
                            create_revision: 3,
                            mod_revision: 3,
                        })
                        .collect(),
                ),
                Op::Put => None,
            })
            .collect();
        let operations: Vec<Option<&[KeyValue]>> = reads.iter().map(|r| r.as_deref()).collect();
        grpc::txn_answer(self.succeeded, 7, &operations)
    }

    /// `None`: an error is expected.
    fn outcome(&self) -> Option<Outcome> {
        if self.succeeded {
            return Some(Outcome::Succeeded);
        }
        // The mark Txn's failure branch is one read: the answer's first operation
        // must be that read; anything else is an error, never "no mark".
        let Op::Range(kvs) = self.responses.first()? else { return None };
        let Some(kv) = kvs.first() else {
            return Some(Outcome::Current(None));
        };
        mark(&self.resource, &kv.value(&self.resource)).map(|m| Outcome::Current(Some(m)))
    }
}

/// A token fit for a header (visible ASCII, bounded); an error one printable
/// bounded line.
fn token_or_error(result: Result<String, wire::AuthRefusal>) {
    match result {
        Ok(token) => {
            assert!(!token.is_empty() && token.len() <= wire::MAX_TOKEN_BYTES, "{token:?}");
            assert!(token.bytes().all(|b| b.is_ascii_graphic()), "{token:?}");
        }
        Err(wire::AuthRefusal::WrongCredentials(e) | wire::AuthRefusal::Other(e)) => {
            assert!(is_printable_line(&e.0) && e.0.len() <= MAX_ERROR_BYTES, "{:?}", e.0);
        }
    }
}

/// An error one printable line, no longer than the bound.
fn bounded_error<T>(result: Result<T, wire::WireError>) {
    if let Err(e) = result {
        assert!(is_printable_line(&e.0) && e.0.len() <= MAX_ERROR_BYTES, "{:?}", e.0);
    }
}

/// One answer body, status OK, through every parser of the library and the filter.
fn answer_body(body: &[u8]) {
    const RESOURCE: &str = "orders/2026.csv";
    let txn = grpc::parse_txn(body);
    if let Ok(answer) = &txn {
        for i in 0..answer.operations() + 1 {
            bounded_error(answer.read(i));
        }
    }
    // As the answer to a first mark's Txn: the mark and the retention floor read back.
    if let Ok(answer) = &txn {
        let _ = fencekeeper_etcd_wire::retention::created(answer, RESOURCE, "/fencekeeper/marks/");
    }
    bounded_error(txn);
    bounded_error(grpc::parse_vouch_txn(body));
    token_or_error(grpc::parse_authentication(Ok(body)));
    bounded_error(grpc::parse_lease_grant(body).map(|id| assert!(id > 0, "{id}")));
    bounded_error(grpc::parse_keepalive(body));
    bounded_error(grpc::parse_range(body));
    if let Err(e) = fencekeeper_filter::etcd::created(&Ok(body.to_vec()), "/fencekeeper/marks/", RESOURCE) {
        assert!(is_printable_line(&e.0), "{:?}", e.0);
    }
    if let Err(e) = parse(&Ok(body.to_vec()), RESOURCE) {
        let bound = MAX_ERROR_BYTES + format!("{RESOURCE:?}").len();
        assert!(is_printable_line(&e.0) && e.0.len() <= bound, "{:?}", e.0);
    }
}

fuzz_target!(|data: &[u8]| {
    if data.first() == Some(&0x0a) {
        answer_body(data);
        return;
    }
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let (result, resource) = match &input {
        Input::Raw { code, message, body, resource } => {
            let response: Response = match code {
                0 => Ok(body.clone()),
                _ => Err(Status { code: *code, message: message.clone() }),
            };
            let result = parse(&response, resource);
            // The same answer to a confirm of two resources: each decided alone, every
            // error one bounded line.
            let pair = [resource.clone(), "orders/2026.csv".to_owned()];
            match fencekeeper_filter::etcd::confirmed(&response, "/fencekeeper/marks/", &pair) {
                Ok((outcomes, floor, _)) => {
                    for e in outcomes.into_iter().filter_map(Result::err) {
                        let bound = MAX_ERROR_BYTES + format!("{resource:?}").len();
                        assert!(is_printable_line(&e.0) && e.0.len() <= bound, "{:?}", e.0);
                    }
                    if let Err(e) = floor {
                        assert!(is_printable_line(&e.0), "{:?}", e.0);
                    }
                }
                Err(e) => assert!(is_printable_line(&e.0), "{:?}", e.0),
            }
            if *code != 0 {
                assert!(result.is_err(), "status {code} gave {result:?}");
                let _ = grpc::token_refused(&Status { code: *code, message: message.clone() });
            }
            token_or_error(grpc::parse_authentication(response.as_deref()));
            // The same bytes as an answer to any other of the library's calls.
            answer_body(body);
            (result, resource)
        }
        Input::Shaped(answer) => {
            let result = parse(&Ok(answer.encoded()), &answer.resource);
            assert_eq!(result.as_ref().ok(), answer.outcome().as_ref(), "{answer:?}");
            (result, &answer.resource)
        }
    };
    if let Err(e) = result {
        let bound = MAX_ERROR_BYTES + format!("{resource:?}").len();
        assert!(is_printable_line(&e.0) && e.0.len() <= bound, "{:?}", e.0);
    }
});
