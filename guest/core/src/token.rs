//! Fencing tokens: 1 to 4 unsigned 64-bit components, compared lexicographically.
//!
//! Text form: decimal components joined by `.`, leading zeros allowed (`34`,
//! `7.1042`, `0000000000000000034`). Anything else is [`Malformed`].

use core::cmp::Ordering;
use core::fmt;

/// The most components a token may have.
pub const MAX_COMPONENTS: usize = 4;

/// The longest token text accepted, in bytes. Four `u64` components in canonical form
/// take at most 83 bytes (4 x 20 digits and 3 dots); the rest leaves room for leading
/// zeros. Every host checks this before a validator sees the text, so that parsing any
/// token a client can send costs bounded work (a guest's fuel budget is sized on it).
pub const MAX_TOKEN_BYTES: usize = 128;

/// A parsed fencing token.
///
/// Tokens of different arity are not comparable: [`PartialOrd`] answers `None`
/// for them, and the decision refuses such a token as malformed.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    parts: [u64; MAX_COMPONENTS],
    len: u8,
}

/// Why a token (or a resource key) was refused as malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// The token text is empty.
    Empty,
    /// The token text is longer than [`MAX_TOKEN_BYTES`]; carries its length.
    TooLong(usize),
    /// More than [`MAX_COMPONENTS`] components.
    TooManyComponents,
    /// A component between dots is empty (`7.`, `.7`, `7..8`); 1-based.
    EmptyComponent(usize),
    /// A component holds something other than ASCII digits; 1-based.
    NotDecimal(usize),
    /// A component is larger than `u64::MAX`; 1-based.
    Overflow(usize),
    /// The token's arity differs from the one fixed by the resource's first admit.
    ArityMismatch {
        /// Components in the resource's mark.
        mark: usize,
        /// Components in the presented token.
        presented: usize,
    },
    /// The resource key is not acceptable.
    Resource(crate::resource::ResourceError),
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SYNTAX: &str = "expected 1 to 4 decimal u64 components joined by '.', like 34 or 7.1042";
        match self {
            Malformed::Empty => write!(f, "fencing token is empty; {SYNTAX}"),
            Malformed::TooLong(len) => {
                write!(f, "fencing token is {len} bytes; the limit is {MAX_TOKEN_BYTES}; {SYNTAX}")
            }
            Malformed::TooManyComponents => {
                write!(f, "fencing token has more than {MAX_COMPONENTS} components; {SYNTAX}")
            }
            Malformed::EmptyComponent(i) => {
                write!(f, "fencing token component {i} is empty; {SYNTAX}")
            }
            Malformed::NotDecimal(i) => {
                write!(f, "fencing token component {i} is not a decimal number (no sign, no spaces); {SYNTAX}")
            }
            Malformed::Overflow(i) => write!(f, "fencing token component {i} exceeds {} (u64); {SYNTAX}", u64::MAX),
            Malformed::ArityMismatch { mark, presented } => write!(
                f,
                "fencing token has {presented} component(s) but this resource's tokens have {mark}; \
                 a resource keeps the arity of its first admitted token"
            ),
            Malformed::Resource(e) => write!(f, "{e}"),
        }
    }
}

impl Token {
    /// Parse the text form of a token.
    pub fn parse(raw: &str) -> Result<Token, Malformed> {
        check_length(raw)?;
        let mut parts = [0u64; MAX_COMPONENTS];
        let mut len = 0usize;
        for (i, text) in raw.split('.').enumerate() {
            let position = i + 1;
            if i == MAX_COMPONENTS {
                return Err(Malformed::TooManyComponents);
            }
            parts[i] = parse_component(text, position)?;
            len = position;
        }
        Ok(Token { parts, len: len as u8 })
    }

    /// Build a token from its components; fails on 0 or more than 4 components.
    pub fn from_parts(components: &[u64]) -> Result<Token, Malformed> {
        if components.is_empty() {
            return Err(Malformed::Empty);
        }
        if components.len() > MAX_COMPONENTS {
            return Err(Malformed::TooManyComponents);
        }
        let mut parts = [0u64; MAX_COMPONENTS];
        parts[..components.len()].copy_from_slice(components);
        Ok(Token { parts, len: components.len() as u8 })
    }

    /// The components, most significant first.
    pub fn parts(&self) -> &[u64] {
        &self.parts[..self.len as usize]
    }

    /// How many components the token has (1 to 4).
    pub fn arity(&self) -> usize {
        self.len as usize
    }
}

/// The length rule alone: empty or longer than [`MAX_TOKEN_BYTES`] is malformed.
/// Hosts check it before handing token text to a validator.
pub fn check_length(raw: &str) -> Result<(), Malformed> {
    match raw.len() {
        0 => Err(Malformed::Empty),
        len if len > MAX_TOKEN_BYTES => Err(Malformed::TooLong(len)),
        _ => Ok(()),
    }
}

fn parse_component(text: &str, position: usize) -> Result<u64, Malformed> {
    if text.is_empty() {
        return Err(Malformed::EmptyComponent(position));
    }
    // Syntax before range: a component with a non-digit is not a number whatever its
    // digits before it say (`184467440737095516160x` is a hash or a UUID, not a u64
    // that overflowed).
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Malformed::NotDecimal(position));
    }
    text.bytes()
        .try_fold(0u64, |value, digit| value.checked_mul(10)?.checked_add(u64::from(digit - b'0')))
        .ok_or(Malformed::Overflow(position))
}

impl PartialOrd for Token {
    /// Lexicographic on components; `None` when the arities differ.
    fn partial_cmp(&self, other: &Token) -> Option<Ordering> {
        (self.len == other.len).then(|| self.parts().cmp(other.parts()))
    }
}

impl fmt::Display for Token {
    /// The canonical text form: decimal components without leading zeros.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.parts().iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{part}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

impl core::str::FromStr for Token {
    type Err = Malformed;
    fn from_str(s: &str) -> Result<Token, Malformed> {
        Token::parse(s)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_documented_shape() {
        assert_eq!(Token::parse("34").unwrap().parts(), &[34]);
        assert_eq!(Token::parse("7.1042").unwrap().parts(), &[7, 1042]);
        assert_eq!(Token::parse("0000000000000000034").unwrap().parts(), &[34]);
        assert_eq!(Token::parse("1.2.3.4").unwrap().parts(), &[1, 2, 3, 4]);
        assert_eq!(Token::parse("18446744073709551615").unwrap().parts(), &[u64::MAX]);
    }

    #[test]
    fn refuses_every_malformed_shape() {
        let cases: &[(&str, Malformed)] = &[
            ("", Malformed::Empty),
            ("1.2.3.4.5", Malformed::TooManyComponents),
            (".1", Malformed::EmptyComponent(1)),
            ("1.", Malformed::EmptyComponent(2)),
            ("1..2", Malformed::EmptyComponent(2)),
            ("-1", Malformed::NotDecimal(1)),
            ("+1", Malformed::NotDecimal(1)),
            (" 1", Malformed::NotDecimal(1)),
            ("1 ", Malformed::NotDecimal(1)),
            ("1.x", Malformed::NotDecimal(2)),
            ("１", Malformed::NotDecimal(1)),
            ("18446744073709551616", Malformed::Overflow(1)),
            ("1.99999999999999999999999", Malformed::Overflow(2)),
        ];
        let padded = std::format!("{}34", "0".repeat(MAX_TOKEN_BYTES - 1));
        assert_eq!(Token::parse(&padded), Err(Malformed::TooLong(MAX_TOKEN_BYTES + 1)));
        assert_eq!(Token::parse(&padded[1..]), Ok(Token::from_parts(&[34]).unwrap()));
        for (raw, expected) in cases {
            assert_eq!(Token::parse(raw), Err(*expected), "input {raw:?}");
        }
    }

    #[test]
    fn a_non_digit_after_many_digits_is_not_decimal_rather_than_an_overflow() {
        // Found by fuzz/fuzz_targets/token_parse.rs: the digits before the non-digit
        // used to overflow first, and the reason said "exceeds u64" for a token that
        // is not a number at all.
        assert_eq!(Token::parse("184467440737095516160x"), Err(Malformed::NotDecimal(1)));
        assert_eq!(Token::parse("7.1844674407370955161744073709\u{b}"), Err(Malformed::NotDecimal(2)));
        assert_eq!(Token::parse("18446744073709551616.x"), Err(Malformed::Overflow(1)));
    }

    #[test]
    fn display_is_canonical() {
        let t = Token::parse("007.0001042").unwrap();
        assert_eq!(std::format!("{t}"), "7.1042");
    }

    #[test]
    fn tokens_of_different_arity_do_not_compare() {
        let a = Token::parse("7").unwrap();
        let b = Token::parse("7.0").unwrap();
        assert_eq!(a.partial_cmp(&b), None);
        assert!(Token::parse("7.2").unwrap() > Token::parse("6.99").unwrap());
        assert!(Token::parse("7.2").unwrap() < Token::parse("7.10").unwrap());
    }
}
