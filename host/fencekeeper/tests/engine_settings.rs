//! The engine's settings are chosen once per process (its own test binary, so no other
//! test made the engine first): without signal-based traps, loading and running the
//! guest installs no signal handler, the guest still decides, its traps are still
//! stopped, and asking for other settings afterwards is an error.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::validator::{configure_engine, guest_path, EngineSettings, GuestSource, Limits, Validator};
use fencekeeper::{Class, Guard, MemoryStore, Policy};
use std::sync::Arc;

/// The signals this process catches (`SigCgt` of /proc/self/status).
fn caught_signals() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status.lines().find_map(|l| l.strip_prefix("SigCgt:")).unwrap().trim().to_owned()
}

#[test]
fn without_signal_based_traps_the_engine_installs_no_handler_and_still_stops_a_trap() {
    let before = caught_signals();
    let settings = EngineSettings { signals_based_traps: false };
    configure_engine(settings).unwrap();
    configure_engine(settings).unwrap();
    let faults = guest_path("test-guests/guest_faults.wasm");
    let validator = Validator::load(GuestSource::Path(&faults), Policy::default(), Limits::default()).unwrap();
    let guard = Guard::new(Arc::new(validator), Arc::new(MemoryStore::new()));
    assert!(guard.admit("r", Some("34")).admitted());
    assert_eq!(guard.admit("r", Some("33")).class(), Class::Stale);
    for fault in ["fault-trap", "fault-grow"] {
        let d = guard.admit("r", Some(fault));
        assert_eq!(d.class(), Class::Undecided, "{fault}: {}", d.reason("r"));
    }
    assert_eq!(caught_signals(), before, "the engine added signal handlers");
    let other = configure_engine(EngineSettings::default()).unwrap_err();
    assert!(other.to_string().contains("already made"), "{other}");
}
