//! Every byte of a store file, damaged: the exhaustive corruption test.
//!
//! A small store with a few marks (one a tuple token, one advanced several times so
//! that older versions of its record lie in freed pages, or older frames in its
//! journal) is copied, its file and its journal, and on each copy one byte is
//! flipped, at every offset of the file and of the journal's frames; separately
//! either file is cut at every page boundary. Each variant is opened and every mark read, through `get`,
//! `list` and the guard. The only outcomes allowed are a one-line store error that
//! names the file, or exactly the original marks; and no variant may ever admit a
//! token below an original mark.
//!
//! Every offset is covered, twice: with the lowest bit flipped (`5` becomes `4`, a
//! lower digit) and with every bit flipped. Both for a store closed cleanly and for
//! a copy taken while the store was open (as a backup tool might), where redb must
//! recover and could fall back to an older commit. Copies live in /dev/shm when it
//! exists: each open verifies the file and commits, and fsync on tmpfs is free.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::{FileStore, Guard, NativeDecider, Policy, Token};
use fencekeeper_core::token;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// redb's page size: the file is cut at every multiple.
const PAGE: usize = 4096;

fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let fast = shm.is_dir().then(|| tempfile::Builder::new().prefix("fk-corrupt").tempdir_in(shm).ok()).flatten();
    fast.unwrap_or_else(|| tempfile::tempdir().unwrap())
}

/// The marks every variant must read back exactly, or refuse to read.
fn originals() -> Vec<(String, Token)> {
    vec![("a/7".into(), token!("7.1042")), ("journal".into(), token!("50")), ("orders/2026.csv".into(), token!("34"))]
}

/// Build the store, and keep it open: advance "journal" through 10..=50 so that its
/// older marks (each once valid) are left in the journal's earlier frames, and, once
/// the store is closed and the journal folded in, in the file's freed pages.
fn build(path: &Path) -> Guard {
    let store = FileStore::open(path).unwrap();
    let g = Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(store));
    for token in ["10", "20", "30", "40"] {
        assert!(g.admit("journal", Some(token)).admitted());
    }
    assert!(g.admit("orders/2026.csv", Some("34")).admitted());
    assert!(g.admit("a/7", Some("7.1042")).admitted());
    assert!(g.admit("journal", Some("50")).admitted());
    g
}

/// A token just below `mark`: its last component minus one, or the mark's arity
/// with a lower earlier component.
fn below(mark: &Token) -> Token {
    let mut parts = mark.parts().to_vec();
    let i = parts.iter().rposition(|p| *p > 0).unwrap();
    parts[i] -= 1;
    Token::from_parts(&parts).unwrap()
}

#[derive(Debug, PartialEq)]
enum Outcome {
    /// A one-line store error naming the file.
    Refused,
    /// Exactly the original marks.
    Intact,
}

/// Open the variant at `path` and read every mark; the outcome, or what went wrong.
fn judge(path: &Path, originals: &[(String, Token)]) -> Result<Outcome, String> {
    let one_line = |e: &fencekeeper::StoreError| {
        let text = e.to_string();
        if text.contains('\n') || !text.contains(&path.display().to_string()) {
            Err(format!("not a one-line error naming the file: {text}"))
        } else {
            Ok(Outcome::Refused)
        }
    };
    let store = match FileStore::open(path) {
        Ok(s) => s,
        Err(e) => return one_line(&e),
    };
    let guard = Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(store));
    let mut refused = None;
    for (resource, mark) in originals {
        match guard.store().get(resource) {
            Ok(Some(m)) if m == *mark => {}
            Ok(other) => return Err(format!("{resource} read as {other:?}, stored {mark}")),
            Err(e) => refused = Some(one_line(&e)?),
        }
        let d = guard.admit(resource, Some(&below(mark).to_string()));
        if d.admitted() {
            return Err(format!("{resource}: admitted {} below the mark {mark}", below(mark)));
        }
    }
    match guard.store().list() {
        Ok(all) if all == originals => {}
        Ok(all) => return Err(format!("list read {all:?}")),
        Err(e) => refused = Some(one_line(&e)?),
    }
    Ok(refused.unwrap_or(Outcome::Intact))
}

/// A store as its files: the store's bytes, and its journal's (`None`: no journal).
#[derive(Clone)]
struct Files {
    store: Vec<u8>,
    journal: Option<Vec<u8>>,
}

impl Files {
    fn read(path: &Path) -> Files {
        Files { store: std::fs::read(path).unwrap(), journal: std::fs::read(journal_of(path)).ok() }
    }

    fn write(&self, path: &Path) {
        std::fs::write(path, &self.store).unwrap();
        match &self.journal {
            Some(bytes) => std::fs::write(journal_of(path), bytes).unwrap(),
            None => {
                let _ = std::fs::remove_file(journal_of(path));
            }
        }
    }

    /// The journal's bytes up to just past its last frame (the rest is zeros, where a
    /// flipped byte is garbage after the log's end whatever it is).
    fn journal_live(&self) -> usize {
        let journal = self.journal.as_deref().unwrap_or_default();
        let last = journal.iter().rposition(|b| *b != 0).map_or(0, |at| at + 1);
        (last + 64).min(journal.len())
    }
}

fn journal_of(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap().to_os_string();
    name.push(".journal");
    path.with_file_name(name)
}

/// Judge every variant `damage` makes of `original` (by index), on two threads.
fn sweep(name: &str, original: &Files, count: usize, damage: impl Fn(usize, &mut Files) + Sync) -> (usize, usize) {
    let originals = originals();
    let workers = 2;
    let results: Vec<(usize, usize, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (originals, damage) = (&originals, &damage);
                s.spawn(move || {
                    let dir = scratch();
                    let path: PathBuf = dir.path().join("variant.redb");
                    let (mut intact, mut refused, mut wrong) = (0, 0, Vec::new());
                    for i in (w..count).step_by(workers) {
                        let mut files = original.clone();
                        damage(i, &mut files);
                        files.write(&path);
                        match judge(&path, originals) {
                            Ok(Outcome::Intact) => intact += 1,
                            Ok(Outcome::Refused) => refused += 1,
                            Err(e) => wrong.push(format!("{name} variant {i}: {e}")),
                        }
                    }
                    (intact, refused, wrong)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wrong: Vec<String> = results.iter().flat_map(|r| r.2.clone()).collect();
    assert!(wrong.is_empty(), "{} bad outcomes, first ones:\n{}", wrong.len(), wrong[..wrong.len().min(10)].join("\n"));
    (results.iter().map(|r| r.0).sum(), results.iter().map(|r| r.1).sum())
}

/// Flip bits at every offset of the store and of the journal's frames, cut either at
/// every page boundary: report and check counts.
fn every_offset_and_every_cut(label: &str, original: &Files) {
    let started = Instant::now();
    assert_eq!(judge_files(original), Outcome::Intact, "{label}: the undamaged copy reads back");
    let live = original.journal_live();
    for (pattern, xor) in [("low bit", 0x01u8), ("all bits", 0xff)] {
        let n = original.store.len();
        let (intact, refused) =
            sweep(&format!("{label}, {pattern} flipped at store byte"), original, n, |i, f| f.store[i] ^= xor);
        assert_eq!(intact + refused, n);
        assert!(refused > 0, "{label}: some flips must land in live data and be refused");
        eprintln!("{label}, {pattern}: {n} store offsets, {intact} read intact, {refused} refused");
        let (intact, refused) =
            sweep(&format!("{label}, {pattern} flipped at journal byte"), original, live, |i, f| {
                if let Some(j) = f.journal.as_mut() {
                    j[i] ^= xor;
                }
            });
        eprintln!("{label}, {pattern}: {live} journal offsets, {intact} read intact, {refused} refused");
    }
    let cuts = original.store.len() / PAGE;
    let (intact, refused) =
        sweep(&format!("{label}, store cut at page"), original, cuts, |i, f| f.store.truncate(i * PAGE));
    eprintln!("{label}: {cuts} store cuts, {intact} read intact, {refused} refused");
    let cuts = original.journal.as_ref().map_or(0, |j| j.len() / PAGE);
    let (intact, refused) = sweep(&format!("{label}, journal cut at page"), original, cuts, |i, f| {
        if let Some(j) = f.journal.as_mut() {
            j.truncate(i * PAGE);
        }
    });
    assert_eq!(intact, 0, "{label}: a cut journal is refused, never read short");
    eprintln!("{label}: {cuts} journal cuts, {refused} refused; {:?}", started.elapsed());
}

fn judge_files(files: &Files) -> Outcome {
    let dir = scratch();
    let path = dir.path().join("undamaged.redb");
    files.write(&path);
    judge(&path, &originals()).unwrap()
}

#[test]
fn every_flipped_byte_and_every_cut_of_a_closed_store_is_an_error_or_the_original_marks() {
    let dir = scratch();
    let path = dir.path().join("marks.redb");
    drop(build(&path));
    let closed = Files::read(&path);
    // Closed cleanly, the store's own file holds every mark: without its journal too.
    assert_eq!(judge_files(&Files { journal: None, ..closed.clone() }), Outcome::Intact);
    every_offset_and_every_cut("closed store", &closed);
}

#[test]
fn every_flipped_byte_and_every_cut_of_a_copy_taken_while_open_is_an_error_or_the_original_marks() {
    let dir = scratch();
    let path = dir.path().join("marks.redb");
    let open = build(&path);
    // Copied under a running store, as a backup tool might: redb has not closed it, so
    // its next open must recover, choosing between the two commit slots; and the
    // marks are in the journal, not yet folded in.
    let hot = Files::read(&path);
    drop(open);
    // The store's file alone is refused: its journal may hold marks it lacks.
    assert_eq!(judge_files(&Files { journal: None, ..hot.clone() }), Outcome::Refused);
    every_offset_and_every_cut("copy of an open store", &hot);
}
