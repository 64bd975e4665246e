//! What a fenced write is refused for on its head alone: before any mark is read and
//! before its body is read, in one order for every host.
//!
//! A request can fail more than one of these at once (a COPY with a malformed token
//! under conditional writes; an over-long token during the start grace). Two hosts that
//! checked in different orders answered it differently (400 from one, 501 or 503 from
//! the other), so the order is the engine's:
//!
//! 1. **malformed** (400): no resource the fence can key, a token sent twice with two
//!    values, a write the protocol cannot fence, a key or token over its bound
//!    ([`fencekeeper_core::precheck`]). The request is wrong whatever the fence's state.
//! 2. **not conditional** (501): under conditional writes, a write that cannot carry a
//!    precondition (`fencekeeper_chain::unconditional`). Wrong in this deployment,
//!    whatever the fence's state.
//! 3. **too large** (413): a declared `Content-Length` over what the host holds whole
//!    (the gateway every fenced body, the filter a conditional write's).
//! 4. **start grace** (503 with `Retry-After`): a host that has just started. The only
//!    answer a retry mends by waiting, so it comes after every answer that no retry
//!    mends: a client that waits out the grace must not then learn its request was
//!    never good.
//!
//! A host renders each refusal with the engine's modules (a malformed verdict through
//! its refusal path, [`crate::conditional::not_conditional`],
//! [`crate::conditional::too_large`], [`crate::gate::in_start_grace`]) and counts it
//! as they say.

use crate::head::{Head, Presented, Scope};
use fencekeeper_core::{precheck, Malformed, ResourceError};
use std::time::Duration;

/// Why a fenced write is refused on its head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Early {
    /// The request is malformed (400).
    Malformed(Malformed),
    /// Under conditional writes, the write cannot carry a precondition (501): why.
    NotConditional(&'static str),
    /// Its declared body is over the host's limit (413).
    TooLarge {
        /// The declared length.
        length: u64,
        /// The limit.
        max: u64,
    },
    /// The host is in its start grace (503); this much of it is left.
    StartGrace(Duration),
}

/// What a host knows of itself that the early refusals read.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// Conditional writes are on; whether the store was seen honouring `If-Match` on a
    /// DELETE (else a DELETE cannot be conditional).
    pub conditional: Option<Deletes>,
    /// The largest body the host holds whole, when it holds this write's body.
    pub max_body: Option<u64>,
    /// What is left of the host's start grace, while it lasts.
    pub grace_left: Option<Duration>,
}

/// Whether the store honours `If-Match` on a DELETE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deletes(pub bool);

/// The resources and token of the fenced write `head`, or why it is refused before any
/// mark is read. `path` is [`Scope::store_path`]'s; `inherited` gives a multipart
/// step's token ([`Scope::presented`]); `header` looks a request header up by
/// lower-case name.
pub fn check<'h, M: AsRef<str>, R: AsRef<str>>(
    scope: &Scope<'_, M, R>,
    head: &Head,
    path: &Result<Vec<u8>, ResourceError>,
    inherited: impl FnOnce(&[u8]) -> Option<String>,
    header: impl Fn(&str) -> Option<&'h [u8]>,
    limits: Limits,
) -> Result<Presented, Early> {
    let presented = scope.presented(head, path, inherited).map_err(|e| Early::Malformed(Malformed::Resource(e)))?;
    for key in &presented.keys {
        precheck(key, presented.token.as_deref()).map_err(Early::Malformed)?;
    }
    if let Some(Deletes(deletes)) = limits.conditional {
        if let Some(why) = fencekeeper_chain::unconditional(head.method, head.target, &header, deletes) {
            return Err(Early::NotConditional(why));
        }
    }
    let declared = header("content-length").and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    if let (Some(length), Some(max)) = (declared, limits.max_body) {
        if length > max {
            return Err(Early::TooLarge { length, max });
        }
    }
    match limits.grace_left {
        Some(left) => Err(Early::StartGrace(left)),
        None => Ok(presented),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::http::ResourceFrom;
    use fencekeeper_core::Protocol;

    const FROM_PATH: ResourceFrom<&str> = ResourceFrom::Path { strip_prefix: "" };

    fn scope(protocol: Protocol) -> Scope<'static, &'static str, &'static str> {
        Scope {
            protocol,
            fenced_methods: None,
            path_prefix: "/",
            s3_domain: None,
            resource: &FROM_PATH,
            two_resources: true,
        }
    }

    /// Check `method target` with `headers` (the token among them) under `limits`.
    fn run(
        protocol: Protocol,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        limits: Limits,
    ) -> Result<Presented, Early> {
        let token = headers.iter().find(|(n, _)| *n == "fencing-token").map(|(_, v)| v.as_bytes());
        let head = Head { method, target: target.as_bytes(), token, ..Head::default() };
        let scope = scope(protocol);
        let path = scope.store_path(&head);
        let header = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_bytes());
        check(&scope, &head, &path, |_| None, header, limits)
    }

    fn all_on() -> Limits {
        Limits { conditional: Some(Deletes(true)), max_body: Some(10), grace_left: Some(Duration::from_secs(3)) }
    }

    #[test]
    fn a_write_failing_every_check_gets_the_first_in_the_order() {
        let long = "9".repeat(200);
        let copy = [("fencing-token", long.as_str()), ("x-amz-copy-source", "b/o"), ("content-length", "99")];
        let e = run(Protocol::S3, "PUT", "/b/o", &copy, all_on()).unwrap_err();
        assert!(matches!(e, Early::Malformed(_)), "{e:?}");

        let copy = [("fencing-token", "7"), ("x-amz-copy-source", "b/o"), ("content-length", "99")];
        let e = run(Protocol::S3, "PUT", "/b/o", &copy, all_on()).unwrap_err();
        assert!(matches!(e, Early::NotConditional(_)), "{e:?}");

        let large = [("fencing-token", "7"), ("content-length", "99")];
        assert_eq!(run(Protocol::S3, "PUT", "/b/o", &large, all_on()), Err(Early::TooLarge { length: 99, max: 10 }));

        let fine = [("fencing-token", "7"), ("content-length", "9")];
        assert_eq!(run(Protocol::S3, "PUT", "/b/o", &fine, all_on()), Err(Early::StartGrace(Duration::from_secs(3))));

        let presented = run(Protocol::S3, "PUT", "/b/o", &fine, Limits { grace_left: None, ..all_on() }).unwrap();
        assert_eq!(presented, Presented { keys: vec!["/b/o".to_owned()], token: Some("7".to_owned()) });
    }

    #[test]
    fn an_over_long_token_is_malformed_even_in_the_start_grace() {
        let long = "1".repeat(129);
        let grace = Limits { grace_left: Some(Duration::from_secs(1)), ..Limits::default() };
        let e = run(Protocol::Http, "PUT", "/r", &[("fencing-token", long.as_str())], grace).unwrap_err();
        assert!(matches!(e, Early::Malformed(_)), "{e:?}");
    }

    #[test]
    fn without_conditional_writes_or_a_limit_only_the_key_and_the_grace_are_checked() {
        let copy = [("fencing-token", "7"), ("x-amz-copy-source", "b/o"), ("content-length", "99999")];
        let presented = run(Protocol::S3, "PUT", "/b/o", &copy, Limits::default()).unwrap();
        assert_eq!(presented.keys, ["/b/o"]);
        // A missing or unparsable token is the decision's to refuse, with the mark.
        assert!(run(Protocol::Http, "PUT", "/r", &[], Limits::default()).is_ok());
        assert!(run(Protocol::Http, "PUT", "/r", &[("fencing-token", "x")], Limits::default()).is_ok());
    }

    #[test]
    fn a_delete_is_not_conditional_on_a_store_not_seen_honouring_if_match_on_one() {
        let limits = Limits { conditional: Some(Deletes(false)), ..Limits::default() };
        let e = run(Protocol::S3, "DELETE", "/b/o", &[("fencing-token", "7")], limits).unwrap_err();
        assert!(matches!(e, Early::NotConditional(_)), "{e:?}");
        let limits = Limits { conditional: Some(Deletes(true)), ..Limits::default() };
        assert!(run(Protocol::S3, "DELETE", "/b/o", &[("fencing-token", "7")], limits).is_ok());
    }
}
