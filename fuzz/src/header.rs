//! What a host may put in a response header, and what a reason line may hold.
//!
//! A host puts core output in three headers: `fencing-highest` and
//! `fencing-admitted-token` (a token's canonical text) and, for gRPC, `grpc-message`
//! (the one-line reason, percent-encoded). A reason also ends up in response bodies
//! and log lines, so it must be one line that cannot forge another.

/// RFC 9110 `field-value`: visible ASCII and obs-text, with spaces and tabs only
/// between them (HTTP/2 refuses leading or trailing whitespace). No CR, LF or NUL.
pub fn is_field_value(value: &[u8]) -> bool {
    let vchar = |b: u8| (0x21..=0x7e).contains(&b) || b >= 0x80;
    let edges = value.first().is_none_or(|&b| vchar(b)) && value.last().is_none_or(|&b| vchar(b));
    edges && value.iter().all(|&b| vchar(b) || b == b' ' || b == b'\t')
}

/// A token header value: the canonical text, non-empty digits and dots.
pub fn is_token_value(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit() || b == b'.') && is_field_value(value.as_bytes())
}

/// The gRPC spec's `grpc-message` encoding (PROTOCOL-HTTP2): bytes outside
/// `0x20..=0x7E`, and `%`, become `%XX`.
pub fn grpc_message(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    for byte in reason.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Decode a `grpc-message` value; `None` when it is not in the encoded form.
pub fn grpc_message_decode(value: &str) -> Option<Vec<u8>> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b @ 0x20..=0x7e => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    Some(out)
}

/// One line, safe to print: no control characters (newlines, escapes, C1) and none
/// of the invisible characters that reorder or hide text (bidi overrides,
/// zero-width). The same rule the host library applies to a guest's text.
pub fn is_printable_line(text: &str) -> bool {
    !text.chars().any(|c| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_accept_and_refuse_what_they_say() {
        assert!(is_field_value(b"34") && is_field_value(b"a b\tc") && is_field_value(b"\x80"));
        assert!(!is_field_value(b" 34") && !is_field_value(b"34\r\n") && !is_field_value(b"3\x004"));
        assert!(is_token_value("7.1042") && !is_token_value("") && !is_token_value("-1"));
        assert_eq!(grpc_message("100% \u{fc}\n"), "100%25 %C3%BC%0A");
        assert_eq!(grpc_message_decode("100%25 %C3%BC%0A").as_deref(), Some("100% \u{fc}\n".as_bytes()));
        assert_eq!(grpc_message_decode("%4"), None);
        assert!(is_printable_line("stale \"\u{fc}\"") && !is_printable_line("a\rb") && !is_printable_line("\u{202e}"));
    }
}
