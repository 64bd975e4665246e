//! Marks in etcd, so that several gateways (and Envoys) in front of one resource agree.
//!
//! Talks to etcd's v3 JSON gateway (etcd 3.4: `POST /v3/kv/range`, `/v3/kv/txn`, keys
//! and values base64) with a small blocking HTTP client. The key scheme is shared with
//! the Envoy filter's etcd mode, so gateways and proxies can share one etcd:
//!
//! * key: `/fencekeeper/marks/` + resource (the prefix is configurable);
//! * value: the mark's canonical text (`Token`'s `Display`: `34`, `7.1042`).
//!
//! `get` is a linearizable range read. `compare_and_swap` is one Txn: compare the value
//! with the expected mark's canonical text (or `create_revision == 0` when there is no
//! mark), then put; when the compare fails, the same Txn reads the key, so a lost race
//! costs no extra round trip. etcd commits a Txn to its raft log before answering, so
//! an admit is durable (on a quorum) when it is reported.

use super::{MarkStore, StoreError, Swap};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use fencekeeper_core::Token;
use serde_json::{json, Value};
use std::time::Duration;

/// The default key prefix; the Envoy filter uses the same.
pub const DEFAULT_PREFIX: &str = "/fencekeeper/marks/";

/// A [`MarkStore`] in etcd (v3 API through its JSON gateway).
pub struct EtcdStore {
    endpoint: String,
    prefix: String,
    agent: ureq::Agent,
}

impl EtcdStore {
    /// A store at `endpoint` (`http://HOST:PORT`), checked by one read so that a wrong
    /// address fails here, at start-up, rather than on the first request.
    pub fn connect(endpoint: &str) -> Result<EtcdStore, StoreError> {
        Self::with_options(endpoint, DEFAULT_PREFIX, Duration::from_secs(2))
    }

    /// [`EtcdStore::connect`] with another key prefix and a per-call timeout.
    pub fn with_options(endpoint: &str, prefix: &str, timeout: Duration) -> Result<EtcdStore, StoreError> {
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        if !endpoint.starts_with("http://") {
            return Err(StoreError::Unavailable(format!(
                "etcd endpoint {endpoint:?} must look like http://HOST:PORT (TLS is not supported)"
            )));
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            // The gateway calls from many blocking threads at once.
            .max_idle_connections(64)
            .max_idle_connections_per_host(64)
            .build();
        let store = EtcdStore { endpoint, prefix: prefix.to_owned(), agent: ureq::Agent::new_with_config(config) };
        store.call("/v3/kv/range", &json!({ "key": B64.encode(&store.prefix), "limit": 1 }))?;
        Ok(store)
    }

    /// The etcd key holding `resource`'s mark.
    pub fn key(&self, resource: &str) -> String {
        format!("{}{resource}", self.prefix)
    }

    fn call(&self, path: &str, body: &Value) -> Result<Value, StoreError> {
        let unavailable = |detail: String| StoreError::Unavailable(format!("etcd at {}: {detail}", self.endpoint));
        let mut response = self
            .agent
            .post(format!("{}{path}", self.endpoint))
            .content_type("application/json")
            .send(body.to_string())
            .map_err(|e| unavailable(e.to_string()))?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().map_err(|e| unavailable(e.to_string()))?;
        if status != 200 {
            let line = text.lines().next().unwrap_or_default();
            return Err(unavailable(format!("HTTP {status}: {line}")));
        }
        serde_json::from_str(&text).map_err(|e| unavailable(format!("unreadable answer: {e}")))
    }

    /// Decode a `kvs` array: (resource, mark) pairs.
    fn marks(&self, kvs: Option<&Value>) -> Result<Vec<(String, Token)>, StoreError> {
        let Some(kvs) = kvs.and_then(Value::as_array) else {
            return Ok(Vec::new());
        };
        kvs.iter()
            .map(|kv| {
                let key = decode(kv.get("key"))?;
                let resource = key.strip_prefix(&self.prefix).unwrap_or(&key).to_owned();
                let value = decode(kv.get("value"))?;
                let mark = Token::parse(&value).map_err(|e| StoreError::BadMark {
                    resource: resource.clone(),
                    detail: format!("{value:?}: {e}"),
                })?;
                Ok((resource, mark))
            })
            .collect()
    }
}

fn decode(field: Option<&Value>) -> Result<String, StoreError> {
    // etcd's JSON gateway omits empty fields, so a missing value is an empty one.
    let raw = field.and_then(Value::as_str).unwrap_or_default();
    let bytes = B64.decode(raw).map_err(|e| StoreError::Unavailable(format!("etcd answered bad base64: {e}")))?;
    String::from_utf8(bytes)
        .map_err(|e| StoreError::Unavailable(format!("etcd answered a non-UTF-8 key or value: {e}")))
}

fn one(marks: Vec<(String, Token)>) -> Option<Token> {
    marks.into_iter().next().map(|(_, mark)| mark)
}

impl MarkStore for EtcdStore {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        // Ranges are linearizable unless "serializable" is set.
        let answer = self.call("/v3/kv/range", &json!({ "key": B64.encode(self.key(resource)) }))?;
        Ok(one(self.marks(answer.get("kvs"))?))
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        let key = B64.encode(self.key(resource));
        let compare = match expected {
            Some(old) => {
                json!({ "key": key, "target": "VALUE", "result": "EQUAL", "value": B64.encode(old.to_string()) })
            }
            None => json!({ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }),
        };
        let txn = json!({
            "compare": [compare],
            "success": [{ "request_put": { "key": key, "value": B64.encode(new.to_string()) } }],
            "failure": [{ "request_range": { "key": key } }],
        });
        let answer = self.call("/v3/kv/txn", &txn)?;
        // The JSON gateway leaves out false booleans: no "succeeded" means it failed.
        if answer.get("succeeded").and_then(Value::as_bool) == Some(true) {
            return Ok(Swap::Swapped);
        }
        let current = answer
            .pointer("/responses/0/response_range/kvs")
            .map(|kvs| self.marks(Some(kvs)))
            .transpose()?
            .and_then(one);
        Ok(Swap::Conflict(current))
    }

    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        let answer = self.call(
            "/v3/kv/range",
            &json!({ "key": B64.encode(&self.prefix), "range_end": B64.encode(prefix_end(&self.prefix)) }),
        )?;
        let mut marks = self.marks(answer.get("kvs"))?;
        marks.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(marks)
    }
}

/// The smallest key above every key that starts with `prefix` (etcd's prefix range end).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end("/fencekeeper/marks/"), b"/fencekeeper/marks0".to_vec());
    }

    #[test]
    fn unreachable_etcd_is_unavailable_with_a_one_line_reason() {
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(1);
        let err =
            EtcdStore::connect(&format!("http://127.0.0.1:{port}")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.starts_with("mark store unavailable: etcd at http://127.0.0.1:"), "{err}");
        assert!(!err.contains('\n'));
    }
}
