//! What an answer says happened, classified from its raw form ([`classify`]): status,
//! the `fencing-highest` header, the body's first words, a transport error.

use crate::record::Write;

/// What an answer says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// 2xx: admitted, and the store stored it.
    Stored,
    /// 409 with `fencing-highest`: refused as stale.
    Stale,
    /// 428: refused, no token.
    Missing,
    /// 400: refused, malformed.
    Malformed,
    /// 503 "cannot decide": refused, undecided (the mark may still have advanced).
    Undecided,
    /// Admitted and forwarded, but the store failed: its own injected error.
    UpstreamError,
    /// Admitted and forwarded, but the proxy got no answer from the store (502, 504,
    /// Envoy's "upstream connect error").
    UpstreamFailed,
    /// Never sent (connection refused).
    Unreachable,
    /// Sent, no answer (a timeout, a reset, a worker killed mid-write).
    Unknown,
    /// 409 "cannot write": admitted, but refused for the store's version (conditional
    /// writes: the store refused the precondition, or the version is not known); not
    /// applied. Only a write the store applied late, after a fault, explains it.
    Conflict,
    /// 503 "cannot write": a conditional write refused because too many writes given up
    /// on are lent on its resource's chain (each may still be applied by the store) until
    /// an operator releases them. Admitted (the mark may have advanced), never applied.
    /// Only writes given up on during earlier faults explain it, and it lasts past them.
    Lent,
    /// Anything else: unaccounted for.
    Other,
}

impl Class {
    /// The fence admitted the token (the mark is at least the token).
    pub fn admitted(self) -> bool {
        matches!(self, Class::Stored | Class::UpstreamError | Class::UpstreamFailed)
    }

    /// Answers that only a fault explains.
    pub fn disturbed(self) -> bool {
        matches!(
            self,
            Class::Undecided
                | Class::UpstreamError
                | Class::UpstreamFailed
                | Class::Unreachable
                | Class::Unknown
                | Class::Conflict
        )
    }

    /// A word for tables.
    pub fn word(self) -> &'static str {
        match self {
            Class::Stored => "stored",
            Class::Stale => "stale",
            Class::Missing => "missing",
            Class::Malformed => "malformed",
            Class::Undecided => "undecided",
            Class::UpstreamError => "upstream-error",
            Class::UpstreamFailed => "upstream-failed",
            Class::Unreachable => "unreachable",
            Class::Unknown => "unknown",
            Class::Conflict => "conflict",
            Class::Lent => "lent",
            Class::Other => "other",
        }
    }
}

/// What a refusal for writes left lent on a resource says (`fencekeeper-chain`'s
/// `Refusal::TooManyLent`).
const LENT: &str = "writes given up on may still be applied by the store";

/// Classify one recorded answer.
pub fn classify(w: &Write) -> Class {
    match (&w.error, w.status) {
        (Some(e), _) if e == "refused" => Class::Unreachable,
        (Some(_), _) => Class::Unknown,
        (None, 0) => Class::Unknown,
        (None, 200..=299) => Class::Stored,
        (None, _) if w.upstream_error => Class::UpstreamError,
        (None, 409) if w.highest.is_some() => Class::Stale,
        // Writes left lent: 503 from the gateway and the Envoy filter alike (the filter
        // answered 409 before, and a log of then still reads so).
        (None, 409 | 503) if w.body.starts_with("cannot write") && w.body.contains(LENT) => Class::Lent,
        (None, 409) if w.body.starts_with("cannot write") => Class::Conflict,
        (None, 428) => Class::Missing,
        (None, 400) => Class::Malformed,
        (None, 503) if w.body.starts_with("cannot decide") => Class::Undecided,
        (None, 503) if w.body.starts_with("cannot write") => Class::Lent,
        (None, 502 | 504) => Class::UpstreamFailed,
        (None, 503) if w.body.starts_with("upstream connect error") => Class::UpstreamFailed,
        // Envoy's own 503 with no body: the filter's VM failed (a trap) or is being
        // reloaded. A request already forwarded when its VM trapped gets it too, after
        // the store applied it: so it says nothing about what happened.
        (None, 503) if w.body.is_empty() => Class::Unknown,
        _ => Class::Other,
    }
}
