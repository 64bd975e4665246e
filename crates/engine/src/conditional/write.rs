//! One conditional write's course, as a machine both hosts drive: lend it on its
//! resource's chain before the store can apply it, ask the store for a version the
//! chain does not know, send it with its precondition, settle the store's answer,
//! and conclude what the client is told, counted once.
//!
//! The machine makes no call. Each event a host feeds it returns the one thing to do
//! next ([`Command`]); the host does it (a chain change in its own chain store, a
//! `HEAD` through its own client, a header set, a body released) and feeds back what
//! came of it. The gateway drives it in one task, awaiting each command; the Envoy
//! filter from its callbacks. What differs between the two is only how a body
//! arrives: the gateway has a write's body whole before it starts it
//! ([`Body::Whole`]); the filter lets a head go before its body ([`Body::ToCome`]), so
//! it first peeks at what the write would be lent on, holds the body until it is
//! whole, and lends it then ([`Write::body_whole`]), checking that the version has
//! not moved meanwhile.
//!
//! ```text
//!   start ──Whole──▶ Chain(Lend) ──Lent──▶ Send(precondition) ──▶ answered ──▶ Chain(Settle) ──▶ Conclude
//!     │                   ▲    └──Unknown──▶ AskStore ──▶ Chain(Learn) ──┐
//!     └──ToCome──▶ Chain(Peek) ──Lent──▶ Send ──▶ body_whole ──▶ Chain(Lend{on}) ──Lent──▶ ReleaseBody
//! ```

use super::{learned, lend_refused, moved, unavailable, Refused, Stored};
use crate::answer::Form;
use fencekeeper_chain::{Answer, Chain, Change, Done, Lend, Refusal, Term, Version};
use fencekeeper_core::Token;

/// What the host does next for the write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Make this change of the resource's chain (atomically: read, apply
    /// [`Change::apply`], swap if it changed), then tell [`Write::chain_done`], or
    /// [`Write::chain_failed`] when the chain could not be read or changed.
    Chain(Change),
    /// Ask the store for the resource's version: a `HEAD` of the write's target, with
    /// its Host and no credentials, then tell [`Write::store_told`] its status and
    /// ETag (status 0: no answer).
    AskStore,
    /// Put this precondition header (name, value) on the write and let its head go,
    /// the write admitted. A body still to come stays held until [`Command::ReleaseBody`].
    Send(&'static str, String),
    /// The held body may go: the write is lent on the precondition its head carries.
    ReleaseBody,
    /// The write's outcome is known: count it ([`Refused::class`] and
    /// [`Refused::event`], or `admitted` for `None`) and, for `Some`, answer the client
    /// with it instead of the store. Given once per write.
    Conclude(Option<Refused>),
    /// Nothing until the next event.
    Idle,
}

/// A write's body as it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Whole: the version the write makes when the store applies it (a delete's is
    /// absent; a PUT's, its body's content version).
    Whole(Version),
    /// Still to come: its head goes first, the body is held until
    /// [`Write::body_whole`].
    ToCome,
}

/// What the host was answered for the write it sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery<'a> {
    /// The store answered with this status and ETag.
    Answered(u16, Option<&'a [u8]>),
    /// Nothing was sent (no connection): the store will never apply it.
    NotSent,
    /// Given up on after it may have been sent: the store may still apply it until
    /// its lend's term is over. A host that still gets the store's answer later tells
    /// it with [`Write::delivered`] again.
    GivenUp,
}

/// Something the host logs for the write: `error`, else a warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// An error (else a warning).
    pub error: bool,
    /// What happened, on one line.
    pub line: String,
}

/// One conditional write of `resource` with `token`.
#[derive(Debug)]
pub struct Write {
    resource: String,
    token: Token,
    delete: bool,
    form: Form,
    /// How long after it is lent the store may still apply the write (`None`: no
    /// bound declared).
    lifetime_ms: Option<u64>,
    /// The host can ask the store for a version ([`Command::AskStore`]).
    can_ask: bool,
    /// The store was asked (once per write).
    asked: bool,
    /// The change to make again once the version the store told is learned.
    retry: Option<Change>,
    /// The chain change in flight.
    in_flight: Option<Change>,
    /// The precondition its head carries, once it went.
    on: Option<Version>,
    /// Its lend, once recorded.
    lend: Option<Lend>,
    /// The store's answer, while its lend is settled.
    stored: Option<Stored>,
    /// The store answered before the write was lent (its body still held): the lend,
    /// when it comes, is ended at once.
    answered_early: bool,
    /// Its outcome was concluded.
    concluded: bool,
    /// The fence does not know the resource's version (a read through it may teach it).
    unknown: bool,
    notes: Vec<Note>,
}

impl Write {
    /// A conditional write (`delete`: a DELETE) of `resource` with `token`, answered
    /// in `form`; a lend stays `lifetime_ms` after it is made when the write is given
    /// up on; `can_ask`: the host can send the store a `HEAD`.
    pub fn new(
        resource: &str,
        token: Token,
        delete: bool,
        form: Form,
        lifetime_ms: Option<u64>,
        can_ask: bool,
    ) -> Write {
        Write {
            resource: resource.to_owned(),
            token,
            delete,
            form,
            lifetime_ms,
            can_ask,
            asked: false,
            retry: None,
            in_flight: None,
            on: None,
            lend: None,
            stored: None,
            answered_early: false,
            concluded: false,
            unknown: false,
            notes: Vec::new(),
        }
    }

    /// The resource written.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The write's token.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Whether its head went and its body is held, not lent yet (the filter's). Once
    /// the write is concluded without a lend (the proxy answered early), the body
    /// stays held: none of it goes without its lend.
    pub fn holding_body(&self) -> bool {
        self.on.is_some() && self.lend.is_none()
    }

    /// Whether a chain change is in flight.
    pub fn changing(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether the store answered before the write was lent.
    pub fn answered_early(&self) -> bool {
        self.answered_early
    }

    /// Whether the fence found the resource's version unknown: a read through it
    /// may teach it.
    pub fn version_unknown(&self) -> bool {
        self.unknown
    }

    /// What to log for the write since the last call.
    pub fn notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// The write starts at `now_ms` (Unix time), its body whole or to come.
    pub fn start(&mut self, body: Body, now_ms: u64) -> Command {
        let term = self.term(now_ms);
        let change = match body {
            Body::Whole(makes) => Change::Lend { token: self.token, makes: Some(makes), on: None, term },
            Body::ToCome => Change::Peek(self.token, term),
        };
        self.chain(change)
    }

    /// The held body is whole at `now_ms`, and makes `makes`: lend the write on the
    /// precondition its head carries.
    pub fn body_whole(&mut self, makes: Version, now_ms: u64) -> Command {
        let term = self.term(now_ms);
        self.chain(Change::Lend { token: self.token, makes: Some(makes), on: self.on.clone(), term })
    }

    /// The chain change in flight came to `done` at `now_ms`.
    pub fn chain_done(&mut self, done: Done, now_ms: u64) -> Command {
        let Some(change) = self.in_flight.take() else { return Command::Idle };
        match (change, done) {
            (Change::Peek(..), Done::Lent(lend)) => self.send(lend.on),
            (Change::Lend { .. }, Done::Lent(lend)) => {
                let (id, on) = (lend.id, lend.on.clone());
                self.lend = Some(lend);
                if self.answered_early {
                    // The store answered before the body went: it will not apply it.
                    return self.chain(Change::Settle { id, answer: Answer::NotApplied });
                }
                match self.on {
                    Some(_) => Command::ReleaseBody,
                    None => self.send(on),
                }
            }
            (change @ (Change::Peek(..) | Change::Lend { .. }), Done::Refused(Refusal::Unknown))
                if self.can_ask && !self.asked =>
            {
                self.asked = true;
                self.unknown = true;
                self.retry = Some(change);
                Command::AskStore
            }
            (Change::Peek(..) | Change::Lend { .. }, Done::Refused(refusal)) => {
                match refusal {
                    Refusal::Unknown => self.unknown = true,
                    Refusal::TooManyLent(_) => self.note(true, format!("refused: {refusal}")),
                    _ => {}
                }
                let refused = lend_refused(&self.resource, self.token, &refusal, self.form);
                self.conclude(Some(refused))
            }
            (Change::Lend { .. }, Done::Moved { carried, now }) => {
                let refused = moved(&self.resource, &carried, &now, self.form);
                self.conclude(Some(refused))
            }
            (Change::Learn(_), Done::Chain(_)) => match self.retry.take() {
                Some(retry) => {
                    self.unknown = false;
                    let term = self.term(now_ms);
                    self.chain(retry.renewed(term))
                }
                None => self.failed("an unexpected version chain outcome"),
            },
            (Change::Settle { .. }, Done::Chain(chain)) => self.settled(Some(&chain)),
            _ => self.failed("an unexpected version chain outcome"),
        }
    }

    /// The chain change in flight could not be made: `why`, on one line.
    pub fn chain_failed(&mut self, why: &str) -> Command {
        match self.in_flight.take() {
            Some(Change::Settle { .. }) => {
                self.note(
                    true,
                    format!("the write's answer was not recorded in its version chain; it stays lent: {why}"),
                );
                self.settled(None)
            }
            Some(_) => self.failed(why),
            None => Command::Idle,
        }
    }

    /// The store answered the filter's or the gateway's `HEAD` with `status` (0: no
    /// answer) and `etag`.
    pub fn store_told(&mut self, status: u16, etag: Option<&[u8]>) -> Command {
        match learned(status, etag) {
            Some(version) => self.chain(Change::Learn(version)),
            None => {
                let answer = if status == 0 { "no answer".to_owned() } else { status.to_string() };
                self.note(
                    false,
                    format!("the store's answer to the fence's HEAD ({answer}) tells no version: a client's read must"),
                );
                self.retry = None;
                let refused = lend_refused(&self.resource, self.token, &Refusal::Unknown, self.form);
                self.conclude(Some(refused))
            }
        }
    }

    /// What became of the write the host sent, or tried to.
    pub fn delivered(&mut self, delivery: Delivery<'_>) -> Command {
        let Some(lend) = self.lend.clone() else {
            // Answered before it was lent (its body still held): the exchange is over
            // and the write will not apply; a lend still in flight is ended at once.
            // The proxy's own answer (a 413 over its buffer) says nothing of the store.
            self.answered_early |= matches!(delivery, Delivery::Answered(..));
            return self.conclude(None);
        };
        let stored = match delivery {
            Delivery::GivenUp => {
                self.note(
                    false,
                    format!(
                        "given up on a conditional write on {}: it stays lent until the store answers it or its term \
                         is over, and the store refuses it if it arrives late",
                        lend.on
                    ),
                );
                return self.conclude(None);
            }
            Delivery::NotSent => None,
            Delivery::Answered(status, etag) => Some(Stored::of(status, etag, self.delete, &lend)),
        };
        if let Some(why) = stored.as_ref().and_then(|s| s.unlearned.as_deref()) {
            let line = format!(
                "the store applied a conditional write without telling its version ({why}): the next write is \
                 refused until a read through the fence tells it"
            );
            self.note(true, line);
        }
        let answer = stored.as_ref().map_or(Answer::NotApplied, |s| s.settle.clone());
        self.stored = stored;
        self.chain(Change::Settle { id: lend.id, answer })
    }

    fn term(&self, now_ms: u64) -> Term {
        Term { now_ms, lifetime_ms: self.lifetime_ms }
    }

    fn chain(&mut self, change: Change) -> Command {
        self.in_flight = Some(change.clone());
        Command::Chain(change)
    }

    /// The head goes with the precondition on `on`.
    fn send(&mut self, on: Version) -> Command {
        let (name, value) = super::precondition(&on);
        self.on = Some(on);
        Command::Send(name, value)
    }

    /// The lend is settled (`None`: it could not be recorded): the fence's refusal,
    /// or the store's answer.
    fn settled(&mut self, chain: Option<&Chain>) -> Command {
        if chain.is_some_and(|c| c.current.is_none()) {
            self.unknown = true;
        }
        let Some(stored) = self.stored.take() else {
            return self.conclude(None); // no answer of the store's: nothing to tell
        };
        let refused = stored.refused(&self.resource, chain.and_then(|c| c.highest), self.form);
        self.conclude(refused)
    }

    /// The write cannot be lent (`why`): refused, never sent without its lend.
    fn failed(&mut self, why: &str) -> Command {
        self.note(true, format!("version chain unavailable; refused: {why}"));
        self.conclude(Some(unavailable(&self.resource, why, self.form)))
    }

    /// The host knows the write's outcome itself (it refused the write for what only
    /// it sees, or the stream ended with the store's answer): conclude it, once.
    pub fn conclude(&mut self, refused: Option<Refused>) -> Command {
        if std::mem::replace(&mut self.concluded, true) {
            return Command::Idle;
        }
        Command::Conclude(refused)
    }

    fn note(&mut self, error: bool, line: String) {
        self.notes.push(Note { error, line });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::conditional::Event;
    use fencekeeper_core::Class;

    fn t(n: u64) -> Token {
        Token::from_parts(&[n]).unwrap()
    }

    fn tag(s: &str) -> Version {
        Version::tag(format!("\"{s}\"").as_bytes()).unwrap()
    }

    /// Carry out `command`'s chain changes on `chain` as a host would (at 2 s),
    /// returning the first other command.
    fn run(w: &mut Write, chain: &mut Chain, mut command: Command) -> Command {
        while let Command::Chain(change) = command {
            let done = change.apply(chain);
            command = w.chain_done(done, 2_000);
        }
        command
    }

    fn write(token: u64, can_ask: bool) -> Write {
        Write::new("r", t(token), false, Form::Text, Some(60_000), can_ask)
    }

    #[test]
    fn a_whole_write_is_lent_sent_with_its_precondition_and_settled_with_the_answer() {
        let mut chain = Chain::new();
        let mut w = write(3, true);
        let first = w.start(Body::Whole(tag("a")), 1_000);
        let send = run(&mut w, &mut chain, first);
        assert_eq!(send, Command::Send("if-none-match", "*".into()));
        assert_eq!(chain.lends.len(), 1, "lent before it is sent");
        let settle = w.delivered(Delivery::Answered(200, Some(b"\"a\"")));
        assert_eq!(run(&mut w, &mut chain, settle), Command::Conclude(None));
        assert_eq!((chain.lends.len(), chain.current.clone()), (0, Some(tag("a"))));
        assert!(w.notes().is_empty());
    }

    #[test]
    fn a_write_whose_body_is_to_come_peeks_sends_its_head_then_is_lent_when_whole() {
        let mut chain = Chain::new();
        let mut w = write(3, true);
        let peek = w.start(Body::ToCome, 1_000);
        assert!(matches!(peek, Command::Chain(Change::Peek(..))));
        assert_eq!(run(&mut w, &mut chain, peek), Command::Send("if-none-match", "*".into()));
        assert!(chain.lends.is_empty() && w.holding_body(), "a peek lends nothing");
        let lend = w.body_whole(tag("a"), 1_100);
        assert_eq!(run(&mut w, &mut chain, lend), Command::ReleaseBody);
        assert_eq!(chain.lends.len(), 1);
        assert!(!w.holding_body());
    }

    #[test]
    fn a_version_that_moved_while_the_body_arrived_is_refused_and_nothing_is_lent() {
        let mut chain = Chain::new();
        let mut w = write(3, true);
        let peek = w.start(Body::ToCome, 1_000);
        run(&mut w, &mut chain, peek);
        chain.current = Some(tag("b")); // another write applied meanwhile
        let lend = w.body_whole(tag("a"), 1_100);
        let Command::Conclude(Some(refused)) = run(&mut w, &mut chain, lend) else { panic!("refused") };
        assert_eq!(refused.answer.status, 409);
        assert!(chain.lends.is_empty());
    }

    #[test]
    fn an_unknown_version_is_asked_of_the_store_learned_and_the_write_lent_on_it() {
        let mut chain = Chain { current: None, ..Chain::new() };
        let mut w = write(3, true);
        let first = w.start(Body::Whole(tag("b")), 1_000);
        assert_eq!(run(&mut w, &mut chain, first), Command::AskStore);
        assert!(w.version_unknown());
        let learn = w.store_told(200, Some(b"\"a\""));
        assert_eq!(learn, Command::Chain(Change::Learn(tag("a"))));
        assert_eq!(run(&mut w, &mut chain, learn), Command::Send("if-match", "\"a\"".into()));
        assert!(!w.version_unknown());
        assert_eq!(chain.lends[0].until, Some(62_000), "the lend made again takes its term from then");
    }

    #[test]
    fn a_store_that_tells_nothing_or_a_second_unknown_refuses_the_write_for_a_read() {
        for status in [0, 403] {
            let mut chain = Chain { current: None, ..Chain::new() };
            let mut w = write(3, true);
            let first = w.start(Body::Whole(tag("b")), 1_000);
            run(&mut w, &mut chain, first);
            let Command::Conclude(Some(refused)) = w.store_told(status, None) else { panic!("refused") };
            assert!(refused.answer.reason.contains("(GET or HEAD)"), "{refused:?}");
            assert_eq!(w.notes().len(), 1);
            assert!(w.version_unknown());
        }
        // A host that cannot ask refuses at once.
        let mut chain = Chain { current: None, ..Chain::new() };
        let mut w = write(3, false);
        let first = w.start(Body::Whole(tag("b")), 1_000);
        assert!(matches!(run(&mut w, &mut chain, first), Command::Conclude(Some(_))));
        // Asked once only: a version lost again after the learn refuses.
        let mut w = write(3, true);
        let _ = w.start(Body::Whole(tag("b")), 1_000);
        assert_eq!(w.chain_done(Done::Refused(Refusal::Unknown), 1_000), Command::AskStore);
        assert_eq!(w.store_told(404, None), Command::Chain(Change::Learn(Version::Absent)));
        assert!(matches!(w.chain_done(Done::Chain(Chain::new()), 1_000), Command::Chain(Change::Lend { .. })));
        assert!(matches!(w.chain_done(Done::Refused(Refusal::Unknown), 1_000), Command::Conclude(Some(_))));
    }

    #[test]
    fn a_412_is_stale_after_a_higher_lend_else_a_version_conflict_and_counted_once() {
        let mut chain = Chain::new();
        let mut w = write(3, true);
        let first = w.start(Body::Whole(tag("a")), 1_000);
        run(&mut w, &mut chain, first);
        let mut higher = write(4, true);
        let first = higher.start(Body::Whole(tag("b")), 1_000);
        run(&mut higher, &mut chain, first);
        let settle = w.delivered(Delivery::Answered(412, None));
        let Command::Conclude(Some(refused)) = run(&mut w, &mut chain, settle) else { panic!("refused") };
        assert_eq!((refused.class, refused.event), (Some(Class::Stale), Some(Event::PreconditionFailed)));
    }

    #[test]
    fn a_write_given_up_on_stays_lent_and_a_late_answer_settles_it() {
        let mut chain = Chain::new();
        let mut w = write(3, true);
        let first = w.start(Body::Whole(tag("a")), 1_000);
        run(&mut w, &mut chain, first);
        assert_eq!(w.delivered(Delivery::GivenUp), Command::Conclude(None));
        assert_eq!(chain.lends.len(), 1);
        assert_eq!(w.notes().len(), 1);
        let late = w.delivered(Delivery::Answered(412, None));
        assert_eq!(run(&mut w, &mut chain, late), Command::Idle, "settled; the client was answered already");
        assert!(chain.lends.is_empty());
    }

    #[test]
    fn an_answer_before_the_lend_ends_the_lend_at_once() {
        let mut chain = Chain::new();
        let mut w = write(3, true);
        let peek = w.start(Body::ToCome, 1_000);
        run(&mut w, &mut chain, peek);
        let lend = w.body_whole(tag("a"), 1_100);
        // The store answers while the lend is in flight.
        assert_eq!(w.delivered(Delivery::Answered(400, None)), Command::Conclude(None));
        let Command::Chain(change) = lend else { panic!("lend") };
        let done = change.apply(&mut chain);
        let settle = w.chain_done(done, 1_200);
        assert!(matches!(settle, Command::Chain(Change::Settle { answer: Answer::NotApplied, .. })));
        assert_eq!(run(&mut w, &mut chain, settle), Command::Idle);
        assert!(chain.lends.is_empty());
    }

    #[test]
    fn a_chain_out_of_reach_refuses_before_and_leaves_the_lend_after() {
        let mut w = write(3, true);
        let _ = w.start(Body::Whole(tag("a")), 1_000);
        let Command::Conclude(Some(refused)) = w.chain_failed("etcd timed out") else { panic!("refused") };
        assert_eq!((refused.answer.status, refused.class), (503, Some(Class::Undecided)));
        let mut chain = Chain::new();
        let mut w = write(3, true);
        let first = w.start(Body::Whole(tag("a")), 1_000);
        run(&mut w, &mut chain, first);
        let _ = w.delivered(Delivery::Answered(412, None));
        let Command::Conclude(Some(refused)) = w.chain_failed("etcd timed out") else { panic!("the 412 still told") };
        assert_eq!(refused.answer.status, 409);
        assert!(w.notes()[0].error);
    }
}
