//! What a host does with a verdict: forward the request, or refuse it with the
//! status of the refusal contract (docs/semantics.md, "Refusal contract"), under the policy's mode.
//!
//! Every adapter (proxy-wasm filter, gateway, CLI) maps through here, so the HTTP
//! and gRPC codes, the header names and the fail-open rules exist once.

use crate::decision::{Mode, Verdict};
use crate::token::Token;
use core::fmt;

use crate::http::TOKEN_HEADER;

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
    /// The token would advance the mark, but the lock service did not confirm that
    /// it issued it (the provenance check): a forged or foreign token.
    Unverified,
}

impl Class {
    /// Every class, in counter order.
    pub const ALL: [Class; 7] = [
        Class::Admitted,
        Class::Stale,
        Class::Replayed,
        Class::Malformed,
        Class::Missing,
        Class::Undecided,
        Class::Unverified,
    ];

    /// This class's position in [`Class::ALL`] (for arrays of counters).
    pub fn index(self) -> usize {
        match self {
            Class::Admitted => 0,
            Class::Stale => 1,
            Class::Replayed => 2,
            Class::Malformed => 3,
            Class::Missing => 4,
            Class::Undecided => 5,
            Class::Unverified => 6,
        }
    }

    /// The stable lower-case name used in metrics, logs and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Class::Admitted => "admitted",
            Class::Stale => "stale",
            Class::Replayed => "replayed",
            Class::Malformed => "malformed",
            Class::Missing => "missing",
            Class::Undecided => "undecided",
            Class::Unverified => "unverified",
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
            // Forbidden: retrying with the same token cannot succeed.
            Class::Unverified => 403,
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
            // PERMISSION_DENIED: the token is not one the caller may use.
            Class::Unverified => 7,
        }
    }
}

/// Why the host does not act on a verdict, as far as the mode is concerned: none was
/// reached, or the lock service did not vouch for the token an admit would advance to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoVerdict {
    /// The mark store could not be reached or answered damaged data. The only
    /// failure efficiency mode lets a request through on: it depends on the
    /// infrastructure, never on what the request carried.
    StoreUnreachable,
    /// Anything else: a validator fault, a verdict that broke the contract, lost
    /// races, a timeout at the ordering gate, a lock service that could not be asked
    /// about a token. Refused in both modes.
    Refused,
    /// The token would advance the mark, but the lock service did not confirm that
    /// it issued it (the provenance check). Refused in both modes as
    /// [`Class::Unverified`]: it is what the request carried.
    Unverified,
}

/// What the host does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    /// The outcome's class (what to count).
    pub class: Class,
    /// Forward the request to the resource (true) or refuse it.
    pub forward: bool,
    /// On admit: the admitted token, for [`ADMITTED_HEADER`](crate::http::ADMITTED_HEADER).
    /// On stale or replayed: the current mark, for [`HIGHEST_HEADER`](crate::http::HIGHEST_HEADER).
    pub token: Option<Token>,
}

impl Action {
    /// The request is forwarded without an admit: efficiency mode failing open.
    pub fn failed_open(&self) -> bool {
        self.forward && self.class != Class::Admitted
    }
}

/// Resolve a verdict, or the reason none was reached, into an action under `mode`.
///
/// Only an admit is forwarded, in both modes, with one exception: efficiency mode
/// lets a request through when the mark store cannot be reached
/// ([`NoVerdict::StoreUnreachable`]). Nothing a request carries (a stale, replayed,
/// malformed, missing or unverified token, or one that makes the validator fail)
/// ever passes.
pub fn resolve<M>(mode: Mode, outcome: Result<&Verdict<M>, NoVerdict>) -> Action {
    let (class, token) = match outcome {
        Ok(Verdict::Admit { mark, .. }) => (Class::Admitted, Some(*mark)),
        Ok(Verdict::Stale { mark, .. }) => (Class::Stale, Some(*mark)),
        Ok(Verdict::Replayed { mark }) => (Class::Replayed, Some(*mark)),
        Ok(Verdict::Malformed(_)) => (Class::Malformed, None),
        Ok(Verdict::Missing) => (Class::Missing, None),
        Err(NoVerdict::Unverified) => (Class::Unverified, None),
        Err(_) => (Class::Undecided, None),
    };
    let forward = match outcome {
        Ok(Verdict::Admit { .. }) => true,
        Err(NoVerdict::StoreUnreachable) => mode == Mode::Efficiency,
        _ => false,
    };
    Action { class, forward, token }
}

/// The one-line reason for a refusal (or a fail-open pass), for response bodies and
/// logs.
pub struct Reason<'a, M> {
    /// The verdict, or `None` when the validator could not decide.
    pub verdict: Option<&'a Verdict<M>>,
    /// The resource key.
    pub resource: &'a str,
    /// The cause when undecided (guest fault, store error).
    pub cause: &'a dyn fmt::Display,
}

impl<M: fmt::Display> fmt::Display for Reason<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.resource;
        match self.verdict {
            Some(Verdict::Admit { mark, advanced: true }) => write!(f, "admitted token {mark} on {r:?}; the mark advanced"),
            Some(Verdict::Admit { mark, advanced: false }) => write!(f, "admitted token {mark} on {r:?}; the mark is unchanged"),
            // A cause on a stale verdict says why the mark it was judged against is not
            // one the resource has seen: the retention floor ([`Forgotten`]).
            Some(Verdict::Stale { presented, .. }) if !is_empty(self.cause) => write!(
                f,
                "stale fencing token {presented} for {r:?}: {}; reacquire the lock for a newer token",
                self.cause
            ),
            Some(Verdict::Stale { mark, presented }) => write!(
                f,
                "stale fencing token {presented} for {r:?}: the resource has seen token {mark}; a newer lock holder exists, reacquire the lock"
            ),
            Some(Verdict::Replayed { mark }) => write!(
                f,
                "replayed fencing token {mark} for {r:?}: strict mode admits each token once; acquire a new token"
            ),
            Some(Verdict::Malformed(m)) => write!(f, "malformed request: {m}"),
            Some(Verdict::Missing) => write!(
                f,
                "missing fencing token for {r:?}: send the lock's fencing token with the write (over HTTP, in the {TOKEN_HEADER} header)"
            ),
            None => write!(
                f,
                "cannot decide on {r:?}: {}; retry later (in strict mode with a new token: the mark may have advanced)",
                self.cause
            ),
        }
    }
}

/// Why a token was judged against the retention floor: the resource has no mark of
/// its own because a compaction forgot it, so it is held to the floor, which lies at
/// or above every mark forgotten. The cause of a stale [`Reason`] so judged.
pub struct Forgotten {
    /// The retention floor.
    pub floor: Token,
}

impl fmt::Display for Forgotten {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the resource has no mark of its own (retention forgets the marks of idle resources) and is held to \
             the retention floor {}, at or above every mark retention forgot",
            self.floor
        )
    }
}

/// True when `text` writes nothing (no allocation: the bytes are only counted).
fn is_empty(text: &dyn fmt::Display) -> bool {
    struct Count(usize);
    impl fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = fmt::write(&mut count, format_args!("{text}"));
    count.0 == 0
}

/// The one-line reason for an unverified refusal ([`NoVerdict::Unverified`]), for
/// response bodies and logs. `cause` is the lock service's side of it: which token,
/// and why it is not one the service issued.
pub struct Unverified<'a> {
    /// The resource key.
    pub resource: &'a str,
    /// Why the lock service did not vouch for the token.
    pub cause: &'a dyn fmt::Display,
}

impl fmt::Display for Unverified<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unverified fencing token for {:?}: {}; only a token the lock service issued can advance the mark, \
             acquire the lock and send its token",
            self.resource, self.cause
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn stale() -> Verdict {
        Verdict::Stale { mark: Token::parse("34").unwrap(), presented: Token::parse("33").unwrap() }
    }

    #[test]
    fn correctness_mode_fails_closed() {
        for cause in [NoVerdict::StoreUnreachable, NoVerdict::Refused] {
            assert!(!resolve::<()>(Mode::Correctness, Err(cause)).forward);
            assert_eq!(resolve::<()>(Mode::Correctness, Err(cause)).class.http_status(), 503);
        }
        let missing = resolve(Mode::Correctness, Ok(&Verdict::<()>::Missing));
        assert!(!missing.forward);
        assert_eq!(missing.class.http_status(), 428);
    }

    #[test]
    fn efficiency_mode_fails_open_only_when_the_store_is_unreachable() {
        let open = resolve::<()>(Mode::Efficiency, Err(NoVerdict::StoreUnreachable));
        assert!(open.forward && open.failed_open());
        assert!(!resolve::<()>(Mode::Efficiency, Err(NoVerdict::Refused)).forward);
        // What a request carries never passes: no token, a stale, malformed or replayed one.
        assert!(!resolve(Mode::Efficiency, Ok(&Verdict::<()>::Missing)).forward);
        assert!(!resolve(Mode::Efficiency, Ok(&Verdict::Malformed(()))).forward);
        let stale = resolve(Mode::Efficiency, Ok(&stale()));
        assert!(!stale.forward);
        assert_eq!(stale.token, Token::parse("34").ok());
        assert_eq!(stale.class.http_status(), 409);
        assert_eq!(stale.class.grpc_status(), 9);
    }

    #[test]
    fn an_unverified_token_is_refused_403_permission_denied_in_both_modes() {
        for mode in [Mode::Correctness, Mode::Efficiency] {
            let action = resolve::<()>(mode, Err(NoVerdict::Unverified));
            assert!(!action.forward && !action.failed_open(), "{mode:?}");
            assert_eq!(action.class, Class::Unverified);
            assert_eq!(action.token, None, "no fencing-highest: the mark did not refuse it");
            assert_eq!((action.class.http_status(), action.class.grpc_status()), (403, 7));
            assert_eq!(action.class.name(), "unverified");
        }
        let text = std::format!("{}", Unverified { resource: "f", cause: &"etcd has not issued token 9" });
        assert!(text.starts_with("unverified fencing token for \"f\": etcd has not issued token 9;"), "{text}");
        assert!(!text.contains('\n'));
    }

    #[test]
    fn class_index_is_the_position_in_all() {
        for (i, class) in Class::ALL.iter().enumerate() {
            assert_eq!(class.index(), i);
        }
    }

    #[test]
    fn reasons_are_one_line() {
        let v = stale();
        let text = std::format!("{}", Reason { verdict: Some(&v), resource: "f", cause: &"" });
        assert!(text.contains("34") && text.contains("33") && !text.contains('\n'));
    }

    #[test]
    fn a_stale_reason_against_the_retention_floor_names_retention() {
        let v = stale();
        let floor = Forgotten { floor: Token::parse("34").unwrap() };
        let text = std::format!("{}", Reason { verdict: Some(&v), resource: "f", cause: &floor });
        assert!(text.starts_with("stale fencing token 33 for \"f\": the resource has no mark of its own"), "{text}");
        assert!(text.contains("retention floor 34") && !text.contains("has seen token"), "{text}");
        assert!(!text.contains('\n'));
    }
}
