//! A lease lock in etcd, the way real lock clients build one (etcd's own
//! `concurrency` package does the same): a lease with a short TTL, kept alive by a
//! thread; the lock is a key created under that lease by a Txn that succeeds only if
//! the key does not exist (`create_revision == 0`). The fencing token is the revision
//! of that creation: etcd revisions only grow, so every later acquisition gets a
//! higher token. When the holder stops (SIGSTOP), so does its keep-alive; the lease
//! expires, etcd deletes the key, and the next client acquires.

use anyhow::{bail, Result};
use fencekeeper::etcd::{EtcdClient, EtcdOptions};
use fencekeeper_etcd_wire::{grpc, Expect, Op};
use std::time::{Duration, Instant};

/// A client of etcd's gRPC API (the library's, as the mark store uses it).
pub struct Etcd {
    url: String,
    client: EtcdClient,
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
    pub fn new(url: &str) -> Result<Etcd> {
        let options = EtcdOptions { timeout: Duration::from_secs(5), ..EtcdOptions::default() };
        Ok(Etcd { url: url.to_owned(), client: EtcdClient::new(url, &options)? })
    }

    fn lease_call(&self, method: &str, message: &[u8]) -> Result<Vec<u8>> {
        Ok(self.client.unary(grpc::LEASE_SERVICE, method, message)?)
    }

    /// Acquire the lock `key`, waiting (at most `patience`) while someone else holds it.
    pub fn acquire(&self, key: &str, owner: &str, ttl: u64, patience: Duration) -> Result<Held> {
        let lease = grpc::parse_lease_grant(&self.lease_call(grpc::LEASE_GRANT_METHOD, &grpc::lease_grant(ttl))?)?;
        self.keep_alive(lease, ttl)?;
        let deadline = Instant::now() + patience;
        let key = key.as_bytes();
        loop {
            let put = Op::Put { key, value: owner.as_bytes(), lease: Some(lease) };
            let answer = self.client.txn(&grpc::txn(&[(key, Expect::Absent)], &[put], &[]))?;
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
        let _ = self.lease_call(grpc::LEASE_REVOKE_METHOD, &grpc::lease(held.lease));
    }

    /// Refresh the lease from a thread (its own connection), a third of the TTL
    /// apart. The thread stops with the process: a paused holder stops refreshing,
    /// which is the point.
    fn keep_alive(&self, lease: i64, ttl: u64) -> Result<()> {
        let etcd = Etcd::new(&self.url)?;
        let period = Duration::from_millis(ttl * 1000 / 3);
        std::thread::spawn(move || loop {
            std::thread::sleep(period);
            let _ = etcd.lease_call(grpc::LEASE_KEEPALIVE_METHOD, &grpc::lease(lease));
        });
        Ok(())
    }
}
