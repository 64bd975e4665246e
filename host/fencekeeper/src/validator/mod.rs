//! The WebAssembly validator: the fencing decision run by a guest component that
//! implements `fencekeeper:validator@0.1.0` (wit/fencekeeper.wit), under limits.
//!
//! The guest is compiled once per [`Validator`] (the bundled one once per process);
//! instances are pooled and reused, one per concurrent caller, so a call costs a few
//! hundred nanoseconds instead of a fresh instantiation. Every call is bounded by a
//! fuel budget and a memory limit ([`Limits`]). A guest that traps, runs out of
//! fuel or outgrows its memory has its instance discarded (never reused) and the
//! call answers [`DecideError::GuestFault`], which the [`Guard`](crate::Guard)
//! treats as "cannot decide". The host never trusts the guest with the mark: the
//! guard refuses an admit that would lower it.
//!
//! # Layout
//! * `load`: the engine and the checks on a guest (component, world, no imports).
//! * `instance`: one store + instance + checker, and how a failed call is reported.
//! * `convert`: WIT values to the core's types, checking the guest's answers.

mod convert;
mod instance;
mod load;

pub use load::LoadError;

use crate::{DecideError, Decider};
use fencekeeper_core::{Policy, Token, Verdict};
use instance::{Instance, State};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use wasmtime::Engine;

/// Host bindings generated from the WIT contract.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "fencekeeper",
    });
}

/// The bundled guest: `guest/artifacts/fencekeeper_validator.wasm`, as committed
/// (rebuilt byte-identically by `scripts/build-guests.sh`).
static BUNDLED: &[u8] = include_bytes!("../../../../guest/artifacts/fencekeeper_validator.wasm");

/// The file name of the validator guest in `guest/artifacts` and in
/// `FENCEKEEPER_GUEST_DIR`.
pub const VALIDATOR_FILE: &str = "fencekeeper_validator.wasm";

/// The environment variable naming a directory of freshly built guests (same file
/// names as `guest/artifacts`). The test suite sets it when the guests were rebuilt
/// on a toolchain whose bytes differ from the committed ones (see
/// `scripts/build-guests.sh --check`); [`GuestSource::Bundled`] then loads
/// [`VALIDATOR_FILE`] from there instead of the embedded bytes.
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
    /// The guest embedded in this library (or [`VALIDATOR_FILE`] in
    /// `FENCEKEEPER_GUEST_DIR` when that is set).
    Bundled,
    /// A component file implementing the world.
    Path(&'a Path),
    /// Component bytes implementing the world.
    Bytes(&'a [u8]),
}

/// Bounds on every call into the guest.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Fuel per call (about one unit per wasm instruction). The bundled guest's
    /// decide uses about 1,800; the default allows about a hundred times that.
    pub fuel: u64,
    /// The most linear memory one instance may have, in bytes.
    pub memory_bytes: usize,
    /// How many idle instances to keep for reuse (about the number of threads
    /// that call at once); more concurrent callers still work, their extra
    /// instances are dropped after use.
    pub max_idle_instances: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { fuel: 200_000, memory_bytes: 16 << 20, max_idle_instances: 64 }
    }
}

/// What a guest says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestInfo {
    /// The guest's name (`fencekeeper-validator` for the bundled one).
    pub name: String,
    /// The guest's version.
    pub version: String,
    /// The token syntax it accepts, in one line.
    pub token_syntax: String,
}

/// A [`Decider`] that runs a guest component. Cheap to share (`Arc`) between threads.
pub struct Validator {
    engine: &'static Engine,
    pre: bindings::FencekeeperPre<State>,
    policy: Policy,
    limits: Limits,
    idle: Mutex<Vec<Instance>>,
}

impl Validator {
    /// Load a guest, check that it implements the world and imports nothing, and
    /// start one instance (so a guest that cannot start fails here, not later).
    pub fn load(source: GuestSource<'_>, policy: Policy, limits: Limits) -> Result<Validator, LoadError> {
        let engine = load::engine()?;
        let fresh_build = std::env::var_os(GUEST_DIR_ENV).map(|dir| PathBuf::from(dir).join(VALIDATOR_FILE));
        let (pre, what) = match (source, fresh_build) {
            (GuestSource::Bundled, Some(path)) => (compile_file(engine, &path)?, describe_path(&path)),
            (GuestSource::Bundled, None) => (bundled_pre(engine)?, "the bundled guest".to_owned()),
            (GuestSource::Path(path), _) => (compile_file(engine, path)?, describe_path(path)),
            (GuestSource::Bytes(bytes), _) => {
                (load::compile(engine, bytes, "the guest bytes")?, "the guest bytes".to_owned())
            }
        };
        let first = Instance::start(engine, &pre, policy, &limits)
            .map_err(|e| LoadError::Start { what, detail: e.to_string() })?;
        Ok(Validator { engine, pre, policy, limits, idle: Mutex::new(vec![first]) })
    }

    /// The bundled guest with default limits.
    pub fn bundled(policy: Policy) -> Result<Validator, LoadError> {
        Validator::load(GuestSource::Bundled, policy, Limits::default())
    }

    /// The guest's name, version and token syntax.
    pub fn describe(&self) -> Result<GuestInfo, DecideError> {
        let info = self.call(|i, l| i.describe(l))?;
        Ok(GuestInfo { name: info.name, version: info.version, token_syntax: info.token_syntax })
    }

    /// Parse a raw token with the guest: the token, or the guest's one-line reason.
    pub fn parse(&self, raw: &str) -> Result<Result<Token, String>, DecideError> {
        match self.call(|i, l| i.parse(l, raw))? {
            Ok(parts) => convert::token(&parts, "parsed").map(Ok),
            Err(reason) => Ok(Err(reason)),
        }
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Fuel one decide on a fresh resource uses (to size [`Limits::fuel`]).
    pub fn fuel_per_decide(&self) -> Result<u64, DecideError> {
        self.call(|i, l| {
            i.decide(l, "fuel-probe", Some("34"), Some(&[33]))?;
            Ok(i.fuel_used(l))
        })
    }

    /// Run `f` on an idle instance (or a new one). An instance whose call failed is
    /// dropped, so a faulted guest is never called again; the next call starts fresh.
    fn call<R>(&self, f: impl FnOnce(&mut Instance, &Limits) -> Result<R, DecideError>) -> Result<R, DecideError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut instance = match idle {
            Some(instance) => instance,
            None => Instance::start(self.engine, &self.pre, self.policy, &self.limits)?,
        };
        let result = f(&mut instance, &self.limits);
        if result.is_ok() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < self.limits.max_idle_instances {
                idle.push(instance);
            }
        }
        result
    }
}

impl Decider for Validator {
    fn policy(&self) -> Policy {
        self.policy
    }

    fn decide(&self, resource: &str, presented: Option<&str>, mark: Option<&Token>) -> Result<Verdict, DecideError> {
        let verdict = self.call(|i, l| i.decide(l, resource, presented, mark.map(Token::parts)))?;
        convert::verdict(verdict, &self.policy, resource, presented, mark)
    }
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator").field("policy", &self.policy).field("limits", &self.limits).finish_non_exhaustive()
    }
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
