//! The stored form of a version chain: one ASCII line per resource, checked like a
//! mark's record (CRC32C over the resource and the line), so a damaged chain is an
//! error, never an empty chain that would forget a write that may still apply.
//!
//! ```text
//! value   = "fkc3 " highest " " current " " next " " count (" " id " " token " " on " " until " " makes)* " " crc
//! highest = the highest token lent, or "-"
//! current = "?" (unknown) | version
//! on      = version
//! until   = "-" (ends only by hand) | Unix milliseconds past which the lend ends
//! makes   = "?" (not told) | version: the version the write would make
//! version = "-" (absent) | the ETag's bytes in lowercase hex
//! crc     = 8 lowercase hex digits: fencekeeper_core::record::checksum(resource, value up to the crc)
//! ```
//!
//! `fkc2`, written before lends kept the version they would make, is the same
//! without `makes`, and `fkc1`, written before lends had terms, also without `until`:
//! both are still read (their lends make versions not told; `fkc1`'s end only by
//! hand), and written back as `fkc3` at their next change. A host older than `fkc3`
//! refuses an `fkc3` record as not a chain: upgrade every instance on one etcd prefix
//! together.

use crate::{Chain, Lend, Version, MAX_LENDS, MAX_VERSION};
use fencekeeper_core::record::checksum;
use fencekeeper_core::Token;
use std::fmt::{self, Write};

/// The record's format: `Fkc1` lends have no term.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Fkc1,
    Fkc2,
    Fkc3,
}

impl Format {
    fn tag(self) -> &'static str {
        match self {
            Format::Fkc1 => "fkc1",
            Format::Fkc2 => "fkc2",
            Format::Fkc3 => "fkc3",
        }
    }
}

/// Why a stored value is not a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainRecordError {
    /// Not a chain record of this format.
    NotARecord,
    /// The checksum does not match.
    Mismatch,
    /// The checksum matches but a field is not what the writer writes.
    Malformed,
}

impl fmt::Display for ChainRecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChainRecordError::NotARecord => "it is not a version chain record (expected \"fkc3 ...\")",
            ChainRecordError::Mismatch => {
                "its checksum does not match its contents: the record is damaged or belongs to another resource"
            }
            ChainRecordError::Malformed => "its checksum matches but its fields are malformed",
        })
    }
}

impl std::error::Error for ChainRecordError {}

/// The record of `chain` as `resource`'s.
pub fn encode(resource: &str, chain: &Chain) -> String {
    encode_as(Format::Fkc3, resource, chain)
}

fn encode_as(format: Format, resource: &str, chain: &Chain) -> String {
    let mut out = String::with_capacity(64 + chain.lends.len() * 192);
    let highest = chain.highest.map_or_else(|| "-".to_owned(), |t| t.to_string());
    let current = chain.current.as_ref().map_or_else(|| "?".to_owned(), version);
    let _ = write!(out, "{} {highest} {current} {} {}", format.tag(), chain.next, chain.lends.len());
    for lend in &chain.lends {
        let _ = write!(out, " {} {} {}", lend.id, lend.token, version(&lend.on));
        if format != Format::Fkc1 {
            let _ = match lend.until {
                Some(until) => write!(out, " {until}"),
                None => write!(out, " -"),
            };
        }
        if format == Format::Fkc3 {
            let _ = match &lend.makes {
                Some(makes) => write!(out, " {}", version(makes)),
                None => write!(out, " ?"),
            };
        }
    }
    out.push(' ');
    let crc = checksum(resource.as_bytes(), out.as_bytes());
    let _ = write!(out, "{crc:08x}");
    out
}

/// The chain that `value` records for `resource`, verified.
pub fn decode(resource: &str, value: &[u8]) -> Result<Chain, ChainRecordError> {
    let text = std::str::from_utf8(value).map_err(|_| ChainRecordError::NotARecord)?;
    let format = match text.get(..5) {
        Some("fkc3 ") => Format::Fkc3,
        Some("fkc2 ") => Format::Fkc2,
        Some("fkc1 ") => Format::Fkc1,
        _ => return Err(ChainRecordError::NotARecord),
    };
    let (body, crc) = text.rsplit_once(' ').ok_or(ChainRecordError::NotARecord)?;
    let stored = (crc.len() == 8).then(|| u32::from_str_radix(crc, 16).ok()).flatten();
    let stored = stored.ok_or(ChainRecordError::NotARecord)?;
    if stored != checksum(resource.as_bytes(), &value[..body.len() + 1]) {
        return Err(ChainRecordError::Mismatch);
    }
    let chain = fields(format, body).ok_or(ChainRecordError::Malformed)?;
    // One chain, one value: anything else was not written by us.
    if encode_as(format, resource, &chain).as_bytes() != value {
        return Err(ChainRecordError::Malformed);
    }
    Ok(chain)
}

fn fields(format: Format, body: &str) -> Option<Chain> {
    let mut words = body.split(' ').skip(1);
    let highest = match words.next()? {
        "-" => None,
        t => Some(Token::parse(t).ok()?),
    };
    let current = match words.next()? {
        "?" => None,
        v => Some(unversion(v)?),
    };
    let next = words.next()?.parse::<u64>().ok()?;
    let count = words.next()?.parse::<usize>().ok().filter(|n| *n <= MAX_LENDS)?;
    let mut lends = Vec::with_capacity(count);
    for _ in 0..count {
        let id = words.next()?.parse::<u64>().ok()?;
        let token = Token::parse(words.next()?).ok()?;
        let on = unversion(words.next()?)?;
        let until = match format {
            Format::Fkc1 => None,
            Format::Fkc2 | Format::Fkc3 => match words.next()? {
                "-" => None,
                ms => Some(ms.parse::<u64>().ok()?),
            },
        };
        let makes = match format {
            Format::Fkc1 | Format::Fkc2 => None,
            Format::Fkc3 => match words.next()? {
                "?" => None,
                v => Some(unversion(v)?),
            },
        };
        lends.push(Lend { id, token, on, makes, until });
    }
    words.next().is_none().then_some(Chain { highest, current, lends, next })
}

fn version(v: &Version) -> String {
    match v {
        Version::Absent => "-".to_owned(),
        Version::Tag(tag) => tag.bytes().fold(String::with_capacity(tag.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        }),
    }
}

fn unversion(hex: &str) -> Option<Version> {
    if hex == "-" {
        return Some(Version::Absent);
    }
    if hex.is_empty() || !hex.len().is_multiple_of(2) || hex.len() > MAX_VERSION * 2 {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect();
    Version::tag(&bytes?).ok()
}
