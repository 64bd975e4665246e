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

/// The running trace: its digest, its length, and its last lines (what a failure
/// prints; the whole trace of a million requests is not kept).
pub struct Trace {
    hash: u64,
    lines: u64,
    line: String,
    tail: VecDeque<String>,
    keep: usize,
}

impl Trace {
    /// A trace that keeps its last `keep` lines.
    pub fn new(keep: usize) -> Trace {
        Trace { hash: BASIS, lines: 0, line: String::new(), tail: VecDeque::new(), keep }
    }

    /// Add one line.
    pub fn line(&mut self, args: fmt::Arguments<'_>) {
        self.line.clear();
        let _ = self.line.write_fmt(args);
        self.line.push('\n');
        self.hash = fnv1a(self.hash, self.line.as_bytes());
        self.lines += 1;
        if self.keep > 0 {
            if self.tail.len() == self.keep {
                self.tail.pop_front();
            }
            self.tail.push_back(self.line.trim_end().to_owned());
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

    /// The last lines kept.
    pub fn tail(&self) -> impl Iterator<Item = &str> {
        self.tail.iter().map(String::as_str)
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
        let mut t = Trace::new(1);
        t.line(format_args!("a{}", 1));
        t.line(format_args!("b"));
        assert_eq!(t.digest(), format!("{:016x}", fnv1a(BASIS, b"a1\nb\n")));
        assert_eq!(t.tail().collect::<Vec<_>>(), ["b"]);
    }
}
