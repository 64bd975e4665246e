//! The edge every exported function crosses: statuses, the thread's last error, and
//! the panic boundary.
//!
//! A function either succeeds (`FENCEKEEPER_OK`) or returns one of the error statuses
//! and leaves a one-line message for [`crate::fencekeeper_last_error`]. A panic inside
//! the library is caught here and becomes `FENCEKEEPER_ERR_PANIC`: unwinding into C
//! is undefined behaviour, and aborting would take the caller's engine down with it.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A function's status: `FENCEKEEPER_OK` or one of the `FENCEKEEPER_ERR_*` values.
#[allow(non_camel_case_types)]
pub type fencekeeper_status = i32;

/// The call succeeded. (A refused write is a success: the outcome says why.)
pub const FENCEKEEPER_OK: fencekeeper_status = 0;
/// An argument was unusable: a NULL pointer where one is required, a length
/// without its pointer, an unknown enum value, a misaligned struct, text that must
/// be UTF-8 and is not, or a handle that is not an open guard.
pub const FENCEKEEPER_ERR_ARGUMENT: fencekeeper_status = 1;
/// The validator guest could not be loaded (not a component, wrong world, an
/// import, a failed conformance vector, a file that cannot be read).
pub const FENCEKEEPER_ERR_LOAD: fencekeeper_status = 2;
/// The mark store could not be opened or read (a corrupt file, a damaged record,
/// etcd unreachable or refusing the credentials).
pub const FENCEKEEPER_ERR_STORE: fencekeeper_status = 3;
/// The admit advanced the mark, but its audit line was not written. The outcome is
/// filled in and true; what to do with the write is the caller's choice.
pub const FENCEKEEPER_ERR_AUDIT: fencekeeper_status = 4;
/// A bug in the library: a panic, caught at the boundary. The guard stays usable
/// (it keeps no state of its own between calls), but please report it.
pub const FENCEKEEPER_ERR_PANIC: fencekeeper_status = 5;

/// An error on its way out: a status and a one-line message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: fencekeeper_status,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn argument(message: impl Into<String>) -> Failure {
        Failure { status: FENCEKEEPER_ERR_ARGUMENT, message: message.into() }
    }

    pub(crate) fn new(status: fencekeeper_status, message: impl std::fmt::Display) -> Failure {
        Failure { status, message: message.to_string() }
    }
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // One line, and no NUL inside (CString would refuse it).
    let line: String = message.chars().map(|c| if c == '\0' || c == '\n' || c == '\r' { ' ' } else { c }).collect();
    let text = CString::new(line).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Clear the last error, without allocating when it is clear already (every call
/// does this, most of them successful).
fn clear_last_error() {
    LAST_ERROR.with(|e| {
        if !e.borrow().is_empty() {
            *e.borrow_mut() = CString::default();
        }
    });
}

/// The last error's text on this thread. Valid until the next call into the
/// library on this thread.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Run `body` at the boundary: its failure becomes a status and the last error, a
/// panic becomes `FENCEKEEPER_ERR_PANIC`. Every call clears the last error first.
pub(crate) fn call(body: impl FnOnce() -> Result<(), Failure>) -> fencekeeper_status {
    clear_last_error();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => FENCEKEEPER_OK,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            set_last_error(&format!("internal error in libfencekeeper_capi (a bug, please report it): {what}"));
            FENCEKEEPER_ERR_PANIC
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: `last_error` points at this thread's CString, alive until the next call.
        #[allow(unsafe_code)]
        unsafe { CStr::from_ptr(last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    #[allow(clippy::panic)]
    fn a_panic_is_a_status_and_one_line_never_an_unwind() {
        assert_eq!(call(|| panic!("boom\non two lines")), FENCEKEEPER_ERR_PANIC);
        assert!(last().ends_with("boom on two lines"), "{}", last());
        assert_eq!(call(|| Ok(())), FENCEKEEPER_OK);
        assert_eq!(last(), "", "a successful call clears the last error");
        assert_eq!(call(|| Err(Failure::argument("a\0b"))), FENCEKEEPER_ERR_ARGUMENT);
        assert_eq!(last(), "a b");
    }
}
