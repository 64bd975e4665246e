//! Loading a guest: the engine, and the checks that turn a file into a trusted shape
//! (a component, implementing `fencekeeper:validator@0.3.0`, importing nothing).

use super::bindings::FencekeeperPre;
use super::budget::State;
use super::one_line;
use std::path::PathBuf;
use std::sync::OnceLock;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

/// The exports a guest must have, by their component-model names.
const REQUIRED_EXPORTS: [&str; 2] = ["fencekeeper:validator/types@0.3.0", "fencekeeper:validator/validator@0.3.0"];

/// The exports of the frozen worlds, to recognise a guest built against one, and
/// why each is refused.
const OLD_WORLDS: [(&str, &str, &str); 2] = [
    ("fencekeeper:validator/validator@0.1.0", "0.1.0", "whose verdicts a host cannot verify"),
    ("fencekeeper:validator/validator@0.2.0", "0.2.0", "which has no `decide-short`"),
];

/// Why a guest could not be loaded. Each message is one line and names the guest.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The guest file could not be read.
    #[error("cannot read guest {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not WebAssembly at all.
    #[error("{what} is not WebAssembly (it does not start with the \\0asm header)")]
    NotWasm {
        /// Which guest.
        what: String,
    },
    /// The bytes are a core module, not a component.
    #[error(
        "{what} is a core WebAssembly module, not a component; build it into a component \
         (scripts/build-guests.sh does, with wit-component)"
    )]
    CoreModule {
        /// Which guest.
        what: String,
    },
    /// The component does not validate or compile.
    #[error("{what} is not a valid component: {detail}")]
    Invalid {
        /// Which guest.
        what: String,
        /// The compiler's reason.
        detail: String,
    },
    /// The component implements a frozen world (0.1.0 or 0.2.0).
    #[error(
        "{what} implements fencekeeper:validator@{version}, {why}; \
         rebuild it against fencekeeper:validator@0.3.0 (wit/fencekeeper.wit)"
    )]
    OldWorld {
        /// Which guest.
        what: String,
        /// The frozen version it implements.
        version: &'static str,
        /// Why that version is refused.
        why: &'static str,
    },
    /// The component lacks one of the world's exports.
    #[error("{what} does not implement fencekeeper:validator@0.3.0: it has no export named {export:?}")]
    MissingExport {
        /// Which guest.
        what: String,
        /// The missing export.
        export: &'static str,
    },
    /// The component exports the names with the wrong types.
    #[error("{what} does not implement fencekeeper:validator@0.3.0: {detail}")]
    WrongShape {
        /// Which guest.
        what: String,
        /// What did not match.
        detail: String,
    },
    /// The component imports something; the world imports nothing.
    #[error(
        "{what} imports {import:?}; a fencekeeper guest must import nothing \
         (it is given no authority beyond its own memory)"
    )]
    Imports {
        /// Which guest.
        what: String,
        /// The first import's name.
        import: String,
    },
    /// The component loaded but could not be instantiated or constructed.
    #[error("{what} failed to start: {detail}")]
    Start {
        /// Which guest.
        what: String,
        /// Why.
        detail: String,
    },
    /// The guest answered a conformance vector wrongly when it was loaded.
    #[error("{what} fails conformance vector {vector:?}: expected {expected}, got {got}")]
    Conformance {
        /// Which guest.
        what: String,
        /// The vector's name.
        vector: String,
        /// What the vector expects.
        expected: String,
        /// What the guest answered.
        got: String,
    },
    /// The WebAssembly engine could not be configured on this machine.
    #[error("cannot set up the WebAssembly engine: {0}")]
    Engine(String),
}

/// How the process's one WebAssembly engine is set up. Every validator in a process
/// shares one engine, so these are chosen once, before the first validator loads
/// ([`configure_engine`]); the defaults suit a process of its own (the gateway, the
/// command line, an engine linking the library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Let wasmtime install its signal handlers (SIGSEGV, SIGBUS, SIGILL, SIGFPE) and
    /// turn a guest's out-of-bounds access or `unreachable` into a trap through them;
    /// the compiled guest then elides bounds checks. On by default. A host loaded into
    /// a server that owns those signals turns it off: Redis, for one, installs its
    /// crash handler again (or the default action) whenever `crash-log-enabled` is
    /// set, after which a guest trap would reach Redis's handler and end the server.
    /// Off, wasmtime installs no handler and the compiled guest checks its bounds and
    /// divisors in code (BENCHMARKS.md measures what that costs per call).
    pub signal_handlers: bool,
}

impl Default for EngineOptions {
    fn default() -> EngineOptions {
        EngineOptions { signal_handlers: true }
    }
}

/// The options the engine was (or will be) built with: set by [`configure_engine`],
/// else the defaults when the first validator loads.
static OPTIONS: OnceLock<EngineOptions> = OnceLock::new();

/// Choose how the process's engine is set up, before any validator loads. Setting the
/// options it already has succeeds; other options, once the engine was set up (or
/// configured) differently, are an error, since a process has one engine.
pub fn configure_engine(options: EngineOptions) -> Result<(), LoadError> {
    let chosen = *OPTIONS.get_or_init(|| options);
    if chosen == options {
        return Ok(());
    }
    Err(LoadError::Engine(format!(
        "the engine is already set up with {chosen:?}; configure it before the first validator loads"
    )))
}

/// The process's one engine. Every validator shares it: an engine is the compiler
/// configuration and the code memory, and is meant to live as long as the process.
pub(crate) fn engine() -> Result<&'static Engine, LoadError> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let options = *OPTIONS.get_or_init(EngineOptions::default);
            let mut config = Config::new();
            // Fuel bounds every call deterministically (a loop stops after the same
            // work on every machine), without a timer thread as epochs would need.
            config.consume_fuel(true);
            // A trap ends in a one-line GuestFault; collecting wasm frames for a
            // backtrace would only slow the failure path down.
            config.wasm_backtrace_max_frames(None);
            // See EngineOptions::signal_handlers. Off, wasmtime also turns off its
            // Spectre mitigations of heap and table accesses (they rely on a fault),
            // so a hostile guest could read the host's memory speculatively: such a
            // host loads only guests its administrator chose.
            config.signals_based_traps(options.signal_handlers);
            Engine::new(&config).map_err(|e| one_line(&e))
        })
        .as_ref()
        .map_err(|e| LoadError::Engine(e.clone()))
}

/// Compile `bytes` and check that they implement the world and import nothing.
pub(crate) fn compile(engine: &Engine, bytes: &[u8], what: &str) -> Result<FencekeeperPre<State>, LoadError> {
    let what = what.to_owned();
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => return Err(LoadError::CoreModule { what }),
        Some([0, b'a', b's', b'm', ..]) => {}
        _ => return Err(LoadError::NotWasm { what }),
    }
    let component =
        Component::new(engine, bytes).map_err(|e| LoadError::Invalid { what: what.clone(), detail: one_line(&e) })?;
    let ty = component.component_type();
    if let Some((import, _)) = ty.imports(engine).next() {
        return Err(LoadError::Imports { what, import: import.to_owned() });
    }
    if let Some((_, version, why)) = OLD_WORLDS.into_iter().find(|(name, ..)| ty.get_export(engine, name).is_some()) {
        return Err(LoadError::OldWorld { what, version, why });
    }
    if let Some(export) = REQUIRED_EXPORTS.into_iter().find(|name| ty.get_export(engine, name).is_none()) {
        return Err(LoadError::MissingExport { what, export });
    }
    // An empty linker: instantiation succeeding is the proof the guest needs nothing.
    let linker = Linker::<State>::new(engine);
    linker
        .instantiate_pre(&component)
        .and_then(FencekeeperPre::new)
        .map_err(|e| LoadError::WrongShape { what, detail: one_line(&e) })
}
