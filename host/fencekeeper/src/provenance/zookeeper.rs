//! Provenance of ZooKeeper tokens: the token must be the czxid (as `epoch.counter`) of
//! the node that holds the lock `LOCK_PREFIX + resource` now.
//!
//! **Holder, not merely a node.** A node under the lock with the token's czxid is not
//! enough: any client with a session can create a child there and so mint a czxid,
//! and a contender still waiting in the queue has a czxid above the holder's, so a
//! write with it would raise the mark and fence the real holder out while nobody has
//! acquired. The check therefore asks what Chubby's `CheckSequencer` asks: is the
//! token the *current holder's*, the contender with the lowest sequence number, as
//! `fencekeeper lock --zookeeper` and kazoo's `Lock` decide it (one definition,
//! [`lock_node::sequence`]).
//!
//! One check is three reads: `sync` (the server catches up with the leader, so a
//! holder that acquired through another member of the ensemble is seen), the lock
//! node's children, and the holder's Stat. The holder can change between the last two;
//! then the reads are made again, a few times at most.
//!
//! One session per provenance object, opened at [`ZooKeeperProvenance::connect`] and
//! again whenever it is lost or has been silent long enough to have expired. The
//! gateway checks from several threads: a mutex lets one check use the session at a
//! time. Checks happen only when a token would advance a mark (once per acquisition
//! and resource), and each is bounded by the timeout, so the queue stays short.

use super::{Origin, Provenance, ProvenanceError};
use crate::zookeeper::jute::{Jute, Reader};
use crate::zookeeper::lock_node::{self, NotAZxid};
use crate::zookeeper::session::{code, describe, op};
use crate::zookeeper::{Session, ZooKeeperError};
use fencekeeper_core::Token;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The most children of a lock node read: a queue longer than this is not a lock in
/// use but an attack or a leak, and the check fails (503) rather than read it.
pub const MAX_CHILDREN: usize = 10_000;
/// The longest child name read (kazoo's are about 50 bytes, ours about 75).
pub const MAX_NAME: usize = 512;
/// The longest lock path asked for; a longer `LOCK_PREFIX + resource` has no lock.
pub const MAX_PATH: usize = 4096;
/// How many times the reads are made when the holder changes between them.
const ATTEMPTS: usize = 3;
/// The session asked for: it only reads, so a long one costs nothing, and spares a new
/// handshake when advances are a few seconds apart.
const SESSION_TIMEOUT: Duration = Duration::from_secs(30);

/// [`Provenance`] against ZooKeeper's lock recipe.
pub struct ZooKeeperProvenance {
    address: String,
    lock_prefix: String,
    timeout: Duration,
    session: Mutex<Option<Session>>,
}

/// The node holding a lock, and its czxid.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Holder {
    node: String,
    czxid: i64,
}

impl ZooKeeperProvenance {
    /// A check against ZooKeeper at `address` (`HOST:PORT`) of the locks
    /// `lock_prefix + resource`, each call bounded by `timeout` (per request, and per
    /// connection and handshake); the session is opened now, so that a wrong address
    /// fails at start-up.
    pub fn connect(address: &str, lock_prefix: &str, timeout: Duration) -> Result<Self, ProvenanceError> {
        let session = Session::open_within(address, SESSION_TIMEOUT, timeout).map_err(unavailable(address))?;
        Ok(ZooKeeperProvenance {
            address: address.to_owned(),
            lock_prefix: lock_prefix.to_owned(),
            timeout,
            session: Mutex::new(Some(session)),
        })
    }

    /// The holder of lock node `lock`, with a live session: the one kept, unless it
    /// is lost or silent long enough to have expired; if the kept one fails because
    /// its connection is gone, once more on a new one.
    fn holder(&self, lock: &str) -> Result<Option<Holder>, ProvenanceError> {
        // A panic in another check leaves nothing half-done that matters: the session
        // is dropped below whenever a call fails.
        let mut kept = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        let stale = kept.as_ref().is_some_and(|s| s.is_closed() || s.silent_for() >= s.timeout / 2);
        let reused = !stale && kept.is_some();
        let mut session = match kept.take() {
            Some(session) if reused => session,
            _ => self.open()?,
        };
        let answer = match read_holder(&mut session, lock) {
            Err(ZooKeeperError::Lost(_)) if reused => {
                session = self.open()?;
                read_holder(&mut session, lock)
            }
            answer => answer,
        };
        // A session whose request failed may still owe a late answer: start afresh.
        if answer.is_ok() {
            *kept = Some(session);
        }
        answer.map_err(unavailable(&self.address))
    }

    fn open(&self) -> Result<Session, ProvenanceError> {
        Session::open_within(&self.address, SESSION_TIMEOUT, self.timeout).map_err(unavailable(&self.address))
    }
}

fn unavailable(address: &str) -> impl Fn(ZooKeeperError) -> ProvenanceError + '_ {
    move |e| match e {
        // Its line names the address already.
        ZooKeeperError::Connect(line) => ProvenanceError::Unavailable(line),
        other => ProvenanceError::Unavailable(format!("ZooKeeper at {address}: {other}")),
    }
}

/// The current holder of `lock` (None: nobody holds it, or the node does not exist).
fn read_holder(session: &mut Session, lock: &str) -> Result<Option<Holder>, ZooKeeperError> {
    let mut path = Jute::default();
    path.string(lock);
    let (err, body) = session.call(op::SYNC, &path.0)?;
    match err {
        0 => Reader(&body).string().map(drop)?,
        code::NO_NODE => return Ok(None),
        e => return Err(refused("syncing", lock, e)),
    }
    for _ in 0..ATTEMPTS {
        let mut list = Jute::default();
        list.string(lock).bool(false);
        let (err, body) = session.call(op::GET_CHILDREN, &list.0)?;
        match err {
            0 => {}
            code::NO_NODE => return Ok(None),
            e => return Err(refused("listing", lock, e)),
        }
        let mut reply = Reader(&body);
        let children = reply.bounded_strings(MAX_CHILDREN, MAX_NAME)?;
        reply.end()?;
        let Some(node) = lowest_contender(&children)? else { return Ok(None) };
        let node_path = format!("{lock}/{node}");
        let mut exists = Jute::default();
        exists.string(&node_path).bool(false);
        let (err, body) = session.call(op::EXISTS, &exists.0)?;
        match err {
            0 => {}
            // Released between the two reads: look again.
            code::NO_NODE => continue,
            e => return Err(refused("reading", &node_path, e)),
        }
        let mut reply = Reader(&body);
        let stat = reply.stat()?;
        reply.end()?;
        if stat.czxid <= 0 {
            return Err(ZooKeeperError::Malformed(format!("ZooKeeper said {node_path:?} was created at zxid {}", stat.czxid)));
        }
        return Ok(Some(Holder { node: node.to_owned(), czxid: stat.czxid }));
    }
    Err(ZooKeeperError::Timeout(format!("the holder of {lock:?} changed under each of {ATTEMPTS} reads")))
}

fn refused(doing: &str, path: &str, err: i32) -> ZooKeeperError {
    ZooKeeperError::Refused(format!("{doing} {path:?}: ZooKeeper answered {}", describe(err)))
}

/// The contender with the lowest sequence number; two with one number cannot come
/// from one parent's counter, so they are a malformed answer, not a choice.
fn lowest_contender(children: &[String]) -> Result<Option<&str>, ZooKeeperError> {
    let mut contenders: Vec<(i64, &str)> =
        children.iter().filter_map(|c| Some((lock_node::sequence(c)?, c.as_str()))).collect();
    contenders.sort_unstable();
    match contenders.as_slice() {
        [] => Ok(None),
        [(a, first), (b, second), ..] if a == b => Err(ZooKeeperError::Malformed(format!(
            "ZooKeeper listed two contenders with sequence number {a}: {first:?} and {second:?}"
        ))),
        [(_, first), ..] => Ok(Some(first)),
    }
}

/// Whether `token` (`czxid`) is the holder's of `lock`.
fn judge(token: &Token, czxid: i64, lock: &str, holder: Option<Holder>) -> Origin {
    let Some(holder) = holder else {
        return Origin::Unverified(format!("token {token} is not the lock holder's: nobody holds the ZooKeeper lock {lock:?}"));
    };
    if holder.czxid == czxid {
        return Origin::Issued;
    }
    let whose = if czxid < holder.czxid { "an earlier holder's" } else { "a waiting contender's" };
    Origin::Unverified(format!(
        "token {token} is not the lock holder's: the ZooKeeper lock {lock:?} is held by {:?}, token {}; \
         this one is {whose} or was never issued",
        holder.node,
        lock_node::token_text(holder.czxid)
    ))
}

fn not_a_zxid(token: &Token, why: NotAZxid) -> Origin {
    Origin::Unverified(format!("ZooKeeper has not issued token {token}: {why}"))
}

impl Provenance for ZooKeeperProvenance {
    fn check(&self, resource: &str, token: &Token) -> Result<Origin, ProvenanceError> {
        let czxid = match lock_node::czxid(token) {
            Ok(czxid) => czxid,
            Err(why) => return Ok(not_a_zxid(token, why)),
        };
        let name = format!("{}{resource}", self.lock_prefix);
        let path = if name.len() > MAX_PATH { None } else { lock_node::lock_path(&name) };
        let Some(lock) = path else {
            let shown = if name.len() > MAX_PATH { format!("of {} bytes", name.len()) } else { format!("{name:?}") };
            return Ok(Origin::Unverified(format!(
                "token {token} is not the lock holder's: the lock name {shown} (lock prefix + resource) is no ZooKeeper path"
            )));
        };
        Ok(judge(token, czxid, &lock, self.holder(&lock)?))
    }

    fn describe(&self) -> String {
        format!("zookeeper {} strong, locks under {:?}", self.address, self.lock_prefix)
    }
}
