//! The outcome of one admit, as a C caller reads it: a struct the caller owns,
//! filled in by the library with no allocation (text is copied into fixed buffers).
#![allow(unsafe_code)]

use crate::raw;
use fencekeeper::{Class, Decision};
use std::ffi::c_char;
use std::fmt::Write;
use std::ptr::addr_of_mut;

/// Text written into a fixed buffer (what does not fit is dropped).
struct Text<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Default for Text<N> {
    fn default() -> Self {
        Text { bytes: [0; N], len: 0 }
    }
}

impl<const N: usize> Text<N> {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl<const N: usize> Write for Text<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let room = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        room.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The class of an outcome: one of the `FENCEKEEPER_CLASS_*` values.
#[allow(non_camel_case_types)]
pub type fencekeeper_class = i32;

/// Admitted: apply the write.
pub const FENCEKEEPER_CLASS_ADMITTED: fencekeeper_class = 0;
/// The token is below the mark (HTTP 409): a newer lock holder exists.
pub const FENCEKEEPER_CLASS_STALE: fencekeeper_class = 1;
/// Strict mode: the token equals the mark (HTTP 409).
pub const FENCEKEEPER_CLASS_REPLAYED: fencekeeper_class = 2;
/// The token or the resource key is malformed (HTTP 400).
pub const FENCEKEEPER_CLASS_MALFORMED: fencekeeper_class = 3;
/// No token was presented (HTTP 428).
pub const FENCEKEEPER_CLASS_MISSING: fencekeeper_class = 4;
/// No verdict could be reached: guest fault, store failure, a verdict the host
/// proved wrong (HTTP 503). In efficiency mode a store failure is let through
/// (`failed_open`).
pub const FENCEKEEPER_CLASS_UNDECIDED: fencekeeper_class = 5;
/// The lock service did not vouch for the token (HTTP 403).
pub const FENCEKEEPER_CLASS_UNVERIFIED: fencekeeper_class = 6;

/// Bytes of `fencekeeper_outcome::mark` and of every other token buffer: the
/// longest canonical token (four u64 components and three dots, 83 bytes) and a NUL.
pub const FENCEKEEPER_TOKEN_CAP: usize = 84;

/// Bytes of `fencekeeper_outcome::reason`, the NUL included. A longer reason (one
/// quoting a long, escaped resource key) is cut at a character boundary and
/// `reason_truncated` is set.
pub const FENCEKEEPER_REASON_CAP: usize = 4096;

const _: () = assert!(FENCEKEEPER_TOKEN_CAP == 4 * 20 + 3 + 1);

/// What an admit decided. The caller allocates it (on its stack is fine); the
/// library writes every field on `FENCEKEEPER_OK` and on `FENCEKEEPER_ERR_AUDIT`,
/// and none on any other status. It holds no pointers: copy it, keep it, free
/// nothing.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct fencekeeper_outcome {
    /// One of `FENCEKEEPER_CLASS_*`.
    pub class_: fencekeeper_class,
    /// The HTTP status of the class (200 admitted, 409, 400, 428, 503, 403).
    pub http_status: u16,
    /// The gRPC status of the class (0 admitted, 9, 3, 14, 7).
    pub grpc_status: u16,
    /// Apply the write: the token was admitted, or efficiency mode let it through
    /// because the store failed (`failed_open`).
    pub admitted: bool,
    /// The admit raised the mark (to `mark`).
    pub advanced: bool,
    /// Efficiency mode let the write through without a verdict (count these).
    pub failed_open: bool,
    /// The validator's verdict was proven wrong by the host and refused (count and
    /// log these: a broken or hostile guest).
    pub breach: bool,
    /// `reason` was cut to fit.
    pub reason_truncated: bool,
    /// Length of `mark`, 0 when there is none.
    pub mark_len: usize,
    /// The token of the outcome, canonical and NUL-terminated: the admitted token
    /// (the mark now) when admitted, the current mark when stale or replayed, empty
    /// otherwise.
    pub mark: [c_char; FENCEKEEPER_TOKEN_CAP],
    /// Length of `reason`.
    pub reason_len: usize,
    /// Why, in one line (NUL-terminated, UTF-8, control characters escaped): for
    /// a response body or a log line.
    pub reason: [c_char; FENCEKEEPER_REASON_CAP],
}

/// Text written straight into a caller's buffer, NUL-terminated, cut at a character
/// boundary when it does not fit (the reason: formatted once, never allocated).
struct Cut {
    buffer: *mut c_char,
    /// Room for text: the buffer less its NUL.
    room: usize,
    len: usize,
    cut: bool,
}

impl Cut {
    /// # Safety
    /// `buffer` points at `cap` writable bytes, `cap` >= 1, for the writer's life.
    unsafe fn new(buffer: *mut c_char, cap: usize) -> Cut {
        Cut { buffer, room: cap - 1, len: 0, cut: false }
    }

    /// Terminate the text: its length, and whether it was cut.
    fn finish(self) -> (usize, bool) {
        // SAFETY: `len <= room < cap` (see `write_str`), within the buffer `new` was given.
        unsafe { self.buffer.add(self.len).write(0) };
        (self.len, self.cut)
    }
}

impl Write for Cut {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.cut {
            return Ok(());
        }
        let mut n = s.len().min(self.room - self.len);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: `len + n <= room`, within the buffer `new` was given; `s` is not in it.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), self.buffer.add(self.len), n) };
        self.len += n;
        self.cut = n < s.len();
        Ok(())
    }
}

/// The class's value in the ABI.
pub(crate) fn class_value(class: Class) -> fencekeeper_class {
    match class {
        Class::Admitted => FENCEKEEPER_CLASS_ADMITTED,
        Class::Stale => FENCEKEEPER_CLASS_STALE,
        Class::Replayed => FENCEKEEPER_CLASS_REPLAYED,
        Class::Malformed => FENCEKEEPER_CLASS_MALFORMED,
        Class::Missing => FENCEKEEPER_CLASS_MISSING,
        Class::Undecided => FENCEKEEPER_CLASS_UNDECIDED,
        Class::Unverified => FENCEKEEPER_CLASS_UNVERIFIED,
    }
}

/// Write `decision` (on `resource`, for its reason) into `out`.
///
/// SAFETY contract: `out` is non-NULL, aligned and points at room for a
/// `fencekeeper_outcome` (checked by `raw::out`, promised by the caller).
pub(crate) unsafe fn write(out: *mut fencekeeper_outcome, decision: &Decision, resource: &str) {
    let class = decision.class();
    // A token's text fits on the stack: no allocation for it.
    let mut mark = Text::<FENCEKEEPER_TOKEN_CAP>::default();
    if let Some(token) = decision.action.token {
        let _ = write!(mark, "{token}");
    }

    // SAFETY: `out` points at a writable outcome (the contract); every field is
    // written through a raw pointer, so an uninitialised struct is never read or
    // referenced, and only the bytes of the two texts are written into the buffers.
    unsafe {
        addr_of_mut!((*out).class_).write(class_value(class));
        addr_of_mut!((*out).http_status).write(class.http_status());
        addr_of_mut!((*out).grpc_status).write(u16::try_from(class.grpc_status()).unwrap_or(u16::MAX));
        addr_of_mut!((*out).admitted).write(decision.admitted());
        addr_of_mut!((*out).advanced).write(decision.advance.is_some());
        addr_of_mut!((*out).failed_open).write(decision.action.failed_open());
        addr_of_mut!((*out).breach).write(decision.breach().is_some());
        let (mark_len, _) = raw::fill(addr_of_mut!((*out).mark).cast(), FENCEKEEPER_TOKEN_CAP, mark.as_str());
        addr_of_mut!((*out).mark_len).write(mark_len);
        let mut reason = Cut::new(addr_of_mut!((*out).reason).cast(), FENCEKEEPER_REASON_CAP);
        let _ = decision.write_reason(&mut reason, resource);
        let (reason_len, cut) = reason.finish();
        addr_of_mut!((*out).reason_len).write(reason_len);
        addr_of_mut!((*out).reason_truncated).write(cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_that_does_not_fit_is_cut_at_a_character_boundary_and_terminated() {
        let mut buffer = [1 as c_char; 7];
        // SAFETY: the buffer is as long as the capacity given.
        let mut cut = unsafe { Cut::new(buffer.as_mut_ptr(), buffer.len()) };
        for piece in ["ab", "ü€", "more"] {
            cut.write_str(piece).ok();
        }
        assert_eq!(cut.finish(), (4, true), "'abü' fits in the 6 bytes of room, '€' does not, nor what follows");
        assert_eq!(buffer[4], 0);
        let mut buffer = [1 as c_char; 8];
        // SAFETY: as above.
        let mut whole = unsafe { Cut::new(buffer.as_mut_ptr(), buffer.len()) };
        whole.write_str("1234567").ok();
        assert_eq!(whole.finish(), (7, false));
    }
}
