//! A lock in one Redis node, with a fencing token.
//!
//! A Redis lock (`SET key value NX PX ttl`) says who holds it, not in what order: it
//! has no number that grows. The token is a counter incremented in the same Lua
//! script that sets the key (`redis_acquire.lua`), so acquisition and token are one
//! atomic step. Renewal and release are scripts too, each acting only while the key
//! still holds this holder's value (compare-and-expire, compare-and-delete): a holder
//! whose key expired never extends or deletes the next holder's lock.
//!
//! Keys: `fencekeeper:lock:{NAME}` (the lock, with a TTL) and `fencekeeper:token:{NAME}`
//! (the counter, kept forever). `{NAME}` is a hash tag: both keys live in one slot of
//! a Redis Cluster, as a script's keys must.
//!
//! The client speaks RESP2 itself over one TCP stream: it sends `EVAL` and reads
//! integer, nil or error replies, which a general client crate would do with many
//! times the code. No AUTH, no TLS.

use super::{connect, unique_id, Held, Patience, Renewal};
use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The acquisition script, also shown in docs/tokens.md for other clients to run.
pub const ACQUIRE: &str = include_str!("redis_acquire.lua");
/// Extend the key's TTL only if it still holds our value.
const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                     return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
/// Delete the key only if it still holds our value.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                       return redis.call('DEL', KEYS[1]) end return 0";
/// How often a waiting client tries again.
const POLL: Duration = Duration::from_millis(100);
/// The longest bulk string or array a reply may carry: the replies here are small.
const MAX_REPLY: usize = 1 << 20;

/// A held Redis lock.
pub struct RedisLock {
    address: String,
    connection: Option<Connection>,
    key: String,
    owner: String,
    ttl: Duration,
    token: String,
}

/// Take lock `name` at `address` (`HOST:PORT`).
pub fn acquire(address: &str, name: &str, ttl: Duration, patience: Patience) -> anyhow::Result<RedisLock> {
    let context = || format!("taking lock {name:?} in Redis at {address}");
    let mut connection = Connection::open(address).with_context(context)?;
    let (key, counter) = (format!("fencekeeper:lock:{{{name}}}"), format!("fencekeeper:token:{{{name}}}"));
    let owner = unique_id();
    let ttl_ms = ttl.as_millis().to_string();
    loop {
        match connection.eval(ACQUIRE, &[&key, &counter], &[&owner, &ttl_ms]).with_context(context)? {
            Reply::Integer(token) => {
                let token = token.to_string();
                return Ok(RedisLock {
                    address: address.to_owned(),
                    connection: Some(connection),
                    key,
                    owner,
                    ttl,
                    token,
                });
            }
            Reply::Nil => {}
            other => bail!("{}: the acquisition script answered {other:?}", context()),
        }
        patience.check(name)?;
        std::thread::sleep(POLL);
    }
}

impl RedisLock {
    /// Run `script` on our key, reconnecting once if the connection broke.
    fn run(&mut self, script: &str) -> anyhow::Result<Reply> {
        let ttl_ms = self.ttl.as_millis().to_string();
        let mut connection = match self.connection.take() {
            Some(c) => c,
            None => Connection::open(&self.address)?,
        };
        let reply = connection.eval(script, &[&self.key], &[&self.owner, &ttl_ms])?;
        self.connection = Some(connection);
        Ok(reply)
    }
}

impl Held for RedisLock {
    fn token(&self) -> &str {
        &self.token
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn renew(&mut self) -> Result<(), Renewal> {
        match self.run(RENEW) {
            Ok(Reply::Integer(1)) => Ok(()),
            Ok(Reply::Integer(_)) => {
                Err(Renewal::Lost(format!("the Redis key {:?} expired or holds another holder's value", self.key)))
            }
            Ok(other) => Err(Renewal::Unreachable(format!("the renewal script answered {other:?}"))),
            Err(e) => Err(Renewal::Unreachable(format!("Redis at {}: {e:#}", self.address))),
        }
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        match self.run(RELEASE).with_context(|| format!("Redis at {}", self.address))? {
            Reply::Integer(_) => Ok(()),
            other => bail!("the release script answered {other:?}"),
        }
    }
}

/// A RESP2 reply.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Status(String),
    Integer(i64),
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
    Nil,
}

/// One connection to Redis.
struct Connection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Connection {
    fn open(address: &str) -> anyhow::Result<Connection> {
        let stream = connect(address, "Redis")?;
        stream.set_read_timeout(Some(Duration::from_secs(3)))?;
        Ok(Connection { reader: BufReader::new(stream.try_clone()?), writer: stream })
    }

    /// `EVAL script numkeys keys... args...`; an error reply is an error.
    fn eval(&mut self, script: &str, keys: &[&str], args: &[&str]) -> anyhow::Result<Reply> {
        let numkeys = keys.len().to_string();
        let mut words: Vec<&[u8]> = vec![b"EVAL", script.as_bytes(), numkeys.as_bytes()];
        words.extend(keys.iter().chain(args).map(|w| w.as_bytes()));
        self.writer.write_all(&encode(&words))?;
        read_reply(&mut self.reader, 0)
    }
}

/// A command as a RESP array of bulk strings.
fn encode(words: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for word in words {
        out.extend_from_slice(format!("${}\r\n", word.len()).as_bytes());
        out.extend_from_slice(word);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Read one reply; nested arrays at most a few levels deep, every length bounded.
fn read_reply(reader: &mut impl BufRead, depth: usize) -> anyhow::Result<Reply> {
    let mut line = Vec::new();
    reader.by_ref().take(MAX_REPLY as u64).read_until(b'\n', &mut line)?;
    let Some(line) = line.strip_suffix(b"\r\n") else { bail!("Redis closed the connection or sent a broken line") };
    let (kind, rest) = line.split_first().context("Redis sent an empty line")?;
    let text = String::from_utf8_lossy(rest).into_owned();
    let length = || -> anyhow::Result<Option<usize>> {
        let n: i64 = text.parse().with_context(|| format!("Redis sent length {text:?}"))?;
        match usize::try_from(n) {
            Ok(n) if n <= MAX_REPLY => Ok(Some(n)),
            Ok(_) => bail!("Redis sent a reply of {n} bytes or items; the limit is {MAX_REPLY}"),
            Err(_) => Ok(None),
        }
    };
    Ok(match kind {
        b'+' => Reply::Status(text),
        b'-' => bail!("Redis answered: {text}"),
        b':' => Reply::Integer(text.parse().with_context(|| format!("Redis sent integer {text:?}"))?),
        b'$' => match length()? {
            None => Reply::Nil,
            Some(n) => {
                let mut bulk = vec![0; n + 2];
                reader.read_exact(&mut bulk)?;
                bulk.truncate(n);
                Reply::Bulk(bulk)
            }
        },
        b'*' => match length()? {
            None => Reply::Nil,
            Some(_) if depth >= 4 => bail!("Redis sent arrays nested too deep"),
            Some(n) => Reply::Array((0..n).map(|_| read_reply(reader, depth + 1)).collect::<Result<_, _>>()?),
        },
        other => bail!("Redis sent a reply of unknown type {:?}", char::from(*other)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> anyhow::Result<Reply> {
        read_reply(&mut &raw[..], 0)
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(encode(&[b"EVAL", b"return 1", b"0"]), b"*3\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n0\r\n");
    }

    #[test]
    fn replies_of_each_kind_are_read() {
        assert_eq!(parse(b":34\r\n").ok(), Some(Reply::Integer(34)));
        assert_eq!(parse(b"$-1\r\n").ok(), Some(Reply::Nil));
        assert_eq!(parse(b"+OK\r\n").ok(), Some(Reply::Status("OK".into())));
        assert_eq!(parse(b"$2\r\nhi\r\n").ok(), Some(Reply::Bulk(b"hi".to_vec())));
        assert_eq!(parse(b"*2\r\n:1\r\n$-1\r\n").ok(), Some(Reply::Array(vec![Reply::Integer(1), Reply::Nil])));
        let err = parse(b"-NOSCRIPT No matching script\r\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(err, "Redis answered: NOSCRIPT No matching script");
    }

    #[test]
    fn hostile_replies_are_errors_not_allocations_or_panics() {
        assert!(parse(b"$99999999999\r\n").is_err());
        assert!(parse(b"*99999999999\r\n").is_err());
        assert!(parse(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n").is_err());
        assert!(parse(b":12").is_err());
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b"$5\r\nab").is_err());
    }
}
