//! libfencekeeper_capi: the `fencekeeper` host library behind a C ABI, so that a
//! storage engine in C, C++, Go, Python or anything else that calls C gets the same
//! fencing as a Rust one: the bundled WebAssembly validator (or a guest of its own)
//! under the same limits, every verdict checked, marks in memory, a durable file,
//! etcd, or the engine's own transaction.
//!
//! The header, `include/fencekeeper_capi.h`, is generated from this crate by
//! cbindgen and committed; it is the reference for C callers, with the ownership and
//! thread-safety rules. This crate adds no policy: every decision is the guard's
//! (`fencekeeper::Guard`), every check the core's. What it adds is the boundary: no
//! panic crosses it, every pointer and length is checked where it can be, and every
//! failure is a status with a one-line message.
//!
//! # Layout
//! * this file: the exported functions and the guard handle.
//! * `boundary`: statuses, the thread's last error, the panic boundary.
//! * `raw`: pointers and lengths from C, checked.
//! * `request`: an admit's (resource, token) bytes, bounded before they are read.
//! * `options`: what a guard is opened with (validator, policy, store, audit).
//! * `outcome`: the outcome struct an admit fills.
//! * `engine_store`: the callback table that is the C form of `MarkStore`.
#![allow(unsafe_code)] // Exported `#[no_mangle]` functions; every `unsafe` block says why it holds.

mod boundary;
mod engine_store;
mod options;
mod outcome;
mod raw;
mod request;

pub use boundary::*;
pub use engine_store::*;
pub use options::*;
pub use outcome::*;

use boundary::{call, Failure};
use engine_store::EngineStore;
use fencekeeper::audit::{self, Change, Entry};
use fencekeeper::store::MarkStore;
use fencekeeper::{Decision, Token};
use options::Opened;
use request::Request;
use std::ffi::{c_char, c_void};

/// The version of this ABI: a change that breaks a caller built against an earlier
/// header bumps it. Compare it with `fencekeeper_abi_version()` at start-up.
pub const FENCEKEEPER_ABI_VERSION: u32 = 1;

/// A handle's first word while it is open; cleared when it is closed, so that a
/// closed or foreign pointer is refused (on a best-effort basis: memory that was
/// freed may hold anything).
const OPEN: u64 = 0x6665_6e63_656b_6565; // "fencekee"

/// An open guard: a validator, a policy, a mark store. Opaque; made by
/// `fencekeeper_guard_open`, released by `fencekeeper_guard_close`.
#[allow(non_camel_case_types)]
pub struct fencekeeper_guard {
    magic: u64,
    opened: Opened,
}

/// The version of the ABI this library implements (`FENCEKEEPER_ABI_VERSION`).
#[no_mangle]
pub extern "C" fn fencekeeper_abi_version() -> u32 {
    FENCEKEEPER_ABI_VERSION
}

/// The message of the last call on this thread that failed: one line of UTF-8,
/// empty after a call that succeeded. The pointer stays valid until the next call
/// into the library on this thread; never free it.
#[no_mangle]
pub extern "C" fn fencekeeper_last_error() -> *const c_char {
    boundary::last_error()
}

/// Open a guard as `options` say (NULL: every default) and store its handle in
/// `*guard`. Loading the validator runs the conformance vectors against it; the
/// store is opened and checked (a corrupt file or an unreachable etcd fails here).
/// On failure `*guard` is set to NULL.
///
/// # Safety
/// `options` is NULL or points at a `fencekeeper_options` whose non-NULL strings are
/// NUL-terminated; `guard` points at room for one pointer.
#[no_mangle]
pub unsafe extern "C" fn fencekeeper_guard_open(
    options: *const fencekeeper_options,
    guard: *mut *mut fencekeeper_guard,
) -> fencekeeper_status {
    call(|| {
        let out = raw::out(guard, "guard")?;
        // SAFETY: `out` is non-NULL and aligned (checked); the caller promises room
        // for a pointer. Cleared first, so a failure leaves NULL behind.
        unsafe { out.write(std::ptr::null_mut()) };
        let defaults = zeroed_options();
        // SAFETY: this function's contract.
        let options = if options.is_null() { &defaults } else { unsafe { raw::get(options, "options")? } };
        // SAFETY: this function's contract.
        let opened = unsafe { options::open(options)? };
        let handle = Box::into_raw(Box::new(fencekeeper_guard { magic: OPEN, opened }));
        // SAFETY: as above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Close a guard and free it (NULL is ignored). No other call on the guard may be
/// running or start after this one: the caller keeps that order.
///
/// # Safety
/// `guard` is NULL or a handle from `fencekeeper_guard_open`, not in use elsewhere.
#[no_mangle]
pub unsafe extern "C" fn fencekeeper_guard_close(guard: *mut fencekeeper_guard) {
    call(|| {
        if guard.is_null() {
            return Ok(());
        }
        // SAFETY: this function's contract.
        unsafe { open_guard(guard)? };
        // SAFETY: `guard` came from `fencekeeper_guard_open` (its magic says so) and
        // is not used by anyone else any more (the caller's promise). The magic is
        // cleared before the box is freed, so a second close is refused while the
        // memory still holds the handle.
        unsafe {
            (*guard).magic = 0;
            drop(Box::from_raw(guard));
        }
        Ok(())
    });
}

/// Decide on a write of `resource` (`resource_len` bytes of UTF-8) carrying
/// `token` (`token_len` bytes; `token` NULL: the write carried none), and advance
/// the mark in the guard's store when the token is admitted above it. Fills
/// `*outcome`. A refusal is `FENCEKEEPER_OK` with the outcome saying why; an error
/// status means the arguments were unusable (or `FENCEKEEPER_ERR_AUDIT`: the mark
/// advanced but its audit line was not written).
///
/// # Safety
/// `guard` is an open guard; `resource` (and `token`, when not NULL) name readable
/// bytes of their lengths; `outcome` points at room for a `fencekeeper_outcome`.
#[no_mangle]
pub unsafe extern "C" fn fencekeeper_admit(
    guard: *const fencekeeper_guard,
    resource: *const u8,
    resource_len: usize,
    token: *const u8,
    token_len: usize,
    outcome: *mut fencekeeper_outcome,
) -> fencekeeper_status {
    call(|| {
        // SAFETY: this function's contract.
        let opened = unsafe { open_guard(guard)? };
        let out = raw::out(outcome, "outcome")?;
        // SAFETY: this function's contract.
        let request = unsafe { Request::read(resource, resource_len, token, token_len)? };
        let (decision, resource, token) = decide(opened, request, |r, t| opened.guard.admit(r, t));
        // SAFETY: `out` was checked by `raw::out`; the caller promises room for it.
        unsafe { outcome::write(out, &decision, resource) };
        match (&opened.audit, decision.advance) {
            (Some(log), Some(advance)) => {
                let entry = entry(opened, resource, token.as_deref(), advance, &opened.store_name);
                log.append(&entry).map_err(|e| Failure::new(FENCEKEEPER_ERR_AUDIT, e))
            }
            _ => Ok(()),
        }
    })
}

/// `fencekeeper_admit` against the caller's own store (`store`, a callback table)
/// instead of the guard's: the mark is read and swapped through the callbacks,
/// inside whatever transaction the caller has open, so it commits or rolls back
/// with the write. When the admit raises the mark and the table has an `audit`
/// callback, the audit line goes to it before this returns (`FENCEKEEPER_ERR_AUDIT`
/// if it fails: roll the transaction back). The guard's own store is not touched.
///
/// # Safety
/// As for `fencekeeper_admit`, and `store` points at a table whose callbacks have
/// the documented signatures and whose `name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn fencekeeper_admit_in(
    guard: *const fencekeeper_guard,
    store: *const fencekeeper_mark_store,
    resource: *const u8,
    resource_len: usize,
    token: *const u8,
    token_len: usize,
    outcome: *mut fencekeeper_outcome,
) -> fencekeeper_status {
    call(|| {
        // SAFETY: this function's contract, for all four.
        let (opened, table) = unsafe { (open_guard(guard)?, raw::get(store, "store")?) };
        // SAFETY: as above.
        let table = unsafe { EngineStore::new(table) }.map_err(Failure::argument)?;
        let out = raw::out(outcome, "outcome")?;
        // SAFETY: as above.
        let request = unsafe { Request::read(resource, resource_len, token, token_len)? };
        let (decision, resource, token) = decide(opened, request, |r, t| opened.guard.admit_in(&table, r, t));
        // SAFETY: as in `fencekeeper_admit`.
        unsafe { outcome::write(out, &decision, resource) };
        match decision.advance {
            Some(advance) => {
                let line = entry(opened, resource, token.as_deref(), advance, table.name()).to_string();
                table.audit(&line).map_err(|e| Failure::new(FENCEKEEPER_ERR_AUDIT, e))
            }
            None => Ok(()),
        }
    })
}

/// The mark of `resource` in the guard's store: its canonical text in `mark` (room
/// for `FENCEKEEPER_TOKEN_CAP` bytes, NUL-terminated) and `*found` true, or `*found`
/// false and `mark` empty when it has none. A damaged record is
/// `FENCEKEEPER_ERR_STORE`, never "no mark".
///
/// # Safety
/// `guard` is an open guard; `resource` names readable bytes of its length; `mark`
/// points at `FENCEKEEPER_TOKEN_CAP` writable bytes, `found` at a bool.
#[no_mangle]
pub unsafe extern "C" fn fencekeeper_mark(
    guard: *const fencekeeper_guard,
    resource: *const u8,
    resource_len: usize,
    mark: *mut c_char,
    found: *mut bool,
) -> fencekeeper_status {
    call(|| {
        // SAFETY: this function's contract.
        unsafe { read_mark(open_guard(guard)?.guard.store(), resource, resource_len, mark, found) }
    })
}

/// `fencekeeper_mark` through the caller's callback table (its `get` alone): the
/// mark an engine keeps, checked as the guard checks it.
///
/// # Safety
/// As for `fencekeeper_mark`, with `store` as for `fencekeeper_admit_in`.
#[no_mangle]
pub unsafe extern "C" fn fencekeeper_mark_in(
    store: *const fencekeeper_mark_store,
    resource: *const u8,
    resource_len: usize,
    mark: *mut c_char,
    found: *mut bool,
) -> fencekeeper_status {
    call(|| {
        // SAFETY: this function's contract.
        let table = unsafe { EngineStore::new(raw::get(store, "store")?) }.map_err(Failure::argument)?;
        // SAFETY: as above.
        unsafe { read_mark(&table, resource, resource_len, mark, found) }
    })
}

/// Called once per mark by `fencekeeper_marks`, in resource order: the resource
/// key's bytes and the mark's canonical text (NUL-terminated), valid only during
/// the call. Return 0 to go on, anything else to stop.
#[allow(non_camel_case_types)]
pub type fencekeeper_visit_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        resource: *const u8,
        resource_len: usize,
        mark: *const c_char,
        mark_len: usize,
    ) -> i32,
>;

/// Every mark in the guard's store, sorted by resource, each passed to `visit`.
/// The memory and file stores list marks; etcd lists in pages. A damaged record
/// fails the whole listing with `FENCEKEEPER_ERR_STORE`.
///
/// # Safety
/// `guard` is an open guard; `visit` has the documented signature.
#[no_mangle]
pub unsafe extern "C" fn fencekeeper_marks(
    guard: *const fencekeeper_guard,
    visit: fencekeeper_visit_fn,
    ctx: *mut c_void,
) -> fencekeeper_status {
    call(|| {
        // SAFETY: this function's contract.
        let opened = unsafe { open_guard(guard)? };
        let visit = visit.ok_or_else(|| Failure::argument("visit is NULL"))?;
        let marks = opened.guard.store().list().map_err(|e| Failure::new(FENCEKEEPER_ERR_STORE, e))?;
        for (resource, mark) in marks {
            let text = std::ffi::CString::new(mark.to_string()).unwrap_or_default();
            let len = text.as_bytes().len();
            // SAFETY: the caller promised a callback of this signature; the key and
            // the text live until it returns.
            let stop = unsafe { visit(ctx, resource.as_ptr(), resource.len(), text.as_ptr(), len) };
            if stop != 0 {
                break;
            }
        }
        Ok(())
    })
}

/// The guard behind a handle, if it is one.
///
/// # Safety
/// `guard` is NULL, or points at readable memory the size of a handle (an open one,
/// or one that was closed and not yet reused).
unsafe fn open_guard<'a>(guard: *const fencekeeper_guard) -> Result<&'a Opened, Failure> {
    // SAFETY: this function's contract.
    let handle = unsafe { raw::get(guard, "guard")? };
    if handle.magic != OPEN {
        return Err(Failure::argument("guard is not an open guard (closed already, or another pointer)"));
    }
    Ok(&handle.opened)
}

/// Decide on a request: through `admit` when it is within bounds, else malformed as
/// the guard would call it. Also the resource and token text, for the reason and
/// the audit line.
fn decide<'r>(
    opened: &Opened,
    request: Request<'r>,
    admit: impl FnOnce(&str, Option<&str>) -> Decision,
) -> (Decision, &'r str, Option<std::borrow::Cow<'r, str>>) {
    match request {
        Request::Ready { resource, token } => (admit(resource, token.as_deref()), resource, token),
        Request::Malformed(why) => (request::malformed(opened.guard.decider().policy().mode, why), "", None),
    }
}

/// The audit record of an advance, in the one format every host writes.
fn entry<'a>(
    opened: &'a Opened,
    resource: &'a str,
    token: Option<&'a str>,
    advance: fencekeeper::Advance,
    store: &'a str,
) -> Entry<'a> {
    Entry {
        unix_ms: audit::now_ms(),
        host: &opened.host,
        reason: Change::Advance,
        resource,
        old: advance.from,
        old_damaged: None,
        new: Some(advance.to),
        token,
        client: None,
        user: None,
        store,
    }
}

/// # Safety
/// `resource` names readable bytes of its length; `mark` points at
/// `FENCEKEEPER_TOKEN_CAP` writable bytes, `found` at a bool.
unsafe fn read_mark(
    store: &dyn MarkStore,
    resource: *const u8,
    resource_len: usize,
    mark: *mut c_char,
    found: *mut bool,
) -> Result<(), Failure> {
    let mark_out = raw::out(mark, "mark")?;
    let found_out = raw::out(found, "found")?;
    // SAFETY: this function's contract.
    let key = match unsafe { Request::read(resource, resource_len, std::ptr::null(), 0)? } {
        Request::Ready { resource, .. } => resource,
        Request::Malformed(why) => return Err(Failure::argument(why.to_string())),
    };
    let current: Option<Token> = store.get(key).map_err(|e| Failure::new(boundary::FENCEKEEPER_ERR_STORE, e))?;
    let text = current.map(|t| t.to_string()).unwrap_or_default();
    // SAFETY: both checked by `raw::out`; the caller promises `FENCEKEEPER_TOKEN_CAP`
    // bytes at `mark` and a bool at `found`.
    unsafe {
        raw::fill(mark_out, FENCEKEEPER_TOKEN_CAP, &text);
        found_out.write(current.is_some());
    }
    Ok(())
}

fn zeroed_options() -> fencekeeper_options {
    fencekeeper_options {
        guest_path: std::ptr::null(),
        mode: FENCEKEEPER_MODE_CORRECTNESS,
        strict: 0,
        store: FENCEKEEPER_STORE_KIND_MEMORY,
        store_path: std::ptr::null(),
        etcd_endpoint: std::ptr::null(),
        etcd_prefix: std::ptr::null(),
        etcd_timeout_ms: 0,
        etcd_ca: std::ptr::null(),
        etcd_cert: std::ptr::null(),
        etcd_key: std::ptr::null(),
        etcd_user: std::ptr::null(),
        etcd_password: std::ptr::null(),
        audit_path: std::ptr::null(),
        host_name: std::ptr::null(),
    }
}
