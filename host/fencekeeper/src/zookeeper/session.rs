//! A ZooKeeper session over one TCP connection: the framing, the handshake, pings and
//! watch events.
//!
//! One request is in flight at a time, so replies are matched by xid alone. Watch
//! events (xid -1) and ping replies (xid -2) that arrive in between are absorbed.
//! A session never reconnects: a lost connection ends it ([`ZooKeeperError::Lost`]).
//! A lock holder must then treat its lock as lost, since it can no longer prove its
//! session alive; a reader (provenance) opens a new session.

use super::jute::{Jute, Reader};
use super::ZooKeeperError;
use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The largest frame accepted: ZooKeeper's own default limit (jute.maxbuffer).
const MAX_FRAME: usize = 0xfffff;

/// How long `fencekeeper lock` gives a connection and the handshake.
const CONNECT_WITHIN: Duration = Duration::from_secs(3);
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(5);

/// Operation codes (ZooDefs.OpCode).
pub mod op {
    /// Create a znode, answer its path and Stat.
    pub const CREATE2: i32 = 15;
    /// Create a znode (used for parents), answer its path.
    pub const CREATE: i32 = 1;
    /// Delete a znode.
    pub const DELETE: i32 = 2;
    /// A znode's Stat, optionally leaving a watch.
    pub const EXISTS: i32 = 3;
    /// A znode's children.
    pub const GET_CHILDREN: i32 = 8;
    /// Catch the server up with the leader, so that the next read sees every write
    /// committed before it.
    pub const SYNC: i32 = 9;
    pub(super) const PING: i32 = 11;
    pub(super) const CLOSE: i32 = -11;
}

/// Error codes (KeeperException.Code) the callers tell apart.
pub mod code {
    /// The znode does not exist.
    pub const NO_NODE: i32 = -101;
    /// The znode exists already.
    pub const NODE_EXISTS: i32 = -110;
    /// The session expired.
    pub const SESSION_EXPIRED: i32 = -112;
}

/// Watch event type: a watched znode was deleted.
const NODE_DELETED: i32 = 2;
const WATCH_XID: i32 = -1;
const PING_XID: i32 = -2;

/// An open session.
pub struct Session {
    stream: TcpStream,
    buffer: Vec<u8>,
    xid: i32,
    /// The session timeout the server granted.
    pub timeout: Duration,
    /// The session's id, for messages.
    pub id: i64,
    /// How long a request waits for its answer (the session timeout unless set).
    answer_within: Duration,
    deleted: HashSet<String>,
    last_heard: Instant,
    closed: bool,
}

/// A TCP connection to ZooKeeper at `address` (`HOST:PORT`), with no delay on small
/// writes, connected and writing within `within`.
fn connect(address: &str, within: Duration) -> Result<TcpStream, ZooKeeperError> {
    let addr = address
        .to_socket_addrs()
        .map_err(|e| ZooKeeperError::Connect(format!("ZooKeeper address {address:?} (expected HOST:PORT): {e}")))?
        .next()
        .ok_or_else(|| ZooKeeperError::Connect(format!("ZooKeeper address {address:?} resolves to nothing")))?;
    let failed = |e: std::io::Error| ZooKeeperError::Connect(format!("connecting to ZooKeeper at {address}: {e}"));
    let stream = TcpStream::connect_timeout(&addr, within).map_err(failed)?;
    stream.set_nodelay(true).map_err(failed)?;
    stream.set_write_timeout(Some(within)).map_err(failed)?;
    Ok(stream)
}

impl Session {
    /// Connect to `address` and open a session asking for `timeout` (the server
    /// clamps it to its own bounds, 2 to 20 ticks by default); requests wait for
    /// their answers as long as the session lasts.
    pub fn open(address: &str, timeout: Duration) -> Result<Session, ZooKeeperError> {
        let stream = connect(address, CONNECT_WITHIN)?;
        Self::handshake(stream, timeout, HANDSHAKE_WITHIN)
    }

    /// [`Session::open`] for a caller that must answer within `within`: the
    /// connection, the handshake and each later request are bounded by it.
    pub fn open_within(address: &str, timeout: Duration, within: Duration) -> Result<Session, ZooKeeperError> {
        let mut session = Self::handshake(connect(address, within)?, timeout, within)?;
        session.answer_within = within;
        Ok(session)
    }

    fn handshake(stream: TcpStream, timeout: Duration, within: Duration) -> Result<Session, ZooKeeperError> {
        let mut session = Session {
            stream,
            buffer: Vec::new(),
            xid: 0,
            timeout,
            id: 0,
            answer_within: timeout,
            deleted: HashSet::new(),
            last_heard: Instant::now(),
            closed: false,
        };
        let mut connect = Jute::default();
        let asked = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        connect.int(0).long(0).int(asked).long(0).buffer(&[0; 16]).bool(false);
        session.send(&connect.0)?;
        let frame = session
            .frame(Instant::now() + within)?
            .ok_or_else(|| ZooKeeperError::Timeout("ZooKeeper did not answer the connect".into()))?;
        let mut reply = Reader(&frame);
        let (_protocol, granted, id) = (reply.int()?, reply.int()?, reply.long()?);
        if granted <= 0 {
            return Err(ZooKeeperError::Refused("ZooKeeper refused the session".into()));
        }
        session.timeout = Duration::from_millis(granted.unsigned_abs().into());
        session.answer_within = session.timeout;
        session.id = id;
        Ok(session)
    }

    /// Send request `op` with `body` and wait for its reply: (error code, body).
    pub fn call(&mut self, op: i32, body: &[u8]) -> Result<(i32, Vec<u8>), ZooKeeperError> {
        self.xid = self.xid.wrapping_add(1).max(1);
        let mut request = Jute::default();
        request.int(self.xid).int(op);
        request.0.extend_from_slice(body);
        self.send(&request.0)?;
        let deadline = Instant::now() + self.answer_within;
        loop {
            let frame = self.frame(deadline)?.ok_or_else(|| {
                ZooKeeperError::Timeout(format!("ZooKeeper did not answer within {:?}", self.answer_within))
            })?;
            if let Some(reply) = self.absorb(&frame)? {
                return Ok(reply);
            }
        }
    }

    /// Ping and wait for the answer: proof that the session is alive now.
    pub fn ping(&mut self) -> Result<(), ZooKeeperError> {
        let mut ping = Jute::default();
        ping.int(PING_XID).int(op::PING);
        self.send(&ping.0)?;
        let deadline = Instant::now() + self.timeout * 2 / 3;
        loop {
            let frame = self
                .frame(deadline)?
                .ok_or_else(|| ZooKeeperError::Timeout("ZooKeeper did not answer a ping".into()))?;
            let mut reader = Reader(&frame);
            let (xid, _zxid, err) = (reader.int()?, reader.long()?, reader.int()?);
            if xid == PING_XID {
                return match err {
                    0 => Ok(()),
                    e => Err(ZooKeeperError::Refused(format!("ZooKeeper answered the ping with {}", describe(e)))),
                };
            }
            self.absorb(&frame)?;
        }
    }

    /// Wait until a watch says `path` was deleted, or `until` passes (false), pinging
    /// the server meanwhile so that the session stays alive.
    pub fn wait_deleted(&mut self, path: &str, until: Instant) -> Result<bool, ZooKeeperError> {
        loop {
            if self.deleted.remove(path) {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= until {
                return Ok(false);
            }
            if self.last_heard.elapsed() >= self.timeout / 3 {
                self.ping()?;
                continue;
            }
            let next_ping = self.last_heard + self.timeout / 3;
            if let Some(frame) = self.frame(until.min(next_ping))? {
                self.absorb(&frame)?;
            }
        }
    }

    /// True once the connection is gone: the session cannot be used or proven alive.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// How long since the server last said anything: past the session timeout, the
    /// server has expired the session.
    pub fn silent_for(&self) -> Duration {
        self.last_heard.elapsed()
    }

    /// End the session: the server deletes its ephemeral znodes.
    pub fn close(&mut self) -> Result<(), ZooKeeperError> {
        self.call(op::CLOSE, &[]).map(|_| ())
    }

    /// Handle one frame: a reply to the request in flight is returned; a watch event
    /// is recorded; a ping reply only shows the server is there.
    fn absorb(&mut self, frame: &[u8]) -> Result<Option<(i32, Vec<u8>)>, ZooKeeperError> {
        let mut reader = Reader(frame);
        let (xid, _zxid, err) = (reader.int()?, reader.long()?, reader.int()?);
        match xid {
            WATCH_XID => {
                let (kind, _state, path) = (reader.int()?, reader.int()?, reader.string()?);
                if kind == NODE_DELETED {
                    self.deleted.insert(path);
                }
                Ok(None)
            }
            PING_XID => Ok(None),
            xid if xid == self.xid => Ok(Some((err, reader.rest().to_vec()))),
            // The late answer to a request given up on.
            xid if xid < self.xid => Ok(None),
            other => {
                Err(ZooKeeperError::Malformed(format!("ZooKeeper answered request {other}, expected {}", self.xid)))
            }
        }
    }

    fn send(&mut self, payload: &[u8]) -> Result<(), ZooKeeperError> {
        let length = u32::try_from(payload.len())
            .map_err(|_| ZooKeeperError::Malformed(format!("a request of {} bytes is too large", payload.len())))?;
        let mut frame = length.to_be_bytes().to_vec();
        frame.extend_from_slice(payload);
        self.stream.write_all(&frame).map_err(|e| {
            self.closed = true;
            ZooKeeperError::Lost(format!("writing to ZooKeeper: {e}"))
        })
    }

    /// The next whole frame, or None when `deadline` passes first. Bytes of a frame
    /// that arrives in pieces are kept across calls.
    fn frame(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, ZooKeeperError> {
        loop {
            if let Some(head) = self.buffer.first_chunk::<4>() {
                let length = u32::from_be_bytes(*head) as usize;
                if length > MAX_FRAME {
                    self.closed = true;
                    let said = format!("ZooKeeper sent a frame of {length} bytes; the limit is {MAX_FRAME}");
                    return Err(ZooKeeperError::Malformed(said));
                }
                if self.buffer.len() >= 4 + length {
                    let frame = self.buffer[4..4 + length].to_vec();
                    self.buffer.drain(..4 + length);
                    self.last_heard = Instant::now();
                    return Ok(Some(frame));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left)).map_err(|e| self.lost("reading from ZooKeeper", e))?;
            let mut chunk = [0; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    return Err(ZooKeeperError::Lost(
                        "ZooKeeper closed the connection (it closes an expired session's)".into(),
                    ));
                }
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(e) => return Err(self.lost("reading from ZooKeeper", e)),
            }
        }
    }

    fn lost(&mut self, doing: &str, e: std::io::Error) -> ZooKeeperError {
        self.closed = true;
        ZooKeeperError::Lost(format!("{doing}: {e}"))
    }
}

/// A ZooKeeper error code in words.
pub fn describe(code: i32) -> String {
    let name = match code {
        code::NO_NODE => "NONODE",
        code::NODE_EXISTS => "NODEEXISTS",
        code::SESSION_EXPIRED => "SESSIONEXPIRED",
        -4 => "CONNECTIONLOSS",
        -8 => "BADARGUMENTS",
        -102 => "NOAUTH",
        -108 => "NOCHILDRENFOREPHEMERALS",
        _ => "error",
    };
    format!("{name} ({code})")
}
