//! A ZooKeeper session over one TCP connection: the framing, the jute encoding of the
//! few requests the lock recipe needs, pings, and watch events.
//!
//! One request is in flight at a time, so replies are matched by xid alone. Watch
//! events (xid -1) and ping replies (xid -2) that arrive in between are absorbed.
//! The session never reconnects: a lost connection ends it (the lock treats that as a
//! lost lock), which is what a holder that cannot prove its session is alive must do.

use anyhow::{bail, Context};
use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The largest frame accepted: ZooKeeper's own default limit (jute.maxbuffer).
const MAX_FRAME: usize = 0xfffff;

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
    pub(super) const PING: i32 = 11;
    pub(super) const CLOSE: i32 = -11;
}

/// Error codes (KeeperException.Code) the recipe tells apart.
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
    deleted: HashSet<String>,
    last_heard: Instant,
    closed: bool,
}

impl Session {
    /// Connect to `address` and open a session asking for `timeout` (the server
    /// clamps it to its own bounds, 2 to 20 ticks by default).
    pub fn open(address: &str, timeout: Duration) -> anyhow::Result<Session> {
        let stream = crate::lock::connect(address, "ZooKeeper")?;
        let mut session = Session {
            stream,
            buffer: Vec::new(),
            xid: 0,
            timeout,
            id: 0,
            deleted: HashSet::new(),
            last_heard: Instant::now(),
            closed: false,
        };
        let mut connect = Jute::default();
        let asked = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        connect.int(0).long(0).int(asked).long(0).buffer(&[0; 16]).bool(false);
        session.send(&connect.0)?;
        let frame =
            session.frame(Instant::now() + Duration::from_secs(5))?.context("ZooKeeper did not answer the connect")?;
        let mut reply = Reader(&frame);
        let (_protocol, granted, id) = (reply.int()?, reply.int()?, reply.long()?);
        if granted <= 0 {
            bail!("ZooKeeper refused the session");
        }
        session.timeout = Duration::from_millis(granted.unsigned_abs().into());
        session.id = id;
        Ok(session)
    }

    /// Send request `op` with `body` and wait for its reply: (error code, body).
    pub fn call(&mut self, op: i32, body: &[u8]) -> anyhow::Result<(i32, Vec<u8>)> {
        self.xid = self.xid.wrapping_add(1).max(1);
        let mut request = Jute::default();
        request.int(self.xid).int(op);
        request.0.extend_from_slice(body);
        self.send(&request.0)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let frame = self.frame(deadline)?.context("ZooKeeper did not answer within the session timeout")?;
            if let Some(reply) = self.absorb(&frame)? {
                return Ok(reply);
            }
        }
    }

    /// Ping and wait for the answer: proof that the session is alive now.
    pub fn ping(&mut self) -> anyhow::Result<()> {
        let mut ping = Jute::default();
        ping.int(PING_XID).int(op::PING);
        self.send(&ping.0)?;
        let deadline = Instant::now() + self.timeout * 2 / 3;
        loop {
            let frame = self.frame(deadline)?.context("ZooKeeper did not answer a ping")?;
            let mut reader = Reader(&frame);
            let (xid, _zxid, err) = (reader.int()?, reader.long()?, reader.int()?);
            if xid == PING_XID {
                return match err {
                    0 => Ok(()),
                    e => bail!("ZooKeeper answered the ping with {}", describe(e)),
                };
            }
            self.absorb(&frame)?;
        }
    }

    /// Wait until a watch says `path` was deleted, or `until` passes (false), pinging
    /// the server meanwhile so that the session stays alive.
    pub fn wait_deleted(&mut self, path: &str, until: Instant) -> anyhow::Result<bool> {
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

    /// End the session: the server deletes its ephemeral znodes.
    pub fn close(&mut self) -> anyhow::Result<()> {
        self.call(op::CLOSE, &[]).map(|_| ())
    }

    /// Handle one frame: a reply to the request in flight is returned; a watch event
    /// is recorded; a ping reply only shows the server is there.
    fn absorb(&mut self, frame: &[u8]) -> anyhow::Result<Option<(i32, Vec<u8>)>> {
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
            xid if xid == self.xid => Ok(Some((err, reader.0.to_vec()))),
            // The late answer to a request given up on.
            xid if xid < self.xid => Ok(None),
            other => bail!("ZooKeeper answered request {other}, expected {}", self.xid),
        }
    }

    fn send(&mut self, payload: &[u8]) -> anyhow::Result<()> {
        let length = u32::try_from(payload.len()).context("request too large")?;
        let mut frame = length.to_be_bytes().to_vec();
        frame.extend_from_slice(payload);
        let written = self.stream.write_all(&frame);
        self.closed |= written.is_err();
        written.context("writing to ZooKeeper")
    }

    /// The next whole frame, or None when `deadline` passes first. Bytes of a frame
    /// that arrives in pieces are kept across calls.
    fn frame(&mut self, deadline: Instant) -> anyhow::Result<Option<Vec<u8>>> {
        loop {
            if let Some(head) = self.buffer.first_chunk::<4>() {
                let length = u32::from_be_bytes(*head) as usize;
                if length > MAX_FRAME {
                    bail!("ZooKeeper sent a frame of {length} bytes; the limit is {MAX_FRAME}");
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
            self.stream.set_read_timeout(Some(left))?;
            let mut chunk = [0; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    bail!("ZooKeeper closed the connection (it closes an expired session's)")
                }
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(e) => {
                    self.closed = true;
                    return Err(e).context("reading from ZooKeeper");
                }
            }
        }
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

/// Jute, ZooKeeper's encoding: big-endian integers, length-prefixed bytes and strings.
#[derive(Default)]
pub struct Jute(pub Vec<u8>);

impl Jute {
    /// An int.
    pub fn int(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A long.
    pub fn long(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A boolean.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.0.push(u8::from(v));
        self
    }
    /// A byte buffer.
    pub fn buffer(&mut self, v: &[u8]) -> &mut Self {
        self.int(i32::try_from(v.len()).unwrap_or(i32::MAX));
        self.0.extend_from_slice(v);
        self
    }
    /// A string.
    pub fn string(&mut self, v: &str) -> &mut Self {
        self.buffer(v.as_bytes())
    }
}

/// Reads jute from a reply, failing (never panicking) on a short or odd one.
pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> anyhow::Result<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>().context("ZooKeeper sent a short reply")?;
        self.0 = rest;
        Ok(*head)
    }
    /// An int.
    pub fn int(&mut self) -> anyhow::Result<i32> {
        Ok(i32::from_be_bytes(self.take()?))
    }
    /// A long.
    pub fn long(&mut self) -> anyhow::Result<i64> {
        Ok(i64::from_be_bytes(self.take()?))
    }
    /// A string (a null one reads as empty).
    pub fn string(&mut self) -> anyhow::Result<String> {
        let length = self.int()?;
        let Ok(length) = usize::try_from(length) else { return Ok(String::new()) };
        if length > self.0.len() {
            bail!("ZooKeeper sent a string longer than its reply");
        }
        let (text, rest) = self.0.split_at(length);
        self.0 = rest;
        String::from_utf8(text.to_vec()).context("ZooKeeper sent a non-UTF-8 string")
    }
    /// A vector of strings.
    pub fn strings(&mut self) -> anyhow::Result<Vec<String>> {
        let count = self.int()?;
        let count = usize::try_from(count).unwrap_or(0);
        // Each string takes at least its 4-byte length: a count beyond that is a lie.
        if count > self.0.len() / 4 {
            bail!("ZooKeeper sent a list longer than its reply");
        }
        (0..count).map(|_| self.string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jute_round_trips_what_the_recipe_sends_and_reads() {
        let mut out = Jute::default();
        out.int(-2).long(0x1_0000_0005).string("/locks").bool(true);
        let mut reader = Reader(&out.0);
        assert_eq!(reader.int().ok(), Some(-2));
        assert_eq!(reader.long().ok(), Some(0x1_0000_0005));
        assert_eq!(reader.string().ok().as_deref(), Some("/locks"));
        assert_eq!(reader.0, &[1]);
    }

    #[test]
    fn short_or_lying_replies_are_errors() {
        assert!(Reader(&[0, 0, 1]).int().is_err());
        assert!(Reader(&[0, 0, 0, 9, b'a']).string().is_err());
        assert!(Reader(&[0x7f, 0xff, 0xff, 0xff]).strings().is_err());
        assert_eq!(Reader(&[0xff, 0xff, 0xff, 0xff]).string().ok().as_deref(), Some(""));
    }
}
