//! The MarkStore contract (`fencekeeper::store::contract`), run against the library's
//! own stores: memory and file here, etcd with a real etcd in
//! tests/tests/all/e2e_gateway_etcd.rs.

#![allow(clippy::unwrap_used)]

use fencekeeper::store::contract;
use fencekeeper::{FileStore, MemoryStore};

#[test]
fn the_memory_store_keeps_the_contract() {
    let store = MemoryStore::new();
    contract::check(&store).unwrap();
    contract::check_concurrent(&store, 8, 400).unwrap();
}

#[test]
fn the_file_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path().join("marks.redb")).unwrap();
    contract::check(&store).unwrap();
    contract::check_concurrent(&store, 8, 100).unwrap();
}

/// A store that lowers a mark when asked to, as the memory store once did: the
/// contract must catch it, or it checks nothing.
#[test]
fn a_store_that_lowers_a_mark_breaks_the_contract() {
    use fencekeeper::{MarkStore, StoreError, Swap, Token};
    use std::collections::HashMap;
    use std::sync::Mutex;
    #[derive(Default)]
    struct Obedient(Mutex<HashMap<String, Token>>);
    impl MarkStore for Obedient {
        fn get(&self, r: &str) -> Result<Option<Token>, StoreError> {
            Ok(self.0.lock().unwrap().get(r).copied())
        }
        fn compare_and_swap(&self, r: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
            let mut marks = self.0.lock().unwrap();
            let current = marks.get(r).copied();
            if current.as_ref() != expected {
                return Ok(Swap::Conflict(current));
            }
            marks.insert(r.to_owned(), *new);
            Ok(Swap::Swapped)
        }
    }
    let e = contract::check(&Obedient::default()).unwrap_err();
    assert!(e.0.contains("must never fall"), "{e}");
}
