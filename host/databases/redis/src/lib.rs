//! Fencekeeper as a Redis 7 module: a fenced write is decided by the bundled
//! WebAssembly validator and applied in one command, on Redis's thread, so no other
//! command runs between the check and the write (none in MULTI/EXEC or a script
//! either). There is no check-then-forward window to close.
//!
//! ```text
//! redis-server --loadmodule target/release/libfencekeeper_redis.so
//! FENCE.SET orders:2026-11 fence:orders 34 "the import"   -> OK (mark of fence:orders := 34)
//! FENCE.SET orders:2026-11 fence:orders 33 "a late write" -> (error) STALE 34 stale fencing token 33 ...
//! FENCE.CALL fence:orders 34 HSET order:7 state shipped   -> (integer) 1
//! FENCE.MARK fence:orders                                  -> "34"
//! ```
//!
//! A resource's mark is a key of the module's own type (`fencemark`), named by the
//! resource and holding the core's checked record (`fencekeeper_core::record`): it is
//! saved in RDB and AOF, replicated, and read back through its checksum. The host
//! library's [`Guard`](fencekeeper::Guard) runs the admit against the command's
//! context ([`marks::Marks`], a `MarkStore`), with every rule it keeps: bounded
//! input, verified verdicts, fuel and memory limits, conformance at load. The command
//! (docs/databases.md lists them, their errors and the load arguments):
//!
//! 1. checks its arguments and what the write touches (never a mark);
//! 2. admits the token against the mark read from the keyspace (an advance is held,
//!    not yet written);
//! 3. runs the write through `RedisModule_Call`; a write that fails advances nothing;
//! 4. stores the advanced mark and replicates it as `FENCE.RAISE resource record`,
//!    beside the write's own effect: replicas and the AOF apply the two, never run
//!    the guest again.
//!
//! # Layout
//! * `load_args`: the module's load arguments (mode, strict, guest).
//! * `mark_type`: the `fencemark` data type (a record per key; RDB, AOF rewrite).
//! * `marks`: the library's `MarkStore` over one command's context.
//! * `eviction`: whether Redis could evict a mark (maxmemory-policy).
//! * `refusal`: a decision as a Redis error with a stable prefix.
//! * `write`: a fenced write: admit, run the command, record the mark.
//! * `command_flags`: whether a command `FENCE.CALL` is given writes.
//! * `commands/`: one file per command (`FENCE.SET`, `FENCE.CALL`, `FENCE.MARK`,
//!   `FENCE.RAISE`).
//! * `fence`: the process's one guard, set up when the module loads.
//! * `redis_api`: the few module API calls that redis-module does not wrap, each
//!   behind a safe function.
//!
//! Unsafe code is allowed here, as in any crate at a C ABI: the module type's
//! callbacks and the unwrapped API calls. Every block says why it is sound.
#![allow(unsafe_code)]
// Unit tests build without the registration (`module`), which is what uses the commands.
#![cfg_attr(test, allow(dead_code))]

mod command_flags;
mod commands;
mod eviction;
mod fence;
mod load_args;
mod mark_type;
mod marks;
mod redis_api;
mod refusal;
mod write;

/// The module's registration. Not in unit tests: it sets Redis's allocator as the
/// global one, which exists only inside redis-server.
#[cfg(not(test))]
mod module {
    use crate::commands::{call, mark, raise, set};
    use crate::mark_type::MARK_TYPE;
    use redis_module::{redis_module, Context, RedisString, Status};

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        crate::fence::init(ctx, args)
    }

    /// Never unloaded: each calling thread keeps a guest instance in a thread-local
    /// slot, and wasmtime's compiled code lives in the module's mappings; neither may
    /// outlive the library. (Redis refuses anyway: the module exports a data type.)
    fn deinit(ctx: &Context) -> Status {
        ctx.log_warning(
            "fencekeeper cannot be unloaded (its marks are keys of its own type); restart Redis without it",
        );
        Status::Err
    }

    redis_module! {
        name: "fencekeeper",
        version: 1,
        // Redis's allocator: what the module holds shows in INFO memory and counts
        // against maxmemory (the guest's linear memory is mapped by wasmtime and
        // bounded by the validator's limits instead).
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [MARK_TYPE],
        init: init,
        deinit: deinit,
        commands: [
            ["fence.set", set::run, "write deny-oom", 1, 2, 1, ""],
            ["fence.call", call::run, "write deny-oom getkeys-api", 0, 0, 0, ""],
            ["fence.mark", mark::run, "readonly fast", 1, 1, 1, ""],
            ["fence.raise", raise::run, "write", 1, 1, 1, ""],
        ],
    }
}
