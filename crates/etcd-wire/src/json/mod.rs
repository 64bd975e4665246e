//! etcd's JSON API: the gateway etcd serves beside gRPC on its client port (`POST
//! /v3/kv/txn`, `/v3/auth/authenticate`, `/v3/lease/grant`; etcd 3.4 and later), for
//! a host that makes HTTP calls but no gRPC ones (nginx with ngx_wasm_module, Kong).
//!
//! A call's message is written once, as protobuf, by [`crate::grpc`]; [`request`]
//! transcodes it to the JSON the gateway takes, and [`answer`] transcodes the
//! gateway's JSON answer back to protobuf. So the same builders write, and the same
//! parsers judge, every call whichever way it travels: nothing about marks, floors or
//! provenance is written twice. The transcoding knows etcd's messages field by field
//! ([`schema`]); it never guesses a type, and an answer is read as hostile bytes
//! (bounded in size and depth, every base64 and number checked).
//!
//! The cost: etcd decodes the JSON and calls its own gRPC server, about twice the CPU
//! of the same call over gRPC (BENCHMARKS.md). A host that makes gRPC calls uses
//! those.

mod schema;
mod text;

use crate::grpc::protobuf::{fields, Message, Value};
use crate::grpc::{Status, MAX_ANSWER_BYTES as MAX_MESSAGE_BYTES};
use crate::{excerpt, WireError};
use schema::{Field, Kind};
use text::Json;

/// The header that carries an authentication's token to the gateway (etcd reads it
/// as the gRPC metadata `token`).
pub const TOKEN_HEADER: &str = "authorization";

/// The content type of a call's body.
pub const CONTENT_TYPE: &str = "application/json";

/// The longest JSON answer read: base64 and field names make an answer up to about
/// twice its protobuf, which is bounded by [`crate::grpc::MAX_ANSWER_BYTES`].
pub const MAX_ANSWER_BYTES: usize = 4 * MAX_MESSAGE_BYTES;

/// One of the calls Fencekeeper makes to etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `KV/Txn`.
    Txn,
    /// `Auth/Authenticate`.
    Authenticate,
    /// `Lease/LeaseGrant`.
    LeaseGrant,
}

impl Call {
    /// The gateway's path of this call.
    pub fn path(self) -> &'static str {
        match self {
            Call::Txn => "/v3/kv/txn",
            Call::Authenticate => "/v3/auth/authenticate",
            Call::LeaseGrant => "/v3/lease/grant",
        }
    }

    fn schemas(self) -> (&'static [Field], &'static [Field]) {
        match self {
            Call::Txn => (schema::TXN_REQUEST, schema::TXN_RESPONSE),
            Call::Authenticate => (schema::AUTHENTICATE_REQUEST, schema::AUTHENTICATE_RESPONSE),
            Call::LeaseGrant => (schema::LEASE_GRANT_REQUEST, schema::LEASE_GRANT_RESPONSE),
        }
    }
}

/// The JSON body of `call` whose protobuf message is `message` (as [`crate::grpc`]
/// writes it). An error only when the message is not one of this call's: a bug of
/// the caller, reported, never sent.
pub fn request(call: Call, message: &[u8]) -> Result<Vec<u8>, WireError> {
    let mut out = String::with_capacity(message.len() * 2 + 16);
    write_message(message, call.schemas().0, &mut out)?;
    Ok(out.into_bytes())
}

fn write_message(bytes: &[u8], schema: &[Field], out: &mut String) -> Result<(), WireError> {
    let mut present = Vec::new();
    for f in fields(bytes, "request") {
        let (number, value) = f?;
        let field = schema
            .iter()
            .find(|s| u64::from(s.number) == number)
            .ok_or_else(|| WireError(format!("a request to etcd has field {number}, which its JSON does not know")))?;
        present.push((field, value));
    }
    out.push('{');
    let mut first = true;
    for field in schema {
        let mut values = present.iter().filter(|(f, _)| f.number == field.number).map(|(_, v)| v).peekable();
        if values.peek().is_none() {
            continue;
        }
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        text::quote(field.name, out);
        out.push(':');
        if field.repeated {
            out.push('[');
            for (i, v) in values.enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(field, v, out)?;
            }
            out.push(']');
        } else if let Some(v) = values.last() {
            write_value(field, v, out)?;
        }
    }
    out.push('}');
    Ok(())
}

fn write_value(field: &Field, value: &Value<'_>, out: &mut String) -> Result<(), WireError> {
    match (field.kind, value) {
        (Kind::Bytes, Value::Bytes(b)) => {
            out.push('"');
            text::base64(b, out);
            out.push('"');
        }
        (Kind::Text, Value::Bytes(b)) => {
            let t = std::str::from_utf8(b)
                .map_err(|_| WireError(format!("a request to etcd has a {} that is not UTF-8", field.name)))?;
            text::quote(t, out);
        }
        // proto3's JSON writes 64-bit numbers as strings.
        (Kind::Int, Value::Varint(v)) => out.push_str(&format!("\"{}\"", *v as i64)),
        (Kind::Bool, Value::Varint(v)) => out.push_str(if *v != 0 { "true" } else { "false" }),
        (Kind::Enum(names), Value::Varint(v)) => match names.get(*v as usize) {
            Some(name) => text::quote(name, out),
            None => out.push_str(&v.to_string()),
        },
        (Kind::Message(schema), Value::Bytes(b)) => write_message(b, schema, out)?,
        _ => return Err(WireError(format!("a request to etcd has its {} of the wrong type", field.name))),
    }
    Ok(())
}

/// The protobuf message of the gateway's answer to `call`: `status` is the answer's
/// HTTP status (0: no answer came, the call failed), `body` its body. An error is a
/// gRPC status, as a gRPC call would have failed: etcd's own (the gateway puts its
/// code and message in the body), or one that stands for what came instead (a
/// proxy's error page, a cut or foreign answer), so that every caller judges both
/// transports' failures by one rule (`grpc::token_refused`, `parse_authentication`).
pub fn answer(call: Call, status: u16, body: &[u8]) -> Result<Vec<u8>, Status> {
    if status == 0 {
        return Err(Status { code: UNAVAILABLE, message: "no answer: the call to etcd failed or timed out".into() });
    }
    if body.len() > MAX_ANSWER_BYTES {
        return Err(Status {
            code: INTERNAL,
            message: format!(
                "etcd's JSON answer is more than the {MAX_ANSWER_BYTES} bytes one of Fencekeeper's calls gets"
            ),
        });
    }
    let parsed = text::parse(body);
    if status != 200 {
        return Err(refusal(status, parsed.ok().as_ref(), body));
    }
    let json = parsed.map_err(|e| Status { code: INTERNAL, message: e.0 })?;
    if !has_revision(&json) {
        // etcd heads every answer with the cluster's revision; a 200 without one is
        // not etcd's (a store or a proxy on the wrong port), whatever else it says.
        return Err(Status {
            code: INTERNAL,
            message: format!(
                "the answer to {} has no etcd header with a revision: is the etcd cluster etcd's client port?",
                call.path()
            ),
        });
    }
    let mut m = Message::default();
    read_message(&json, call.schemas().1, &mut m).map_err(|e| Status { code: INTERNAL, message: e.0 })?;
    Ok(m.0)
}

/// Whether `json` is an object with `header.revision` above 0.
fn has_revision(json: &Json) -> bool {
    let member = |json: &Json, name: &str| match json {
        Json::Object(members) => members.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()),
        _ => None,
    };
    let revision = member(json, "header").and_then(|h| member(&h, "revision"));
    matches!(revision, Some(Json::Text(r) | Json::Number(r)) if r.parse::<u64>().is_ok_and(|r| r > 0))
}

const UNKNOWN: u32 = 2;
const INTERNAL: u32 = 13;
const UNAVAILABLE: u32 = 14;

/// The status of an answer other than 200: etcd's code and message from the
/// gateway's error body (`{"error": .., "code": .., "message": ..}`), else one that
/// stands for the HTTP status, with what came as its message.
fn refusal(status: u16, json: Option<&Json>, body: &[u8]) -> Status {
    if let Some(Json::Object(members)) = json {
        let member = |name: &str| members.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let code = match member("code") {
            Some(Json::Number(n)) => n.parse::<u32>().ok(),
            _ => None,
        };
        let message = match (member("message"), member("error")) {
            (Some(Json::Text(m)), _) | (_, Some(Json::Text(m))) => Some(m.clone()),
            _ => None,
        };
        if let (Some(code), Some(message)) = (code, message) {
            return Status { code, message };
        }
    }
    let code = match status {
        400 => 3,
        401 => 16,
        403 => PERMISSION_DENIED,
        // No gateway at that path: not etcd's client port, or etcd before 3.4.
        404 => 12,
        408 | 504 => 4,
        429 => 8,
        502 | 503 => UNAVAILABLE,
        _ => UNKNOWN,
    };
    let text = String::from_utf8_lossy(body);
    Status { code, message: format!("HTTP {status} {}", excerpt(text.trim())) }
}

const PERMISSION_DENIED: u32 = crate::grpc::PERMISSION_DENIED;

/// Whether a JSON member's name is this field's: the `.proto` name etcd's gateway
/// writes, or proto3's lowerCamelCase one, which other gateways write.
fn named(json: &str, field: &str) -> bool {
    if json == field {
        return true;
    }
    let mut expected = String::with_capacity(field.len());
    let mut upper = false;
    for c in field.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            expected.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            expected.push(c);
        }
    }
    json == expected
}

fn read_message(json: &Json, schema: &[Field], m: &mut Message) -> Result<(), WireError> {
    let Json::Object(members) = json else {
        return Err(WireError("etcd's JSON answer has a message that is not an object".into()));
    };
    for (name, value) in members {
        let Some(field) = schema.iter().find(|f| named(name, f.name)) else { continue };
        match (value, field.repeated) {
            (Json::Null, _) => {}
            (Json::Array(items), true) => {
                for item in items {
                    read_value(field, item, m)?;
                }
            }
            (_, true) => return Err(wrong(field)),
            (value, false) => read_value(field, value, m)?,
        }
    }
    Ok(())
}

fn wrong(field: &Field) -> WireError {
    WireError(format!("etcd's JSON answer has its {} of the wrong type", field.name))
}

fn read_value(field: &Field, value: &Json, m: &mut Message) -> Result<(), WireError> {
    match (field.kind, value) {
        (Kind::Bytes, Json::Text(t)) => m.set_bytes(field.number, &text::unbase64(t)?),
        (Kind::Text, Json::Text(t)) => m.set_bytes(field.number, t.as_bytes()),
        (Kind::Int, Json::Text(t) | Json::Number(t)) => {
            // uint64 (a header's ids) or int64, as protobuf's varint holds either.
            let v = t.parse::<u64>().ok().or_else(|| t.parse::<i64>().ok().map(|v| v as u64)).ok_or_else(|| {
                WireError(format!(
                    "etcd's JSON answer has a {} that is not a 64-bit integer ({})",
                    field.name,
                    excerpt(t)
                ))
            })?;
            m.set_uint(field.number, v);
        }
        (Kind::Bool, Json::Bool(b)) => m.set_uint(field.number, u64::from(*b)),
        (Kind::Enum(names), Json::Text(t)) => {
            let v = names.iter().position(|n| n == t).ok_or_else(|| wrong(field))?;
            m.set_uint(field.number, v as u64);
        }
        (Kind::Message(schema), Json::Object(_)) => {
            let mut inner = Message::default();
            read_message(value, schema, &mut inner)?;
            m.message(field.number, inner);
        }
        _ => return Err(wrong(field)),
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::grpc;
    use crate::{Expect, KeyValue, Op, Range};
    use fencekeeper_core::token;

    fn text(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_mark_txn_becomes_the_json_etcd_takes() {
        let message = grpc::mark_txn("/m/r", "r", Some(&token!("33")), &token!("34"));
        let json = text(request(Call::Txn, &message).unwrap());
        let old = fencekeeper_core::record::encode(b"r", &token!("33"));
        let new = fencekeeper_core::record::encode(b"r", &token!("34"));
        let b64 = |b: &[u8]| {
            let mut s = String::new();
            text::base64(b, &mut s);
            s
        };
        let expected = format!(
            r#"{{"compare":[{{"target":"VALUE","key":"{k}","value":"{old}"}}],"success":[{{"request_put":{{"key":"{k}","value":"{new}"}}}}],"failure":[{{"request_range":{{"key":"{k}"}}}}]}}"#,
            k = b64(b"/m/r"),
            old = b64(old.as_bytes()),
            new = b64(new.as_bytes()),
        );
        assert_eq!(json, expected);
        // A first mark compares the key's absence: a oneof member at 0 is written.
        let first = text(request(Call::Txn, &grpc::txn(&[(b"k", Expect::Absent)], &[], &[])).unwrap());
        assert_eq!(first, r#"{"compare":[{"target":"CREATE","key":"aw==","create_revision":"0"}]}"#);
    }

    #[test]
    fn reads_leases_and_credentials_keep_every_field() {
        let queue = Range::lock_queue_head(b"/locks/r/", Some(40));
        let put = Op::Put { key: b"f", value: b"v", lease: Some(7_587_862_183_519_485_220) };
        let json =
            text(request(Call::Txn, &grpc::txn(&[], &[put, Op::Delete { key: b"d" }], &[Op::Range(queue)])).unwrap());
        assert!(
            json.contains(r#""request_put":{"key":"Zg==","value":"dg==","lease":"7587862183519485220"}"#),
            "{json}"
        );
        assert!(json.contains(r#""request_delete_range":{"key":"ZA=="}"#), "{json}");
        assert!(
            json.contains(r#""limit":"1","sort_order":"DESCEND","sort_target":"CREATE","max_create_revision":"40""#),
            "{json}"
        );
        let grant = text(request(Call::LeaseGrant, &grpc::lease_grant(12)).unwrap());
        assert_eq!(grant, r#"{"TTL":"12"}"#);
        let login = text(request(Call::Authenticate, &grpc::authenticate("fence", "p\"w")).unwrap());
        assert_eq!(login, r#"{"name":"fence","password":"p\"w"}"#);
        // Another call's message is not sent as this one's.
        assert!(request(Call::LeaseGrant, &grpc::authenticate("a", "b")).is_err());
    }

    fn kv(key: &str, value: &[u8], rev: u64) -> KeyValue {
        KeyValue { key: key.as_bytes().to_vec(), value: value.to_vec(), create_revision: rev, mod_revision: rev }
    }

    #[test]
    fn the_gateways_txn_answer_parses_as_the_grpc_one() {
        // As etcd 3.4's gateway writes them (captured from one).
        let lost = br#"{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"9","raft_term":"2"},"responses":[{"response_range":{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"9","raft_term":"2"},"kvs":[{"key":"L20vcg==","create_revision":"3","mod_revision":"8","version":"2","value":"eA=="}],"count":"1"}}]}"#;
        let parsed = grpc::parse_txn(&answer(Call::Txn, 200, lost).unwrap()).unwrap();
        assert!(!parsed.succeeded);
        assert_eq!(parsed.revision, 9);
        assert_eq!(parsed.read(0).unwrap(), vec![KeyValue { mod_revision: 8, ..kv("/m/r", b"x", 3) }]);
        let won = br#"{"header":{"revision":"10"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"10"}}},{"response_range":{"header":{}}}]}"#;
        let parsed = grpc::parse_txn(&answer(Call::Txn, 200, won).unwrap()).unwrap();
        assert!(parsed.succeeded);
        assert_eq!(parsed.operations(), 2);
        assert!(parsed.read(0).is_err(), "a put is not a read");
        assert_eq!(parsed.read(1).unwrap(), vec![], "an empty read is a read of nothing");
        // The same answer as gRPC gives is parsed the same.
        let same = grpc::txn_answer(false, 9, &[Some(&[kv("/m/r", b"x", 3)])]);
        let json = br#"{"header":{"revision":"9"},"responses":[{"responseRange":{"kvs":[{"key":"L20vcg==","createRevision":"3","modRevision":3,"value":"eA=="}]}}]}"#;
        assert_eq!(grpc::parse_txn(&answer(Call::Txn, 200, json).unwrap()), grpc::parse_txn(&same));
    }

    #[test]
    fn leases_and_authentication_answers_parse() {
        let grant = br#"{"header":{"revision":"3"},"ID":"7587862183519485220","TTL":"12"}"#;
        assert_eq!(
            grpc::parse_lease_grant(&answer(Call::LeaseGrant, 200, grant).unwrap()),
            Ok(7_587_862_183_519_485_220)
        );
        let token = br#"{"header":{"revision":"4"},"token":"abc.42"}"#;
        let parsed = grpc::parse_authentication(answer(Call::Authenticate, 200, token).as_deref());
        assert_eq!(parsed.unwrap(), "abc.42");
    }

    #[test]
    fn etcds_refusals_keep_their_code_and_anything_else_is_a_status_too() {
        let invalid = br#"{"error":"etcdserver: authentication failed, invalid user ID or password","code":3,"message":"etcdserver: authentication failed, invalid user ID or password"}"#;
        let refused = answer(Call::Authenticate, 400, invalid).unwrap_err();
        assert_eq!(refused.code, 3);
        assert!(matches!(grpc::parse_authentication(Err(&refused)), Err(crate::AuthRefusal::WrongCredentials(_))));
        let expired = br#"{"code":16,"message":"etcdserver: invalid auth token"}"#;
        assert!(grpc::token_refused(&answer(Call::Txn, 401, expired).unwrap_err()));
        let page = answer(Call::Txn, 502, b"<html>\r\nBad Gateway</html>").unwrap_err();
        assert_eq!((page.code, page.message.as_str()), (14, r#"HTTP 502 "<html>\r\nBad Gateway</html>""#));
        assert_eq!(answer(Call::Txn, 404, b"404 page not found\n").unwrap_err().code, 12);
        assert_eq!(answer(Call::Txn, 0, b"").unwrap_err().code, 14);
        // A 200 that is not etcd's answer is an error, never a Txn that "succeeded".
        for bad in [
            &b"<html>"[..],
            b"[]",
            br#"{"succeeded":"yes"}"#,
            br#"{"responses":{}}"#,
            br#"{"header":{"revision":"x"}}"#,
        ] {
            let e = answer(Call::Txn, 200, bad).unwrap_err();
            assert_eq!(e.code, 13, "{e:?}");
        }
        let kv_bad = br#"{"header":{"revision":"3"},"responses":[{"response_range":{"kvs":[{"key":"!!"}]}}]}"#;
        assert!(answer(Call::Txn, 200, kv_bad).unwrap_err().message.contains("not base64"));
        let huge = vec![b' '; MAX_ANSWER_BYTES + 1];
        assert!(answer(Call::Txn, 200, &huge).unwrap_err().message.contains("more than"));
    }
}
