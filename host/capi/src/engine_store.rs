//! The C form of `MarkStore`: a table of callbacks into the caller's own storage, so
//! that an engine keeps marks inside its own transaction (`fencekeeper_admit_in`).
//!
//! The engine stores *records*, not tokens: the library hands it the bytes to keep
//! (`fencekeeper_core::record`, `fk2 34 fc4dab37`, at most `FENCEKEEPER_RECORD_CAP`
//! bytes, whose CRC32C covers the resource key and the token) and verifies whatever
//! comes back. So the engine needs no token parser, compares values as opaque bytes
//! (the encoding is deterministic: equal marks, equal bytes), and a value its disk
//! damaged, or one moved to another key, is a store error, never a lower mark.
#![allow(unsafe_code)]

use fencekeeper::store::{MarkStore, StoreError, Swap};
use fencekeeper::{GuestText, Token};
use fencekeeper_core::record;
use std::ffi::{c_char, c_void, CStr};

/// A callback's answer: one of the `FENCEKEEPER_STORE_*` values. Zero is no
/// answer (a callback that forgot to return one is an error, never a success).
#[allow(non_camel_case_types)]
pub type fencekeeper_store_status = i32;

/// `get`: the mark's value was written to `value`, its length to `*value_len`.
pub const FENCEKEEPER_STORE_FOUND: fencekeeper_store_status = 1;
/// `get`: the resource has no mark.
pub const FENCEKEEPER_STORE_ABSENT: fencekeeper_store_status = 2;
/// `compare_and_swap`: the stored value was `expected` and is now `value`.
pub const FENCEKEEPER_STORE_SWAPPED: fencekeeper_store_status = 3;
/// `compare_and_swap`: the stored value is not `expected`; nothing was written.
pub const FENCEKEEPER_STORE_CONFLICT: fencekeeper_store_status = 4;
/// `audit`: the line was written.
pub const FENCEKEEPER_STORE_WRITTEN: fencekeeper_store_status = 5;
/// Any callback: it failed; a one-line reason may be written to `why`.
pub const FENCEKEEPER_STORE_FAILED: fencekeeper_store_status = 6;

/// The longest value a store keeps for one mark, in bytes (no NUL).
pub const FENCEKEEPER_RECORD_CAP: usize = 96;
/// Bytes of the `why` buffer a callback may write a failure's reason into (NUL
/// included; a reason without a NUL is read up to the buffer's end).
pub const FENCEKEEPER_WHY_CAP: usize = 256;

const _: () = assert!(FENCEKEEPER_RECORD_CAP == record::MAX_LEN);

/// Read `resource`'s stored value into `value` (room for `*value_len` bytes, which
/// is `FENCEKEEPER_RECORD_CAP`), set `*value_len` to its length, and answer
/// `FENCEKEEPER_STORE_FOUND`; or answer `FENCEKEEPER_STORE_ABSENT` or
/// `FENCEKEEPER_STORE_FAILED`.
#[allow(non_camel_case_types)]
pub type fencekeeper_get_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        resource: *const u8,
        resource_len: usize,
        value: *mut u8,
        value_len: *mut usize,
        why: *mut c_char,
        why_cap: usize,
    ) -> fencekeeper_store_status,
>;

/// If `resource`'s stored value is byte for byte `expected` (`expected` NULL,
/// `expected_len` 0: the resource has no mark), store `value` instead and answer
/// `FENCEKEEPER_STORE_SWAPPED`; else change nothing and answer
/// `FENCEKEEPER_STORE_CONFLICT`; or `FENCEKEEPER_STORE_FAILED`. Atomic with `get`
/// (inside the engine's write transaction that is free).
#[allow(non_camel_case_types)]
pub type fencekeeper_swap_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        resource: *const u8,
        resource_len: usize,
        expected: *const u8,
        expected_len: usize,
        value: *const u8,
        value_len: usize,
        why: *mut c_char,
        why_cap: usize,
    ) -> fencekeeper_store_status,
>;

/// Keep the audit line of a mark this admit raised (one JSON line, NUL-terminated,
/// no newline), in the same transaction as the mark; answer
/// `FENCEKEEPER_STORE_WRITTEN` or `FENCEKEEPER_STORE_FAILED`.
#[allow(non_camel_case_types)]
pub type fencekeeper_audit_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        line: *const c_char,
        line_len: usize,
        why: *mut c_char,
        why_cap: usize,
    ) -> fencekeeper_store_status,
>;

/// A mark store made of the caller's callbacks. The library calls them only during
/// the call that was given the table, on the calling thread, and keeps no pointer
/// to the table or to `ctx` after it returns.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct fencekeeper_mark_store {
    /// Passed to every callback as is.
    pub ctx: *mut c_void,
    /// Required.
    pub get: fencekeeper_get_fn,
    /// Required.
    pub compare_and_swap: fencekeeper_swap_fn,
    /// Optional (NULL: no audit line is produced).
    pub audit: fencekeeper_audit_fn,
    /// Optional: what the store is called in errors and in audit lines (NUL-terminated
    /// UTF-8; NULL: "the engine's store").
    pub name: *const c_char,
}

/// A checked table, as the guard uses it.
pub(crate) struct EngineStore<'a> {
    table: &'a fencekeeper_mark_store,
    name: String,
}

impl<'a> EngineStore<'a> {
    /// Check `table` (the required callbacks are there, the name is UTF-8).
    ///
    /// # Safety
    /// `table.name` is NULL or a NUL-terminated string.
    pub(crate) unsafe fn new(table: &'a fencekeeper_mark_store) -> Result<EngineStore<'a>, String> {
        if table.get.is_none() || table.compare_and_swap.is_none() {
            return Err("the mark store table needs both get and compare_and_swap".to_owned());
        }
        // SAFETY: this function's contract.
        let name = match unsafe { crate::raw::text(table.name, "the mark store's name") } {
            Ok(Some(name)) => GuestText::new(name).to_string(),
            Ok(None) => "the engine's store".to_owned(),
            Err(e) => return Err(e.message),
        };
        Ok(EngineStore { table, name })
    }

    /// The store's name, for audit lines.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Hand `line` to the table's audit callback, if it has one.
    pub(crate) fn audit(&self, line: &str) -> Result<(), String> {
        let Some(audit) = self.table.audit else { return Ok(()) };
        let text = std::ffi::CString::new(line).map_err(|_| "an audit line with a NUL".to_owned())?;
        let mut why = Why::new();
        // SAFETY: the caller promised a callback of this signature (header); the line
        // and the why buffer live until it returns, and it keeps no pointer to them.
        let status = unsafe { audit(self.table.ctx, text.as_ptr(), line.len(), why.ptr(), FENCEKEEPER_WHY_CAP) };
        match status {
            FENCEKEEPER_STORE_WRITTEN => Ok(()),
            FENCEKEEPER_STORE_FAILED => Err(format!("{} could not keep the audit line: {}", self.name, why.text())),
            other => Err(format!("{}'s audit callback answered {other}, not WRITTEN or FAILED", self.name)),
        }
    }

    fn failed(&self, call: &str, status: fencekeeper_store_status, expected: &str, why: &Why) -> StoreError {
        if status == FENCEKEEPER_STORE_FAILED {
            StoreError::Unavailable(format!("{}: {call} failed: {}", self.name, why.text()))
        } else {
            StoreError::Unavailable(format!("{}: {call} answered {status}, not {expected}", self.name))
        }
    }
}

impl MarkStore for EngineStore<'_> {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        let Some(get) = self.table.get else { return Err(StoreError::Unsupported("get")) };
        let mut value = [0u8; FENCEKEEPER_RECORD_CAP];
        let mut len = value.len();
        let mut why = Why::new();
        // SAFETY: the caller promised a callback of this signature; every pointer
        // passed lives until it returns, `value` has room for `len` bytes.
        let status = unsafe {
            get(self.table.ctx, resource.as_ptr(), resource.len(), value.as_mut_ptr(), &mut len, why.ptr(), why.cap())
        };
        match status {
            FENCEKEEPER_STORE_ABSENT => Ok(None),
            FENCEKEEPER_STORE_FOUND => {
                let stored = value.get(..len).ok_or_else(|| {
                    StoreError::Unavailable(format!(
                        "{}: get answered a value of {len} bytes; a mark's value is at most {FENCEKEEPER_RECORD_CAP}",
                        self.name
                    ))
                })?;
                record::decode(resource.as_bytes(), stored).map(Some).map_err(|e| StoreError::Damaged {
                    resource: resource.to_owned(),
                    store: self.name.clone(),
                    detail: e.to_string(),
                })
            }
            other => Err(self.failed("get", other, "FOUND, ABSENT or FAILED", &why)),
        }
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        let Some(swap) = self.table.compare_and_swap else { return Err(StoreError::Unsupported("compare_and_swap")) };
        // The engine compares record bytes, not tokens: a swap that would not raise
        // the mark is refused here, whatever its caller asks.
        if !fencekeeper::store::raises(expected, new) {
            return Ok(Swap::Conflict(self.get(resource)?));
        }
        let expected = expected.map(|t| record::encode(resource.as_bytes(), t));
        let (expected_ptr, expected_len) = match &expected {
            Some(r) => (r.as_bytes().as_ptr(), r.as_bytes().len()),
            None => (std::ptr::null(), 0),
        };
        let value = record::encode(resource.as_bytes(), new);
        let mut why = Why::new();
        // SAFETY: as in `get`; the records live on this stack frame until it returns.
        let status = unsafe {
            swap(
                self.table.ctx,
                resource.as_ptr(),
                resource.len(),
                expected_ptr,
                expected_len,
                value.as_bytes().as_ptr(),
                value.as_bytes().len(),
                why.ptr(),
                why.cap(),
            )
        };
        match status {
            FENCEKEEPER_STORE_SWAPPED => Ok(Swap::Swapped),
            FENCEKEEPER_STORE_CONFLICT => Ok(Swap::Conflict(self.get(resource)?)),
            other => Err(self.failed("compare_and_swap", other, "SWAPPED, CONFLICT or FAILED", &why)),
        }
    }
}

/// The buffer a callback writes a failure's reason into.
struct Why([c_char; FENCEKEEPER_WHY_CAP]);

impl Why {
    fn new() -> Why {
        Why([0; FENCEKEEPER_WHY_CAP])
    }

    fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr()
    }

    fn cap(&self) -> usize {
        self.0.len()
    }

    /// What the callback wrote, up to a NUL or the buffer's end, made safe to print.
    fn text(&self) -> String {
        let bytes: Vec<u8> = self.0.iter().map(|&c| c as u8).collect();
        let text = match CStr::from_bytes_until_nul(&bytes) {
            Ok(c) => c.to_string_lossy().into_owned(),
            Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
        };
        if text.is_empty() {
            "(no reason given)".to_owned()
        } else {
            GuestText::new(&text).to_string()
        }
    }
}
