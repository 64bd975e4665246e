//! Marks in etcd, through etcd's v3 JSON gateway (`POST /v3/kv/txn`).
//!
//! Key scheme shared with the gateway (so an Envoy and a gateway can share one
//! etcd): key = prefix + resource (default prefix `/fencekeeper/marks/`), value =
//! the mark's canonical text (`34`, `7.1042`). One transaction per step:
//!
//! ```text
//! compare: value(key) == expected      (create_revision(key) == 0 when no mark)
//! success: put(key, token)             (nothing when token == expected: a confirm)
//! failure: range(key)                  (the current mark, to decide again)
//! ```

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use fencekeeper_core::Token;
use serde::Deserialize;
use serde_json::json;

/// The gateway path of a transaction.
pub const TXN_PATH: &str = "/v3/kv/txn";

/// The body of one compare-and-advance (or compare-and-confirm) transaction.
pub fn txn(key: &str, expected: Option<&Token>, token: &Token) -> Vec<u8> {
    let k = B64.encode(key);
    let compare = match expected {
        Some(m) => json!({"key": k, "target": "VALUE", "result": "EQUAL", "value": B64.encode(m.to_string())}),
        None => json!({"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}),
    };
    let success = if expected == Some(token) {
        json!([])
    } else {
        json!([{"request_put": {"key": k, "value": B64.encode(token.to_string())}}])
    };
    let body = json!({
        "compare": [compare],
        "success": success,
        "failure": [{"request_range": {"key": k}}],
    });
    body.to_string().into_bytes()
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

#[derive(Deserialize)]
struct TxnResponse {
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<ResponseOp>,
}

#[derive(Deserialize)]
struct ResponseOp {
    #[serde(default)]
    response_range: Option<RangeResponse>,
}

#[derive(Deserialize)]
struct RangeResponse {
    #[serde(default)]
    kvs: Vec<Kv>,
}

#[derive(Deserialize)]
struct Kv {
    #[serde(default)]
    value: String,
}

/// Parse the gateway's answer to [`txn`].
pub fn parse(status: Option<&str>, body: &[u8]) -> Result<Outcome, EtcdError> {
    if status != Some("200") {
        let text = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES)]);
        let quoted = format!("{:?}", text.trim());
        return Err(EtcdError(format!("etcd answered status {} {}", status.unwrap_or("none"), cut(&quoted))));
    }
    let r: TxnResponse = serde_json::from_slice(body)
        .map_err(|e| EtcdError(format!("etcd answer does not parse: {}", cut(&e.to_string()))))?;
    if r.succeeded {
        return Ok(Outcome::Succeeded);
    }
    let range = r
        .responses
        .into_iter()
        .find_map(|op| op.response_range)
        .ok_or_else(|| EtcdError("etcd answer has no range response".into()))?;
    let Some(kv) = range.kvs.into_iter().next() else {
        return Ok(Outcome::Current(None));
    };
    let raw = B64.decode(kv.value).map_err(|_| EtcdError("etcd mark value is not base64".into()))?;
    let text = String::from_utf8(raw).map_err(|_| EtcdError("etcd mark value is not UTF-8".into()))?;
    // A value that is not a token is a store fault, never a reason to admit.
    let mark = Token::parse(&text)
        .map_err(|_| EtcdError(format!("etcd holds {}, which is not a fencing token", cut(&format!("{text:?}")))))?;
    Ok(Outcome::Current(Some(mark)))
}

/// The most bytes of what etcd (or whatever answered in its place) said that an
/// error quotes.
const EXCERPT_BYTES: usize = 200;

/// `text` cut to [`EXCERPT_BYTES`] at a character boundary. An error is a refusal's
/// cause: it goes into a response body, a log line and a `grpc-message`, so what it
/// quotes is escaped (`{:?}`) to one printable line and bounded.
fn cut(text: &str) -> String {
    if text.len() <= EXCERPT_BYTES {
        return text.to_owned();
    }
    let end = (0..=EXCERPT_BYTES).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}…", &text[..end])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: &str) -> Token {
        Token::parse(s).unwrap()
    }

    #[test]
    fn txn_compares_on_the_canonical_text() {
        let body: serde_json::Value =
            serde_json::from_slice(&txn("/fencekeeper/marks/a", Some(&t("033")), &t("34"))).unwrap();
        assert_eq!(body["compare"][0]["value"], B64.encode("33"));
        assert_eq!(body["success"][0]["request_put"]["value"], B64.encode("34"));
        assert_eq!(body["compare"][0]["key"], B64.encode("/fencekeeper/marks/a"));
        let first: serde_json::Value = serde_json::from_slice(&txn("k", None, &t("1"))).unwrap();
        assert_eq!(first["compare"][0]["target"], "CREATE");
        let confirm: serde_json::Value = serde_json::from_slice(&txn("k", Some(&t("5")), &t("5"))).unwrap();
        assert_eq!(confirm["success"], json!([]));
    }

    #[test]
    fn answers_parse_and_bad_ones_are_errors() {
        assert_eq!(parse(Some("200"), br#"{"header":{},"succeeded":true}"#), Ok(Outcome::Succeeded));
        assert_eq!(
            parse(Some("200"), br#"{"header":{},"responses":[{"response_range":{"header":{}}}]}"#),
            Ok(Outcome::Current(None))
        );
        let v = B64.encode("7.1042");
        let body =
            format!(r#"{{"responses":[{{"response_range":{{"kvs":[{{"key":"eA==","value":"{v}"}}],"count":"1"}}}}]}}"#);
        assert_eq!(parse(Some("200"), body.as_bytes()), Ok(Outcome::Current(Some(t("7.1042")))));
        assert!(parse(Some("503"), b"no healthy upstream").is_err());
        assert!(parse(None, b"").is_err());
        assert!(parse(Some("200"), b"{").is_err());
        let bad = format!(r#"{{"responses":[{{"response_range":{{"kvs":[{{"value":"{}"}}]}}}}]}}"#, B64.encode("x"));
        assert!(parse(Some("200"), bad.as_bytes()).unwrap_err().0.contains("not a fencing token"));
    }

    #[test]
    fn errors_quote_what_answered_on_one_bounded_line() {
        // Found by fuzz/fuzz_targets/etcd_answer.rs: a proxy's error page (CR LF) or
        // control bytes went into the refusal's reason as they were, and a long
        // answer made an error (a grpc-message) of any length.
        let e = parse(Some("502"), b"<html>\r\n<head>\x1b[2J</head>\r\n").unwrap_err();
        assert_eq!(e.0, r#"etcd answered status 502 "<html>\r\n<head>\u{1b}[2J</head>""#);
        let long = parse(Some("503"), &[0x15; 4096]).unwrap_err();
        let value = B64.encode("\u{202e}".repeat(1000));
        let holds = format!(r#"{{"responses":[{{"response_range":{{"kvs":[{{"value":"{value}"}}]}}}}]}}"#);
        let holds = parse(Some("200"), holds.as_bytes()).unwrap_err();
        let unparsable = format!(r#"{{"succeeded":"{}"}}"#, "x".repeat(4096));
        let unparsable = parse(Some("200"), unparsable.as_bytes()).unwrap_err();
        for e in [long, holds, unparsable] {
            assert!(e.0.len() <= 300 && !e.0.chars().any(|c| c.is_control() || c == '\u{202e}'), "{e}");
        }
    }
}
