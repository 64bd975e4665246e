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
    /// A request that names the resources it writes in its body (S3's DeleteObjects,
    /// `POST /BUCKET?delete`), which no host reads before it decides.
    KeysInBody,
    /// The token is sent twice (S3: in the token header and in the object metadata
    /// header), with two values: which one the lock gave is unknown.
    TwoTokens,
    /// An S3 request whose `Host` is a domain name that is neither the configured S3
    /// domain nor a bucket under it: the bucket it names cannot be told
    /// ([`crate::s3::addressing`]).
    S3Host,
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
            ResourceError::KeysInBody => f.write_str(
                "S3 DeleteObjects (POST ?delete) names the keys it deletes in its body, which the fence does not read; \
                 delete each key with DeleteObject (aws s3 rm, boto3 delete_object)",
            ),
            ResourceError::TwoTokens => f.write_str(
                "the fencing token is sent twice with two values (its header and the object metadata header); \
                 send one, or the same in both",
            ),
            ResourceError::S3Host => f.write_str(
                "the Host is a domain name the fence cannot place: with protocol s3 it must be the S3 domain, \
                 BUCKET. + that domain, or an IP address; set the S3 domain the store serves \
                 (fencekeeper serve --s3-domain, the filter's s3_domain)",
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

/// Normalize a decoded path in place, as a store resolves it before it writes, and
/// return its new length: runs of `/` are one, `.` segments are removed, and a `..`
/// segment removes the segment before it (RFC 3986 section 5.2.4; never above the
/// root). A path that ends in `/`, `/.` or `/..` keeps a trailing `/`. Without this a
/// stale writer could send `/d/x/../f`, `/d//f` or `/d/./f`: keys without a mark,
/// while Apache httpd and nginx write `/d/f`. A path that does not start with `/` is
/// left as it is. Hosts apply it to the bytes [`path_key_bytes`] decoded, so that
/// `%2e%2e` is a `..` too.
pub fn normalize_path(path: &mut [u8]) -> usize {
    if path.first() != Some(&b'/') {
        return path.len();
    }
    let len = path.len();
    // The output `path[..w]` never overtakes the input at `r`: every segment it
    // copies comes from at or after where it is written.
    let (mut r, mut w) = (0, 0);
    let mut trailing_slash = false;
    while r < len {
        // path[r] is '/': the segment is what follows, up to the next '/'.
        let start = r + 1;
        let end = path[start..].iter().position(|&b| b == b'/').map_or(len, |i| start + i);
        match &path[start..end] {
            b"" | b"." => trailing_slash = end == len,
            b".." => {
                w = path[..w].iter().rposition(|&b| b == b'/').unwrap_or(0);
                trailing_slash = end == len;
            }
            _ => {
                path[w] = b'/';
                path.copy_within(start..end, w + 1);
                w += 1 + end - start;
                trailing_slash = false;
            }
        }
        r = end;
    }
    if trailing_slash || w == 0 {
        path[w] = b'/';
        w += 1;
    }
    w
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

    fn normalized(path: &str) -> std::string::String {
        let mut bytes = key(path);
        let n = normalize_path(&mut bytes);
        std::string::String::from_utf8_lossy(&bytes[..n]).into_owned()
    }

    #[test]
    fn dot_segments_and_repeated_slashes_resolve_as_the_store_resolves_them() {
        for (path, want) in [
            ("/d/f", "/d/f"),
            ("/d/x/../f", "/d/f"),
            ("/d//f", "/d/f"),
            ("/d/./f", "/d/f"),
            ("/d/x/%2e%2e/f", "/d/f"),
            ("/d/x/%2E%2E%2ff", "/d/f"),
            ("/../../f", "/f"),
            ("/d/", "/d/"),
            ("/d/.", "/d/"),
            ("/d/x/..", "/d/"),
            ("/d//", "/d/"),
            ("/", "/"),
            ("//", "/"),
            ("/..", "/"),
            ("/.", "/"),
            ("/d/..f/.f/...", "/d/..f/.f/..."),
            ("", ""),
            ("d/../f", "d/../f"),
        ] {
            assert_eq!(normalized(path), want, "{path}");
        }
    }

    proptest::proptest! {
        /// Over paths of `/`, `.`, `%2e`, `%2f` and letters: the result is a fixed point,
        /// has no empty, `.` or `..` segment, and is no longer than the input.
        #[test]
        fn normalized_paths_have_no_segment_a_store_would_resolve(
            parts in proptest::collection::vec(proptest::sample::select(&["/", ".", "..", "%2e", "%2f", "a", "b"][..]), 0..12)
        ) {
            let path = std::format!("/{}", parts.concat());
            let once = normalized(&path);
            proptest::prop_assert!(once.len() <= key(&path).len());
            proptest::prop_assert_eq!(normalized(&once), once.clone());
            let inner = once.strip_suffix('/').unwrap_or(&once);
            for segment in inner.split('/').skip(1) {
                proptest::prop_assert!(!matches!(segment, "" | "." | ".."), "{} -> {}", path, once);
            }
        }
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
