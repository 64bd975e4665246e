//! Marks in the proxy's shared data, with a compare-and-swap that holds for new
//! resources too.
//!
//! Envoy skips the CAS check when a shared-data key does not exist yet, so two
//! workers creating the same key race and the lower token can win. The filter
//! therefore never creates a key while serving: a fixed number of slot keys is
//! created in `on_configure` (only those still absent, so a reloaded VM keeps the
//! other workers' marks), and each slot holds a small map resource -> mark for the
//! resources that hash into it. Every update of a slot is a real CAS.
//!
//! Slot value: one version byte, then entries of
//! `u16 LE key length, key bytes, u8 token length, canonical token text`.

use fencekeeper_core::Token;
use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

const VERSION: u8 = 1;
const KEY_PREFIX: &str = "fencekeeper/slot/";

/// Why a slot could not be read or written (the request is then undecided).
#[derive(Debug)]
pub enum SlotError {
    /// The slot key is absent: `on_configure` did not create it.
    Absent(u32),
    /// The slot's bytes do not decode.
    Corrupt(u32),
    /// The host refused the call.
    Host(Status),
}

impl std::fmt::Display for SlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotError::Absent(i) => write!(f, "shared-data slot {i} is missing"),
            SlotError::Corrupt(i) => write!(f, "shared-data slot {i} does not decode"),
            SlotError::Host(s) => write!(f, "shared data call failed ({s:?})"),
        }
    }
}

/// The slot keys of one filter configuration.
#[derive(Clone, Copy, Debug)]
pub struct Slots {
    /// How many slot keys exist.
    pub count: u32,
}

/// One read of a slot: the resource's mark and the CAS value to write back with.
pub struct Read {
    /// The slot index.
    pub slot: u32,
    /// The decoded map.
    pub entries: Vec<(String, Token)>,
    /// The CAS value of this read.
    pub cas: u32,
}

impl Read {
    /// The mark of `resource` in this slot.
    pub fn mark(&self, resource: &str) -> Option<Token> {
        self.entries.iter().find(|(k, _)| k == resource).map(|(_, t)| *t)
    }
}

impl Slots {
    /// Create every slot key that does not exist yet. Called from `on_configure`,
    /// before this worker serves. Existing slots are left alone.
    pub fn create_absent(&self) -> Result<(), Status> {
        for i in 0..self.count {
            let key = key(i);
            // An existing key (even with an empty value) reports a CAS value.
            let (_, cas) = hostcalls::get_shared_data(&key)?;
            if cas.is_none() {
                hostcalls::set_shared_data(&key, Some(&[VERSION]), None)?;
            }
        }
        Ok(())
    }

    /// Which slot holds `resource` (FNV-1a, stable across builds and workers).
    pub fn slot_of(&self, resource: &str) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        for b in resource.bytes() {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        h % self.count
    }

    /// Read the slot holding `resource`.
    pub fn read(&self, resource: &str) -> Result<Read, SlotError> {
        let slot = self.slot_of(resource);
        let (data, cas) = hostcalls::get_shared_data(&key(slot)).map_err(SlotError::Host)?;
        let cas = cas.ok_or(SlotError::Absent(slot))?;
        let entries = decode(data.as_deref().unwrap_or(&[VERSION])).ok_or(SlotError::Corrupt(slot))?;
        Ok(Read { slot, entries, cas })
    }

    /// Write `mark` for `resource` into the slot `read` came from, if nobody wrote
    /// the slot since. `Ok(false)`: the CAS lost, read again.
    pub fn write(&self, mut read: Read, resource: &str, mark: Token) -> Result<bool, SlotError> {
        match read.entries.iter_mut().find(|(k, _)| k == resource) {
            Some(entry) => entry.1 = mark,
            None => read.entries.push((resource.to_owned(), mark)),
        }
        match hostcalls::set_shared_data(&key(read.slot), Some(&encode(&read.entries)), Some(read.cas)) {
            Ok(()) => Ok(true),
            Err(Status::CasMismatch) => Ok(false),
            Err(s) => Err(SlotError::Host(s)),
        }
    }

    /// Raise the cached mark of `resource` to `mark` (never lower it), with bounded
    /// retries. Used as a cache of etcd: losing it only costs a round trip.
    pub fn raise(&self, resource: &str, mark: Token) -> Result<(), SlotError> {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let read = self.read(resource)?;
            match read.mark(resource) {
                // Equal or higher, or another arity (then etcd decides): nothing to do.
                Some(m) if m.partial_cmp(&mark) != Some(std::cmp::Ordering::Less) => return Ok(()),
                _ => {}
            }
            if self.write(read, resource, mark)? {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// How many times a lost CAS is retried before the request is undecided.
pub const MAX_CAS_ATTEMPTS: usize = 64;

fn key(slot: u32) -> String {
    format!("{KEY_PREFIX}{slot}")
}

fn encode(entries: &[(String, Token)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + entries.len() * 24);
    out.push(VERSION);
    for (k, t) in entries {
        let text = t.to_string();
        // Keys are at most 1024 bytes (the core refuses longer ones before any write),
        // canonical tokens at most 4 * 20 + 3 bytes.
        out.extend_from_slice(&(k.len() as u16).to_le_bytes());
        out.extend_from_slice(k.as_bytes());
        out.push(text.len() as u8);
        out.extend_from_slice(text.as_bytes());
    }
    out
}

fn decode(bytes: &[u8]) -> Option<Vec<(String, Token)>> {
    let (&version, mut rest) = bytes.split_first()?;
    if version != VERSION {
        return None;
    }
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let klen = usize::from(u16::from_le_bytes([*rest.first()?, *rest.get(1)?]));
        let k = std::str::from_utf8(rest.get(2..2 + klen)?).ok()?;
        rest = &rest[2 + klen..];
        let tlen = usize::from(*rest.first()?);
        let t = Token::parse(std::str::from_utf8(rest.get(1..1 + tlen)?).ok()?).ok()?;
        rest = &rest[1 + tlen..];
        entries.push((k.to_owned(), t));
    }
    Some(entries)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn slot_encoding_round_trips_and_refuses_garbage() {
        let entries = vec![
            ("/a".to_owned(), Token::parse("34").unwrap()),
            ("b\u{fc}cher".to_owned(), Token::parse("7.1042").unwrap()),
            ("k".repeat(1024), Token::parse("18446744073709551615.1.2.3").unwrap()),
        ];
        assert_eq!(decode(&encode(&entries)), Some(entries));
        assert_eq!(decode(&[VERSION]), Some(vec![]));
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[9]), None);
        assert_eq!(decode(&[VERSION, 5, 0, b'a']), None);
        assert_eq!(decode(&[VERSION, 1, 0, b'a', 2, b'x', b'y']), None);
    }

    #[test]
    fn slots_spread_resources() {
        let s = Slots { count: 256 };
        let used: std::collections::HashSet<u32> = (0..1000).map(|i| s.slot_of(&format!("/r{i}"))).collect();
        assert!(used.len() > 200);
        assert!(used.iter().all(|&i| i < 256));
    }
}
