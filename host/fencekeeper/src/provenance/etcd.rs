//! Provenance of etcd tokens (revisions), weak or strong; the rules are the etcd wire's
//! (`fencekeeper_etcd_wire::provenance`), shared with the Envoy filter.
//!
//! * **Weak**: the token is not above the cluster's revision. Revisions only grow, so a
//!   token at or below the highest revision any answer carried needs no round trip;
//!   sharing the mark store's connection ([`EtcdProvenance::sharing`]) makes that the
//!   common case, since the store reads the mark before an advance. Otherwise one
//!   count-only read returns the revision.
//! * **Strong**: one read of the holder of the lock `LOCK_PREFIX + resource` (the
//!   first key under it by create revision); the token must lie between that key's
//!   create revision and the read's revision.

use super::{AwaitableProvenance, Origin, Provenance, ProvenanceError};
use crate::etcd::{EtcdClient, EtcdOptions};
use crate::store::EtcdStore;
use fencekeeper_core::Token;
use fencekeeper_etcd_wire::provenance::{self as rules, Unissued};
use fencekeeper_etcd_wire::{self as wire, grpc, Op};
use std::sync::Arc;
use std::time::Duration;

/// Which etcd check, and for the strong one, where the locks live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdCheck {
    /// The token is not above the cluster's revision.
    Weak,
    /// The token belongs to the current holder of the lock `lock_prefix + resource`.
    Strong {
        /// Prepended to the resource to name its lock (`etcdctl lock NAME`).
        lock_prefix: String,
    },
}

/// [`Provenance`] against etcd.
pub struct EtcdProvenance {
    client: Arc<EtcdClient>,
    check: EtcdCheck,
}

impl EtcdProvenance {
    /// A check against the etcd at `endpoint` (`http://HOST:PORT`), each call bounded
    /// by `timeout`; one read now, so that a wrong address fails at start-up.
    pub fn connect(endpoint: &str, check: EtcdCheck, timeout: Duration) -> Result<EtcdProvenance, ProvenanceError> {
        Self::connect_with(endpoint, check, &EtcdOptions { timeout, ..EtcdOptions::default() })
    }

    /// [`EtcdProvenance::connect`] with TLS and a user ([`EtcdOptions`]).
    pub fn connect_with(
        endpoint: &str,
        check: EtcdCheck,
        options: &EtcdOptions,
    ) -> Result<EtcdProvenance, ProvenanceError> {
        let provenance = EtcdProvenance { client: Arc::new(EtcdClient::new(endpoint, options)?), check };
        provenance.client.block_on(provenance.revision())?;
        Ok(provenance)
    }

    /// A check against `store`'s etcd that shares the store's connection and the
    /// highest revision the store's answers carried, so that the weak check of a
    /// token at or below a revision the store has seen costs no round trip.
    pub fn sharing(store: &EtcdStore, check: EtcdCheck) -> EtcdProvenance {
        EtcdProvenance { client: store.client().clone(), check }
    }

    /// The cluster's current revision: a Txn without operations answers it.
    async fn revision(&self) -> Result<u64, ProvenanceError> {
        Ok(self.read(&[]).await?.revision)
    }

    /// A read-only Txn of `reads` (over gRPC, as the mark store's; the client
    /// remembers the revision it answered at).
    async fn read(&self, reads: &[Op<'_>]) -> Result<wire::TxnAnswer, ProvenanceError> {
        Ok(self.client.txn_async(&grpc::txn(&[], reads, &[])).await?)
    }

    /// The check, awaited or blocked on ([`Provenance::check`]).
    async fn check_async(&self, resource: &str, token: &Token) -> Result<Origin, ProvenanceError> {
        match &self.check {
            EtcdCheck::Weak => match rules::weak(token, self.client.revision()) {
                // Above every revision seen so far: ask for the current one.
                Err(Unissued::AboveRevision { .. }) => Ok(origin(rules::weak(token, self.revision().await?))),
                seen => Ok(origin(seen)),
            },
            EtcdCheck::Strong { lock_prefix } => {
                let lock = rules::lock_name(lock_prefix, resource);
                let answer = self.read(&[rules::holder_op(&rules::holder_keys(&lock))]).await?;
                let holder = answer
                    .read(0)
                    .map_err(|e| ProvenanceError::Unavailable(format!("etcd at {}: {e}", self.client.endpoint())))?;
                Ok(origin(rules::strong(token, holder.first(), &lock, answer.revision)))
            }
        }
    }
}

impl AwaitableProvenance for EtcdProvenance {
    fn check<'a>(
        &'a self,
        resource: &'a str,
        token: &'a Token,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Origin, ProvenanceError>> + Send + 'a>> {
        Box::pin(self.check_async(resource, token))
    }
}

fn origin(rule: Result<(), Unissued>) -> Origin {
    match rule {
        Ok(()) => Origin::Issued,
        Err(why) => Origin::Unverified(why.to_string()),
    }
}

impl Provenance for EtcdProvenance {
    fn check(&self, resource: &str, token: &Token) -> Result<Origin, ProvenanceError> {
        self.client.block_on(self.check_async(resource, token))
    }

    fn awaitable(&self) -> Option<&dyn AwaitableProvenance> {
        Some(self)
    }

    fn issued_as_far_as_known(&self, _resource: &str, token: &Token) -> bool {
        self.check == EtcdCheck::Weak && rules::weak(token, self.client.revision()).is_ok()
    }

    fn describe(&self) -> String {
        match &self.check {
            EtcdCheck::Weak => format!("etcd {} weak", self.client.endpoint()),
            EtcdCheck::Strong { lock_prefix } => {
                format!("etcd {} strong, locks under {lock_prefix:?}", self.client.endpoint())
            }
        }
    }
}
