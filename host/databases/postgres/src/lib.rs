//! The `fencekeeper` PostgreSQL extension: fencing inside the writing transaction.
//!
//! A row trigger (`fencekeeper.fence`) and a function (`fencekeeper.admit`) run the
//! bundled WebAssembly guest through the host library's [`Guard`](fencekeeper::Guard),
//! with every rule the library keeps (bounded input, verified verdicts, fuel and
//! memory limits, the conformance vectors at load). The marks live in the extension's
//! table `fencekeeper.marks`, one checked record per resource, read and written
//! through SPI in the same transaction as the row: a rollback takes the advance back,
//! and a refusal aborts the transaction with a SQLSTATE of class `FK`
//! (docs/databases.md has the contract).
//!
//! Inside a backend: no thread is started (wasmtime compiles on the calling thread:
//! its `parallel-compilation` feature is not built), wasmtime installs no signal
//! handler (`signals_based_traps` off, see [`guests`]), and with
//! `shared_preload_libraries = 'fencekeeper'` the guest is compiled and checked once,
//! in the postmaster, and every backend inherits it.
//!
//! # Layout
//! * [`settings`]: the `fencekeeper.*` settings (strict mode, the guest, audit, the
//!   token an UPDATE or a DELETE presents without the token column).
//! * [`guests`]: the validator and guard each backend keeps, per guest and policy.
//! * [`marks`]: `MarkStore` over SPI: the marks table, its locks and its records.
//! * [`owner`]: running the extension's own statements as the marks table's owner.
//! * [`audit`]: an advance, as the audit line every host writes, into `fencekeeper.audit`.
//! * [`write`]: one fenced write: the inputs checked, the guard asked, the outcome.
//! * [`refusal`]: the SQLSTATE and message of each refusal class, and raising it.
//! * [`text`]: server text as UTF-8 and datums as text.
//! * [`entry`]: the C entry points the SQL functions name.
//! * [`trigger`]: the row trigger: which rows, which resource, which token.
//! * [`presented`]: which token a row presents: the writer's, never the row's leftover.
//! * [`token_column`]: the column tokens are carried in: its type, its value as a token.
//! * [`expression`]: a trigger's resource given as an SQL expression over the row.
//! * [`attach`]: the event trigger that checks a token column when a fence is attached.

// The entry points are C functions called by the server, and the row and error
// plumbing reads the server's structures: each `unsafe` block says why it holds.
#![allow(unsafe_code)]

pub mod attach;
pub mod audit;
pub mod entry;
pub mod expression;
pub mod guests;
pub mod marks;
pub mod owner;
pub mod presented;
pub mod refusal;
pub mod settings;
pub mod text;
pub mod token_column;
pub mod trigger;
pub mod write;

pgrx::pg_module_magic!();

/// Called by the server when it loads the library: in the postmaster (with
/// `shared_preload_libraries`) or in a backend at its first call.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::define();
    guests::init();
}
