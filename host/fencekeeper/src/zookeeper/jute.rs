//! Jute, ZooKeeper's encoding: big-endian integers, length-prefixed bytes and strings,
//! vectors as a count and their items.
//!
//! The [`Reader`] treats every reply as hostile: a short reply, a length beyond what is
//! left, a count beyond a caller's bound or a string that is not UTF-8 is an error,
//! never a panic and never a default that could pass for an answer.

use super::ZooKeeperError;

/// A request being written.
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

fn malformed(what: &str) -> ZooKeeperError {
    ZooKeeperError::Malformed(format!("ZooKeeper sent {what}"))
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], ZooKeeperError> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or_else(|| malformed("a short reply"))?;
        self.0 = rest;
        Ok(*head)
    }
    /// An int.
    pub fn int(&mut self) -> Result<i32, ZooKeeperError> {
        Ok(i32::from_be_bytes(self.take()?))
    }
    /// A long.
    pub fn long(&mut self) -> Result<i64, ZooKeeperError> {
        Ok(i64::from_be_bytes(self.take()?))
    }
    /// A string (a null one reads as empty).
    pub fn string(&mut self) -> Result<String, ZooKeeperError> {
        self.bounded_string(usize::MAX)
    }
    /// A string of at most `max` bytes.
    pub fn bounded_string(&mut self, max: usize) -> Result<String, ZooKeeperError> {
        let length = self.int()?;
        let Ok(length) = usize::try_from(length) else { return Ok(String::new()) };
        if length > self.0.len() {
            return Err(malformed("a string longer than its reply"));
        }
        if length > max {
            return Err(malformed(&format!("a name of {length} bytes; the limit is {max}")));
        }
        let (text, rest) = self.0.split_at(length);
        self.0 = rest;
        String::from_utf8(text.to_vec()).map_err(|_| malformed("a non-UTF-8 string"))
    }
    /// A vector of strings.
    pub fn strings(&mut self) -> Result<Vec<String>, ZooKeeperError> {
        self.bounded_strings(usize::MAX, usize::MAX)
    }
    /// A vector of at most `count` strings of at most `length` bytes each (a null
    /// vector reads as empty).
    pub fn bounded_strings(&mut self, count: usize, length: usize) -> Result<Vec<String>, ZooKeeperError> {
        let n = usize::try_from(self.int()?).unwrap_or(0);
        // Each string takes at least its 4-byte length: a count beyond that is a lie.
        if n > self.0.len() / 4 {
            return Err(malformed("a list longer than its reply"));
        }
        if n > count {
            return Err(malformed(&format!("a list of {n} names; the limit is {count}")));
        }
        (0..n).map(|_| self.bounded_string(length)).collect()
    }
    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.0
    }
    /// Fail unless everything was read: a reply longer than its fields is not the
    /// reply that was asked for.
    pub fn end(&self) -> Result<(), ZooKeeperError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(malformed(&format!("{n} bytes more than the reply holds"))),
        }
    }
}

/// A znode's Stat, as ZooKeeper sends it (DataTree's `Stat`, 68 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The zxid of the transaction that created the znode.
    pub czxid: i64,
    /// The session that owns the znode if it is ephemeral, else 0.
    pub ephemeral_owner: i64,
}

impl Reader<'_> {
    /// A Stat; only the fields a caller uses are kept, all are read.
    pub fn stat(&mut self) -> Result<Stat, ZooKeeperError> {
        let czxid = self.long()?;
        let (_mzxid, _ctime, _mtime) = (self.long()?, self.long()?, self.long()?);
        let (_version, _cversion, _aversion) = (self.int()?, self.int()?, self.int()?);
        let ephemeral_owner = self.long()?;
        let (_data_length, _children, _pzxid) = (self.int()?, self.int()?, self.long()?);
        Ok(Stat { czxid, ephemeral_owner })
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
        assert_eq!(reader.rest(), &[1]);
        assert!(reader.end().is_err());
    }

    #[test]
    fn short_or_lying_replies_are_errors() {
        assert!(Reader(&[0, 0, 1]).int().is_err());
        assert!(Reader(&[0, 0, 0, 9, b'a']).string().is_err());
        assert!(Reader(&[0x7f, 0xff, 0xff, 0xff]).strings().is_err());
        assert_eq!(Reader(&[0xff, 0xff, 0xff, 0xff]).string().ok().as_deref(), Some(""));
        assert!(Reader(&[0, 0, 0, 2, 0xc3, 0x28]).string().is_err(), "not UTF-8");
        assert!(Reader(&[0; 67]).stat().is_err(), "a Stat is 68 bytes");
    }

    #[test]
    fn bounds_refuse_long_lists_and_long_names() {
        let mut three = Jute::default();
        three.int(3).string("a").string("b").string("c");
        assert_eq!(Reader(&three.0).bounded_strings(3, 1).ok().map(|v| v.len()), Some(3));
        assert!(Reader(&three.0).bounded_strings(2, 1).is_err());
        let mut long = Jute::default();
        long.int(1).string("abcdef");
        assert!(Reader(&long.0).bounded_strings(10, 5).is_err());
        assert!(Reader(&long.0).bounded_strings(10, 6).is_ok());
    }
}
