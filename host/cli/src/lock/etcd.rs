//! A lock in etcd, the same recipe as etcd's `concurrency.Mutex` (what `etcdctl lock`
//! runs), so that the two clients exclude each other on one NAME:
//!
//! * a lease with the TTL; the lock's key is `NAME/<lease ID in hex>`, put under the
//!   lease, in a Txn that puts it only if it does not exist yet;
//! * the holder is the key under `NAME/` with the lowest create revision: a client
//!   waits until no key created before its own is left;
//! * the token is the revision at which the client saw that: the header revision of
//!   the read that found no earlier key while its own key still existed. That is what
//!   `etcdctl lock` hands its command as `ETCD_LOCK_REV`, so tokens from both clients
//!   for one lock are comparable (docs/tokens.md: why not the key's create revision).
//!
//! Every JSON body and field name of etcd's v3 gateway that the lock uses is in this
//! file; nothing else in the command speaks to etcd for locks.

use super::{Held, Patience, Renewal};
use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use std::time::Duration;

/// How often a waiting client looks again (etcdctl watches instead; a poll keeps the
/// client one blocking thread that also renews its lease while it waits).
const POLL: Duration = Duration::from_millis(100);

/// A held etcd lock.
pub struct EtcdLock {
    client: Client,
    name: String,
    lease: String,
    /// The lease's ID as a number (etcdctl shows it in hex, and names keys by it).
    id: i64,
    key: String,
    ttl: Duration,
    token: String,
}

/// Take lock `name` at `address` (`HOST:PORT` or `http://HOST:PORT`).
pub fn acquire(address: &str, name: &str, ttl: Duration, patience: Patience) -> anyhow::Result<EtcdLock> {
    let client = Client::new(address)?;
    let context = || format!("taking lock {name:?} in etcd at {}", client.endpoint);
    let grant = client.call("/v3/lease/grant", &json!({ "TTL": ttl.as_secs() })).with_context(context)?;
    let lease = grant.get("ID").and_then(Value::as_str).context("etcd granted a lease without an ID")?.to_owned();
    let id: i64 = lease.parse().with_context(|| format!("etcd granted lease {lease:?}"))?;
    let prefix = format!("{name}/");
    let key = format!("{prefix}{id:x}");
    let context = context();
    let mut lock = EtcdLock { client, name: name.to_owned(), lease, id, key, ttl, token: String::new() };
    match lock.wait_turn(&prefix, patience) {
        Ok(token) => {
            lock.token = token;
            Ok(lock)
        }
        Err(e) => {
            // Leave the queue: revoking the lease deletes the waiting key.
            let _ = lock.revoke();
            Err(e.context(context))
        }
    }
}

impl EtcdLock {
    /// Queue the key, then wait until no key under `prefix` was created before it;
    /// answer the revision at which that was seen.
    fn wait_turn(&mut self, prefix: &str, patience: Patience) -> anyhow::Result<String> {
        let key = B64.encode(&self.key);
        let first = range_of(prefix, "ASCEND", None);
        let queued = self.client.call(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
                "success": [{ "request_put": { "key": key, "value": "", "lease": self.lease } }, { "request_range": first }],
                "failure": [{ "request_range": { "key": key } }, { "request_range": first }],
            }),
        )?;
        // The JSON gateway leaves out false booleans: no "succeeded" means it failed.
        let mine = if queued.get("succeeded").and_then(Value::as_bool) == Some(true) {
            revision(queued.pointer("/header/revision"))?
        } else {
            revision(queued.pointer("/responses/0/response_range/kvs/0/create_revision"))?
        };
        let owner = queued.pointer("/responses/1/response_range/kvs/0/create_revision");
        if owner.is_none() || revision(owner)? == mine {
            return Ok(revision(queued.pointer("/header/revision"))?.to_string());
        }
        let mut renewed = std::time::Instant::now();
        loop {
            // Still queued (our key exists, created at `mine`), and no key created before it.
            let earlier = self.client.call(
                "/v3/kv/txn",
                &json!({
                    "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": mine.to_string() }],
                    "success": [{ "request_range": range_of(prefix, "DESCEND", Some(mine - 1)) }],
                }),
            )?;
            if earlier.get("succeeded").and_then(Value::as_bool) != Some(true) {
                bail!("the waiting key {:?} is gone (its lease expired while waiting?)", self.key);
            }
            if earlier.pointer("/responses/0/response_range/kvs/0").is_none() {
                return Ok(revision(earlier.pointer("/header/revision"))?.to_string());
            }
            patience.check(&self.name)?;
            if renewed.elapsed() >= self.ttl / 3 {
                self.renew().map_err(|e| anyhow::anyhow!("keeping the lease alive while waiting: {e:?}"))?;
                renewed = std::time::Instant::now();
            }
            std::thread::sleep(POLL);
        }
    }

    fn revoke(&self) -> anyhow::Result<()> {
        match self.client.call("/v3/lease/revoke", &json!({ "ID": self.lease })) {
            Ok(_) => Ok(()),
            // Expired already: the key went with it.
            Err(e) if format!("{e:#}").contains("lease not found") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Held for EtcdLock {
    fn token(&self) -> &str {
        &self.token
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn renew(&mut self) -> Result<(), Renewal> {
        let unreachable = |e: anyhow::Error| Renewal::Unreachable(format!("{e:#}"));
        let kept = self.client.call("/v3/lease/keepalive", &json!({ "ID": self.lease })).map_err(unreachable)?;
        // An expired lease is renewed with TTL 0, which the gateway leaves out.
        if int(kept.pointer("/result/TTL")).unwrap_or(0) <= 0 {
            return Err(Renewal::Lost(format!("etcd lease {:x} expired", self.id)));
        }
        let read = self.client.call("/v3/kv/range", &json!({ "key": B64.encode(&self.key) })).map_err(unreachable)?;
        if read.pointer("/kvs/0").is_none() {
            return Err(Renewal::Lost(format!("the lock key {:?} was deleted", self.key)));
        }
        Ok(())
    }

    fn release(self: Box<Self>) -> anyhow::Result<()> {
        self.revoke()
    }
}

/// A range over every key under `prefix` (which ends in `/`), one key, sorted by
/// create revision; with `max_create`, only keys created at or before it.
fn range_of(prefix: &str, order: &str, max_create: Option<i64>) -> Value {
    // The end of a prefix range is the prefix with its last byte raised: '/' + 1 = '0'.
    let end = format!("{}0", prefix.strip_suffix('/').unwrap_or(prefix));
    let mut range = json!({
        "key": B64.encode(prefix),
        "range_end": B64.encode(end),
        "sort_order": order,
        "sort_target": "CREATE",
        "limit": 1,
    });
    if let Some(max) = max_create {
        range["max_create_revision"] = json!(max.to_string());
    }
    range
}

/// A revision: an int64, which the gateway renders as a JSON string.
fn revision(field: Option<&Value>) -> anyhow::Result<i64> {
    int(field).with_context(|| format!("etcd answered revision {field:?}"))
}

/// An int64 field, as a JSON string (the gateway's rendering) or a number.
fn int(field: Option<&Value>) -> Option<i64> {
    match field? {
        Value::String(text) => text.parse().ok(),
        other => other.as_i64(),
    }
}

/// A client of etcd's v3 JSON gateway.
struct Client {
    endpoint: String,
    agent: ureq::Agent,
}

impl Client {
    fn new(address: &str) -> anyhow::Result<Client> {
        let endpoint = fencekeeper_gateway::config::with_scheme(address).trim_end_matches('/').to_owned();
        if !endpoint.starts_with("http://") {
            bail!("etcd address {address:?} must be HOST:PORT or http://HOST:PORT (TLS is not supported)");
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(3)))
            .http_status_as_error(false)
            .build();
        Ok(Client { endpoint, agent: ureq::Agent::new_with_config(config) })
    }

    fn call(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.endpoint);
        let mut response = self
            .agent
            .post(&url)
            .content_type("application/json")
            .send(body.to_string())
            .with_context(|| format!("etcd at {}", self.endpoint))?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().with_context(|| format!("etcd at {}", self.endpoint))?;
        if status != 200 {
            let detail = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| text.lines().next().unwrap_or_default().to_owned());
            bail!("etcd at {} answered {path} with HTTP {status}: {detail}", self.endpoint);
        }
        serde_json::from_str(&text).with_context(|| format!("etcd at {} answered {path} unreadably", self.endpoint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_range_covers_the_prefix_and_stops_at_the_given_revision() {
        let range = range_of("orders/", "DESCEND", Some(41));
        assert_eq!(range["key"], B64.encode("orders/"));
        assert_eq!(range["range_end"], B64.encode("orders0"));
        assert_eq!(range["max_create_revision"], "41");
        assert_eq!(range["limit"], 1);
    }
}
