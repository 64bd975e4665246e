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
    /// The key's bytes (a percent-decoded path, a header value) are not UTF-8.
    NotUtf8,
    /// A WebDAV COPY or MOVE without a `Destination` header that names a path (an
    /// absolute URI or an absolute path): the resource it writes is unknown.
    Destination,
    /// A request that writes two resources (WebDAV's MOVE) at a host that fences one
    /// per request (the Envoy filter).
    TwoResources,
}

impl fmt::Display for ResourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResourceError::Empty => f.write_str("resource key is empty; name the protected resource"),
            ResourceError::TooLong(len) => write!(
                f,
                "resource key is {len} bytes; the limit is {MAX_KEY_BYTES} (use a shorter key or a path prefix)"
            ),
            ResourceError::NotUtf8 => {
                f.write_str("resource key is not UTF-8 (after percent-decoding); name resources in UTF-8")
            }
            ResourceError::Destination => f.write_str(
                "COPY and MOVE name the resource they write in a Destination header, an absolute URI or path; \
                 it is missing or is neither",
            ),
            ResourceError::TwoResources => f.write_str(
                "MOVE writes two resources (its path and its Destination) and this host fences one per request; \
                 COPY then DELETE, or write through fencekeeper serve",
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

/// A resource key from raw bytes: they must be UTF-8. No lossy conversion: two
/// distinct byte strings must never become one key (and share one mark), nor one
/// byte string two keys.
pub fn key_from_bytes(bytes: &[u8]) -> Result<&str, ResourceError> {
    core::str::from_utf8(bytes).map_err(|_| ResourceError::NotUtf8)
}

/// The bytes of the resource key a request path names: the path without its query
/// or fragment, percent-decoded. Every host derives path keys through this, so
/// `/a%62c` and `/abc` — one file to the store — share one mark, and a stale writer
/// cannot dodge the mark by re-encoding its path. A `%` not followed by two hex
/// digits stays as it is. Hosts then take the key with [`key_from_bytes`]: a path
/// that decodes to bytes that are not UTF-8 (`/%FF%FE`) is malformed, never
/// replaced lossily (which would give `/%FF%FE` and `/%FE%FF` one mark).
pub fn path_key_bytes(path: &[u8]) -> PathKeyBytes<'_> {
    let end = path.iter().position(|&b| b == b'?' || b == b'#').unwrap_or(path.len());
    PathKeyBytes { rest: &path[..end] }
}

/// Iterator returned by [`path_key_bytes`].
#[derive(Clone, Debug)]
pub struct PathKeyBytes<'a> {
    rest: &'a [u8],
}

impl Iterator for PathKeyBytes<'_> {
    type Item = u8;
    fn next(&mut self) -> Option<u8> {
        let (&first, tail) = self.rest.split_first()?;
        if let [b'%', h, l, ..] = self.rest {
            if let (Some(h), Some(l)) = (hex(*h), hex(*l)) {
                self.rest = &self.rest[3..];
                return Some(h << 4 | l);
            }
        }
        self.rest = tail;
        Some(first)
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn key(path: &str) -> Vec<u8> {
        path_key_bytes(path.as_bytes()).collect()
    }

    #[test]
    fn re_encoded_paths_share_one_key() {
        assert_eq!(key("/a%62c"), b"/abc");
        assert_eq!(key("/a%2Fb%2fc"), b"/a/b/c");
    }

    #[test]
    fn query_and_fragment_are_not_part_of_the_key() {
        assert_eq!(key("/f.txt?x=1"), b"/f.txt");
        assert_eq!(key("/f.txt#top"), b"/f.txt");
    }

    #[test]
    fn lone_percent_signs_stay() {
        assert_eq!(key("/100%"), b"/100%");
        assert_eq!(key("/%zz%4"), b"/%zz%4");
        assert_eq!(key("/%e6%97%a5"), "/日".as_bytes());
    }

    #[test]
    fn undecodable_paths_are_not_keys_and_never_collide() {
        let a = key("/%FF%FE");
        let b = key("/%FE%FF");
        assert_ne!(a, b);
        assert_eq!(key_from_bytes(&a), Err(ResourceError::NotUtf8));
        assert_eq!(key_from_bytes(&b), Err(ResourceError::NotUtf8));
        assert_eq!(key_from_bytes(&key("/b%C3%BCcher")), Ok("/bücher"));
    }
}
