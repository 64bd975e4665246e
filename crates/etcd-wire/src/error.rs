//! The one error of the wire: an etcd answer that cannot be used, as one printable
//! line, and the rule for quoting foreign text inside it.

use std::fmt;

/// An etcd answer that cannot be used: one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

/// The most bytes of foreign text (an answer, a key) an error quotes.
pub const EXCERPT_BYTES: usize = 200;

/// `text` quoted (`{:?}`: control and formatting characters escaped, so it stays one
/// printable line) and cut to [`EXCERPT_BYTES`] at a character boundary. What etcd,
/// or a proxy in front of it, answered ends up in refusal reasons and headers.
pub fn excerpt(text: &str) -> String {
    let quoted = format!("{text:?}");
    if quoted.len() <= EXCERPT_BYTES {
        return quoted;
    }
    let end = (0..=EXCERPT_BYTES).rev().find(|&i| quoted.is_char_boundary(i)).unwrap_or(0);
    format!("{}…", &quoted[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_one_bounded_printable_line() {
        assert_eq!(excerpt("no healthy\r\nupstream\x1b[2J"), r#""no healthy\r\nupstream\u{1b}[2J""#);
        let long = excerpt(&"é\u{202e}".repeat(4096));
        assert!(long.len() <= EXCERPT_BYTES + "…".len() && !long.contains('\u{202e}'), "{long}");
    }
}
