//! JSON text and base64, as much as etcd's JSON API needs: a reader that takes an
//! answer as hostile bytes (bounded depth, every escape checked, an error and never a
//! panic on anything else), and the writers of strings and base64 for requests.

use crate::WireError;

/// How deeply an answer may nest. etcd's deepest answer (a Txn's read's key-value)
/// is five levels; a deeper one is not etcd's.
const MAX_DEPTH: usize = 16;

/// A JSON value. Numbers stay text: etcd writes 64-bit numbers as strings, and a
/// field decides how to read either.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Number(String),
    Text(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// Parse one JSON document.
pub(crate) fn parse(bytes: &[u8]) -> Result<Json, WireError> {
    let mut reader = Reader { bytes, at: 0 };
    let value = reader.value(0)?;
    reader.space();
    if reader.at != bytes.len() {
        return Err(reader.error("text after the answer"));
    }
    Ok(value)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn error(&self, what: &str) -> WireError {
        WireError(format!("etcd's JSON answer is not JSON etcd writes ({what} at byte {})", self.at))
    }

    fn space(&mut self) {
        while matches!(self.bytes.get(self.at), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, expected: &[u8]) -> Result<(), WireError> {
        if self.bytes[self.at..].starts_with(expected) {
            self.at += expected.len();
            Ok(())
        } else {
            Err(self.error("an unexpected byte"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, WireError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting too deep"));
        }
        self.space();
        match self.bytes.get(self.at) {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.text().map(Json::Text),
            Some(b't') => self.eat(b"true").map(|()| Json::Bool(true)),
            Some(b'f') => self.eat(b"false").map(|()| Json::Bool(false)),
            Some(b'n') => self.eat(b"null").map(|()| Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("an unexpected byte")),
            None => Err(self.error("the end")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, WireError> {
        self.at += 1;
        let mut members = Vec::new();
        self.space();
        if self.bytes.get(self.at) == Some(&b'}') {
            self.at += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.space();
            if self.bytes.get(self.at) != Some(&b'"') {
                return Err(self.error("a member without a name"));
            }
            let name = self.text()?;
            self.space();
            self.eat(b":")?;
            members.push((name, self.value(depth + 1)?));
            self.space();
            match self.bytes.get(self.at) {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Json::Object(members));
                }
                _ => return Err(self.error("an object not closed")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, WireError> {
        self.at += 1;
        let mut items = Vec::new();
        self.space();
        if self.bytes.get(self.at) == Some(&b']') {
            self.at += 1;
            return Ok(Json::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.space();
            match self.bytes.get(self.at) {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.error("an array not closed")),
            }
        }
    }

    fn number(&mut self) -> Result<Json, WireError> {
        let start = self.at;
        while matches!(self.bytes.get(self.at), Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')) {
            self.at += 1;
        }
        // Only ASCII was taken.
        let text = String::from_utf8_lossy(&self.bytes[start..self.at]).into_owned();
        Ok(Json::Number(text))
    }

    fn hex4(&mut self) -> Result<u32, WireError> {
        let digits = self.bytes.get(self.at..self.at + 4).ok_or_else(|| self.error("a cut escape"))?;
        let text = std::str::from_utf8(digits).map_err(|_| self.error("a bad escape"))?;
        let v = u32::from_str_radix(text, 16).map_err(|_| self.error("a bad escape"))?;
        self.at += 4;
        Ok(v)
    }

    fn text(&mut self) -> Result<String, WireError> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let Some(&b) = self.bytes.get(self.at) else { return Err(self.error("a string not closed")) };
            self.at += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.bytes.get(self.at) else { return Err(self.error("a cut escape")) };
                    self.at += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let high = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&high) {
                                self.eat(b"\\u")?;
                                let low = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&low) {
                                    return Err(self.error("a lone surrogate"));
                                }
                                0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00)
                            } else {
                                high
                            };
                            char::from_u32(code).ok_or_else(|| self.error("a lone surrogate"))?
                        }
                        _ => return Err(self.error("a bad escape")),
                    };
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return Err(self.error("a control byte in a string")),
                _ => out.push(b),
            }
        }
        String::from_utf8(out).map_err(|_| self.error("a string that is not UTF-8"))
    }
}

/// `text` as a JSON string, quotes included.
pub(crate) fn quote(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in base64, standard alphabet, padded: how proto3's JSON writes `bytes`.
pub(crate) fn base64(bytes: &[u8], out: &mut String) {
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
}

/// Decode base64, standard or URL-safe alphabet, padded or not (proto3's JSON reader
/// takes both). Anything else is an error.
pub(crate) fn unbase64(text: &str) -> Result<Vec<u8>, WireError> {
    let bad = || WireError(format!("etcd's JSON answer holds bytes that are not base64 ({})", crate::excerpt(text)));
    let trimmed = text.trim_end_matches('=');
    if text.len() - trimmed.len() > 2 || trimmed.len() % 4 == 1 {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(trimmed.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in trimmed.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return Err(bad()),
        };
        acc = acc << 6 | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_length_and_refuses_what_is_not() {
        for n in 0..10 {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + 200) as u8).collect();
            let mut text = String::new();
            base64(&bytes, &mut text);
            assert_eq!(unbase64(&text).unwrap(), bytes, "{text}");
        }
        let mut text = String::new();
        base64(b"fk2 34 fc4dab37", &mut text);
        assert_eq!(text, "ZmsyIDM0IGZjNGRhYjM3");
        assert_eq!(unbase64("_-8").unwrap(), [0xff, 0xef], "URL-safe, unpadded");
        for bad in ["a", "ab!c", "ab===", "a b="] {
            assert!(unbase64(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_parses_what_etcd_writes_and_refuses_what_is_not_json() {
        let doc = parse(br#" {"a": [1, "x\u00e9\ud83d\ude00\n", true, null, {}], "b": -2.5e3} "#).unwrap();
        let Json::Object(members) = doc else { unreachable!("an object") };
        assert_eq!(members[0].0, "a");
        assert_eq!(
            members[0].1,
            Json::Array(vec![
                Json::Number("1".into()),
                Json::Text("x\u{e9}\u{1f600}\n".into()),
                Json::Bool(true),
                Json::Null,
                Json::Object(vec![])
            ])
        );
        assert_eq!(members[1].1, Json::Number("-2.5e3".into()));
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        for bad in [
            &b"{"[..],
            b"{\"a\" 1}",
            b"[1,]x",
            b"\"\\ud800\"",
            b"\"\x01\"",
            b"\"\xff\"",
            b"nul",
            b"{} {}",
            b"",
            deep.as_bytes(),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.0.starts_with("etcd's JSON answer is not JSON"), "{e}");
        }
    }

    #[test]
    fn strings_are_quoted_so_that_they_parse_back() {
        let mut out = String::new();
        quote("pa\"ss\\w\u{1}ord é", &mut out);
        assert_eq!(out, r#""pa\"ss\\w\u0001ord é""#);
        assert_eq!(parse(out.as_bytes()).unwrap(), Json::Text("pa\"ss\\w\u{1}ord é".into()));
    }
}
