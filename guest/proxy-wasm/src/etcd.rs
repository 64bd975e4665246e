//! Marks in etcd, through etcd's v3 JSON gateway (`POST /v3/kv/txn`).
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

use fencekeeper_core::Token;
use fencekeeper_etcd_wire::provenance as rules;
use fencekeeper_etcd_wire::{self as wire, KeyValue, MarkError};

pub use wire::TXN_PATH;

/// The headers of a call to etcd's Txn endpoint through the proxy (`authority`: the
/// configured `:authority`).
pub fn txn_headers(authority: &str) -> Vec<(&str, &str)> {
    vec![(":method", "POST"), (":path", TXN_PATH), (":authority", authority), ("content-type", "application/json")]
}

/// The body of one compare-and-advance (or compare-and-confirm) transaction on
/// `resource`'s mark at `key`.
pub fn txn(key: &str, resource: &str, expected: Option<&Token>, token: &Token) -> Vec<u8> {
    wire::mark_txn(key, resource, expected, token).into_bytes()
}

/// What a transaction answered.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// The compare held: the put (if any) is committed.
    Succeeded,
    /// The compare failed; this is the current mark (`None`: no key).
    Current(Option<Token>),
}

/// Why an etcd answer could not be used.
#[derive(Debug, PartialEq)]
pub struct EtcdError(pub String);

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parse the gateway's answer to [`txn`] on `resource`'s mark.
pub fn parse(status: Option<&str>, body: &[u8], resource: &str) -> Result<Outcome, EtcdError> {
    answer(status, body, resource).map(|(outcome, _)| outcome)
}

/// [`parse`], with the cluster's revision the answer carried.
pub fn answer(status: Option<&str>, body: &[u8], resource: &str) -> Result<(Outcome, u64), EtcdError> {
    ok_status(status, body)?;
    let answer = wire::parse_txn(body).map_err(|e| EtcdError(e.0))?;
    if answer.succeeded {
        return Ok((Outcome::Succeeded, answer.revision));
    }
    // The failure branch's one read: an answer without it is an error, never "no mark".
    let read = answer.read(0).map_err(|e| EtcdError(e.0))?;
    let mark = read.first().map(|kv| verified(resource, &kv.value)).transpose()?;
    Ok((Outcome::Current(mark), answer.revision))
}

fn ok_status(status: Option<&str>, body: &[u8]) -> Result<(), EtcdError> {
    match status.map(str::parse::<u16>) {
        Some(Ok(200)) => Ok(()),
        Some(Ok(code)) => Err(EtcdError(wire::status_error(code, body).0)),
        _ => Err(EtcdError(format!("etcd answered status {}", wire::excerpt(status.unwrap_or("none"))))),
    }
}

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

/// The body of the vouching read before an advance: `resource`'s mark at `key`, and
/// with `lock` (the strong check) the holder of that lock, in one read-only Txn.
pub fn vouch(key: &str, lock: Option<&str>) -> Vec<u8> {
    rules::vouch_txn(key, lock).into_bytes()
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
pub fn parse_vouch(status: Option<&str>, body: &[u8], resource: &str) -> Result<Found, EtcdError> {
    ok_status(status, body)?;
    let answer = rules::parse_vouch_txn(body).map_err(|e| EtcdError(e.0))?;
    let mark = answer.mark.map(|kv| verified(resource, &kv.value)).transpose()?;
    Ok(Found { mark, holder: answer.holder, revision: answer.revision })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD as B64;
    use base64::Engine as _;
    use fencekeeper_core::record;
    use serde_json::json;

    fn t(s: &str) -> Token {
        Token::parse(s).unwrap()
    }

    fn value(resource: &str, token: &str) -> String {
        B64.encode(record::encode(resource.as_bytes(), &t(token)).as_bytes())
    }

    fn answer(value: &str) -> String {
        format!(r#"{{"responses":[{{"response_range":{{"kvs":[{{"key":"eA==","value":"{value}"}}],"count":"1"}}}}]}}"#)
    }

    #[test]
    fn txn_compares_and_puts_the_records_of_the_canonical_tokens() {
        let body: serde_json::Value =
            serde_json::from_slice(&txn("/fencekeeper/marks/a", "a", Some(&t("033")), &t("34"))).unwrap();
        assert_eq!(body["compare"][0]["value"], value("a", "33"));
        assert_eq!(body["success"][0]["request_put"]["value"], value("a", "34"));
        assert!(B64.decode(value("a", "34")).unwrap().starts_with(b"fk2 34 "));
        assert_eq!(body["compare"][0]["key"], B64.encode("/fencekeeper/marks/a"));
        let first: serde_json::Value = serde_json::from_slice(&txn("k", "k", None, &t("1"))).unwrap();
        assert_eq!(first["compare"][0]["target"], "CREATE");
        let confirm: serde_json::Value = serde_json::from_slice(&txn("k", "k", Some(&t("5")), &t("5"))).unwrap();
        assert_eq!(confirm["success"], json!([]));
    }

    #[test]
    fn a_damaged_moved_or_bare_value_is_an_error_not_a_lower_mark() {
        let good = record::encode(b"r", &t("50"));
        let mut damaged = good.as_bytes().to_vec();
        damaged[4] = b'4'; // "fk2 40 ..."
        let err = parse(Some("200"), answer(&B64.encode(&damaged)).as_bytes(), "r").unwrap_err();
        assert!(err.0.contains("damaged mark for \"r\""), "{err}");
        assert!(parse(Some("200"), answer(&value("q", "50")).as_bytes(), "r").is_err(), "another resource's record");
        let bare = parse(Some("200"), answer(&B64.encode("34")).as_bytes(), "r").unwrap_err();
        assert!(bare.0.contains("old format") && bare.0.contains("--upgrade"), "{bare}");
    }

    #[test]
    fn the_vouching_read_gives_the_verified_mark_the_holder_and_the_revision() {
        let body = vouch("/fencekeeper/marks/r", Some("/locks/r"));
        let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(sent["success"].as_array().map(Vec::len), Some(2));
        let holder = B64.encode("/locks/r/694d");
        let answer = format!(
            r#"{{"header":{{"revision":"57"}},"succeeded":true,"responses":[{{"response_range":{{"kvs":[{{"key":"eA==","value":"{}"}}]}}}},{{"response_range":{{"kvs":[{{"key":"{holder}","create_revision":"40"}}]}}}}]}}"#,
            value("r", "33")
        );
        let found = parse_vouch(Some("200"), answer.as_bytes(), "r").unwrap();
        assert_eq!((found.mark, found.revision), (Some(t("33")), 57));
        assert_eq!(found.holder.map(|h| h.create_revision), Some(40));
        assert!(parse_vouch(Some("200"), answer.as_bytes(), "q").is_err(), "another resource's record");
        assert!(parse_vouch(Some("503"), b"", "r").is_err());
        let (_, revision) = answer_of(br#"{"header":{"revision":"9"},"succeeded":true}"#);
        assert_eq!(revision, 9);
    }

    fn answer_of(body: &[u8]) -> (Outcome, u64) {
        super::answer(Some("200"), body, "x").unwrap()
    }

    #[test]
    fn answers_parse_and_bad_ones_are_errors() {
        assert_eq!(parse(Some("200"), br#"{"header":{},"succeeded":true}"#, "x"), Ok(Outcome::Succeeded));
        assert_eq!(
            parse(Some("200"), br#"{"header":{},"responses":[{"response_range":{"header":{}}}]}"#, "x"),
            Ok(Outcome::Current(None))
        );
        let body = answer(&value("x", "7.1042"));
        assert_eq!(parse(Some("200"), body.as_bytes(), "x"), Ok(Outcome::Current(Some(t("7.1042")))));
        assert!(parse(Some("503"), b"no healthy upstream", "x").is_err());
        assert!(parse(None, b"", "x").is_err());
        assert!(parse(Some("200"), b"{", "x").is_err());
        let bad = answer(&B64.encode("x"));
        assert!(parse(Some("200"), bad.as_bytes(), "x").unwrap_err().0.contains("damaged mark"));
    }

    #[test]
    fn errors_quote_what_answered_on_one_bounded_line() {
        // Found by fuzz/fuzz_targets/etcd_answer.rs: a proxy's error page (CR LF) or
        // control bytes went into the refusal's reason as they were, and a long
        // answer made an error (a grpc-message) of any length.
        let e = parse(Some("502"), b"<html>\r\n<head>\x1b[2J</head>\r\n", "r").unwrap_err();
        assert_eq!(e.0, r#"etcd answered HTTP 502: "<html>\r\n<head>\u{1b}[2J</head>""#);
        let long = parse(Some("503"), &[0x15; 4096], "r").unwrap_err();
        let value = B64.encode("\u{202e}".repeat(1000));
        let holds = format!(r#"{{"responses":[{{"response_range":{{"kvs":[{{"value":"{value}"}}]}}}}]}}"#);
        let holds = parse(Some("200"), holds.as_bytes(), &"k".repeat(1024)).unwrap_err();
        let unparsable = format!(r#"{{"succeeded":"{}"}}"#, "x".repeat(4096));
        let unparsable = parse(Some("200"), unparsable.as_bytes(), "r").unwrap_err();
        for e in [long, holds, unparsable] {
            assert!(e.0.len() <= 500 && !e.0.chars().any(|c| c.is_control() || c == '\u{202e}'), "{e}");
        }
    }

    #[test]
    fn a_failed_txn_without_its_read_back_is_an_error_not_no_mark() {
        // Found by fuzz/fuzz_targets/etcd_answer.rs after the move to the etcd wire: a
        // failed compare whose answer lacks the read-back was taken for "no mark".
        let bare = br#"{"header":{"cluster_id":"1","revision":"7"},"responses":[],"succeeded":false}"#;
        let e = parse(Some("200"), bare, "r").unwrap_err();
        assert!(e.0.contains("lacks the read"), "{e}");
    }
}
