//! Fencekeeper's deterministic simulator: lock holders, fence instances and a store
//! on a virtual clock, in one thread, every draw from one seed, so that a run replays
//! exactly from its seed and request count and its trace's digest says so.
//!
//! * [`rng`]: the one source of chance (splitmix64, written out here);
//! * [`queue`]: the virtual clock and the event queue, ordered by (time, sequence);
//! * [`trace`]: a line per event and the trace's digest (FNV-1a 64);
//! * [`fence`]: a fence instance behind the [`fence::Fence`] trait: today the
//!   library's admit logic and the ordering gate's rule ([`fence::GuardFence`]);
//! * [`conditional`]: an instance with conditional writes: the library's admit and
//!   the engine's conditional-write machine ([`conditional::ConditionalFence`]);
//! * [`etcd`]: marks in a simulated etcd;
//! * [`kv`]: that etcd's key space as its JSON API serves the Envoy filter;
//! * [`admits`]: an instance's admits, the library's async admit polled by hand over
//!   the simulated etcd, or its blocking admit over a memory or file store;
//! * [`filter`]: an instance that is the Envoy filter's `.wasm` in the in-process
//!   proxy-wasm host;
//! * [`world`]: the lock service, the holders, the store, the faults, and the history
//!   the shared checker (`fencekeeper-check`, the torture run's rules) judges;
//! * [`config`]: a run's shape and timing, and the faults and pauses it skips;
//! * [`shrink`]: a failing run cut down to a smaller config that still fails.

pub mod admits;
pub mod conditional;
pub mod config;
pub mod etcd;
pub mod fence;
pub mod filter;
pub mod kv;
pub mod queue;
pub mod rng;
pub mod shrink;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;
pub mod trace;
pub mod world;

pub use config::Config;
pub use world::{run, Outcome, SimError};
