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
            return Err(ZooKeeperError::Malformed(format!(
                "ZooKeeper said {node_path:?} was created at zxid {}",
                stat.czxid
            )));
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
        return Origin::Unverified(format!(
            "token {token} is not the lock holder's: nobody holds the ZooKeeper lock {lock:?}"
        ));
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

#[cfg(test)]
// A test states its expectations by panicking.
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The token the hostile servers below would vouch for if their answers were taken.
    const TOKEN: &str = "1.5";
    const CZXID: i64 = 0x1_0000_0005;

    /// What a fake server sends for request `op` (xid `xid`) on its `connection`th
    /// connection: bytes, or None to close the connection.
    type Script = dyn Fn(usize, i32, i32) -> Option<Vec<u8>> + Send + Sync;

    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(payload.len()).unwrap().to_be_bytes().to_vec();
        out.extend_from_slice(payload);
        out
    }

    fn reply(xid: i32, err: i32, body: &[u8]) -> Vec<u8> {
        let mut header = Jute::default();
        header.int(xid).long(7).int(err);
        header.0.extend_from_slice(body);
        framed(&header.0)
    }

    fn names(children: &[&str]) -> Vec<u8> {
        let mut list = Jute::default();
        list.int(children.len() as i32);
        for child in children {
            list.string(child);
        }
        list.0
    }

    fn stat(czxid: i64) -> Vec<u8> {
        let mut stat = Jute::default();
        stat.long(czxid).long(czxid).long(0).long(0).int(0).int(0).int(0).long(0x77).int(0).int(0).long(czxid);
        stat.0
    }

    fn read_frame(stream: &mut TcpStream) -> Option<Vec<u8>> {
        let mut head = [0; 4];
        stream.read_exact(&mut head).ok()?;
        let mut payload = vec![0; u32::from_be_bytes(head) as usize];
        stream.read_exact(&mut payload).ok()?;
        Some(payload)
    }

    /// A ZooKeeper on loopback that grants every session, then answers as `script` says.
    fn fake(script: Arc<Script>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let connections = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let (script, n) = (script.clone(), connections.fetch_add(1, Ordering::SeqCst));
                std::thread::spawn(move || {
                    read_frame(&mut stream)?;
                    let mut granted = Jute::default();
                    granted.int(0).int(5000).long(0x1234).buffer(&[0; 16]).bool(false);
                    stream.write_all(&framed(&granted.0)).ok()?;
                    while let Some(request) = read_frame(&mut stream) {
                        let mut r = Reader(&request);
                        let (xid, op) = (r.int().ok()?, r.int().ok()?);
                        stream.write_all(&script(n, xid, op)?).ok()?;
                    }
                    Some(())
                });
            }
        });
        address
    }

    /// An honest server's answers for a lock whose children are `children` and whose
    /// nodes were all created at `czxid`.
    fn honest(children: &'static [&'static str], czxid: i64) -> impl Fn(i32, i32) -> Vec<u8> {
        move |xid, op| match op {
            op::SYNC => {
                let mut path = Jute::default();
                path.string("/locks/r");
                reply(xid, 0, &path.0)
            }
            op::GET_CHILDREN => reply(xid, 0, &names(children)),
            op::EXISTS => reply(xid, 0, &stat(czxid)),
            _ => reply(xid, -6, &[]),
        }
    }

    const CHILDREN: &[&str] = &["b__lock__0000000002", "lease", "a__lock__0000000001"];

    fn check_against(script: Arc<Script>) -> Result<Origin, ProvenanceError> {
        let provenance = ZooKeeperProvenance::connect(&fake(script), "/locks", Duration::from_millis(300)).unwrap();
        provenance.check("/r", &Token::parse(TOKEN).unwrap())
    }

    /// A server that answers one operation as `hostile` says and the rest honestly.
    fn hostile(on: i32, hostile: impl Fn(i32) -> Vec<u8> + Send + Sync + 'static) -> Arc<Script> {
        let honest = honest(CHILDREN, CZXID);
        Arc::new(move |_, xid, op| Some(if op == on { hostile(xid) } else { honest(xid, op) }))
    }

    #[test]
    fn the_fake_vouches_when_honest_so_the_hostile_cases_below_can_fail() {
        let honest = honest(CHILDREN, CZXID);
        assert_eq!(check_against(Arc::new(move |_, xid, op| Some(honest(xid, op)))).unwrap(), Origin::Issued);
    }

    #[test]
    fn the_holder_is_the_lowest_contender_and_other_tokens_say_whose_they_are() {
        let children = vec!["x__lock__0000000009".to_owned(), "y__rlock__0000000004".into(), "lease".into()];
        assert_eq!(lowest_contender(&children).unwrap(), Some("y__rlock__0000000004"));
        let wrapped = vec!["x__lock__0000000009".to_owned(), "y__lock__-2147483648".into()];
        assert_eq!(lowest_contender(&wrapped).unwrap(), Some("y__lock__-2147483648"));
        assert_eq!(lowest_contender(&["lease".to_owned()]).unwrap(), None);
        let twins = vec!["x__lock__0000000001".to_owned(), "y__lock__0000000001".into()];
        assert!(lowest_contender(&twins).is_err(), "two nodes cannot share a sequence number");

        let token = Token::parse(TOKEN).unwrap();
        let held = |czxid| Some(Holder { node: "a__lock__0000000001".into(), czxid });
        assert_eq!(judge(&token, CZXID, "/locks/r", held(CZXID)), Origin::Issued);
        for (holder, says) in [
            (held(CZXID + 1), "an earlier holder's"),
            (held(CZXID - 1), "a waiting contender's"),
            (None, "nobody holds the ZooKeeper lock \"/locks/r\""),
        ] {
            let Origin::Unverified(why) = judge(&token, CZXID, "/locks/r", holder) else { panic!("vouched") };
            assert!(why.contains(says) && why.contains(TOKEN), "{why}");
        }
    }

    #[test]
    fn a_missing_lock_node_is_nobody_holding_and_tokens_that_are_no_czxid_are_not_sent() {
        let missing: Arc<Script> = Arc::new(|_, xid, _| Some(reply(xid, code::NO_NODE, &[])));
        assert!(matches!(check_against(missing), Ok(Origin::Unverified(why)) if why.contains("nobody holds")));
        // Nothing answers requests: a token that is no czxid must not ask.
        let silent: Arc<Script> = Arc::new(|_, _, _| Some(Vec::new()));
        let provenance = ZooKeeperProvenance::connect(&fake(silent), "/locks", Duration::from_millis(300)).unwrap();
        for token in ["4294967295.4294967295", "57", "1.2.3", "4294967296.1"] {
            let origin = provenance.check("/r", &Token::parse(token).unwrap()).unwrap();
            assert!(matches!(&origin, Origin::Unverified(why) if why.contains(token)), "{token}: {origin:?}");
        }
        let long = format!("/{}", "x".repeat(MAX_PATH));
        assert!(matches!(provenance.check(&long, &Token::parse(TOKEN).unwrap()), Ok(Origin::Unverified(_))));
    }

    #[test]
    fn hostile_answers_are_errors_never_a_verification() {
        let long_name = format!("{}__lock__0000000001", "x".repeat(MAX_NAME));
        let many: Vec<String> = (0..=MAX_CHILDREN).map(|i| format!("n__lock__{i:010}")).collect();
        let cases: Vec<(&str, Arc<Script>)> = vec![
            ("a list longer than its reply", hostile(op::GET_CHILDREN, |xid| reply(xid, 0, &1000i32.to_be_bytes()))),
            (
                "bytes after the list",
                hostile(op::GET_CHILDREN, |xid| reply(xid, 0, &[names(CHILDREN), vec![0]].concat())),
            ),
            ("a name over the bound", hostile(op::GET_CHILDREN, move |xid| reply(xid, 0, &names(&[&long_name])))),
            ("too many children", {
                hostile(op::GET_CHILDREN, move |xid| {
                    reply(xid, 0, &names(&many.iter().map(String::as_str).collect::<Vec<_>>()))
                })
            }),
            (
                "a name that is not UTF-8",
                hostile(op::GET_CHILDREN, |xid| reply(xid, 0, &[0, 0, 0, 1, 0, 0, 0, 1, 0xff])),
            ),
            ("twin contenders", {
                hostile(op::GET_CHILDREN, |xid| reply(xid, 0, &names(&["a__lock__0000000001", "b__lock__0000000001"])))
            }),
            ("a short Stat", hostile(op::EXISTS, |xid| reply(xid, 0, &stat(CZXID)[..60]))),
            ("a long Stat", hostile(op::EXISTS, |xid| reply(xid, 0, &[stat(CZXID), vec![0]].concat()))),
            ("a negative czxid", hostile(op::EXISTS, |xid| reply(xid, 0, &stat(-1)))),
            ("a zero czxid", hostile(op::EXISTS, |xid| reply(xid, 0, &stat(0)))),
            ("a holder that never stays", hostile(op::EXISTS, |xid| reply(xid, code::NO_NODE, &[]))),
            ("NOAUTH", hostile(op::GET_CHILDREN, |xid| reply(xid, -102, &[]))),
            ("an answer to another request", hostile(op::GET_CHILDREN, |xid| reply(xid + 5, 0, &names(CHILDREN)))),
            ("a frame over the limit", hostile(op::GET_CHILDREN, |_| 0x0010_0000u32.to_be_bytes().to_vec())),
            ("no answer", hostile(op::EXISTS, |_| Vec::new())),
            ("half an answer", hostile(op::EXISTS, |xid| reply(xid, 0, &stat(CZXID))[..40].to_vec())),
        ];
        for (case, script) in cases {
            match check_against(script) {
                Err(ProvenanceError::Unavailable(why)) => {
                    assert!(why.contains("ZooKeeper at 127.0.0.1:"), "{case}: {why}")
                }
                other => panic!("{case}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_unreachable_zookeeper_leaves_an_advance_undecided_in_efficiency_mode_too() {
        use crate::{Class, Guard, MemoryStore, Mode, NativeDecider, Policy};
        let closing: Arc<Script> = Arc::new(|_, _, _| None);
        let provenance = ZooKeeperProvenance::connect(&fake(closing), "/locks", Duration::from_millis(300)).unwrap();
        let decider = Arc::new(NativeDecider(Policy { mode: Mode::Efficiency, strict: false }));
        let guard = Guard::new(decider, Arc::new(MemoryStore::new())).with_provenance(Arc::new(provenance));
        let d = guard.admit("/r", Some(TOKEN));
        assert!(!d.admitted() && !d.action.failed_open(), "{}", d.reason("/r"));
        assert_eq!((d.class(), d.class().http_status()), (Class::Undecided, 503));
        assert_eq!(guard.mark("/r").unwrap(), None);
    }

    #[test]
    fn a_closed_session_is_replaced_once_then_the_check_answers() {
        // The first connection (opened by connect) is closed by the server at the first
        // request, as ZooKeeper closes an expired session's; the second answers.
        let honest = honest(CHILDREN, CZXID);
        let script: Arc<Script> = Arc::new(move |n, xid, op| (n > 0).then(|| honest(xid, op)));
        assert_eq!(check_against(script).unwrap(), Origin::Issued);
        // Every connection closed: an error, after one new session, not a loop.
        let closing: Arc<Script> = Arc::new(|_, _, _| None);
        assert!(matches!(check_against(closing), Err(ProvenanceError::Unavailable(why)) if why.contains("closed")));
    }
}
