//! Text as the server holds it, and as the fence reads it.
//!
//! Resource keys and tokens are UTF-8 in every Fencekeeper host. The server holds
//! text in the database's encoding: in a UTF8 database it is UTF-8 already; in
//! SQL_ASCII it is whatever bytes a client sent, which may not be UTF-8 at all
//! (those are malformed, never read lossily: two different byte strings must never
//! share a mark); any other encoding is converted to UTF-8 by the server.

use pgrx::pg_sys;
use std::borrow::Cow;

/// Text that is not UTF-8 in a SQL_ASCII database.
#[derive(Debug)]
pub struct NotUtf8 {
    /// Where the first byte that is not UTF-8 is.
    pub at: usize,
}

/// The database's encoding as far as the fence is concerned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// UTF8 or SQL_ASCII: the bytes are the text (checked to be UTF-8).
    Bytes,
    /// Anything else: converted by the server.
    Converted,
}

fn encoding() -> Encoding {
    // SAFETY: reads the database encoding the backend fixed when it connected.
    let encoding = unsafe { pg_sys::GetDatabaseEncoding() };
    if encoding == pg_sys::pg_enc::PG_UTF8 as i32 || encoding == pg_sys::pg_enc::PG_SQL_ASCII as i32 {
        Encoding::Bytes
    } else {
        Encoding::Converted
    }
}

/// Server text (the database's encoding) as UTF-8.
pub fn to_utf8(bytes: &[u8]) -> Result<String, NotUtf8> {
    let utf8 = match encoding() {
        Encoding::Bytes => Cow::Borrowed(bytes),
        Encoding::Converted => convert(bytes, true),
    };
    String::from_utf8(utf8.into_owned()).map_err(|e| NotUtf8 { at: e.utf8_error().valid_up_to() })
}

/// UTF-8 text as the server's text, for a statement's parameter.
pub fn to_server(text: &str) -> Cow<'_, [u8]> {
    match encoding() {
        Encoding::Bytes => Cow::Borrowed(text.as_bytes()),
        Encoding::Converted => convert(text.as_bytes(), false),
    }
}

/// A message for the server's log and its client, which expect the database's
/// encoding: UTF-8 as it is in a UTF8 database; elsewhere every character outside
/// ASCII written as `\u{..}`, so that no conversion (which could itself fail) is
/// needed on the way out of a refusal.
pub fn message(text: &str) -> Cow<'_, str> {
    // SAFETY: reads the database encoding the backend fixed when it connected.
    let utf8 = unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32;
    if utf8 || text.is_ascii() {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars().map(|c| if c.is_ascii() { c.to_string() } else { c.escape_unicode().to_string() }).collect(),
    )
}

/// Convert between the server's encoding and UTF-8 (`from_server`: which way). Every
/// character of a valid text has a UTF-8 form, so this cannot lose one; text the
/// server cannot convert is an error the server raises itself.
fn convert(bytes: &[u8], from_server: bool) -> Cow<'_, [u8]> {
    let len = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
    let utf8 = pg_sys::pg_enc::PG_UTF8 as i32;
    // SAFETY: both functions read `len` bytes at the pointer and return either that
    // same pointer (no conversion needed) or a NUL-terminated string they palloc'd,
    // read here before this function returns; server text holds no NUL.
    unsafe {
        let src = bytes.as_ptr().cast::<std::ffi::c_char>();
        let out = if from_server {
            pg_sys::pg_server_to_any(src, len, utf8)
        } else {
            pg_sys::pg_any_to_server(src, len, utf8)
        };
        if out.cast_const() == src {
            return Cow::Borrowed(bytes);
        }
        Cow::Owned(std::ffi::CStr::from_ptr(out).to_bytes().to_vec())
    }
}

/// A datum of type `typoid` as the bytes of its text form: text and varchar as
/// stored, anything else (bigint, numeric, ...) through the type's output function.
///
/// # Safety
/// `datum` must be a valid, non-null datum of type `typoid`.
pub unsafe fn datum_bytes(datum: pg_sys::Datum, typoid: pg_sys::Oid) -> Vec<u8> {
    // SAFETY: the caller vouches for the datum and its type; a text or varchar datum
    // is a varlena (detoasted here), any type has an output function that returns a
    // palloc'd NUL-terminated string.
    unsafe {
        if typoid == pg_sys::TEXTOID || typoid == pg_sys::VARCHAROID {
            let varlena = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
            return pgrx::varlena::varlena_to_byte_slice(varlena).to_vec();
        }
        let (mut output, mut varlena) = (pg_sys::Oid::INVALID, false);
        pg_sys::getTypeOutputInfo(typoid, &mut output, &mut varlena);
        let text = pg_sys::OidOutputFunctionCall(output, datum);
        std::ffi::CStr::from_ptr(text).to_bytes().to_vec()
    }
}
