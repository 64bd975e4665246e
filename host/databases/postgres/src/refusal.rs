//! A refused write as the client sees it: an ERROR with a SQLSTATE of class `FK`,
//! one per refusal class, the one-line reason as its message and, for stale and
//! replayed tokens, the mark in its DETAIL as `fencing-highest: MARK` (the HTTP
//! hosts' header). Raising it aborts the transaction, or the subtransaction a client
//! opened with a savepoint.
//!
//! | class | SQLSTATE | HTTP |
//! |---|---|---|
//! | stale | FK001 | 409 |
//! | replayed (strict mode) | FK002 | 409 |
//! | missing | FK003 | 428 |
//! | malformed | FK004 | 400 |
//! | unverified | FK005 (reserved: no provenance check runs in a database) | 403 |
//! | undecided | FK006 | 503 |
//!
//! pgrx raises only the server's own codes, so the error is raised here with the
//! server's `ereport` calls, after every Rust value of the call has been dropped.

use fencekeeper::{Class, Token};
use std::ffi::{c_char, c_int, CString};

/// A write that was not admitted, and why.
#[derive(Debug)]
pub struct Refusal {
    /// Its class.
    pub class: Class,
    /// The reason, one line.
    pub message: String,
    /// The mark that refused it (stale, replayed).
    pub highest: Option<Token>,
}

impl Refusal {
    /// A refusal of `class` for `message`.
    pub fn new(class: Class, message: impl Into<String>) -> Refusal {
        Refusal { class, message: message.into(), highest: None }
    }

    /// The SQLSTATE of this refusal.
    pub fn sqlstate(&self) -> &'static [u8; 5] {
        sqlstate(self.class)
    }
}

/// The SQLSTATE of each refusal class (`Admitted` has none; it is never raised).
pub fn sqlstate(class: Class) -> &'static [u8; 5] {
    match class {
        Class::Stale => b"FK001",
        Class::Replayed => b"FK002",
        Class::Missing => b"FK003",
        Class::Malformed => b"FK004",
        Class::Unverified => b"FK005",
        Class::Undecided | Class::Admitted => b"FK006",
    }
}

/// The server's encoding of a SQLSTATE (`MAKE_SQLSTATE`: six bits a character).
fn make_sqlstate(code: &[u8; 5]) -> c_int {
    code.iter().enumerate().map(|(i, c)| (c_int::from(*c - b'0') & 0x3f) << (6 * i)).sum()
}

/// Text for the server, in its encoding ([`crate::text::message`]); a NUL would end
/// it early, so it is replaced.
fn c_text(text: &str) -> CString {
    CString::new(crate::text::message(text).replace('\0', "\u{fffd}")).unwrap_or_default()
}

// The server's error functions; pgrx does not export them (it raises only its own
// codes). errmsg and the others copy their text into the error before they return.
extern "C-unwind" {
    fn errstart(elevel: c_int, domain: *const c_char) -> bool;
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errmsg_internal(fmt: *const c_char, ...) -> c_int;
    fn errdetail_internal(fmt: *const c_char, ...) -> c_int;
    fn errhint(fmt: *const c_char, ...) -> c_int;
    fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
}

/// Raise `refusal` as an ERROR. Does not return: the server unwinds to the
/// transaction's (or savepoint's) abort.
///
/// # Safety
/// Call it only from the top frame of a C entry point, with nothing left alive that
/// needs dropping: the server leaves this frame with a `longjmp`.
pub unsafe fn raise(refusal: Refusal) -> ! {
    let code = make_sqlstate(refusal.sqlstate());
    let message = c_text(&refusal.message);
    let detail = refusal.highest.map(|mark| c_text(&format!("fencing-highest: {mark}")));
    let hint = match refusal.class {
        Class::Missing => Some("send the lock's fencing token with the write"),
        Class::Malformed => {
            Some("a token is 1 to 4 unsigned 64-bit numbers joined by '.'; a resource is 1 to 1024 bytes of UTF-8")
        }
        _ => None,
    }
    .map(c_text);
    drop(refusal);
    // SAFETY: the ereport sequence of the server's elog.h for an ERROR: errstart is
    // true at ERROR, each err* call copies its text into the error being built, the
    // Rust strings are dropped before errfinish, which longjmps out (the caller's
    // contract: no frame above holds anything to drop). The file and function names
    // are static.
    unsafe {
        if errstart(pgrx::pg_sys::elog::PgLogLevel::ERROR as c_int, std::ptr::null()) {
            errcode(code);
            errmsg_internal(c"%s".as_ptr(), message.as_ptr());
            if let Some(detail) = &detail {
                errdetail_internal(c"%s".as_ptr(), detail.as_ptr());
            }
            if let Some(hint) = &hint {
                errhint(c"%s".as_ptr(), hint.as_ptr());
            }
            drop((message, detail, hint));
            errfinish(c"host/databases/postgres/src/refusal.rs".as_ptr(), line!() as c_int, c"fencekeeper".as_ptr());
        }
    }
    // errfinish does not return at ERROR; were it ever to, aborting is the safe end.
    std::process::abort()
}
