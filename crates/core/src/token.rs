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
    ///
    /// One pass over the bytes (this runs inside the sandbox on every uncached
    /// decide). Errors come in reading order: the first component that is empty,
    /// holds a non-digit, or overflows is the one reported, and within a component
    /// a non-digit wins over an overflow (see [`Malformed`]).
    pub fn parse(raw: &str) -> Result<Token, Malformed> {
        check_length(raw)?;
        let mut parts = [0u64; MAX_COMPONENTS];
        let mut index = 0usize;
        let mut component = Component::default();
        for &byte in raw.as_bytes() {
            if byte == b'.' {
                parts[index] = component.finish(index + 1)?;
                index += 1;
                if index == MAX_COMPONENTS {
                    return Err(Malformed::TooManyComponents);
                }
                component = Component::default();
            } else if byte.is_ascii_digit() {
                component.push(byte - b'0');
            } else {
                return Err(Malformed::NotDecimal(index + 1));
            }
        }
        parts[index] = component.finish(index + 1)?;
        Ok(Token { parts, len: (index + 1) as u8 })
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

    /// Build a token from a fixed array and an arity (the flat form a token takes at
    /// the component boundary); components past `arity` are ignored. Fails on an
    /// arity of 0 or more than 4.
    pub fn from_array(components: [u64; MAX_COMPONENTS], arity: usize) -> Result<Token, Malformed> {
        match arity {
            0 => Err(Malformed::Empty),
            1..=MAX_COMPONENTS => {
                let mut parts = components;
                for (i, part) in parts.iter_mut().enumerate() {
                    if i >= arity {
                        *part = 0;
                    }
                }
                Ok(Token { parts, len: arity as u8 })
            }
            _ => Err(Malformed::TooManyComponents),
        }
    }

    /// The components as a fixed array, zero past [`arity`](Token::arity).
    pub fn to_array(&self) -> [u64; MAX_COMPONENTS] {
        self.parts
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

/// One component being read: its value so far, whether it has any digit, and
/// whether it has passed `u64::MAX` (reported once the component is known to be all
/// digits: `184467440737095516160x` is not a number, rather than one too large).
#[derive(Default)]
struct Component {
    value: u64,
    digits: bool,
    overflow: bool,
}

impl Component {
    fn push(&mut self, digit: u8) {
        // `value * 10 + digit <= u64::MAX`, tested without a widening multiply
        // (a library call on wasm32, and a tenth of a guest's decide).
        const MAX_TENTH: u64 = u64::MAX / 10;
        const MAX_LAST_DIGIT: u64 = u64::MAX % 10;
        let digit = u64::from(digit);
        self.digits = true;
        if self.value < MAX_TENTH || (self.value == MAX_TENTH && digit <= MAX_LAST_DIGIT) {
            self.value = self.value * 10 + digit;
        } else {
            self.overflow = true;
        }
    }

    /// The component's value; `position` is 1-based, for the error.
    fn finish(&self, position: usize) -> Result<u64, Malformed> {
        match (self.digits, self.overflow) {
            (false, _) => Err(Malformed::EmptyComponent(position)),
            (true, true) => Err(Malformed::Overflow(position)),
            (true, false) => Ok(self.value),
        }
    }
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

/// A [`Token`] from text known to be one, for tests and examples:
/// `token!("34")`, `token!("7.1042")`, `token!(&text)`. Panics, naming the text, when
/// it is not a token; parse what a client sent with [`Token::parse`] instead.
#[macro_export]
macro_rules! token {
    ($text:expr) => {{
        let text: &str = $text;
        match <$crate::Token as ::core::str::FromStr>::from_str(text) {
            Ok(token) => token,
            Err(e) => panic!("{text:?} is not a token: {e}"),
        }
    }};
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
    fn the_largest_components_parse_and_one_more_overflows() {
        assert_eq!(Token::parse("18446744073709551615").unwrap().parts(), &[u64::MAX]);
        assert_eq!(Token::parse("18446744073709551609").unwrap().parts(), &[u64::MAX - 6]);
        assert_eq!(Token::parse("18446744073709551616"), Err(Malformed::Overflow(1)));
        assert_eq!(Token::parse("18446744073709551620"), Err(Malformed::Overflow(1)));
        assert_eq!(Token::parse("1.28446744073709551615"), Err(Malformed::Overflow(2)));
        assert_eq!(Token::parse("99999999999999999999"), Err(Malformed::Overflow(1)));
    }

    #[test]
    fn a_flat_array_keeps_only_its_arity() {
        let t = Token::from_array([7, 1042, 9, 9], 2).unwrap();
        assert_eq!(t, Token::parse("7.1042").unwrap());
        assert_eq!(t.to_array(), [7, 1042, 0, 0]);
        assert_eq!(Token::from_array([1; 4], 0), Err(Malformed::Empty));
        assert_eq!(Token::from_array([1; 4], 5), Err(Malformed::TooManyComponents));
        assert_eq!(Token::from_array([1; 4], 4).unwrap().parts(), &[1, 1, 1, 1]);
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
