//! A fence instance, as the simulator sees it: a machine that takes requests, answers
//! them, forwards admitted writes to the store and asks for timers, and never does I/O
//! or reads a clock of its own ([`Fence`]). The world ([`crate::world`]) carries what
//! it says, with network delays, to clients, the store and back.
//!
//! [`GuardFence`] is the one instance today: the library's admit logic unchanged (a
//! [`Guard`] with the bundled validator over a memory mark store) and the engine's
//! ordering gate ([`fencekeeper_engine::flights`], the machine the gateway runs) over
//! the writes it sent (its *flights*), with an upstream timeout, a gate budget, a
//! store apply bound and a start grace. Several instances share one flight table for
//! the shared gate; a crash abandons an instance's flights there, as a lease would.

use crate::admits::Admits;
use crate::etcd::{Answer as EtcdAnswer, Call};
use crate::queue::{Nanos, MS};
use fencekeeper::{Decision, Guard, MemoryStore, Token};
use fencekeeper_chain::{Change, Done};
use fencekeeper_engine::flights::{Entered, Flights, Next, Table};
use fencekeeper_engine::forward;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// A write a client sent, as it reaches an instance.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// The write's number in the run.
    pub id: u64,
    /// The resource's index.
    pub resource: usize,
    /// The token it carries.
    pub token: u64,
    /// Which of a few bodies it writes (conditional runs: the same bytes make the
    /// same version, as MD5 ETags do).
    pub content: u8,
    /// A `fencing-admitted-token` the client sent itself (a lie: only the fence may
    /// tell the store what it admitted).
    pub forged: Option<u64>,
}

/// What the instance answered a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The `fencing-highest` header of a stale refusal.
    pub highest: Option<u64>,
    /// The body's first words (what the checker classifies by).
    pub body: String,
}

/// What an instance asks the world to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out {
    /// Answer the client of write `id`.
    Answer {
        /// The write.
        id: u64,
        /// The answer.
        answer: Answer,
    },
    /// Send write `id` to the store.
    Forward {
        /// The write.
        id: u64,
        /// Its `fencing-admitted-token` header, what the store takes for the token
        /// admitted (0: none).
        token: u64,
        /// The precondition header it carries (conditional writes), name and value.
        precondition: Option<(&'static str, String)>,
    },
    /// Make `change` to `resource`'s version chain in the chain store (as one etcd
    /// Txn), then call [`Fence::chain_done`] for write `id` with what it came to.
    Chain {
        /// The write.
        id: u64,
        /// The resource.
        resource: usize,
        /// The change.
        change: Change,
    },
    /// Send etcd call `call` (a mark store call of an admit), then call
    /// [`Fence::etcd_answered`] with its answer.
    Etcd {
        /// The call's number at this instance.
        call: u64,
        /// The call.
        op: Call,
    },
    /// Ask the store for `resource`'s version (a `HEAD`), then call
    /// [`Fence::head_answered`] for write `id`.
    Head {
        /// The write.
        id: u64,
        /// The resource.
        resource: usize,
    },
    /// Call [`Fence::timer`] with `tag` at `at`.
    Timer {
        /// When.
        at: Nanos,
        /// The instance's own word for it.
        tag: u64,
    },
    /// A flight on `resource` ended or changed in a registry other instances share:
    /// their held writes may go now ([`Fence::wake`]).
    Changed {
        /// The resource.
        resource: usize,
    },
}

/// A fence instance, driven by the world.
pub trait Fence {
    /// A client's write arrives.
    fn request(&mut self, now: Nanos, req: Request, out: &mut Vec<Out>);
    /// The store answered write `id` (which this instance forwarded) with `status`
    /// and `etag`.
    fn store_answered(&mut self, now: Nanos, id: u64, status: u16, etag: Option<&str>, out: &mut Vec<Out>);
    /// The chain store made write `id`'s change ([`Out::Chain`]) and it came to
    /// `done`; `None`: its answer was lost (the change may have been made).
    fn chain_done(&mut self, _now: Nanos, _id: u64, _done: Option<Done>, _out: &mut Vec<Out>) {}
    /// Etcd answered call `call` ([`Out::Etcd`]); `Err`: the answer was lost.
    fn etcd_answered(&mut self, now: Nanos, call: u64, answer: Result<EtcdAnswer, String>, out: &mut Vec<Out>);
    /// The store answered write `id`'s `HEAD` ([`Out::Head`]).
    fn head_answered(&mut self, _now: Nanos, _id: u64, _status: u16, _etag: Option<&str>, _out: &mut Vec<Out>) {}
    /// A timer this instance asked for fired.
    fn timer(&mut self, now: Nanos, tag: u64, out: &mut Vec<Out>);
    /// Another instance changed a flight on `resource` in a shared registry.
    fn wake(&mut self, now: Nanos, resource: usize, out: &mut Vec<Out>);
    /// The instance dies: everything it held in memory is lost (the world answers its
    /// open requests with a reset). Marks are kept: they are in the mark store.
    fn crash(&mut self, now: Nanos);
    /// The instance starts again, fresh, at `now` (its start grace begins).
    fn restart(&mut self, now: Nanos);
    /// The mark of `resource` as this instance's mark store has it.
    fn mark(&self, resource: usize) -> Option<u64>;
}

/// The timing an instance is configured with.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// How long it waits for the store before giving up on a forwarded write (504).
    pub upstream_timeout: Nanos,
    /// How long the gate holds a write before refusing it (503).
    pub gate_budget: Nanos,
    /// The store apply bound: a write given up on may still be applied for this long.
    pub apply_bound: Nanos,
    /// After a start, writes are refused (503) for this long: a write the previous
    /// incarnation sent may still be applied meanwhile, and its flights are gone.
    pub start_grace: Nanos,
}

/// A bug put into the fence on purpose, to show that the checker finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// Forward every admitted write at once, without the ordering gate.
    SkipGate,
    /// Forward a token below the mark, as a host that skipped the admit would: the
    /// guard's refusal is ignored and the gate is not told the mark (told it, the
    /// gate alone would refuse the write as stale).
    AdmitStale,
    /// The gate lets a write whose token equals the highest admitted on its resource
    /// go at once, past lower-token writes the store may still apply (as if "the
    /// holder's own token already passed" were enough).
    EqualPasses,
    /// Conditional writes: the chain lends a write without checking it against the
    /// writes still lent (the chain store applies the lend with them out of sight), so
    /// a body that brings back a version a given-up write is conditioned on goes
    /// (A-B-A).
    LendUnchecked,
    /// Conditional writes: a write given up on is settled as not applied at once,
    /// instead of staying lent until the store answers or its term is over.
    ReleaseGivenUp,
    /// Conditional writes: the chain lends a write without checking its token against
    /// the highest it lent (a write admitted, then overtaken by a higher token's lend
    /// before its own lend is made, goes on the version the higher one made).
    LendStale,
    /// The host sets `fencing-admitted-token` only when the client sent none, so a
    /// client's own value reaches the store.
    HeaderKept,
    /// With file stores: the file is gone when an instance starts again (kept on a
    /// disk that did not survive the restart), so its marks start empty.
    LostMarks,
    /// Etcd makes a compare-and-swap whose mark moved meanwhile (a lost race written
    /// anyway), which may lower the mark.
    CasLowers,
    /// With `--shared-gate`: each instance's gate is its own after all, while writes to
    /// one resource still go through every instance (the opt-out, `--local-gate`, on
    /// instances scaled out on one etcd).
    LocalGate,
}

impl Bug {
    /// Every bug's name, as `--bug` takes it.
    pub const NAMES: &'static str =
        "skip-gate, admit-stale, equal-passes, header-kept, cas-lowers, lost-marks, lend-unchecked, lend-stale, release-given-up, \
         local-gate";

    /// Its name, as `--bug` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Bug::SkipGate => "skip-gate",
            Bug::AdmitStale => "admit-stale",
            Bug::EqualPasses => "equal-passes",
            Bug::LendUnchecked => "lend-unchecked",
            Bug::ReleaseGivenUp => "release-given-up",
            Bug::CasLowers => "cas-lowers",
            Bug::HeaderKept => "header-kept",
            Bug::LostMarks => "lost-marks",
            Bug::LendStale => "lend-stale",
            Bug::LocalGate => "local-gate",
        }
    }
}

impl std::str::FromStr for Bug {
    type Err = String;
    fn from_str(s: &str) -> Result<Bug, String> {
        match s {
            "skip-gate" => Ok(Bug::SkipGate),
            "admit-stale" => Ok(Bug::AdmitStale),
            "equal-passes" => Ok(Bug::EqualPasses),
            "lend-unchecked" => Ok(Bug::LendUnchecked),
            "release-given-up" => Ok(Bug::ReleaseGivenUp),
            "cas-lowers" => Ok(Bug::CasLowers),
            "header-kept" => Ok(Bug::HeaderKept),
            "lost-marks" => Ok(Bug::LostMarks),
            "lend-stale" => Ok(Bug::LendStale),
            "local-gate" => Ok(Bug::LocalGate),
            _ => Err(format!("unknown bug {s:?} ({})", Bug::NAMES)),
        }
    }
}

/// The writes sent on each resource that the store may still apply: one instance's
/// own table, or one several instances share (the shared gate).
pub type Registry = Rc<RefCell<Table>>;

/// An empty registry.
pub fn registry() -> Registry {
    Rc::new(RefCell::new(Table::default()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Admitted, at the gate.
    Held,
    /// Sent to the store, not answered.
    Sent,
}

#[derive(Clone, Copy)]
struct Pending {
    resource: usize,
    token: u64,
    /// Its `fencing-admitted-token` ([`admitted_header`]).
    header: u64,
    state: State,
}

/// A timer's tag: the upstream timeout of a write, or the gate's wake-up at a time.
enum Timer {
    Upstream(u64),
    Wake(u64),
}

impl Timer {
    fn tag(&self) -> u64 {
        match *self {
            Timer::Upstream(id) => id << 1,
            Timer::Wake(ms) => (ms << 1) | 1,
        }
    }

    fn of(tag: u64) -> Timer {
        match tag & 1 {
            0 => Timer::Upstream(tag >> 1),
            _ => Timer::Wake(tag >> 1),
        }
    }
}

/// The answer to an admit that refused a write on `name`: 409 with the mark for a
/// stale token, else 503, with the guard's reason, as the gateway answers them.
pub(crate) fn refusal(decision: &Decision, name: &str) -> Answer {
    let (status, highest) = match decision.class() {
        fencekeeper::Class::Stale => (409, decision.action.token.as_ref().map(first)),
        _ => (503, None),
    };
    let reason = decision.reason(name);
    let body = if status == 503 { format!("cannot decide: {reason}") } else { reason };
    Answer { status, highest, body }
}

/// The `fencing-admitted-token` a write `req` forwarded after `decision` carries to
/// the store (0: none), as the hosts set it: the client's own value removed (it is
/// one of the engine's `forward::NEVER_FROM_CLIENTS`), then the admitted token set
/// (`forward::admitted`).
pub(crate) fn admitted_header(decision: &Decision, req: &Request, bug: Option<Bug>) -> u64 {
    let admitted = forward::admitted(&decision.action).map(|t| first(&t));
    let header = match bug {
        Some(Bug::HeaderKept) => req.forged.or(admitted),
        // A host that skipped the admit forwards the token it was presented.
        Some(Bug::AdmitStale) => admitted.or(Some(req.token)),
        _ => admitted,
    };
    header.unwrap_or(0)
}

/// The answer to a write that arrives at an instance in its start grace.
pub(crate) fn in_grace(name: &str) -> Answer {
    let body = format!("cannot decide on {name:?}: the instance started less than its start grace ago");
    Answer { status: 503, highest: None, body }
}

/// The library's admit logic and the engine's ordering gate, as one instance.
pub struct GuardFence {
    me: usize,
    /// Its admits, the writes being admitted among them (they arrived at the gate,
    /// unless the gate is skipped).
    admits: Admits,
    names: Rc<[String]>,
    index: HashMap<String, usize>,
    table: Registry,
    shared_gate: bool,
    settings: Settings,
    bug: Option<Bug>,
    grace_until: Nanos,
    flights: Flights,
    pending: BTreeMap<u64, Pending>,
    /// The times a wake-up timer is set for.
    wakes: BTreeSet<u64>,
}

impl GuardFence {
    /// Instance `me`, admitting through `guard` (whose store holds the marks, maybe
    /// shared with other instances), ordering through `table` (its own, or one shared
    /// when `shared_gate`), over the resources named in `names`.
    pub fn new(
        me: usize,
        admits: Admits,
        names: Rc<[String]>,
        table: Registry,
        shared_gate: bool,
        settings: Settings,
        bug: Option<Bug>,
    ) -> GuardFence {
        let index = names.iter().enumerate().map(|(i, n)| (n.clone(), i)).collect();
        GuardFence {
            me,
            admits,
            names,
            index,
            table,
            shared_gate,
            flights: flights(me, &settings),
            settings,
            bug,
            grace_until: 0,
            pending: BTreeMap::new(),
            wakes: BTreeSet::new(),
        }
    }

    /// A guard with the bundled validator over a fresh memory store.
    pub fn memory_guard(validator: Arc<fencekeeper::Validator>) -> Arc<Guard> {
        Arc::new(Guard::new(validator, Arc::new(MemoryStore::new())))
    }

    fn answer(&mut self, id: u64, status: u16, highest: Option<u64>, body: String, out: &mut Vec<Out>) {
        self.pending.remove(&id);
        out.push(Out::Answer { id, answer: Answer { status, highest, body } });
    }

    fn stale(&mut self, id: u64, higher: u64, out: &mut Vec<Out>) {
        let body = format!("stale: a write with token {higher} was already sent");
        self.answer(id, 409, Some(higher), body, out);
    }

    fn forward(&mut self, now: Nanos, id: u64, out: &mut Vec<Out>) {
        let Some(p) = self.pending.get_mut(&id) else { return };
        p.state = State::Sent;
        out.push(Out::Forward { id, token: p.header, precondition: None });
        out.push(Out::Timer { at: now + self.settings.upstream_timeout, tag: Timer::Upstream(id).tag() });
    }

    /// Run `f` on the gate at `now`, then carry out what it says, as the gateway does.
    fn step(&mut self, now: Nanos, out: &mut Vec<Out>, f: impl FnOnce(&mut Flights, &mut Table, u64, &mut Vec<Next>)) {
        let mut next = Vec::new();
        f(&mut self.flights, &mut self.table.borrow_mut(), now / MS, &mut next);
        let mut i = 0;
        while let Some(n) = next.get(i).cloned() {
            i += 1;
            match n {
                Next::Go { id } => {
                    let Some(p) = self.pending.get(&id).copied() else { continue };
                    // Another instance on the same marks may have admitted a higher
                    // token while this write waited.
                    let mark = match self.bug {
                        Some(Bug::AdmitStale) => None,
                        _ => self.admits.mark(&self.names[p.resource]),
                    };
                    match mark.filter(|m| *m > p.token) {
                        Some(higher) => {
                            self.flights.answered(&mut self.table.borrow_mut(), now / MS, id, &mut next);
                            self.stale(id, higher, out);
                        }
                        None => self.forward(now, id, out),
                    }
                }
                Next::Stale { id, higher } => self.stale(id, first(&higher), out),
                Next::TimedOut { id, .. } => {
                    let Some(p) = self.pending.get(&id).copied() else { continue };
                    let name = &self.names[p.resource];
                    let body = format!("cannot decide on {name:?}: timed out at the ordering gate");
                    self.answer(id, 503, None, body, out);
                }
                Next::WakeAt(ms) => {
                    if self.wakes.insert(ms) {
                        out.push(Out::Timer { at: ms * MS, tag: Timer::Wake(ms).tag() });
                    }
                }
                Next::Changed(name) => {
                    if self.shared_gate {
                        if let Some(&resource) = self.index.get(&name) {
                            out.push(Out::Changed { resource });
                        }
                    }
                }
            }
        }
    }
}

fn flights(me: usize, settings: &Settings) -> Flights {
    let ms = |n: Nanos| Duration::from_millis(n / MS);
    Flights::new(me as u64, ms(settings.gate_budget), ms(settings.apply_bound))
}

pub(crate) fn tok(t: u64) -> Token {
    // One component is always a valid arity.
    Token::from_parts(&[t]).unwrap_or_else(|_| unreachable!())
}

pub(crate) fn first(t: &Token) -> u64 {
    t.parts().first().copied().unwrap_or(0)
}

impl GuardFence {
    /// Write `req`'s admit decided: refuse it, or take it to the gate.
    fn decided(&mut self, now: Nanos, req: Request, decision: Decision, out: &mut Vec<Out>) {
        let id = req.id;
        let name = self.names[req.resource].clone();
        let gated = self.bug != Some(Bug::SkipGate);
        let admitted = decision.admitted() || self.bug == Some(Bug::AdmitStale);
        if !admitted {
            if gated {
                self.step(now, out, |flights, table, ms, _| flights.leave(table, ms, &name));
            }
            out.push(Out::Answer { id, answer: refusal(&decision, &name) });
            return;
        }
        let header = admitted_header(&decision, &req, self.bug);
        self.pending.insert(id, Pending { resource: req.resource, token: req.token, header, state: State::Held });
        let token = tok(req.token);
        if !gated {
            return self.forward(now, id, out);
        }
        let equal = self.table.borrow().entry(&name).and_then(|e| e.highest) == Some(token);
        if self.bug == Some(Bug::EqualPasses) && equal {
            self.step(now, out, |flights, table, ms, _| flights.leave(table, ms, &name));
            return self.forward(now, id, out);
        }
        let mut entered = Entered::Held;
        self.step(now, out, |flights, table, ms, next| {
            entered = flights.enter(table, ms, id, &name, token, next);
        });
        match entered {
            Entered::Go => self.forward(now, id, out),
            Entered::Stale(higher) => self.stale(id, first(&higher), out),
            Entered::Held => {}
        }
    }
}

impl Fence for GuardFence {
    fn request(&mut self, now: Nanos, req: Request, out: &mut Vec<Out>) {
        let name = self.names[req.resource].clone();
        if now < self.grace_until {
            return out.push(Out::Answer { id: req.id, answer: in_grace(&name) });
        }
        // At the gate from its arrival, as the gateway's: a higher write admitted
        // meanwhile is kept in the table until this one is decided.
        if self.bug != Some(Bug::SkipGate) {
            self.step(now, out, |flights, table, _, _| flights.arrive(table, &name));
        }
        if let Some((req, decision)) = self.admits.start(req, &name, out) {
            self.decided(now, req, decision, out);
        }
    }

    fn etcd_answered(&mut self, now: Nanos, call: u64, answer: Result<EtcdAnswer, String>, out: &mut Vec<Out>) {
        if let Some((req, decision)) = self.admits.answered(call, answer, out) {
            self.decided(now, req, decision, out);
        }
    }

    fn store_answered(&mut self, now: Nanos, id: u64, _status: u16, _etag: Option<&str>, out: &mut Vec<Out>) {
        // A write given up on is no longer pending: its flight holds until its deadline.
        if !self.pending.get(&id).is_some_and(|p| p.state == State::Sent) {
            return;
        }
        self.answer(id, 200, None, "stored".into(), out);
        self.step(now, out, |flights, table, ms, next| flights.answered(table, ms, id, next));
    }

    fn timer(&mut self, now: Nanos, tag: u64, out: &mut Vec<Out>) {
        match Timer::of(tag) {
            Timer::Upstream(id) => {
                if !self.pending.get(&id).is_some_and(|p| p.state == State::Sent) {
                    return;
                }
                // Given up on: the store may still apply it within the apply bound,
                // counted from the next millisecond (the gate's clock is in whole ones).
                self.answer(id, 504, None, "upstream timed out".into(), out);
                self.step(now + MS, out, |flights, table, ms, next| flights.given_up(table, ms, id, next));
            }
            Timer::Wake(ms) => {
                self.wakes.remove(&ms);
                self.step(now, out, |flights, table, ms, next| flights.tick(table, ms, next));
            }
        }
    }

    fn wake(&mut self, now: Nanos, resource: usize, out: &mut Vec<Out>) {
        let name = self.names[resource].clone();
        self.step(now, out, |flights, table, ms, next| flights.changed(table, ms, &name, next));
    }

    fn crash(&mut self, now: Nanos) {
        self.pending.clear();
        self.wakes.clear();
        // Its writes being admitted leave the gate's table (a shared one outlives it).
        let admitting = self.admits.crash();
        if self.bug != Some(Bug::SkipGate) {
            let mut table = self.table.borrow_mut();
            for req in &admitting {
                self.flights.leave(&mut table, now / MS, &self.names[req.resource]);
            }
        }
        let flights = std::mem::replace(&mut self.flights, flights(self.me, &self.settings));
        let mut table = self.table.borrow_mut();
        if self.shared_gate {
            // A shared registry keeps a dead instance's flights until its lease runs
            // out; here, until the store can no longer apply them. The world tells
            // the other instances.
            let until = (now + self.settings.apply_bound) / MS + 1;
            flights.abandon(&mut table, now / MS, until, &mut Vec::new());
        } else {
            *table = Table::default();
        }
    }

    fn restart(&mut self, now: Nanos) {
        self.admits.restart();
        self.grace_until = now + self.settings.start_grace;
    }

    fn mark(&self, resource: usize) -> Option<u64> {
        self.admits.mark(&self.names[resource])
    }
}
