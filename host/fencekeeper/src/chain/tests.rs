// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use super::*;
use crate::store::StoreError;
use fencekeeper_core::Token;
use proptest::prelude::*;

fn t(n: u64) -> Token {
    Token::parse(&n.to_string()).unwrap_or_else(|_| unreachable!())
}

fn tag(s: &str) -> Version {
    Version::Tag(format!("\"{s}\""))
}

/// Lends that end only by hand.
const U: Term = Term::UNBOUNDED;

/// Lent at `now_ms`, ending 100 ms later.
fn at(now_ms: u64) -> Term {
    Term { now_ms, lifetime_ms: Some(100) }
}

#[test]
fn a_write_is_lent_on_the_current_version_and_its_answer_moves_it() {
    let mut chain = Chain::new();
    let lend = chain.lend(t(34), Some(&tag("a")), U).unwrap();
    assert_eq!(lend.on, Version::Absent, "a new object's first write goes with If-None-Match: *");
    chain.settle(lend.id, &Answer::Applied(Some(tag("a"))));
    assert_eq!((chain.current.clone(), chain.lends.len()), (Some(tag("a")), 0));
    let lend = chain.lend(t(34), Some(&tag("b")), U).unwrap();
    assert_eq!(lend.on, tag("a"));
}

#[test]
fn a_lower_token_than_one_lent_is_stale() {
    let mut chain = Chain::new();
    chain.lend(t(34), None, U).unwrap();
    assert_eq!(chain.lend(t(33), None, U), Err(Refusal::Stale(t(34))));
    assert!(chain.lend(t(34), None, U).is_ok(), "the same holder writes again");
}

#[test]
fn a_write_that_would_repeat_a_version_a_late_write_carries_is_refused() {
    // a, then 33's write on a is given up on; b lands; a again would let 33's land.
    let mut chain = Chain::new();
    let first = chain.lend(t(33), Some(&tag("a")), U).unwrap();
    chain.settle(first.id, &Answer::Applied(Some(tag("a"))));
    let _given_up = chain.lend(t(33), Some(&tag("x")), U).unwrap();
    let b = chain.lend(t(34), Some(&tag("b")), U).unwrap();
    chain.settle(b.id, &Answer::Applied(Some(tag("b"))));
    assert_eq!(chain.lend(t(34), Some(&tag("a")), U), Err(Refusal::Repeats(tag("a"))));
    assert!(chain.lend(t(34), Some(&tag("b")), U).is_ok(), "the same bytes again, with nothing else lent on b");
    assert!(chain.lend(t(34), Some(&tag("b")), U).is_ok(), "and again: only 34 is lent on b, its own token");
    assert_eq!(chain.lend(t(35), Some(&tag("b")), U), Err(Refusal::Repeats(tag("b"))), "34's may land after 35's");
    assert!(chain.lend(t(35), Some(&tag("c")), U).is_ok());
}

#[test]
fn a_412_on_the_believed_version_makes_it_unknown_until_a_read_tells_it() {
    let mut chain = Chain::new();
    let lend = chain.lend(t(34), None, U).unwrap();
    chain.settle(lend.id, &Answer::PreconditionFailed);
    assert_eq!(chain.lend(t(34), None, U), Err(Refusal::Unknown));
    assert!(chain.learn(tag("z")));
    assert!(!chain.learn(tag("y")), "a known version is not overwritten by a read");
    assert_eq!(chain.lend(t(34), None, U).map(|l| l.on), Ok(tag("z")));
}

#[test]
fn lends_with_no_term_are_bounded_and_released_only_by_hand() {
    let mut chain = Chain::new();
    for _ in 0..MAX_LENDS {
        chain.lend(t(1), None, U).unwrap();
    }
    assert_eq!(chain.lend(t(1), None, U), Err(Refusal::TooManyLent(MAX_LENDS)));
    assert_eq!(chain.release(), MAX_LENDS);
    assert_eq!(chain.lend(t(1), None, U), Err(Refusal::Unknown), "released lends may have changed the version");
}

#[test]
fn a_lend_given_up_on_ends_by_itself_once_its_term_is_over() {
    let mut chain = Chain::new();
    for n in 0..MAX_LENDS as u64 {
        chain.lend(t(33), None, at(n)).unwrap();
    }
    assert_eq!(chain.lends.iter().filter_map(|l| l.until).min(), Some(100));
    assert_eq!(chain.lend(t(34), None, at(99)), Err(Refusal::TooManyLent(MAX_LENDS)), "none is over at 99");
    let lend = chain.lend(t(34), None, at(100)).unwrap();
    assert_eq!(chain.lends.len(), MAX_LENDS, "the first ended at 100, and 34's took its place");
    assert_eq!((lend.on, lend.until), (Version::Absent, Some(200)), "the version is kept");
    assert_eq!(chain.expire(10_000), MAX_LENDS);
    // A lend with no term is never over.
    chain.lend(t(34), None, U).unwrap();
    assert_eq!((chain.expire(u64::MAX), chain.lends.len(), chain.lends[0].until), (0, 1, None));
}

#[test]
fn within_its_term_a_lend_still_bars_a_repeat_and_after_it_does_not() {
    // 33's write on a is given up on at 0; b lands; a again would let 33's land, until
    // its term is over.
    let mut chain = Chain::new();
    let first = chain.lend(t(32), Some(&tag("a")), U).unwrap();
    chain.settle(first.id, &Answer::Applied(Some(tag("a"))));
    chain.lend(t(33), Some(&tag("x")), at(0)).unwrap();
    let b = chain.lend(t(34), Some(&tag("b")), at(1)).unwrap();
    chain.settle(b.id, &Answer::Applied(Some(tag("b"))));
    assert_eq!(chain.lend(t(34), Some(&tag("a")), at(99)), Err(Refusal::Repeats(tag("a"))));
    assert!(chain.lend(t(34), Some(&tag("a")), at(100)).is_ok());
}

#[test]
fn records_round_trip_and_damage_is_caught() {
    let mut chain = Chain::new();
    let lend = chain.lend(t(7), Some(&tag("a")), U).unwrap();
    chain.settle(lend.id, &Answer::Applied(Some(tag("a"))));
    chain.lend(t(8), None, U).unwrap();
    chain.lend(t(8), None, at(1_700_000_000_000)).unwrap();
    let value = encode("orders/q3.csv", &chain);
    assert!(value.starts_with("fkc3 8 ") && value.contains(" 1700000000100 ?"), "{value}");
    assert_eq!(decode("orders/q3.csv", value.as_bytes()), Ok(chain.clone()));
    assert_eq!(decode("orders/q4.csv", value.as_bytes()), Err(ChainRecordError::Mismatch));
    for i in 0..value.len() {
        let mut damaged = value.clone().into_bytes();
        damaged[i] ^= 0x04;
        assert!(decode("orders/q3.csv", &damaged).is_err(), "flipped bit in byte {i} of {value:?} passed");
    }
    assert_eq!(decode("r", b"fk2 34 fc4dab37"), Err(ChainRecordError::NotARecord));
    // A record written before lends had terms is read, its lends with none.
    let body = "fkc1 8 226122 2 1 1 8 - ";
    let old = format!("{body}{:08x}", fencekeeper_core::record::checksum(b"r", body.as_bytes()));
    let chain = decode("r", old.as_bytes()).unwrap();
    assert_eq!((chain.lends.len(), chain.lends[0].until, chain.current.clone()), (1, None, Some(tag("a"))));
    assert!(encode("r", &chain).starts_with("fkc3 "), "and written back in the new format");
    // One written before lends kept the version they make: read, each making none told.
    let body = "fkc2 8 226122 2 1 1 8 226122 1700000000100 ";
    let old = format!("{body}{:08x}", fencekeeper_core::record::checksum(b"r", body.as_bytes()));
    let chain = decode("r", old.as_bytes()).unwrap();
    assert_eq!((chain.lends[0].until, chain.lends[0].makes.clone()), (Some(1_700_000_000_100), None));
    assert!(encode("r", &chain).starts_with("fkc3 "), "and written back in the new format");
    // The version a lend makes goes into the record and comes back.
    let mut chain = Chain::new();
    chain.lend(t(9), Some(&tag("b")), U).unwrap();
    chain.lend(t(9), Some(&Version::Absent), U).unwrap();
    let value = encode("r", &chain);
    assert!(value.contains(&format!(" {} ", hex(&tag("b")))) && value.contains(" - - - "), "{value}");
    assert_eq!(decode("r", value.as_bytes()), Ok(chain));
    assert_eq!(decode("r", b""), Err(ChainRecordError::NotARecord));
}

/// A version as the record writes it: its bytes in lowercase hex.
fn hex(v: &Version) -> String {
    match v {
        Version::Absent => "-".to_owned(),
        Version::Tag(t) => t.bytes().map(|b| format!("{b:02x}")).collect(),
    }
}

/// A chain whose first write, token 1, applied at version "a".
fn at_a() -> Chain {
    let mut chain = Chain::new();
    let a = chain.lend(t(1), Some(&tag("a")), U).unwrap();
    chain.settle(a.id, &Answer::Applied(Some(tag("a"))));
    chain
}

#[test]
fn a_412_with_one_write_still_lent_on_the_refused_version_takes_the_version_that_write_makes() {
    // A write given up on (its client went away) that the store applied anyway: the
    // next write, lent on the version before it, gets the store's 412. The one write
    // still lent on that version makes "b", so the store is taken to be at "b" and
    // the write after goes on it, with no read through the fence.
    let mut chain = at_a();
    let _given_up = chain.lend(t(1), Some(&tag("b")), U).unwrap();
    let next = chain.lend(t(1), Some(&tag("c")), U).unwrap();
    assert_eq!(next.on, tag("a"));
    chain.settle(next.id, &Answer::PreconditionFailed);
    assert_eq!(chain.current, Some(tag("b")), "the given-up write's version");
    let after = chain.lend(t(1), Some(&tag("c")), U).unwrap();
    assert_eq!(after.on, tag("b"));
    // The store bears the guess out: it stays.
    chain.settle(after.id, &Answer::Applied(Some(tag("c"))));
    assert_eq!(chain.current, Some(tag("c")));

    // Two writes still lent on the refused version, or one whose version was not
    // told (a store that is not content-addressed): nothing to go on, unknown.
    for makes in [[Some(tag("b")), Some(tag("d"))], [None, None]] {
        let mut chain = at_a();
        chain.lend(t(1), makes[0].as_ref(), U).unwrap();
        if makes[1].is_some() {
            chain.lend(t(1), makes[1].as_ref(), U).unwrap();
        }
        let next = chain.lend(t(1), Some(&tag("c")), U).unwrap();
        chain.settle(next.id, &Answer::PreconditionFailed);
        assert_eq!(chain.current, None, "{makes:?}");
    }

    // A wrong guess costs one 412 more, then the version is unknown: no write goes
    // on a version the store is not at.
    let mut chain = at_a();
    chain.lend(t(1), Some(&tag("b")), U).unwrap();
    let next = chain.lend(t(1), Some(&tag("c")), U).unwrap();
    chain.settle(next.id, &Answer::PreconditionFailed);
    let wrong = chain.lend(t(1), Some(&tag("c")), U).unwrap();
    chain.settle(wrong.id, &Answer::PreconditionFailed);
    assert_eq!(chain.current, None);
}

#[test]
fn weak_long_or_binary_etags_are_not_versions() {
    assert_eq!(Version::tag(b"W/\"a\""), Err(VersionError::Weak));
    assert_eq!(Version::tag(b""), Err(VersionError::Length(0)));
    assert_eq!(Version::tag(&[b'a'; MAX_VERSION + 1]), Err(VersionError::Length(MAX_VERSION + 1)));
    assert_eq!(Version::tag(b"\"a b\""), Err(VersionError::NotText));
    assert_eq!(Version::tag(b"\"5d41\""), Ok(tag("5d41")));
}

#[test]
fn update_retries_lost_races_and_refuses_a_damaged_record() {
    let store = MemoryChains::default();
    let lend = update(&store, "r", |c| c.lend(t(3), None, U)).unwrap().unwrap();
    assert_eq!(lend.id, 0);
    assert_eq!(read(&store, "r").unwrap().lends.len(), 1);
    store.swap("r", store.get("r").unwrap().as_deref(), b"fkc1 garbage").unwrap();
    assert!(matches!(update(&store, "r", |c| c.lend(t(3), None, U)), Err(ChainError::Damaged { .. })));
}

// The model: a content-addressed store (the version is the body), a fence whose
// chains live in a store that survives crashes, and a network that delivers writes
// late, out of order, or never, and loses answers. Whatever happens, the tokens of
// the writes the store applies never go down. Time passes too: a lend's term is 100
// ms, and the store applies no write later than that after it was sent (the store
// apply bound the terms assume); a lend made with no term never ends by itself.

#[derive(Clone, Debug)]
enum Op {
    /// A holder with this token writes body (0..3) or deletes (None).
    Write(u64, Option<u8>),
    /// The network delivers the i-th write in flight; the fence sees the answer (or not).
    Deliver(usize, bool),
    /// The network drops the i-th write in flight: it never arrives.
    Drop(usize),
    /// A read through the fence.
    Read,
    /// The fence crashes: every answer in flight is lost.
    Crash,
    /// An operator releases the lends (only done when none is still in the network).
    Release,
    /// Time passes (ms).
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..6, proptest::option::weighted(0.8, 0u8..3)).prop_map(|(t, b)| Op::Write(t, b)),
        4 => (0usize..8, proptest::bool::weighted(0.7)).prop_map(|(i, seen)| Op::Deliver(i, seen)),
        1 => (0usize..8).prop_map(Op::Drop),
        1 => Just(Op::Read),
        1 => Just(Op::Crash),
        1 => Just(Op::Release),
        3 => (0u64..40).prop_map(Op::Tick),
    ]
}

struct Message {
    id: u64,
    token: Token,
    on: Version,
    body: Option<u8>,
    answer_seen: bool,
    /// When the store stops applying it (`None`: never).
    until: Option<u64>,
}

fn body_version(body: Option<u8>) -> Version {
    body.map_or(Version::Absent, |b| tag(&b.to_string()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]
    #[test]
    fn no_write_applies_after_a_higher_token_one(
        ops in proptest::collection::vec(op(), 1..60),
        terms in proptest::bool::ANY,
    ) {
        let chains = MemoryChains::default();
        let mut now = 0u64;
        let mut object = Version::Absent;
        let mut applied: Vec<Token> = Vec::new();
        let mut network: Vec<Message> = Vec::new();
        for op in ops {
            match op {
                Op::Write(token, body) => {
                    let makes = body_version(body);
                    let term = if terms { at(now) } else { U };
                    let lent = update(&chains, "r", |c| c.lend(t(token), Some(&makes), term))
                        .map_err(|e: ChainError| TestCaseError::fail(e.to_string()))?;
                    if let Ok(lend) = lent {
                        let m = Message { id: lend.id, token: t(token), on: lend.on, body, answer_seen: true, until: lend.until };
                        network.push(m);
                    }
                }
                Op::Deliver(i, seen) if i < network.len() => {
                    let m = network.remove(i);
                    let answer = if m.until.is_some_and(|until| now >= until) {
                        // Past the bound: the store refuses it (its own timeout).
                        Answer::NotApplied
                    } else if object == m.on {
                        if let Some(last) = applied.last() {
                            prop_assert!(m.token >= *last, "token {} applied after {}", m.token, last);
                        }
                        applied.push(m.token);
                        object = body_version(m.body);
                        Answer::Applied(Some(object.clone()))
                    } else if object == Version::Absent && m.on != Version::Absent {
                        Answer::Missing
                    } else {
                        Answer::PreconditionFailed
                    };
                    if seen && m.answer_seen {
                        update(&chains, "r", |c| { c.settle(m.id, &answer); Ok::<_, ()>(()) })
                            .map_err(|e| TestCaseError::fail(e.to_string()))?.ok();
                    }
                }
                Op::Drop(i) if i < network.len() => { network.remove(i); }
                Op::Read => {
                    let seen = object.clone();
                    update(&chains, "r", |c| { c.learn(seen.clone()); Ok::<_, ()>(()) })
                        .map_err(|e| TestCaseError::fail(e.to_string()))?.ok();
                }
                Op::Crash => network.iter_mut().for_each(|m| m.answer_seen = false),
                Op::Release if network.is_empty() => {
                    update(&chains, "r", |c| { c.release(); Ok::<_, ()>(()) })
                        .map_err(|e| TestCaseError::fail(e.to_string()))?.ok();
                }
                Op::Tick(ms) => now += ms,
                _ => {}
            }
        }
    }
}

#[test]
fn a_failing_store_is_an_error_not_an_empty_chain() {
    struct Down;
    impl ChainStore for Down {
        fn get(&self, _: &str) -> Result<Option<Vec<u8>>, StoreError> {
            Err(StoreError::Unavailable("down".into()))
        }
        fn swap(&self, _: &str, _: Option<&[u8]>, _: &[u8]) -> Result<bool, StoreError> {
            Err(StoreError::Unavailable("down".into()))
        }
        fn describe(&self) -> String {
            "down".into()
        }
    }
    assert!(matches!(update(&Down, "r", |c| c.lend(t(1), None, U)), Err(ChainError::Store(_))));
}

/// A chain store that counts its reads and swaps.
#[derive(Default)]
struct Counting {
    inner: MemoryChains,
    gets: std::sync::atomic::AtomicUsize,
    swaps: std::sync::atomic::AtomicUsize,
}

impl ChainStore for Counting {
    fn get(&self, resource: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.get(resource)
    }
    fn swap(&self, resource: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool, StoreError> {
        self.swaps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.swap(resource, expected, new)
    }
    fn describe(&self) -> String {
        "counting".into()
    }
}

impl Counting {
    fn calls(&self) -> (usize, usize) {
        (
            self.gets.swap(0, std::sync::atomic::Ordering::Relaxed),
            self.swaps.swap(0, std::sync::atomic::Ordering::Relaxed),
        )
    }
}

#[test]
fn from_the_record_last_seen_a_change_skips_its_read_and_an_outdated_one_costs_one() {
    let store = Counting::default();
    let (lent, known) = update_from(&store, "r", None, |c| c.lend(t(3), None, U)).unwrap();
    let id = lent.unwrap().id;
    assert_eq!(store.calls(), (1, 1), "nothing known: read, then swap");
    let (_, known) = update_from(&store, "r", Some(known), |c| {
        c.settle(id, &Answer::Applied(Some(tag("a"))));
        Ok::<_, ()>(())
    })
    .unwrap();
    assert_eq!(store.calls(), (0, 1), "from the record it put: the swap alone");
    // Another writer changes the chain: the record known is outdated; the swap fails,
    // and the change is made again on the record as it is.
    update(&store.inner, "r", |c| c.lend(t(4), None, U)).unwrap().unwrap();
    let (lent, now) = update_from(&store, "r", Some(known.clone()), |c| c.lend(t(5), None, U)).unwrap();
    assert_eq!(lent.unwrap().on, tag("a"));
    assert_eq!(store.calls(), (1, 2));
    assert_eq!(now.as_deref(), store.inner.get("r").unwrap().as_deref(), "it returns the record the store holds");
    // A refusal on an outdated record is decided again on a fresh one: stale below 3
    // there, below 5 here.
    let (refused, _) = update_from(&store, "r", Some(known), |c| c.lend(t(2), None, U)).unwrap();
    assert_eq!(refused, Err(Refusal::Stale(t(5))));
    assert_eq!(store.calls(), (1, 0), "refused on the record read, nothing written");
}
