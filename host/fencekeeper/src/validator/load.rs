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

/// How the process that hosts the validators lets wasmtime run their guests. Every
/// validator in a process shares one engine, so these are chosen once, before the
/// first validator loads ([`configure_engine`]); the defaults suit a process of its own
/// (the gateway, the command line, an engine linking the library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineSettings {
    /// Let wasmtime catch a guest's traps with signal handlers of its own (SIGSEGV on
    /// guard pages for out-of-bounds accesses, SIGILL, SIGFPE, SIGBUS), installed for
    /// the whole process when the engine is made. On by default: the compiled code
    /// then needs no explicit bounds checks. Turn it off in a process whose signals
    /// belong to someone else: a database server's backend, or Redis, which installs
    /// its crash handler again whenever `crash-log-enabled` is set, after which a
    /// guest trap would reach Redis's handler and end the server. Off, wasmtime
    /// installs no handler at all and the compiled code checks bounds and divisors
    /// itself (somewhat slower guest code, the same verdicts; BENCHMARKS.md).
    pub signals_based_traps: bool,
}

impl Default for EngineSettings {
    fn default() -> EngineSettings {
        EngineSettings { signals_based_traps: true }
    }
}

/// The settings the engine was (or will be) made with: set by [`configure_engine`],
/// else the defaults when the first validator loads.
static SETTINGS: OnceLock<EngineSettings> = OnceLock::new();

/// Choose the settings of the process's engine. Call it before any validator loads;
/// once the engine exists (or settings were chosen), asking for other settings is an
/// error and asking for the same ones is not.
pub fn configure_engine(settings: EngineSettings) -> Result<(), LoadError> {
    let chosen = *SETTINGS.get_or_init(|| settings);
    if chosen == settings {
        Ok(())
    } else {
        Err(LoadError::Engine(format!(
            "the engine was already made with {chosen:?}; choose the settings before the first validator loads"
        )))
    }
}

/// The process's one engine. Every validator shares it: an engine is the compiler
/// configuration and the code memory, and is meant to live as long as the process.
pub(crate) fn engine() -> Result<&'static Engine, LoadError> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let settings = *SETTINGS.get_or_init(EngineSettings::default);
            let mut config = Config::new();
            // Fuel bounds every call deterministically (a loop stops after the same
            // work on every machine), without a timer thread as epochs would need.
            config.consume_fuel(true);
            // A trap ends in a one-line GuestFault; collecting wasm frames for a
            // backtrace would only slow the failure path down.
            config.wasm_backtrace_max_frames(None);
            if !settings.signals_based_traps {
                // Off, wasmtime also turns off its Spectre mitigations of heap and
                // table accesses (they rely on a fault), so a hostile guest could read
                // the host's memory speculatively: such a host loads only guests its
                // administrator chose.
                config.signals_based_traps(false);
                // Guard pages only serve traps caught by signal handlers; without
                // them every access is checked in code, and a memory reserves no
                // address space beyond what it holds (its budget is 16 MiB by default).
                config.memory_guard_size(0);
                config.memory_reservation(0);
            }
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
