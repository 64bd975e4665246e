//! The trace: one line of text per event, and its digest. Two runs behaved alike
//! exactly when their traces are byte for byte the same, which the digest stands for.
//!
//! The digest is FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3)
//! over every line's bytes, each followed by `\n`, printed as 16 hex digits. It is
//! fixed here rather than taken from a crate, so that it never changes with one.

use std::collections::VecDeque;
use std::fmt::{self, Write as _};

const BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// The FNV-1a 64 digest of `bytes`, continuing from `hash`.
pub fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

/// The running trace: its digest, its length, and the last lines up to an instant
/// that name one of the words it was asked to focus on (a failure's writes and
/// resource, on its replay; the whole trace of a million requests is not kept).
pub struct Trace {
    hash: u64,
    lines: u64,
    line: String,
    focus: Vec<String>,
    until: u64,
    kept: VecDeque<String>,
}

/// At most this many focused lines are kept: the last ones.
const KEEP: usize = 60;

impl Trace {
    /// A trace that keeps the last lines naming a word of `focus` (as a whole word)
    /// whose time (their first word) is at most `until`.
    pub fn new(focus: Vec<String>, until: u64) -> Trace {
        Trace { hash: BASIS, lines: 0, line: String::new(), focus, until, kept: VecDeque::new() }
    }

    /// Add one line.
    pub fn line(&mut self, args: fmt::Arguments<'_>) {
        self.line.clear();
        let _ = self.line.write_fmt(args);
        self.line.push('\n');
        self.hash = fnv1a(self.hash, self.line.as_bytes());
        self.lines += 1;
        if !self.focus.is_empty() {
            let mut words = self.line.split_whitespace();
            let early = words.next().and_then(|t| t.parse::<u64>().ok()).is_some_and(|t| t <= self.until);
            if early && words.any(|w| self.focus.iter().any(|f| f == w)) {
                if self.kept.len() == KEEP {
                    self.kept.pop_front();
                }
                self.kept.push_back(self.line.trim_end().to_owned());
            }
        }
    }

    /// The digest so far, as 16 hex digits.
    pub fn digest(&self) -> String {
        format!("{:016x}", self.hash)
    }

    /// Lines so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// The focused lines kept.
    pub fn kept(&self) -> impl Iterator<Item = &str> {
        self.kept.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_fnv1a_64() {
        // FNV-1a 64's published values.
        assert_eq!(fnv1a(BASIS, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(BASIS, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(BASIS, b"foobar"), 0x8594_4171_f739_67e8);
        let mut t = Trace::new(vec!["w1".into()], 5);
        t.line(format_args!("{} w{}", 1, 1));
        t.line(format_args!("2 w10"));
        t.line(format_args!("6 w1"));
        assert_eq!(t.digest(), format!("{:016x}", fnv1a(BASIS, b"1 w1\n2 w10\n6 w1\n")));
        assert_eq!(t.kept().collect::<Vec<_>>(), ["1 w1"]);
    }
}
