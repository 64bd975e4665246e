//! Deriving a request's resource key, as the gateway does.
//!
//! From the path, the key is the core's `path_key_bytes`: the path without its
//! query, percent-decoded, so `/a%62c` and `/abc` (one file to nginx) share one mark
//! and a stale writer cannot dodge its mark by re-encoding the path. A path that
//! does not decode to UTF-8 is malformed (never replaced lossily, which would give
//! distinct paths one mark). From a header, a non-UTF-8 value is malformed, and a
//! missing one is the empty key, which the core refuses as malformed too.

use crate::config::ResourceFrom;
use fencekeeper_core::resource::{key_from_bytes, path_key_bytes, ResourceError};

/// The resource key for a request with this `:path` and header lookup.
pub fn derive(
    from: &ResourceFrom,
    path: &[u8],
    header: impl FnOnce(&str) -> Option<Vec<u8>>,
) -> Result<String, ResourceError> {
    let bytes = match from {
        ResourceFrom::Path { strip_prefix } => {
            let decoded: Vec<u8> = path_key_bytes(path).collect();
            match decoded.strip_prefix(strip_prefix.as_bytes()) {
                Some(rest) => rest.to_vec(),
                None => decoded,
            }
        }
        ResourceFrom::Header(name) => header(name).unwrap_or_default(),
    };
    key_from_bytes(&bytes).map(str::to_owned)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn path(p: &str, strip: &str) -> String {
        derive(&ResourceFrom::Path { strip_prefix: strip.into() }, p.as_bytes(), |_| None).unwrap()
    }

    #[test]
    fn path_key_is_decoded_and_without_query() {
        assert_eq!(path("/data/a%62c?x=1", ""), "/data/abc");
        assert_eq!(path("/data/abc", "/data/"), "abc");
        assert_eq!(path("/other/abc", "/data/"), "/other/abc");
        assert_eq!(path("/bad%zz%4", ""), "/bad%zz%4");
        assert_eq!(path("/b%C3%BCcher", ""), "/bücher");
    }

    #[test]
    fn undecodable_paths_are_malformed_not_merged() {
        let from = ResourceFrom::Path { strip_prefix: String::new() };
        for p in ["/%FF%FE", "/%FE%FF", "/x%ff"] {
            assert_eq!(derive(&from, p.as_bytes(), |_| None), Err(ResourceError::NotUtf8), "{p}");
        }
    }

    #[test]
    fn header_key_or_empty() {
        let from = ResourceFrom::Header("fencing-resource".into());
        assert_eq!(derive(&from, b"/", |_| Some(b"orders".to_vec())).unwrap(), "orders");
        assert_eq!(derive(&from, b"/", |_| None).unwrap(), "");
        assert_eq!(derive(&from, b"/", |_| Some(vec![0xff])), Err(ResourceError::NotUtf8));
    }
}
