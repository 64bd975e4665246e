//! The WebAssembly validator: the fencing decision run by a guest component that
//! implements `fencekeeper:validator@0.3.0` (wit/fencekeeper.wit), under limits.
//!
//! The guest is compiled once per [`Validator`] (the bundled one once per process);
//! instances are pooled and reused, one per concurrent caller, so a call costs a few
//! hundred nanoseconds instead of a fresh instantiation. Every call is bounded by a
//! fuel budget, and every instance by a memory budget (linear memories and tables
//! together, and a count of each), all instances of a validator by a pool budget
//! ([`Limits`]). A guest that traps, runs out of fuel or outgrows a budget has its
//! instance discarded (never reused) and the call answers
//! [`DecideError::GuestFault`], which the [`Guard`](crate::Guard) refuses. Loading a
//! guest runs the conformance vectors against it. The guard checks every verdict;
//! this module only checks its shape.
//!
//! # Layout
//! * `load`: the engine and the checks on a guest (component, world, no imports).
//! * `budget`: the memory and table limits of one instance and of the pool.
//! * `instance`: one store + instance, and how a failed call is reported.
//! * `pool`: where instances wait between calls (one per calling thread, no lock).
//! * `cache`: a per-thread cache of verdicts (a holder's repeated writes).
//! * `convert`: WIT values to the host's types.

mod budget;
mod cache;
mod convert;
mod instance;
mod load;
mod pool;

pub use load::{configure_engine, EngineSettings, LoadError};

use crate::conformance::{self, Vectors};
use crate::{DecideError, Decider, GuestText, Verdict};
use budget::State;
use fencekeeper_core::{Policy, Token};
use instance::Instance;
use pool::Shared;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use wasmtime::Engine;

/// Host bindings generated from the WIT contract.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "fencekeeper",
    });
}

/// The bundled guest: `guest/artifacts/fencekeeper_validator.wasm`, as committed
/// (rebuilt byte-identically by `scripts/build-guests.sh`).
static BUNDLED: &[u8] = include_bytes!("../../guest/fencekeeper_validator.wasm");

/// The file name of the validator guest in `guest/artifacts` and in
/// `FENCEKEEPER_GUEST_DIR`.
pub const VALIDATOR_FILE: &str = "fencekeeper_validator.wasm";

/// The environment variable naming a directory of freshly built guests (same file
/// names as `guest/artifacts`), read only by [`guest_path`]. The test suite sets it
/// when the guests were rebuilt on a toolchain whose bytes differ from the committed
/// ones (see `scripts/build-guests.sh --check`).
pub const GUEST_DIR_ENV: &str = "FENCEKEEPER_GUEST_DIR";

/// The bundled validator component's bytes (embedded in this library).
pub fn bundled_component() -> &'static [u8] {
    BUNDLED
}

/// Where the guest named `name` (e.g. `"test-guests/guest_faults.wasm"`) is: in
/// `FENCEKEEPER_GUEST_DIR` when set, else in this repository's `guest/artifacts`.
/// For tests and tools that run from a checkout.
pub fn guest_path(name: &str) -> PathBuf {
    match std::env::var_os(GUEST_DIR_ENV) {
        Some(dir) => PathBuf::from(dir).join(name),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/artifacts").join(name),
    }
}

/// Where a validator's guest comes from.
#[derive(Clone, Copy, Debug)]
pub enum GuestSource<'a> {
    /// The guest embedded in this library.
    Bundled,
    /// A component file implementing the world.
    Path(&'a Path),
    /// Component bytes implementing the world.
    Bytes(&'a [u8]),
}

/// Whether loading a guest runs the conformance vectors against it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Conformance {
    /// Run them; a guest that fails one does not load (the default).
    #[default]
    Check,
    /// Skip them: for a deliberately stricter guest, or to report its failures
    /// (`fencekeeper conformance`). The guard still checks every verdict.
    Skip,
}

/// Bounds on every call into the guest, on each instance, and on all of them.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Fuel per call (about one unit per wasm instruction). A typical decide of the
    /// bundled guest takes about 1,000; its worst accepted input (a token of
    /// [`MAX_TOKEN_BYTES`](fencekeeper_core::token::MAX_TOKEN_BYTES), four
    /// components) about 8,000. The default, 200,000, is more than ten times that
    /// (`tests/all/guest_faults.rs` measures it), so an honest guest never runs out on
    /// anything a client can send.
    pub fuel: u64,
    /// The most bytes one instance may hold: all its linear memories and table
    /// elements together.
    pub memory_bytes: usize,
    /// The most linear memories one instance may create.
    pub memories: usize,
    /// The most tables one instance may create.
    pub tables: usize,
    /// The most elements one table may have.
    pub table_elements: usize,
    /// The most bytes all live instances of one validator may hold together. With
    /// the per-instance budget, this bounds the pool's memory whatever the guest
    /// and the concurrency: an instance that would pass it fails to start or to
    /// grow (a guest fault, refused), it is never granted.
    pub pool_memory_bytes: usize,
    /// How many idle instances to keep for reuse, beyond the one each calling
    /// thread keeps for itself; more are dropped after use.
    pub max_idle_instances: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            fuel: 200_000,
            memory_bytes: 16 << 20,
            memories: 1,
            tables: 4,
            table_elements: 10_000,
            pool_memory_bytes: 256 << 20,
            max_idle_instances: 64,
        }
    }
}

/// What a guest says about itself, made safe to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestInfo {
    /// The guest's name (`fencekeeper-validator` for the bundled one).
    pub name: GuestText,
    /// The guest's version.
    pub version: GuestText,
    /// The token syntax it accepts, in one line.
    pub token_syntax: GuestText,
}

/// A [`Decider`] that runs a guest component. Cheap to share (`Arc`) between threads.
///
/// Each thread that calls it keeps an instance and a small cache of verdicts for
/// itself (no lock, nothing shared on the call path); they are released when the
/// thread exits or calls another validator. The verdict cache is on by default:
/// a verdict is a function of (policy, token text, mark) for a guest that imports
/// nothing, and the guard checks cached verdicts like fresh ones.
pub struct Validator {
    shared: Arc<Shared>,
    policy: Policy,
}

impl Validator {
    /// Load a guest, check that it implements the world and imports nothing, start
    /// one instance (so a guest that cannot start fails here, not later) and run
    /// the conformance vectors against it.
    pub fn load(source: GuestSource<'_>, policy: Policy, limits: Limits) -> Result<Validator, LoadError> {
        Validator::load_with(source, policy, limits, Conformance::Check)
    }

    /// [`Validator::load`], choosing whether the conformance vectors run.
    pub fn load_with(
        source: GuestSource<'_>,
        policy: Policy,
        limits: Limits,
        conformance: Conformance,
    ) -> Result<Validator, LoadError> {
        let engine = load::engine()?;
        let (pre, what) = match source {
            GuestSource::Bundled => (bundled_pre(engine)?, "the bundled guest".to_owned()),
            GuestSource::Path(path) => (compile_file(engine, path)?, describe_path(path)),
            GuestSource::Bytes(bytes) => {
                (load::compile(engine, bytes, "the guest bytes")?, "the guest bytes".to_owned())
            }
        };
        let bytes = Arc::new(AtomicUsize::new(0));
        let mut first = Instance::start(engine, &pre, &limits, &bytes)
            .map_err(|e| LoadError::Start { what: what.clone(), detail: e.to_string() })?;
        if conformance == Conformance::Check {
            check_conformance(&mut first, &limits, &what)?;
        }
        Ok(Validator { shared: Arc::new(Shared::new(engine, pre, limits, bytes, first)), policy })
    }

    /// The bundled guest with default limits.
    pub fn bundled(policy: Policy) -> Result<Validator, LoadError> {
        Validator::load(GuestSource::Bundled, policy, Limits::default())
    }

    /// This validator without its verdict cache: every decide calls the guest. For
    /// measuring the guest, or testing its limits with repeated inputs.
    pub fn without_verdict_cache(self) -> Validator {
        let mut shared = self.shared;
        match Arc::get_mut(&mut shared) {
            Some(s) => s.cache_verdicts = false,
            // Shared only through this thread's slot: take the slot's hold away first.
            None => return Validator { shared: shared.uncached(), policy: self.policy },
        }
        Validator { shared, policy: self.policy }
    }

    /// The guest's name, version and token syntax.
    pub fn describe(&self) -> Result<GuestInfo, DecideError> {
        let info = self.shared.call(|i, l| i.describe(l))?;
        Ok(GuestInfo {
            name: GuestText::new(&info.name),
            version: GuestText::new(&info.version),
            token_syntax: GuestText::new(&info.token_syntax),
        })
    }

    /// Parse a raw token with the guest: the token, or the guest's one-line reason.
    pub fn parse(&self, raw: &str) -> Result<Result<Token, GuestText>, DecideError> {
        match self.shared.call(|i, l| i.parse(l, raw))? {
            Ok(t) => convert::token(&t, "parsed").map(Ok),
            Err(reason) => Ok(Err(GuestText::new(&reason))),
        }
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Bytes of memory and tables held now by all of this validator's instances.
    pub fn pool_bytes(&self) -> usize {
        self.shared.bytes()
    }

    /// Fuel one decide of `presented` against `mark` uses (to size [`Limits::fuel`]).
    pub fn fuel_per_decide(&self, presented: &str, mark: Option<&Token>) -> Result<u64, DecideError> {
        self.shared.call(|i, l| {
            i.decide(l, &self.policy, Some(presented), mark)?;
            Ok(i.fuel_used(l))
        })
    }
}

impl Decider for Validator {
    fn policy(&self) -> Policy {
        self.policy
    }

    fn decide(&self, presented: Option<&str>, mark: Option<&Token>) -> Result<Verdict, DecideError> {
        self.shared.decide(&self.policy, presented, mark)
    }
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator")
            .field("policy", &self.policy)
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

/// Run the bundled conformance vectors on `instance`, as the guard would decide
/// them (a short text through `decide-short`), and again through `decide` alone, so
/// that a guest whose two decides disagree on a vector does not load. The first
/// failure is the load error.
fn check_conformance(instance: &mut Instance, limits: &Limits, what: &str) -> Result<(), LoadError> {
    let vectors = Vectors::bundled().map_err(|e| LoadError::Engine(format!("the bundled vectors: {e}")))?;
    let short = conformance::run_with(&vectors, |policy, presented, mark| {
        instance.decide(limits, policy, presented, mark).map_err(|e| e.to_string())
    });
    let full = conformance::run_with(&vectors, |policy, presented, mark| {
        instance.decide_full(limits, policy, presented, mark).map_err(|e| e.to_string())
    });
    let mut failed = short.outcomes.into_iter().chain(full.outcomes.into_iter().map(|mut o| {
        o.name = format!("{} (through decide)", o.name);
        o
    }));
    match failed.find(|o| !o.passed) {
        Some(o) => {
            Err(LoadError::Conformance { what: what.to_owned(), vector: o.name, expected: o.expected, got: o.got })
        }
        None => Ok(()),
    }
}

/// A wasmtime error as one line: its chain of causes joined by ": ".
pub(crate) fn one_line(error: &wasmtime::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn describe_path(path: &Path) -> String {
    format!("guest {}", path.display())
}

fn compile_file(engine: &Engine, path: &Path) -> Result<bindings::FencekeeperPre<State>, LoadError> {
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read { path: path.to_owned(), source })?;
    load::compile(engine, &bytes, &describe_path(path))
}

/// The bundled guest is compiled once per process, however many validators use it.
fn bundled_pre(engine: &Engine) -> Result<bindings::FencekeeperPre<State>, LoadError> {
    static COMPILED: OnceLock<bindings::FencekeeperPre<State>> = OnceLock::new();
    if let Some(pre) = COMPILED.get() {
        return Ok(pre.clone());
    }
    let pre = load::compile(engine, BUNDLED, "the bundled guest")?;
    Ok(COMPILED.get_or_init(|| pre).clone())
}
