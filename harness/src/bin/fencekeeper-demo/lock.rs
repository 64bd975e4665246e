//! A lease lock in etcd, the way real lock clients build one (etcd's own
//! `concurrency` package does the same): a lease with a short TTL, kept alive by a
//! thread; the lock is a key created under that lease by a Txn that succeeds only if
//! the key does not exist (`create_revision == 0`). The fencing token is the revision
//! of that creation: etcd revisions only grow, so every later acquisition gets a
//! higher token. When the holder stops (SIGSTOP), so does its keep-alive; the lease
//! expires, etcd deletes the key, and the next client acquires.

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A client of etcd's v3 JSON gateway.
pub struct Etcd {
    url: String,
    agent: ureq::Agent,
}

/// A held lock: its lease and fencing token.
pub struct Held {
    /// The lease the lock key lives under.
    pub lease: String,
    /// The fencing token: the revision that created the lock key.
    pub token: u64,
}

impl Etcd {
    /// A client for `url` (`http://HOST:PORT`).
    pub fn new(url: &str) -> Etcd {
        let config = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(5))).build();
        Etcd { url: url.trim_end_matches('/').to_owned(), agent: ureq::Agent::new_with_config(config) }
    }

    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let url = format!("{}{path}", self.url);
        let text = self
            .agent
            .post(&url)
            .send(body.to_string())
            .with_context(|| format!("etcd {url}"))?
            .body_mut()
            .read_to_string()?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Acquire the lock `key`, waiting (at most `patience`) while someone else holds it.
    pub fn acquire(&self, key: &str, owner: &str, ttl: u64, patience: Duration) -> Result<Held> {
        let grant = self.call("/v3/lease/grant", &json!({ "TTL": ttl }))?;
        let lease = grant.get("ID").and_then(Value::as_str).context("etcd granted no lease ID")?.to_owned();
        self.keep_alive(&lease, ttl);
        let key = B64.encode(key);
        let deadline = Instant::now() + patience;
        loop {
            let txn = json!({
                "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
                "success": [{ "request_put": { "key": key, "value": B64.encode(owner), "lease": lease } }],
            });
            let answer = self.call("/v3/kv/txn", &txn)?;
            if answer.get("succeeded").and_then(Value::as_bool) == Some(true) {
                let revision = answer.pointer("/header/revision").and_then(Value::as_str).context("no revision")?;
                return Ok(Held { lease, token: revision.parse()? });
            }
            if Instant::now() > deadline {
                bail!("lock still held by someone else after {patience:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Give the lock back (revoking the lease deletes the key); an expired lease is fine.
    pub fn release(&self, held: &Held) {
        let _ = self.call("/v3/lease/revoke", &json!({ "ID": held.lease }));
    }

    /// Refresh the lease from a thread, a third of the TTL apart. The thread stops
    /// with the process: a paused holder stops refreshing, which is the point.
    fn keep_alive(&self, lease: &str, ttl: u64) {
        let (etcd, body) = (Etcd::new(&self.url), json!({ "ID": lease }));
        let period = Duration::from_millis(ttl * 1000 / 3);
        std::thread::spawn(move || loop {
            std::thread::sleep(period);
            let _ = etcd.call("/v3/lease/keepalive", &body);
        });
    }
}
