//! One admit through the C ABI against the same admit as a Rust library call, in one
//! process: the boundary's own cost (pointer checks, the panic boundary, the outcome
//! struct). scripts/bench-capi.sh runs this beside the C and Python callers and
//! writes the table of BENCHMARKS.md ("Admit through the C ABI").
//!
//! Prints `PATH SCENARIO MEDIAN_NS` lines: the median over rounds of the calling
//! thread's CPU time per admit. Repeating: the holder writing again with the mark's
//! token (a read, no write). Advancing: a higher token each time (a swap).

#![allow(clippy::unwrap_used, unsafe_code)]

use fencekeeper::{Guard, MemoryStore, Policy, Validator};
use fencekeeper_capi::*;
use std::hint::black_box;
use std::sync::Arc;

const ROUNDS: usize = 15;
const PER_ROUND: u64 = 20_000;
const RESOURCE: &str = "orders/2026.csv";

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

fn median(mut round: impl FnMut(u64)) -> f64 {
    let mut times: Vec<f64> = (0..ROUNDS as u64)
        .map(|r| {
            let start = thread_cpu_ns();
            round(r);
            (thread_cpu_ns() - start) as f64 / PER_ROUND as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[ROUNDS / 2]
}

/// Tokens for round `r`: the same one (repeating), or rising across rounds (advancing).
fn tokens(advancing: bool, r: u64) -> impl Iterator<Item = String> {
    (0..PER_ROUND).map(move |i| if advancing { (1_000_000 + r * PER_ROUND + i).to_string() } else { "34".to_owned() })
}

fn main() {
    for (scenario, advancing) in [("repeating", false), ("advancing", true)] {
        let validator = Validator::bundled(Policy::default()).unwrap();
        let guard = Guard::new(Arc::new(validator), Arc::new(MemoryStore::new()));
        assert!(guard.admit(RESOURCE, Some("34")).admitted());
        let texts: Vec<Vec<String>> = (0..ROUNDS as u64).map(|r| tokens(advancing, r).collect()).collect();
        let library = median(|r| {
            for t in &texts[r as usize] {
                black_box(guard.admit(black_box(RESOURCE), Some(t.as_str())));
            }
        });

        let mut handle = std::ptr::null_mut();
        // SAFETY: NULL options are the defaults; room for the handle.
        assert_eq!(unsafe { fencekeeper_guard_open(std::ptr::null(), &mut handle) }, FENCEKEEPER_OK);
        let mut outcome = std::mem::MaybeUninit::<fencekeeper_outcome>::uninit();
        let admit = |t: &str, o: *mut fencekeeper_outcome| {
            // SAFETY: an open guard, the strings' bytes, room for an outcome.
            unsafe { fencekeeper_admit(handle, RESOURCE.as_ptr(), RESOURCE.len(), t.as_ptr(), t.len(), o) }
        };
        assert_eq!(admit("34", outcome.as_mut_ptr()), FENCEKEEPER_OK);
        let abi = median(|r| {
            for t in &texts[r as usize] {
                black_box(admit(black_box(t), outcome.as_mut_ptr()));
            }
        });
        // SAFETY: written by the last admit.
        assert!(unsafe { outcome.assume_init_ref() }.admitted);
        // SAFETY: opened above, used by nobody else.
        unsafe { fencekeeper_guard_close(handle) };
        println!("rust-library {scenario} {library:.1}");
        println!("rust-abi {scenario} {abi:.1}");
    }
}
