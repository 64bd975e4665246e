//! What one guest instance may hold, and what all of a validator's instances may
//! hold together.
//!
//! wasmtime's stock `StoreLimits` caps each linear memory on its own, so a guest
//! that declares many small memories, or grows its tables, escapes a per-memory
//! cap (seen: a gateway at 1 GiB RSS while answering normally). This limiter counts
//! every byte an instance holds, linear memories and table elements alike, against
//! one budget per instance, and against one budget shared by the validator's pool.
//! It also caps how many memories and tables an instance may create at all.

use super::Limits;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use wasmtime::ResourceLimiter;

/// Bytes one table element costs the host (a pointer).
const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();

/// A limit was hit; carried through wasmtime as the error of the grow or the
/// instantiation, and reported as a guest fault naming the limit.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct LimitHit(pub String);

/// The per-store state: the guest gets nothing else from the host.
pub(crate) struct State {
    budget: Budget,
}

impl State {
    pub(crate) fn new(limits: &Limits, pool: Arc<AtomicUsize>) -> State {
        State { budget: Budget { limits: limits.clone(), held: 0, pool } }
    }

    pub(crate) fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.budget
    }
}

struct Budget {
    limits: Limits,
    /// Bytes this instance holds (memories and tables).
    held: usize,
    /// Bytes every live instance of the validator holds.
    pool: Arc<AtomicUsize>,
}

impl Budget {
    fn take(&mut self, bytes: usize, what: &str) -> wasmtime::Result<bool> {
        let limits = &self.limits;
        if self.held + bytes > limits.memory_bytes {
            return Err(LimitHit(format!(
                "exceeded its memory limit of {} bytes per instance ({what})",
                limits.memory_bytes
            ))
            .into());
        }
        let before = self.pool.fetch_add(bytes, Ordering::Relaxed);
        if before + bytes > limits.pool_memory_bytes {
            self.pool.fetch_sub(bytes, Ordering::Relaxed);
            return Err(LimitHit(format!(
                "the validator's instances together reached their memory limit of {} bytes ({what})",
                limits.pool_memory_bytes
            ))
            .into());
        }
        self.held += bytes;
        Ok(true)
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        self.pool.fetch_sub(self.held, Ordering::Relaxed);
    }
}

impl ResourceLimiter for Budget {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.take(desired.saturating_sub(current), "linear memory")
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limits.table_elements {
            return Err(
                LimitHit(format!("exceeded its limit of {} elements per table", self.limits.table_elements)).into()
            );
        }
        self.take(desired.saturating_sub(current).saturating_mul(TABLE_ELEMENT_BYTES), "table elements")
    }

    fn instances(&self) -> usize {
        // One component instance holds a few core instances (the guest and
        // wit-component's shims); nothing more is ever needed.
        16
    }

    fn tables(&self) -> usize {
        self.limits.tables
    }

    fn memories(&self) -> usize {
        self.limits.memories
    }
}
