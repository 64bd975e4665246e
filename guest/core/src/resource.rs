//! Resource keys: opaque UTF-8 names of what is protected, 1 to 1024 bytes.

use core::fmt;

/// The longest resource key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// Why a resource key was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceError {
    /// The key is empty.
    Empty,
    /// The key is longer than [`MAX_KEY_BYTES`]; carries its length.
    TooLong(usize),
}

impl fmt::Display for ResourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResourceError::Empty => f.write_str("resource key is empty; name the protected resource"),
            ResourceError::TooLong(len) => write!(
                f,
                "resource key is {len} bytes; the limit is {MAX_KEY_BYTES} (use a shorter key or a path prefix)"
            ),
        }
    }
}

/// Check a resource key against the rules.
pub fn check(key: &str) -> Result<(), ResourceError> {
    match key.len() {
        0 => Err(ResourceError::Empty),
        len if len > MAX_KEY_BYTES => Err(ResourceError::TooLong(len)),
        _ => Ok(()),
    }
}
