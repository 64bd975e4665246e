//! Concurrent confirms of one resource share one etcd Txn, and the batches of
//! different resources that are ready together share one too (`send_ready`).
//!
//! A holder writing again presents the token equal to the mark, and etcd must say
//! the mark has not moved: a compare without a put. Under load many such checks of
//! one resource are in flight on a worker at once, each one Txn. Here they queue
//! behind the Txn in flight, and the next Txn answers all of them: the pattern of
//! Raft's ReadIndex, on the proxy's side of the wire.
//!
//! Linearizable, because a request is only ever answered by a Txn that *began after
//! it arrived*: it joins the batch that has not been sent yet, never the one in
//! flight (a Txn sent before the request arrived could miss an advance that
//! completed before it, and admit a token already superseded). A Txn tells the mark
//! etcd held when it ran; every request of the batch is decided on that mark.
//!
//! The root context sends every batch's Txn and answers its requests (switching the
//! effective context to each): a request's own context may end before an answer it
//! did not ask for arrives, the root's lives as long as the VM. A request that joins
//! an idle resource wakes the root through a shared queue of this VM's own.

use crate::etcd::{self, EtcdError, Method, Outcome, Response};
use crate::reply::Reply;
use crate::{Filter, Tally};
use fencekeeper_core::decision::decide_token;
use fencekeeper_core::refusal::{Forgotten, NoVerdict};
use fencekeeper_core::{Policy, Token, Verdict};
use fencekeeper_etcd_wire::grpc::MAX_CONFIRMS_PER_TXN;
use proxy_wasm::hostcalls;
use proxy_wasm::types::Action;
use std::cell::RefCell;
use std::collections::HashMap;

/// A request waiting for a batch's Txn.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiter {
    /// The token it presented (equal to the mark the worker knew when it arrived).
    pub token: Token,
    /// How it is answered (its context among it).
    pub reply: Reply,
}

/// One resource's queue: the batch in flight and the one waiting for it.
#[derive(Default)]
struct Queue {
    flying: Option<Flight>,
    waiting: Vec<Waiter>,
}

/// A batch whose Txn is in flight.
#[derive(Debug, Default, PartialEq)]
pub struct Flight {
    /// The token the Txn compares with the mark.
    pub compare: Option<Token>,
    /// The requests it answers.
    pub waiters: Vec<Waiter>,
}

/// The batches of one VM, by resource, and the Txns in flight, by call.
#[derive(Default)]
pub struct Confirms {
    queues: RefCell<HashMap<String, Queue>>,
    /// The resources whose batches each call carries, in the order of its Txn.
    calls: RefCell<HashMap<u32, Vec<String>>>,
}

/// A batch ready to be sent: its resource and the token its Txn compares (the
/// highest presented: the mark most likely current).
pub struct Ready {
    /// The resource.
    pub resource: String,
    /// The token the Txn compares with the mark.
    pub compare: Token,
}

impl Confirms {
    /// Queue a request for the next Txn of `resource`. True when the root must be
    /// woken: nothing of this resource was queued or in flight.
    pub fn join(&self, resource: &str, waiter: Waiter) -> bool {
        let mut queues = self.queues.borrow_mut();
        let queue = queues.entry(resource.to_owned()).or_default();
        let idle = queue.flying.is_none() && queue.waiting.is_empty();
        queue.waiting.push(waiter);
        idle
    }

    /// A request that joined `resource`'s queue ended: it is answered by no batch.
    pub fn leave(&self, resource: &str, context: u32) {
        let mut queues = self.queues.borrow_mut();
        let Some(queue) = queues.get_mut(resource) else { return };
        queue.waiting.retain(|w| w.reply.context != context);
        if let Some(flying) = queue.flying.as_mut() {
            flying.waiters.retain(|w| w.reply.context != context);
        }
        if queue.flying.is_none() && queue.waiting.is_empty() {
            queues.remove(resource);
        }
    }

    /// Every batch that can be sent now (waiting, and nothing of its resource in
    /// flight), each moved to in flight.
    pub fn ready(&self) -> Vec<Ready> {
        let mut queues = self.queues.borrow_mut();
        let mut out = Vec::new();
        for (resource, queue) in queues.iter_mut() {
            if queue.flying.is_some() {
                continue;
            }
            let mut tokens = queue.waiting.iter().map(|w| w.token);
            let Some(first) = tokens.next() else { continue };
            // Tokens of another arity are not comparable, and never the highest.
            let compare = tokens.fold(first, |best, t| if t > best { t } else { best });
            queue.flying = Some(Flight { compare: Some(compare), waiters: std::mem::take(&mut queue.waiting) });
            out.push(Ready { resource: resource.clone(), compare });
        }
        out
    }

    /// The Txn of these resources' batches in flight was sent as call `token`.
    pub fn sent(&self, token: u32, resources: Vec<String>) {
        self.calls.borrow_mut().insert(token, resources);
    }

    /// The Txn of `resource`'s batch could not be sent, or was answered: the batch
    /// (empty when there is none in flight).
    pub fn landed(&self, resource: &str) -> Flight {
        let mut queues = self.queues.borrow_mut();
        let Some(queue) = queues.get_mut(resource) else { return Flight::default() };
        let flying = queue.flying.take().unwrap_or_default();
        if queue.waiting.is_empty() {
            queues.remove(resource);
        }
        flying
    }

    /// The resources whose batches call `token` carries, forgetting the call.
    pub fn answered(&self, token: u32) -> Option<Vec<String>> {
        self.calls.borrow_mut().remove(&token)
    }
}

/// Send every batch that is ready (from the root context, so the answer comes back
/// to the root), up to [`MAX_CONFIRMS_PER_TXN`] resources' batches in one Txn; a
/// batch whose Txn cannot be sent is answered as undecided.
pub fn send_ready(f: &Filter) {
    let Some(e) = &f.config.etcd else { return };
    let ready = f.confirms.ready();
    for group in ready.chunks(MAX_CONFIRMS_PER_TXN) {
        let fail = |cause: String| {
            for r in group {
                answer_all(f, &r.resource, Err(EtcdError(cause.clone())), Ok(None));
            }
        };
        // The host ties a call to the effective context and cancels it when that
        // context ends: after answering requests it is the last one answered.
        if let Err(s) = hostcalls::set_effective_context(f.root) {
            fail(format!("cannot send the batch from the root context ({s:?})"));
            continue;
        }
        // Each mark compared with the token its batch presented, without a put; when
        // any moved, every one read back.
        let marks: Vec<(&str, Token)> = group.iter().map(|r| (r.resource.as_str(), r.compare)).collect();
        // With etcd authentication only a write that waited at the gate is confirmed
        // here (`gate`), under the VM's token, as the shared registry's calls are.
        let token = f.auth.as_ref().and_then(|a| a.token()).map(|(t, _)| t);
        match etcd::call(e, Method::Txn, token.as_deref(), &etcd::confirms(&e.key_prefix, &marks)) {
            Ok(token) => {
                f.confirms.sent(token, group.iter().map(|r| r.resource.clone()).collect());
                f.metrics.batch_sent();
            }
            Err(cause) => fail(cause),
        }
    }
}

/// The answer to call `token`, if it is a batch's: answer its requests, and send
/// the batches that queued meanwhile. False when the call is no batch's.
pub fn on_answer(f: &Filter, token: u32, response: &Response) -> bool {
    let Some(resources) = f.confirms.answered(token) else { return false };
    let prefix = f.config.etcd.as_ref().map_or("", |e| e.key_prefix.as_str());
    match etcd::confirmed(response, prefix, &resources) {
        Ok((outcomes, floor, revision)) => {
            f.saw(revision);
            for (resource, seen) in resources.iter().zip(outcomes) {
                answer_all(f, resource, seen, floor.clone());
            }
        }
        Err(e) => {
            for resource in &resources {
                answer_all(f, resource, Err(e.clone()), Ok(None));
            }
        }
    }
    send_ready(f);
    true
}

/// Answer every request of `resource`'s batch in flight from what its Txn saw (and
/// the retention floor it read, when any mark moved).
fn answer_all(f: &Filter, resource: &str, seen: Result<Outcome, EtcdError>, floor: Result<Option<Token>, EtcdError>) {
    let Flight { compare, waiters } = f.confirms.landed(resource);
    let mark = seen.map(|outcome| match outcome {
        // The compare held: the mark is the token the Txn compared.
        Outcome::Succeeded => compare,
        Outcome::Current(current) => current,
    });
    // Without a mark the floor decides: a floor that could not be read fails it.
    let (mark, floor) = match (mark, floor) {
        (Ok(None), Err(e)) => (Err(e), None),
        (mark, floor) => (mark, floor.ok().flatten()),
    };
    match &mark {
        Ok(Some(m)) => {
            let _ = f.slots.raise(resource, *m);
        }
        // Gone from etcd (retention forgot it, or an operator cleared it): a retry then
        // starts without the copy and meets the floor, if any.
        Ok(None) => {
            let _ = f.slots.forget(resource);
        }
        Err(_) => {}
    }
    let mut tally = Tally::default();
    for w in waiters {
        if hostcalls::set_effective_context(w.reply.context).is_err() {
            // Its stream ended meanwhile: nobody to answer.
            continue;
        }
        tally.batched += 1;
        let (outcome, cause) = match &mark {
            Err(e) => (Err(NoVerdict::StoreUnreachable), e.0.clone()),
            Ok(m) => judge(&f.config.policy, resource, w.token, *m, floor),
        };
        if let Action::Continue = w.reply.answer(f, outcome, resource, &cause, &mut tally) {
            let _ = hostcalls::resume_http_request();
        }
    }
    f.metrics.add(&tally);
}

/// A request's verdict on the mark a batch's Txn saw, or with none the retention
/// floor it read in the same Txn.
fn judge(
    policy: &Policy,
    resource: &str,
    token: Token,
    mark: Option<Token>,
    floor: Option<Token>,
) -> (Result<Verdict, NoVerdict>, String) {
    if mark == Some(token) {
        return (Ok(Verdict::Admit { mark: token, advanced: false }), String::new());
    }
    let held_to = mark.or(floor);
    match decide_token(policy, token, held_to.as_ref()) {
        // The mark left etcd (retention forgot it): the token equals the floor the
        // same Txn read, so the holder writes again.
        v @ Verdict::Admit { advanced: false, .. } => (Ok(v), String::new()),
        // The mark is gone (an operator cleared it, or the token lies above the
        // floor): a first mark takes a Txn of the request's own. Rare; the client
        // retries, and its Txn reads the mark and the floor.
        Verdict::Admit { .. } if mark.is_none() => (
            Err(NoVerdict::Refused),
            format!("the mark of {resource:?} left etcd while it was checked (retention or an operator); retry"),
        ),
        stale @ Verdict::Stale { .. } if mark.is_none() => {
            (Ok(stale), floor.map(|floor| Forgotten { floor }.to_string()).unwrap_or_default())
        }
        // The mark fell below the token while it was checked (an operator lowered
        // it): advancing takes a compare-and-swap of the request's own. Rare; the
        // client retries.
        Verdict::Admit { .. } => (
            Err(NoVerdict::Refused),
            format!("the mark of {resource:?} moved below the token while it was checked; retry"),
        ),
        refusal => (Ok(refusal), String::new()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn waiter(context: u32, token: u64) -> Waiter {
        let reply = Reply { context, ..Reply::default() };
        Waiter { token: Token::from_parts(&[token]).unwrap(), reply }
    }

    #[test]
    fn requests_arriving_while_a_txn_is_in_flight_wait_for_the_next_one() {
        let c = Confirms::default();
        assert!(c.join("r", waiter(1, 5)), "an idle resource wakes the root");
        assert!(!c.join("r", waiter(2, 5)));
        let ready = c.ready();
        assert_eq!(ready.len(), 1);
        c.sent(100, vec!["r".into()]);
        // Arrived after the Txn was sent: not answered by it.
        assert!(!c.join("r", waiter(3, 5)), "the root sends the next batch when the Txn lands");
        assert!(c.ready().is_empty(), "one Txn in flight per resource");
        assert_eq!(c.answered(100), Some(vec!["r".to_owned()]));
        let answered: Vec<u32> = c.landed("r").waiters.iter().map(|w| w.reply.context).collect();
        assert_eq!(answered, [1, 2]);
        let next = c.ready();
        assert_eq!(next.len(), 1);
        assert_eq!(c.landed("r").waiters.iter().map(|w| w.reply.context).collect::<Vec<_>>(), [3]);
        assert!(c.queues.borrow().is_empty(), "an idle resource is forgotten");
    }

    #[test]
    fn a_batch_compares_its_highest_token_and_a_gone_request_is_answered_by_none() {
        let c = Confirms::default();
        c.join("r", waiter(1, 5));
        c.join("r", waiter(2, 7));
        c.join("r", waiter(3, 6));
        c.leave("r", 2);
        let ready = c.ready();
        assert_eq!(ready[0].compare, Token::from_parts(&[6]).unwrap());
        c.leave("r", 3);
        // The Txn compared 6 although the request that carried it left.
        let flight = c.landed("r");
        assert_eq!(flight.compare, Some(Token::from_parts(&[6]).unwrap()));
        assert_eq!(flight.waiters.iter().map(|w| w.reply.context).collect::<Vec<_>>(), [1]);
        c.leave("r", 1);
        assert!(c.queues.borrow().is_empty());
        assert!(c.answered(9).is_none(), "a call that is no batch's");
    }
}
