//! Protobuf's wire format, as much of it as etcd's messages need: a writer of
//! varint, int64 and length-delimited fields, and a reader that yields an answer's
//! fields one at a time and treats every byte as hostile (a truncated field, an
//! over-long varint, a group or an unknown wire type is an error, never a panic).

use crate::WireError;

/// A protobuf message being written.
#[derive(Default)]
pub(crate) struct Message(pub(crate) Vec<u8>);

impl Message {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    /// A varint field, always written (a `oneof` member has presence even at 0).
    pub(crate) fn set_uint(&mut self, field: u32, v: u64) {
        self.key(field, 0);
        self.varint(v);
    }

    /// A varint field; proto3 leaves out zero.
    pub(crate) fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.set_uint(field, v);
        }
    }

    /// An int64 field (two's complement, as protobuf writes a negative int64).
    pub(crate) fn int(&mut self, field: u32, v: i64) {
        self.uint(field, v as u64);
    }

    /// A length-delimited field, always written.
    pub(crate) fn set_bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    /// A bytes or string field; proto3 leaves out empty ones.
    pub(crate) fn bytes(&mut self, field: u32, b: &[u8]) {
        if !b.is_empty() {
            self.set_bytes(field, b);
        }
    }

    pub(crate) fn message(&mut self, field: u32, m: Message) {
        self.set_bytes(field, &m.0);
    }
}

/// One field of an answer.
pub(crate) enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of a message, in order.
pub(crate) struct Fields<'a> {
    rest: &'a [u8],
    what: &'static str,
}

pub(crate) fn fields<'a>(bytes: &'a [u8], what: &'static str) -> Fields<'a> {
    Fields { rest: bytes, what }
}

impl<'a> Fields<'a> {
    fn truncated(&mut self) -> WireError {
        self.rest = &[];
        WireError(format!("etcd's {} answer is cut short or not protobuf", self.what))
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let Some((&b, rest)) = self.rest.split_first() else { return Err(self.truncated()) };
            self.rest = rest;
            if shift == 63 && b > 1 {
                return Err(self.truncated());
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(self.truncated())
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], WireError> {
        match usize::try_from(n).ok().filter(|&n| n <= self.rest.len()) {
            Some(n) => {
                let (taken, rest) = self.rest.split_at(n);
                self.rest = rest;
                Ok(taken)
            }
            None => Err(self.truncated()),
        }
    }

    fn field(&mut self) -> Result<(u64, Value<'a>), WireError> {
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => self.take(8).map(|_| Value::Fixed)?,
            2 => {
                let n = self.varint()?;
                Value::Bytes(self.take(n)?)
            }
            5 => self.take(4).map(|_| Value::Fixed)?,
            // Groups (3, 4) are not in etcd's messages; 6 and 7 are not wire types.
            _ => return Err(self.truncated()),
        };
        Ok((key >> 3, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        (!self.rest.is_empty()).then(|| self.field())
    }
}

pub(crate) fn wrong_type(what: &str, field: u64) -> WireError {
    WireError(format!("etcd's {what} answer has field {field} of the wrong type"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    /// Decode a message into (field, value) pairs: nested ones as bytes.
    pub(crate) fn decoded(m: &[u8]) -> Vec<(u64, Result<u64, Vec<u8>>)> {
        fields(m, "test")
            .map(|f| match f.unwrap() {
                (n, Value::Varint(v)) => (n, Ok(v)),
                (n, Value::Bytes(b)) => (n, Err(b.to_vec())),
                (n, Value::Fixed) => (n, Ok(u64::MAX)),
            })
            .collect()
    }

    #[test]
    fn encoding_writes_negative_and_large_numbers_as_protobuf_does() {
        let mut m = Message::default();
        m.int(1, -1);
        assert_eq!(m.0, [0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let parsed = decoded(&m.0);
        assert_eq!(parsed, vec![(1, Ok(u64::MAX))]);
        let mut big = Message::default();
        big.set_bytes(1, &[7; 300]);
        assert_eq!(&big.0[..3], &[0x0a, 0xac, 0x02]);
    }
}
