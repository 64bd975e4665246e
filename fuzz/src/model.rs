//! Reference models, written from the contract's text rather than from the code
//! they check: a target that compared the core with itself would prove nothing.

use fencekeeper_core::token::{MAX_COMPONENTS, MAX_TOKEN_BYTES};
use fencekeeper_core::Malformed;

/// `u64::MAX` in decimal: a component is in range when its significant digits are
/// fewer, or as many and not greater as text.
const U64_MAX_TEXT: &str = "18446744073709551615";

/// A token as the contract reads it (docs/semantics.md): 1 to 4 components of ASCII
/// decimal digits joined by `.`, each at most `u64::MAX`, the whole at most
/// [`MAX_TOKEN_BYTES`]; the first rule broken, left to right, is the error.
pub fn token(raw: &str) -> Result<Vec<u64>, Malformed> {
    if raw.is_empty() {
        return Err(Malformed::Empty);
    }
    if raw.len() > MAX_TOKEN_BYTES {
        return Err(Malformed::TooLong(raw.len()));
    }
    let mut parts = Vec::new();
    for (i, text) in raw.split('.').enumerate() {
        let position = i + 1;
        if position > MAX_COMPONENTS {
            return Err(Malformed::TooManyComponents);
        }
        if text.is_empty() {
            return Err(Malformed::EmptyComponent(position));
        }
        if !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Malformed::NotDecimal(position));
        }
        let digits = significant(text);
        if digits.len() > U64_MAX_TEXT.len() || (digits.len() == U64_MAX_TEXT.len() && digits > U64_MAX_TEXT) {
            return Err(Malformed::Overflow(position));
        }
        parts.push(digits.parse().expect("at most u64::MAX, digits only"));
    }
    Ok(parts)
}

/// The canonical text of a token's text, by the text alone: each component
/// without its leading zeros. `None` when the text is not a token.
pub fn canonical(raw: &str) -> Option<String> {
    token(raw).ok()?;
    Some(raw.split('.').map(significant).collect::<Vec<_>>().join("."))
}

/// A component's digits without leading zeros (`0` for all zeros).
fn significant(digits: &str) -> &str {
    let trimmed = digits.trim_start_matches('0');
    if trimmed.is_empty() {
        "0"
    } else {
        trimmed
    }
}

/// The resource key of a request path, as docs/semantics.md ("Limits") says: the path up
/// to the first `?` or `#`, with each `%` followed by two hex digits replaced by the
/// byte they spell, and every other byte kept as it is.
pub fn path_key(path: &[u8]) -> Vec<u8> {
    let path = path.split(|&b| b == b'?' || b == b'#').next().unwrap_or_default();
    let mut key = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let escape = path.get(i + 1..i + 3).filter(|hex| path[i] == b'%' && hex.iter().all(u8::is_ascii_hexdigit));
        match escape {
            Some(hex) => {
                let hex = std::str::from_utf8(hex).expect("hex digits are ASCII");
                key.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
                i += 3;
            }
            None => {
                key.push(path[i]);
                i += 1;
            }
        }
    }
    key
}

/// A decoded path as a store resolves it, as docs/semantics.md ("Limits") says: a stack of
/// segments, where an empty or `.` segment adds nothing and `..` drops the top (never
/// below the root); a path whose last segment added nothing ends in `/`. A path that
/// does not start with `/` is kept.
pub fn normalized_path(path: &[u8]) -> Vec<u8> {
    let Some(rest) = path.strip_prefix(b"/") else { return path.to_vec() };
    let mut stack: Vec<&[u8]> = Vec::new();
    let mut trailing = false;
    for segment in rest.split(|&b| b == b'/') {
        trailing = matches!(segment, b"" | b"." | b"..");
        match segment {
            b"" | b"." => {}
            b".." => {
                stack.pop();
            }
            s => stack.push(s),
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for s in &stack {
        out.push(b'/');
        out.extend_from_slice(s);
    }
    if trailing || out.is_empty() {
        out.push(b'/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_models_read_the_documented_examples() {
        assert_eq!(token("007.1042"), Ok(vec![7, 1042]));
        assert_eq!(token(U64_MAX_TEXT), Ok(vec![u64::MAX]));
        assert_eq!(token("18446744073709551616"), Err(Malformed::Overflow(1)));
        assert_eq!(token("1.2.3.4.x"), Err(Malformed::TooManyComponents));
        assert_eq!(canonical("000.0100"), Some("0.100".to_owned()));
        assert_eq!(path_key(b"/a%62c%zz%4?x#y"), b"/abc%zz%4");
    }
}
