//! The simulated etcd's key space, as its JSON API serves it to the Envoy filter
//! (`POST /v3/kv/txn`): keys with values, each with its create and mod revisions and
//! version, under one revision counter that every Txn with a write moves on once.
//! A Txn's compares decide which of its two op lists runs; ranges, puts and deletes
//! answer as etcd's gateway writes them (64-bit numbers as strings, bytes in base64).
//!
//! Leases (`POST /v3/lease/grant`) are granted for their TTL on the world's clock and
//! never kept alive (the filter's registry grants new ones); one that ran out takes
//! its keys with it, in a revision of its own, before the next call is made. Only
//! what the filter's calls use is kept: no watches, no history (a range at an old
//! revision is refused). What the filter sends is hostile input here too: a body that
//! is not a call etcd would take gets etcd's 400, never a guess.

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// One key's value and its bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    value: Vec<u8>,
    create: i64,
    modified: i64,
    version: i64,
    lease: i64,
}

/// The keys, the revision and the leases.
#[derive(Clone, Debug)]
pub struct Kv {
    revision: i64,
    keys: BTreeMap<Vec<u8>, Entry>,
    /// Each lease's end, on the world's clock (ms).
    leases: BTreeMap<i64, u64>,
    next_lease: i64,
    /// The world's clock as of the last call (ms).
    now_ms: u64,
}

impl Default for Kv {
    fn default() -> Kv {
        // etcd starts at revision 1.
        Kv { revision: 1, keys: BTreeMap::new(), leases: BTreeMap::new(), next_lease: 0x1000, now_ms: 0 }
    }
}

/// A failed call: etcd's HTTP status and its message.
type Refusal = (u16, String);

impl Kv {
    /// The world's clock moved to `now_ms`: the leases that ran out end, and their
    /// keys go (one revision for them all, as etcd's lessor revokes a lease).
    pub fn advance(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        let ended: Vec<i64> = self.leases.iter().filter(|(_, end)| **end <= self.now_ms).map(|(id, _)| *id).collect();
        for id in ended {
            self.leases.remove(&id);
            let before = self.keys.len();
            self.keys.retain(|_, e| e.lease != id);
            if self.keys.len() < before {
                self.revision += 1;
            }
        }
    }

    /// Answer one JSON API call: its path and body, to a status and a body.
    pub fn call(&mut self, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let answer = match path {
            "/v3/kv/txn" => self.txn(body),
            "/v3/lease/grant" => self.grant(body),
            other => Err((404, format!("the simulated etcd serves no {other}"))),
        };
        match answer {
            Ok(v) => (200, v.to_string().into_bytes()),
            Err((status, message)) => {
                // As etcd's gateway writes a failure: gRPC's code and the message
                // (NOT_FOUND for a lease, UNIMPLEMENTED for a path, INVALID_ARGUMENT).
                let code = match status {
                    404 if message.contains("lease") => 5,
                    404 => 12,
                    _ => 3,
                };
                (status, json!({"error": message, "code": code, "message": message}).to_string().into_bytes())
            }
        }
    }

    /// The value of `key`, if it has one.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.keys.get(key).map(|e| e.value.as_slice())
    }

    fn grant(&mut self, body: &[u8]) -> Result<Value, Refusal> {
        let grant: Value = serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
        let ttl = int(&grant, "TTL")?;
        if ttl <= 0 {
            return Err(bad(format!("a lease TTL of {ttl}")));
        }
        let id = match int(&grant, "ID")? {
            0 => {
                self.next_lease += 1;
                self.next_lease
            }
            taken if self.leases.contains_key(&taken) => return Err(bad(format!("lease {taken} exists"))),
            chosen => chosen,
        };
        self.leases.insert(id, self.now_ms.saturating_add(ttl as u64 * 1000));
        Ok(json!({"header": self.header(), "ID": id.to_string(), "TTL": ttl.to_string()}))
    }

    fn txn(&mut self, body: &[u8]) -> Result<Value, Refusal> {
        let txn: Value = serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
        let list = |name: &str| match txn.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items.clone()),
            Some(_) => Err(bad(format!("{name} is not a list"))),
        };
        let compares = list("compare")?;
        let mut succeeded = true;
        for c in &compares {
            succeeded &= self.holds(c)?;
        }
        let ops = list(if succeeded { "success" } else { "failure" })?;
        // Writes within one Txn share the revision after it.
        let next = self.revision + 1;
        // A Txn is all or nothing: an op refused undoes the ones before it.
        let mut undo = Vec::new();
        let mut responses = Vec::new();
        for op in &ops {
            match self.op(op, next, &mut undo) {
                Ok(answer) => responses.push(answer),
                Err(refused) => {
                    for (key, before) in undo.into_iter().rev() {
                        match before {
                            Some(entry) => self.keys.insert(key, entry),
                            None => self.keys.remove(&key),
                        };
                    }
                    return Err(refused);
                }
            }
        }
        if !undo.is_empty() {
            self.revision = next;
        }
        Ok(json!({"header": self.header(), "succeeded": succeeded, "responses": responses}))
    }

    fn header(&self) -> Value {
        json!({"cluster_id": "1", "member_id": "1", "revision": self.revision.to_string(), "raft_term": "2"})
    }

    /// Whether compare `c` holds (over every key of its range, when it has one).
    fn holds(&self, c: &Value) -> Result<bool, Refusal> {
        let key = bytes(c, "key")?;
        let end = bytes(c, "range_end")?;
        let target = text(c, "target").unwrap_or("VERSION");
        let result = text(c, "result").unwrap_or("EQUAL");
        let keys: Vec<(&Vec<u8>, &Entry)> = self.range_of(&key, &end).collect();
        if keys.is_empty() {
            // etcd: a value compared on a key that does not exist always fails; the
            // other targets compare as zero.
            if end.is_empty() {
                return if target == "VALUE" { Ok(false) } else { compare(target, result, c, None) };
            }
            return Ok(true);
        }
        for (_, entry) in keys {
            if !compare(target, result, c, Some(entry))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn range_of<'a>(&'a self, key: &[u8], end: &[u8]) -> Box<dyn Iterator<Item = (&'a Vec<u8>, &'a Entry)> + 'a> {
        if end.is_empty() {
            return Box::new(self.keys.get_key_value(key).into_iter());
        }
        let from = key.to_vec();
        if end == [0] {
            return Box::new(self.keys.range(from..));
        }
        Box::new(self.keys.range(from..end.to_vec()))
    }

    /// Run `op` at revision `next`, noting in `undo` what each key it wrote was.
    fn op(&mut self, op: &Value, next: i64, undo: &mut Vec<(Vec<u8>, Option<Entry>)>) -> Result<Value, Refusal> {
        if let Some(r) = op.get("request_range") {
            return self.range(r);
        }
        if let Some(p) = op.get("request_put") {
            let key = bytes(p, "key")?;
            if key.is_empty() {
                return Err(bad("a put of an empty key".into()));
            }
            let value = bytes(p, "value")?;
            let lease = int(p, "lease")?;
            if lease != 0 && !self.leases.contains_key(&lease) {
                return Err((404, "etcdserver: requested lease not found".into()));
            }
            let prev = self.keys.get(&key).cloned();
            let entry = match &prev {
                Some(e) => Entry { value, create: e.create, modified: next, version: e.version + 1, lease },
                None => Entry { value, create: next, modified: next, version: 1, lease },
            };
            undo.push((key.clone(), prev.clone()));
            self.keys.insert(key.clone(), entry);
            let mut answer = json!({"header": self.header()});
            if flag(p, "prev_kv") {
                if let Some(e) = prev {
                    answer["prev_kv"] = kv_json(&key, &e, false);
                }
            }
            return Ok(json!({ "response_put": answer }));
        }
        if let Some(d) = op.get("request_delete_range") {
            let key = bytes(d, "key")?;
            let end = bytes(d, "range_end")?;
            let gone: Vec<(Vec<u8>, Entry)> = self.range_of(&key, &end).map(|(k, e)| (k.clone(), e.clone())).collect();
            for (k, e) in &gone {
                self.keys.remove(k);
                undo.push((k.clone(), Some(e.clone())));
            }
            let mut answer = json!({"header": self.header(), "deleted": gone.len().to_string()});
            if flag(d, "prev_kv") {
                answer["prev_kvs"] = gone.iter().map(|(k, e)| kv_json(k, e, false)).collect();
            }
            return Ok(json!({ "response_delete_range": answer }));
        }
        Err(bad("an op that is none of range, put, delete".into()))
    }

    fn range(&self, r: &Value) -> Result<Value, Refusal> {
        let key = bytes(r, "key")?;
        let end = bytes(r, "range_end")?;
        let at = int(r, "revision")?;
        if at != 0 && at != self.revision {
            // No history is kept: a read at another revision is refused, never
            // answered with today's values.
            return Err(bad(format!("the simulated etcd keeps no history (revision {at})")));
        }
        let (min_mod, max_mod) = (int(r, "min_mod_revision")?, int(r, "max_mod_revision")?);
        let (min_create, max_create) = (int(r, "min_create_revision")?, int(r, "max_create_revision")?);
        let mut found: Vec<(&Vec<u8>, &Entry)> = self
            .range_of(&key, &end)
            .filter(|(_, e)| min_mod == 0 || e.modified >= min_mod)
            .filter(|(_, e)| max_mod == 0 || e.modified <= max_mod)
            .filter(|(_, e)| min_create == 0 || e.create >= min_create)
            .filter(|(_, e)| max_create == 0 || e.create <= max_create)
            .collect();
        let count = found.len();
        match (text(r, "sort_target").unwrap_or("KEY"), text(r, "sort_order").unwrap_or("NONE")) {
            (_, "NONE") | ("KEY", "ASCEND") => {}
            ("KEY", "DESCEND") => found.reverse(),
            (target, order) => {
                found.sort_by_key(|(k, e)| match target {
                    "VERSION" => (e.version, (*k).clone()),
                    "CREATE" => (e.create, (*k).clone()),
                    "MOD" => (e.modified, (*k).clone()),
                    _ => (0, (*k).clone()),
                });
                if order == "DESCEND" {
                    found.reverse();
                }
            }
        }
        let limit = usize::try_from(int(r, "limit")?).unwrap_or(0);
        let more = limit != 0 && found.len() > limit;
        if more {
            found.truncate(limit);
        }
        let mut answer = json!({"header": self.header(), "count": count.to_string()});
        if more {
            answer["more"] = json!(true);
        }
        if !flag(r, "count_only") {
            let keys_only = flag(r, "keys_only");
            answer["kvs"] = found.iter().map(|(k, e)| kv_json(k, e, keys_only)).collect();
        }
        Ok(json!({ "response_range": answer }))
    }
}

fn bad(message: String) -> Refusal {
    (400, message)
}

fn text<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
    v.get(name).and_then(Value::as_str)
}

fn flag(v: &Value, name: &str) -> bool {
    v.get(name).and_then(Value::as_bool).unwrap_or(false)
}

/// A 64-bit number, as proto3's JSON writes it (a string of digits) or as a number.
fn int(v: &Value, name: &str) -> Result<i64, Refusal> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s.parse().map_err(|_| bad(format!("{name} {s:?} is not a number"))),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| bad(format!("{name} {n} is not a 64-bit number"))),
        Some(other) => Err(bad(format!("{name} {other} is not a number"))),
    }
}

fn bytes(v: &Value, name: &str) -> Result<Vec<u8>, Refusal> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => base64::decode(s).ok_or_else(|| bad(format!("{name} is not base64"))),
        Some(other) => Err(bad(format!("{name} {other} is not base64 text"))),
    }
}

fn compare(target: &str, result: &str, c: &Value, entry: Option<&Entry>) -> Result<bool, Refusal> {
    use std::cmp::Ordering;
    let ordering = match target {
        "VALUE" => {
            let have = entry.map_or(&[][..], |e| e.value.as_slice());
            have.cmp(bytes(c, "value")?.as_slice())
        }
        "VERSION" => entry.map_or(0, |e| e.version).cmp(&int(c, "version")?),
        "CREATE" => entry.map_or(0, |e| e.create).cmp(&int(c, "create_revision")?),
        "MOD" => entry.map_or(0, |e| e.modified).cmp(&int(c, "mod_revision")?),
        "LEASE" => entry.map_or(0, |e| e.lease).cmp(&int(c, "lease")?),
        other => return Err(bad(format!("no compare target {other}"))),
    };
    Ok(match result {
        "EQUAL" => ordering == Ordering::Equal,
        "NOT_EQUAL" => ordering != Ordering::Equal,
        "GREATER" => ordering == Ordering::Greater,
        "LESS" => ordering == Ordering::Less,
        other => return Err(bad(format!("no compare result {other}"))),
    })
}

fn kv_json(key: &[u8], e: &Entry, keys_only: bool) -> Value {
    let mut kv = Map::new();
    kv.insert("key".into(), json!(base64::encode(key)));
    kv.insert("create_revision".into(), json!(e.create.to_string()));
    kv.insert("mod_revision".into(), json!(e.modified.to_string()));
    kv.insert("version".into(), json!(e.version.to_string()));
    if !keys_only {
        kv.insert("value".into(), json!(base64::encode(&e.value)));
    }
    if e.lease != 0 {
        kv.insert("lease".into(), json!(e.lease.to_string()));
    }
    Value::Object(kv)
}

/// Standard base64 with padding, as etcd's gateway writes bytes.
mod base64 {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(text: &str) -> Option<Vec<u8>> {
        let text = text.as_bytes();
        if !text.len().is_multiple_of(4) {
            return None;
        }
        let mut out = Vec::with_capacity(text.len() / 4 * 3);
        for chunk in text.chunks(4) {
            let pad = chunk.iter().rev().take_while(|c| **c == b'=').count();
            if pad > 2 {
                return None;
            }
            let mut n = 0u32;
            for (i, c) in chunk.iter().enumerate() {
                let v = if i >= 4 - pad { 0 } else { ALPHABET.iter().position(|a| a == c)? as u32 };
                n |= v << (18 - 6 * i);
            }
            for i in 0..3 - pad {
                out.push((n >> (16 - 8 * i)) as u8);
            }
        }
        Some(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn txn(kv: &mut Kv, body: Value) -> Value {
        let (status, answer) = kv.call("/v3/kv/txn", body.to_string().as_bytes());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        serde_json::from_slice(&answer).unwrap()
    }

    fn b64(s: &str) -> String {
        base64::encode(s.as_bytes())
    }

    #[test]
    fn base64_round_trips_every_length() {
        for n in 0..10 {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + 200) as u8).collect();
            assert_eq!(base64::decode(&base64::encode(&bytes)).unwrap(), bytes);
        }
        assert_eq!(base64::encode(b"fo"), "Zm8=");
        assert!(base64::decode("Zm8").is_none());
    }

    #[test]
    fn a_txn_creates_then_compares_on_value_and_revision() {
        let mut kv = Kv::default();
        let create = json!({
            "compare": [{"target": "CREATE", "result": "EQUAL", "key": b64("/m/r"), "create_revision": "0"}],
            "success": [{"request_put": {"key": b64("/m/r"), "value": b64("34")}}],
            "failure": [{"request_range": {"key": b64("/m/r")}}],
        });
        let first = txn(&mut kv, create.clone());
        assert_eq!(first["succeeded"], json!(true));
        assert_eq!(first["header"]["revision"], json!("2"));
        let again = txn(&mut kv, create);
        assert_eq!(again["succeeded"], json!(false), "the key exists now");
        let kvs = &again["responses"][0]["response_range"]["kvs"];
        assert_eq!(kvs[0]["value"], json!(b64("34")));
        assert_eq!(kvs[0]["mod_revision"], json!("2"));
        let swap = |from: &str, to: &str| {
            json!({
                "compare": [{"target": "VALUE", "result": "EQUAL", "key": b64("/m/r"), "value": b64(from)}],
                "success": [{"request_put": {"key": b64("/m/r"), "value": b64(to)}}],
            })
        };
        assert_eq!(txn(&mut kv, swap("33", "35"))["succeeded"], json!(false), "the value is not 33");
        assert_eq!(txn(&mut kv, swap("34", "35"))["succeeded"], json!(true));
        assert_eq!(kv.get(b"/m/r"), Some(&b"35"[..]));
        assert_eq!(kv.revision, 3, "a failed Txn writes nothing and moves no revision");
    }

    #[test]
    fn a_value_compared_on_a_missing_key_fails_and_ranges_list_in_key_order() {
        let mut kv = Kv::default();
        let on_missing =
            json!({"compare": [{"target": "VALUE", "result": "NOT_EQUAL", "key": b64("x"), "value": b64("1")}]});
        assert_eq!(txn(&mut kv, on_missing)["succeeded"], json!(false));
        for k in ["/p/b", "/p/a", "/q/c"] {
            txn(&mut kv, json!({"success": [{"request_put": {"key": b64(k), "value": b64("v")}}]}));
        }
        let listed = txn(
            &mut kv,
            json!({"success": [{"request_range": {"key": b64("/p/"), "range_end": b64("/p0"), "limit": "1"}}]}),
        );
        let range = &listed["responses"][0]["response_range"];
        assert_eq!((range["count"].clone(), range["more"].clone()), (json!("2"), json!(true)));
        assert_eq!(range["kvs"][0]["key"], json!(b64("/p/a")));
        let gone =
            txn(&mut kv, json!({"success": [{"request_delete_range": {"key": b64("/p/"), "range_end": b64("/p0")}}]}));
        assert_eq!(gone["responses"][0]["response_delete_range"]["deleted"], json!("2"));
        assert_eq!(kv.get(b"/q/c"), Some(&b"v"[..]));
    }

    #[test]
    fn what_is_not_a_txn_gets_etcds_400() {
        let mut kv = Kv::default();
        let put_then_bad = r#"{"success": [{"request_put": {"key": "YQ==", "value": "YQ=="}}, {}]}"#;
        for body in [
            "{",
            r#"{"compare": 3}"#,
            r#"{"success": [{"request_put": {"key": "%%"}}]}"#,
            r#"{"success": [{}]}"#,
            put_then_bad,
        ] {
            let (status, answer) = kv.call("/v3/kv/txn", body.as_bytes());
            assert_eq!(status, 400, "{body}: {}", String::from_utf8_lossy(&answer));
        }
        assert_eq!(kv.call("/v3/lease/grant", b"{}").0, 400, "no TTL");
        assert_eq!(kv.call("/v3/lease/revoke", b"{}").0, 404);
        let on_no_lease = r#"{"success": [{"request_put": {"key": "YQ==", "value": "YQ==", "lease": "7"}}]}"#;
        assert_eq!(kv.call("/v3/kv/txn", on_no_lease.as_bytes()).0, 404);
        assert_eq!((kv.revision, kv.get(b"a")), (1, None), "a refused Txn wrote nothing");
    }

    #[test]
    fn a_lease_takes_its_keys_when_it_runs_out_on_the_worlds_clock() {
        let mut kv = Kv::default();
        kv.advance(1_000);
        let (status, body) = kv.call("/v3/lease/grant", br#"{"TTL": "2"}"#);
        assert_eq!(status, 200);
        let granted: Value = serde_json::from_slice(&body).unwrap();
        let id = granted["ID"].as_str().unwrap().to_owned();
        assert_eq!(granted["TTL"], json!("2"));
        txn(&mut kv, json!({"success": [{"request_put": {"key": b64("/f/1"), "value": b64("x"), "lease": id}}]}));
        txn(&mut kv, json!({"success": [{"request_put": {"key": b64("/m/1"), "value": b64("34")}}]}));
        kv.advance(2_999);
        assert!(kv.get(b"/f/1").is_some(), "not yet");
        let before = kv.revision;
        kv.advance(3_000);
        assert_eq!((kv.get(b"/f/1"), kv.get(b"/m/1")), (None, Some(&b"34"[..])), "only the lease's key went");
        assert_eq!(kv.revision, before + 1);
        let late = json!({"success": [{"request_put": {"key": b64("/f/2"), "value": b64("x"), "lease": id}}]});
        assert_eq!(kv.call("/v3/kv/txn", late.to_string().as_bytes()).0, 404, "a put under an ended lease");
    }
}
