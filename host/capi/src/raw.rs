//! Reading what a C caller passed: (pointer, length) pairs, C strings, structs to
//! fill. Every check that can be made on a pointer is made here (NULL, alignment,
//! a length without a pointer, lengths past `isize::MAX`); what cannot be checked
//! (that the memory is really there) is the caller's promise, written in the header.
//!
//! Lengths are also bounded before anything is read: a resource key or token longer
//! than the core accepts is refused on its length alone, so a wrong length never
//! makes the library read far past what the caller meant.
#![allow(unsafe_code)]

use crate::boundary::Failure;
use std::ffi::{c_char, CStr};
use std::path::PathBuf;

/// Bytes the caller passed as (pointer, length). NULL with length 0 is the empty
/// slice; NULL with a length is an argument error.
///
/// # Safety
/// A non-NULL `ptr` points at `len` readable bytes that stay unchanged for `'a`.
pub(crate) unsafe fn bytes<'a>(ptr: *const u8, len: usize, what: &str) -> Result<&'a [u8], Failure> {
    if ptr.is_null() {
        return if len == 0 { Ok(&[]) } else { Err(Failure::argument(format!("{what} is NULL with length {len}"))) };
    }
    if len > isize::MAX as usize {
        return Err(Failure::argument(format!("{what} has an impossible length {len}")));
    }
    // SAFETY: non-NULL, length within isize::MAX (checked above); `len` readable
    // bytes is this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// An optional NUL-terminated string: NULL is `None`, else it must be UTF-8.
///
/// # Safety
/// A non-NULL `ptr` points at a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn text<'a>(ptr: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL; a NUL-terminated string is this function's contract.
    let c = unsafe { CStr::from_ptr(ptr) };
    c.to_str().map(Some).map_err(|_| Failure::argument(format!("{what} is not UTF-8")))
}

/// An optional NUL-terminated path: NULL is `None`; any bytes but NUL (Unix paths
/// need not be UTF-8).
///
/// # Safety
/// As for [`text`].
pub(crate) unsafe fn path(ptr: *const c_char, what: &str) -> Result<Option<PathBuf>, Failure> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: as in `text`.
    let c = unsafe { CStr::from_ptr(ptr) };
    if c.is_empty() {
        return Err(Failure::argument(format!("{what} is empty")));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(c.to_bytes()))))
    }
    #[cfg(not(unix))]
    c.to_str().map(|s| Some(PathBuf::from(s))).map_err(|_| Failure::argument(format!("{what} is not UTF-8")))
}

/// A struct the caller passed to read: not NULL, aligned.
///
/// # Safety
/// A non-NULL, aligned `ptr` points at an initialised `T` that lives for `'a`.
pub(crate) unsafe fn get<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Failure> {
    aligned(ptr, what)?;
    // SAFETY: non-NULL and aligned (checked); an initialised T is the contract.
    Ok(unsafe { &*ptr })
}

/// A struct the caller passed to be written field by field: not NULL, aligned. It
/// need not be initialised; the writer must write through raw pointers only.
pub(crate) fn out<T>(ptr: *mut T, what: &str) -> Result<*mut T, Failure> {
    aligned(ptr, what)?;
    Ok(ptr)
}

/// Write `text` into a buffer of `cap` bytes at `buffer` as a NUL-terminated string,
/// cut at a character boundary when it does not fit; the length written (without
/// the NUL) and whether it was cut. Only the bytes written are touched.
///
/// # Safety
/// `buffer` points at `cap` writable bytes, `cap` >= 1.
pub(crate) unsafe fn fill(buffer: *mut c_char, cap: usize, text: &str) -> (usize, bool) {
    let mut end = text.len().min(cap.saturating_sub(1));
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    // SAFETY: `end + 1 <= cap` bytes from `buffer` are writable (the function's
    // contract); the source is `end` bytes of `text`, which cannot overlap it.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buffer, end);
        buffer.add(end).write(0);
    }
    (end, end < text.len())
}

fn aligned<T>(ptr: *const T, what: &str) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::argument(format!("{what} is NULL")));
    }
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Failure::argument(format!("{what} is not aligned for its type")));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn null_lengths_and_alignment_are_checked_before_anything_is_read() {
        // SAFETY: every pointer that is not NULL points at as many bytes as given,
        // except those the checks must refuse before reading.
        unsafe {
            assert_eq!(bytes(std::ptr::null(), 0, "k").unwrap(), b"");
            assert!(bytes(std::ptr::null(), 3, "k").unwrap_err().message.contains("NULL with length 3"));
            let b = [1u8, 2];
            assert!(bytes(b.as_ptr(), usize::MAX, "k").is_err());
            let words = [0u64; 2];
            let odd = (words.as_ptr() as *const u8).wrapping_add(1) as *const u64;
            assert!(get(odd, "s").unwrap_err().message.contains("aligned"));
            assert!(get::<u64>(std::ptr::null(), "s").unwrap_err().message.contains("NULL"));
        }
    }

    #[test]
    fn text_that_does_not_fit_is_cut_at_a_character_boundary_and_terminated() {
        let mut small = [1 as c_char; 6];
        // SAFETY: the buffers are as long as the capacities given.
        let cut = unsafe { fill(small.as_mut_ptr(), small.len(), "abü€") };
        assert_eq!(cut, (4, true), "ü is 2 bytes: 'abü' fits in 5, '€' does not");
        assert_eq!(small[4], 0);
        let mut room = [1 as c_char; 8];
        // SAFETY: as above.
        assert_eq!(unsafe { fill(room.as_mut_ptr(), room.len(), "34") }, (2, false));
        assert_eq!(&room[..4], &[b'3' as c_char, b'4' as c_char, 0, 1], "nothing past the NUL is touched");
    }
}
