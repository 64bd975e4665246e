//! The guard: the atomic read -> decide -> verify -> compare-and-swap loop.
//!
//! Check the request's bounds (key length, token length) before anything else, read
//! the mark, ask the decider, check its verdict against what the host knows
//! (`verify`), and when the verdict advances the mark, swap it in only if nobody
//! changed it meanwhile; on a lost race, decide again against the mark that won.
//! Admits that reuse the current mark touch the store only to read. Because every
//! advance is a compare-and-swap from the value the decision saw, the admits on one
//! resource are linearizable against a max-register.
//!
//! With a [`Provenance`] check, a token that would advance the mark is swapped in
//! only once the lock service vouched for it (once per admit, however many races it
//! loses); a token equal to the mark is never asked about, so a decision made on a
//! store's local copy is first checked against the store itself.

use crate::decider::{DecideError, Decider};
use crate::provenance::{Origin, Provenance, ProvenanceError};
use crate::store::{AwaitableMarks, MarkStore, Read, StoreError, Swap};
use crate::verify::{self, Breach};
use crate::{GuestText, Verdict};
use fencekeeper_core::refusal::{self, Action, Forgotten, NoVerdict, Reason, Unverified};
use fencekeeper_core::{Class, Token};
use std::sync::Arc;

/// How many lost compare-and-swap races one admit tolerates before it gives up as
/// undecided. Marks only rise, so each lost race means a higher token won; running
/// out takes a sustained stream of ever-higher tokens on one resource.
const MAX_ROUNDS: usize = 64;

/// Why a request was not decided on a verdict: it could not be (the store, the
/// decider, a breach, contention, a lock service that cannot be asked), or the lock
/// service did not vouch for the token it would have admitted.
#[derive(Debug, thiserror::Error)]
pub enum Undecided {
    /// The mark store failed. The one cause efficiency mode fails open on.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The decider failed (trap, fuel, memory, a malformed answer).
    #[error(transparent)]
    Decide(#[from] DecideError),
    /// The decider's verdict was proven wrong by the host.
    #[error(transparent)]
    Breach(#[from] Breach),
    /// Too many concurrent advances on one resource.
    #[error("gave up after {MAX_ROUNDS} lost compare-and-swap races on one resource")]
    Contention,
    /// The lock service did not vouch for the token that would advance the mark
    /// (why, naming the token): refused as unverified (403) in both modes.
    #[error("{0}")]
    Unverified(String),
    /// The lock service could not be asked about the token that would advance the
    /// mark: undecided (503) in both modes.
    #[error(transparent)]
    LockService(#[from] ProvenanceError),
}

impl Undecided {
    /// How the mode treats this failure.
    pub fn no_verdict(&self) -> NoVerdict {
        match self {
            Undecided::Store(_) => NoVerdict::StoreUnreachable,
            Undecided::Unverified(_) => NoVerdict::Unverified,
            _ => NoVerdict::Refused,
        }
    }
}

/// A mark the guard raised: from what to what. The compare-and-swap that raised it
/// compared `from`, so it is exact even when the decision was made on a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advance {
    /// The mark before (`None`: the resource had none).
    pub from: Option<Token>,
    /// The mark now: the admitted token.
    pub to: Token,
}

/// The outcome of one admit: the verdict (if one was reached) and what to do.
#[derive(Debug)]
pub struct Decision {
    /// The verdict, or `None` when the request could not be decided. After a
    /// breach this is the refusal the host proved on its own, if it could.
    pub verdict: Option<Verdict>,
    /// Forward or refuse, with the class to count and the header token.
    pub action: Action,
    /// Why the request could not be decided (or which contract was broken, or why its
    /// token is unverified).
    pub undecided: Option<Undecided>,
    /// The mark this admit raised, when it raised one: what an audit log records.
    pub advance: Option<Advance>,
    /// The retention floor the token was judged against, when the resource had no
    /// mark of its own under one ([`crate::store::Retention`]): a stale refusal's
    /// reason then names retention.
    pub retention_floor: Option<Token>,
}

impl Decision {
    /// True when the write may proceed.
    pub fn admitted(&self) -> bool {
        self.action.forward
    }

    /// The class of the outcome.
    pub fn class(&self) -> Class {
        self.action.class
    }

    /// The decider broke the contract on this request (to count and log).
    pub fn breach(&self) -> Option<&Breach> {
        match &self.undecided {
            Some(Undecided::Breach(b)) => Some(b),
            _ => None,
        }
    }

    /// The one-line reason, for a response body or a log line.
    pub fn reason(&self, resource: &str) -> String {
        let mut line = String::new();
        let _ = self.write_reason(&mut line, resource);
        line
    }

    /// [`Decision::reason`] written into `out`, for a host that has a buffer of its
    /// own (the C ABI writes it into the caller's outcome without allocating).
    pub fn write_reason(&self, out: &mut dyn std::fmt::Write, resource: &str) -> std::fmt::Result {
        let forgotten = self.retention_floor.map(|floor| Forgotten { floor });
        let cause: &dyn std::fmt::Display = match (&self.undecided, &forgotten) {
            (Some(Undecided::Unverified(why)), _) => return write!(out, "{}", Unverified { resource, cause: why }),
            (Some(e), _) => e,
            (None, Some(forgotten)) => forgotten,
            (None, None) => &"",
        };
        write!(out, "{}", Reason { verdict: self.verdict.as_ref(), resource, cause })
    }
}

/// What [`Guard::decide_and_swap`] reached: the verdict, the mark it raised, and the
/// retention floor it judged against, if the resource had no mark under one.
struct Decided {
    verdict: Verdict,
    advance: Option<Advance>,
    floor: Option<Token>,
}

impl Decided {
    fn of(verdict: Verdict) -> Decided {
        Decided { verdict, advance: None, floor: None }
    }
}

/// Fencing for one set of resources: a decider and a mark store, and optionally a
/// lock service that vouches for tokens before they advance a mark. It keeps no state
/// of its own (no counters, no locks): the admit path shares nothing between
/// callers but the mark. Callers count the [`Decision`]s they act on.
pub struct Guard {
    decider: Arc<dyn Decider>,
    store: Arc<dyn MarkStore + Send + Sync>,
    provenance: Option<Arc<dyn Provenance>>,
}

impl Guard {
    /// A guard deciding with `decider` against marks in `store`.
    pub fn new(decider: Arc<dyn Decider>, store: Arc<dyn MarkStore + Send + Sync>) -> Guard {
        Guard { decider, store, provenance: None }
    }

    /// The same guard, advancing a mark only to a token `provenance` vouches for
    /// (see [`crate::provenance`]): a forged token is refused as unverified instead
    /// of raising the mark past every honest holder.
    pub fn with_provenance(mut self, provenance: Arc<dyn Provenance>) -> Guard {
        self.provenance = Some(provenance);
        self
    }

    /// The provenance check, if the guard has one.
    pub fn provenance(&self) -> Option<&dyn Provenance> {
        self.provenance.as_deref()
    }

    /// Decide on a write to `resource` carrying `presented` (None: no token), and
    /// advance the mark in the guard's store when the token is admitted and higher.
    pub fn admit(&self, resource: &str, presented: Option<&str>) -> Decision {
        self.admit_in(&*self.store, resource, presented)
    }

    /// [`Guard::admit`] against another store, such as a view of your engine's open
    /// transaction, so that the mark commits or rolls back with the write itself.
    pub fn admit_in(&self, store: &dyn MarkStore, resource: &str, presented: Option<&str>) -> Decision {
        // Every call of `Blocking` is answered before it returns: one poll.
        let decided = crate::wait::block_on(self.decide_and_swap(Blocking(store), resource, presented));
        self.conclude(decided)
    }

    /// True when [`Guard::admit_async`] never blocks its thread: the store can be
    /// awaited ([`MarkStore::awaitable`]), and so can the provenance check if there is
    /// one ([`Provenance::awaitable`]: etcd's; ZooKeeper's client is synchronous).
    pub fn awaits(&self) -> bool {
        self.store.awaitable().is_some() && self.provenance.as_ref().is_none_or(|p| p.awaitable().is_some())
    }

    /// [`Guard::admit`] for a host on an asynchronous runtime: the same decision, with
    /// the store's calls and the provenance check awaited rather than blocked on, when
    /// they offer it ([`MarkStore::awaitable`], [`Provenance::awaitable`]; a tokio
    /// runtime with its timer must be running). One that does not is called on the
    /// calling thread and blocks it; [`Guard::awaits`] says whether any would. The decider runs on
    /// the calling thread (its fuel bounds it).
    pub async fn admit_async(&self, resource: &str, presented: Option<&str>) -> Decision {
        let decided = match self.store.awaitable() {
            Some(calls) => self.decide_and_swap(Awaiting { store: &*self.store, calls }, resource, presented).await,
            None => self.decide_and_swap(Blocking(&*self.store), resource, presented).await,
        };
        self.conclude(decided)
    }

    /// The decision the loop reached, with its action in the decider's mode.
    fn conclude(&self, decided: Result<Decided, Undecided>) -> Decision {
        let mode = self.decider.policy().mode;
        match decided {
            Ok(Decided { verdict, advance, floor }) => Decision {
                action: refusal::resolve(mode, Ok(&verdict)),
                // Only a refusal needs the floor named; an admit says what it did.
                retention_floor: floor.filter(|_| matches!(verdict, Verdict::Stale { .. })),
                verdict: Some(verdict),
                undecided: None,
                advance,
            },
            Err(Undecided::Breach(breach)) => {
                let verdict = breach.proven.clone();
                // Only refusals are ever proven, so a breach never forwards; the
                // guard says so rather than rely on it.
                let mut action = match &verdict {
                    Some(v) => refusal::resolve(mode, Ok(v)),
                    None => refusal::resolve::<GuestText>(mode, Err(NoVerdict::Refused)),
                };
                action.forward = false;
                Decision {
                    verdict,
                    action,
                    undecided: Some(Undecided::Breach(breach)),
                    advance: None,
                    retention_floor: None,
                }
            }
            Err(e) => Decision {
                action: refusal::resolve::<GuestText>(mode, Err(e.no_verdict())),
                verdict: None,
                undecided: Some(e),
                advance: None,
                retention_floor: None,
            },
        }
    }

    /// The resource's current mark in the guard's store.
    pub fn mark(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        self.store.get(resource)
    }

    /// The decider.
    pub fn decider(&self) -> &dyn Decider {
        &*self.decider
    }

    /// The mark store.
    pub fn store(&self) -> &(dyn MarkStore + Send + Sync) {
        &*self.store
    }

    async fn decide_and_swap<S: Calls>(
        &self,
        store: S,
        resource: &str,
        presented: Option<&str>,
    ) -> Result<Decided, Undecided> {
        // Bounded before anything is read or asked: an over-long token never
        // reaches the validator, so no request can exhaust its fuel.
        if let Err(m) = fencekeeper_core::precheck(resource, presented) {
            return Ok(Decided::of(Verdict::Malformed(GuestText::new(&m.to_string()))));
        }
        let policy = self.decider.policy();
        let read = store.read(resource).await?;
        let (mut mark, mut exact) = (read.mark, read.exact);
        // The token does not change between rounds: the lock service is asked once,
        // and its text read once.
        let mut vouched = self.provenance.is_none();
        let canonical = verify::reading(presented);
        for _ in 0..MAX_ROUNDS {
            // A resource without a mark is held to the retention floor, if any: the
            // decider judges the token against it as if it were the mark.
            let floor = if mark.is_none() { store.floor()? } else { None };
            let judged = mark.or(floor);
            let verdict = self.decider.decide(presented, judged.as_ref()).map_err(|e| match e {
                // An answer of the wrong shape is a broken contract like a wrong verdict.
                DecideError::Contract(what) => {
                    Undecided::Breach(verify::breach(&policy, presented, judged.as_ref(), what))
                }
                fault => Undecided::Decide(fault),
            })?;
            verify::check_read(&policy, presented, canonical, judged.as_ref(), &verdict)?;
            // Every answer rests on the store's own word (a read, a swap or a
            // confirm), never on a local copy alone: the admits stay linearizable.
            let swap = match verdict {
                Verdict::Admit { mark: new, advanced: true } => {
                    vouched =
                        vouched || self.provenance.as_ref().is_some_and(|p| p.issued_as_far_as_known(resource, &new));
                    if !vouched {
                        // A copy can lag the mark, and a token equal to the mark is
                        // not asked about: read the store's own mark first.
                        if !exact {
                            (mark, exact) = (store.get(resource).await?, true);
                            continue;
                        }
                        self.vouch(resource, &new, S::AWAITS).await?;
                        vouched = true;
                    }
                    match store.compare_and_swap(resource, mark.as_ref(), &new).await? {
                        Swap::Swapped => {
                            return Ok(Decided { verdict, advance: Some(Advance { from: mark, to: new }), floor })
                        }
                        lost => lost,
                    }
                }
                // The token equals the floor: it gives the resource its mark, with
                // the swap that checks the floor the store holds now (the one read
                // may lag it).
                Verdict::Admit { mark: same, advanced: false } if floor.is_some() => {
                    match store.compare_and_swap(resource, None, &same).await? {
                        Swap::Swapped => {
                            return Ok(Decided { verdict, advance: Some(Advance { from: None, to: same }), floor })
                        }
                        lost => lost,
                    }
                }
                Verdict::Admit { mark: same, advanced: false } if !exact || store.confirm_equal_admits() => {
                    store.confirm(resource, &same).await?
                }
                Verdict::Missing => return Ok(Decided::of(verdict)),
                _ if !exact => Swap::Conflict(store.get(resource).await?),
                _ => return Ok(Decided { verdict, advance: None, floor }),
            };
            match swap {
                Swap::Swapped => return Ok(Decided::of(verdict)),
                Swap::Conflict(current) => (mark, exact) = (current, true),
            }
        }
        Err(Undecided::Contention)
    }

    /// Ask the lock service about `token`; an error unless it vouches for it.
    /// Ask the provenance check about `token`, awaiting it when `awaiting` and it
    /// can be awaited.
    async fn vouch(&self, resource: &str, token: &Token, awaiting: bool) -> Result<(), Undecided> {
        let Some(provenance) = &self.provenance else {
            return Ok(());
        };
        let origin = match provenance.awaitable().filter(|_| awaiting) {
            Some(awaited) => awaited.check(resource, token).await?,
            None => provenance.check(resource, token)?,
        };
        match origin {
            Origin::Issued => Ok(()),
            Origin::Unverified(why) => Err(Undecided::Unverified(why)),
        }
    }
}

/// How the admit loop calls the store: [`Blocking`] answers each call before it
/// returns, [`Awaiting`] awaits the store's futures. One loop serves both, so the
/// synchronous and asynchronous admits cannot decide differently.
trait Calls {
    /// Whether the provenance check is awaited too.
    const AWAITS: bool;
    async fn read(&self, resource: &str) -> Result<Read, StoreError>;
    async fn get(&self, resource: &str) -> Result<Option<Token>, StoreError>;
    async fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token)
        -> Result<Swap, StoreError>;
    async fn confirm(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError>;
    fn floor(&self) -> Result<Option<Token>, StoreError>;
    fn confirm_equal_admits(&self) -> bool;
}

struct Blocking<'a, S: MarkStore + ?Sized>(&'a S);

impl<S: MarkStore + ?Sized> Calls for Blocking<'_, S> {
    const AWAITS: bool = false;
    async fn read(&self, resource: &str) -> Result<Read, StoreError> {
        self.0.read(resource)
    }
    async fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        self.0.get(resource)
    }
    async fn compare_and_swap(
        &self,
        resource: &str,
        expected: Option<&Token>,
        new: &Token,
    ) -> Result<Swap, StoreError> {
        self.0.compare_and_swap(resource, expected, new)
    }
    async fn confirm(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError> {
        self.0.confirm(resource, mark)
    }
    fn floor(&self) -> Result<Option<Token>, StoreError> {
        self.0.floor()
    }
    fn confirm_equal_admits(&self) -> bool {
        self.0.confirm_equal_admits()
    }
}

/// The store's awaitable calls; the floor and the store's nature are asked of the
/// store itself (neither waits).
struct Awaiting<'a> {
    store: &'a (dyn MarkStore + Send + Sync),
    calls: &'a dyn AwaitableMarks,
}

impl Calls for Awaiting<'_> {
    const AWAITS: bool = true;
    async fn read(&self, resource: &str) -> Result<Read, StoreError> {
        self.calls.read(resource).await
    }
    async fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        self.calls.get(resource).await
    }
    async fn compare_and_swap(
        &self,
        resource: &str,
        expected: Option<&Token>,
        new: &Token,
    ) -> Result<Swap, StoreError> {
        self.calls.compare_and_swap(resource, expected, new).await
    }
    async fn confirm(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError> {
        self.calls.confirm(resource, mark).await
    }
    fn floor(&self) -> Result<Option<Token>, StoreError> {
        self.store.floor()
    }
    fn confirm_equal_admits(&self) -> bool {
        self.store.confirm_equal_admits()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::Read;
    use crate::{MemoryStore, NativeDecider};
    use fencekeeper_core::{Mode, Policy};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    fn guard(mode: Mode) -> Guard {
        Guard::new(Arc::new(NativeDecider(Policy { mode, strict: false })), Arc::new(MemoryStore::new()))
    }

    /// A lock service that issued every token up to `issued`, or cannot be reached;
    /// it knows without asking about tokens up to `known`.
    struct Issued {
        issued: u64,
        down: bool,
        asked: AtomicUsize,
        known: u64,
    }

    impl Provenance for Issued {
        fn check(&self, _: &str, token: &Token) -> Result<Origin, ProvenanceError> {
            self.asked.fetch_add(1, Relaxed);
            if self.down {
                return Err(ProvenanceError::Unavailable("connection refused".into()));
            }
            Ok(match token.parts() {
                [t] if *t <= self.issued => Origin::Issued,
                _ => Origin::Unverified(format!("token {token} was never issued")),
            })
        }
        fn issued_as_far_as_known(&self, _: &str, token: &Token) -> bool {
            matches!(token.parts(), [t] if *t <= self.known)
        }
        fn describe(&self) -> String {
            "test".into()
        }
    }

    fn vouched(mode: Mode, issued: u64, down: bool) -> (Guard, Arc<Issued>) {
        let lock = Arc::new(Issued { issued, down, asked: AtomicUsize::new(0), known: 0 });
        (guard(mode).with_provenance(lock.clone()), lock)
    }

    #[test]
    fn a_forged_token_is_refused_as_unverified_in_both_modes_and_the_mark_stays() {
        for mode in [Mode::Correctness, Mode::Efficiency] {
            let (g, _) = vouched(mode, 100, false);
            let first = g.admit("f", Some("34"));
            assert_eq!(first.advance, Some(Advance { from: None, to: Token::parse("34").unwrap() }));
            let d = g.admit("f", Some("18446744073709551615"));
            assert!(!d.admitted() && !d.action.failed_open(), "{mode:?}");
            assert_eq!((d.class(), d.class().http_status(), d.advance), (Class::Unverified, 403, None));
            assert!(
                d.reason("f").starts_with("unverified fencing token for \"f\": token 18446744073709551615"),
                "{}",
                d.reason("f")
            );
            assert_eq!(g.mark("f").unwrap(), Token::parse("34").ok());
            assert!(g.admit("f", Some("35")).admitted(), "the honest holder is not locked out");
        }
    }

    #[test]
    fn only_a_token_that_advances_the_mark_is_asked_about_and_once() {
        let (g, lock) = vouched(Mode::Correctness, 100, false);
        assert!(g.admit("f", Some("50")).admitted());
        assert_eq!(lock.asked.load(Relaxed), 1);
        let again = g.admit("f", Some("50"));
        assert!(again.admitted() && again.advance.is_none());
        assert_eq!(g.admit("f", Some("49")).class(), Class::Stale);
        assert_eq!(lock.asked.load(Relaxed), 1, "equal and stale tokens are not asked about");
    }

    #[test]
    fn an_unreachable_lock_service_leaves_an_advance_undecided_in_both_modes() {
        for mode in [Mode::Correctness, Mode::Efficiency] {
            let lock = Arc::new(Issued { issued: 100, down: true, asked: AtomicUsize::new(0), known: 0 });
            let store = Arc::new(MemoryStore::new());
            store.compare_and_swap("f", None, &Token::parse("5").unwrap()).unwrap();
            let g = Guard::new(Arc::new(NativeDecider(Policy { mode, strict: false })), store).with_provenance(lock);
            let d = g.admit("f", Some("6"));
            assert!(!d.admitted() && d.class() == Class::Undecided, "{mode:?}: {}", d.reason("f"));
            assert!(d.reason("f").contains("the lock service cannot check the token"), "{}", d.reason("f"));
            assert!(g.admit("f", Some("5")).admitted(), "{mode:?}: the current holder needs no check");
        }
    }

    /// A store whose local copy of every mark lags one behind: what another gateway's
    /// advance leaves in an etcd store's copy. Counts the reads of the store itself.
    struct Lagging(MemoryStore, AtomicUsize);

    impl MarkStore for Lagging {
        fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
            self.1.fetch_add(1, Relaxed);
            self.0.get(resource)
        }
        fn compare_and_swap(&self, r: &str, e: Option<&Token>, n: &Token) -> Result<Swap, StoreError> {
            self.0.compare_and_swap(r, e, n)
        }
        fn read(&self, resource: &str) -> Result<Read, StoreError> {
            let lower = self.0.get(resource)?.and_then(|m| Token::from_parts(&[m.parts()[0].saturating_sub(1)]).ok());
            Ok(Read { mark: lower, exact: false })
        }
    }

    #[test]
    fn a_token_equal_to_the_stores_mark_is_not_asked_about_even_when_the_copy_lags() {
        let lock = Arc::new(Issued { issued: 0, down: false, asked: AtomicUsize::new(0), known: 0 });
        let store = Arc::new(Lagging(MemoryStore::new(), AtomicUsize::new(0)));
        store.0.compare_and_swap("f", None, &Token::parse("7").unwrap()).unwrap();
        let g = Guard::new(Arc::new(NativeDecider(Policy::default())), store).with_provenance(lock.clone());
        let d = g.admit("f", Some("7"));
        assert!(d.admitted() && d.advance.is_none(), "{}", d.reason("f"));
        assert_eq!(lock.asked.load(Relaxed), 0);
        assert_eq!(g.admit("f", Some("8")).class(), Class::Unverified);
        assert_eq!(lock.asked.load(Relaxed), 1);
    }

    #[test]
    fn a_token_the_check_knows_to_be_issued_costs_neither_a_check_nor_a_read() {
        let lock = Arc::new(Issued { issued: 100, down: false, asked: AtomicUsize::new(0), known: 50 });
        let store = Arc::new(Lagging(MemoryStore::new(), AtomicUsize::new(0)));
        store.0.compare_and_swap("f", None, &Token::parse("7").unwrap()).unwrap();
        let g = Guard::new(Arc::new(NativeDecider(Policy::default())), store.clone()).with_provenance(lock.clone());
        let reads = store.1.load(Relaxed);
        assert!(g.admit("f", Some("40")).advance.is_some());
        assert_eq!((lock.asked.load(Relaxed), store.1.load(Relaxed) - reads), (0, 0));
        assert!(g.admit("f", Some("60")).advance.is_some(), "above what it knows: asked");
        assert_eq!(lock.asked.load(Relaxed), 1);
    }

    /// A store inside the writer's transaction: reads are its own (exact), yet an
    /// equal admit must end with a confirm (the lock that holds the mark until the
    /// write commits). `overtaken` is what a confirm finds: another writer's advance.
    struct Holding {
        marks: MemoryStore,
        confirms: AtomicUsize,
        overtaken: Option<Token>,
    }

    impl MarkStore for Holding {
        fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
            self.marks.get(resource)
        }
        fn compare_and_swap(&self, r: &str, e: Option<&Token>, n: &Token) -> Result<Swap, StoreError> {
            self.marks.compare_and_swap(r, e, n)
        }
        fn confirm(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError> {
            self.confirms.fetch_add(1, Relaxed);
            if let Some(higher) = self.overtaken {
                self.marks.compare_and_swap(resource, Some(mark), &higher)?;
            }
            self.marks.confirm(resource, mark)
        }
        fn confirm_equal_admits(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_store_that_asks_for_it_confirms_every_equal_admit_and_a_lost_confirm_decides_again() {
        let seven = Token::parse("7").unwrap();
        for (overtaken, class) in [(None, Class::Admitted), (Token::parse("8").ok(), Class::Stale)] {
            let store = Arc::new(Holding { marks: MemoryStore::new(), confirms: AtomicUsize::new(0), overtaken });
            store.marks.compare_and_swap("f", None, &seven).unwrap();
            let g = Guard::new(Arc::new(NativeDecider(Policy::default())), store.clone());
            let d = g.admit("f", Some("7"));
            assert_eq!((d.class(), store.confirms.load(Relaxed)), (class, 1), "{}", d.reason("f"));
        }
    }

    #[test]
    fn stale_token_is_refused_after_a_newer_admit() {
        let g = guard(Mode::Correctness);
        assert!(g.admit("f", Some("33")).admitted());
        assert!(g.admit("f", Some("34")).admitted());
        let d = g.admit("f", Some("33"));
        assert_eq!(d.class(), Class::Stale);
        assert_eq!(d.action.token.map(|t| t.to_string()), Some("34".into()));
        assert!(d.reason("f").contains("stale fencing token 33"), "{}", d.reason("f"));
        assert_eq!(g.mark("f").unwrap().map(|t| t.to_string()), Some("34".into()));
    }

    #[test]
    fn missing_token_is_refused_in_both_modes() {
        for mode in [Mode::Correctness, Mode::Efficiency] {
            let g = guard(mode);
            let d = g.admit("f", None);
            assert!(!d.admitted() && d.class() == Class::Missing, "{mode:?}");
            assert!(!d.action.failed_open());
        }
    }

    #[test]
    fn over_long_tokens_and_keys_are_malformed_before_the_decider_is_asked() {
        struct Unreachable;
        impl Decider for Unreachable {
            fn policy(&self) -> Policy {
                Policy { mode: Mode::Efficiency, strict: false }
            }
            fn decide(&self, _: Option<&str>, _: Option<&Token>) -> Result<Verdict, DecideError> {
                Err(DecideError::GuestFault("asked".into()))
            }
        }
        let g = Guard::new(Arc::new(Unreachable), Arc::new(MemoryStore::new()));
        let long = format!("{}33", "0".repeat(fencekeeper_core::token::MAX_TOKEN_BYTES));
        for (resource, token) in [("f", long.as_str()), ("", "33")] {
            let d = g.admit(resource, Some(token));
            assert_eq!(d.class(), Class::Malformed);
            assert!(!d.admitted());
        }
    }
}
