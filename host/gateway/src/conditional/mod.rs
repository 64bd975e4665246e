//! Conditional writes (`--conditional-writes`): every admitted write goes to the store
//! with a precondition on the version the store gave the last write the gateway saw
//! applied, so the store itself refuses a write that arrives late, after the
//! gateway gave up on it, crashed, or another gateway moved the object on.
//!
//! The version chains are `fencekeeper::chain`'s, kept beside the marks. Here:
//!
//! * which writes can be conditional: a PUT of the object's bytes and a DELETE;
//!   anything else (S3 multipart steps and copies, WebDAV's COPY and MOVE, POST) is
//!   refused before it is admitted, as are writes carrying preconditions of their own;
//! * one write at a time per resource (its *turn*): two writes of one holder would
//!   otherwise race on one version and one of them fail; a write waits at most the
//!   gate timeout for its turn, then is refused 503 with `Retry-After`;
//! * the lend before the write is sent (durable), and the settle from the store's
//!   answer;
//! * learning an unknown version: from a HEAD the gateway sends the store itself
//!   before it refuses, or from a client's read (GET or HEAD) through the gateway,
//!   for a store that wants credentials the gateway does not have;
//! * the start-up probe: a PUT with an `If-Match` that names no version must fail.
//!
//! Each step is decided by the engine's machine (`fencekeeper_engine::conditional::
//! Write`), as in the Envoy filter: this module carries it out with the gateway's
//! chain store, client and tasks. The turn is the gateway's own so far: in the
//! filter, the second of two writes racing on one version gets a 409 instead of
//! waiting (docs/architecture.md, "Where the hosts still differ").

use crate::refusal::{full, Answer, Failure, Form};
use crate::tls::Connector;
use crate::Body;
use fencekeeper::chain::{self, ChainError, ChainStore, Change, Version};
use fencekeeper_core::refusal::Action;
use fencekeeper_core::{Class, Token};
use fencekeeper_engine::conditional::{self as rules, Command, Refused, Write};
use hyper::body::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, ETAG, HOST};
use hyper::http::request::Parts;
use hyper::{Method, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use md5::{Digest, Md5};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use turns::{Turn, Turns};

mod probe;
mod turns;

pub use probe::{probe, Probed};

/// The gateway's conditional writes: the chains, and one turn per resource.
pub struct Conditional {
    chains: Arc<dyn ChainStore>,
    /// Each resource's chain record as this gateway last saw it.
    records: Arc<Records>,
    turns: Arc<Turns>,
    /// Resources whose version this gateway found unknown: a read of one through the
    /// gateway is looked at to learn it (other reads cost nothing).
    unknown: Mutex<HashSet<String>>,
    /// The longest a write waits for its turn.
    wait: Duration,
    /// The gateway's client of the store and the store's address, to ask the store
    /// itself for a version the gateway does not know (a HEAD).
    client: Client<Connector, Body>,
    upstream: Uri,
    /// The store honours `If-Match` on DELETE (probed, or vouched for).
    deletes: bool,
    /// How long after it is sent the store may still apply a write (the request
    /// timeout plus the store apply bound): a lend's term.
    lend_for: Duration,
}

/// A write lent on its resource's chain and holding its turn: forward it, then
/// [`Conditional::settle`] it with what became of it.
pub struct Lent {
    write: Write,
    turn: Turn,
}

/// What became of a forwarded write.
pub enum Delivery {
    /// The store answered with this status (the response is the store's).
    Answered(StatusCode),
    /// Nothing was sent (no connection).
    NotSent,
    /// Given up on after it may have been sent: the store may still apply it. With the
    /// request, still waiting for the store's answer, when it could be kept.
    GivenUp(Option<Late>),
}

/// A request the gateway gave up on (its client was answered 504) whose answer from
/// the store is still awaited: a conditional write settles its lend with it.
pub type Late =
    tokio::task::JoinHandle<Result<hyper::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Conditional {
    /// Conditional writes with chains in `chains`; a write waits at most `wait` for
    /// its resource's turn; `client` reaches the store at `upstream`; deletes are
    /// refused unless the store honours `If-Match` on them (`deletes`); a write given
    /// up on stays lent `lend_for` after it was sent.
    pub fn new(
        chains: Arc<dyn ChainStore>,
        wait: Duration,
        client: Client<Connector, Body>,
        upstream: Uri,
        deletes: bool,
        lend_for: Duration,
    ) -> Conditional {
        let turns = Arc::default();
        let records = Arc::default();
        Conditional { chains, records, turns, unknown: Mutex::default(), wait, client, upstream, deletes, lend_for }
    }

    /// Whether the store honours `If-Match` on a DELETE (probed, or vouched for): else
    /// a DELETE cannot be conditional (the engine's `early` refuses it, 501).
    pub fn deletes(&self) -> bool {
        self.deletes
    }

    /// Take `resource`'s turn and lend the write (`token`, `body`) on its chain, then
    /// set its precondition in `headers`. Refused: the answer, and what it counts.
    pub async fn lend(
        &self,
        resource: &str,
        token: Option<Token>,
        parts: &mut Parts,
        body: &[u8],
        form: Form,
    ) -> Result<Lent, Refused> {
        let Some(token) = token else {
            let answer = Answer::failure(Failure::Internal, "an admitted write without a token", form);
            return Err(Refused { answer, class: Some(Class::Admitted), event: None });
        };
        let Some(turn) = self.turns.take(resource, self.wait).await else {
            // The gateway's own wait, as the ordering gate's: undecided, retry.
            let reason = format!(
                "cannot decide on {resource:?}: another write held it longer than {:?} (conditional writes go one at \
                 a time per resource); retry",
                self.wait
            );
            let undecided = Action { class: Class::Undecided, forward: false, token: None };
            let answer = Answer::refusal(&undecided, &reason, form, Some(1));
            return Err(Refused { answer, class: Some(Class::Undecided), event: None });
        };
        let delete = parts.method == Method::DELETE;
        // What the write would make the version: known in advance for a delete, and
        // for a store whose ETags are the body's MD5 (S3's single-part uploads). For
        // any other store it never matches, which is right: its versions never repeat.
        let makes = if delete { Version::Absent } else { chain::content_version(&Md5::digest(body).into()) };
        let lifetime = Some(self.lend_for.as_millis() as u64);
        let mut write = Write::new(resource, token, delete, form, lifetime, true);
        let mut next = write.start(rules::Body::Whole(makes), now_ms());
        loop {
            next = match next {
                Command::Chain(change) => change_chain(&self.chains, &self.records, &mut write, change).await,
                Command::AskStore => {
                    let (status, etag) = self.ask_store(parts).await;
                    let next = write.store_told(status, etag.as_deref());
                    if let Command::Chain(Change::Learn(version)) = &next {
                        tracing::info!(resource, %version, "learned the store's version from its answer to a HEAD");
                    }
                    next
                }
                Command::Send(name, value) => {
                    log_notes(&mut write);
                    // A stored tag is visible ASCII (checked when it was read); were it
                    // not, the write would go without its precondition: refused instead.
                    let Ok(value) = HeaderValue::from_str(&value) else {
                        let why = format!("the precondition {value:?} is not a header value");
                        return Err(rules::unavailable(resource, &why, form));
                    };
                    parts.headers.insert(HeaderName::from_static(name), value);
                    return Ok(Lent { write, turn });
                }
                Command::Conclude(refused) => {
                    self.concluded(&mut write);
                    let why = "a conditional write concluded before it was sent";
                    return Err(refused.unwrap_or_else(|| rules::unavailable(resource, why, form)));
                }
                Command::ReleaseBody | Command::Idle => {
                    let why = "an unexpected conditional write step";
                    return Err(rules::unavailable(resource, why, form));
                }
            };
        }
    }

    /// Ask the store for the version of the write's target with a HEAD (its Host
    /// kept): its status (0: no answer in time) and ETag.
    async fn ask_store(&self, parts: &Parts) -> (u16, Option<Vec<u8>>) {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let authority = self.upstream.authority().map_or("", |a| a.as_str());
        let mut head = hyper::Request::head(format!("http://{authority}{path}"));
        if let Some(host) = parts.headers.get(HOST) {
            head = head.header(HOST, host);
        }
        let Ok(head) = head.body(full(Bytes::new())) else { return (0, None) };
        let answer = tokio::time::timeout(self.wait, self.client.request(head)).await;
        let Ok(Ok(response)) = answer else { return (0, None) };
        let etag = response.headers().get(ETAG).map(|v| v.as_bytes().to_vec());
        (response.status().as_u16(), etag)
    }

    /// Record what became of the write `lent` in its chain (`headers`: the store's
    /// answer's), and the refusal a 412 or a 404 means (`None`: the store's answer
    /// goes to the client).
    pub async fn settle(&self, lent: Lent, delivery: Delivery, headers: &HeaderMap) -> Option<Refused> {
        let Lent { mut write, turn } = lent;
        let next = match delivery {
            Delivery::GivenUp(late) => {
                let next = write.delivered(rules::Delivery::GivenUp);
                log_notes(&mut write);
                // The resource's turn is free now: the next write does not wait for a
                // store that may never answer this one.
                drop(turn);
                if let Some(late) = late {
                    self.settle_late(write, late);
                }
                return match next {
                    Command::Conclude(refused) => refused,
                    _ => None,
                };
            }
            Delivery::NotSent => write.delivered(rules::Delivery::NotSent),
            Delivery::Answered(status) => {
                let etag = headers.get(ETAG).map(HeaderValue::as_bytes);
                write.delivered(rules::Delivery::Answered(status.as_u16(), etag))
            }
        };
        let refused = finish(&self.chains, &self.records, &mut write, next).await;
        self.concluded(&mut write);
        refused
    }

    /// Wait (in a task of its own, at most a lend's term) for the store's answer to
    /// the write given up on, and settle its lend with it: a 412 ends the lend at
    /// once, and an applied write tells the version, so the next write need not find
    /// it out with a 412 and a read.
    fn settle_late(&self, mut write: Write, mut late: Late) {
        let (chains, records, term) = (self.chains.clone(), self.records.clone(), self.lend_for);
        tokio::spawn(async move {
            let response = match tokio::time::timeout(term, &mut late).await {
                Ok(Ok(Ok(response))) => response,
                Ok(_) => return, // failed without an answer: it stays lent for its term
                Err(_) => {
                    late.abort();
                    return;
                }
            };
            let (status, etag) = (response.status(), response.headers().get(ETAG).map(|v| v.as_bytes().to_vec()));
            drop(response);
            let next = write.delivered(rules::Delivery::Answered(status.as_u16(), etag.as_deref()));
            finish(&chains, &records, &mut write, next).await;
            let resource = write.resource();
            tracing::info!(resource, %status, "a conditional write given up on was answered late; settled");
        });
    }

    /// The write's outcome is known: log what the machine noted, and remember a
    /// resource whose version the gateway does not know, for a read to teach it.
    fn concluded(&self, write: &mut Write) {
        log_notes(write);
        if write.version_unknown() {
            lock(&self.unknown).insert(write.resource().to_owned());
        }
    }

    /// A read of `resource` through the gateway was answered `status` with
    /// `headers`: when the gateway does not know the resource's version, learn it.
    /// True when it was learned.
    pub async fn observe_read(&self, resource: &str, status: StatusCode, headers: &HeaderMap) -> bool {
        if !lock(&self.unknown).contains(resource) {
            return false;
        }
        let Some(seen) = rules::learned(status.as_u16(), headers.get(ETAG).map(HeaderValue::as_bytes)) else {
            return false;
        };
        let (chains, key) = (self.chains.clone(), resource.to_owned());
        let learned = tokio::task::spawn_blocking(move || {
            chain::update(&*chains, &key, |c| {
                c.learn(seen.clone());
                Ok::<_, ()>(c.current.clone())
            })
        })
        .await;
        match learned {
            Ok(Ok(Ok(Some(version)))) => {
                lock(&self.unknown).remove(resource);
                self.records.forget(resource); // changed here: the next change reads it
                tracing::info!(resource, %version, "learned the store's version from a read");
                true
            }
            _ => false,
        }
    }
}

/// Unix time now, in milliseconds: when a lend is made.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// The chain record of each resource as this gateway last read or wrote it, so that
/// its next change goes straight to the swap: one call instead of a read and a swap
/// while no other instance changes the chain (the swap compares the whole record, so
/// an outdated one only costs the read it would have made anyway). Forgotten
/// wholesale past [`RECORDS_KEPT`] resources.
#[derive(Default)]
struct Records(Mutex<HashMap<String, Option<Vec<u8>>>>);

/// How many resources' records [`Records`] keeps (each is a few hundred bytes).
const RECORDS_KEPT: usize = 10_000;

impl Records {
    fn get(&self, resource: &str) -> Option<Option<Vec<u8>>> {
        lock(&self.0).get(resource).cloned()
    }

    fn put(&self, resource: String, record: Option<Vec<u8>>) {
        let mut map = lock(&self.0);
        if map.len() >= RECORDS_KEPT && !map.contains_key(&resource) {
            map.clear();
        }
        map.insert(resource, record);
    }

    fn forget(&self, resource: &str) {
        lock(&self.0).remove(resource);
    }
}

/// Make `change` of the write's chain in `chains` (from the record last seen, in
/// `records`), off the reactor, and tell the machine what it came to.
async fn change_chain(
    chains: &Arc<dyn ChainStore>,
    records: &Arc<Records>,
    write: &mut Write,
    change: Change,
) -> Command {
    let (chains, key) = (chains.clone(), write.resource().to_owned());
    let known = records.get(&key);
    let done = tokio::task::spawn_blocking(move || {
        chain::update_from(&*chains, &key, known, |c| Ok::<_, ()>(change.apply(c))).map(|(done, now)| (key, done, now))
    })
    .await
    .unwrap_or_else(|e| Err(ChainError::Store(fencekeeper::StoreError::Unavailable(e.to_string()))));
    match done {
        Ok((key, Ok(done), now)) => {
            records.put(key, now);
            write.chain_done(done, now_ms())
        }
        Ok((_, Err(()), _)) => write.chain_failed("an unexpected version chain outcome"),
        Err(e) => {
            // Whatever it held is not trusted now: the next change reads.
            records.forget(write.resource());
            write.chain_failed(&e.to_string())
        }
    }
}

/// Carry out the machine's chain changes after the write was sent, to its outcome
/// (`None`: the store's answer goes to the client).
async fn finish(
    chains: &Arc<dyn ChainStore>,
    records: &Arc<Records>,
    write: &mut Write,
    mut next: Command,
) -> Option<Refused> {
    loop {
        next = match next {
            Command::Chain(change) => change_chain(chains, records, write, change).await,
            Command::Conclude(refused) => return refused,
            Command::AskStore | Command::Send(..) | Command::ReleaseBody | Command::Idle => return None,
        };
    }
}

/// Log what the machine noted for the write.
fn log_notes(write: &mut Write) {
    let resource = write.resource().to_owned();
    for note in write.notes() {
        if note.error {
            tracing::error!(resource, "{}", note.line);
        } else {
            tracing::warn!(resource, "{}", note.line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencekeeper::chain::MemoryChains;

    fn conditional(deletes: bool) -> Conditional {
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(Connector::new(None));
        let upstream = Uri::from_static("http://127.0.0.1:9");
        let (chains, wait) = (Arc::new(MemoryChains::default()), Duration::from_secs(1));
        Conditional::new(chains, wait, client, upstream, deletes, Duration::from_secs(120))
    }

    impl Conditional {
        async fn turn(&self, resource: &str) -> Option<Turn> {
            self.turns.take(resource, self.wait).await
        }
    }

    #[tokio::test]
    async fn a_resource_has_one_turn_at_a_time_and_forgets_it_when_nobody_waits() {
        let c = Arc::new(conditional(true));
        let a = c.turn("r").await.expect("free");
        let c2 = c.clone();
        let b = tokio::spawn(async move { c2.turn("r").await.map(|t| (t, std::time::Instant::now())) });
        tokio::task::yield_now().await;
        let released = std::time::Instant::now();
        drop(a);
        let b = b.await.ok().flatten().expect("b takes the turn a left");
        assert!(b.1 >= released);
        assert!(c.turn("r").await.is_none(), "a third waits while b holds it (and times out here)");
        assert!(c.turn("other").await.is_some(), "other resources do not wait");
        drop(b);
        assert_eq!(c.turns.len(), 0, "forgotten once nobody holds or waits");
        assert!(c.turn("r").await.is_some());
    }
}
