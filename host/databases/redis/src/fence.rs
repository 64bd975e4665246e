//! The process's one guard, set up when the module loads: the validator (the bundled
//! guest, or the one the `guest` argument names), checked against the conformance
//! vectors, under limits sized for Redis's one command thread.

use crate::load_args::{self, LoadArgs};
use fencekeeper::validator::{configure_engine, EngineSettings, Limits};
use fencekeeper::{Conformance, Guard, GuestSource, MemoryStore, Validator};
use redis_module::{Context, RedisString, Status};
use std::sync::{Arc, OnceLock};

static GUARD: OnceLock<Guard> = OnceLock::new();

/// The guard every fenced command admits through. `None` only if the module failed
/// to load, when Redis registers none of its commands.
pub fn guard() -> Option<&'static Guard> {
    GUARD.get()
}

/// `RedisModule_OnLoad`'s work: parse the arguments, load and check the guest.
pub fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let words: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    match load_args::parse(&words).and_then(|args| load(&args)) {
        Ok(described) => {
            ctx.log_notice(&format!("fencekeeper: {described}"));
            Status::Ok
        }
        Err(why) => {
            ctx.log_warning(&format!("fencekeeper failed to load: {why}"));
            Status::Err
        }
    }
}

fn load(args: &LoadArgs) -> Result<String, String> {
    // Redis owns SIGSEGV, SIGBUS, SIGILL and SIGFPE (its crash report), and installs
    // its handler again whenever `crash-log-enabled` is set: wasmtime's handlers
    // would not survive that, and a guest trap would end the server. Without them
    // wasmtime checks bounds in the compiled guest and installs nothing.
    configure_engine(EngineSettings { signals_based_traps: false }).map_err(|e| e.to_string())?;
    let source = match &args.guest {
        Some(path) => GuestSource::Path(path),
        None => GuestSource::Bundled,
    };
    let validator =
        Validator::load_with(source, args.policy, limits(), Conformance::Check).map_err(|e| e.to_string())?;
    let info = validator.describe().map_err(|e| e.to_string())?;
    // The guard's own store is never used: every admit names the command's context
    // as its store (`Guard::admit_in`), so marks live in the keyspace.
    let guard = Guard::new(Arc::new(validator), Arc::new(MemoryStore::new()));
    GUARD.set(guard).map_err(|_| "the module is already loaded in this process".to_owned())?;
    Ok(format!(
        "guest {} {} passed the conformance vectors; mode {}, strict {}",
        info.name,
        info.version,
        match args.policy.mode {
            fencekeeper::Mode::Correctness => "correctness",
            fencekeeper::Mode::Efficiency => "efficiency",
        },
        if args.policy.strict { "yes" } else { "no" }
    ))
}

/// Commands run on one thread (Redis's), so one instance is in use at a time; a
/// faulted instance is dropped before its replacement starts. Two instances' worth
/// bounds the pool whatever a guest does; the per-instance budget is the library's.
fn limits() -> Limits {
    let limits = Limits::default();
    Limits { pool_memory_bytes: 2 * limits.memory_bytes, max_idle_instances: 1, ..limits }
}
