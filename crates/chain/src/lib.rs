//! Version chains for conditional writes: the store's own compare-and-swap enforces the order the fence
//! decided, whenever a write arrives.
//!
//! A proxy orders only the writes it forwards, and only while it remembers them: a
//! write it gave up on, or had in flight when it crashed, can still be applied late.
//! Many stores that cannot compare tokens can compare versions for equality (HTTP
//! `If-Match` on ETags: S3, GCS, Azure, WebDAV). So the fence forwards every admitted
//! write with a precondition on the version the store gave the last write it saw
//! applied (`If-Match: "v"`, or `If-None-Match: *` while the object is absent), and
//! records the version the store answers. A late write carries a version the store
//! has moved past, and the store refuses it (412).
//!
//! That holds only while versions never come back. S3's ETags are the MD5 of the
//! body, so a chain can return to an earlier link (A, B, A) and a late write
//! conditioned on A would pass. Hence the [`Chain`] of a resource remembers, durably
//! and before the write is sent, every *lend*: a write forwarded with a precondition
//! whose answer the fence has not seen. A lend ends when the store answers; one
//! given up on, or in flight at a crash, stays (nothing bounds when the store may
//! still apply it). A write is then refused when the version it would make (its
//! body's MD5, for a content-addressed store) is the precondition of any open lend:
//! the chain never returns to a version a late write could carry. (Writing the bytes
//! the object holds is allowed when nothing else is lent on it: a retry. Nor is a
//! lend with the write's own token a bar: a write with an equal token applying late
//! puts no lower token after a higher one.)
//!
//! The argument, in short: a write applies only if the store's version equals its
//! precondition. An open lend's precondition is never made again by a write the
//! fence forwards, so once the store has moved past it (a later write applied) the
//! lend can never apply. And a lend is made only for a token no lower than every
//! token lent before on the resource ([`Chain::lend`] checks, atomically with the
//! record), so a write that applies after another never carries a lower token.
//!
//! A lend given up on cannot stay forever: past [`MAX_LENDS`] of them a resource
//! refuses writes. So each lend carries its *term*, the time past which the store can
//! no longer apply it (its host's upstream timeout plus the store apply bound, after
//! it was sent), and ends by itself once the term is over ([`Chain::expire`], which
//! every lend runs first). That is the ordering gate's one timing assumption, here
//! only for content-addressed versions written again: a late write that arrives
//! after its term and finds the store back at its precondition would apply. A lend
//! with no term (recorded by a host that sets none) ends only by hand
//! ([`Chain::release`]). The terms are wall-clock times, compared by whichever
//! instance lends next: instances' clocks must agree to well within the bound.
//! `tests` check this against a model store with every interleaving it can draw:
//! late deliveries, lost answers, crashes, content-addressed versions.
//!
//! What the fence believes the version is can be wrong (a write applied whose
//! answer was lost): that costs a 412 and an unknown version, never a late write,
//! because a write conditioned on a wrong version does not apply. An unknown version
//! is learned again from a read of the object through the fence (a GET or HEAD
//! answer's strong ETag, or a 404). A 412 is read for what it most likely means
//! first: when exactly one write is still lent on the refused version and the version
//! it makes is known, it was that write, given up on and applied after all, that
//! moved the store, and the chain takes its version (a guess the store checks like
//! any other belief).

mod change;
mod record;

pub use change::{Change, Done};
pub use record::{decode, encode, ChainRecordError};

use fencekeeper_core::Token;
use std::fmt;

/// The longest version the fence keeps (an ETag's bytes, quotes included). S3's are
/// 34 (an MD5 in hex, quoted), or 38 for a multipart upload; GCS and Azure stay far
/// below.
pub const MAX_VERSION: usize = 128;

/// How many writes a resource may have lent at once. Only writes given up on, or in
/// flight at a crash, stay lent; past this many, the resource refuses writes until an
/// operator releases them (`fencekeeper marks --release-lends RESOURCE --force`), once
/// the store can no longer apply them.
pub const MAX_LENDS: usize = 32;

/// A store's version of an object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    /// The object does not exist: a write goes with `If-None-Match: *`.
    Absent,
    /// A strong ETag, as the store sent it (quotes included): a write goes with
    /// `If-Match` on it.
    Tag(String),
}

impl Version {
    /// A strong ETag from a store's answer, or why it cannot be a version: weak
    /// (`W/"..."` never matches `If-Match`), empty, too long, or not visible ASCII.
    pub fn tag(etag: &[u8]) -> Result<Version, VersionError> {
        if etag.starts_with(b"W/") {
            return Err(VersionError::Weak);
        }
        if etag.is_empty() || etag.len() > MAX_VERSION {
            return Err(VersionError::Length(etag.len()));
        }
        if !etag.iter().all(|b| b.is_ascii_graphic()) {
            return Err(VersionError::NotText);
        }
        Ok(Version::Tag(String::from_utf8_lossy(etag).into_owned()))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::Absent => f.write_str("absent"),
            Version::Tag(tag) => f.write_str(tag),
        }
    }
}

/// Why an ETag cannot be used as a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionError {
    /// A weak ETag, which never matches `If-Match`.
    Weak,
    /// Empty, or longer than [`MAX_VERSION`].
    Length(usize),
    /// Holds bytes that are not visible ASCII.
    NotText,
}

impl fmt::Display for VersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionError::Weak => f.write_str("the ETag is weak (W/...), and a weak ETag never matches If-Match"),
            VersionError::Length(n) => write!(f, "the ETag is {n} bytes long (1 to {MAX_VERSION} are kept)"),
            VersionError::NotText => f.write_str("the ETag holds bytes that are not visible ASCII"),
        }
    }
}

impl std::error::Error for VersionError {}

/// One write forwarded with a precondition, whose answer the fence has not seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lend {
    /// Names the lend within its resource's chain.
    pub id: u64,
    /// The write's token.
    pub token: Token,
    /// The version it is conditioned on.
    pub on: Version,
    /// The version it would make, when that was told in advance (a content-addressed
    /// store's MD5 of the body, absent for a delete).
    pub makes: Option<Version>,
    /// Unix time in milliseconds past which the store can no longer apply the write:
    /// the lend then ends by itself. `None`: only by hand.
    pub until: Option<u64>,
}

/// When a write is lent, and how long the store may still apply it after that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// Unix time now, in milliseconds.
    pub now_ms: u64,
    /// How long after it is sent the store may still apply the write: the host's
    /// upstream timeout plus the store apply bound. `None`: no bound is declared, and
    /// a lend given up on stays until an operator releases it.
    pub lifetime_ms: Option<u64>,
}

impl Term {
    /// Lends that never end by themselves.
    pub const UNBOUNDED: Term = Term { now_ms: 0, lifetime_ms: None };

    /// When a lend made now ends.
    fn until(self) -> Option<u64> {
        self.lifetime_ms.map(|life| self.now_ms.saturating_add(life))
    }
}

/// One resource's version chain: what the fence knows of the store's version, and
/// the writes that may still apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// The highest token lent on this resource.
    pub highest: Option<Token>,
    /// The store's version after the last write the fence saw applied (`None`:
    /// unknown, until a read through the fence tells it). A new resource's is
    /// [`Version::Absent`].
    pub current: Option<Version>,
    /// Writes forwarded whose answers the fence has not seen.
    pub lends: Vec<Lend>,
    /// The next lend's id.
    pub next: u64,
}

impl Chain {
    /// The chain of a resource the fence has never written: the object is taken as
    /// absent, so the first write goes with `If-None-Match: *` (an object that exists
    /// already makes it fail with 412, and the version is then learned from a read).
    pub fn new() -> Chain {
        Chain { highest: None, current: Some(Version::Absent), lends: Vec::new(), next: 0 }
    }

    /// Lend a write with `token` that would make the store's version `makes` (when it
    /// can be told in advance: a content-addressed store's MD5 of the body, absent
    /// for a delete). Returns the lend, whose `on` is the precondition to send.
    /// Lends whose term is over at `term.now_ms` end first ([`Chain::expire`]).
    pub fn lend(&mut self, token: Token, makes: Option<&Version>, term: Term) -> Result<Lend, Refusal> {
        self.expire(term.now_ms);
        // Not `token < highest`: tokens of another arity do not compare, and are no
        // more admitted here than by the guard.
        if let Some(highest) = self.highest.filter(|h| token.partial_cmp(h).is_none_or(|o| o.is_lt())) {
            return Err(Refusal::Stale(highest));
        }
        let Some(current) = self.current.clone() else { return Err(Refusal::Unknown) };
        if self.lends.len() >= MAX_LENDS {
            return Err(Refusal::TooManyLent(self.lends.len()));
        }
        // Only a lend with another (so a lower) token is guarded: one with this token
        // applying after this write puts no lower token after a higher one. So the
        // same holder's concurrent writes of the same bytes race for the version like
        // any others, instead of refusing each other.
        if let Some(makes) = makes {
            if self.lends.iter().any(|l| l.on == *makes && l.token != token) {
                return Err(Refusal::Repeats(makes.clone()));
            }
        }
        let lend = Lend { id: self.next, token, on: current, makes: makes.cloned(), until: term.until() };
        self.next += 1;
        self.highest = Some(token);
        self.lends.push(lend.clone());
        Ok(lend)
    }

    /// The store answered lend `id`: the lend ends, and what the answer says about
    /// the version is recorded.
    pub fn settle(&mut self, id: u64, answer: &Answer) {
        let Some(at) = self.lends.iter().position(|l| l.id == id) else { return };
        let lend = self.lends.remove(at);
        let believed = self.current.as_ref() == Some(&lend.on);
        match answer {
            // Applied: the store was at `on`, then at what it answered. Recorded when the
            // chain is still at `on`. Otherwise something else moved it after this
            // write was lent (another write's settle, a read, a refusal), and which of
            // the two the store applied last is not known: two writes lent on one
            // version both apply when the first writes the same bytes again, and their
            // settles may come in either order. Taking this answer then would put the
            // chain back at an older version, and the next write would be refused by
            // the store (412) although nothing went wrong; unknown, the next write asks
            // the store (a HEAD) or the client (a read).
            Answer::Applied(Some(version)) if believed => self.current = Some(version.clone()),
            // Applied at the version the chain holds already (a guess, below, that
            // this answer bears out).
            Answer::Applied(Some(version)) if self.current.as_ref() == Some(version) => {}
            Answer::Applied(Some(_)) => self.current = None,
            // Applied, but the store did not say at which version: unknown.
            Answer::Applied(None) => self.current = None,
            // The store is not at `on`: if the fence thought it was, it does not know,
            // unless one write lent on `on` is still open and its version is known
            // (a write given up on that the store applied after all, the usual
            // cause): the store is taken to be at that version. A guess, which the
            // store checks: a wrong one costs the next write a 412, never a late
            // write, and spares stores the fence may not read (SigV4) a refusal of
            // every write until a client reads the object through the fence.
            Answer::PreconditionFailed if believed => self.current = self.sole_successor(&lend.on),
            // The object is absent (`If-Match` on a missing object answers 404).
            Answer::Missing if believed => self.current = Some(Version::Absent),
            Answer::PreconditionFailed | Answer::Missing | Answer::NotApplied => {}
        }
    }

    /// The version the one open lend on `on` would make, when exactly one is open on
    /// it and that version is known.
    fn sole_successor(&self, on: &Version) -> Option<Version> {
        let mut on_it = self.lends.iter().filter(|l| l.on == *on);
        match (on_it.next(), on_it.next()) {
            (Some(only), None) => only.makes.clone(),
            _ => None,
        }
    }

    /// A read through the fence saw the store at `version`. Learned only while the
    /// version is unknown: a known one changes only by the fence's own writes.
    pub fn learn(&mut self, version: Version) -> bool {
        if self.current.is_some() {
            return false;
        }
        self.current = Some(version);
        true
    }

    /// End the lends whose term is over at `now_ms` (Unix time in milliseconds): the
    /// store can no longer apply them. Returns how many ended. The version is kept: a
    /// lend that did apply late made it wrong, and a wrong version costs the next
    /// write a 412 and a read, never a late write.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let before = self.lends.len();
        self.lends.retain(|l| l.until.is_none_or(|until| until > now_ms));
        before - self.lends.len()
    }

    /// End every lend (an operator's word that the store can no longer apply them),
    /// and forget the version, which they may have changed. Returns how many ended.
    pub fn release(&mut self) -> usize {
        let n = self.lends.len();
        if n > 0 {
            self.lends.clear();
            self.current = None;
        }
        n
    }
}

/// What the store's answer to a lent write says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Applied (2xx): the new version, if the answer named one.
    Applied(Option<Version>),
    /// 412: the store is not at the precondition's version.
    PreconditionFailed,
    /// 404 to a write with `If-Match`: the object does not exist.
    Missing,
    /// Any other answer: not applied, and nothing learned.
    NotApplied,
}

impl Answer {
    /// What a store's answer to a lent write says: its status, its `ETag` header if
    /// any, whether the write was a delete, and the version the write was conditioned
    /// on. With an applied write whose version cannot be learned, also why not (the
    /// caller reports it: the next write waits for a read).
    pub fn of(status: u16, etag: Option<&[u8]>, delete: bool, on: &Version) -> (Answer, Option<String>) {
        match status {
            200..=299 if delete => (Answer::Applied(Some(Version::Absent)), None),
            200..=299 => match etag.map(Version::tag) {
                Some(Ok(version)) => (Answer::Applied(Some(version)), None),
                Some(Err(e)) => (Answer::Applied(None), Some(e.to_string())),
                None => (Answer::Applied(None), Some("the answer has no ETag".to_owned())),
            },
            412 => (Answer::PreconditionFailed, None),
            404 if *on != Version::Absent => (Answer::Missing, None),
            _ => (Answer::NotApplied, None),
        }
    }
}

/// Why a write cannot be sent with a precondition (`None`: it can): a host refuses it
/// (501) before any mark is read. `method` and `target` (path and query) are the
/// request's, `header` looks one of its headers up by lower-case name, and `deletes`
/// says whether the store was seen honouring `If-Match` on a DELETE.
pub fn unconditional<'a>(
    method: &str,
    target: &[u8],
    header: impl Fn(&str) -> Option<&'a [u8]>,
    deletes: bool,
) -> Option<&'static str> {
    let query = target.iter().position(|&b| b == b'?').map(|at| &target[at + 1..]);
    let streaming = header("x-amz-content-sha256").is_some_and(|v| v.starts_with(b"STREAMING-"))
        || header("content-encoding").is_some_and(|v| v.windows(11).any(|w| w.eq_ignore_ascii_case(b"aws-chunked")));
    Some(if method != "PUT" && method != "DELETE" {
        "only PUT and DELETE can be made conditional"
    } else if method == "DELETE" && !deletes {
        "the store was not seen honouring If-Match on a DELETE (the precondition probe), so a late delete could land"
    } else if header("if-match").is_some() || header("if-none-match").is_some() {
        "the write carries If-Match or If-None-Match, and the fence sets the precondition itself"
    } else if header("x-amz-copy-source").is_some() {
        "an S3 copy's version cannot be told before it is made"
    } else if query.is_some_and(|q| q.split(|&b| b == b'&').any(|p| p.starts_with(b"uploadId"))) {
        "a part of an S3 multipart upload cannot be made conditional"
    } else if streaming {
        "the body is aws-chunked (streaming SigV4), so the version it makes cannot be told from it: send the \
         payload whole (its SHA-256 or UNSIGNED-PAYLOAD)"
    } else {
        return None;
    })
}

/// The version a PUT of `body` makes on a store whose ETags are the MD5 of the body
/// in hex, quoted (S3's single-part uploads), given the digest.
pub fn content_version(md5: &[u8; 16]) -> Version {
    let mut tag = String::with_capacity(34);
    tag.push('"');
    for b in md5 {
        tag.push_str(&format!("{b:02x}"));
    }
    tag.push('"');
    Version::Tag(tag)
}

/// Why a write cannot be lent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A higher token was lent on the resource: this write is stale.
    Stale(Token),
    /// The fence does not know the store's version.
    Unknown,
    /// Too many writes given up on still may apply.
    TooManyLent(usize),
    /// The write would bring the store back to a version a write may still carry.
    Repeats(Version),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Stale(t) => write!(f, "a write with the higher token {t} was already sent to the store"),
            Refusal::Unknown => f.write_str(
                "the store's version of this object is not known (a write was applied whose answer did not say it, \
                 or the object changed outside the fence): read the object through the fence (GET or HEAD) so it \
                 can learn the version, then retry (boto3: head_object; the aws CLI: aws s3api head-object)",
            ),
            Refusal::TooManyLent(n) => write!(
                f,
                "{n} writes given up on may still be applied by the store; each ends by itself once the store apply \
                 bound has passed since its upstream timeout (retry then), or, once you know the store can no longer \
                 apply them, release them with `fencekeeper marks --release-lends RESOURCE --force`"
            ),
            Refusal::Repeats(v) => write!(
                f,
                "the write would set the store's version to {v}, the version a write that may still be applied is \
                 conditioned on (the store's versions are content hashes, so writing the same bytes repeats one): \
                 write different bytes"
            ),
        }
    }
}

impl std::error::Error for Refusal {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<&'static [u8]> {
        None
    }

    #[test]
    fn a_write_settled_after_a_later_ones_settle_leaves_the_version_unknown_not_older() {
        // Both lent on A; the store applies the first (A again: the same bytes), then
        // the second (B). The second's settle comes first: the chain is at B. The
        // first's settle must not put it back at A, where the store no longer is.
        let a = Version::Tag("\"a\"".into());
        let b = Version::Tag("\"b\"".into());
        let mut chain = Chain::new();
        chain.current = Some(a.clone());
        let term = Term { now_ms: 0, lifetime_ms: None };
        let first = chain.lend(Token::parse("7").unwrap(), Some(&a), term).unwrap();
        let second = chain.lend(Token::parse("8").unwrap(), Some(&b), term).unwrap();
        chain.settle(second.id, &Answer::Applied(Some(b.clone())));
        assert_eq!(chain.current, Some(b.clone()));
        chain.settle(first.id, &Answer::Applied(Some(a.clone())));
        assert_eq!(chain.current, None, "the store's order of the two is not known: asked, not guessed");
        // In the store's order, each settle finds the chain where its write was lent.
        let mut chain = Chain::new();
        chain.current = Some(a.clone());
        let first = chain.lend(Token::parse("7").unwrap(), Some(&a), term).unwrap();
        let second = chain.lend(Token::parse("8").unwrap(), Some(&b), term).unwrap();
        chain.settle(first.id, &Answer::Applied(Some(a.clone())));
        chain.settle(second.id, &Answer::Applied(Some(b.clone())));
        assert_eq!(chain.current, Some(b));
    }

    #[test]
    fn only_whole_puts_and_probed_deletes_without_preconditions_of_their_own_are_conditional() {
        assert_eq!(unconditional("PUT", b"/b/k", none, false), None);
        assert_eq!(unconditional("DELETE", b"/b/k", none, true), None);
        assert!(unconditional("DELETE", b"/b/k", none, false).unwrap().contains("probe"));
        for method in ["POST", "COPY", "MOVE", "PATCH"] {
            assert!(unconditional(method, b"/b/k", none, true).is_some(), "{method}");
        }
        assert!(unconditional("PUT", b"/b/k?partNumber=1&uploadId=x", none, true).unwrap().contains("multipart"));
        assert_eq!(unconditional("PUT", b"/b/k?uploads-not=1", none, true), None);
        for (name, value, says) in [
            ("if-match", &b"\"a\""[..], "If-Match"),
            ("if-none-match", b"*", "If-Match"),
            ("x-amz-copy-source", b"/b/j", "copy"),
            ("x-amz-content-sha256", b"STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "aws-chunked"),
            ("content-encoding", b"gzip, AWS-CHUNKED", "aws-chunked"),
        ] {
            let header = |n: &str| (n == name).then_some(value);
            let why = unconditional("PUT", b"/b/k", header, true).unwrap_or_default();
            assert!(why.contains(says), "{name}: {why}");
        }
        let signed = |n: &str| (n == "x-amz-content-sha256").then_some(&b"UNSIGNED-PAYLOAD"[..]);
        assert_eq!(unconditional("PUT", b"/b/k", signed, true), None);
    }

    #[test]
    fn a_body_makes_its_quoted_md5_and_answers_read_as_the_store_means_them() {
        let empty = [0xd4, 0x1d, 0x8c, 0xd9, 0x8f, 0x00, 0xb2, 0x04, 0xe9, 0x80, 0x09, 0x98, 0xec, 0xf8, 0x42, 0x7e];
        assert_eq!(content_version(&empty), Version::Tag("\"d41d8cd98f00b204e9800998ecf8427e\"".into()));
        let on = Version::Tag("\"a\"".into());
        assert_eq!(
            Answer::of(200, Some(b"\"b\""), false, &on),
            (Answer::Applied(Some(Version::Tag("\"b\"".into()))), None)
        );
        assert_eq!(Answer::of(204, None, true, &on), (Answer::Applied(Some(Version::Absent)), None));
        assert!(
            matches!(Answer::of(201, None, false, &on), (Answer::Applied(None), Some(why)) if why.contains("no ETag"))
        );
        assert!(
            matches!(Answer::of(200, Some(b"W/\"b\""), false, &on), (Answer::Applied(None), Some(why)) if why.contains("weak"))
        );
        assert_eq!(Answer::of(412, None, false, &on).0, Answer::PreconditionFailed);
        assert_eq!(Answer::of(404, None, false, &on).0, Answer::Missing);
        assert_eq!(Answer::of(404, None, false, &Version::Absent).0, Answer::NotApplied);
        assert_eq!(Answer::of(503, None, false, &on).0, Answer::NotApplied);
    }
}
