//! A small Redis client for tests and benchmarks: RESP2 over one TCP stream, commands
//! of binary-safe arguments, and replies as values (an error reply is a value too,
//! since what a test checks is often the error). Replies are read with bounded
//! lengths: a test that gets a huge or broken reply fails, it does not allocate.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The longest bulk string or array a reply may carry.
const MAX_REPLY: usize = 4 << 20;

/// One reply, as RESP2 gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Status(String),
    /// `-ERR ...`: the whole line after the `-`.
    Error(String),
    /// `:34`
    Integer(i64),
    /// `$...` (None: nil)
    Bulk(Option<Vec<u8>>),
    /// `*...` (None: a nil array)
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The error's text, if this is an error.
    pub fn error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    /// A bulk string as text (lossy), None for nil or another kind.
    pub fn text(&self) -> Option<String> {
        match self {
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Reply::Status(s) => Some(s.clone()),
            _ => None,
        }
    }
}

/// A connection to one Redis server.
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    /// Connect to `addr` (replies awaited at most 30 s).
    pub fn connect(addr: SocketAddr) -> Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connecting to Redis at {addr}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_nodelay(true)?;
        Ok(Client { reader: BufReader::new(stream.try_clone()?), writer: stream })
    }

    /// Send one command and read its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> Result<Reply> {
        self.send(args)?;
        self.receive()
    }

    /// [`Client::call`] with text arguments.
    pub fn cmd(&mut self, args: &[&str]) -> Result<Reply> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.call(&args)
    }

    /// Send one command without reading its reply (pipelining: read it with
    /// [`Client::receive`], in order).
    pub fn send(&mut self, args: &[&[u8]]) -> Result<()> {
        let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        write!(out, "*{}\r\n", args.len())?;
        for arg in args {
            write!(out, "${}\r\n", arg.len())?;
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        Ok(self.writer.write_all(&out)?)
    }

    /// Read the next reply.
    pub fn receive(&mut self) -> Result<Reply> {
        parse(&mut self.reader, 0)
    }

    /// The underlying stream (to shut it down, or set its timeout).
    pub fn stream(&self) -> &TcpStream {
        &self.writer
    }
}

fn parse(reader: &mut impl BufRead, depth: usize) -> Result<Reply> {
    let mut line = Vec::new();
    reader.by_ref().take(MAX_REPLY as u64).read_until(b'\n', &mut line)?;
    let Some(line) = line.strip_suffix(b"\r\n") else { bail!("the connection closed mid-reply") };
    let Some((&kind, rest)) = line.split_first() else { bail!("an empty reply line") };
    let text = String::from_utf8_lossy(rest).into_owned();
    let size = || -> Result<Option<usize>> {
        let n: i64 = text.parse().with_context(|| format!("a length of {text:?}"))?;
        match usize::try_from(n) {
            Ok(n) if n > MAX_REPLY => bail!("a reply of {n} bytes or items, over {MAX_REPLY}"),
            Ok(n) => Ok(Some(n)),
            Err(_) => Ok(None),
        }
    };
    Ok(match kind {
        b'+' => Reply::Status(text),
        b'-' => Reply::Error(text),
        b':' => Reply::Integer(text.parse().with_context(|| format!("an integer of {text:?}"))?),
        b'$' => Reply::Bulk(match size()? {
            None => None,
            Some(n) => {
                let mut bulk = vec![0; n + 2];
                reader.read_exact(&mut bulk)?;
                bulk.truncate(n);
                Some(bulk)
            }
        }),
        b'*' if depth > 8 => bail!("arrays nested more than 8 deep"),
        b'*' => Reply::Array(match size()? {
            None => None,
            Some(n) => Some((0..n).map(|_| parse(reader, depth + 1)).collect::<Result<_>>()?),
        }),
        other => bail!("a reply of unknown type {:?}", char::from(other)),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_reply_is_read_and_errors_are_values() {
        let mut raw: &[u8] = b"+OK\r\n-STALE 34 stale\r\n:7\r\n$-1\r\n$2\r\nhi\r\n*2\r\n:1\r\n$0\r\n\r\n";
        let mut reader = BufReader::new(&mut raw);
        let replies: Vec<Reply> = (0..6).map(|_| parse(&mut reader, 0).unwrap()).collect();
        assert_eq!(replies[0], Reply::Status("OK".into()));
        assert_eq!(replies[1].error(), Some("STALE 34 stale"));
        assert_eq!(replies[2], Reply::Integer(7));
        assert_eq!(replies[3], Reply::Bulk(None));
        assert_eq!(replies[4].text().as_deref(), Some("hi"));
        assert_eq!(replies[5], Reply::Array(Some(vec![Reply::Integer(1), Reply::Bulk(Some(vec![]))])));
    }

    #[test]
    fn a_huge_or_broken_reply_is_an_error() {
        for raw in [&b"$99999999999\r\n"[..], b"*99999999999\r\n", b":x\r\n", b"$3\r\nab", b"?\r\n"] {
            assert!(parse(&mut BufReader::new(raw), 0).is_err(), "{raw:?}");
        }
    }
}
