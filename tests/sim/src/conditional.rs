//! A fence instance with conditional writes, as the gateway runs them with
//! `--conditional-writes`: the library's admit (a [`Guard`] over the marks), then the
//! engine's conditional-write machine ([`fencekeeper_engine::conditional::Write`])
//! unchanged, carried out against the world's version chains and store. No ordering
//! gate: the chain refuses a lend below the highest it lent, and the store refuses a
//! write whose precondition it has moved past.
//!
//! What the machine asks for becomes an [`Out`]: a chain change is made by the
//! world's chain store (one etcd Txn, after a network hop, whose answer may be lost),
//! a `HEAD` asks the world's store, a send forwards the write with its precondition.
//! A write given up on (the upstream timeout) stays in the machine, as the gateway
//! keeps it, so that the store's late answer settles its lend; a crash loses every
//! machine, and the lends they left end at their term.

use crate::admits::Admits;
use crate::etcd::Answer as EtcdAnswer;
use crate::fence::{admitted_header, in_grace, refusal, tok, Answer, Bug, Fence, Out, Request, Settings};
use crate::queue::{Nanos, MS};
use fencekeeper::Decision;
use fencekeeper_chain::{content_version, Change, Done, Version};
use fencekeeper_engine::answer::Form;
use fencekeeper_engine::conditional::{Body, Command, Delivery, Refused, Write};
use std::collections::BTreeMap;
use std::rc::Rc;

/// The version a write of `content` makes: the same bytes, the same ETag (a quoted
/// hex digest, as S3's MD5 ETags), so a body written again brings a version back.
pub fn version_of(content: u8) -> Version {
    content_version(&[content; 16])
}

/// [`version_of`]'s ETag, as the store answers it.
pub fn etag_of(content: u8) -> String {
    match version_of(content) {
        Version::Tag(tag) => tag,
        Version::Absent => String::new(),
    }
}

/// One conditional write in the instance.
struct Pending {
    resource: usize,
    /// Its `fencing-admitted-token` (`fence::admitted_header`).
    header: u64,
    write: Write,
    /// Forwarded to the store.
    sent: bool,
    /// The upstream timeout passed: its client was answered 504.
    given_up: bool,
    /// The store's answer, once it came (status, ETag).
    stored: Option<(u16, Option<String>)>,
    /// The lend it was given, once lent (for [`Bug::ReleaseGivenUp`]).
    lend: Option<u64>,
}

/// The library's admit and the engine's conditional-write machine, as one instance.
pub struct ConditionalFence {
    admits: Admits,
    names: Rc<[String]>,
    settings: Settings,
    bug: Option<Bug>,
    grace_until: Nanos,
    writes: BTreeMap<u64, Pending>,
}

impl ConditionalFence {
    /// An instance admitting through `admits`, over the resources named in `names`.
    pub fn new(admits: Admits, names: Rc<[String]>, settings: Settings, bug: Option<Bug>) -> ConditionalFence {
        ConditionalFence { admits, names, settings, bug, grace_until: 0, writes: BTreeMap::new() }
    }

    /// Write `req`'s admit decided: refuse it, or start its conditional course.
    fn decided(&mut self, now: Nanos, req: Request, decision: Decision, out: &mut Vec<Out>) {
        let id = req.id;
        let name = self.names[req.resource].clone();
        if !decision.admitted() {
            out.push(Out::Answer { id, answer: refusal(&decision, &name) });
            return;
        }
        let mut write = Write::new(&name, tok(req.token), false, Form::Text, Some(self.lifetime_ms()), true);
        let command = write.start(Body::Whole(version_of(req.content)), now / MS);
        let (resource, header) = (req.resource, admitted_header(&decision, &req, self.bug));
        let pending = Pending { resource, header, write, sent: false, given_up: false, stored: None, lend: None };
        self.writes.insert(id, pending);
        self.carry(now, id, command, out);
    }

    /// How long after it is lent a write given up on stays lent: the upstream
    /// timeout plus the store apply bound, as the gateway's `--request-timeout` plus
    /// `--store-apply-bound`.
    fn lifetime_ms(&self) -> u64 {
        (self.settings.upstream_timeout + self.settings.apply_bound) / MS
    }

    fn answer(&mut self, id: u64, answer: Answer, out: &mut Vec<Out>) {
        out.push(Out::Answer { id, answer });
    }

    fn refused(&mut self, id: u64, refused: &Refused, out: &mut Vec<Out>) {
        let a = &refused.answer;
        let highest = a.header("fencing-highest").and_then(|h| h.parse().ok());
        self.answer(id, Answer { status: a.status, highest, body: a.body.trim_end().to_owned() }, out);
    }

    /// Carry out what write `id`'s machine said.
    fn carry(&mut self, now: Nanos, id: u64, command: Command, out: &mut Vec<Out>) {
        let Some(p) = self.writes.get_mut(&id) else { return };
        match command {
            Command::Chain(change) => out.push(Out::Chain { id, resource: p.resource, change }),
            Command::AskStore => out.push(Out::Head { id, resource: p.resource }),
            Command::Send(name, value) => {
                p.sent = true;
                out.push(Out::Forward { id, token: p.header, precondition: Some((name, value)) });
                out.push(Out::Timer { at: now + self.settings.upstream_timeout, tag: id });
            }
            // A whole body is lent before it is sent: nothing is held.
            Command::ReleaseBody | Command::Idle => {
                if p.given_up && !p.write.changing() {
                    self.writes.remove(&id);
                }
            }
            Command::Conclude(Some(refused)) => {
                let answered = p.given_up;
                self.writes.remove(&id);
                if !answered {
                    self.refused(id, &refused, out);
                }
            }
            Command::Conclude(None) => {
                if p.given_up {
                    // Its client had its 504; the machine waits for a late answer.
                    return;
                }
                let stored = p.stored.take();
                self.writes.remove(&id);
                let answer = match stored {
                    Some((status @ 200..=299, _)) => Answer { status, highest: None, body: "stored".into() },
                    Some((status, _)) => Answer { status, highest: None, body: format!("the store answered {status}") },
                    None => Answer { status: 502, highest: None, body: "no answer from the store".into() },
                };
                self.answer(id, answer, out);
            }
        }
    }
}

impl Fence for ConditionalFence {
    fn request(&mut self, now: Nanos, req: Request, out: &mut Vec<Out>) {
        let name = self.names[req.resource].clone();
        if now < self.grace_until {
            return out.push(Out::Answer { id: req.id, answer: in_grace(&name) });
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

    fn store_answered(&mut self, now: Nanos, id: u64, status: u16, etag: Option<&str>, out: &mut Vec<Out>) {
        let Some(p) = self.writes.get_mut(&id) else { return };
        if !p.sent || p.stored.is_some() {
            return;
        }
        p.stored = Some((status, etag.map(str::to_owned)));
        let command = p.write.delivered(Delivery::Answered(status, etag.map(str::as_bytes)));
        self.carry(now, id, command, out);
    }

    fn chain_done(&mut self, now: Nanos, id: u64, done: Option<Done>, out: &mut Vec<Out>) {
        let Some(p) = self.writes.get_mut(&id) else { return };
        let command = match done {
            Some(done) => {
                if let Done::Lent(lend) = &done {
                    p.lend = Some(lend.id);
                }
                p.write.chain_done(done, now / MS)
            }
            None => p.write.chain_failed("the chain store's answer was lost"),
        };
        self.carry(now, id, command, out);
    }

    fn head_answered(&mut self, now: Nanos, id: u64, status: u16, etag: Option<&str>, out: &mut Vec<Out>) {
        let Some(p) = self.writes.get_mut(&id) else { return };
        let command = p.write.store_told(status, etag.map(str::as_bytes));
        self.carry(now, id, command, out);
    }

    fn timer(&mut self, now: Nanos, id: u64, out: &mut Vec<Out>) {
        let Some(p) = self.writes.get_mut(&id) else { return };
        if !p.sent || p.given_up || p.stored.is_some() {
            return;
        }
        // Given up on: its client is answered now; the store may still apply it.
        p.given_up = true;
        let (resource, lend) = (p.resource, p.lend);
        out.push(Out::Answer { id, answer: Answer { status: 504, highest: None, body: "upstream timed out".into() } });
        if let (Some(Bug::ReleaseGivenUp), Some(lend)) = (self.bug, lend) {
            let change = Change::Settle { id: lend, answer: fencekeeper_chain::Answer::NotApplied };
            out.push(Out::Chain { id: u64::MAX, resource, change });
        }
        let command = p.write.delivered(Delivery::GivenUp);
        self.carry(now, id, command, out);
    }

    fn wake(&mut self, _now: Nanos, _resource: usize, _out: &mut Vec<Out>) {}

    fn crash(&mut self, _now: Nanos) {
        self.writes.clear();
        self.admits.crash();
    }

    fn restart(&mut self, now: Nanos) {
        self.admits.restart();
        self.grace_until = now + self.settings.start_grace;
    }

    fn mark(&self, resource: usize) -> Option<u64> {
        self.admits.mark(&self.names[resource])
    }
}
