//! The advance journal: where the file store makes an advance durable.
//!
//! A commit of redb's writes its header and several pages, and a reported advance must
//! also be in redb's fallback commit (`mod.rs`): two commits, three to five pages each,
//! for a lone advance. The journal makes it one small write and one `fdatasync`: each
//! group of advances is a *frame* appended to a preallocated file beside the store
//! (`STORE.journal`), and the advances go into redb later, many at a time, when the
//! journal is folded in (a *checkpoint*: one sealed redb commit, then the journal
//! starts over).
//!
//! What keeps its promises:
//!
//! * **Every frame twice.** A frame is written as two identical copies, each with
//!   its own CRC32C, in one write made durable by one `fdatasync`. A copy damaged
//!   after its advances were reported leaves the other, as redb's two commit slots
//!   do. A frame whose both copies fail, with no valid frame after it, is the torn
//!   tail of a write that was never reported (its `fdatasync` had not returned); one
//!   with a valid frame after it is damage to reported advances, and the store
//!   refuses to open.
//! * **A file that never shrinks.** The file is preallocated, and its length is in
//!   its header; frames are only written inside it (a full journal is folded in
//!   first). So a cut file is an error, not a shorter log; and an `fdatasync` never
//!   has to make a new length durable.
//! * **Epochs, not truncation.** Starting over writes a new epoch into the header;
//!   frames of an older epoch, still in the file, end the log where they begin.
//!   The header is two checksummed copies, the newer valid one read.
//! * **Bound to its store.** The header carries an id that the store's own file
//!   records, with whether the journal may hold advances (`mod.rs`): a journal of
//!   another store is refused, and so is a missing one that may hold advances.
//! * **Frames no client can forge.** A frame's payload holds resource keys, which a
//!   client chooses (any bytes, `%00` included), and a damaged or torn frame is
//!   searched for byte by byte: a key could hold bytes that check as a frame of the
//!   epoch, read in a real frame's place, or after a torn tail as a later frame that
//!   makes the store refuse to open. So a frame's checksum covers the journal's id,
//!   which is random and only on this disk: a frame written without it checks with a
//!   chance of one in 2^32.

use super::{corrupt, create_whole};
use crate::store::StoreError;
use fencekeeper_core::resource::MAX_KEY_BYTES;
use fencekeeper_core::{record, Token};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The header's magic bytes.
const MAGIC: &[u8; 8] = b"FKJRNL2\n";
/// The magic of the format before frame checksums covered the journal's id (made
/// only by development builds): its frames do not check in this one's.
const EARLIER_MAGIC: &[u8; 8] = b"FKJRNL1\n";
/// How the error for a journal of [`EARLIER_MAGIC`] begins ([`earlier_format`]).
const EARLIER: &str = "the journal is in an earlier development format (FKJRNL1)";
/// A frame copy's magic number.
const FRAME: u32 = 0x4a4b_4631;
/// The header's two copies, at 0 and here; frames start at [`FRAMES`].
const HEADER_COPY: u64 = 512;
const FRAMES: u64 = 4096;
/// magic ‖ id ‖ epoch ‖ length, then the CRC.
const HEADER_BYTES: usize = 8 + 8 + 8 + 8 + 4;
/// magic ‖ epoch ‖ seq ‖ payload length, then the payload and the CRC.
const FRAME_HEAD: usize = 4 + 8 + 8 + 4;
/// The most payload one frame carries: a larger group is several frames.
const MAX_PAYLOAD: usize = 32 << 10;
/// A frame copy's largest size.
const MAX_COPY: usize = FRAME_HEAD + MAX_PAYLOAD + 4;
/// The file's length: frames never go past it. A lone advance's frame is about 110
/// bytes, so a fold comes every thousand or so.
pub(super) const SIZE: u64 = 256 << 10;
/// Past this much of the file in frames, the journal is folded into redb before the
/// next frame: so a group of frames always fits after it.
pub(super) const CHECKPOINT_AT: u64 = SIZE / 2;
/// The checksums' domains: a frame's bytes never check as a header's, or a record's.
const FRAME_SUM: &[u8] = b"fencekeeper journal frame";
const HEADER_SUM: &[u8] = b"fencekeeper journal header";

/// An open journal: where the next frame goes.
pub(super) struct Journal {
    file: File,
    path: PathBuf,
    id: u64,
    epoch: u64,
    /// The next frame's sequence number within the epoch.
    seq: u64,
    /// Where the next frame goes.
    end: u64,
    /// A write or sync failed: what reached the file is not known, so the journal
    /// takes no frame until it has started over.
    broken: bool,
}

/// The journal's path for the store at `store`: `STORE.journal`, beside it.
pub(super) fn path_of(store: &Path) -> PathBuf {
    let mut name = store.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".journal");
    store.with_file_name(name)
}

impl Journal {
    /// Create the journal at `path` for the store with `id`: a header and zeros up to
    /// [`SIZE`], durable (the directory entry too) before it returns. Built under a
    /// temporary name and linked into place whole, so a crash while making it leaves
    /// no half-made journal where the store looks for one.
    pub(super) fn create(path: &Path, id: u64) -> Result<Journal, StoreError> {
        let io_err = |error| StoreError::Io { path: path.to_owned(), error };
        let header = Journal::header_of(id, 1);
        let mut bytes = vec![0u8; SIZE as usize];
        bytes[..HEADER_BYTES].copy_from_slice(&header);
        bytes[HEADER_COPY as usize..HEADER_COPY as usize + HEADER_BYTES].copy_from_slice(&header);
        create_whole(path, |temp| {
            let file = File::create(temp).map_err(io_err)?;
            file.write_all_at(&bytes, 0).and_then(|()| file.sync_all()).map_err(io_err)
        })?;
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io_err)?;
        Ok(Journal { file, path: path.to_owned(), id, epoch: 1, seq: 0, end: FRAMES, broken: false })
    }

    /// Open the journal at `path` and read every advance of its epoch, verified, in
    /// the order they were made. Damage to reported advances, a cut file, or a
    /// header that fails its checks is [`StoreError::Corrupt`].
    pub(super) fn open(path: &Path) -> Result<(Journal, Vec<(String, Token)>), StoreError> {
        let io_err = |error| StoreError::Io { path: path.to_owned(), error };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io_err)?;
        let bytes = fs::read(path).map_err(io_err)?;
        if [0, HEADER_COPY as usize].iter().any(|&at| bytes.get(at..at + 8) == Some(EARLIER_MAGIC.as_slice())) {
            return Err(corrupt(
                path,
                format!(
                    "{EARLIER}, whose frames this version cannot read; open and close the store once with the \
                     build that wrote it, which folds the journal into the store"
                ),
            ));
        }
        let header = [0, HEADER_COPY as usize]
            .into_iter()
            .filter_map(|at| bytes.get(at..at + HEADER_BYTES).and_then(read_header))
            .max_by_key(|h| h.epoch)
            .ok_or_else(|| corrupt(path, "both copies of the journal's header fail their checks"))?;
        if (bytes.len() as u64) < header.size {
            return Err(corrupt(
                path,
                format!(
                    "the journal is {} bytes, shorter than the {} it was made with (cut?)",
                    bytes.len(),
                    header.size
                ),
            ));
        }
        let frames = &bytes[..header.size as usize];
        let (entries, end, seq) = scan(frames, header.id, header.epoch).map_err(|e| corrupt(path, e))?;
        let journal =
            Journal { file, path: path.to_owned(), id: header.id, epoch: header.epoch, seq, end, broken: false };
        Ok((journal, entries))
    }

    /// The id of the store it belongs to.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// How far into the file its frames reach.
    pub(super) fn end(&self) -> u64 {
        self.end
    }

    /// Whether it holds no frame.
    pub(super) fn is_empty(&self) -> bool {
        self.end == FRAMES
    }

    /// Whether a failed write left it needing to start over before the next frame.
    pub(super) fn broken(&self) -> bool {
        self.broken
    }

    /// Whether `frames` fit in what is left of the file.
    pub(super) fn fits(&self, frames: &Frames) -> bool {
        self.end + frames.len <= SIZE
    }

    /// Append `frames` (each twice) and make them durable with one `fdatasync`. On an
    /// error nothing may be reported: the journal is then broken until it starts over.
    pub(super) fn append(&mut self, frames: &Frames) -> Result<(), StoreError> {
        if self.broken {
            return Err(self.unavailable("an earlier write failed and it has not started over"));
        }
        if !self.fits(frames) {
            return Err(self.unavailable("it is full and could not be folded into the store"));
        }
        let mut bytes = Vec::with_capacity(frames.len as usize);
        let (mut seq, domain) = (self.seq, frame_domain(self.id));
        for payload in &frames.payloads {
            let copy = frame(&domain, self.epoch, seq, payload);
            bytes.extend_from_slice(&copy);
            bytes.extend_from_slice(&copy);
            seq += 1;
        }
        let written = self.file.write_all_at(&bytes, self.end).and_then(|()| self.file.sync_data());
        if let Err(error) = written {
            self.broken = true;
            return Err(StoreError::Io { path: self.path.clone(), error });
        }
        self.end += bytes.len() as u64;
        self.seq = seq;
        Ok(())
    }

    /// Start over, empty: a new epoch in the header, durable. Only once every advance
    /// in it is durable in the store itself.
    pub(super) fn restart(&mut self) -> Result<(), StoreError> {
        self.epoch += 1;
        let header = self.header();
        let mut bytes = vec![0u8; HEADER_COPY as usize + HEADER_BYTES];
        bytes[..HEADER_BYTES].copy_from_slice(&header);
        bytes[HEADER_COPY as usize..].copy_from_slice(&header);
        let written = self.file.write_all_at(&bytes, 0).and_then(|()| self.file.sync_data());
        if let Err(error) = written {
            self.broken = true;
            return Err(StoreError::Io { path: self.path.clone(), error });
        }
        (self.seq, self.end, self.broken) = (0, FRAMES, false);
        Ok(())
    }

    fn header(&self) -> Vec<u8> {
        Journal::header_of(self.id, self.epoch)
    }

    fn header_of(id: u64, epoch: u64) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER_BYTES);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&id.to_le_bytes());
        h.extend_from_slice(&epoch.to_le_bytes());
        h.extend_from_slice(&SIZE.to_le_bytes());
        let crc = record::checksum(HEADER_SUM, &h);
        h.extend_from_slice(&crc.to_le_bytes());
        h
    }

    fn unavailable(&self, why: &str) -> StoreError {
        StoreError::Unavailable(format!("mark store journal {}: {why}; refused", self.path.display()))
    }
}

struct Header {
    id: u64,
    epoch: u64,
    size: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn read_header(b: &[u8]) -> Option<Header> {
    if &b[..8] != MAGIC || record::checksum(HEADER_SUM, &b[..32]) != u32_at(b, 32) {
        return None;
    }
    let header = Header { id: u64_at(b, 8), epoch: u64_at(b, 16), size: u64_at(b, 24) };
    // A header that checks is ours; a length other than the one this version makes and
    // writes frames up to is not (frames past a shorter one would never be read).
    (header.size == SIZE).then_some(header)
}

/// Advances encoded as the payloads of the frames that carry them, each `key length
/// (u16) ‖ key ‖ token length (u8) ‖ token text`, at most [`MAX_PAYLOAD`] bytes a
/// frame: encoded once, then measured against the room left and appended.
pub(super) struct Frames {
    payloads: Vec<Vec<u8>>,
    /// The bytes they take in the file, both copies of every frame.
    len: u64,
}

impl Frames {
    pub(super) fn of(advances: &[(String, Token)]) -> Frames {
        let mut payloads = vec![Vec::new()];
        for (resource, token) in advances {
            let text = token.to_string();
            let entry = 2 + resource.len() + 1 + text.len();
            if payloads.last().is_some_and(|p: &Vec<u8>| !p.is_empty() && p.len() + entry > MAX_PAYLOAD) {
                payloads.push(Vec::new());
            }
            if let Some(p) = payloads.last_mut() {
                // Keys are at most MAX_KEY_BYTES and token text far below 255 bytes.
                p.extend_from_slice(&(resource.len() as u16).to_le_bytes());
                p.extend_from_slice(resource.as_bytes());
                p.push(text.len() as u8);
                p.extend_from_slice(text.as_bytes());
            }
        }
        let len = payloads.iter().map(|p| 2 * (FRAME_HEAD + p.len() + 4) as u64).sum();
        Frames { payloads, len }
    }
}

/// The checksum domain of the frames of the journal with `id`: the id makes a frame
/// unforgeable by whoever does not know it.
fn frame_domain(id: u64) -> Vec<u8> {
    [FRAME_SUM, &id.to_le_bytes()].concat()
}

fn frame(domain: &[u8], epoch: u64, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(FRAME_HEAD + payload.len() + 4);
    f.extend_from_slice(&FRAME.to_le_bytes());
    f.extend_from_slice(&epoch.to_le_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    let crc = record::checksum(domain, &f);
    f.extend_from_slice(&crc.to_le_bytes());
    f
}

/// The copy of frame `seq` of `epoch` at `at`, if one is there and checks: its
/// payload and its length.
fn copy_at<'a>(bytes: &'a [u8], at: usize, domain: &[u8], epoch: u64, seq: u64) -> Option<(&'a [u8], usize)> {
    let head = bytes.get(at..at + FRAME_HEAD)?;
    if u32_at(head, 0) != FRAME || u64_at(head, 4) != epoch || u64_at(head, 12) != seq {
        return None;
    }
    let len = u32_at(head, 20) as usize;
    if len > MAX_PAYLOAD {
        return None;
    }
    let body = bytes.get(at..at + FRAME_HEAD + len + 4)?;
    let sum = u32_at(body, FRAME_HEAD + len);
    (record::checksum(domain, &body[..FRAME_HEAD + len]) == sum).then(|| (&body[FRAME_HEAD..FRAME_HEAD + len], len))
}

/// The first place in `bytes[from..to]` where a copy of a frame of `epoch` whose
/// sequence number `wanted` accepts checks: where it is, its payload and its length.
fn find<'a>(
    bytes: &'a [u8],
    (from, to): (usize, usize),
    domain: &[u8],
    epoch: u64,
    wanted: impl Fn(u64) -> bool,
) -> Option<(usize, &'a [u8], usize)> {
    let (magic, to) = (FRAME.to_le_bytes(), to.min(bytes.len()));
    let mut at = from;
    while at < to {
        // Most of a journal is zeros past its end: skipped a block at a time.
        if at.is_multiple_of(64) && bytes[at..(at + 64).min(to)].iter().all(|b| *b == 0) {
            at += 64;
            continue;
        }
        if bytes[at..].starts_with(&magic) {
            let seq = bytes.get(at + 12..at + 20).map(|b| u64_at(b, 0));
            if let Some(found) = seq.filter(|s| wanted(*s)).and_then(|s| copy_at(bytes, at, domain, epoch, s)) {
                return Some((at, found.0, found.1));
            }
        }
        at += 1;
    }
    None
}

/// What a journal's frames hold: every advance in order, where the next frame goes,
/// and its sequence number.
type Scanned = (Vec<(String, Token)>, u64, u64);

/// Read the frames of `epoch` of the journal with `id`.
fn scan(bytes: &[u8], id: u64, epoch: u64) -> Result<Scanned, String> {
    let (mut at, mut seq, mut entries) = (FRAMES as usize, 0u64, Vec::new());
    let domain = frame_domain(id);
    loop {
        let found = match copy_at(bytes, at, &domain, epoch, seq) {
            // The first copy checks: the second, right after it, is not needed.
            Some((payload, len)) => Some((payload, at + 2 * (FRAME_HEAD + len + 4))),
            // The first copy is damaged: its twin is within one copy's length.
            None => find(bytes, (at + 1, at + MAX_COPY + 1), &domain, epoch, |s| s == seq)
                .map(|(twin, payload, len)| (payload, twin + FRAME_HEAD + len + 4)),
        };
        let Some((payload, next)) = found else { break };
        decode(payload, &mut entries).map_err(|e| format!("journal frame {seq} of epoch {epoch}: {e}"))?;
        at = next;
        seq += 1;
    }
    // Both copies of frame `seq` fail: the torn tail of a write never reported, unless
    // a later frame was written after it, which happens only once it was durable.
    if let Some((later, _, _)) = find(bytes, (at, bytes.len()), &domain, epoch, |s| s > seq) {
        return Err(format!(
            "both copies of journal frame {seq} (at byte {at}) are damaged, and a later frame (at byte {later}) \
             is whole: advances that were reported are lost"
        ));
    }
    Ok((entries, at as u64, seq))
}

fn decode(payload: &[u8], out: &mut Vec<(String, Token)>) -> Result<(), String> {
    let mut rest = payload;
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<2>().ok_or("an entry is cut short")?;
        let len = usize::from(u16::from_le_bytes(*len));
        if len > MAX_KEY_BYTES || tail.len() < len + 1 {
            return Err(format!("an entry's key length {len} is not one this store writes"));
        }
        let resource = std::str::from_utf8(&tail[..len]).map_err(|_| "an entry's key is not UTF-8")?;
        let tlen = usize::from(tail[len]);
        let text = tail.get(len + 1..len + 1 + tlen).ok_or("an entry's token is cut short")?;
        let text = std::str::from_utf8(text).map_err(|_| "an entry's token is not text")?;
        let token = Token::parse(text).map_err(|e| format!("an entry's token {text:?} is not a token: {e}"))?;
        out.push((resource.to_owned(), token));
        rest = &tail[len + 1 + tlen..];
    }
    Ok(())
}

/// Whether the error says the journal is in the earlier development format.
pub(super) fn earlier_format(e: &StoreError) -> bool {
    matches!(e, StoreError::Corrupt { detail, .. } if detail.starts_with(EARLIER))
}

/// Whether the error says the file is not there.
pub(super) fn missing(e: &StoreError) -> bool {
    matches!(e, StoreError::Io { error, .. } if error.kind() == io::ErrorKind::NotFound)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    fn advances(n: u64) -> Vec<(String, Token)> {
        (1..=n).map(|i| (format!("r/{}", i % 3), Token::from_parts(&[i]).unwrap())).collect()
    }

    fn journal_with(frames: &[Vec<(String, Token)>]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.journal");
        let mut j = Journal::create(&path, 7).unwrap();
        for f in frames {
            j.append(&Frames::of(f)).unwrap();
        }
        (dir, path)
    }

    fn flip(path: &Path, at: u64) {
        let mut b = fs::read(path).unwrap();
        b[at as usize] ^= 0xff;
        fs::write(path, b).unwrap();
    }

    #[test]
    fn a_journal_is_made_whole_under_a_temporary_name_and_never_over_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.journal");
        let temp = dir.path().join(format!(".s.journal.{}.tmp", std::process::id()));
        fs::write(&temp, b"what a crash mid-way left").unwrap();
        Journal::create(&path, 1).unwrap();
        assert!(!temp.exists());
        assert!(Journal::create(&path, 2).is_err());
        assert_eq!(Journal::open(&path).unwrap().0.id(), 1);
    }

    #[test]
    fn frames_read_back_in_order_and_the_next_goes_after_them() {
        let frames = [advances(3), vec![("x".into(), token!("7.1042"))]];
        let (_d, path) = journal_with(&frames);
        let (j, entries) = Journal::open(&path).unwrap();
        assert_eq!(entries, frames.concat());
        assert_eq!((j.id(), j.seq), (7, 2));
        assert_eq!(j.end(), FRAMES + Frames::of(&frames[0]).len + Frames::of(&frames[1]).len);
    }

    #[test]
    fn a_large_group_is_several_frames_and_reads_back_whole() {
        let big: Vec<(String, Token)> =
            (0..100u64).map(|i| ("k".repeat(900) + &i.to_string(), Token::from_parts(&[i + 1]).unwrap())).collect();
        assert!(Frames::of(&big).payloads.len() > 1);
        let (_d, path) = journal_with(std::slice::from_ref(&big));
        assert_eq!(Journal::open(&path).unwrap().1, big);
    }

    #[test]
    fn one_damaged_copy_of_any_frame_is_read_from_the_other() {
        let frames = [advances(2), advances(5), advances(1)];
        let (_d, path) = journal_with(&frames);
        let (j, _) = Journal::open(&path).unwrap();
        let original = fs::read(&path).unwrap();
        for at in FRAMES..j.end() {
            flip(&path, at);
            match Journal::open(&path) {
                Ok((_, entries)) => assert_eq!(entries, frames.concat(), "byte {at}"),
                Err(e) => panic!("byte {at}: {e}"),
            }
            fs::write(&path, &original).unwrap();
        }
    }

    #[test]
    fn both_copies_damaged_before_a_whole_frame_is_refused_and_at_the_tail_is_a_torn_write() {
        let frames = [advances(2), advances(2)];
        let (_d, path) = journal_with(&frames);
        let copy = Frames::of(&frames[0]).len / 2;
        flip(&path, FRAMES + 30);
        flip(&path, FRAMES + copy + 30);
        let err = Journal::open(&path).err().unwrap().to_string();
        assert!(err.contains("advances that were reported are lost"), "{err}");
        // The same damage to the last frame: a write whose fdatasync never returned.
        let (_d2, path) = journal_with(&frames);
        let last = FRAMES + 2 * copy;
        flip(&path, last + 30);
        flip(&path, last + copy + 30);
        let (j, entries) = Journal::open(&path).unwrap();
        assert_eq!((entries, j.end()), (frames[0].clone(), last));
    }

    #[test]
    fn a_restarted_journal_is_empty_and_its_old_frames_never_come_back() {
        let (_d, path) = journal_with(&[advances(4)]);
        let (mut j, _) = Journal::open(&path).unwrap();
        j.restart().unwrap();
        j.append(&Frames::of(&advances(1))).unwrap();
        let (j, entries) = Journal::open(&path).unwrap();
        assert_eq!((entries, j.epoch), (advances(1), 2));
    }

    #[test]
    fn a_damaged_header_copy_is_read_from_the_other_and_both_or_a_cut_file_are_refused() {
        let (_d, path) = journal_with(&[advances(2)]);
        flip(&path, 9);
        assert_eq!(Journal::open(&path).unwrap().1, advances(2));
        flip(&path, HEADER_COPY + 17);
        assert!(Journal::open(&path).err().unwrap().to_string().contains("header"));
        let (_d2, path) = journal_with(&[advances(2)]);
        let b = fs::read(&path).unwrap();
        fs::write(&path, &b[..b.len() - 4096]).unwrap();
        assert!(Journal::open(&path).err().unwrap().to_string().contains("cut"));
    }

    #[test]
    fn a_full_journal_refuses_a_frame_and_a_failed_one_breaks_it_until_it_starts_over() {
        let (_d, path) = journal_with(&[]);
        let (mut j, _) = Journal::open(&path).unwrap();
        j.end = SIZE - 10;
        assert!(!j.fits(&Frames::of(&advances(1))));
        assert!(j.append(&Frames::of(&advances(1))).is_err());
        j.broken = true;
        j.end = FRAMES;
        assert!(j.append(&Frames::of(&advances(1))).is_err());
        j.restart().unwrap();
        j.append(&Frames::of(&advances(1))).unwrap();
    }

    /// Bytes a client could put in the file inside a resource key (`%00` decodes to a
    /// zero byte): a copy of frame `seq` of epoch 1 carrying `victim`'s advance to 1,
    /// checksummed in `domain`.
    fn forged(domain: &[u8], seq: u64) -> Vec<u8> {
        let victim = [("victim".to_owned(), Token::from_parts(&[1]).unwrap())];
        let payload = Frames::of(&victim).payloads.remove(0);
        frame(domain, 1, seq, &payload)
    }

    fn write_at(path: &Path, at: u64, bytes: &[u8]) {
        let file = OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(bytes, at).unwrap();
    }

    #[test]
    fn a_frame_forged_without_the_journals_id_is_never_read_nor_refuses_the_journal() {
        let domains = [("the format's public domain", FRAME_SUM.to_vec()), ("another id", frame_domain(8))];
        for (what, domain) in domains {
            // In the next frame's place, as a torn write's bytes could leave it.
            let (_d, path) = journal_with(&[advances(2)]);
            let end = Journal::open(&path).unwrap().0.end();
            write_at(&path, end, &forged(&domain, 1));
            assert_eq!(Journal::open(&path).unwrap().1, advances(2), "{what}: read in place of frame 1");
            // After a torn frame, as a later frame: the journal would be refused.
            write_at(&path, end, &[0xee; 64]);
            write_at(&path, end + 64, &forged(&domain, 99));
            assert_eq!(Journal::open(&path).unwrap().1, advances(2), "{what}: taken for a later frame");
        }
        // The control: with the journal's own id the same bytes are a frame, both ways.
        let (_d, path) = journal_with(&[advances(2)]);
        let end = Journal::open(&path).unwrap().0.end();
        write_at(&path, end, &forged(&frame_domain(7), 1));
        assert_eq!(Journal::open(&path).unwrap().1.last().map(|(r, _)| r.as_str()), Some("victim"));
        write_at(&path, end, &[0xee; 64]);
        write_at(&path, end + 64, &forged(&frame_domain(7), 99));
        assert!(Journal::open(&path).err().unwrap().to_string().contains("later frame"));
    }

    #[test]
    fn a_journal_of_the_earlier_format_is_named_never_read_as_empty() {
        let (_d, path) = journal_with(&[advances(2)]);
        write_at(&path, 0, EARLIER_MAGIC);
        let err = Journal::open(&path).err().unwrap();
        assert!(earlier_format(&err) && err.to_string().contains("open and close the store once"), "{err}");
        assert!(!earlier_format(&corrupt(&path, "something else")));
    }
}
