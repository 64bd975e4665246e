//! A small ZooKeeper client over its binary protocol (jute over TCP): enough for the
//! lock recipe (`fencekeeper lock --zookeeper`) and for provenance
//! ([`ZooKeeperProvenance`](crate::provenance::ZooKeeperProvenance)), one client for
//! both. Feature `zookeeper`; no dependency beyond std.
//!
//! * [`session`]: one session over one connection, one request in flight at a time.
//! * [`jute`]: the encoding, and a reader that treats every reply as hostile.
//! * [`lock_node`]: the lock recipe's node names, who holds, and the czxid token.

pub mod jute;
pub mod lock_node;
pub mod session;

pub use session::Session;

/// Why ZooKeeper gave no usable answer. Each carries its one-line message.
#[derive(Debug, thiserror::Error)]
pub enum ZooKeeperError {
    /// The address is not `HOST:PORT`, or nothing accepts a connection there.
    #[error("{0}")]
    Connect(String),
    /// The connection is gone: ZooKeeper closed it (as it does an expired session's)
    /// or a read or write failed. The session cannot be used again.
    #[error("{0}")]
    Lost(String),
    /// ZooKeeper did not answer in time.
    #[error("{0}")]
    Timeout(String),
    /// ZooKeeper's answer is not one that was asked for: short, too long, a list or a
    /// name beyond its bound, a reply to another request.
    #[error("{0}")]
    Malformed(String),
    /// ZooKeeper refused the session or answered an error code.
    #[error("{0}")]
    Refused(String),
}
