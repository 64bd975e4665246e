//! One clock for every process of a run: CLOCK_MONOTONIC in nanoseconds. The runner,
//! its client threads, the client processes and the upstream store all stamp with it,
//! so "A ended before B began" compares stamps taken in different processes.

/// Nanoseconds on CLOCK_MONOTONIC (system-wide, never set back).
pub fn now() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}
