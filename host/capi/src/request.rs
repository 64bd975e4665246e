//! One admit's request as a C caller passes it: resource bytes and token bytes.
//!
//! The bounds come first, on the lengths alone: a key past the core's 1024 bytes or
//! a token past its 128 is malformed before a byte of it is read, so a wrong length
//! costs nothing and reads nothing. A key that is not UTF-8 is malformed (two byte
//! strings must never share a mark, so nothing is converted lossily). A token that is
//! not UTF-8 goes to the guard lossily converted, as the gateway passes a header: a
//! replacement character is never a digit, so it stays malformed.

use crate::boundary::Failure;
use crate::raw;
use fencekeeper::{Decision, GuestText, Mode, Verdict};
use fencekeeper_core::refusal;
use fencekeeper_core::resource::{self, ResourceError, MAX_KEY_BYTES};
use fencekeeper_core::token::MAX_TOKEN_BYTES;
use fencekeeper_core::Malformed;
use std::borrow::Cow;

/// A request the guard can be asked about, or one that is malformed on its bounds.
pub(crate) enum Request<'a> {
    /// Within bounds: the key, and the token text (`None`: no token was sent).
    Ready {
        /// The resource key.
        resource: &'a str,
        /// The token text.
        token: Option<Cow<'a, str>>,
    },
    /// Malformed before the guard is asked.
    Malformed(Malformed),
}

impl<'a> Request<'a> {
    /// Read a request: `token` NULL (with length 0) means no token was sent.
    ///
    /// # Safety
    /// Each non-NULL pointer names as many readable bytes as its length says, for
    /// `'a` (only lengths within the core's bounds are read).
    pub(crate) unsafe fn read(
        resource_ptr: *const u8,
        resource_len: usize,
        token_ptr: *const u8,
        token_len: usize,
    ) -> Result<Request<'a>, Failure> {
        if token_ptr.is_null() && token_len != 0 {
            return Err(Failure::argument(format!("token is NULL with length {token_len}")));
        }
        if resource_len > MAX_KEY_BYTES {
            if resource_ptr.is_null() {
                return Err(Failure::argument(format!("resource is NULL with length {resource_len}")));
            }
            return Ok(Request::Malformed(Malformed::Resource(ResourceError::TooLong(resource_len))));
        }
        // SAFETY: this function's contract.
        let key = match resource::key_from_bytes(unsafe { raw::bytes(resource_ptr, resource_len, "resource")? }) {
            Ok(key) => key,
            Err(e) => return Ok(Request::Malformed(Malformed::Resource(e))),
        };
        // The key's own rules before the token's, in the order the guard checks them.
        if let Err(e) = resource::check(key) {
            return Ok(Request::Malformed(Malformed::Resource(e)));
        }
        if token_ptr.is_null() {
            return Ok(Request::Ready { resource: key, token: None });
        }
        if token_len > MAX_TOKEN_BYTES {
            return Ok(Request::Malformed(Malformed::TooLong(token_len)));
        }
        // SAFETY: this function's contract.
        let token = String::from_utf8_lossy(unsafe { raw::bytes(token_ptr, token_len, "token")? });
        Ok(Request::Ready { resource: key, token: Some(token) })
    }
}

/// The decision on a request malformed on its bounds: what the guard decides for
/// one that fails its own precheck.
pub(crate) fn malformed(mode: Mode, why: Malformed) -> Decision {
    let verdict = Verdict::Malformed(GuestText::new(&why.to_string()));
    Decision {
        action: refusal::resolve(mode, Ok(&verdict)),
        verdict: Some(verdict),
        undecided: None,
        advance: None,
        retention_floor: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn malformed_of(resource: &[u8], token: Option<&[u8]>) -> Malformed {
        let (t, tl) = token.map_or((std::ptr::null(), 0), |t| (t.as_ptr(), t.len()));
        // SAFETY: the pointers name the slices' bytes.
        match unsafe { Request::read(resource.as_ptr(), resource.len(), t, tl) }.unwrap() {
            Request::Malformed(m) => m,
            Request::Ready { .. } => panic!("accepted"),
        }
    }

    #[test]
    fn over_long_keys_and_tokens_are_malformed_on_their_length_without_being_read() {
        // A length far past the buffer: refused on the length, so nothing past the
        // three real bytes is read (Miri or ASan would catch a read).
        let key = b"abc";
        // SAFETY: the lengths past the buffers are refused before anything is read.
        let long = unsafe { Request::read(key.as_ptr(), 1 << 40, std::ptr::null(), 0) };
        assert!(matches!(long, Ok(Request::Malformed(Malformed::Resource(ResourceError::TooLong(_))))));
        let token = b"34";
        // SAFETY: as above.
        let long = unsafe { Request::read(key.as_ptr(), 3, token.as_ptr(), 1 << 40) };
        assert!(matches!(long, Ok(Request::Malformed(Malformed::TooLong(_)))));
    }

    #[test]
    fn keys_that_are_not_utf8_are_malformed_and_the_key_is_checked_before_the_token() {
        assert_eq!(malformed_of(b"/\xff\xfe", Some(b"34")), Malformed::Resource(ResourceError::NotUtf8));
        assert_eq!(malformed_of(b"", Some(&[b'0'; 200])), Malformed::Resource(ResourceError::Empty));
    }

    #[test]
    fn a_token_that_is_not_utf8_reaches_the_guard_as_text_that_cannot_parse() {
        let t = b"3\xff4";
        // SAFETY: the pointers name the slices' bytes (or are NULL).
        let (ready, without) = unsafe {
            (Request::read(b"k".as_ptr(), 1, t.as_ptr(), t.len()), Request::read(b"k".as_ptr(), 1, std::ptr::null(), 2))
        };
        let Ok(Request::Ready { token: Some(text), .. }) = ready else { panic!("not ready") };
        assert!(fencekeeper::Token::parse(&text).is_err());
        assert!(without.is_err(), "a length without a token");
    }
}
