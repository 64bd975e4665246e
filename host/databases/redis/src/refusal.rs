//! The refusal contract as Redis errors. An error's first word is its class, a stable
//! prefix a client can match on, as Redis's own `MOVED` or `WRONGTYPE`; stale and
//! replayed tokens put the current mark second; the rest is the one-line reason.
//!
//! | class | error | HTTP peer |
//! |---|---|---|
//! | stale | `STALE <mark> stale fencing token 33 for "r": the resource has seen token 34; ...` | 409 |
//! | replayed (strict) | `REPLAYED <mark> replayed fencing token 34 for "r": ...` | 409 |
//! | malformed token (an empty one too) or resource | `MALFORMED malformed request: ...` | 400 |
//! | unverified | `UNVERIFIED ...` (no provenance check in the module: never sent today) | 403 |
//! | cannot decide | `UNDECIDED cannot decide on "r": ...` | 503 |
//!
//! No command answers `MISSING`: each carries its token argument (a command without
//! one is short of its arity, `ERR`), and an empty one is malformed, as in every host.
//! A misused command (arity, a write that would touch a mark, a command that writes
//! no key) answers `ERR`, like Redis; a write that fails answers its own error.

use fencekeeper::{Class, Decision};
use fencekeeper_core::refusal::Reason;
use std::fmt::Display;

/// The error a refused write answers.
pub fn error(decision: &Decision, resource: &str) -> String {
    let class = decision.class();
    let reason = decision.reason(resource);
    match (class, decision.action.token) {
        (Class::Stale | Class::Replayed, Some(mark)) => format!("{} {mark} {reason}", prefix(class)),
        _ => format!("{} {reason}", prefix(class)),
    }
}

/// A resource argument that cannot be a resource key (not UTF-8).
pub fn malformed(cause: impl Display) -> String {
    format!("{} malformed request: {cause}", prefix(Class::Malformed))
}

/// No decision could be reached on `resource`, for `cause`.
pub fn undecided(resource: &str, cause: impl Display) -> String {
    format!(
        "{} {}",
        prefix(Class::Undecided),
        Reason::<fencekeeper::GuestText> { verdict: None, resource, cause: &cause }
    )
}

/// The stable prefix of a class's error.
pub fn prefix(class: Class) -> &'static str {
    match class {
        Class::Admitted => "ADMITTED",
        Class::Stale => "STALE",
        Class::Replayed => "REPLAYED",
        Class::Malformed => "MALFORMED",
        Class::Missing => "MISSING",
        Class::Undecided => "UNDECIDED",
        Class::Unverified => "UNVERIFIED",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper::{Guard, MarkStore, MemoryStore, Mode, NativeDecider, Policy, StoreError, Swap, Token};
    use std::sync::Arc;

    fn guard(strict: bool) -> Guard {
        let decider = NativeDecider(Policy { mode: Mode::Correctness, strict });
        Guard::new(Arc::new(decider), Arc::new(MemoryStore::new()))
    }

    #[test]
    fn stale_and_replayed_errors_carry_the_mark_second() {
        let g = guard(true);
        assert!(g.admit("r", Some("34")).admitted());
        let stale = error(&g.admit("r", Some("33")), "r");
        assert!(
            stale.starts_with("STALE 34 stale fencing token 33 for \"r\": the resource has seen token 34"),
            "{stale}"
        );
        let replayed = error(&g.admit("r", Some("34")), "r");
        assert!(replayed.starts_with("REPLAYED 34 replayed fencing token 34 for \"r\""), "{replayed}");
    }

    #[test]
    fn malformed_and_undecided_have_their_prefixes_and_an_empty_token_is_malformed() {
        let g = guard(false);
        assert_eq!(
            error(&g.admit("r", Some("")), "r"),
            "MALFORMED malformed request: fencing token is empty; \
             expected 1 to 4 decimal u64 components joined by '.', like 34 or 7.1042"
        );
        let bad = error(&g.admit("r", Some("-1")), "r");
        assert!(bad.starts_with("MALFORMED malformed request: "), "{bad}");
        assert!(malformed("resource key is not UTF-8").starts_with("MALFORMED malformed request: resource key"));
        struct Broken;
        impl MarkStore for Broken {
            fn get(&self, _: &str) -> Result<Option<Token>, StoreError> {
                Err(StoreError::Unavailable("down".into()))
            }
            fn compare_and_swap(&self, _: &str, _: Option<&Token>, _: &Token) -> Result<Swap, StoreError> {
                Err(StoreError::Unavailable("down".into()))
            }
        }
        let undecided_admit = error(&g.admit_in(&Broken, "r", Some("5")), "r");
        assert!(
            undecided_admit.starts_with("UNDECIDED cannot decide on \"r\": mark store unavailable: down"),
            "{undecided_admit}"
        );
        assert!(undecided("r", "maxmemory-policy").starts_with("UNDECIDED cannot decide on \"r\": maxmemory-policy"));
    }
}
