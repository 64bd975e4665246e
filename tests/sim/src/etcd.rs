//! Marks in a simulated etcd: a mark store whose every call the library's admit makes
//! ([`Guard::admit_async`](fencekeeper::Guard::admit_async), the loop the gateway
//! awaits with its etcd store) goes to the world as a request, is made by the world's
//! etcd at some later instant (linearizably: one call at a time, whether or not the
//! instance that sent it is still up), and answers after another hop, or never (a
//! fault loses the answer after the commit; the caller's call then fails, and the
//! admit ends undecided while its swap may have been made).
//!
//! The admit itself is an `async fn` of the library, polled by hand
//! ([`crate::admits::Admits`]). Nothing about the loop (reads, swaps, lost races,
//! confirms, provenance off) is the simulator's own.

use crate::kv::Kv;
use fencekeeper::store::{AwaitableMarks, Pending, Read};
use fencekeeper::{MarkStore, StoreError, Swap, Token};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

/// One call to etcd, as the world carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// Read the resource's mark.
    Get(String),
    /// Set the mark to `new` if it is `expected` and `new` raises it.
    Swap {
        /// The resource.
        resource: String,
        /// The mark it must be.
        expected: Option<Token>,
        /// The mark it becomes.
        new: Token,
    },
    /// Check that the mark is still `mark`.
    Confirm(String, Token),
    /// A call to etcd's JSON API, as the Envoy filter makes it (`--filter` with marks
    /// in etcd): its path and body.
    Json {
        /// The path (`/v3/kv/txn`).
        path: String,
        /// The JSON body.
        body: String,
    },
}

/// What etcd answered a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A mark read.
    Mark(Option<Token>),
    /// A swap's or a confirm's outcome.
    Swap(Swap),
    /// The JSON API's answer: status and body.
    Json(u16, String),
}

/// The marks as etcd holds them, shared by every instance's client.
#[derive(Clone, Debug, Default)]
pub struct Server {
    marks: BTreeMap<String, Token>,
    /// The key space the JSON API serves (the filter's records, by its own keys).
    kv: Kv,
}

impl Server {
    /// Make `call`, as etcd's Txn does: atomically. `lose_compare`: a buggy server
    /// that writes a swap whose mark moved (a lost compare-and-swap).
    pub fn apply(&mut self, call: &Call, lose_compare: bool) -> Answer {
        match call {
            Call::Json { path, body } => {
                let (status, answer) = self.kv.call(path, body.as_bytes());
                Answer::Json(status, String::from_utf8_lossy(&answer).into_owned())
            }
            Call::Get(resource) => Answer::Mark(self.marks.get(resource).copied()),
            Call::Confirm(resource, mark) => Answer::Swap(match self.marks.get(resource) {
                Some(m) if m == mark => Swap::Swapped,
                other => Swap::Conflict(other.copied()),
            }),
            Call::Swap { resource, expected, new } => {
                let current = self.marks.get(resource).copied();
                let raises = fencekeeper::store::raises(expected.as_ref(), new);
                if (current == *expected || lose_compare) && raises {
                    self.marks.insert(resource.clone(), *new);
                    Answer::Swap(Swap::Swapped)
                } else {
                    Answer::Swap(Swap::Conflict(current))
                }
            }
        }
    }

    /// The world's clock moved to `now_ms` (leases run out on it).
    pub fn advance(&mut self, now_ms: u64) {
        self.kv.advance(now_ms);
    }

    /// The value of `key` in the JSON API's key space, read at once.
    pub fn value(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.kv.get(key).map(<[u8]>::to_vec)
    }

    /// The resource's mark, read at once (the marks read back after a fault).
    pub fn mark(&self, resource: &str) -> Option<Token> {
        self.marks.get(resource).copied()
    }
}

/// A shared [`Server`].
pub type SharedServer = Arc<Mutex<Server>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
struct Calls {
    next: u64,
    /// Calls made and not yet handed to the world.
    outbox: Vec<(u64, Call)>,
    /// Answers that came back and were not yet taken by the future waiting on them.
    answers: BTreeMap<u64, Result<Answer, String>>,
}

/// One instance's etcd client: a mark store whose calls the world answers.
pub struct Client {
    server: SharedServer,
    calls: Arc<Mutex<Calls>>,
}

/// A call in flight: ready once the world answered it.
struct InFlight {
    calls: Arc<Mutex<Calls>>,
    id: u64,
}

impl Future for InFlight {
    type Output = Result<Answer, StoreError>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        match lock(&self.calls).answers.remove(&self.id) {
            Some(answer) => Poll::Ready(answer.map_err(StoreError::Unavailable)),
            None => Poll::Pending,
        }
    }
}

impl Client {
    /// A client of `server`.
    pub fn new(server: SharedServer) -> Client {
        Client { server, calls: Arc::default() }
    }

    fn call(&self, call: Call) -> InFlight {
        let mut calls = lock(&self.calls);
        let id = calls.next;
        calls.next += 1;
        calls.outbox.push((id, call));
        InFlight { calls: self.calls.clone(), id }
    }

    /// The calls made since the last time, to hand to the world.
    pub fn take_calls(&self) -> Vec<(u64, Call)> {
        std::mem::take(&mut lock(&self.calls).outbox)
    }

    /// The world's answer to call `id` (`Err`: none came).
    pub fn answered(&self, id: u64, answer: Result<Answer, String>) {
        lock(&self.calls).answers.insert(id, answer);
    }
}

fn unexpected<T>(answer: Answer) -> Result<T, StoreError> {
    Err(StoreError::Unavailable(format!("etcd answered {answer:?} to another call")))
}

impl AwaitableMarks for Client {
    fn read<'a>(&'a self, resource: &'a str) -> Pending<'a, Read> {
        let call = self.call(Call::Get(resource.to_owned()));
        Box::pin(async move {
            match call.await? {
                Answer::Mark(mark) => Ok(Read { mark, exact: true }),
                other => unexpected(other),
            }
        })
    }

    fn get<'a>(&'a self, resource: &'a str) -> Pending<'a, Option<Token>> {
        let call = self.call(Call::Get(resource.to_owned()));
        Box::pin(async move {
            match call.await? {
                Answer::Mark(mark) => Ok(mark),
                other => unexpected(other),
            }
        })
    }

    fn compare_and_swap<'a>(
        &'a self,
        resource: &'a str,
        expected: Option<&'a Token>,
        new: &'a Token,
    ) -> Pending<'a, Swap> {
        let call = self.call(Call::Swap { resource: resource.to_owned(), expected: expected.copied(), new: *new });
        Box::pin(async move {
            match call.await? {
                Answer::Swap(swap) => Ok(swap),
                other => unexpected(other),
            }
        })
    }

    fn confirm<'a>(&'a self, resource: &'a str, mark: &'a Token) -> Pending<'a, Swap> {
        let call = self.call(Call::Confirm(resource.to_owned(), *mark));
        Box::pin(async move {
            match call.await? {
                Answer::Swap(swap) => Ok(swap),
                other => unexpected(other),
            }
        })
    }
}

/// The blocking calls: read at once from the server. The admit never makes them (it
/// awaits [`AwaitableMarks`]); the fence's check after a wait and the marks read back
/// after a fault do.
impl MarkStore for Client {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        Ok(lock(&self.server).mark(resource))
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        let call = Call::Swap { resource: resource.to_owned(), expected: expected.copied(), new: *new };
        match lock(&self.server).apply(&call, false) {
            Answer::Swap(swap) => Ok(swap),
            other => unexpected(other),
        }
    }

    fn awaitable(&self) -> Option<&dyn AwaitableMarks> {
        Some(self)
    }
}
