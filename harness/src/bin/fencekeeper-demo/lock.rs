//! A lease lock in etcd, the way real lock clients build one (etcd's own
//! `concurrency` package does the same): a lease with a short TTL, kept alive by a
//! thread; the lock is a key created under that lease by a Txn that succeeds only if
//! the key does not exist (`create_revision == 0`). The fencing token is the revision
//! of that creation: etcd revisions only grow, so every later acquisition gets a
//! higher token. When the holder stops (SIGSTOP), so does its keep-alive; the lease
//! expires, etcd deletes the key, and the next client acquires.

use anyhow::{bail, Context, Result};
use fencekeeper_etcd_wire::{self as wire, Expect};
use std::time::{Duration, Instant};

/// A client of etcd's v3 JSON gateway.
pub struct Etcd {
    url: String,
    agent: ureq::Agent,
}

/// A held lock: its lease and fencing token.
pub struct Held {
    /// The lease the lock key lives under.
    pub lease: i64,
    /// The fencing token: the revision that created the lock key.
    pub token: u64,
}

impl Etcd {
    /// A client for `url` (`http://HOST:PORT`).
    pub fn new(url: &str) -> Etcd {
        let config = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(5))).build();
        Etcd { url: url.trim_end_matches('/').to_owned(), agent: ureq::Agent::new_with_config(config) }
    }

    fn call(&self, path: &str, body: String) -> Result<Vec<u8>> {
        let url = format!("{}{path}", self.url);
        Ok(self.agent.post(&url).send(body).with_context(|| format!("etcd {url}"))?.body_mut().read_to_vec()?)
    }

    /// Acquire the lock `key`, waiting (at most `patience`) while someone else holds it.
    pub fn acquire(&self, key: &str, owner: &str, ttl: u64, patience: Duration) -> Result<Held> {
        let lease = wire::parse_lease_grant(&self.call(wire::LEASE_GRANT_PATH, wire::lease_grant(ttl))?)?;
        self.keep_alive(lease, ttl);
        let deadline = Instant::now() + patience;
        loop {
            let txn = wire::txn(key.as_bytes(), Expect::Absent, Some(owner.as_bytes()), Some(lease), false);
            let answer = wire::parse_txn(&self.call(wire::TXN_PATH, txn)?)?;
            if answer.succeeded {
                return Ok(Held { lease, token: answer.revision });
            }
            if Instant::now() > deadline {
                bail!("lock still held by someone else after {patience:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Give the lock back (revoking the lease deletes the key); an expired lease is fine.
    pub fn release(&self, held: &Held) {
        let _ = self.call(wire::LEASE_REVOKE_PATH, wire::lease(held.lease));
    }

    /// Refresh the lease from a thread, a third of the TTL apart. The thread stops
    /// with the process: a paused holder stops refreshing, which is the point.
    fn keep_alive(&self, lease: i64, ttl: u64) {
        let etcd = Etcd::new(&self.url);
        let period = Duration::from_millis(ttl * 1000 / 3);
        std::thread::spawn(move || loop {
            std::thread::sleep(period);
            let _ = etcd.call(wire::LEASE_KEEPALIVE_PATH, wire::lease(lease));
        });
    }
}
