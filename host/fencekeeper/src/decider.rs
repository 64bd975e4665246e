//! Who decides: anything that maps (resource, presented token, mark) to a verdict.
//!
//! The bundled WebAssembly validator is the default; [`NativeDecider`] calls the
//! same core natively (for comparison, and for hosts that cannot run wasm).

use fencekeeper_core::{decision, Policy, Token, Verdict};

/// Why a decider could not reach a verdict. The guard treats it as "cannot decide":
/// refused in correctness mode, passed and counted in efficiency mode.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The guest trapped, ran out of fuel or time, or exceeded its memory limit.
    #[error("validator guest fault: {0}")]
    GuestFault(String),
    /// The guest answered something outside the contract (e.g. an invalid token).
    #[error("validator guest broke the contract: {0}")]
    Contract(String),
}

/// Decides on a presented token against a mark. Implementations are pure: they
/// never read or write marks themselves.
pub trait Decider: Send + Sync {
    /// The policy this decider applies.
    fn policy(&self) -> Policy;
    /// The verdict for `presented` (None: no token sent) against `mark`.
    fn decide(&self, resource: &str, presented: Option<&str>, mark: Option<&Token>) -> Result<Verdict, DecideError>;
}

/// The core's decision called natively, without WebAssembly.
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeDecider(pub Policy);

impl Decider for NativeDecider {
    fn policy(&self) -> Policy {
        self.0
    }

    fn decide(&self, resource: &str, presented: Option<&str>, mark: Option<&Token>) -> Result<Verdict, DecideError> {
        Ok(decision::decide(&self.0, resource, presented, mark))
    }
}
