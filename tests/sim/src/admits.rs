//! An instance's admits: the library's `Guard::admit` where the marks answer at once
//! (a memory store, the library's file store), and its `Guard::admit_async`, polled
//! by hand, where they are in the simulated etcd ([`crate::etcd`]): each time an
//! answer comes back the admit's future is polled again, and the calls it makes next
//! go to the world. The file store is closed at a crash and opened again from its file
//! at the restart.

use crate::etcd::{Answer, Client};
use crate::fence::{Bug, Out, Request};
use fencekeeper::{Decision, FileStore, Guard, MarkStore, StoreError, Swap, Token, Validator};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

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
