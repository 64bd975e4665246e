//! What a host does with a verdict: forward the request, or refuse it with the
//! status of the refusal contract (DESIGN.md), under the policy's mode.
//!
//! Every adapter (proxy-wasm filter, gateway, CLI) maps through here, so the HTTP
//! and gRPC codes, the header names and the fail-open rules exist once.

use crate::decision::{Mode, Verdict};
use crate::token::Token;
use core::fmt;

/// The request header that carries the fencing token, by default.
pub const TOKEN_HEADER: &str = "fencing-token";
/// The response header that carries the current mark on a stale or replayed refusal.
pub const HIGHEST_HEADER: &str = "fencing-highest";
/// The header added to a forwarded request: the token that was admitted.
pub const ADMITTED_HEADER: &str = "fencing-admitted-token";

/// The class of an outcome; one counter each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// The token was admitted.
    Admitted,
    /// The token was lower than the mark.
    Stale,
    /// Strict mode: the token equalled the mark.
    Replayed,
    /// The token or resource key was malformed.
    Malformed,
    /// The request carried no token.
    Missing,
    /// The validator could not decide (guest fault, store unreachable).
    Undecided,
}

impl Class {
    /// Every class, in counter order.
    pub const ALL: [Class; 6] =
        [Class::Admitted, Class::Stale, Class::Replayed, Class::Malformed, Class::Missing, Class::Undecided];

    /// The stable lower-case name used in metrics, logs and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Class::Admitted => "admitted",
            Class::Stale => "stale",
            Class::Replayed => "replayed",
            Class::Malformed => "malformed",
            Class::Missing => "missing",
            Class::Undecided => "undecided",
        }
    }

    /// The HTTP status of a refusal of this class (200 for admitted).
    pub fn http_status(self) -> u16 {
        match self {
            Class::Admitted => 200,
            Class::Stale | Class::Replayed => 409,
            Class::Missing => 428,
            Class::Malformed => 400,
            Class::Undecided => 503,
        }
    }

    /// The gRPC status code of a refusal of this class (0, OK, for admitted).
    pub fn grpc_status(self) -> u32 {
        match self {
            Class::Admitted => 0,
            // FAILED_PRECONDITION: the caller must reacquire the lock (or present one).
            Class::Stale | Class::Replayed | Class::Missing => 9,
            // INVALID_ARGUMENT
            Class::Malformed => 3,
            // UNAVAILABLE: retrying later may succeed.
            Class::Undecided => 14,
        }
    }
}

/// What the host does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    /// The outcome's class (what to count).
    pub class: Class,
    /// Forward the request to the resource (true) or refuse it.
    pub forward: bool,
    /// On admit: the admitted token, for [`ADMITTED_HEADER`]. On stale or replayed:
    /// the current mark, for [`HIGHEST_HEADER`].
    pub token: Option<Token>,
}

/// Resolve a verdict, or a failure to reach one, into an action under `mode`.
///
/// Correctness mode refuses everything but an admit. Efficiency mode also lets a
/// request without a token, and a request that could not be decided, through.
/// Stale, replayed and malformed tokens are refused in both modes.
pub fn resolve(mode: Mode, verdict: Option<&Verdict>) -> Action {
    let fail_open = mode == Mode::Efficiency;
    let (class, token) = match verdict {
        Some(Verdict::Admit { mark, .. }) => (Class::Admitted, Some(*mark)),
        Some(Verdict::Stale { mark }) => (Class::Stale, Some(*mark)),
        Some(Verdict::Replayed { mark }) => (Class::Replayed, Some(*mark)),
        Some(Verdict::Malformed(_)) => (Class::Malformed, None),
        Some(Verdict::Missing) => (Class::Missing, None),
        None => (Class::Undecided, None),
    };
    let forward = match class {
        Class::Admitted => true,
        Class::Missing | Class::Undecided => fail_open,
        Class::Stale | Class::Replayed | Class::Malformed => false,
    };
    Action { class, forward, token }
}

/// The one-line reason for a refusal (or a fail-open pass), for response bodies and
/// logs. `detail` is the malformed reason or the cause of an undecided outcome.
pub struct Reason<'a> {
    /// The verdict, or `None` when the validator could not decide.
    pub verdict: Option<&'a Verdict>,
    /// The resource key.
    pub resource: &'a str,
    /// The cause when undecided (guest fault, store error).
    pub cause: &'a dyn fmt::Display,
}

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.resource;
        match self.verdict {
            Some(Verdict::Admit { mark, advanced: true }) => write!(f, "admitted token {mark} on {r:?}; the mark advanced"),
            Some(Verdict::Admit { mark, advanced: false }) => write!(f, "admitted token {mark} on {r:?}; the mark is unchanged"),
            Some(Verdict::Stale { mark }) => write!(
                f,
                "stale fencing token for {r:?}: the resource has seen token {mark}; a newer lock holder exists, reacquire the lock"
            ),
            Some(Verdict::Replayed { mark }) => write!(
                f,
                "replayed fencing token {mark} for {r:?}: strict mode admits each token once; acquire a new token"
            ),
            Some(Verdict::Malformed(m)) => write!(f, "malformed request: {m}"),
            Some(Verdict::Missing) => write!(
                f,
                "missing fencing token for {r:?}: send the lock's fencing token in the {TOKEN_HEADER} header"
            ),
            None => write!(f, "cannot decide on {r:?}: {}; retry later", self.cause),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn correctness_mode_fails_closed() {
        assert!(!resolve(Mode::Correctness, None).forward);
        assert!(!resolve(Mode::Correctness, Some(&Verdict::Missing)).forward);
        assert_eq!(resolve(Mode::Correctness, None).class.http_status(), 503);
        assert_eq!(resolve(Mode::Correctness, Some(&Verdict::Missing)).class.http_status(), 428);
    }

    #[test]
    fn efficiency_mode_fails_open_but_still_refuses_stale() {
        let mark = Token::parse("34").unwrap();
        assert!(resolve(Mode::Efficiency, None).forward);
        assert!(resolve(Mode::Efficiency, Some(&Verdict::Missing)).forward);
        let stale = resolve(Mode::Efficiency, Some(&Verdict::Stale { mark }));
        assert!(!stale.forward);
        assert_eq!(stale.token, Some(mark));
        assert_eq!(stale.class.http_status(), 409);
        assert_eq!(stale.class.grpc_status(), 9);
    }

    #[test]
    fn reasons_are_one_line() {
        let mark = Token::parse("34").unwrap();
        let v = Verdict::Stale { mark };
        let text = std::format!("{}", Reason { verdict: Some(&v), resource: "f", cause: &"" });
        assert!(text.contains("34") && !text.contains('\n'));
    }
}
