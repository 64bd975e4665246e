//! Conditional writes: the store's own compare-and-swap enforces the order the fence
//! decided, whenever a write arrives. The rules and the record are in
//! `fencekeeper-chain` (shared with the Envoy filter); this module keeps them in a
//! [`ChainStore`] and changes them atomically.

mod store;

pub use fencekeeper_chain::*;
pub use store::{ChainStore, MemoryChains};

use crate::store::StoreError;

/// A resource's chain could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The chain store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored chain failed its check.
    #[error("the version chain of {resource:?} in {store} is damaged: {detail}; it is not trusted")]
    Damaged {
        /// The resource.
        resource: String,
        /// Where the chain is.
        store: String,
        /// What was wrong.
        detail: ChainRecordError,
    },
    /// Too many writers changed the chain at once.
    #[error("gave up after {0} lost compare-and-swap races on the version chain")]
    Contention(usize),
}

/// How many lost races one change of a chain tolerates.
const ROUNDS: usize = 64;

/// Change `resource`'s chain in `store` with `change`, atomically: read, change, and
/// swap in only if nobody changed it meanwhile (else again). Returns what `change`
/// returned; a change that returns an error writes nothing.
pub fn update<T, E>(
    store: &dyn ChainStore,
    resource: &str,
    change: impl FnMut(&mut Chain) -> Result<T, E>,
) -> Result<Result<T, E>, ChainError> {
    update_from(store, resource, None, change).map(|(out, _)| out)
}

/// What [`update_from`] returns: what the change returned, and the record the store
/// holds now (`None`: none).
pub type Updated<T, E> = (Result<T, E>, Option<Vec<u8>>);

/// [`update`], starting from the record the caller last saw of `resource` (`known`:
/// `Some(None)` for none; `None`: not known, read it first), and returning, with what
/// `change` returned, the record the store holds now (for the next change to start
/// from). A caller that keeps each resource's last record saves a read per change
/// while nobody else changes it: the change goes straight to the swap, which compares
/// the whole record, so it succeeds only if the record was current. An outcome that
/// writes nothing (a refusal) is decided on a fresh read, never on a record that may
/// be outdated.
pub fn update_from<T, E>(
    store: &dyn ChainStore,
    resource: &str,
    known: Option<Option<Vec<u8>>>,
    mut change: impl FnMut(&mut Chain) -> Result<T, E>,
) -> Result<Updated<T, E>, ChainError> {
    let (mut raw, mut fresh) = match known {
        Some(raw) => (raw, false),
        None => (store.get(resource)?, true),
    };
    for _ in 0..ROUNDS {
        let mut chain = match &raw {
            Some(bytes) => decode(resource, bytes).map_err(|detail| ChainError::Damaged {
                resource: resource.to_owned(),
                store: store.describe(),
                detail,
            })?,
            None => Chain::new(),
        };
        let before = chain.clone();
        let out = change(&mut chain);
        let unchanged = out.is_err() || chain == before;
        if unchanged && fresh {
            return Ok((out, raw));
        }
        if !unchanged {
            let new = encode(resource, &chain).into_bytes();
            if store.swap(resource, raw.as_deref(), &new)? {
                return Ok((out, Some(new)));
            }
        }
        // Outdated, or lost a race: decide again on the record as it is.
        raw = store.get(resource)?;
        fresh = true;
    }
    Err(ChainError::Contention(ROUNDS))
}

/// `resource`'s chain in `store` (a new one if none is stored).
pub fn read(store: &dyn ChainStore, resource: &str) -> Result<Chain, ChainError> {
    match store.get(resource)? {
        Some(bytes) => decode(resource, &bytes).map_err(|detail| ChainError::Damaged {
            resource: resource.to_owned(),
            store: store.describe(),
            detail,
        }),
        None => Ok(Chain::new()),
    }
}

#[cfg(test)]
mod tests;
