//! The stored form of a mark: one record per resource, checked whenever it is read.
//!
//! A mark store that forgets a mark, or remembers a lower one, has lost the fence.
//! Disks, partial copies and careless tools damage bytes; a damaged digit must not
//! read back as a lower mark, and a damaged key must not hand the mark to another
//! resource. So every stored mark is a record that carries a checksum over both the
//! resource key and the token, and every reader verifies it. The file store, the
//! host's etcd store and the Envoy filter's etcd code all write and read this one
//! format, so they can share marks.
//!
//! ```text
//! value     = "fk2 " token " " crc
//! token     = the token's canonical text (`Token`'s `Display`): 34, 7.1042
//! crc       = 8 lowercase hex digits: CRC32C over
//!             len(resource) as 8 bytes little-endian ‖ resource ‖ the value up to the crc
//! example   = "fk2 34 fc4dab37"  (mark 34 of resource "orders/2026.csv")
//! ```
//!
//! The value is plain ASCII, so an operator reading etcd with `etcdctl` sees the mark.
//! It is deterministic (one token, one resource, one value), which matters because
//! etcd writers compare-and-swap on the exact value bytes. `fk2` names the format:
//! format 1 was the bare token text with no checksum; such a value decodes as
//! [`RecordError::Unchecked`], never as a mark.
//!
//! Why CRC32C and not a 64-bit hash: a CRC detects *every* error burst up to 32 bits
//! long and every error of up to three flipped bits in a value this short, with
//! certainty, where a hash only makes each such error unlikely to pass. The damage
//! this guards against (a flipped bit or byte, a short overwritten run) is exactly
//! that kind; random damage passes with probability 2^-32. A CRC is not a MAC: it
//! stops accidents, not someone who can write the store on purpose.
//!
//! Pure functions: no I/O, no allocation, no panics on any input, so a fuzz target
//! can call [`decode`] directly.

use crate::token::{Token, MAX_COMPONENTS};
use core::fmt;

/// What every record starts with: the format's name and a space.
pub const TAG: &str = "fk2 ";

/// The longest canonical token text: four `u64::MAX` components and three dots.
const MAX_TOKEN_TEXT: usize = MAX_COMPONENTS * 20 + (MAX_COMPONENTS - 1);

/// Hex digits of the checksum.
const CRC_DIGITS: usize = 8;

/// The longest record value, in bytes.
pub const MAX_LEN: usize = TAG.len() + MAX_TOKEN_TEXT + 1 + CRC_DIGITS;

/// An encoded record value, held inline (no allocation).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Record {
    bytes: [u8; MAX_LEN],
    len: usize,
}

impl Record {
    /// The value's bytes, as stored.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }

    /// The value as text (it is always ASCII).
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Record({:?})", self.as_str())
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a stored value is not a usable mark. None of these is ever read as a mark,
/// nor as "no mark".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// The value is a bare token: a mark stored in format 1, before records carried
    /// a checksum. It cannot be verified, so it is not trusted as is.
    Unchecked,
    /// The value is not a record of any known format.
    NotARecord,
    /// The checksum does not match the resource and the token: the value was
    /// damaged, or it belongs to another resource.
    Mismatch {
        /// The checksum the value carries.
        stored: u32,
        /// The checksum of what the value holds, under this resource.
        computed: u32,
    },
    /// The checksum matches, but the token text is not a canonical token: the
    /// writer was wrong, not the disk.
    BadToken,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Unchecked => f.write_str(
                "it is a bare token in the old format without a checksum (format 1), so it cannot be verified",
            ),
            RecordError::NotARecord => f.write_str("it is not a mark record (expected \"fk2 TOKEN CRC\")"),
            RecordError::Mismatch { stored, computed } => write!(
                f,
                "its checksum {stored:08x} does not match its contents ({computed:08x}): \
                 the record is damaged or belongs to another resource"
            ),
            RecordError::BadToken => f.write_str("its checksum matches but its token is not a canonical fencing token"),
        }
    }
}

/// The record of `token` as `resource`'s mark.
pub fn encode(resource: &[u8], token: &Token) -> Record {
    let mut record = Record { bytes: [0; MAX_LEN], len: 0 };
    let mut out = Writer { record: &mut record };
    // Cannot fail: MAX_LEN holds the longest tag, token and checksum.
    let _ = fmt::write(&mut out, format_args!("{TAG}{token} "));
    let crc = checksum(resource, record.as_bytes());
    let mut out = Writer { record: &mut record };
    let _ = fmt::write(&mut out, format_args!("{crc:08x}"));
    record
}

/// The mark that `value` records for `resource`, verified.
pub fn decode(resource: &[u8], value: &[u8]) -> Result<Token, RecordError> {
    let Some(body) = value.strip_prefix(TAG.as_bytes()) else {
        let bare = core::str::from_utf8(value).ok().and_then(|text| Token::parse(text).ok());
        return Err(if bare.is_some() { RecordError::Unchecked } else { RecordError::NotARecord });
    };
    let Some(split) = body.len().checked_sub(CRC_DIGITS + 1) else {
        return Err(RecordError::NotARecord);
    };
    let (token_text, tail) = body.split_at(split);
    let (Some((&b' ', digits)), false) = (tail.split_first(), token_text.is_empty()) else {
        return Err(RecordError::NotARecord);
    };
    let stored = parse_crc(digits).ok_or(RecordError::NotARecord)?;
    let checked = value.get(..value.len() - CRC_DIGITS).unwrap_or_default();
    let computed = checksum(resource, checked);
    if stored != computed {
        return Err(RecordError::Mismatch { stored, computed });
    }
    let token =
        core::str::from_utf8(token_text).ok().and_then(|text| Token::parse(text).ok()).ok_or(RecordError::BadToken)?;
    // One token, one value: anything but the canonical text was not written by us.
    if encode(resource, &token).as_bytes() != value {
        return Err(RecordError::BadToken);
    }
    Ok(token)
}

/// The token a value appears to hold, without any check: the token text of a
/// record (damaged or not) or a bare format-1 token. Never a mark; a repair uses it
/// only as a floor that a mark set by hand must lie above.
pub fn legible(value: &[u8]) -> Option<Token> {
    let text = core::str::from_utf8(value).ok()?;
    let token_text = match text.strip_prefix(TAG) {
        Some(body) => body.rsplit_once(' ').map_or(body, |(token, _)| token),
        None => text,
    };
    Token::parse(token_text).ok()
}

/// CRC32C of the resource (length-prefixed, so resource and value cannot trade
/// bytes) followed by `checked`. Other checked records of a resource (the version
/// chains of conditional writes) use the same sum.
pub fn checksum(resource: &[u8], checked: &[u8]) -> u32 {
    let mut crc = Crc32c::new();
    crc.update(&(resource.len() as u64).to_le_bytes());
    crc.update(resource);
    crc.update(checked);
    crc.finish()
}

fn parse_crc(digits: &[u8]) -> Option<u32> {
    if digits.len() != CRC_DIGITS {
        return None;
    }
    digits.iter().try_fold(0u32, |acc, &d| {
        let nibble = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => return None,
        };
        Some(acc << 4 | u32::from(nibble))
    })
}

/// Appends to a record's inline buffer; refuses (never panics) when it is full.
struct Writer<'a> {
    record: &'a mut Record,
}

impl fmt::Write for Writer<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.record.len + s.len();
        let slot = self.record.bytes.get_mut(self.record.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.record.len = end;
        Ok(())
    }
}

/// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78), the checksum of iSCSI,
/// ext4 metadata and etcd's write-ahead log. Table-driven, one byte at a time:
/// records are under a hundred bytes plus the key.
struct Crc32c(u32);

const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

impl Crc32c {
    fn new() -> Crc32c {
        Crc32c(!0)
    }

    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = CRC32C_TABLE[((self.0 ^ u32::from(b)) & 0xff) as usize] ^ (self.0 >> 8);
        }
    }

    fn finish(&self) -> u32 {
        !self.0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::token;
    use proptest::prelude::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        let mut crc = Crc32c::new();
        crc.update(b"123456789");
        assert_eq!(crc.finish(), 0xE306_9283);
    }

    #[test]
    fn the_format_is_frozen() {
        // Stored marks, the gateway and the Envoy filter all depend on these bytes.
        assert_eq!(encode(b"orders/2026.csv", &token!("34")).as_str(), "fk2 34 fc4dab37");
    }

    #[test]
    fn legible_is_the_token_a_value_shows_without_any_check() {
        assert_eq!(legible(b"fk2 40 00000000"), Some(token!("40")));
        assert_eq!(legible(b"34"), Some(token!("34")));
        assert_eq!(legible(b"fk2 x 00000000"), None);
        assert_eq!(legible(b"\xff"), None);
    }

    #[test]
    fn a_record_reads_back_as_its_mark_and_is_readable_text() {
        for token in ["34", "7.1042", "0", "18446744073709551615.18446744073709551615.18446744073709551615.1"] {
            let record = encode(b"orders/2026.csv", &token!(token));
            assert!(record.as_str().starts_with(&std::format!("fk2 {token} ")), "{record}");
            assert_eq!(record.as_bytes().len(), TAG.len() + token.len() + 1 + CRC_DIGITS);
            assert_eq!(decode(b"orders/2026.csv", record.as_bytes()), Ok(token!(token)));
        }
        // Canonical: a token written with leading zeros is stored without them.
        assert_eq!(encode(b"r", &token!("007.01042")), encode(b"r", &token!("7.1042")));
    }

    #[test]
    fn the_longest_token_fits() {
        let max = Token::from_parts(&[u64::MAX; MAX_COMPONENTS]).unwrap();
        let record = encode(&[0xff; 1024], &max);
        assert_eq!(record.as_bytes().len(), MAX_LEN);
        assert_eq!(decode(&[0xff; 1024], record.as_bytes()), Ok(max));
    }

    #[test]
    fn a_flipped_digit_is_a_mismatch_not_a_lower_mark() {
        let record = encode(b"r", &token!("50"));
        let mut damaged = record.as_bytes().to_vec();
        damaged[TAG.len()] ^= 0x01; // '5' -> '4'
        assert!(std::str::from_utf8(&damaged).unwrap().starts_with("fk2 40 "));
        assert!(matches!(decode(b"r", &damaged), Err(RecordError::Mismatch { .. })));
    }

    #[test]
    fn a_record_under_another_key_is_a_mismatch() {
        let record = encode(b"orders/a", &token!("50"));
        assert!(matches!(decode(b"orders/b", record.as_bytes()), Err(RecordError::Mismatch { .. })));
        assert!(matches!(decode(b"orders/", record.as_bytes()), Err(RecordError::Mismatch { .. })));
    }

    #[test]
    fn a_bare_token_is_unchecked_and_garbage_is_not_a_record() {
        assert_eq!(decode(b"r", b"34"), Err(RecordError::Unchecked));
        assert_eq!(decode(b"r", b"7.1042"), Err(RecordError::Unchecked));
        for garbage in
            [&b""[..], b"fk2 ", b"fk2 34", b"fk2 34 1234567", b"fk2 34 123456789", b"fk2  00000000", b"\xff\xfe"]
        {
            assert_eq!(decode(b"r", garbage), Err(RecordError::NotARecord), "{garbage:?}");
        }
        // Upper-case hex is not what the encoder writes.
        let upper = encode(b"r", &token!("34")).as_str().to_ascii_uppercase().replace("FK2", "fk2");
        assert!(decode(b"r", upper.as_bytes()).is_err());
    }

    #[test]
    fn a_checksummed_non_canonical_token_is_refused() {
        // What a buggy writer that checksums its own spelling would produce.
        let forged = |text: &str| {
            let body = std::format!("{TAG}{text} ");
            std::format!("{body}{:08x}", checksum(b"r", body.as_bytes()))
        };
        assert_eq!(decode(b"r", forged("34").as_bytes()), Ok(token!("34")));
        for bad in ["034", "x", "1.2.3.4.5", "-1", ""] {
            assert!(decode(b"r", forged(bad).as_bytes()).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn every_single_byte_change_is_caught(
            parts in proptest::collection::vec(any::<u64>(), 1..=MAX_COMPONENTS),
            resource in proptest::collection::vec(any::<u8>(), 1..64),
            at in any::<proptest::sample::Index>(),
            xor in 1u8..=255,
        ) {
            let token = Token::from_parts(&parts).unwrap();
            let record = encode(&resource, &token);
            let mut damaged = record.as_bytes().to_vec();
            let i = at.index(damaged.len());
            damaged[i] ^= xor;
            prop_assert!(decode(&resource, &damaged).is_err());
            // And a change in the key, with the value intact.
            let mut key = resource.clone();
            let k = at.index(key.len());
            key[k] ^= xor;
            prop_assert!(decode(&key, record.as_bytes()).is_err());
        }

        #[test]
        fn decode_never_panics_and_only_accepts_what_encode_writes(
            resource in proptest::collection::vec(any::<u8>(), 0..32),
            value in proptest::collection::vec(any::<u8>(), 0..120),
        ) {
            if let Ok(token) = decode(&resource, &value) {
                let again = encode(&resource, &token);
                prop_assert_eq!(again.as_bytes(), &value[..]);
            }
        }
    }
}
