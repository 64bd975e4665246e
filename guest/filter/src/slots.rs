//! Marks, and the writes in flight on them, in the proxy's shared data, with a
//! compare-and-swap that holds for new resources too.
//!
//! Envoy skips the CAS check when a shared-data key does not exist yet, so two
//! workers creating the same key race and the lower token can win. The filter
//! therefore never creates a key while serving: a fixed number of slot keys is
//! created in `on_configure` (only those still absent, so a reloaded VM keeps the
//! other workers' marks), and each slot holds a small map resource -> entry for the
//! resources that hash into it. Every update of a slot is a real CAS.
//!
//! An entry is the resource's mark and, for the ordering gate (`gate`), the writes
//! this Envoy sent on it that the store may still apply (its *flights*) and the
//! wake queues of the workers holding a write back for them. Flights and wakers are
//! there only while writes are in flight, so a slot stays as small as its marks.
//!
//! Slot value, version 2: one version byte, then entries of
//! `u16 LE key length, key bytes, token, u16 LE flight count, flights, u16 LE waker
//! count, u32 LE queue tokens`, where a token is `u8 length, canonical text` (length
//! 0: no mark) and a flight is `u64 LE owner VM, u32 LE context, u64 LE deadline (0:
//! not answered yet), token`. Version 1 (entries of key and token only, written by
//! earlier filters) is read as entries without flights.

use fencekeeper_core::Token;
use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

const VERSION: u8 = 2;
const VERSION_1: u8 = 1;
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
    /// An entry would hold more flights or wakers than its format counts.
    Full(u32),
}

impl std::fmt::Display for SlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotError::Absent(i) => write!(f, "shared-data slot {i} is missing"),
            SlotError::Corrupt(i) => write!(f, "shared-data slot {i} does not decode"),
            SlotError::Host(s) => write!(f, "shared data call failed ({s:?})"),
            SlotError::Full(i) => write!(f, "shared-data slot {i} holds {MAX_LIST} writes in flight on one resource"),
        }
    }
}

/// The most flights (or wakers) one entry holds.
pub const MAX_LIST: usize = u16::MAX as usize;

/// The slot keys of one filter configuration.
#[derive(Clone, Copy, Debug)]
pub struct Slots {
    /// How many slot keys exist.
    pub count: u32,
    /// The most marks one slot keeps (`shared_marks_max` spread over the slots);
    /// `None`: no bound (the shared data is the only copy of the marks).
    pub per_slot: Option<usize>,
}

/// A write this Envoy sent on a resource that the store may still apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedFlight {
    /// The VM (worker) that sent it: its random id.
    pub owner: u64,
    /// Its request's context id in that VM.
    pub context: u32,
    /// The token it was admitted with.
    pub token: Token,
    /// 0 while the store has not answered it; else when the VM gave up on it plus the
    /// store apply bound (milliseconds, the proxy's clock): it holds the resource
    /// until then.
    pub deadline: u64,
}

/// One resource's entry in a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The resource key.
    pub key: String,
    /// Its mark (`None` until one is admitted).
    pub mark: Option<Token>,
    /// The writes in flight on it.
    pub flights: Vec<SharedFlight>,
    /// The wake queues of the workers that hold a write back for those flights.
    pub wakers: Vec<u32>,
}

/// One read of a slot: its entries and the CAS value to write back with.
pub struct Read {
    /// The slot index.
    pub slot: u32,
    /// The decoded map.
    pub entries: Vec<Entry>,
    /// The CAS value of this read.
    pub cas: u32,
}

impl Read {
    /// The mark of `resource` in this slot.
    pub fn mark(&self, resource: &str) -> Option<Token> {
        self.entry(resource).and_then(|e| e.mark)
    }

    /// The entry of `resource`, if the slot has one.
    pub fn entry(&self, resource: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == resource)
    }

    /// The entry of `resource`, made empty if the slot had none. It moves to the end,
    /// so a slot's entries run from the least recently written.
    pub fn entry_mut(&mut self, resource: &str) -> &mut Entry {
        match self.entries.iter().position(|e| e.key == resource) {
            Some(i) => {
                let entry = self.entries.remove(i);
                self.entries.push(entry);
            }
            None => {
                let key = resource.to_owned();
                self.entries.push(Entry { key, mark: None, flights: Vec::new(), wakers: Vec::new() });
            }
        }
        let last = self.entries.len() - 1;
        &mut self.entries[last]
    }

    /// Keep at most `max` entries, evicting the least recently written that have
    /// nothing in flight (a flight or a waker is the gate's, not a cache). What is
    /// evicted is only a copy: the next request on it asks etcd.
    fn evict_past(&mut self, max: usize) {
        let mut excess = self.entries.len().saturating_sub(max);
        self.entries.retain(|e| {
            let idle = e.flights.is_empty() && e.wakers.is_empty();
            let evict = excess > 0 && idle;
            excess -= usize::from(evict);
            !evict
        });
    }
}

/// Raise `entry`'s mark to `token` (never lower it; another arity is left to etcd).
pub fn raise(entry: &mut Entry, token: Token) {
    if entry.mark.is_none_or(|m| m < token) {
        entry.mark = Some(token);
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
        read.entry_mut(resource).mark = Some(mark);
        self.store(&mut read)
    }

    /// Write `read`'s entries back into its slot, if nobody wrote the slot since,
    /// past the bound evicting the least recently written idle marks.
    /// `Ok(false)`: the CAS lost, read again.
    pub fn store(&self, read: &mut Read) -> Result<bool, SlotError> {
        if let Some(max) = self.per_slot {
            read.evict_past(max);
        }
        let bytes = encode(&read.entries).ok_or(SlotError::Full(read.slot))?;
        match hostcalls::set_shared_data(&key(read.slot), Some(&bytes), Some(read.cas)) {
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

impl Slots {
    /// Drop the cached mark of `resource` (etcd holds none: retention forgot it, or an
    /// operator cleared it), with bounded retries. A copy of etcd's: a miss only costs
    /// a round trip, so a lost race is left as it is.
    pub fn forget(&self, resource: &str) -> Result<(), SlotError> {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let mut read = self.read(resource)?;
            match read.entries.iter_mut().find(|e| e.key == resource) {
                Some(entry) if entry.mark.is_some() => entry.mark = None,
                _ => return Ok(()),
            }
            if self.store(&mut read)? {
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

/// The slot's bytes, or `None` when an entry lists more than [`MAX_LIST`] flights
/// or wakers. Entries with no mark and nothing in flight are left out.
fn encode(entries: &[Entry]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(1 + entries.len() * 24);
    out.push(VERSION);
    for e in entries.iter().filter(|e| e.mark.is_some() || !e.flights.is_empty() || !e.wakers.is_empty()) {
        // Keys are at most 1024 bytes (the core refuses longer ones before any write),
        // canonical tokens at most 4 * 20 + 3 bytes.
        out.extend_from_slice(&(e.key.len() as u16).to_le_bytes());
        out.extend_from_slice(e.key.as_bytes());
        put_token(&mut out, e.mark.as_ref());
        out.extend_from_slice(&u16::try_from(e.flights.len()).ok()?.to_le_bytes());
        for f in &e.flights {
            out.extend_from_slice(&f.owner.to_le_bytes());
            out.extend_from_slice(&f.context.to_le_bytes());
            out.extend_from_slice(&f.deadline.to_le_bytes());
            put_token(&mut out, Some(&f.token));
        }
        out.extend_from_slice(&u16::try_from(e.wakers.len()).ok()?.to_le_bytes());
        for w in &e.wakers {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    Some(out)
}

fn put_token(out: &mut Vec<u8>, token: Option<&Token>) {
    let text = token.map(Token::to_string).unwrap_or_default();
    out.push(text.len() as u8);
    out.extend_from_slice(text.as_bytes());
}

/// A cursor over a slot's bytes: every read is bounds-checked, so bytes another VM
/// (or a damaged slot) left are refused, never a panic.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn text(&mut self, n: usize) -> Option<&'a str> {
        std::str::from_utf8(self.take(n)?).ok()
    }

    /// A token, `None` inside when its length is 0 (no mark).
    fn token(&mut self) -> Option<Option<Token>> {
        let n = usize::from(*self.take(1)?.first()?);
        if n == 0 {
            return Some(None);
        }
        Token::parse(self.text(n)?).ok().map(Some)
    }
}

fn decode(bytes: &[u8]) -> Option<Vec<Entry>> {
    let (&version, rest) = bytes.split_first()?;
    if version != VERSION && version != VERSION_1 {
        return None;
    }
    let mut b = Bytes(rest);
    let mut entries = Vec::new();
    while !b.0.is_empty() {
        let klen = usize::from(b.u16()?);
        let key = b.text(klen)?.to_owned();
        let mark = b.token()?;
        let (mut flights, mut wakers) = (Vec::new(), Vec::new());
        match version {
            VERSION_1 => {
                // Version 1 entries always carry a mark.
                mark?;
            }
            _ => {
                for _ in 0..b.u16()? {
                    let (owner, context, deadline) = (b.u64()?, b.u32()?, b.u64()?);
                    flights.push(SharedFlight { owner, context, deadline, token: b.token()?? });
                }
                for _ in 0..b.u16()? {
                    wakers.push(b.u32()?);
                }
            }
        }
        entries.push(Entry { key, mark, flights, wakers });
    }
    Some(entries)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    fn entry(key: &str, mark: &str) -> Entry {
        Entry { key: key.to_owned(), mark: Some(token!(mark)), flights: vec![], wakers: vec![] }
    }

    #[test]
    fn slot_encoding_round_trips_and_refuses_garbage() {
        let mut busy = entry("k".repeat(1024).as_str(), "18446744073709551615.1.2.3");
        busy.flights = vec![
            SharedFlight { owner: u64::MAX, context: 7, token: token!("18446744073709551615.1.2.2"), deadline: 0 },
            SharedFlight { owner: 1, context: u32::MAX, token: token!("1.1.1.1"), deadline: 123_456 },
        ];
        busy.wakers = vec![1, u32::MAX];
        let entries = vec![entry("/a", "34"), entry("b\u{fc}cher", "7.1042"), busy];
        assert_eq!(decode(&encode(&entries).unwrap()), Some(entries));
        assert_eq!(decode(&[VERSION]), Some(vec![]));
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[9]), None);
        assert_eq!(decode(&[VERSION, 5, 0, b'a']), None);
        assert_eq!(decode(&[VERSION, 1, 0, b'a', 2, b'x', b'y']), None);
        // A flight count that runs past the end, a flight without a token.
        assert_eq!(decode(&[VERSION, 1, 0, b'a', 0, 1, 0]), None);
        assert_eq!(
            decode(&[VERSION, 1, 0, b'a', 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            None
        );
    }

    #[test]
    fn a_version_1_slot_reads_as_marks_without_flights() {
        // What an earlier filter wrote: u16 key length, key, u8 token length, token.
        let v1 = [VERSION_1, 2, 0, b'/', b'a', 2, b'3', b'4'];
        assert_eq!(decode(&v1), Some(vec![entry("/a", "34")]));
        // Version 1 entries never lack a mark.
        assert_eq!(decode(&[VERSION_1, 2, 0, b'/', b'a', 0]), None);
    }

    #[test]
    fn empty_entries_are_dropped_and_oversized_lists_refused() {
        let idle = Entry { key: "/idle".into(), mark: None, flights: vec![], wakers: vec![] };
        assert_eq!(decode(&encode(&[idle, entry("/a", "1")]).unwrap()), Some(vec![entry("/a", "1")]));
        let mut crowded = entry("/a", "1");
        crowded.wakers = vec![0; MAX_LIST + 1];
        assert_eq!(encode(&[crowded]), None);
    }

    #[test]
    fn past_the_bound_the_least_recently_written_idle_marks_go_and_flights_stay() {
        let mut read = Read { slot: 0, entries: vec![entry("/a", "1"), entry("/b", "2"), entry("/c", "3")], cas: 0 };
        read.entries[0].flights.push(SharedFlight { owner: 1, context: 2, token: token!("1"), deadline: 0 });
        read.entry_mut("/b").mark = Some(token!("5"));
        assert_eq!(read.entries.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["/a", "/c", "/b"]);
        read.entry_mut("/d").mark = Some(token!("4"));
        read.evict_past(2);
        let kept: Vec<&str> = read.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(kept, ["/a", "/d"], "/a has a write in flight; /c then /b were written least recently");
        read.entries.iter_mut().for_each(|e| e.wakers.push(9));
        read.evict_past(0);
        assert_eq!(read.entries.len(), 2, "entries the gate uses are never evicted");
    }

    /// Many random runs of admits and evictions against a max-register: what the copy
    /// holds of a resource is its highest mark or nothing (a miss: etcd is asked, and
    /// an entry made again after an eviction starts without a mark), never a lower
    /// one; an entry with a write in flight is never evicted.
    #[test]
    fn evictions_never_leave_a_lower_mark_and_never_take_a_flight() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for _run in 0..2_000 {
            let mut read = Read { slot: 0, entries: vec![], cas: 0 };
            let mut highest: std::collections::HashMap<String, u64> = Default::default();
            for _op in 0..40 {
                let resource = format!("/r{}", next(6));
                match next(4) {
                    0 | 1 => {
                        // Only an admitted token is raised into the copy: one at or above
                        // etcd's mark (a lower one is refused, by the copy or by etcd).
                        let t = 1 + next(50);
                        let top = highest.entry(resource.clone()).or_insert(0);
                        if t >= *top {
                            *top = t;
                            raise(read.entry_mut(&resource), Token::from_parts(&[t]).unwrap());
                        }
                    }
                    2 => {
                        let flight =
                            SharedFlight { owner: 1, context: next(9) as u32, token: token!("1"), deadline: 0 };
                        let entry = read.entry_mut(&resource);
                        if entry.flights.is_empty() {
                            entry.flights.push(flight);
                        } else {
                            entry.flights.clear();
                        }
                    }
                    _ => {
                        let busy: Vec<String> =
                            read.entries.iter().filter(|e| !e.flights.is_empty()).map(|e| e.key.clone()).collect();
                        let max = next(4) as usize;
                        read.evict_past(max);
                        for key in &busy {
                            assert!(read.entry(key).is_some(), "{key} had a write in flight and was evicted");
                        }
                        assert!(
                            read.entries.len() <= max.max(busy.len()),
                            "{} entries kept past {max}",
                            read.entries.len()
                        );
                    }
                }
                // An entry without a mark (made again for a flight after its eviction)
                // is a miss: etcd is asked.
                for e in read.entries.iter().filter(|e| e.mark.is_some()) {
                    let expected = highest.get(&e.key).map(|t| Token::from_parts(&[*t]).unwrap());
                    assert_eq!(e.mark, expected, "the copy of {} is not its highest mark", e.key);
                }
            }
        }
    }

    #[test]
    fn slots_spread_resources() {
        let s = Slots { count: 256, per_slot: None };
        let used: std::collections::HashSet<u32> = (0..1000).map(|i| s.slot_of(&format!("/r{i}"))).collect();
        assert!(used.len() > 200);
        assert!(used.iter().all(|&i| i < 256));
    }
}
