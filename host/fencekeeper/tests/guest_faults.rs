//! The validator component under fault: the fault-injection guest
//! (guest/artifacts/test-guests/guest_faults.wasm, built from guest/component with
//! the `faults` feature) traps, loops, grows memory or lies about the mark on
//! reserved resource keys. The host's limits stop each fault, the same Validator
//! keeps serving, correctness mode refuses, efficiency mode passes and counts, and
//! no guest can lower a mark. Also: what loading a wrong guest says.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::validator::{guest_path, GuestSource, Limits, LoadError, Validator};
use fencekeeper::{Class, DecideError, Decider, Guard, MemoryStore, Mode, Policy, Token};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous: the limits stop each fault in milliseconds; this only catches a hang.
const BOUND: Duration = Duration::from_secs(10);

fn policy(mode: Mode) -> Policy {
    Policy { mode, strict: false }
}

fn fault_guest(mode: Mode) -> Arc<Validator> {
    let path = guest_path("test-guests/guest_faults.wasm");
    Arc::new(Validator::load(GuestSource::Path(&path), policy(mode), Limits::default()).expect("fault guest loads"))
}

fn guard(validator: &Arc<Validator>) -> Guard {
    Guard::new(validator.clone(), Arc::new(MemoryStore::new()))
}

fn mark(g: &Guard, resource: &str) -> Option<String> {
    g.mark(resource).expect("memory store").map(|t| t.to_string())
}

#[test]
fn bundled_guest_instantiates_with_an_empty_linker_and_describes_itself() {
    // Loading instantiates the component with an empty linker: it imports nothing.
    let v = Validator::bundled(Policy::default()).expect("bundled guest loads");
    let info = v.describe().expect("describe answers");
    assert_eq!(info.name, "fencekeeper-validator");
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    assert!(info.token_syntax.contains("u64") && !info.token_syntax.contains('\n'), "{info:?}");
    assert_eq!(v.parse("007.1042").unwrap(), Ok(Token::parse("7.1042").unwrap()));
    assert!(v.parse("7.x").unwrap().unwrap_err().contains("component 2"));
}

#[test]
fn stale_token_is_refused_by_the_wasm_guest_through_the_guard() {
    let g = guard(&Arc::new(Validator::bundled(Policy::default()).unwrap()));
    assert!(g.admit("file", Some("33")).admitted());
    assert!(g.admit("file", Some("34")).admitted());
    let d = g.admit("file", Some("33"));
    assert_eq!(d.class(), Class::Stale);
    assert_eq!(d.action.token.map(|t| t.to_string()).as_deref(), Some("34"));
    assert!(g.admit("file", Some("1.2")).class() == Class::Malformed);
    assert_eq!(mark(&g, "file").as_deref(), Some("34"));
}

/// Run one faulting admit in correctness mode, then show the same validator serves.
fn fault_is_contained(resource: &str, expected_reason: &str) {
    let v = fault_guest(Mode::Correctness);
    let g = guard(&v);
    let started = Instant::now();
    let d = g.admit(resource, Some("5"));
    assert!(started.elapsed() < BOUND, "{resource} took {:?}", started.elapsed());
    assert!(!d.admitted(), "correctness mode must refuse an undecided request");
    assert_eq!(d.class(), Class::Undecided);
    assert_eq!(d.class().http_status(), 503);
    let reason = d.reason(resource);
    assert!(reason.contains(expected_reason) && !reason.contains('\n'), "reason: {reason}");
    assert_eq!(mark(&g, resource), None, "a fault must not set a mark");
    // The faulted instance was thrown away; the next calls get a fresh one.
    for token in ["7", "8"] {
        assert!(g.admit("normal", Some(token)).admitted(), "validator stopped serving after {resource}");
    }
    assert_eq!(g.admit("normal", Some("6")).class(), Class::Stale);
}

#[test]
fn trapping_guest_is_refused_in_correctness_mode_and_the_validator_keeps_serving() {
    fault_is_contained("fault/trap", "unreachable");
}

#[test]
fn endless_loop_is_stopped_by_the_fuel_budget() {
    fault_is_contained("fault/loop", "ran out of fuel");
}

#[test]
fn unbounded_allocation_is_stopped_by_the_memory_limit() {
    fault_is_contained("fault/grow", "memory limit");
}

#[test]
fn efficiency_mode_passes_a_faulted_request_and_counts_it() {
    let v = fault_guest(Mode::Efficiency);
    let g = guard(&v);
    for (i, resource) in ["fault/trap", "fault/loop", "fault/grow"].into_iter().enumerate() {
        let d = g.admit(resource, Some("5"));
        assert!(d.admitted(), "efficiency mode fails open on {resource}");
        assert_eq!(d.class(), Class::Undecided);
        assert_eq!(g.counters().failed_open(), i as u64 + 1);
    }
    // Stale tokens are still refused in efficiency mode, and nothing counts as failed open.
    assert!(g.admit("normal", Some("9")).admitted());
    assert_eq!(g.admit("normal", Some("8")).class(), Class::Stale);
    assert_eq!(g.counters().failed_open(), 3);
}

#[test]
fn guest_that_lowers_the_mark_is_never_believed() {
    for mode in [Mode::Correctness, Mode::Efficiency] {
        let g = guard(&fault_guest(mode));
        assert!(g.admit("fault/lower", Some("34")).admitted());
        // The guest admits 33 as "advancing"; the guard checks and refuses to store it.
        let d = g.admit("fault/lower", Some("33"));
        assert_eq!(d.class(), Class::Undecided, "{mode:?}");
        assert!(d.reason("fault/lower").contains("broke the contract"), "{}", d.reason("fault/lower"));
        assert_eq!(d.admitted(), mode == Mode::Efficiency);
        assert_eq!(mark(&g, "fault/lower").as_deref(), Some("34"), "the mark must never be lowered ({mode:?})");
    }
}

#[test]
fn guest_returning_a_token_outside_the_contract_is_a_contract_error() {
    let v = fault_guest(Mode::Correctness);
    match v.decide("fault/contract", Some("5"), None) {
        Err(DecideError::Contract(why)) => assert!(why.contains("0 components"), "{why}"),
        other => panic!("expected a contract error, got {other:?}"),
    }
    assert!(v.decide("normal", Some("5"), None).is_ok());
}

#[test]
fn validator_serves_many_threads_at_once() {
    let g = Arc::new(guard(&Arc::new(Validator::bundled(Policy::default()).unwrap())));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let g = g.clone();
            std::thread::spawn(move || {
                for i in 1..=200u64 {
                    assert!(g.admit(&format!("r{t}"), Some(&i.to_string())).admitted());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    for t in 0..8 {
        assert_eq!(mark(&g, &format!("r{t}")).as_deref(), Some("200"));
    }
}

#[test]
fn default_fuel_allows_about_a_hundred_decides() {
    let v = Validator::bundled(Policy::default()).unwrap();
    let per_call = v.fuel_per_decide().unwrap();
    let budget = Limits::default().fuel;
    assert!(per_call * 50 <= budget && per_call * 500 >= budget, "decide uses {per_call} fuel, budget {budget}");
}

fn load_error(bytes: &[u8]) -> String {
    let err = Validator::load(GuestSource::Bytes(bytes), Policy::default(), Limits::default()).unwrap_err();
    let text = err.to_string();
    assert!(!text.contains('\n'), "one line: {text}");
    text
}

#[test]
fn garbage_bytes_are_not_webassembly() {
    assert!(load_error(b"this is not wasm").contains("not WebAssembly"));
}

#[test]
fn core_module_is_refused_as_not_a_component() {
    assert!(load_error(b"\0asm\x01\0\0\0").contains("core WebAssembly module, not a component"));
}

#[test]
fn component_with_an_import_is_refused_naming_the_import() {
    let bytes = wat::parse_str(r#"(component (import "host-clock" (func)))"#).unwrap();
    let text = load_error(&bytes);
    assert!(text.contains("imports \"host-clock\"") && text.contains("must import nothing"), "{text}");
}

#[test]
fn component_without_the_world_says_which_export_is_missing() {
    let bytes = wat::parse_str("(component)").unwrap();
    let text = load_error(&bytes);
    assert!(text.contains("does not implement fencekeeper:validator@0.1.0"), "{text}");
    assert!(text.contains("fencekeeper:validator/types@0.1.0"), "{text}");
}

#[test]
fn unreadable_guest_file_names_the_path() {
    let path = std::path::Path::new("/nonexistent/guest.wasm");
    let err = Validator::load(GuestSource::Path(path), Policy::default(), Limits::default()).unwrap_err();
    assert!(matches!(err, LoadError::Read { .. }));
    assert!(err.to_string().contains("/nonexistent/guest.wasm"), "{err}");
}

#[test]
fn memory_limit_below_the_guests_needs_fails_at_load_not_at_the_first_request() {
    let limits = Limits { memory_bytes: 64 << 10, ..Limits::default() };
    let err = Validator::load(GuestSource::Bundled, Policy::default(), limits).unwrap_err();
    assert!(matches!(err, LoadError::Start { .. }), "{err:?}");
    assert!(err.to_string().contains("failed to start") && !err.to_string().contains('\n'), "{err}");
}
