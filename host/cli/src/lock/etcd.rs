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
//! The messages and answers are `fencekeeper-etcd-wire`'s (its gRPC module), the
//! connection (TLS, user) the library's `EtcdClient`: the lock speaks to etcd as the
//! mark store does.

use super::{Held, Patience, Renewal};
use anyhow::{bail, Context};
use fencekeeper::etcd::{EtcdClient, EtcdOptions};
use fencekeeper_etcd_wire::{self as wire, grpc, Expect, Op, Range};
use std::time::Duration;

/// How often a waiting client looks again (etcdctl watches instead; a poll keeps the
/// client one blocking thread that also renews its lease while it waits).
const POLL: Duration = Duration::from_millis(100);

/// A held etcd lock.
pub struct EtcdLock {
    client: EtcdClient,
    name: String,
    /// The lease's ID (etcdctl shows it in hex, and names keys by it).
    id: i64,
    key: String,
    ttl: Duration,
    token: String,
}

/// Take lock `name` at `address` (`http://HOST:PORT`, or `https://HOST:PORT` with TLS
/// in `options`).
pub fn acquire(
    address: &str,
    options: &EtcdOptions,
    name: &str,
    ttl: Duration,
    patience: Patience,
) -> anyhow::Result<EtcdLock> {
    let client = EtcdClient::new(address, &EtcdOptions { timeout: Duration::from_secs(3), ..options.clone() })?;
    let context = || format!("taking lock {name:?} in etcd at {}", client.endpoint());
    let grant = client
        .unary(grpc::LEASE_SERVICE, grpc::LEASE_GRANT_METHOD, &grpc::lease_grant(ttl.as_secs()))
        .with_context(context)?;
    let id = grpc::parse_lease_grant(&grant).with_context(context)?;
    let prefix = format!("{name}/");
    let key = format!("{prefix}{id:x}");
    let context = context();
    let mut lock = EtcdLock { client, name: name.to_owned(), id, key, ttl, token: String::new() };
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

fn create_revision(kvs: &[wire::KeyValue]) -> Option<i64> {
    kvs.first().map(|kv| kv.create_revision as i64)
}

impl EtcdLock {
    /// A Txn on `key`: compare it with `expect`, then `success` or `failure`.
    fn txn(
        &self,
        key: &[u8],
        expect: Expect<'_>,
        success: &[Op<'_>],
        failure: &[Op<'_>],
    ) -> anyhow::Result<wire::TxnAnswer> {
        Ok(self.client.txn(&grpc::txn(&[(key, expect)], success, failure))?)
    }

    /// Queue the key, then wait until no key under `prefix` was created before it;
    /// answer the revision at which that was seen.
    fn wait_turn(&mut self, prefix: &str, patience: Patience) -> anyhow::Result<String> {
        let owned_key = self.key.clone();
        let key = owned_key.as_bytes();
        let put = Op::Put { key, value: b"", lease: Some(self.id) };
        let own = Op::Range(Range::of(key));
        let first = Op::Range(Range::lock_queue_head(prefix.as_bytes(), None));
        let queued = self.txn(key, Expect::Absent, &[put, first.clone()], &[own, first])?;
        let mine = if queued.succeeded {
            queued.revision as i64
        } else {
            create_revision(&queued.read(0)?).context("etcd answered no revision for the waiting key")?
        };
        let owner = create_revision(&queued.read(1)?);
        if owner.is_none_or(|o| o == mine) {
            return Ok(queued.revision.to_string());
        }
        let mut renewed = std::time::Instant::now();
        loop {
            // Still queued (our key exists, created at `mine`), and no key created before it.
            let earlier = Op::Range(Range::lock_queue_head(prefix.as_bytes(), Some(mine - 1)));
            let answer = self.txn(key, Expect::CreatedAt(mine), &[earlier], &[])?;
            if !answer.succeeded {
                bail!("the waiting key {:?} is gone (its lease expired while waiting?)", self.key);
            }
            if answer.read(0)?.is_empty() {
                return Ok(answer.revision.to_string());
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
        match self.client.unary(grpc::LEASE_SERVICE, grpc::LEASE_REVOKE_METHOD, &grpc::lease(self.id)) {
            Ok(_) => Ok(()),
            // Expired already: the key went with it.
            Err(e) if e.to_string().contains("lease not found") => Ok(()),
            Err(e) => Err(e.into()),
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
        let unreachable = |e: &dyn std::fmt::Display| Renewal::Unreachable(e.to_string());
        let kept = self
            .client
            .unary(grpc::LEASE_SERVICE, grpc::LEASE_KEEPALIVE_METHOD, &grpc::lease(self.id))
            .map_err(|e| unreachable(&e))?;
        // An expired lease is renewed with TTL 0.
        if grpc::parse_keepalive(&kept).map_err(|e| unreachable(&e))? <= 0 {
            return Err(Renewal::Lost(format!("etcd lease {:x} expired", self.id)));
        }
        let own = Op::Range(Range::of(self.key.as_bytes()));
        let read = self.client.txn(&grpc::txn(&[], &[own], &[])).map_err(|e| unreachable(&e))?;
        if read.read(0).map_err(|e| unreachable(&e))?.is_empty() {
            return Err(Renewal::Lost(format!("the lock key {:?} was deleted", self.key)));
        }
        Ok(())
    }

    fn release(self: Box<Self>) -> anyhow::Result<()> {
        self.revoke()
    }
}
