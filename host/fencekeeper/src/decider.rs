//! Who decides: anything that maps (policy, presented token, mark) to a verdict.
//!
//! The bundled WebAssembly validator is the default; [`NativeDecider`] calls the
//! same core natively (for comparison, and for hosts that cannot run wasm). Either
//! way the [`Guard`](crate::Guard) checks every verdict before acting on it
//! (`verify`): a decider is asked, never obeyed.

use crate::{GuestText, Verdict};
use fencekeeper_core::{decision, Policy, Token};

/// Why a decider could not reach a verdict. The guard refuses the request in both
/// modes: these failures can be caused by what a request carried, so efficiency
/// mode must not let them through.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The guest trapped, ran out of fuel, or exceeded a memory or table limit.
    #[error("validator guest fault: {0}")]
    GuestFault(String),
    /// The guest answered something outside the contract (e.g. a token of arity 0).
    #[error("validator guest broke the contract: {0}")]
    Contract(String),
}

/// Decides on a presented token against a mark. Implementations are pure: they
/// never read or write marks themselves, and the resource key is not theirs to see
/// (the guard checks it).
pub trait Decider: Send + Sync {
    /// The policy this decider applies.
    fn policy(&self) -> Policy;
    /// The verdict for `presented` (None: no token sent) against `mark`. The guard
    /// calls it only with token text within `MAX_TOKEN_BYTES`.
    fn decide(&self, presented: Option<&str>, mark: Option<&Token>) -> Result<Verdict, DecideError>;
}

/// The core's decision called natively, without WebAssembly.
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeDecider(pub Policy);

impl Decider for NativeDecider {
    fn policy(&self) -> Policy {
        self.0
    }

    fn decide(&self, presented: Option<&str>, mark: Option<&Token>) -> Result<Verdict, DecideError> {
        Ok(decision::decide(&self.0, presented, mark).map_malformed(|m| GuestText::new(&m.to_string())))
    }
}
