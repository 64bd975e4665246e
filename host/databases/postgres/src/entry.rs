//! The C functions the extension's SQL names (`AS 'MODULE_PATHNAME', 'fencekeeper_...'`).
//!
//! Each runs its work inside pgrx's guard, which turns a server error raised meanwhile
//! into an unwind through the Rust frames and back into the same error (its SQLSTATE
//! kept: a serialization failure stays 40001), and a panic into an ERROR. A refusal
//! comes back out of the guard as a value and is raised here, in the entry's own
//! frame, where nothing is left to drop.

use crate::refusal::{self, Refusal};
use crate::write::{self, Write};
use crate::{marks::Marks, owner::AsOwner, text};
use fencekeeper::{Class, MarkStore};
use pgrx::fcinfo::{pg_getarg, pg_return_null};
use pgrx::pg_sys::submodules::panic::pgrx_extern_c_guard;
use pgrx::pg_sys::{self, FunctionCallInfo, Pg_finfo_record};
use pgrx::spi::Spi;
use pgrx::IntoDatum;

/// The version-1 calling convention, declared for every entry point.
static V1: Pg_finfo_record = Pg_finfo_record { api_version: 1 };

/// Run `work` guarded; raise its refusal.
///
/// # Safety
/// Only as the whole body of a C entry point.
unsafe fn run(work: impl FnOnce() -> Result<pg_sys::Datum, Refusal>) -> pg_sys::Datum {
    // SAFETY: this is the top Rust frame of the call (the caller's contract), as
    // pgrx's guard and `raise` require.
    match unsafe { pgrx_extern_c_guard(work) } {
        Ok(datum) => datum,
        Err(refusal) => unsafe { refusal::raise(refusal) },
    }
}

/// `fencekeeper.admit(resource text, token text) RETURNS boolean`.
#[no_mangle]
pub extern "C" fn pg_finfo_fencekeeper_admit() -> &'static Pg_finfo_record {
    &V1
}

/// `fencekeeper.admit`: true when the token advanced the mark, false when it equals
/// it; raises the refusal otherwise.
///
/// # Safety
/// Called by the server with the arguments the SQL declares.
#[no_mangle]
pub unsafe extern "C-unwind" fn fencekeeper_admit(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the function's body, called by the server with two text arguments
    // (either may be NULL: the function is not STRICT).
    unsafe {
        run(|| {
            let resource = pg_getarg::<&[u8]>(fcinfo, 0);
            let token = pg_getarg::<&[u8]>(fcinfo, 1);
            let advanced = write::admit(&Write { resource, token, missing: "the token argument is NULL" })?;
            Ok(advanced.into_datum().unwrap_or(pg_sys::Datum::from(false)))
        })
    }
}

/// `fencekeeper.fence() RETURNS trigger`.
#[no_mangle]
pub extern "C" fn pg_finfo_fencekeeper_fence() -> &'static Pg_finfo_record {
    &V1
}

/// `fencekeeper.fence`: the row trigger ([`crate::trigger`]).
///
/// # Safety
/// Called by the server as a trigger function.
#[no_mangle]
pub unsafe extern "C-unwind" fn fencekeeper_fence(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the function's body; `fence` checks it was called as a trigger.
    unsafe { run(|| crate::trigger::fence(fcinfo)) }
}

/// `fencekeeper.mark(resource text) RETURNS text`.
#[no_mangle]
pub extern "C" fn pg_finfo_fencekeeper_mark() -> &'static Pg_finfo_record {
    &V1
}

/// `fencekeeper.mark`: the resource's mark, its record verified; NULL when it has
/// none. A damaged record raises FK006.
///
/// # Safety
/// Called by the server with one text argument, never NULL (the function is STRICT).
#[no_mangle]
pub unsafe extern "C-unwind" fn fencekeeper_mark(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the function's body, with its one argument.
    unsafe {
        run(|| {
            let raw = pg_getarg::<&[u8]>(fcinfo, 0).unwrap_or_default();
            let resource = text::to_utf8(raw).map_err(|e| {
                Refusal::new(Class::Malformed, format!("malformed request: the resource is not UTF-8 (byte {})", e.at))
            })?;
            let mark = Spi::connect(|client| {
                let _owner = AsOwner::switch().map_err(|e| Refusal::new(Class::Undecided, e))?;
                let marks = Marks::new(client).map_err(|e| Refusal::new(Class::Undecided, e.to_string()))?;
                marks.get(&resource).map_err(|e| Refusal::new(Class::Undecided, e.to_string()))
            })?;
            Ok(match mark {
                Some(mark) => mark.to_string().into_datum().unwrap_or_else(|| pg_return_null(fcinfo)),
                None => pg_return_null(fcinfo),
            })
        })
    }
}

/// `fencekeeper.check_fence() RETURNS event_trigger`.
#[no_mangle]
pub extern "C" fn pg_finfo_fencekeeper_check_fence() -> &'static Pg_finfo_record {
    &V1
}

/// `fencekeeper.check_fence`: the event trigger that checks a fenced table's token
/// column when its trigger is attached ([`crate::attach`]).
///
/// # Safety
/// Called by the server as an event trigger function.
#[no_mangle]
pub unsafe extern "C-unwind" fn fencekeeper_check_fence(fcinfo: FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the function's body; `check` checks it was called as an event trigger.
    unsafe { run(|| crate::attach::check(fcinfo)) }
}
