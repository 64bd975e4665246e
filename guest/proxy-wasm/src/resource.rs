//! Deriving a request's resource key, as the gateway does.
//!
//! From the path, the key is the core's `path_key_bytes`: the path without its
//! query, percent-decoded, so `/a%62c` and `/abc` (one file to nginx) share one mark
//! and a stale writer cannot dodge its mark by re-encoding the path. Bytes that do
//! not decode to UTF-8 become U+FFFD: distinct names may then share a mark, which
//! can only refuse more, never admit a stale write. From a header, a missing or
//! non-UTF-8 value is the empty key, which the core refuses as malformed.

use crate::config::ResourceFrom;
use fencekeeper_core::resource::path_key_bytes;

/// The resource key for a request with this `:path` and header lookup.
pub fn derive(from: &ResourceFrom, path: &[u8], header: impl FnOnce(&str) -> Option<Vec<u8>>) -> String {
    match from {
        ResourceFrom::Path { strip_prefix } => {
            let decoded = String::from_utf8_lossy(&path_key_bytes(path).collect::<Vec<u8>>()).into_owned();
            match decoded.strip_prefix(strip_prefix.as_str()) {
                Some(rest) => rest.to_owned(),
                None => decoded,
            }
        }
        ResourceFrom::Header(name) => header(name).and_then(|v| String::from_utf8(v).ok()).unwrap_or_default(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn path(p: &str, strip: &str) -> String {
        derive(&ResourceFrom::Path { strip_prefix: strip.into() }, p.as_bytes(), |_| None)
    }

    #[test]
    fn path_key_is_decoded_and_without_query() {
        assert_eq!(path("/data/a%62c?x=1", ""), "/data/abc");
        assert_eq!(path("/data/abc", "/data/"), "abc");
        assert_eq!(path("/other/abc", "/data/"), "/other/abc");
        assert_eq!(path("/bad%zz%4", ""), "/bad%zz%4");
        assert_eq!(path("/b%C3%BCcher", ""), "/bücher");
        assert_eq!(path("/x%ff", ""), "/x\u{fffd}");
    }

    #[test]
    fn header_key_or_empty() {
        let from = ResourceFrom::Header("fencing-resource".into());
        assert_eq!(derive(&from, b"/", |_| Some(b"orders".to_vec())), "orders");
        assert_eq!(derive(&from, b"/", |_| None), "");
        assert_eq!(derive(&from, b"/", |_| Some(vec![0xff])), "");
    }
}
