//! The guard each backend keeps: one per (guest, strict mode), made at first use.
//!
//! Making one compiles the component (cranelift, on this thread: the library builds
//! wasmtime without parallel compilation, so no thread is started), starts an
//! instance and runs the conformance vectors against it. With
//! `shared_preload_libraries = 'fencekeeper'` the postmaster does this for the
//! bundled guest when it starts, and every backend forks with it ready: its first
//! fenced write pays no compilation.
//!
//! wasmtime is set up without signal handlers (`signals_based_traps` off): a backend's
//! signals belong to the server, which sets its own handlers when a backend starts
//! (SIGFPE among them), after the postmaster may have made the engine. wasmtime then
//! checks bounds and divisors in the compiled code instead, and a guest's trap is an
//! ordinary error return, never a signal.
//!
//! Only correctness mode exists here: the marks are in the writer's own database and
//! transaction, so there is no store that could be down while the write goes ahead,
//! which is the one case efficiency mode would let through.

use fencekeeper::validator::{configure_engine, EngineSettings, GuestSource, Limits};
use fencekeeper::{Guard, MemoryStore, Mode, Policy, Validator};
use std::cell::RefCell;
use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

/// Guards kept per backend; a superuser trying many guests in one session makes
/// the oldest be dropped.
const KEPT: usize = 8;

struct Loaded {
    guest: Option<CString>,
    strict: bool,
    guard: Arc<Guard>,
}

thread_local! {
    static LOADED: RefCell<Vec<Loaded>> = const { RefCell::new(Vec::new()) };
}

/// Set the engine up for a backend and, in the postmaster, load the bundled guest.
pub fn init() {
    if let Err(e) = configure_engine(EngineSettings { signals_based_traps: false }) {
        pgrx::warning!("fencekeeper: {e}");
    }
    // SAFETY: a plain bool the server sets while it loads shared_preload_libraries.
    if unsafe { pgrx::pg_sys::process_shared_preload_libraries_in_progress } {
        for strict in [false, true] {
            if let Err(e) = guard(None, strict) {
                // The backends will try again, and refuse every write as undecided
                // with this reason while it lasts.
                pgrx::log!("fencekeeper: the bundled guest did not load in the postmaster: {e}");
            }
        }
    }
}

/// The guard for `guest` (`None`: the bundled guest) under `strict`, made on first
/// use in this process. The error is the load error in one line.
pub fn guard(guest: Option<&CStr>, strict: bool) -> Result<Arc<Guard>, String> {
    let kept = LOADED.with_borrow(|loaded| {
        loaded.iter().find(|l| l.strict == strict && l.guest.as_deref() == guest).map(|l| l.guard.clone())
    });
    if let Some(guard) = kept {
        return Ok(guard);
    }
    let policy = Policy { mode: Mode::Correctness, strict };
    let source = match guest {
        Some(path) => GuestSource::Path(Path::new(OsStr::from_bytes(path.to_bytes()))),
        None => GuestSource::Bundled,
    };
    let validator = Validator::load(source, policy, Limits::default()).map_err(|e| e.to_string())?;
    // The guard's own store is never used: every admit names the transaction's.
    let guard = Arc::new(Guard::new(Arc::new(validator), Arc::new(MemoryStore::new())));
    LOADED.with_borrow_mut(|loaded| {
        if loaded.len() >= KEPT {
            loaded.remove(0);
        }
        loaded.push(Loaded { guest: guest.map(CStr::to_owned), strict, guard: guard.clone() });
    });
    Ok(guard)
}
