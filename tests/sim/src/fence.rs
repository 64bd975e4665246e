//! A fence instance, as the simulator sees it: a machine that takes requests, answers
//! them, forwards admitted writes to the store and asks for timers, and never does I/O
//! or reads a clock of its own ([`Fence`]). The world ([`crate::world`]) carries what
//! it says, with network delays, to clients, the store and back.
//!
//! [`GuardFence`] is the one instance today: the library's admit logic unchanged (a
//! [`Guard`] with the bundled validator over a memory mark store) and the ordering
//! gate's rule ([`fencekeeper_core::gate::pass`]) over the writes it sent (its
//! *flights*), with an upstream timeout, a gate budget, a store apply bound and a
//! start grace. The HTTP request engine's machine is meant to take its place behind
//! the same trait.

use crate::queue::{Nanos, MS};
use fencekeeper::{Guard, MemoryStore, Token};
use fencekeeper_core::gate::{pass, Flight, Passage, Until};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

/// A write a client sent, as it reaches an instance.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// The write's number in the run.
    pub id: u64,
    /// The resource's index.
    pub resource: usize,
    /// The token it carries.
    pub token: u64,
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
    /// Send write `id` to the store, admitted with `token`.
    Forward {
        /// The write.
        id: u64,
        /// The admitted token (`fencing-admitted-token`).
        token: u64,
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
    /// The store answered write `id` (which this instance forwarded).
    fn store_answered(&mut self, now: Nanos, id: u64, out: &mut Vec<Out>);
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
}

impl std::str::FromStr for Bug {
    type Err = String;
    fn from_str(s: &str) -> Result<Bug, String> {
        match s {
            "skip-gate" => Ok(Bug::SkipGate),
            "admit-stale" => Ok(Bug::AdmitStale),
            _ => Err(format!("unknown bug {s:?} (skip-gate, admit-stale)")),
        }
    }
}

/// The writes sent on each resource that the store may still apply: one instance's
/// own, or a registry several instances share.
pub struct Registry {
    flights: Vec<Vec<(u64, usize, Flight)>>,
}

impl Registry {
    /// An empty registry for `resources` resources.
    pub fn new(resources: usize) -> Rc<RefCell<Registry>> {
        Rc::new(RefCell::new(Registry { flights: vec![Vec::new(); resources] }))
    }
}

#[derive(Clone, Copy)]
enum State {
    /// Held at the gate.
    Held,
    /// Sent to the store, not answered.
    Sent,
}

#[derive(Clone, Copy)]
struct Pending {
    resource: usize,
    token: u64,
    state: State,
}

enum Timer {
    Upstream(u64),
    Gate(u64),
    Recheck(usize),
}

impl Timer {
    fn tag(&self) -> u64 {
        match *self {
            Timer::Upstream(id) => id << 2,
            Timer::Gate(id) => (id << 2) | 1,
            Timer::Recheck(r) => ((r as u64) << 2) | 2,
        }
    }

    fn of(tag: u64) -> Timer {
        match tag & 3 {
            0 => Timer::Upstream(tag >> 2),
            1 => Timer::Gate(tag >> 2),
            _ => Timer::Recheck((tag >> 2) as usize),
        }
    }
}

/// The library's admit logic and the ordering gate's rule, as one instance.
pub struct GuardFence {
    me: usize,
    guard: Arc<Guard>,
    names: Rc<[String]>,
    gate: Rc<RefCell<Registry>>,
    shared_gate: bool,
    settings: Settings,
    bug: Option<Bug>,
    grace_until: Nanos,
    pending: BTreeMap<u64, Pending>,
    held: Vec<Vec<u64>>,
}

impl GuardFence {
    /// Instance `me`, admitting through `guard` (whose store holds the marks, maybe
    /// shared with other instances), ordering through `gate` (its own registry, or
    /// one shared when `shared_gate`), over the resources named in `names`.
    pub fn new(
        me: usize,
        guard: Arc<Guard>,
        names: Rc<[String]>,
        gate: Rc<RefCell<Registry>>,
        shared_gate: bool,
        settings: Settings,
        bug: Option<Bug>,
    ) -> GuardFence {
        let held = vec![Vec::new(); names.len()];
        GuardFence {
            me,
            guard,
            names,
            gate,
            shared_gate,
            settings,
            bug,
            grace_until: 0,
            pending: BTreeMap::new(),
            held,
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

    /// Ask the gate about held write `id`, and act on its passage.
    fn try_pass(&mut self, now: Nanos, id: u64, out: &mut Vec<Out>) -> bool {
        let Some(p) = self.pending.get(&id).copied() else { return true };
        let token = tok(p.token);
        let passage = if self.bug == Some(Bug::SkipGate) {
            Passage::Go
        } else {
            let highest = match self.bug {
                Some(Bug::AdmitStale) => None,
                _ => self.guard.mark(&self.names[p.resource]).ok().flatten(),
            };
            let gate = self.gate.borrow();
            let others = gate.flights[p.resource].iter().filter(|(other, _, _)| *other != id).map(|(_, _, f)| *f);
            pass(&token, highest.as_ref(), others, now / MS)
        };
        match passage {
            Passage::Go => {
                self.gate.borrow_mut().flights[p.resource].push((
                    id,
                    self.me,
                    Flight { token, until: Until::Answered },
                ));
                self.pending.insert(id, Pending { state: State::Sent, ..p });
                out.push(Out::Forward { id, token: p.token });
                out.push(Out::Timer { at: now + self.settings.upstream_timeout, tag: Timer::Upstream(id).tag() });
                true
            }
            Passage::Stale(higher) => {
                let body = format!("stale: a write with token {higher} was already sent");
                self.answer(id, 409, Some(first(&higher)), body, out);
                true
            }
            Passage::Wait { until } => {
                if let Some(at) = until {
                    out.push(Out::Timer { at: at * MS, tag: Timer::Recheck(p.resource).tag() });
                }
                false
            }
        }
    }

    /// Let held writes on `resource` go, in arrival order, as far as the gate allows.
    fn recheck(&mut self, now: Nanos, resource: usize, out: &mut Vec<Out>) {
        self.forget_expired(now, resource);
        let held = std::mem::take(&mut self.held[resource]);
        let mut still = Vec::new();
        for id in held {
            if !self.try_pass(now, id, out) {
                still.push(id);
            }
        }
        self.held[resource] = still;
    }

    fn forget_expired(&mut self, now: Nanos, resource: usize) {
        let now_ms = now / MS;
        self.gate.borrow_mut().flights[resource].retain(|(_, _, f)| f.live(now_ms));
    }

    fn end_flight(&mut self, id: u64, resource: usize, out: &mut Vec<Out>) {
        self.gate.borrow_mut().flights[resource].retain(|(other, _, _)| *other != id);
        if self.shared_gate {
            out.push(Out::Changed { resource });
        }
    }
}

fn tok(t: u64) -> Token {
    // One component is always a valid arity.
    Token::from_parts(&[t]).unwrap_or_else(|_| unreachable!())
}

fn first(t: &Token) -> u64 {
    t.parts().first().copied().unwrap_or(0)
}

impl Fence for GuardFence {
    fn request(&mut self, now: Nanos, req: Request, out: &mut Vec<Out>) {
        let name = &self.names[req.resource];
        if now < self.grace_until {
            let body = format!("cannot decide on {name:?}: the instance started less than its start grace ago");
            out.push(Out::Answer { id: req.id, answer: Answer { status: 503, highest: None, body } });
            return;
        }
        let text = req.token.to_string();
        let decision = self.guard.admit(name, Some(&text));
        let admitted = decision.admitted() || self.bug == Some(Bug::AdmitStale);
        if !admitted {
            let (status, highest) = match decision.class() {
                fencekeeper::Class::Stale => (409, decision.action.token.as_ref().map(first)),
                _ => (503, None),
            };
            let reason = decision.reason(name);
            let body = if status == 503 { format!("cannot decide: {reason}") } else { reason };
            out.push(Out::Answer { id: req.id, answer: Answer { status, highest, body } });
            return;
        }
        self.pending.insert(req.id, Pending { resource: req.resource, token: req.token, state: State::Held });
        if !self.try_pass(now, req.id, out) {
            self.held[req.resource].push(req.id);
            out.push(Out::Timer { at: now + self.settings.gate_budget, tag: Timer::Gate(req.id).tag() });
        }
    }

    fn store_answered(&mut self, now: Nanos, id: u64, out: &mut Vec<Out>) {
        // A write given up on is no longer pending: its flight holds until its deadline.
        let Some(p) = self.pending.get(&id).copied() else { return };
        if !matches!(p.state, State::Sent) {
            return;
        }
        self.answer(id, 200, None, "stored".into(), out);
        self.end_flight(id, p.resource, out);
        self.recheck(now, p.resource, out);
    }

    fn timer(&mut self, now: Nanos, tag: u64, out: &mut Vec<Out>) {
        match Timer::of(tag) {
            Timer::Upstream(id) => {
                let Some(p) = self.pending.get(&id).copied() else { return };
                if !matches!(p.state, State::Sent) {
                    return;
                }
                // Given up on: the store may still apply it within the apply bound.
                let deadline = (now + self.settings.apply_bound) / MS + 1;
                for (other, _, f) in self.gate.borrow_mut().flights[p.resource].iter_mut() {
                    if *other == id {
                        f.until = Until::Deadline(deadline);
                    }
                }
                self.answer(id, 504, None, "upstream timed out".into(), out);
                out.push(Out::Timer { at: deadline * MS, tag: Timer::Recheck(p.resource).tag() });
                if self.shared_gate {
                    out.push(Out::Changed { resource: p.resource });
                }
            }
            Timer::Gate(id) => {
                let Some(p) = self.pending.get(&id).copied() else { return };
                if !matches!(p.state, State::Held) {
                    return;
                }
                self.held[p.resource].retain(|&h| h != id);
                let body = format!("cannot decide on {:?}: timed out at the ordering gate", self.names[p.resource]);
                self.answer(id, 503, None, body, out);
            }
            Timer::Recheck(resource) => self.recheck(now, resource, out),
        }
    }

    fn wake(&mut self, now: Nanos, resource: usize, out: &mut Vec<Out>) {
        if !self.held[resource].is_empty() {
            self.recheck(now, resource, out);
        }
    }

    fn crash(&mut self, now: Nanos) {
        self.pending.clear();
        self.held.iter_mut().for_each(Vec::clear);
        let mut gate = self.gate.borrow_mut();
        if self.shared_gate {
            // A shared registry keeps a dead instance's flights until its lease runs
            // out; here, until the store can no longer apply them.
            let deadline = (now + self.settings.apply_bound) / MS + 1;
            for flights in gate.flights.iter_mut() {
                for (_, _, f) in flights.iter_mut().filter(|(_, owner, _)| *owner == self.me) {
                    if f.until == Until::Answered {
                        f.until = Until::Deadline(deadline);
                    }
                }
            }
        } else {
            gate.flights.iter_mut().for_each(Vec::clear);
        }
    }

    fn restart(&mut self, now: Nanos) {
        self.grace_until = now + self.settings.start_grace;
    }

    fn mark(&self, resource: usize) -> Option<u64> {
        self.guard.mark(&self.names[resource]).ok().flatten().map(|t| first(&t))
    }
}
