//! A storage engine that keeps its fencing marks inside its own transactions.
//!
//! The engine below is a toy (a map behind a mutex, a write transaction that
//! works on a copy and swaps it in on commit), but the shape is the one a real
//! engine uses: implement [`MarkStore`] on the open transaction and call
//! [`Guard::admit_in`] with it. The mark then commits with the write it admitted,
//! or rolls back with it: there is no window where one is durable and the other
//! is not, and no second store to keep in step.
//!
//! Run: `cargo run --release -p fencekeeper --example engine_transaction`

use fencekeeper::{Guard, MarkStore, MemoryStore, Policy, StoreError, Swap, Token, Validator};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Everything the engine stores: rows and, beside them, the fencing marks.
#[derive(Clone, Default)]
struct Tables {
    rows: BTreeMap<String, String>,
    marks: BTreeMap<String, Token>,
}

/// The engine: one writer at a time, readers see committed state.
#[derive(Default)]
struct Engine {
    committed: Mutex<Tables>,
}

/// An open write transaction: holds the engine's write lock and a working copy.
struct Txn<'e> {
    lock: MutexGuard<'e, Tables>,
    working: RefCell<Tables>,
}

impl Engine {
    fn begin(&self) -> Txn<'_> {
        let lock = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        let working = RefCell::new(lock.clone());
        Txn { lock, working }
    }

    fn row(&self, key: &str) -> Option<String> {
        self.committed.lock().unwrap_or_else(|p| p.into_inner()).rows.get(key).cloned()
    }
}

impl Txn<'_> {
    fn put(&self, key: &str, value: &str) {
        self.working.borrow_mut().rows.insert(key.to_owned(), value.to_owned());
    }

    fn commit(mut self) {
        *self.lock = self.working.into_inner();
    }
    // Dropping a Txn without commit() is a rollback: the working copy is discarded.
}

/// The marks as the open transaction sees them. The transaction already excludes
/// other writers, so compare-and-swap is a plain compare and write.
impl MarkStore for Txn<'_> {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        Ok(self.working.borrow().marks.get(resource).copied())
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        let mut working = self.working.borrow_mut();
        let current = working.marks.get(resource).copied();
        if current.as_ref() != expected {
            return Ok(Swap::Conflict(current));
        }
        working.marks.insert(resource.to_owned(), *new);
        Ok(Swap::Swapped)
    }
}

/// A fenced write: admitted and applied in one transaction, or refused with a reason.
fn write(engine: &Engine, fencing: &Guard, key: &str, value: &str, token: &str) -> Result<(), String> {
    let txn = engine.begin();
    let decision = fencing.admit_in(&txn, key, Some(token));
    if !decision.admitted() {
        return Err(decision.reason(key)); // txn dropped: rolled back
    }
    if value.len() > 64 {
        return Err(format!("value for {key:?} too large")); // rolled back, mark included
    }
    txn.put(key, value);
    txn.commit();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The bundled WebAssembly validator decides; the guard's own store goes unused,
    // because every admit below names the transaction as its store.
    let validator = Validator::bundled(Policy::default())?;
    let fencing = Guard::new(Arc::new(validator), Arc::new(MemoryStore::new()));
    let engine = Engine::default();

    write(&engine, &fencing, "invoice/7", "draft by A", "33")?;
    println!("A (token 33) wrote invoice/7");
    // A's lease expires while it is paused; B acquires the lock with token 34.
    write(&engine, &fencing, "invoice/7", "final by B", "34")?;
    println!("B (token 34) wrote invoice/7");
    // A wakes up and writes with its old token.
    let stale = write(&engine, &fencing, "invoice/7", "late draft by A", "33");
    println!("A (token 33) again: {}", stale.as_ref().err().map_or("ADMITTED (wrong!)", String::as_str));
    assert!(stale.is_err(), "a stale write must be refused");
    assert_eq!(engine.row("invoice/7").as_deref(), Some("final by B"));

    // An admitted write that fails later rolls its mark back with it: token 35 was
    // never committed, so the resource's mark is still 34.
    let failed = write(&engine, &fencing, "invoice/7", &"x".repeat(100), "35");
    println!(
        "C (token 35) with an oversized value: {}",
        failed.as_ref().err().map_or("ADMITTED (wrong!)", String::as_str)
    );
    assert!(failed.is_err(), "an oversized value must be refused");
    let mark = engine.begin().get("invoice/7")?.map(|t| t.to_string());
    println!("mark on invoice/7 after the rollback: {}", mark.as_deref().unwrap_or("none"));
    assert_eq!(mark.as_deref(), Some("34"));
    println!("stale write refused; marks commit and roll back with the data");
    Ok(())
}
