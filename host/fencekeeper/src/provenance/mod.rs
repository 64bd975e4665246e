//! Provenance: is a token one the lock service issued? Without the question, any
//! client that can reach the fence can send `fencing-token: 18446744073709551615`,
//! the mark rises to the maximum, and every honest holder is refused from then on.
//!
//! A [`Guard`](crate::Guard) built [`with_provenance`](crate::Guard::with_provenance)
//! asks before a token advances a mark, and only then: a token equal to the mark was
//! vouched for when it became the mark, and stale tokens are refused anyway. A token
//! the lock service does not vouch for is refused as [`Class::Unverified`] (403) in
//! both modes; a lock service that cannot be asked makes the write undecided (503) in
//! both modes, because the check was asked for by what the request carried (a token
//! above the mark), and efficiency mode fails open only when the mark store itself
//! cannot be reached.
//!
//! Implement [`Provenance`] for your lock service. The library has etcd's
//! ([`EtcdProvenance`], feature `etcd`) and ZooKeeper's ([`ZooKeeperProvenance`],
//! feature `zookeeper`: the token is the czxid of the node holding the resource's lock).
//!
//! [`Class::Unverified`]: fencekeeper_core::Class::Unverified

#[cfg(feature = "etcd")]
mod etcd;

#[cfg(feature = "zookeeper")]
mod zookeeper;

#[cfg(feature = "etcd")]
pub use etcd::{EtcdCheck, EtcdProvenance};
#[cfg(feature = "zookeeper")]
pub use zookeeper::ZooKeeperProvenance;

use fencekeeper_core::Token;

/// What the lock service says of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// It issued the token (to the resource's current holder, for checks that ask that).
    Issued,
    /// It did not; why, in one line naming the token (shown to the client and logged).
    Unverified(String),
}

/// The lock service could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ProvenanceError {
    /// It could not be reached, or answered an error.
    #[error("the lock service cannot check the token: {0}")]
    Unavailable(String),
}

/// A lock service that can tell whether it issued a token for a resource.
///
/// Called by the guard for a token that would advance `resource`'s mark, before the
/// mark is swapped; at most once per admit. It must not block forever: bound it with
/// a timeout and answer [`ProvenanceError::Unavailable`].
pub trait Provenance: Send + Sync {
    /// Whether the lock service issued `token` for `resource`.
    fn check(&self, resource: &str, token: &Token) -> Result<Origin, ProvenanceError>;

    /// True when the check is sure, without asking anyone, that the lock service
    /// issued `token` (etcd's weak check: a revision at or below one already seen).
    /// The guard then skips both the check and the read of the exact mark it would
    /// make first. By default, never.
    fn issued_as_far_as_known(&self, _resource: &str, _token: &Token) -> bool {
        false
    }

    /// What the check is, for logs (`etcd http://10.0.0.2:2379 weak`).
    fn describe(&self) -> String;

    /// The check as a future, for a host that awaits the guard
    /// ([`Guard::admit_async`](crate::Guard::admit_async)) rather than block a thread
    /// on the lock service (etcd's). `None` by default: the check blocks.
    fn awaitable(&self) -> Option<&dyn AwaitableProvenance> {
        None
    }
}

/// [`Provenance::check`], awaitable: the same answer, on a tokio runtime with a timer.
pub trait AwaitableProvenance: Send + Sync {
    /// [`Provenance::check`].
    fn check<'a>(
        &'a self,
        resource: &'a str,
        token: &'a Token,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Origin, ProvenanceError>> + Send + 'a>>;
}
