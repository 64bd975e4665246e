//! Conditional writes' HTTP behaviour: what a host does around a resource's version
//! chain (`fencekeeper_chain`), the same in every host. A host keeps the chain where
//! it can (the gateway's chain store, the filter's record in etcd) and the turn of
//! each call; here is what the calls mean:
//!
//! * which writes are refused before any mark is read: one that cannot be sent with a
//!   precondition (501, [`not_conditional`]), a body over what the fence holds (413,
//!   [`too_large`]);
//! * the precondition a lent write carries ([`precondition`]);
//! * a lend the chain refuses ([`lend_refused`]), the version moving while the body
//!   arrived ([`moved`]), the chain out of reach ([`unavailable`]);
//! * what the store's answer to a lent write means ([`Stored`]): the chain's
//!   [`chain::Answer`] to settle, then what the client gets: the store's answer
//!   unchanged, or the fence's refusal. A 412 is refused as stale when the chain has
//!   lent a higher token than the write's (a later write reached the store), else as
//!   a version conflict (409). A 404 to a PUT (`If-Match` on an object that is gone)
//!   is a version conflict too: the write did not happen, the chain now knows the
//!   object absent, and the retry goes as a new object (`If-None-Match: *`);
//! * what a read's answer teaches ([`learned`]).
//!
//! # Counting
//!
//! A host counts a conditional write once, when its outcome is known, not when it is
//! admitted: a write whose answer is the store's counts `admitted`; a [`Refused`]
//! one, what the refusal says. So:
//!
//! * exactly one class counter, for what the client is told of its token: `stale`
//!   when it is refused as stale (by its chain, or after the store's 412 when the
//!   chain has lent a higher token), `undecided` when the chain could not be read or
//!   changed (503), else `admitted`: its token was admitted, whatever its version then
//!   met (a version conflict, or the store's own answer). A write refused before any
//!   mark is read (501, 413) moves no class counter;
//! * at most one conditional [`Event`], naming who refused the write:
//!   [`Event::VersionRefused`] when the fence's version chain refused it before it
//!   was sent, [`Event::PreconditionFailed`] when the store refused its precondition
//!   (412, or 404 to a PUT); [`Event::NotConditional`] for a 501 and
//!   [`Event::TooLarge`] for a 413. A write the store answered otherwise moves none.

mod write;

pub use write::{Body, Command, Delivery, Note, Write};

use crate::answer::{Answer, Failure, Form};
use fencekeeper_chain::{self as chain, Lend, Refusal, Version};
use fencekeeper_core::refusal::{Action, Reason};
use fencekeeper_core::{Class, Token, Verdict};

/// The one conditional-write counter an outcome moves (each host names it its own way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A write that cannot be sent with a precondition was refused (501).
    NotConditional,
    /// A body over what the fence holds was refused (413).
    TooLarge,
    /// The version chain refused the write before it was sent.
    VersionRefused,
    /// The store refused the write's precondition (412, or 404 to a PUT).
    PreconditionFailed,
}

/// A conditional write the fence answers itself, and what it counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The answer to send.
    pub answer: Answer,
    /// The class counter that moves (`None`: refused before any mark was read).
    pub class: Option<Class>,
    /// The conditional counter that moves, if any.
    pub event: Option<Event>,
}

impl Refused {
    fn failure(failure: Failure, reason: &str, form: Form, class: Option<Class>, event: Event) -> Refused {
        Refused { answer: Answer::failure(failure, reason, form), class, event: Some(event) }
    }

    fn stale(resource: &str, token: Token, higher: Token, cause: &str, form: Form, event: Event) -> Refused {
        let verdict: Verdict = Verdict::Stale { mark: higher, presented: token };
        let reason = Reason { verdict: Some(&verdict), resource, cause: &cause }.to_string();
        let action = Action { class: Class::Stale, forward: false, token: Some(higher) };
        Refused { answer: Answer::refusal(&action, &reason, form, None), class: Some(Class::Stale), event: Some(event) }
    }
}

/// A write that cannot be sent with a precondition (`why`: `chain::unconditional`'s
/// reason, or the host's own): 501, before any mark is read.
pub fn not_conditional(resource: &str, why: &str, form: Form) -> Refused {
    let reason = format!(
        "cannot write {resource:?}: {why}: with conditional writes the fence forwards only PUTs of an object's bytes \
         and DELETEs, each with a precondition on the version it last saw applied"
    );
    Refused::failure(Failure::NotImplemented, &reason, form, None, Event::NotConditional)
}

/// A body of `length` bytes or more, over the `max` the fence holds of a write
/// (raised with the host's `setting`): 413, before any mark is read, and none of it
/// reaches the store.
pub fn too_large(length: u64, max: u64, setting: &str, form: Form) -> Refused {
    let reason = format!(
        "the body is {length} bytes or more, and the fence holds a write's body whole up to {max} bytes ({setting}): \
         nothing was written"
    );
    Refused::failure(Failure::TooLarge, &reason, form, None, Event::TooLarge)
}

/// The precondition header a write lent on `on` carries, name and value. It replaces
/// any the client sent (none reaches here: a write carrying its own is refused as
/// [`not_conditional`]).
pub fn precondition(on: &Version) -> (&'static str, String) {
    match on {
        Version::Absent => ("if-none-match", "*".to_owned()),
        Version::Tag(tag) => ("if-match", tag.clone()),
    }
}

/// The chain refused to lend the write with `token` on `resource`: stale when it lent
/// a higher token; 503 while too many writes given up on may still apply (no retry
/// mends it until an operator releases them); else a version conflict (409).
pub fn lend_refused(resource: &str, token: Token, refusal: &Refusal, form: Form) -> Refused {
    let reason = format!("cannot write {resource:?}: {refusal}");
    let admitted = Some(Class::Admitted);
    match refusal {
        Refusal::Stale(higher) => {
            Refused::stale(resource, token, *higher, &refusal.to_string(), form, Event::VersionRefused)
        }
        Refusal::TooManyLent(_) => {
            Refused::failure(Failure::Unavailable, &reason, form, admitted, Event::VersionRefused)
        }
        Refusal::Unknown | Refusal::Repeats(_) => {
            Refused::failure(Failure::VersionConflict, &reason, form, admitted, Event::VersionRefused)
        }
    }
}

/// The store's version moved from `carried` (the precondition the write's headers
/// went with) to `now` while its body arrived: a version conflict (409).
pub fn moved(resource: &str, carried: &Version, now: &Version, form: Form) -> Refused {
    let reason = format!(
        "cannot write {resource:?}: the store's version moved from {carried} to {now} while the write's body arrived \
         (another write to the object went first); retry"
    );
    Refused::failure(Failure::VersionConflict, &reason, form, Some(Class::Admitted), Event::VersionRefused)
}

/// The chain could not be read or changed (`why`): the write cannot be lent, so it is
/// never sent: undecided (503).
pub fn unavailable(resource: &str, why: &str, form: Form) -> Refused {
    let cause = format!("the version chain could not be read or changed: {why}; the write was not sent");
    let reason = Reason::<fencekeeper_core::Malformed> { verdict: None, resource, cause: &cause }.to_string();
    let action = Action { class: Class::Undecided, forward: false, token: None };
    let answer = Answer::refusal(&action, &reason, form, None);
    Refused { answer, class: Some(Class::Undecided), event: Some(Event::VersionRefused) }
}

/// What the store's answer to a lent write means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// What to settle the write's lend with.
    pub settle: chain::Answer,
    /// The write applied, but its version cannot be learned from the answer: why (the
    /// host logs it; the resource's next write is refused until a read tells it).
    pub unlearned: Option<String>,
    delete: bool,
    token: Token,
    on: Version,
}

impl Stored {
    /// The store answered the write `lend` (`delete`: a DELETE) with `status` and
    /// `etag`.
    pub fn of(status: u16, etag: Option<&[u8]>, delete: bool, lend: &Lend) -> Stored {
        let (settle, unlearned) = chain::Answer::of(status, etag, delete, &lend.on);
        Stored { settle, unlearned, delete, token: lend.token, on: lend.on.clone() }
    }

    /// The fence's refusal once the lend is settled, or `None`: the store's answer goes
    /// to the client unchanged. `highest` is the highest token the resource's chain
    /// has lent (`None`: not known, the settle failed).
    pub fn refused(&self, resource: &str, highest: Option<Token>, form: Form) -> Option<Refused> {
        let on = &self.on;
        match self.settle {
            chain::Answer::PreconditionFailed => {
                match highest.filter(|h| h.partial_cmp(&self.token).is_some_and(|o| o.is_gt())) {
                    Some(higher) => {
                        let cause = format!(
                            "the store refused the write's precondition (412): a write with the higher token \
                             {higher} was sent to it since"
                        );
                        Some(Refused::stale(resource, self.token, higher, &cause, form, Event::PreconditionFailed))
                    }
                    None => {
                        let reason = format!(
                            "cannot write {resource:?}: the store refused the write's precondition (412): the object \
                             is not at the version the fence last saw applied ({on}), as after a write the fence \
                             gave up on that the store applied late, a write whose answer was lost, or a writer that \
                             does not go through the fence. Read the object through the fence (GET or HEAD) so it \
                             learns the version, then retry (boto3: head_object; the aws CLI: aws s3api \
                             head-object)"
                        );
                        let admitted = Some(Class::Admitted);
                        Some(Refused::failure(
                            Failure::VersionConflict,
                            &reason,
                            form,
                            admitted,
                            Event::PreconditionFailed,
                        ))
                    }
                }
            }
            chain::Answer::Missing if !self.delete => {
                let reason = format!(
                    "cannot write {resource:?}: the store answered 404 to its precondition on {on}: the object was \
                     deleted since the fence last saw it, and the write did not happen; retry, and it goes as a new \
                     object"
                );
                let admitted = Some(Class::Admitted);
                Some(Refused::failure(Failure::VersionConflict, &reason, form, admitted, Event::PreconditionFailed))
            }
            _ => None,
        }
    }
}

/// What a read's answer (`status`, `etag`) says of the store's version, for a chain
/// that lost its own: a 200 with a strong ETag its version, a 404 absent; any other,
/// nothing.
pub fn learned(status: u16, etag: Option<&[u8]>) -> Option<Version> {
    match status {
        200 => Version::tag(etag?).ok(),
        404 => Some(Version::Absent),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn token(t: &str) -> Token {
        Token::parse(t).unwrap()
    }

    fn tag(s: &str) -> Version {
        Version::Tag(format!("\"{s}\""))
    }

    fn lend(t: &str, on: Version) -> Lend {
        Lend { id: 1, token: token(t), on, makes: None, until: None }
    }

    fn counted(r: &Refused) -> (u16, Option<Class>, Option<Event>) {
        (r.answer.status, r.class, r.event)
    }

    #[test]
    fn a_lend_carries_if_match_on_a_tag_and_if_none_match_on_absent() {
        assert_eq!(precondition(&tag("a")), ("if-match", "\"a\"".to_owned()));
        assert_eq!(precondition(&Version::Absent), ("if-none-match", "*".to_owned()));
    }

    #[test]
    fn a_412_is_stale_when_the_chain_lent_a_higher_token_else_a_version_conflict() {
        let stored = Stored::of(412, None, false, &lend("33", tag("a")));
        assert_eq!(stored.settle, chain::Answer::PreconditionFailed);
        let stale = stored.refused("r", Some(token("34")), Form::Text).unwrap();
        assert_eq!(counted(&stale), (409, Some(Class::Stale), Some(Event::PreconditionFailed)));
        assert_eq!(stale.answer.header("fencing-highest"), Some("34"));
        let body = &stale.answer.body;
        assert!(body.starts_with("stale fencing token 33 for \"r\": the store refused"), "{body}");
        for highest in [None, Some(token("33")), Some(token("1.2"))] {
            let conflict = stored.refused("r", highest, Form::S3).unwrap();
            assert_eq!(counted(&conflict), (409, Some(Class::Admitted), Some(Event::PreconditionFailed)));
            let answer = &conflict.answer;
            assert_eq!(answer.header("fencing-highest"), None, "{highest:?}");
            assert!(answer.body.contains("<Code>FencingVersionConflict</Code>"), "{}", answer.body);
            assert!(answer.reason.contains("(\"a\")") && answer.reason.contains("GET or HEAD"), "{}", answer.reason);
        }
    }

    #[test]
    fn a_404_to_a_put_is_a_version_conflict_and_to_a_delete_the_stores_answer() {
        let put = Stored::of(404, None, false, &lend("5", tag("a")));
        assert_eq!(put.settle, chain::Answer::Missing, "the chain learns the object absent");
        let refused = put.refused("r", Some(token("5")), Form::Text).unwrap();
        assert_eq!(counted(&refused), (409, Some(Class::Admitted), Some(Event::PreconditionFailed)));
        assert!(refused.answer.reason.contains("goes as a new object"), "{}", refused.answer.reason);
        let delete = Stored::of(404, None, true, &lend("5", tag("a")));
        assert_eq!((delete.settle.clone(), delete.refused("r", None, Form::Text)), (chain::Answer::Missing, None));
        // If-None-Match: * is not answered 404 for a missing object: nothing learned.
        let absent = Stored::of(404, None, false, &lend("5", Version::Absent));
        assert_eq!((absent.settle.clone(), absent.refused("r", None, Form::Text)), (chain::Answer::NotApplied, None));
    }

    #[test]
    fn an_applied_write_settles_its_version_and_the_stores_answer_goes_on() {
        let stored = Stored::of(200, Some(b"\"b\""), false, &lend("5", tag("a")));
        assert_eq!((stored.settle.clone(), stored.unlearned.clone()), (chain::Answer::Applied(Some(tag("b"))), None));
        assert_eq!(stored.refused("r", Some(token("9")), Form::Text), None);
        let weak = Stored::of(200, Some(b"W/\"b\""), false, &lend("5", tag("a")));
        assert!(weak.unlearned.is_some_and(|w| w.contains("weak")));
        let failed = Stored::of(500, None, false, &lend("5", tag("a")));
        assert_eq!((failed.settle.clone(), failed.refused("r", None, Form::Text)), (chain::Answer::NotApplied, None));
    }

    #[test]
    fn a_chain_refusal_is_stale_503_or_409_and_counts_one_version_refusal() {
        let stale = lend_refused("r", token("33"), &Refusal::Stale(token("34")), Form::Grpc);
        assert_eq!((stale.answer.grpc_status, stale.answer.header("fencing-highest")), (Some(9), Some("34")));
        assert!(stale.answer.reason.starts_with("stale fencing token 33"), "{}", stale.answer.reason);
        assert_eq!((stale.class, stale.event), (Some(Class::Stale), Some(Event::VersionRefused)));
        let full = lend_refused("r", token("33"), &Refusal::TooManyLent(32), Form::Text);
        assert_eq!(counted(&full), (503, Some(Class::Admitted), Some(Event::VersionRefused)));
        for refusal in [Refusal::Unknown, Refusal::Repeats(tag("a"))] {
            let r = lend_refused("r", token("33"), &refusal, Form::Text);
            assert_eq!(counted(&r), (409, Some(Class::Admitted), Some(Event::VersionRefused)));
            assert_eq!(r.answer.body.lines().count(), 1);
        }
        let moved = moved("r", &Version::Absent, &tag("b"), Form::Text);
        assert_eq!(counted(&moved), (409, Some(Class::Admitted), Some(Event::VersionRefused)));
        let down = unavailable("r", "etcd down", Form::Text);
        assert_eq!(counted(&down), (503, Some(Class::Undecided), Some(Event::VersionRefused)));
        assert!(down.answer.reason.starts_with("cannot decide on \"r\": the version chain"), "{}", down.answer.reason);
    }

    #[test]
    fn writes_refused_before_any_mark_is_read_count_no_class() {
        let copy = not_conditional("r", "an S3 copy's version cannot be told before it is made", Form::S3);
        assert!(copy.answer.body.contains("<Code>NotImplemented</Code>"), "{}", copy.answer.body);
        assert_eq!(counted(&copy), (501, None, Some(Event::NotConditional)));
        let big = too_large(2048, 1024, "--max-body", Form::Text);
        let reason = &big.answer.reason;
        assert!(reason.contains("2048 bytes or more") && reason.contains("1024 bytes (--max-body)"), "{reason}");
        assert_eq!(counted(&big), (413, None, Some(Event::TooLarge)));
    }

    #[test]
    fn a_read_teaches_a_strong_etag_or_absence() {
        assert_eq!(learned(200, Some(b"\"a\"")), Some(tag("a")));
        assert_eq!(learned(200, Some(b"W/\"a\"")), None);
        assert_eq!(learned(200, None), None);
        assert_eq!(learned(404, None), Some(Version::Absent));
        assert_eq!(learned(304, Some(b"\"a\"")), None);
    }
}
