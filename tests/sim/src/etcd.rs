//! Marks in a simulated etcd: a mark store whose every call the library's admit makes
//! ([`Guard::admit_async`](fencekeeper::Guard::admit_async), the loop the gateway
//! awaits with its etcd store) goes to the world as a request, is made by the world's
//! etcd at some later instant (linearizably: one call at a time, whether or not the
//! instance that sent it is still up), and answers after another hop, or never (a
//! fault loses the answer after the commit; the caller's call then fails, and the
//! admit ends undecided while its swap may have been made).
//!
//! The admit itself is an `async fn` of the library, polled here by hand: each time
//! an answer comes back its future is polled again, and whatever calls it makes next
//! are handed to the world ([`Admits`]). Nothing about the loop (reads, swaps, lost
//! races, confirms, provenance off) is the simulator's own.

use crate::fence::{Bug, Out, Request};
use fencekeeper::store::{AwaitableMarks, Pending, Read};
use fencekeeper::{Decision, FileStore, Guard, MarkStore, StoreError, Swap, Token, Validator};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

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
}

/// What etcd answered a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A mark read.
    Mark(Option<Token>),
    /// A swap's or a confirm's outcome.
    Swap(Swap),
}

/// The marks as etcd holds them, shared by every instance's client.
#[derive(Clone, Debug, Default)]
pub struct Server {
    marks: BTreeMap<String, Token>,
}

impl Server {
    /// Make `call`, as etcd's Txn does: atomically. `lose_compare`: a buggy server
    /// that writes a swap whose mark moved (a lost compare-and-swap).
    pub fn apply(&mut self, call: &Call, lose_compare: bool) -> Answer {
        match call {
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

/// A guard with the bundled validator over the library's file store at `path`.
fn file_guard(validator: &Arc<Validator>, path: &Path) -> Result<Arc<Guard>, String> {
    let store = FileStore::open(path).map_err(|e| format!("the file store {} did not open: {e}", path.display()))?;
    Ok(Arc::new(Guard::new(validator.clone(), Arc::new(store))))
}

/// A file store that did not open again after a crash: every call fails with why, so
/// every admit is undecided (503) and the run shows it.
struct Unopened(String);

impl MarkStore for Unopened {
    fn get(&self, _: &str) -> Result<Option<Token>, StoreError> {
        Err(StoreError::Unavailable(self.0.clone()))
    }

    fn compare_and_swap(&self, _: &str, _: Option<&Token>, _: &Token) -> Result<Swap, StoreError> {
        Err(StoreError::Unavailable(self.0.clone()))
    }
}

/// An admit in progress.
type Admitting = Pin<Box<dyn Future<Output = Decision>>>;

/// One instance's admits in progress on an etcd [`Client`], and which write waits on
/// which call.
pub struct Admits {
    guard: Arc<Guard>,
    client: Option<Arc<Client>>,
    admitting: BTreeMap<u64, (Request, Admitting)>,
    waiting: BTreeMap<u64, u64>,
    /// Marks in the library's file store: its file, opened again after a crash.
    file: Option<(PathBuf, Arc<Validator>)>,
    /// A bug: the file is gone when the instance starts again (a store kept on a
    /// disk that did not survive the restart).
    lose_file: bool,
}

impl Admits {
    /// Admits through `guard`, whose store is `client` when marks are in etcd (else
    /// each admit is made at once).
    pub fn new(guard: Arc<Guard>, client: Option<Arc<Client>>) -> Admits {
        let (admitting, waiting) = (BTreeMap::new(), BTreeMap::new());
        Admits { guard, client, admitting, waiting, file: None, lose_file: false }
    }

    /// Admits over the library's file store at `path` (created when missing), as the
    /// gateway's `--store`; with `bug` [`Bug::LostMarks`], the file is gone at each
    /// restart.
    pub fn file(validator: Arc<Validator>, path: PathBuf, bug: Option<Bug>) -> Result<Admits, String> {
        let guard = file_guard(&validator, &path)?;
        let lose_file = bug == Some(Bug::LostMarks);
        Ok(Admits { file: Some((path, validator)), lose_file, ..Admits::new(guard, None) })
    }

    /// The instance starts again after a crash: a file store is opened again from its
    /// file (what a new process finds there), after the old one is closed.
    pub fn restart(&mut self) {
        let Some((path, validator)) = &self.file else { return };
        // The old store closes first: one process holds the file at a time.
        self.guard = Arc::new(Guard::new(validator.clone(), Arc::new(Unopened(String::new()))));
        if self.lose_file {
            let _ = std::fs::remove_file(path);
        }
        self.guard = file_guard(validator, path)
            .unwrap_or_else(|why| Arc::new(Guard::new(validator.clone(), Arc::new(Unopened(why)))));
    }

    /// The resource's mark, read at once (the check after a wait, the marks read back
    /// after a fault); `None` when it has none or cannot be read.
    pub fn mark(&self, resource: &str) -> Option<u64> {
        self.guard.mark(resource).ok().flatten().map(|t| crate::fence::first(&t))
    }

    /// Admit `req`, a write of `resource`: its decision now, or `None` with the etcd
    /// calls it makes put in `out` ([`Out::Etcd`]).
    pub fn start(&mut self, req: Request, resource: &str, out: &mut Vec<Out>) -> Option<(Request, Decision)> {
        let token = req.token.to_string();
        if self.client.is_none() {
            return Some((req, self.guard.admit(resource, Some(&token))));
        }
        let (guard, resource) = (self.guard.clone(), resource.to_owned());
        let future: Admitting = Box::pin(async move { guard.admit_async(&resource, Some(&token)).await });
        self.admitting.insert(req.id, (req, future));
        self.poll(req.id, out)
    }

    /// Call `call` was answered (`Err`: its answer was lost): the write waiting on
    /// it and its decision, if it has one now; the calls it makes next in `out`.
    pub fn answered(
        &mut self,
        call: u64,
        answer: Result<Answer, String>,
        out: &mut Vec<Out>,
    ) -> Option<(Request, Decision)> {
        let client = self.client.clone()?;
        let id = self.waiting.remove(&call)?;
        client.answered(call, answer);
        self.poll(id, out)
    }

    fn poll(&mut self, id: u64, out: &mut Vec<Out>) -> Option<(Request, Decision)> {
        let (_, future) = self.admitting.get_mut(&id)?;
        let polled = future.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        let made = self.client.as_ref().map(|c| c.take_calls()).unwrap_or_default();
        for (call, op) in made {
            self.waiting.insert(call, id);
            out.push(Out::Etcd { call, op });
        }
        match polled {
            Poll::Ready(decision) => self.admitting.remove(&id).map(|(req, _)| (req, decision)),
            Poll::Pending => None,
        }
    }

    /// The instance died: its admits in progress are gone (their calls may still be
    /// made by etcd). Returns the writes they were for.
    pub fn crash(&mut self) -> Vec<Request> {
        self.waiting.clear();
        std::mem::take(&mut self.admitting).into_values().map(|(req, _)| req).collect()
    }
}
