//! Text from a guest, made safe to print anywhere.
//!
//! A guest's malformed reasons, parse errors and `describe` fields reach CLI output,
//! HTTP bodies, gRPC `grpc-message`, logs and the conformance table. A guest is not
//! trusted with any of them: its text is capped in length, kept to one line, and its
//! control and bidirectional-formatting characters are escaped (`\u{1b}`), so it can
//! neither flood a response nor clear a terminal or forge a line of output.

use std::fmt;

/// The most bytes a guest's text keeps (after escaping); longer text is cut at a
/// character boundary and ends with `…`.
pub const MAX_GUEST_TEXT_BYTES: usize = 256;

/// A bounded, single-line, escaped text that came from a guest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GuestText(String);

impl GuestText {
    /// Make `raw` safe: escape, keep one line, cap at [`MAX_GUEST_TEXT_BYTES`].
    pub fn new(raw: &str) -> GuestText {
        const ELLIPSIS: char = '…';
        let room = MAX_GUEST_TEXT_BYTES - ELLIPSIS.len_utf8();
        let mut out = String::with_capacity(raw.len().min(MAX_GUEST_TEXT_BYTES));
        let mut piece = String::new();
        for c in raw.chars() {
            piece.clear();
            if unsafe_to_print(c) {
                piece.extend(c.escape_unicode());
            } else {
                piece.push(c);
            }
            if out.len() + piece.len() > room {
                out.push(ELLIPSIS);
                return GuestText(out);
            }
            out.push_str(&piece);
        }
        GuestText(out)
    }

    /// The safe text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Control characters (C0, DEL, C1: newlines, escapes, bells) and the invisible
/// formatting characters that reorder or hide text (bidi overrides, zero-width).
fn unsafe_to_print(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}')
}

impl fmt::Display for GuestText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for GuestText {
    fn from(raw: &str) -> GuestText {
        GuestText::new(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_are_escaped_on_one_line() {
        let t = GuestText::new("a\nb\x1b[2J\r\u{202e}c\u{7f}\u{85}");
        assert_eq!(t.as_str(), "a\\u{a}b\\u{1b}[2J\\u{d}\\u{202e}c\\u{7f}\\u{85}");
        assert!(t.as_str().chars().all(|c| !unsafe_to_print(c)));
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let t = GuestText::new(&"ü".repeat(10_000));
        assert!(t.as_str().len() <= MAX_GUEST_TEXT_BYTES, "{}", t.as_str().len());
        assert!(t.as_str().ends_with('…'));
        let escapes = GuestText::new(&"\x1b".repeat(10_000));
        assert!(escapes.as_str().len() <= MAX_GUEST_TEXT_BYTES);
        assert!(escapes.as_str().starts_with("\\u{1b}") && escapes.as_str().ends_with('…'));
    }

    #[test]
    fn ordinary_text_is_kept_as_it_is() {
        let reason = "fencing token component 2 is not a decimal number; like 34 or 7.1042 (ü)";
        assert_eq!(GuestText::new(reason).as_str(), reason);
    }
}
