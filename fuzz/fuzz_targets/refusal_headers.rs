//! Target 7: refusal rendering: the values a host puts in headers stay legal.
//!
//! The input is a resource key (the first line), then the rest of the case: the
//! mode, the outcome, the cause.
//!
//! From any verdict (or none), resource key and cause, under either mode, what
//! the core gives a host is checked as the host uses it:
//! * `resolve` forwards only an admit, or efficiency mode's unreachable store, and
//!   carries a token exactly for admitted, stale and replayed outcomes;
//! * `fencing-highest` / `fencing-admitted-token` (a `Token`'s `Display`) is a legal
//!   header value of digits and dots that parses back to the token;
//! * the `Reason` is one printable line, whatever the resource key (it is quoted
//!   and escaped) and whatever etcd answered (the filter's etcd errors are causes);
//! * its `grpc-message` (percent-encoded as the gRPC spec says; the gateway's own
//!   encoder is not reachable from here) is a legal header value that decodes back
//!   to the reason.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fencekeeper_core::decision::{Mode, Verdict};
use fencekeeper_core::refusal::{resolve, Class, NoVerdict, Reason};
use fencekeeper_core::resource::{self, ResourceError};
use fencekeeper_core::{Malformed, Token};
use fencekeeper_etcd_wire::grpc::Status;
use fencekeeper_fuzz::etcd;
use fencekeeper_fuzz::header::{grpc_message, grpc_message_decode, is_field_value, is_printable_line, is_token_value};
use fencekeeper_fuzz::input::SmallToken;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Rest {
    efficiency: bool,
    outcome: Outcome,
    cause: Cause,
}

#[derive(Arbitrary, Debug)]
enum Outcome {
    Admit(SmallToken, bool),
    Stale(SmallToken, SmallToken),
    Replayed(SmallToken),
    Malformed(Bad),
    Missing,
    StoreUnreachable,
    Refused,
}

#[derive(Arbitrary, Debug)]
enum Bad {
    /// Whatever `Token::parse` says of this text.
    Token(String),
    /// Whatever `resource::check` says of this key.
    Key(String),
    Arity(usize, usize),
    Position(u8, usize),
}

#[derive(Arbitrary, Debug)]
enum Cause {
    /// A host's own text: one printable line (other inputs are skipped).
    Text(String),
    /// What the filter's etcd parser says of an answer.
    Etcd(Option<u16>, Vec<u8>),
}

impl Bad {
    fn malformed(&self) -> Malformed {
        match self {
            Bad::Token(t) => Token::parse(t).err().unwrap_or(Malformed::TooManyComponents),
            Bad::Key(k) => Malformed::Resource(resource::check(k).err().unwrap_or(ResourceError::NotUtf8)),
            Bad::Arity(mark, presented) => Malformed::ArityMismatch { mark: *mark, presented: *presented },
            Bad::Position(kind, p) => match kind % 4 {
                0 => Malformed::TooLong(*p),
                1 => Malformed::EmptyComponent(*p),
                2 => Malformed::NotDecimal(*p),
                _ => Malformed::Overflow(*p),
            },
        }
    }
}

fn header_token(token: Token) {
    let value = token.to_string();
    assert!(is_token_value(&value), "{value:?}");
    assert_eq!(Token::parse(&value), Ok(token));
}

fuzz_target!(|data: &[u8]| {
    let (resource, rest) = data.split_at(data.iter().position(|&b| b == b'\n').unwrap_or(data.len()));
    let Ok(resource) = std::str::from_utf8(resource) else { return };
    let Ok(input) = Rest::arbitrary_take_rest(Unstructured::new(rest.get(1..).unwrap_or_default())) else { return };
    let mode = if input.efficiency { Mode::Efficiency } else { Mode::Correctness };
    let verdict = match &input.outcome {
        Outcome::Admit(t, advanced) => Ok(Verdict::Admit { mark: t.token(), advanced: *advanced }),
        Outcome::Stale(m, p) => Ok(Verdict::Stale { mark: m.token(), presented: p.token() }),
        Outcome::Replayed(m) => Ok(Verdict::Replayed { mark: m.token() }),
        Outcome::Malformed(bad) => Ok(Verdict::Malformed(bad.malformed())),
        Outcome::Missing => Ok(Verdict::Missing),
        Outcome::StoreUnreachable => Err(NoVerdict::StoreUnreachable),
        Outcome::Refused => Err(NoVerdict::Refused),
    };
    let cause = match &input.cause {
        Cause::Text(text) if is_printable_line(text) => text.clone(),
        Cause::Text(_) => return,
        Cause::Etcd(status, body) => {
            // An answer (status 0) or a gRPC status whose message is `body`.
            let response = match status {
                None | Some(0) => Ok(body.clone()),
                Some(code) => {
                    Err(Status { code: u32::from(*code), message: String::from_utf8_lossy(body).into_owned() })
                }
            };
            etcd::parse(&response, resource).err().map(|e| e.0).unwrap_or_default()
        }
    };

    let action = resolve(mode, verdict.as_ref().map_err(|e| *e));
    let admit = matches!(verdict, Ok(Verdict::Admit { .. }));
    let open = mode == Mode::Efficiency && verdict == Err(NoVerdict::StoreUnreachable);
    assert_eq!(action.forward, admit || open);
    assert_eq!(action.failed_open(), open);
    assert_eq!(action.token.is_some(), matches!(action.class, Class::Admitted | Class::Stale | Class::Replayed));
    assert!((200..=599).contains(&action.class.http_status()) && action.class.grpc_status() <= 16);
    if let Some(token) = action.token {
        header_token(token);
    }

    let reason = Reason { verdict: verdict.as_ref().ok(), resource, cause: &cause }.to_string();
    assert!(is_printable_line(&reason), "{reason:?}");
    if !matches!(verdict, Ok(Verdict::Malformed(_))) {
        assert!(reason.contains(&format!("{resource:?}")), "{reason:?}");
    }
    let message = grpc_message(&reason);
    assert!(is_field_value(message.as_bytes()), "{message:?}");
    assert_eq!(grpc_message_decode(&message).as_deref(), Some(reason.as_bytes()));
});
