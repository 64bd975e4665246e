//! Fencekeeper's host library: give a storage engine fencing.
//!
//! A lock service hands every acquisition an increasing fencing token. A lease can
//! expire while its holder is paused, so two holders can believe they own a lock;
//! only the resource can stop the stale one, by remembering the highest token it has
//! seen and refusing anything lower. This crate is that check for a resource that
//! embeds it: a [`Guard`] runs the atomic read -> decide -> compare-and-swap loop
//! against a [`MarkStore`], asking a [`Decider`] (by default the bundled WebAssembly
//! validator) for each verdict.
//!
//! ```no_run
//! use fencekeeper::{FileStore, Guard, Policy, Validator};
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let validator = Validator::bundled(Policy::default())?; // the wasm guest, sandboxed
//! let store = FileStore::open("marks.redb")?; // durable: fsync'd before an advance returns
//! let guard = Guard::new(Arc::new(validator), Arc::new(store));
//! let decision = guard.admit("orders/2026-11.csv", Some("34"));
//! if decision.admitted() {
//!     // apply the write
//! } else {
//!     eprintln!("{}", decision.reason("orders/2026-11.csv"));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//! * [`validator`]: the WebAssembly guest under wasmtime, with limits.
//! * [`decider`]: who decides: the wasm validator or the native core.
//! * [`verify`]: the host's check of every verdict against what it knows.
//! * [`guard`]: the compare-and-swap loop, modes, counters.
//! * [`text`]: a guest's text, capped and escaped before it is printed anywhere.
//! * [`conformance`]: the conformance vectors, run against any decider.
//! * [`store`]: where marks live: memory, a durable file, or your own transaction.
//! * [`provenance`]: a lock service vouching for a token before it advances a mark.
//! * [`chain`]: conditional writes: the version chain that lets a store's own
//!   `If-Match` enforce the order the fence decided.
//! * [`audit`]: the audit record of a mark's change, and a file to append it to.
//! * `zookeeper` (feature `zookeeper`): a small ZooKeeper client, for provenance
//!   and the command line's lock.
#![forbid(unsafe_code)]

pub mod audit;
pub mod chain;
pub mod conformance;
pub mod decider;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod guard;
pub mod provenance;
pub mod store;
pub mod text;
pub mod validator;
pub mod verify;
mod wait;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use decider::{DecideError, Decider, NativeDecider};
pub use fencekeeper_core::{Class, Mode, Policy, Token};
pub use guard::{Advance, Decision, Guard, Undecided};
pub use provenance::{Origin, Provenance, ProvenanceError};
pub use store::{FileStore, MarkStore, MemoryStore, StoreError, Swap};
pub use text::GuestText;
pub use validator::{bundled_component, Conformance, GuestInfo, GuestSource, Limits, LoadError, Validator};
pub use verify::Breach;

/// A verdict as the host holds it: a malformed verdict carries the validator's own
/// reason, made safe to print.
pub type Verdict = fencekeeper_core::Verdict<GuestText>;
