//! Conditional writes through Envoy (`conditional_writes`): the store's own
//! compare-and-swap enforces the order the filter decided, whenever a write arrives.
//!
//! Each admitted PUT or DELETE is *lent* on its resource's version chain in etcd
//! (`fencekeeper_chain`, the record the gateway keeps, under the same key) before
//! the store can apply it, and goes with `If-Match` on the version the store gave the
//! last write the filter saw applied (`If-None-Match: *` while the object is
//! absent). The store's answer settles the chain; a write given up on stays lent, so
//! no later write may bring the store back to the version it is conditioned on.
//!
//! Envoy sends a request's headers upstream before the filter sees its body, and the
//! version a PUT makes (its body's MD5, on S3) is known only from the body. So a
//! write whose body is still to come is lent in two steps: at the headers the chain
//! is read for the precondition they carry (nothing is written), and the body is
//! held in Envoy until it is whole; then the write is lent, with the version it makes
//! checked against every open lend, atomically, and only then is the body released.
//! The store cannot apply a write before it has the whole body, so the lend exists
//! before the write can apply, as in the gateway. A write whose body is empty (a
//! DELETE, or an empty PUT) is lent at once, before its headers go.

use crate::etcd::{self, Method, Response};
use crate::Filter;
use fencekeeper_chain::{self as chain, Chain, Change, Done};
use fencekeeper_etcd_wire::grpc;

/// How many lost compare-and-swap races one change of a chain tolerates. A lost race
/// costs one call (the swap reads the record back), and every round someone wins.
/// A settle that gives up leaves its write lent until an operator releases it, so it
/// tries much longer than a lend, which only refuses its write (503).
const MAX_ROUNDS: u32 = 64;
const MAX_SETTLE_ROUNDS: u32 = 1024;

/// The next thing to do with a change in flight.
pub enum Step {
    /// Send this Txn to etcd and wait for its answer.
    Send(Vec<u8>),
    /// The change is done (recorded if it changed the chain).
    Done(Done),
    /// The change could not be made: why, on one line.
    Failed(String),
}

/// One change of `resource`'s chain: read, change, and swap in only if nobody
/// changed the record meanwhile (else again, from the record the lost swap read).
pub struct Update {
    resource: String,
    key: String,
    change: Change,
    rounds: u32,
    /// The swap in flight: the record it puts, and what it means once it succeeds.
    swapping: Option<(Vec<u8>, Done)>,
    /// The record last seen in etcd or put there (`Some(None)`: no record).
    last: Option<Option<Vec<u8>>>,
    /// The change is being tried on a record this request saw earlier, not read now.
    optimistic: bool,
}

impl Update {
    /// A change of `resource`'s chain (under `key_prefix`) and its first call: a read,
    /// or, given the record this request last saw (`known`), a swap from it at once
    /// (a lost swap reads the record back in the same round trip). A record seen
    /// earlier may be outdated, so only a swap is tried on it: an outcome that writes
    /// nothing (a refusal) is decided on a fresh read.
    pub fn start(
        key_prefix: &str,
        resource: &str,
        change: Change,
        known: Option<Option<Vec<u8>>>,
    ) -> (Update, Vec<u8>) {
        let mut update = Update::new(key_prefix, resource, change, known.is_some());
        let read = grpc::read_txn(update.key.as_bytes());
        if let Some(raw) = known {
            if let Step::Send(swap) = update.apply(raw) {
                return (update, swap);
            }
            update.swapping = None;
        }
        update.optimistic = false;
        (update, read)
    }

    /// A change of `resource`'s chain decided on `raw`, the record (`None`: no
    /// record) a read of this request's returned just now: the read its admit's Txn
    /// made beside the mark, which is as fresh as a read of the change's own would be,
    /// one round trip earlier. Its first step: a swap to send, or done with nothing to
    /// write (a peek, a refusal), or failed (a damaged record).
    pub fn decided_on(key_prefix: &str, resource: &str, change: Change, raw: Option<Vec<u8>>) -> (Update, Step) {
        let mut update = Update::new(key_prefix, resource, change, false);
        let step = update.apply(raw);
        (update, step)
    }

    fn new(key_prefix: &str, resource: &str, change: Change, optimistic: bool) -> Update {
        Update {
            resource: resource.to_owned(),
            key: fencekeeper_etcd_wire::chain_key(key_prefix, resource),
            change,
            rounds: 0,
            swapping: None,
            last: None,
            optimistic,
        }
    }

    /// The record last seen in etcd or put there by this change (`Some(None)`: no
    /// record), for the request's next change to start from.
    pub fn last(&self) -> Option<Option<Vec<u8>>> {
        self.last.clone()
    }

    /// etcd answered the last call.
    pub fn answered(&mut self, response: &Response) -> Step {
        let answer = match etcd::txn_answer(response) {
            Ok(answer) => answer,
            Err(e) => return Step::Failed(format!("etcd did not answer the version chain's read or swap: {e}")),
        };
        if let (Some((record, done)), true) = (&self.swapping, answer.succeeded) {
            self.last = Some(Some(record.clone()));
            return Step::Done(done.clone());
        }
        self.swapping = None;
        self.optimistic = false;
        // A read's one operation, or a lost swap's read-back.
        match answer.read(0) {
            Ok(kvs) => self.apply(kvs.into_iter().next().map(|kv| kv.value)),
            Err(e) => Step::Failed(format!("etcd's answer lacks the version chain's read: {}", e.0)),
        }
    }

    /// Change the chain `raw` records (none: a new chain), and swap it in if it changed.
    fn apply(&mut self, raw: Option<Vec<u8>>) -> Step {
        if !self.optimistic {
            self.last = Some(raw.clone());
        }
        let mut chain = match raw.as_deref().map(|bytes| chain::decode(&self.resource, bytes)) {
            None => Chain::new(),
            Some(Ok(chain)) => chain,
            Some(Err(e)) => {
                let resource = fencekeeper_etcd_wire::excerpt(&self.resource);
                return Step::Failed(format!(
                    "the version chain of {resource} in etcd is damaged: {e}; it is not trusted (inspect it with \
                     `fencekeeper marks --etcd URL --chain RESOURCE`)"
                ));
            }
        };
        let before = chain.clone();
        let done = self.change.apply(&mut chain);
        if chain == before {
            return Step::Done(done);
        }
        let most = if matches!(self.change, Change::Settle { .. }) { MAX_SETTLE_ROUNDS } else { MAX_ROUNDS };
        if self.rounds >= most {
            return Step::Failed(format!("gave up after {most} lost compare-and-swap races on the version chain"));
        }
        self.rounds += 1;
        let record = chain::encode(&self.resource, &chain).into_bytes();
        let swap = grpc::swap_txn(self.key.as_bytes(), raw.as_deref(), &record);
        self.swapping = Some((record, done));
        Step::Send(swap)
    }
}

/// Send one Txn of a chain change to etcd, with the VM's etcd token if a user is
/// configured (the write's admission authenticated already).
pub fn send(f: &Filter, message: &[u8]) -> Result<u32, String> {
    let e = f.config.etcd.as_ref().ok_or("conditional writes need etcd")?;
    let token = f.auth.as_ref().and_then(|a| a.token()).map(|(token, _)| token);
    if f.auth.is_some() && token.is_none() {
        return Err("not authenticated to etcd (the token was dropped): retry".to_owned());
    }
    etcd::call(e, Method::Txn, token.as_deref(), message)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_chain::{Answer, Refusal, Term, Version};
    use fencekeeper_core::token;
    use fencekeeper_etcd_wire::{grpc::txn_answer, KeyValue};

    fn kv(value: &[u8]) -> KeyValue {
        KeyValue { key: b"k".to_vec(), value: value.to_vec(), create_revision: 3, mod_revision: 3 }
    }

    fn read(value: Option<&[u8]>) -> Response {
        let kvs: Vec<KeyValue> = value.map(kv).into_iter().collect();
        Ok(txn_answer(true, 9, &[Some(&kvs)]))
    }

    fn tag(s: &str) -> Version {
        Version::Tag(format!("\"{s}\""))
    }

    #[test]
    fn a_lend_reads_swaps_and_on_a_lost_race_changes_the_record_it_read_back() {
        let (mut u, first) = Update::start(
            "/p/",
            "r",
            Change::Lend { token: token!("5"), makes: None, on: None, term: Term::UNBOUNDED },
            None,
        );
        assert_eq!(first, grpc::read_txn(b"/p.chains/r"));
        let Step::Send(swap) = u.answered(&read(None)) else { panic!("a new chain is swapped in") };
        assert_eq!(swap, {
            let mut c = Chain::new();
            c.lend(token!("5"), None, Term::UNBOUNDED).unwrap();
            grpc::swap_txn(b"/p.chains/r", None, chain::encode("r", &c).as_bytes())
        });
        // Someone else lent token 7 meanwhile: the lend of 5 is now stale.
        let mut theirs = Chain::new();
        theirs.lend(token!("7"), None, Term::UNBOUNDED).unwrap();
        let record = chain::encode("r", &theirs);
        let lost = Ok(txn_answer(false, 10, &[Some(&[kv(record.as_bytes())])]));
        assert!(matches!(u.answered(&lost), Step::Done(Done::Refused(Refusal::Stale(t))) if t == token!("7")));
    }

    #[test]
    fn a_committed_swap_reports_the_lend_and_a_peek_never_writes() {
        let (mut u, _) = Update::start(
            "/p/",
            "r",
            Change::Lend { token: token!("5"), makes: None, on: None, term: Term::UNBOUNDED },
            None,
        );
        assert!(matches!(u.answered(&read(None)), Step::Send(_)));
        let committed = Ok(txn_answer(true, 11, &[]));
        assert!(matches!(u.answered(&committed), Step::Done(Done::Lent(l)) if l.on == Version::Absent));
        let (mut peek, _) = Update::start("/p/", "r", Change::Peek(token!("5"), Term::UNBOUNDED), None);
        assert!(matches!(peek.answered(&read(None)), Step::Done(Done::Lent(l)) if l.on == Version::Absent));
    }

    #[test]
    fn a_lend_on_another_version_than_the_headers_carried_is_not_recorded() {
        let mut c = Chain::new();
        let l = c.lend(token!("5"), None, Term::UNBOUNDED).unwrap();
        c.settle(l.id, &Answer::Applied(Some(tag("b"))));
        let record = chain::encode("r", &c);
        let change = Change::Lend {
            token: token!("6"),
            makes: Some(tag("c")),
            on: Some(Version::Absent),
            term: Term::UNBOUNDED,
        };
        let (mut u, _) = Update::start("/p/", "r", change, None);
        let step = u.answered(&read(Some(record.as_bytes())));
        assert!(matches!(step, Step::Done(Done::Moved { carried: Version::Absent, now }) if now == tag("b")));
    }

    #[test]
    fn a_damaged_chain_or_a_failed_call_is_a_failure_never_a_new_chain() {
        let mut record = chain::encode("r", &Chain::new()).into_bytes();
        record[5] ^= 1;
        let (mut u, _) = Update::start("/p/", "r", Change::Peek(token!("5"), Term::UNBOUNDED), None);
        assert!(matches!(u.answered(&read(Some(&record))), Step::Failed(why) if why.contains("damaged")));
        let other = chain::encode("q", &Chain::new());
        assert!(matches!(u.answered(&read(Some(other.as_bytes()))), Step::Failed(_)), "another resource's record");
        let down = Err(grpc::Status { code: 14, message: "no healthy upstream".into() });
        assert!(matches!(u.answered(&down), Step::Failed(_)));
        assert!(matches!(u.answered(&Ok(txn_answer(true, 9, &[]))), Step::Failed(why) if why.contains("lacks")));
    }

    #[test]
    fn a_known_record_is_swapped_from_at_once_and_only_a_swap_is_trusted_to_it() {
        // The lend swaps from the record the peek read: no read first.
        let change = Change::Lend { token: token!("5"), makes: None, on: Some(Version::Absent), term: Term::UNBOUNDED };
        let (mut u, first) = Update::start("/p/", "r", change, Some(None));
        let mut lent = Chain::new();
        lent.lend(token!("5"), None, Term::UNBOUNDED).unwrap();
        let record = chain::encode("r", &lent);
        assert_eq!(first, grpc::swap_txn(b"/p.chains/r", None, record.as_bytes()));
        assert!(matches!(u.answered(&Ok(txn_answer(true, 11, &[]))), Step::Done(Done::Lent(_))));
        assert_eq!(u.last(), Some(Some(record.clone().into_bytes())), "the settle starts from what was put");
        // A known record that would refuse (a version unknown in it) is not trusted:
        // the chain is read again.
        let mut unknown = Chain::new();
        unknown.current = None;
        let old = chain::encode("r", &unknown).into_bytes();
        let change = Change::Lend { token: token!("6"), makes: None, on: None, term: Term::UNBOUNDED };
        let (mut u, first) = Update::start("/p/", "r", change, Some(Some(old)));
        assert_eq!(first, grpc::read_txn(b"/p.chains/r"));
        assert!(matches!(u.answered(&read(Some(record.as_bytes()))), Step::Send(_)), "the fresh record lends");
    }

    #[test]
    fn a_change_decided_on_the_record_the_admit_read_makes_no_read_of_its_own() {
        // A peek on it is done at once: no call at all.
        let (peek, step) = Update::decided_on("/p/", "r", Change::Peek(token!("5"), Term::UNBOUNDED), None);
        assert!(matches!(step, Step::Done(Done::Lent(l)) if l.on == Version::Absent));
        assert_eq!(peek.last(), Some(None), "the next change swaps from the record read");
        // A lend on it is its swap, first.
        let change = Change::Lend { token: token!("5"), makes: None, on: None, term: Term::UNBOUNDED };
        let (mut lend, step) = Update::decided_on("/p/", "r", change, None);
        let mut lent = Chain::new();
        lent.lend(token!("5"), None, Term::UNBOUNDED).unwrap();
        let record = chain::encode("r", &lent);
        assert!(matches!(&step, Step::Send(swap) if *swap == grpc::swap_txn(b"/p.chains/r", None, record.as_bytes())));
        assert!(matches!(lend.answered(&Ok(txn_answer(true, 11, &[]))), Step::Done(Done::Lent(_))));
        // A refusal on it stands (the record is as fresh as a read now), and a damaged
        // one fails, never a new chain.
        let mut theirs = Chain::new();
        theirs.lend(token!("7"), None, Term::UNBOUNDED).unwrap();
        let higher = chain::encode("r", &theirs).into_bytes();
        let (_, step) = Update::decided_on("/p/", "r", Change::Peek(token!("5"), Term::UNBOUNDED), Some(higher));
        assert!(matches!(step, Step::Done(Done::Refused(Refusal::Stale(t))) if t == token!("7")));
        let mut damaged = record.into_bytes();
        damaged[5] ^= 1;
        let (_, step) = Update::decided_on("/p/", "r", Change::Peek(token!("5"), Term::UNBOUNDED), Some(damaged));
        assert!(matches!(step, Step::Failed(why) if why.contains("damaged")));
    }

    #[test]
    fn a_settle_that_changes_nothing_writes_nothing() {
        let (mut u, _) = Update::start("/p/", "r", Change::Settle { id: 4, answer: Answer::NotApplied }, None);
        assert!(matches!(u.answered(&read(None)), Step::Done(Done::Chain(_))));
        let (mut learn, _) = Update::start("/p/", "r", Change::Learn(tag("a")), None);
        assert!(
            matches!(learn.answered(&read(None)), Step::Done(Done::Chain(c)) if c.current == Some(Version::Absent))
        );
    }
}
