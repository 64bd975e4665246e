//! The lock holders' etcd lock, in process: etcd's own recipe (`concurrency.Mutex`, as
//! `fencekeeper lock --etcd` and `etcdctl lock` run it, host/cli/src/lock/etcd.rs),
//! over the project's etcd wire and `EtcdClient`, against every member of the cluster
//! (a call that fails on one member is tried on the next).
//!
//! A lease with the TTL; the lock's key `NAME/<lease ID in hex>` put under it if
//! absent; the holder is the key with the lowest create revision. The token is the
//! revision at which the holder saw it holds the lock, not the key's create revision
//! (docs/tokens.md: the two clients' tokens then order every holder).

use anyhow::{bail, Context, Result};
use fencekeeper::etcd::{EtcdClient, EtcdOptions};
use fencekeeper_etcd_wire::{self as wire, grpc, Expect, Op, Range};
use std::time::{Duration, Instant};

/// How often a waiter looks again.
const POLL: Duration = Duration::from_millis(100);

/// The cluster's members, as one client that fails over.
pub struct Etcd {
    members: Vec<EtcdClient>,
    first: usize,
}

impl Etcd {
    /// Clients for `urls`, trying member `first` first.
    pub fn new(urls: &[String], first: usize) -> Result<Etcd> {
        let options = EtcdOptions { timeout: Duration::from_secs(2), ..EtcdOptions::default() };
        let members = urls.iter().map(|u| EtcdClient::new(u, &options)).collect::<Result<Vec<_>, _>>()?;
        Ok(Etcd { first: first % members.len().max(1), members })
    }

    /// One gRPC call, on each member in turn until one answers.
    pub fn call(&self, service: &str, method: &str, message: &[u8]) -> Result<Vec<u8>> {
        let mut last = None;
        for k in 0..self.members.len() {
            let member = &self.members[(self.first + k) % self.members.len()];
            match member.unary(service, method, message) {
                Ok(bytes) => return Ok(bytes),
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(|| anyhow::anyhow!("no etcd member"), anyhow::Error::from))
    }

    fn txn(&self, message: &[u8]) -> Result<wire::TxnAnswer> {
        Ok(grpc::parse_txn(&self.call(grpc::KV_SERVICE, grpc::TXN_METHOD, message)?)?)
    }

    /// What one read answers (a linearizable read: a Txn without compares).
    fn read(&self, range: Range<'_>) -> Result<Vec<wire::KeyValue>> {
        Ok(self.txn(&grpc::txn(&[], &[Op::Range(range)], &[]))?.read(0)?)
    }

    /// Every key under `prefix` with its value.
    pub fn range_prefix(&self, prefix: &str) -> Result<Vec<wire::KeyValue>> {
        self.read(Range { key: prefix.as_bytes(), prefix: true, ..Range::default() })
    }

    fn lease(&self, method: &str, message: &[u8]) -> Result<Vec<u8>> {
        self.call(grpc::LEASE_SERVICE, method, message)
    }
}

/// A held lock.
pub struct Lock {
    /// The fencing token: the revision at which this holder saw it holds the lock.
    pub token: u64,
    lease: i64,
    key: String,
    prefix: String,
    renewed: Instant,
}

/// Take lock `name` with a lease of `ttl` seconds, waiting at most `patience`.
pub fn acquire(etcd: &Etcd, name: &str, ttl: u64, patience: Duration) -> Result<Lock> {
    let deadline = Instant::now() + patience;
    let lease = grpc::parse_lease_grant(&etcd.lease(grpc::LEASE_GRANT_METHOD, &grpc::lease_grant(ttl))?)?;
    let prefix = format!("{name}/");
    let key = format!("{prefix}{lease:x}");
    let mut lock = Lock { token: 0, lease, key, prefix, renewed: Instant::now() };
    match wait_turn(etcd, &mut lock, ttl, deadline) {
        Ok(token) => {
            lock.token = token;
            Ok(lock)
        }
        Err(e) => {
            let _ = lock.release(etcd);
            Err(e)
        }
    }
}

fn wait_turn(etcd: &Etcd, lock: &mut Lock, ttl: u64, deadline: Instant) -> Result<u64> {
    let key = lock.key.clone();
    let key = key.as_bytes();
    let prefix = lock.prefix.clone();
    let put = Op::Put { key, value: b"", lease: Some(lock.lease) };
    let own = Op::Range(Range::of(key));
    let first = Op::Range(Range::lock_queue_head(prefix.as_bytes(), None));
    let queued = etcd.txn(&grpc::txn(&[(key, Expect::Absent)], &[put, first.clone()], &[own, first]))?;
    let created = |kvs: &[wire::KeyValue]| kvs.first().map(|kv| kv.create_revision as i64);
    let mine = if queued.succeeded {
        queued.revision as i64
    } else {
        created(&queued.read(0)?).context("no revision for the waiting key")?
    };
    if created(&queued.read(1)?).is_none_or(|o| o == mine) {
        return Ok(queued.revision);
    }
    loop {
        let earlier = Op::Range(Range::lock_queue_head(prefix.as_bytes(), Some(mine - 1)));
        let answer = etcd.txn(&grpc::txn(&[(key, Expect::CreatedAt(mine))], &[earlier], &[]))?;
        if !answer.succeeded {
            bail!("the waiting key {:?} is gone", lock.key);
        }
        if answer.read(0)?.is_empty() {
            return Ok(answer.revision);
        }
        if Instant::now() > deadline {
            bail!("lock {:?} not acquired in time", lock.prefix);
        }
        if lock.renewed.elapsed() >= Duration::from_secs(ttl) / 3 {
            lock.renew(etcd)?;
        }
        std::thread::sleep(POLL);
    }
}

impl Lock {
    /// Keep the lease alive; an error when it is gone (the lock is lost).
    pub fn renew(&mut self, etcd: &Etcd) -> Result<()> {
        let kept = etcd.lease(grpc::LEASE_KEEPALIVE_METHOD, &grpc::lease(self.lease))?;
        if grpc::parse_keepalive(&kept)? <= 0 {
            bail!("lease expired");
        }
        self.renewed = Instant::now();
        Ok(())
    }

    /// Since the last renewal.
    pub fn since_renewed(&self) -> Duration {
        self.renewed.elapsed()
    }

    /// True once the lock key is gone (its lease expired or was revoked).
    pub fn lost(&self, etcd: &Etcd) -> Result<bool> {
        Ok(etcd.read(Range::of(self.key.as_bytes()))?.is_empty())
    }

    /// True once another holder's key is first in the queue.
    pub fn superseded(&self, etcd: &Etcd) -> Result<bool> {
        let first = etcd.read(Range::lock_queue_head(self.prefix.as_bytes(), None))?;
        Ok(first.first().is_some_and(|kv| kv.key != self.key.as_bytes()))
    }

    /// Revoke the lease (deleting the key); an expired lease is already released.
    pub fn release(&self, etcd: &Etcd) -> Result<()> {
        match etcd.lease(grpc::LEASE_REVOKE_METHOD, &grpc::lease(self.lease)) {
            Ok(_) => Ok(()),
            Err(e) if format!("{e:#}").contains("lease not found") => Ok(()),
            Err(e) => Err(e),
        }
    }
}
