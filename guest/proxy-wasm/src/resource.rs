//! Deriving a request's resource key.
//!
//! From the path, the key is the path as the store sees it: without the query, and
//! percent-decoded, so `/a%62c` and `/abc` (one file to nginx) share one mark and a
//! stale writer cannot dodge its mark by re-encoding the path. Bytes that do not
//! decode to UTF-8 become U+FFFD: distinct names may then share a mark, which can
//! only refuse more, never admit a stale write.

use crate::config::ResourceFrom;

/// The resource key for a request with this `:path` and header lookup.
pub fn derive(from: &ResourceFrom, path: &[u8], header: impl FnOnce(&str) -> Option<Vec<u8>>) -> String {
    match from {
        ResourceFrom::Path { strip_prefix } => {
            let without_query = path.split(|&b| b == b'?' || b == b'#').next().unwrap_or_default();
            let decoded = String::from_utf8_lossy(&percent_decode(without_query)).into_owned();
            match decoded.strip_prefix(strip_prefix.as_str()) {
                Some(rest) => rest.to_owned(),
                None => decoded,
            }
        }
        // A missing header gives the empty key, which the core refuses as malformed.
        ResourceFrom::Header(name) => header(name).map(|v| String::from_utf8_lossy(&v).into_owned()).unwrap_or_default(),
    }
}

fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    out
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
    }
}
