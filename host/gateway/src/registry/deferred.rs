//! The mark store as the guard sees it when the in-flight registry is on: a write
//! whose token equals the mark is not confirmed with etcd by the store, because the
//! registry's Txn (`flights::pass_txn`) compares the mark with that token before the
//! write may go, and refuses it stale with the higher mark when it moved. One etcd
//! round trip for a holder writing again, where the store's confirm and then the
//! registry's pass made two.
//!
//! Everything else is the store's: reads, advances (a compare-and-swap), and the
//! reads before a refusal. The guard may still admit on a copy older than etcd's
//! mark; the pass is what stands between that admit and the store, so this wrapper
//! goes only with a registry every admitted write passes (`serve` wires both or
//! neither).

use fencekeeper::store::{AwaitableMarks, Pending, Read};
use fencekeeper::{MarkStore, StoreError, Swap, Token};
use std::sync::Arc;

/// A mark store whose equal-token confirms the registry's pass makes.
pub struct Deferred {
    inner: Arc<dyn MarkStore + Send + Sync>,
}

impl Deferred {
    /// `inner`, its confirms left to the registry.
    pub fn new(inner: Arc<dyn MarkStore + Send + Sync>) -> Deferred {
        Deferred { inner }
    }
}

impl MarkStore for Deferred {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        self.inner.get(resource)
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        self.inner.compare_and_swap(resource, expected, new)
    }

    fn floor(&self) -> Result<Option<Token>, StoreError> {
        self.inner.floor()
    }

    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        self.inner.list()
    }

    fn read(&self, resource: &str) -> Result<Read, StoreError> {
        self.inner.read(resource)
    }

    /// The registry's pass compares the mark with the token: so is it confirmed.
    fn confirm(&self, _resource: &str, _mark: &Token) -> Result<Swap, StoreError> {
        Ok(Swap::Swapped)
    }

    fn confirm_equal_admits(&self) -> bool {
        self.inner.confirm_equal_admits()
    }

    fn awaitable(&self) -> Option<&dyn AwaitableMarks> {
        self.inner.awaitable().map(|_| self as &dyn AwaitableMarks)
    }
}

impl AwaitableMarks for Deferred {
    fn read<'a>(&'a self, resource: &'a str) -> Pending<'a, Read> {
        match self.inner.awaitable() {
            Some(a) => a.read(resource),
            None => Box::pin(std::future::ready(self.inner.read(resource))),
        }
    }

    fn get<'a>(&'a self, resource: &'a str) -> Pending<'a, Option<Token>> {
        match self.inner.awaitable() {
            Some(a) => a.get(resource),
            None => Box::pin(std::future::ready(self.inner.get(resource))),
        }
    }

    fn compare_and_swap<'a>(
        &'a self,
        resource: &'a str,
        expected: Option<&'a Token>,
        new: &'a Token,
    ) -> Pending<'a, Swap> {
        match self.inner.awaitable() {
            Some(a) => a.compare_and_swap(resource, expected, new),
            None => Box::pin(std::future::ready(self.inner.compare_and_swap(resource, expected, new))),
        }
    }

    fn confirm<'a>(&'a self, _resource: &'a str, _mark: &'a Token) -> Pending<'a, Swap> {
        Box::pin(std::future::ready(Ok(Swap::Swapped)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper::MemoryStore;

    #[test]
    fn only_the_equal_token_confirm_is_left_to_the_pass() {
        let inner: Arc<dyn MarkStore + Send + Sync> = Arc::new(MemoryStore::default());
        let t = |s: &str| s.parse::<Token>().unwrap();
        assert_eq!(inner.compare_and_swap("r", None, &t("5")).unwrap(), Swap::Swapped);
        let d = Deferred::new(inner.clone());
        assert_eq!(MarkStore::confirm(&d, "r", &t("4")).unwrap(), Swap::Swapped, "the pass checks it");
        assert_eq!(MarkStore::get(&d, "r").unwrap(), Some(t("5")));
        let swap = |expected: &str| MarkStore::compare_and_swap(&d, "r", Some(&t(expected)), &t("6")).unwrap();
        assert!(matches!(swap("4"), Swap::Conflict(Some(_))));
        assert_eq!(swap("5"), Swap::Swapped);
        assert_eq!(inner.get("r").unwrap(), Some(t("6")), "advances reach the store");
    }
}
