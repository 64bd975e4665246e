//! Fuzz inputs shaped like the contract's values.
//!
//! Tokens drawn from all of `u64` almost never meet, so a mark would almost never
//! be equal to, or just above, a presented token. These inputs draw most components
//! from a few small values and a few near `u64::MAX`, and write token text with
//! leading zeros, so that the equal, stale and arity cases all come up.

use arbitrary::Arbitrary;
use fencekeeper_core::token::MAX_COMPONENTS;
use fencekeeper_core::Token;

/// One token component.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Component {
    /// 0 to 15.
    Small(u8),
    /// `u64::MAX` down to `u64::MAX - 3`.
    NearMax(u8),
    /// Any value.
    Any(u64),
}

impl Component {
    /// The component's value.
    pub fn value(self) -> u64 {
        match self {
            Component::Small(v) => u64::from(v % 16),
            Component::NearMax(d) => u64::MAX - u64::from(d % 4),
            Component::Any(v) => v,
        }
    }
}

/// A token of 1 to 4 components.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct SmallToken {
    arity: u8,
    parts: [Component; MAX_COMPONENTS],
}

impl SmallToken {
    /// How many components (1 to 4).
    pub fn arity(&self) -> usize {
        usize::from(self.arity) % MAX_COMPONENTS + 1
    }

    /// The same components, `arity` of them.
    pub fn with_arity(self, arity: usize) -> SmallToken {
        SmallToken { arity: (arity.clamp(1, MAX_COMPONENTS) - 1) as u8, ..self }
    }

    /// The components.
    pub fn parts(&self) -> Vec<u64> {
        self.parts[..self.arity()].iter().map(|c| c.value()).collect()
    }

    /// The token.
    pub fn token(&self) -> Token {
        Token::from_parts(&self.parts()).expect("1 to 4 components")
    }
}

/// A token written as text, each component with 0 to 3 leading zeros.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct TokenText {
    /// The token the text spells.
    pub token: SmallToken,
    zeros: [u8; MAX_COMPONENTS],
}

impl TokenText {
    /// The same text with `arity` components.
    pub fn with_arity(self, arity: usize) -> TokenText {
        TokenText { token: self.token.with_arity(arity), ..self }
    }

    /// The text.
    pub fn text(&self) -> String {
        let parts = self.token.parts();
        let written = parts.iter().zip(self.zeros).map(|(p, z)| format!("{}{p}", "0".repeat(usize::from(z % 4))));
        written.collect::<Vec<_>>().join(".")
    }
}
