//! The validator component under fault: the fault-injection guest
//! (guest/artifacts/test-guests/guest_faults.wasm, the bundled guest built with the
//! `faults` feature) traps, loops, grows memory, floods its reasons, or lies about
//! its verdicts on reserved inputs (guest/validator/src/faults.rs). The host's
//! limits stop each fault and the same Validator keeps serving; the host checks
//! every verdict, so no lie forwards a write or moves a mark, in either mode. Also:
//! the fuel budget measured against the worst accepted input, over-long tokens, and
//! what loading a wrong guest says.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::validator::{guest_path, Conformance, GuestSource, Limits, LoadError, Validator};
use fencekeeper::{Class, Guard, MemoryStore, Mode, Policy, Token};
use fencekeeper_core::token::MAX_TOKEN_BYTES;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous: the limits stop each fault in milliseconds; this only catches a hang.
const BOUND: Duration = Duration::from_secs(10);

const MODES: [Mode; 2] = [Mode::Correctness, Mode::Efficiency];

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
    assert_eq!(info.name.as_str(), "fencekeeper-validator");
    // The guest's own version (its own workspace), not the host's.
    let manifest = include_str!("../../../../guest/validator/Cargo.toml");
    let version = manifest.lines().find_map(|l| l.strip_prefix("version = ")).expect("the guest's version");
    assert_eq!(info.version.as_str(), version.trim_matches('"'));
    assert!(info.token_syntax.as_str().contains("u64"), "{info:?}");
    assert_eq!(v.parse("007.1042").unwrap(), Ok(Token::parse("7.1042").unwrap()));
    assert!(v.parse("7.x").unwrap().unwrap_err().as_str().contains("component 2"));
}

#[test]
fn stale_token_is_refused_by_the_wasm_guest_through_the_guard() {
    let g = guard(&Arc::new(Validator::bundled(Policy::default()).unwrap()));
    assert!(g.admit("file", Some("33")).admitted());
    assert!(g.admit("file", Some("34")).admitted());
    let d = g.admit("file", Some("33"));
    assert_eq!(d.class(), Class::Stale);
    assert_eq!(d.action.token.map(|t| t.to_string()).as_deref(), Some("34"));
    let arity = g.admit("file", Some("1.2"));
    assert!(arity.class() == Class::Malformed && arity.breach().is_none(), "{:?}", arity.undecided);
    assert_eq!(mark(&g, "file").as_deref(), Some("34"));
}

/// Run one faulting admit, in both modes, then show the same validator serves.
fn fault_is_contained(token: &str, expected_reason: &str) {
    for mode in MODES {
        let v = fault_guest(mode);
        let g = guard(&v);
        let started = Instant::now();
        let d = g.admit("r", Some(token));
        assert!(started.elapsed() < BOUND, "{token} took {:?}", started.elapsed());
        // What a request carries never opens efficiency mode: a guest fault is refused.
        assert!(!d.admitted(), "{mode:?} must refuse a request the guest faulted on");
        assert_eq!(d.class(), Class::Undecided);
        assert_eq!(d.class().http_status(), 503);
        assert!(!d.action.failed_open());
        let reason = d.reason("r");
        assert!(reason.contains(expected_reason) && !reason.contains('\n'), "reason: {reason}");
        assert_eq!(mark(&g, "r"), None, "a fault must not set a mark");
        // The faulted instance was thrown away; the next calls get a fresh one.
        for token in ["7", "8"] {
            assert!(g.admit("normal", Some(token)).admitted(), "validator stopped serving after {token}");
        }
        assert_eq!(g.admit("normal", Some("6")).class(), Class::Stale);
    }
}

#[test]
fn trapping_guest_is_refused_in_both_modes_and_the_validator_keeps_serving() {
    fault_is_contained("fault-trap", "unreachable");
}

#[test]
fn endless_loop_is_stopped_by_the_fuel_budget() {
    fault_is_contained("fault-loop", "ran out of fuel");
}

#[test]
fn unbounded_allocation_is_stopped_by_the_memory_limit() {
    fault_is_contained("fault-grow", "memory limit");
}

/// Seed `resource` with `mark` (through the honest path of the same guest).
fn seeded(mode: Mode, resource: &str, mark_text: &str) -> Guard {
    let g = guard(&fault_guest(mode));
    let store = g.store();
    let m = Token::parse(mark_text).unwrap();
    assert_eq!(store.compare_and_swap(resource, None, &m).unwrap(), fencekeeper::Swap::Swapped);
    g
}

#[test]
fn guest_that_admits_a_token_below_the_mark_is_refused_as_stale() {
    for mode in MODES {
        let g = seeded(mode, "r", "64023.1.0.34");
        let d = g.admit("r", Some("64023.1.0.33"));
        assert_eq!(d.class(), Class::Stale, "{mode:?}: the host proves the token is below the mark");
        assert!(!d.admitted());
        assert_eq!(d.action.token.map(|t| t.to_string()).as_deref(), Some("64023.1.0.34"));
        assert!(d.breach().is_some_and(|b| b.what.contains("below the mark")), "{:?}", d.undecided);
        assert_eq!(mark(&g, "r").as_deref(), Some("64023.1.0.34"), "the mark must never be lowered ({mode:?})");
    }
}

#[test]
fn guest_that_admits_the_mark_it_was_given_for_a_lower_token_is_refused_as_stale() {
    for mode in MODES {
        let g = seeded(mode, "r", "64023.3.0.9");
        let d = g.admit("r", Some("64023.3.0.5"));
        assert_eq!(d.class(), Class::Stale, "{mode:?}");
        assert!(!d.admitted());
        let reason = d.reason("r");
        assert!(reason.contains("stale fencing token 64023.3.0.5") && !reason.contains("admitted"), "{reason}");
        assert!(d.breach().is_some_and(|b| b.what.contains("read the token 64023.3.0.5 as 64023.3.0.9")));
    }
}

#[test]
fn guest_that_raises_the_mark_to_the_maximum_cannot_lock_the_resource() {
    for mode in MODES {
        let g = guard(&fault_guest(mode));
        let d = g.admit("r", Some("64023.2.0.5"));
        assert!(!d.admitted(), "{mode:?}: a lie the host can prove is never forwarded");
        assert_eq!(d.class(), Class::Undecided);
        assert_eq!(mark(&g, "r"), None, "no mark may be stored from a lie");
        assert!(d.breach().is_some());
        assert!(g.admit("r", Some("64023.0.0.6")).admitted(), "honest holders still write");
        assert_eq!(mark(&g, "r").as_deref(), Some("64023.0.0.6"));
    }
}

#[test]
fn guest_that_lies_only_after_many_honest_calls_is_caught_on_the_first_lie() {
    // One thread, so one pooled instance answers every call (its count is per instance).
    let g = guard(&fault_guest(Mode::Efficiency));
    let mut last_admitted = 0;
    for i in 1..=300u64 {
        let d = g.admit("r", Some(&format!("64023.4.0.{i}")));
        if !d.admitted() {
            assert!(d.breach().is_some(), "call {i}: {:?}", d.undecided);
            assert_eq!(d.class(), Class::Undecided);
            break;
        }
        last_admitted = i;
    }
    assert!(last_admitted > 100 && last_admitted < 300, "the guest lied from call {last_admitted}");
    assert_eq!(mark(&g, "r"), Some(format!("64023.4.0.{last_admitted}")), "the lie moved no mark");
}

#[test]
fn guest_answer_outside_the_contract_is_a_breach_refused_in_both_modes() {
    for mode in MODES {
        let g = guard(&fault_guest(mode));
        let d = g.admit("r", Some("64023.5.0.1"));
        assert!(!d.admitted(), "{mode:?}");
        assert!(d.breach().is_some_and(|b| b.what.contains("arity 0")), "{:?}", d.undecided);
        assert_eq!(mark(&g, "r"), None);
    }
}

#[test]
fn guest_whose_two_decides_disagree_is_refused_in_both_modes() {
    // decide-short calls a valid token malformed; decide, asked for the reason,
    // admits it. Neither answer is taken: the host cannot know which one lies.
    for mode in MODES {
        let g = guard(&fault_guest(mode));
        let d = g.admit("r", Some("64023.6.0.1"));
        assert!(!d.admitted(), "{mode:?}");
        assert_eq!(d.class(), Class::Undecided, "{mode:?}: {}", d.reason("r"));
        assert!(d.reason("r").contains("decide-short called the token malformed"), "{}", d.reason("r"));
        assert_eq!(mark(&g, "r"), None, "no mark from a guest that contradicts itself");
        assert!(g.admit("r", Some("64023.0.0.2")).admitted(), "the next instance serves honest holders");
    }
}

#[test]
fn guest_text_is_capped_escaped_and_kept_to_one_line() {
    // Writing megabytes takes the guest more than the default fuel: give it room, so
    // that what is tested is the host's handling of the text.
    let path = guest_path("test-guests/guest_faults.wasm");
    let limits = Limits { fuel: 500_000_000, ..Limits::default() };
    let v = Arc::new(Validator::load(GuestSource::Path(&path), Policy::default(), limits).unwrap());
    let g = guard(&v);
    let d = g.admit("r", Some("fault-reason"));
    assert_eq!(d.class(), Class::Malformed, "a guest's own malformed verdict is a 400: {}", d.reason("r"));
    let reason = d.reason("r");
    assert!(reason.len() < 400, "a 2 MiB reason became {} bytes", reason.len());
    assert!(!reason.chars().any(char::is_control), "{reason:?}");
    assert!(reason.contains("\\u{1b}[2J") && reason.contains("\\u{202e}"), "{reason}");
    let name = v.describe().unwrap().name;
    assert!(!name.as_str().chars().any(char::is_control), "{name:?}");
    assert!(name.as_str().contains("\\u{a}44 passed"), "{name:?}");
}

/// The worst input a client can send the bundled guest, as far as its parser goes:
/// the longest token, with the most components, against a mark of that arity, and
/// the longest text that is still parsed to its end before it is refused.
fn worst_inputs() -> Vec<(String, Option<Token>)> {
    let four = |digits: usize| {
        let part = |n: usize| format!("{}1", "0".repeat(n - 1));
        let each = (digits - 3) / 4;
        format!("{}.{}.{}.{}", part(each), part(each), part(each), part(digits - 3 - 3 * each))
    };
    let mark = Token::parse("1.1.1.0");
    vec![
        (four(MAX_TOKEN_BYTES), mark.ok()),
        (format!("{}1", "0".repeat(MAX_TOKEN_BYTES - 1)), None),
        (format!("{}x", "0".repeat(MAX_TOKEN_BYTES - 1)), None),
        (format!("{}.{}x", "0".repeat(MAX_TOKEN_BYTES / 2), "1".repeat(MAX_TOKEN_BYTES / 2 - 2)), None),
    ]
}

#[test]
fn default_fuel_is_ten_times_the_worst_accepted_input() {
    let v = Validator::bundled(Policy::default()).unwrap();
    let mut worst = 0;
    for (token, mark) in worst_inputs() {
        assert!(token.len() <= MAX_TOKEN_BYTES, "{token}");
        worst = worst.max(v.fuel_per_decide(&token, mark.as_ref()).unwrap());
    }
    let typical = v.fuel_per_decide("34", Token::parse("33").ok().as_ref()).unwrap();
    let budget = Limits::default().fuel;
    assert!(worst > typical * 5, "the worst input ({worst}) must cost more than a typical one ({typical})");
    eprintln!("fuel: typical decide {typical}, worst accepted input {worst}, budget {budget}");
    assert!(budget >= 10 * worst, "budget {budget} < 10 x worst case {worst}");
}

#[test]
fn over_long_tokens_are_malformed_in_both_modes_before_the_guest_is_asked() {
    for mode in MODES {
        let g = guard(&Arc::new(Validator::bundled(policy(mode)).unwrap()));
        assert!(g.admit("r", Some("50")).admitted());
        // A stale token padded with leading zeros past the limit: once it cost the
        // guest its fuel, and efficiency mode let it through.
        for padding in [MAX_TOKEN_BYTES, 4096, 1 << 20] {
            let d = g.admit("r", Some(&format!("{}49", "0".repeat(padding))));
            assert_eq!(d.class(), Class::Malformed, "{mode:?}, {padding} zeros");
            assert!(!d.admitted());
        }
        // Within the limit, padding is allowed and the token is judged by its value.
        let padded = format!("{}49", "0".repeat(MAX_TOKEN_BYTES - 2));
        assert_eq!(g.admit("r", Some(&padded)).class(), Class::Stale, "{mode:?}");
        assert_eq!(mark(&g, "r").as_deref(), Some("50"));
    }
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
    assert!(text.contains("does not implement fencekeeper:validator@0.3.0"), "{text}");
    assert!(text.contains("fencekeeper:validator/types@0.3.0"), "{text}");
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

#[test]
fn loading_runs_the_conformance_vectors_and_is_cheap() {
    // Compile the bundled guest first (once per process), to time only the loads.
    drop(Validator::bundled(Policy::default()).unwrap());
    let started = Instant::now();
    let v = Validator::load(GuestSource::Bundled, Policy::default(), Limits::default()).unwrap();
    let checked = started.elapsed();
    let started = Instant::now();
    let unchecked =
        Validator::load_with(GuestSource::Bundled, Policy::default(), Limits::default(), Conformance::Skip).unwrap();
    let skipped = started.elapsed();
    drop((v, unchecked));
    // Recorded for docs/embedding.md; a loose bound only catches a pathology.
    eprintln!("load with conformance: {checked:?}; without: {skipped:?}");
    assert!(checked < Duration::from_secs(2), "{checked:?}");
}
