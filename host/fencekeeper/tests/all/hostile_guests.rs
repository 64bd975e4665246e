//! Hand-written hostile guests: core modules in WAT, made components against
//! wit/fencekeeper.wit at test time, each built to escape a limit that a Rust guest
//! cannot easily reach (many linear memories, growing tables, memory outside the
//! allocator). Each test asserts the host's answer and its resource bound: the
//! budget counts every byte an instance holds, per instance and for the whole pool.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::wat_guest::{component, encode};
use fencekeeper::validator::{Conformance, GuestSource, Limits, LoadError, Validator};
use fencekeeper::{Class, Guard, MemoryStore, Mode, Policy};
use std::path::Path;
use std::sync::Arc;

fn load(bytes: &[u8], limits: Limits) -> Result<Validator, LoadError> {
    // These guests answer nothing right; what is tested is what they hold.
    Validator::load_with(GuestSource::Bytes(bytes), Policy::default(), limits, Conformance::Skip)
}

fn start_error(bytes: &[u8], limits: Limits) -> String {
    let err = load(bytes, limits).unwrap_err();
    assert!(matches!(err, LoadError::Start { .. }), "{err:?}");
    let text = err.to_string();
    assert!(!text.contains('\n'), "one line: {text}");
    text
}

#[test]
fn the_template_guest_loads_so_the_failures_below_are_the_limits() {
    let v = load(&component("", ""), Limits::default()).unwrap();
    assert_eq!(v.describe().unwrap().name.as_str(), "hostile");
    assert!(v.pool_bytes() >= 64 << 10, "one page of memory is counted: {}", v.pool_bytes());
}

#[test]
fn a_guest_built_against_the_frozen_0_2_0_world_is_refused_with_the_reason() {
    let frozen = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit/frozen/0.2.0");
    let err = load(&encode(&frozen, "0.2.0", "", ""), Limits::default()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LoadError::OldWorld { version: "0.2.0", .. }), "{err:?}");
    assert!(
        text.contains("no `decide-short`") && text.contains("rebuild it against fencekeeper:validator@0.3.0"),
        "{text}"
    );
}

#[test]
fn a_guest_with_many_memories_fails_to_load() {
    let many: String = (0..64).map(|i| format!("(memory $m{i} 16)\n")).collect();
    let bytes = component(&many, "");
    // By count: one memory is all a guest needs.
    let text = start_error(&bytes, Limits::default());
    assert!(text.contains("memor"), "{text}");
    // By bytes, when the count is raised: 64 x 1 MiB is past the instance's budget.
    let text = start_error(&bytes, Limits { memories: 100, ..Limits::default() });
    assert!(text.contains("memory limit of 16777216 bytes per instance"), "{text}");
}

#[test]
fn a_guest_with_many_tables_fails_to_load() {
    let many: String = (0..16).map(|i| format!("(table $t{i} 1 funcref)\n")).collect();
    let text = start_error(&component(&many, ""), Limits::default());
    assert!(text.contains("table"), "{text}");
}

#[test]
fn a_guest_that_grows_a_table_is_stopped_and_refused_in_both_modes() {
    let grow = "(drop (table.grow $t (ref.null func) (i32.const 4000)))";
    let bytes = component("(table $t 1 funcref)", grow);
    for mode in [Mode::Correctness, Mode::Efficiency] {
        let policy = Policy { mode, strict: false };
        // Without the verdict cache: every request must reach the guest and grow it.
        let v = Arc::new(
            Validator::load_with(GuestSource::Bytes(&bytes), policy, Limits::default(), Conformance::Skip)
                .unwrap()
                .without_verdict_cache(),
        );
        let g = Guard::new(v.clone(), Arc::new(MemoryStore::new()));
        // 4,000 elements fit in the 10,000-element budget twice; the third grow
        // traps, and the instance is thrown away.
        let mut classes = Vec::new();
        for _ in 0..6 {
            let d = g.admit("r", Some("5"));
            assert!(!d.admitted(), "{mode:?}");
            classes.push(d.class());
            assert!(v.pool_bytes() <= Limits::default().pool_memory_bytes);
        }
        let faults: Vec<_> = classes.iter().filter(|c| **c == Class::Undecided).collect();
        assert!(!faults.is_empty(), "{classes:?}");
        let d = g.admit("r", Some("5"));
        let reason = d.reason("r");
        assert!(
            d.class() != Class::Undecided || reason.contains("elements per table") || reason.contains("broke"),
            "{reason}"
        );
    }
}

#[test]
fn the_pool_budget_bounds_memory_across_every_instance() {
    // Each decide grows memory by one page (64 KiB) and never gives it back.
    let grow = "(drop (memory.grow (i32.const 1)))";
    let bytes = component("", grow);
    let limits = Limits { memory_bytes: 1 << 20, pool_memory_bytes: 2 << 20, ..Limits::default() };
    let v = Arc::new(load(&bytes, limits.clone()).unwrap().without_verdict_cache());
    let g = Arc::new(Guard::new(v.clone(), Arc::new(MemoryStore::new())));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (g, v) = (g.clone(), v.clone());
            let cap = limits.pool_memory_bytes;
            std::thread::spawn(move || {
                let mut faults = 0;
                for _ in 0..100 {
                    let d = g.admit("r", Some("5"));
                    assert!(!d.admitted());
                    faults += usize::from(d.class() == Class::Undecided && d.reason("r").contains("memory limit"));
                    assert!(v.pool_bytes() <= cap, "pool holds {} > {cap}", v.pool_bytes());
                }
                faults
            })
        })
        .collect();
    let faults: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(faults > 0, "800 grows of 64 KiB must hit a 1 MiB instance budget");
    assert!(v.pool_bytes() <= limits.pool_memory_bytes);
}
