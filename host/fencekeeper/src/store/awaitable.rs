//! A store's admit calls as futures, for a host on an asynchronous runtime (the
//! gateway) that would rather await a remote store than block a thread on it.
//!
//! A store that waits on the network (etcd) answers each call on another thread of
//! its own. Called synchronously, the guard runs on a thread that may block (a
//! runtime's blocking pool), which hands the call to the store's thread and waits:
//! on a small machine every such hand-over is a thread woken from idle, and they
//! cost more than the round trip's own work. Awaited, the call goes from the
//! caller's task to the store's connection and back, and the blocking pool is not
//! involved. The calls mean exactly what [`MarkStore`]'s do.

#[cfg(doc)]
use super::MarkStore;
use super::{Read, StoreError, Swap};
use fencekeeper_core::Token;
use std::future::Future;
use std::pin::Pin;

/// One of the calls below, in flight.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The calls of [`MarkStore`] an admit makes, awaitable ([`MarkStore::awaitable`]).
/// Each means what the [`MarkStore`] method of the same name means, on the same
/// store; the futures need a tokio runtime with its timer enabled (a call's timeout).
pub trait AwaitableMarks: Send + Sync {
    /// [`MarkStore::read`].
    fn read<'a>(&'a self, resource: &'a str) -> Pending<'a, Read>;
    /// [`MarkStore::get`].
    fn get<'a>(&'a self, resource: &'a str) -> Pending<'a, Option<Token>>;
    /// [`MarkStore::compare_and_swap`].
    fn compare_and_swap<'a>(
        &'a self,
        resource: &'a str,
        expected: Option<&'a Token>,
        new: &'a Token,
    ) -> Pending<'a, Swap>;
    /// [`MarkStore::confirm`].
    fn confirm<'a>(&'a self, resource: &'a str, mark: &'a Token) -> Pending<'a, Swap>;
}
