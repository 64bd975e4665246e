//! The ordering gate as a machine: the writes an instance sent that the store may
//! still apply (its *flights*), the admitted writes it holds back for them, and when
//! each held write may go, times out, or turns out stale.
//!
//! The rule is the core's ([`fencekeeper_core::gate::pass`]); this is everything a
//! host did around it, once: registering a flight, holding a write in arrival order,
//! letting held writes go when a lower flight ends, a write given up on holding its
//! resource for the store apply bound, the gate timeout, and the counts. It reads no
//! clock and waits for nothing: a host calls it with the time it read (milliseconds
//! on one clock of its own) and what happened (a write admitted, the store answered,
//! the host gave up, a timer fired), and carries out what it says ([`Next`]): send a
//! write, refuse one, wake it again at some time, tell other instances.
//!
//! The machine ([`Flights`]) holds one instance's own writes. The flights themselves
//! are in a [`Table`] passed to every call, so that instances can share one: the
//! gateway keeps its table in its own memory, the simulator gives several instances
//! one table (the shared gate), and a host whose flights live elsewhere (the proxy's
//! shared data) can hand it the entry it read and write back what changed.
//!
//! A write held here and then let go (`Next::Go { waited: true }`) must be checked
//! against the mark store again before it is sent, when other instances admit on the
//! same marks: one may have admitted a higher token while it waited, which this
//! instance's table never saw.

use crate::gate::{end, End};
use fencekeeper_core::gate::{pass, Flight, Passage, Until};
use fencekeeper_core::Token;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A write's number, unique within its instance.
pub type WriteId = u64;

/// What one resource has in the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The highest token admitted on the resource while it had an entry: a write
    /// below it is stale, even before the higher one reaches the mark store.
    pub highest: Option<Token>,
    /// The writes sent on the resource that the store may still apply.
    pub flights: Vec<Sent>,
    /// Writes that arrived and are being admitted ([`Flights::arrive`]): the entry,
    /// and with it `highest`, stays while one is, so that a write admitted before a
    /// higher one but slower to reach the gate finds it here and is stale.
    pub arriving: usize,
    /// Writes held at the gate on the resource, by every instance sharing the table:
    /// the entry stays while one is, so that it is checked against `highest` when it
    /// goes.
    pub held: usize,
}

/// A flight and whose it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The instance that sent it.
    pub owner: u64,
    /// Its number at that instance.
    pub id: WriteId,
    /// Its token and how long it holds the resource.
    pub flight: Flight,
}

/// The flights of every resource that has any, for one instance or several.
#[derive(Clone, Debug, Default)]
pub struct Table {
    entries: HashMap<String, Entry>,
}

impl Table {
    /// The entry of `resource`, if it has one.
    pub fn entry(&self, resource: &str) -> Option<&Entry> {
        self.entries.get(resource)
    }

    /// How many writes sent on `resource` the store may still apply at `now_ms`.
    pub fn in_flight(&self, resource: &str, now_ms: u64) -> usize {
        self.entry(resource).map_or(0, |e| e.flights.iter().filter(|s| s.flight.live(now_ms)).count())
    }

    /// An instance died: the flights it had unanswered hold their resources until
    /// `until_ms` (the store may still apply them; nobody will say when it did).
    fn orphan(&mut self, owner: u64, until_ms: u64) {
        for sent in self.entries.values_mut().flat_map(|e| e.flights.iter_mut()) {
            if sent.owner == owner && sent.flight.until == Until::Answered {
                sent.flight.until = Until::Deadline(until_ms);
            }
        }
    }

    fn entry_mut(&mut self, resource: &str) -> &mut Entry {
        self.entries.entry(resource.to_owned()).or_default()
    }

    /// Forget the flights of `resource` the store can no longer apply, and the entry
    /// once it has none and no write is arriving or held on it (the mark store keeps
    /// the mark).
    fn tidy(&mut self, resource: &str, now_ms: u64) {
        let Some(entry) = self.entries.get_mut(resource) else { return };
        entry.flights.retain(|s| s.flight.live(now_ms));
        if entry.flights.is_empty() && entry.arriving == 0 && entry.held == 0 {
            self.entries.remove(resource);
        }
    }
}

/// What becomes of a write as it enters the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entered {
    /// Send it now; it holds its resource until [`Flights::answered`] or
    /// [`Flights::given_up`].
    Go,
    /// A higher token was admitted on its resource: refuse it as stale.
    Stale(Token),
    /// Held for lower-token writes the store may still apply: what becomes of it
    /// comes later, as a [`Next`] for its id.
    Held,
}

/// What the host does next, for one of its writes or for its clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Held write `id` may go now (check the mark again first when other instances
    /// admit on the same marks): it holds its resource until answered or given up.
    Go {
        /// The write.
        id: WriteId,
    },
    /// Held write `id` is stale: a higher token was admitted on its resource.
    Stale {
        /// The write.
        id: WriteId,
        /// The higher token (for `fencing-highest`).
        higher: Token,
    },
    /// Held write `id` waited out the gate timeout: refuse it (503). `until`: when
    /// the lower writes it waited for, all given up on, stop holding (a hint for
    /// `Retry-After`), `None` while one is unanswered.
    TimedOut {
        /// The write.
        id: WriteId,
        /// When the writes it waited for stop holding, if known.
        until: Option<u64>,
    },
    /// Call [`Flights::tick`] at this time (milliseconds) or soon after.
    WakeAt(u64),
    /// A flight on this resource ended or changed: instances sharing the table call
    /// [`Flights::changed`] for it.
    Changed(String),
}

/// Where one of the instance's writes is.
#[derive(Clone, Debug)]
enum State {
    /// Held at the gate until `deadline`; `until`: the last retry hint.
    Held { token: Token, deadline: u64, until: Option<u64> },
    /// Sent, not answered.
    Sent,
    /// Given up on: holds its resource until `until`.
    GivenUp { until: u64 },
}

#[derive(Clone, Debug)]
struct Write {
    resource: String,
    state: State,
}

/// One instance's writes at the ordering gate.
#[derive(Debug)]
pub struct Flights {
    owner: u64,
    timeout_ms: u64,
    apply_bound: Duration,
    writes: BTreeMap<WriteId, Write>,
    /// The held writes of each resource, in arrival order.
    held: HashMap<String, Vec<WriteId>>,
}

impl Flights {
    /// Instance `owner`'s gate: a write is held at most `timeout`, and a write given
    /// up on holds its resource for `apply_bound`.
    pub fn new(owner: u64, timeout: Duration, apply_bound: Duration) -> Flights {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        Flights { owner, timeout_ms, apply_bound, writes: BTreeMap::new(), held: HashMap::new() }
    }

    /// How many writes are held now.
    pub fn waiting(&self) -> usize {
        self.held.values().map(Vec::len).sum()
    }

    /// How many writes are held now on `resource`.
    pub fn waiting_on(&self, resource: &str) -> usize {
        self.held.get(resource).map_or(0, Vec::len)
    }

    /// How many writes given up on still hold their resource.
    pub fn holding(&self) -> usize {
        self.writes.values().filter(|w| matches!(w.state, State::GivenUp { .. })).count()
    }

    /// A write on `resource` arrived and goes to be admitted: hold the resource's entry
    /// until it [`Flights::enter`]s the gate or [`Flights::leave`]s (refused).
    pub fn arrive(&mut self, table: &mut Table, resource: &str) {
        table.entry_mut(resource).arriving += 1;
    }

    /// A write that [`Flights::arrive`]d was refused before the gate.
    pub fn leave(&mut self, table: &mut Table, now: u64, resource: &str) {
        let entry = table.entry_mut(resource);
        entry.arriving = entry.arriving.saturating_sub(1);
        table.tidy(resource, now);
    }

    /// Write `id`, admitted on `resource` with `token`, enters the gate at `now`,
    /// having [`Flights::arrive`]d.
    pub fn enter(
        &mut self,
        table: &mut Table,
        now: u64,
        id: WriteId,
        resource: &str,
        token: Token,
        out: &mut Vec<Next>,
    ) -> Entered {
        let entry = table.entry_mut(resource);
        entry.arriving = entry.arriving.saturating_sub(1);
        let flights = entry.flights.iter().map(|s| s.flight);
        match pass(&token, entry.highest.as_ref(), flights, now) {
            Passage::Stale(higher) => {
                table.tidy(resource, now);
                Entered::Stale(higher)
            }
            Passage::Go => {
                self.send(table, id, resource, token);
                Entered::Go
            }
            Passage::Wait { until } => {
                raise(entry, token);
                entry.held += 1;
                let deadline = now.saturating_add(self.timeout_ms);
                let state = State::Held { token, deadline, until };
                self.writes.insert(id, Write { resource: resource.to_owned(), state });
                self.held.entry(resource.to_owned()).or_default().push(id);
                out.push(Next::WakeAt(deadline));
                out.extend(until.map(Next::WakeAt));
                Entered::Held
            }
        }
    }

    /// The store answered write `id`, or it was never sent (refused after it went,
    /// or no connection was made): its flight ends now.
    pub fn answered(&mut self, table: &mut Table, now: u64, id: WriteId, out: &mut Vec<Next>) {
        let Some(write) = self.writes.remove(&id) else { return };
        match write.state {
            State::Sent => self.land(table, now, id, &write.resource, out),
            // Given up on: it holds until its deadline whatever comes back later.
            State::GivenUp { .. } => {
                self.writes.insert(id, write);
            }
            // Its client went away while it was held: nothing was sent.
            State::Held { .. } => self.unhold(table, now, id, &write.resource),
        }
    }

    /// The host gave up on write `id` after it may have been sent: the store may
    /// still apply it, so it holds its resource for the store apply bound.
    pub fn given_up(&mut self, table: &mut Table, now: u64, id: WriteId, out: &mut Vec<Next>) {
        let Some(write) = self.writes.get_mut(&id).filter(|w| matches!(w.state, State::Sent)) else { return };
        let End::At(until) = end(false, now, self.apply_bound) else {
            return self.answered(table, now, id, out);
        };
        write.state = State::GivenUp { until };
        let resource = write.resource.clone();
        let owner = self.owner;
        if let Some(sent) = table.entry_mut(&resource).flights.iter_mut().find(|s| s.owner == owner && s.id == id) {
            sent.flight.until = Until::Deadline(until);
        }
        out.push(Next::WakeAt(until));
        out.push(Next::Changed(resource.clone()));
        // The writes held behind it now know when it stops holding.
        self.recheck(table, now, &resource, out);
    }

    /// The host's timer fired at `now`: held writes past the gate timeout are refused,
    /// flights given up on whose bound has passed end, and what they held goes.
    pub fn tick(&mut self, table: &mut Table, now: u64, out: &mut Vec<Next>) {
        let ended: Vec<WriteId> = self
            .writes
            .iter()
            .filter(|(_, w)| matches!(w.state, State::GivenUp { until } if until <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in ended {
            if let Some(write) = self.writes.remove(&id) {
                self.land(table, now, id, &write.resource, out);
            }
        }
        let timed_out: Vec<WriteId> = self
            .writes
            .iter()
            .filter(|(_, w)| matches!(w.state, State::Held { deadline, .. } if deadline <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in timed_out {
            let Some(write) = self.writes.remove(&id) else { continue };
            if let State::Held { until, .. } = write.state {
                out.push(Next::TimedOut { id, until });
            }
            self.unhold(table, now, id, &write.resource);
        }
        // Other instances' flights in a shared table may have passed their deadlines.
        let resources: Vec<String> = self.held.keys().cloned().collect();
        for resource in resources {
            self.recheck(table, now, &resource, out);
        }
    }

    /// Another instance changed a flight on `resource` in the table this one shares.
    pub fn changed(&mut self, table: &mut Table, now: u64, resource: &str, out: &mut Vec<Next>) {
        if self.held.contains_key(resource) {
            self.recheck(table, now, resource, out);
        }
    }

    /// Register write `id` as sent on `resource`.
    fn send(&mut self, table: &mut Table, id: WriteId, resource: &str, token: Token) {
        let entry = table.entry_mut(resource);
        raise(entry, token);
        let flight = Flight { token, until: Until::Answered };
        entry.flights.push(Sent { owner: self.owner, id, flight });
        self.writes.insert(id, Write { resource: resource.to_owned(), state: State::Sent });
    }

    /// End write `id`'s flight on `resource` and let what it held go.
    fn land(&mut self, table: &mut Table, now: u64, id: WriteId, resource: &str, out: &mut Vec<Next>) {
        let owner = self.owner;
        if let Some(entry) = table.entries.get_mut(resource) {
            entry.flights.retain(|s| !(s.owner == owner && s.id == id));
        }
        out.push(Next::Changed(resource.to_owned()));
        self.recheck(table, now, resource, out);
    }

    /// Take held write `id` off `resource`'s queue.
    fn unhold(&mut self, table: &mut Table, now: u64, id: WriteId, resource: &str) {
        if let Some(queue) = self.held.get_mut(resource) {
            queue.retain(|h| *h != id);
            if queue.is_empty() {
                self.held.remove(resource);
            }
        }
        unheld(table, resource, 1);
        table.tidy(resource, now);
    }

    /// Ask the gate again about every write held on `resource`, in arrival order.
    fn recheck(&mut self, table: &mut Table, now: u64, resource: &str, out: &mut Vec<Next>) {
        let queue = self.held.remove(resource).unwrap_or_default();
        let mut still = Vec::new();
        for id in queue {
            let Some(write) = self.writes.get_mut(&id) else { continue };
            let State::Held { token, until: ref mut hint, .. } = write.state else { continue };
            let entry = table.entry_mut(resource);
            let flights = entry.flights.iter().map(|s| s.flight);
            match pass(&token, entry.highest.as_ref(), flights, now) {
                Passage::Go => {
                    self.writes.remove(&id);
                    unheld(table, resource, 1);
                    self.send(table, id, resource, token);
                    out.push(Next::Go { id });
                }
                Passage::Stale(higher) => {
                    self.writes.remove(&id);
                    unheld(table, resource, 1);
                    out.push(Next::Stale { id, higher });
                }
                Passage::Wait { until } => {
                    if until.is_some() && until != *hint {
                        out.extend(until.map(Next::WakeAt));
                    }
                    *hint = until;
                    still.push(id);
                }
            }
        }
        if !still.is_empty() {
            self.held.insert(resource.to_owned(), still);
        }
        table.tidy(resource, now);
    }

    /// The instance dies, its memory lost, while `table` lives on (shared with other
    /// instances, as a registry outside the process would): the flights it had
    /// unanswered hold their resources until `until` (the store may still apply them;
    /// nobody will say when it did), its held writes are gone, and the instances
    /// sharing the table are told of every resource it touched. (A write that
    /// [`Flights::arrive`]d and has not entered must [`Flights::leave`] first.)
    pub fn abandon(self, table: &mut Table, now: u64, until: u64, out: &mut Vec<Next>) {
        table.orphan(self.owner, until);
        let mut touched: Vec<String> = self.held.keys().cloned().collect();
        for (resource, queue) in &self.held {
            unheld(table, resource, queue.len());
        }
        for write in self.writes.values() {
            if !matches!(write.state, State::Held { .. }) {
                touched.push(write.resource.clone());
            }
        }
        touched.sort();
        touched.dedup();
        for resource in touched {
            table.tidy(&resource, now);
            out.push(Next::Changed(resource));
        }
        out.push(Next::WakeAt(until));
    }
}

fn unheld(table: &mut Table, resource: &str, n: usize) {
    let entry = table.entry_mut(resource);
    entry.held = entry.held.saturating_sub(n);
}

fn raise(entry: &mut Entry, token: Token) {
    if entry.highest.is_none_or(|h| token > h) {
        entry.highest = Some(token);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(5_000);
    const BOUND: Duration = Duration::from_millis(60_000);

    fn t(n: u64) -> Token {
        Token::from_parts(&[n]).unwrap()
    }

    fn gate() -> (Flights, Table, Vec<Next>) {
        (Flights::new(1, TIMEOUT, BOUND), Table::default(), Vec::new())
    }

    #[test]
    fn a_higher_token_is_held_while_a_lower_one_is_in_flight_then_goes() {
        let (mut g, mut table, mut out) = gate();
        assert_eq!(g.enter(&mut table, 0, 1, "r", t(33), &mut out), Entered::Go);
        assert_eq!(g.enter(&mut table, 0, 2, "r", t(34), &mut out), Entered::Held);
        assert_eq!(out, [Next::WakeAt(5_000)]);
        assert_eq!((g.waiting(), g.waiting_on("r"), table.in_flight("r", 0)), (1, 1, 1));
        out.clear();
        g.answered(&mut table, 10, 1, &mut out);
        assert_eq!(out, [Next::Changed("r".into()), Next::Go { id: 2 }]);
        assert_eq!((g.waiting(), table.in_flight("r", 10)), (0, 1));
        g.answered(&mut table, 20, 2, &mut out);
        assert!(table.entry("r").is_none(), "an idle resource leaves the table");
    }

    #[test]
    fn equal_tokens_and_other_resources_go_together() {
        let (mut g, mut table, mut out) = gate();
        assert_eq!(g.enter(&mut table, 0, 1, "r", t(33), &mut out), Entered::Go);
        assert_eq!(g.enter(&mut table, 0, 2, "r", t(33), &mut out), Entered::Go);
        assert_eq!(g.enter(&mut table, 0, 3, "s", t(30), &mut out), Entered::Go);
        assert!(out.is_empty());
    }

    #[test]
    fn a_held_write_overtaken_by_a_higher_one_is_stale_and_the_higher_goes() {
        let (mut g, mut table, mut out) = gate();
        g.enter(&mut table, 0, 1, "r", t(33), &mut out);
        assert_eq!(g.enter(&mut table, 0, 2, "r", t(34), &mut out), Entered::Held);
        assert_eq!(g.enter(&mut table, 0, 3, "r", t(35), &mut out), Entered::Held);
        // A lower one arriving now is stale at once: 35 was admitted.
        assert_eq!(g.enter(&mut table, 0, 4, "r", t(34), &mut out), Entered::Stale(t(35)));
        out.clear();
        g.answered(&mut table, 1, 1, &mut out);
        assert_eq!(out, [Next::Changed("r".into()), Next::Stale { id: 2, higher: t(35) }, Next::Go { id: 3 }]);
    }

    #[test]
    fn a_write_held_past_the_timeout_is_refused_with_the_hint_of_when_to_retry() {
        let (mut g, mut table, mut out) = gate();
        g.enter(&mut table, 0, 1, "r", t(33), &mut out);
        g.enter(&mut table, 0, 2, "r", t(34), &mut out);
        out.clear();
        g.tick(&mut table, 4_999, &mut out);
        assert!(out.is_empty());
        g.tick(&mut table, 5_000, &mut out);
        assert_eq!(out, [Next::TimedOut { id: 2, until: None }]);
        assert_eq!(g.waiting(), 0);
        // The lower write's answer, later, lets nothing go and leaves nothing behind.
        out.clear();
        g.answered(&mut table, 6_000, 1, &mut out);
        assert_eq!(out, [Next::Changed("r".into())]);
        assert!(table.entry("r").is_none());
    }

    #[test]
    fn a_write_given_up_on_holds_its_resource_for_the_bound_then_lets_the_held_go() {
        let (mut g, mut table, mut out) = gate();
        g.enter(&mut table, 0, 1, "r", t(33), &mut out);
        g.enter(&mut table, 100, 2, "r", t(34), &mut out);
        out.clear();
        g.given_up(&mut table, 1_000, 1, &mut out);
        assert_eq!(out, [Next::WakeAt(61_000), Next::Changed("r".into()), Next::WakeAt(61_000)]);
        assert_eq!(g.holding(), 1);
        // An answer that comes after the give-up does not end it early.
        out.clear();
        g.answered(&mut table, 2_000, 1, &mut out);
        assert!(out.is_empty() && g.holding() == 1);
        g.tick(&mut table, 5_100, &mut out);
        assert_eq!(out, [Next::TimedOut { id: 2, until: Some(61_000) }]);
        out.clear();
        assert_eq!(g.enter(&mut table, 60_000, 3, "r", t(35), &mut out), Entered::Held);
        out.clear();
        g.tick(&mut table, 61_000, &mut out);
        assert_eq!(out, [Next::Changed("r".into()), Next::Go { id: 3 }]);
        assert_eq!(g.holding(), 0);
    }

    #[test]
    fn a_write_admitted_before_a_higher_one_but_slower_to_the_gate_is_stale() {
        let (mut g, mut table, mut out) = gate();
        g.arrive(&mut table, "r"); // 33, admitted first, is slow to reach the gate
        g.arrive(&mut table, "r");
        assert_eq!(g.enter(&mut table, 0, 2, "r", t(34), &mut out), Entered::Go);
        g.answered(&mut table, 1, 2, &mut out);
        assert_eq!(g.enter(&mut table, 2, 1, "r", t(33), &mut out), Entered::Stale(t(34)));
        assert!(table.entry("r").is_none());
        g.arrive(&mut table, "r");
        g.leave(&mut table, 3, "r");
        assert!(table.entry("r").is_none(), "a write refused before the gate leaves nothing");
    }

    #[test]
    fn a_held_write_whose_client_went_away_leaves_nothing_behind() {
        let (mut g, mut table, mut out) = gate();
        g.enter(&mut table, 0, 1, "r", t(33), &mut out);
        g.enter(&mut table, 0, 2, "r", t(34), &mut out);
        out.clear();
        g.answered(&mut table, 1, 2, &mut out);
        assert!(out.is_empty() && g.waiting() == 0);
        g.answered(&mut table, 2, 1, &mut out);
        assert!(table.entry("r").is_none());
    }

    #[test]
    fn instances_sharing_a_table_hold_each_others_writes_and_are_told_of_changes() {
        let (mut a, mut b) = (Flights::new(1, TIMEOUT, BOUND), Flights::new(2, TIMEOUT, BOUND));
        let (mut table, mut out) = (Table::default(), Vec::new());
        assert_eq!(a.enter(&mut table, 0, 1, "r", t(33), &mut out), Entered::Go);
        // The same number at another instance is another write.
        assert_eq!(b.enter(&mut table, 0, 1, "r", t(34), &mut out), Entered::Held);
        out.clear();
        a.answered(&mut table, 5, 1, &mut out);
        assert_eq!(out, [Next::Changed("r".into())]);
        out.clear();
        b.changed(&mut table, 5, "r", &mut out);
        assert_eq!(out, [Next::Go { id: 1 }]);
    }

    #[test]
    fn a_dead_instances_flights_hold_until_the_store_can_no_longer_apply_them() {
        let (mut a, mut b) = (Flights::new(1, TIMEOUT, BOUND), Flights::new(2, TIMEOUT, BOUND));
        let (mut table, mut out) = (Table::default(), Vec::new());
        a.enter(&mut table, 0, 1, "r", t(33), &mut out);
        a.enter(&mut table, 0, 2, "r", t(34), &mut out);
        out.clear();
        a.abandon(&mut table, 10, 3_000, &mut out);
        assert_eq!(out, [Next::Changed("r".into()), Next::WakeAt(3_000)]);
        assert_eq!(table.entry("r").map(|e| (e.flights.len(), e.held)), Some((1, 0)), "33 holds, 34 is gone");
        assert_eq!(b.enter(&mut table, 10, 1, "r", t(35), &mut out), Entered::Held);
        out.clear();
        b.tick(&mut table, 2_999, &mut out);
        assert!(out.is_empty(), "the store may still apply 33: {out:?}");
        b.tick(&mut table, 3_000, &mut out);
        assert_eq!(out, [Next::Go { id: 1 }]);
    }

    #[test]
    fn a_write_held_at_one_instance_keeps_the_highest_another_sent_past_it() {
        let (mut a, mut b) = (Flights::new(1, TIMEOUT, BOUND), Flights::new(2, TIMEOUT, BOUND));
        let (mut table, mut out) = (Table::default(), Vec::new());
        assert_eq!(b.enter(&mut table, 0, 1, "r", t(33), &mut out), Entered::Go);
        assert_eq!(a.enter(&mut table, 0, 1, "r", t(34), &mut out), Entered::Held);
        assert_eq!(b.enter(&mut table, 0, 2, "r", t(35), &mut out), Entered::Held);
        out.clear();
        // 33 lands: B lets its own 35 go at once, and 35 lands before A hears.
        b.answered(&mut table, 1, 1, &mut out);
        assert!(out.contains(&Next::Go { id: 2 }), "{out:?}");
        b.answered(&mut table, 2, 2, &mut out);
        out.clear();
        a.changed(&mut table, 3, "r", &mut out);
        assert_eq!(out, [Next::Stale { id: 1, higher: t(35) }], "34 must not go after 35 was applied");
        assert!(table.entry("r").is_none());
    }
}
