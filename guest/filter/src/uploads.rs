//! S3 multipart uploads this Envoy saw start, and the token each was admitted with,
//! in the proxy's shared data: the aws CLI sends an upload's parts on several
//! connections, so on several workers.
//!
//! CreateMultipartUpload carries the object's metadata, so the token (`aws s3 cp
//! --metadata fencing-token=34`); UploadPart, CompleteMultipartUpload and
//! AbortMultipartUpload carry neither metadata nor a header the CLI lets a user add.
//! So the filter remembers, per object path and upload id (read from the Create's
//! answer), the token the Create was admitted with; a later step of that upload that
//! sends no token of its own is decided with it, so a paused holder's Complete after
//! a newer write is refused as stale. The memory is never a way in: an upload it does
//! not know (evicted, from before a restart, another Envoy's) leaves the step without
//! a token, refused as missing.
//!
//! Like the mark slots, a fixed number of keys (`fencekeeper/uploads/N`) is created in
//! `on_configure`, so every update is a real CAS. Each holds at most [`PER_SLOT`]
//! uploads, the oldest evicted first: [`SLOTS`] × [`PER_SLOT`] in all. A value is a
//! version byte, then entries of `u16 LE path length, path, u16 LE id length, id,
//! u8 token length, token text`, oldest first.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

/// How many shared-data keys hold uploads.
pub const SLOTS: u32 = 64;
/// The most uploads one key holds.
pub const PER_SLOT: usize = 64;
// The engine's one capacity for every host's upload memory.
const _: () = assert!(SLOTS as usize * PER_SLOT == fencekeeper_engine::uploads::CAPACITY);
const KEY_PREFIX: &str = "fencekeeper/uploads/";
const VERSION: u8 = 1;
/// Lost CAS races tolerated before an update gives up (the upload's later steps
/// then need their own token).
const MAX_CAS_ATTEMPTS: usize = 16;

/// One remembered upload.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    path: Vec<u8>,
    id: Vec<u8>,
    token: Vec<u8>,
}

/// Create the keys not there yet (a reloaded VM keeps the others' uploads).
pub fn create_absent() -> Result<(), Status> {
    for i in 0..SLOTS {
        let key = key(i);
        if hostcalls::get_shared_data(&key)?.1.is_none() {
            hostcalls::set_shared_data(&key, Some(&[VERSION]), None)?;
        }
    }
    Ok(())
}

/// The token the upload `id` (percent-decoded) of the object at `path` started with,
/// if remembered. A slot that cannot be read remembers nothing.
pub fn token(path: &[u8], id: &[u8]) -> Option<String> {
    let (bytes, _) = hostcalls::get_shared_data(&key(slot_of(path, id))).ok()?;
    let entries = decode(&bytes.unwrap_or_default())?;
    let entry = entries.into_iter().find(|e| e.path == path && e.id == id)?;
    String::from_utf8(entry.token).ok()
}

/// Remember the upload `id` of the object at `path`, started with `token`.
pub fn remember(path: &[u8], id: &[u8], token: &str) -> Result<(), String> {
    let entry = Entry { path: path.to_vec(), id: id.to_vec(), token: token.as_bytes().to_vec() };
    update(path, id, |entries| {
        entries.retain(|e| e.path != path || e.id != id);
        entries.push(entry.clone());
        let excess = entries.len().saturating_sub(PER_SLOT);
        entries.drain(..excess);
    })
}

/// Forget the upload (it completed, or was aborted).
pub fn forget(path: &[u8], id: &[u8]) -> Result<(), String> {
    update(path, id, |entries| entries.retain(|e| e.path != path || e.id != id))
}

fn update(path: &[u8], id: &[u8], change: impl Fn(&mut Vec<Entry>)) -> Result<(), String> {
    let slot = slot_of(path, id);
    let key = key(slot);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (bytes, cas) = hostcalls::get_shared_data(&key).map_err(|s| format!("reading {key}: {s:?}"))?;
        let cas = cas.ok_or_else(|| format!("shared-data key {key} is missing"))?;
        let mut entries = decode(&bytes.unwrap_or_default()).ok_or_else(|| format!("{key} does not decode"))?;
        change(&mut entries);
        let bytes = encode(&entries).ok_or_else(|| format!("an upload too large for {key}"))?;
        match hostcalls::set_shared_data(&key, Some(&bytes), Some(cas)) {
            Ok(()) => return Ok(()),
            Err(Status::CasMismatch) => continue,
            Err(s) => return Err(format!("writing {key}: {s:?}")),
        }
    }
    Err(format!("{key} kept changing under {MAX_CAS_ATTEMPTS} attempts"))
}

fn key(slot: u32) -> String {
    format!("{KEY_PREFIX}{slot}")
}

/// FNV-1a over the path, a separator and the id: stable across builds and workers.
fn slot_of(path: &[u8], id: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in path.iter().chain([0xff].iter()).chain(id) {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h % SLOTS
}

fn decode(bytes: &[u8]) -> Option<Vec<Entry>> {
    let (&version, mut rest) = bytes.split_first()?;
    if version != VERSION {
        return None;
    }
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let (path, after) = field(rest, 2)?;
        let (id, after) = field(after, 2)?;
        let (token, after) = field(after, 1)?;
        entries.push(Entry { path: path.to_vec(), id: id.to_vec(), token: token.to_vec() });
        rest = after;
    }
    Some(entries)
}

/// A length-prefixed field (`width` bytes of little-endian length) and what follows.
fn field(bytes: &[u8], width: usize) -> Option<(&[u8], &[u8])> {
    let (len, rest) = bytes.split_at_checked(width)?;
    let len = len.iter().rev().fold(0usize, |n, &b| n << 8 | usize::from(b));
    rest.split_at_checked(len)
}

fn encode(entries: &[Entry]) -> Option<Vec<u8>> {
    let mut out = vec![VERSION];
    for e in entries {
        out.extend(u16::try_from(e.path.len()).ok()?.to_le_bytes());
        out.extend(&e.path);
        out.extend(u16::try_from(e.id.len()).ok()?.to_le_bytes());
        out.extend(&e.id);
        out.push(u8::try_from(e.token.len()).ok()?);
        out.extend(&e.token);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_damage_is_refused() {
        let entries = vec![
            Entry { path: b"/b/k".to_vec(), id: b"id-1".to_vec(), token: b"34".to_vec() },
            Entry { path: b"/b/k2".to_vec(), id: vec![b'x'; 300], token: b"7.1042".to_vec() },
        ];
        let bytes = encode(&entries).unwrap_or_default();
        assert_eq!(decode(&bytes), Some(entries));
        assert_eq!(decode(&[VERSION]), Some(Vec::new()));
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None, "a cut entry");
        assert_eq!(decode(&[2]), None, "another version");
        assert_eq!(decode(&[]), None);
        let long = Entry { path: vec![b'p'; 70_000], id: Vec::new(), token: Vec::new() };
        assert_eq!(encode(&[long]), None, "a path over u16 is not written");
    }

    #[test]
    fn uploads_spread_over_the_slots() {
        let used: std::collections::BTreeSet<u32> =
            (0..1000).map(|n| slot_of(b"/b/k", n.to_string().as_bytes())).collect();
        assert!(used.iter().all(|&s| s < SLOTS));
        assert_eq!(used.len(), SLOTS as usize, "a thousand uploads of one object reach every slot");
    }
}
