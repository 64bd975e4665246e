//! Every byte of a store file, damaged: the exhaustive corruption test.
//!
//! A small store with a few marks (one a tuple token, one advanced several times so
//! that older versions of its record lie in freed pages) is copied, and on each copy
//! one byte is flipped, at every offset of the file; separately the file is cut at
//! every page boundary. Each variant is opened and every mark read, through `get`,
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
/// older records (lower marks, each once valid) are left in the file's freed pages,
/// and end on an advance, so that redb's previous commit lacks a mark.
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

/// Judge every variant `damage` makes of `original` (by index), on two threads.
fn sweep(name: &str, original: &[u8], count: usize, damage: impl Fn(usize, &mut Vec<u8>) + Sync) -> (usize, usize) {
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
                        let mut bytes = original.to_vec();
                        damage(i, &mut bytes);
                        std::fs::write(&path, &bytes).unwrap();
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

/// Flip bits at every offset, cut at every page boundary: report and check counts.
fn every_offset_and_every_cut(label: &str, original: &[u8]) {
    let started = Instant::now();
    assert_eq!(judge_bytes(original), Outcome::Intact, "{label}: the undamaged copy reads back");
    for (pattern, xor) in [("low bit", 0x01u8), ("all bits", 0xff)] {
        let (intact, refused) = sweep(&format!("{label}, {pattern} flipped at"), original, original.len(), |i, b| {
            b[i] ^= xor;
        });
        assert_eq!(intact + refused, original.len());
        assert!(refused > 0, "{label}: some flips must land in live data and be refused");
        eprintln!("{label}, {pattern}: {} offsets, {intact} read intact, {refused} refused", original.len());
    }
    let cuts = original.len() / PAGE;
    let (intact, refused) = sweep(&format!("{label}, cut at page"), original, cuts, |i, b| b.truncate(i * PAGE));
    eprintln!("{label}: {cuts} cuts, {intact} read intact, {refused} refused; {:?}", started.elapsed());
}

fn judge_bytes(bytes: &[u8]) -> Outcome {
    let dir = scratch();
    let path = dir.path().join("undamaged.redb");
    std::fs::write(&path, bytes).unwrap();
    judge(&path, &originals()).unwrap()
}

#[test]
fn every_flipped_byte_and_every_cut_of_a_closed_store_is_an_error_or_the_original_marks() {
    let dir = scratch();
    let path = dir.path().join("marks.redb");
    drop(build(&path));
    every_offset_and_every_cut("closed store", &std::fs::read(&path).unwrap());
}

#[test]
fn every_flipped_byte_and_every_cut_of_a_copy_taken_while_open_is_an_error_or_the_original_marks() {
    let dir = scratch();
    let path = dir.path().join("marks.redb");
    let open = build(&path);
    // Copied under a running store: redb has not closed it, so its next open must
    // recover, choosing between the two commit slots.
    let hot = std::fs::read(&path).unwrap();
    drop(open);
    every_offset_and_every_cut("copy of an open store", &hot);
}
