//! The file store's journal (`STORE.journal`): an advance is durable in it before it is
//! reported, and a process killed with SIGKILL leaves its advances there for the next
//! open; it is folded into the store's file as it fills and when the store is closed;
//! a journal that may hold advances is never done without, and another store's is
//! refused. Damage to its bytes is `file_store_corruption.rs`.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::file_store::open_error;
use fencekeeper::{FileStore, MarkStore, StoreError, Swap, Token};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn journal_of(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap().to_os_string();
    name.push(".journal");
    path.with_file_name(name)
}

fn t(n: u64) -> Token {
    Token::from_parts(&[n]).unwrap()
}

/// Advance `resource` from nothing through `1..=n`, each swap from the one before.
fn advance(store: &FileStore, resource: &str, n: u64) {
    for i in 1..=n {
        let expected = (i > 1).then(|| t(i - 1));
        assert_eq!(store.compare_and_swap(resource, expected.as_ref(), &t(i)).unwrap(), Swap::Swapped);
    }
}

/// Why the store at `path` does not open, which must be as a corrupt store.
fn corrupt_reason(path: &Path) -> String {
    let err = open_error(path);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    err.to_string()
}

/// A child process advances marks, says so, and is killed with SIGKILL before it
/// can close the store: every reported advance is read back, from the journal.
#[test]
fn advances_of_a_process_killed_with_sigkill_come_back_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["file_store_journal::advancing_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("FK_JOURNAL_STORE", &path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Readiness: the child prints once its advances were reported.
    // (libtest prints the test's name on the same line first).
    let reported = lines.by_ref().map_while(Result::ok).find(|l| l.contains("reported"));
    assert!(reported.as_deref().is_some_and(|l| l.ends_with("reported 3000")), "{reported:?}");
    child.kill().unwrap();
    child.wait().unwrap();

    // The store's file alone is refused: it says its journal may hold advances.
    let journal = journal_of(&path);
    let kept = std::fs::read(&journal).unwrap();
    std::fs::remove_file(&journal).unwrap();
    assert!(corrupt_reason(&path).contains("journal is missing"));
    // Nor is it read in an earlier development format's place (it would read empty).
    let mut earlier = kept.clone();
    earlier[..8].copy_from_slice(b"FKJRNL1\n");
    std::fs::write(&journal, earlier).unwrap();
    assert!(corrupt_reason(&path).contains("earlier development format"));
    std::fs::write(&journal, kept).unwrap();

    let store = FileStore::open(&path).unwrap();
    assert_eq!(store.get("lone").unwrap(), Some(t(3000)));
    assert_eq!(store.get("other").unwrap(), Some(t(7)));
    assert_eq!(store.list().unwrap(), vec![("lone".into(), t(3000)), ("other".into(), t(7))]);
    // Nothing lower is taken, and the next advance goes on from there.
    assert_eq!(store.compare_and_swap("lone", None, &t(2999)).unwrap(), Swap::Conflict(Some(t(3000))));
    assert_eq!(store.compare_and_swap("lone", Some(&t(3000)), &t(3001)).unwrap(), Swap::Swapped);
    drop(store);
    // Closed cleanly: folded in, so the store's file alone holds every mark.
    std::fs::remove_file(&journal).unwrap();
    let store = FileStore::open(&path).unwrap();
    assert_eq!(store.get("lone").unwrap(), Some(t(3001)));
    assert_eq!(store.get("other").unwrap(), Some(t(7)));
}

/// The child half: 3000 advances on one resource (past a fold or two: a lone
/// advance's frame is about 110 bytes) and 7 on another, then wait to be killed.
#[test]
#[ignore = "run by the test above, which kills it"]
fn advancing_child() {
    let path = std::env::var_os("FK_JOURNAL_STORE").expect("run by its parent test");
    let store = FileStore::open(&path).unwrap();
    advance(&store, "lone", 3000);
    advance(&store, "other", 7);
    println!("reported 3000");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

/// A key whose bytes are a whole journal frame of `epoch` with sequence number
/// `seq`, checksummed as anyone who knows the format but not the journal's id can:
/// its magic, epoch, sequence number, payload length, payload (one entry: `victim`
/// advanced to a huge token), CRC32C. Zero bytes are UTF-8, and a path's `%00`
/// makes one; a token is tried until the whole is UTF-8.
fn key_forging_a_frame(epoch: u64, seq: u64) -> String {
    (1u64..)
        .find_map(|n| {
            let token = format!("{}", 900_000 + n);
            let mut payload = vec![6, 0];
            payload.extend_from_slice(b"victim");
            payload.push(token.len() as u8);
            payload.extend_from_slice(token.as_bytes());
            let mut frame = 0x4a4b_4631u32.to_le_bytes().to_vec();
            frame.extend_from_slice(&epoch.to_le_bytes());
            frame.extend_from_slice(&seq.to_le_bytes());
            frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            frame.extend_from_slice(&payload);
            let crc = fencekeeper_core::record::checksum(b"fencekeeper journal frame", &frame);
            frame.extend_from_slice(&crc.to_le_bytes());
            String::from_utf8([b"k/".as_slice(), &frame].concat()).ok()
        })
        .unwrap()
}

/// A client chooses its keys: here one holding a frame forged for the journal's next
/// epoch, with a sequence number past any. After a fold it lies in the file beyond
/// the new epoch's frames, where a crash's recovery looks for a later whole frame
/// (one would mean reported advances were lost). A copy of the store taken while it
/// runs, as a crash leaves it, still opens, with every mark and no `victim`.
#[test]
fn a_key_holding_a_forged_frame_never_stops_the_store_opening_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (path, copy) = (dir.path().join("marks.redb"), dir.path().join("copy.redb"));
    let store = FileStore::open(&path).unwrap();
    advance(&store, "lone", 800);
    let key = key_forging_a_frame(2, 1 << 40);
    assert_eq!(store.compare_and_swap(&key, None, &t(1)).unwrap(), Swap::Swapped);
    // On, past the fold (a lone advance's frame is under 80 bytes, so it comes before
    // the 1700th), until epoch 2 holds a few hundred frames: fewer than lie before
    // the key's.
    for i in 801..=2000 {
        assert_eq!(store.compare_and_swap("lone", Some(&t(i - 1)), &t(i)).unwrap(), Swap::Swapped);
    }
    std::fs::copy(journal_of(&path), journal_of(&copy)).unwrap();
    std::fs::copy(&path, &copy).unwrap();
    drop(store);
    let copied = FileStore::open(&copy).unwrap();
    assert_eq!(copied.get("lone").unwrap(), Some(t(2000)));
    assert_eq!(copied.get(&key).unwrap(), Some(t(1)));
    assert_eq!(copied.get("victim").unwrap(), None);
}

/// A store closed cleanly holds every mark in its file: a journal beside it in an
/// earlier development format holds none it needs, and is made again in this one.
#[test]
fn a_closed_stores_journal_of_the_earlier_format_is_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    advance(&FileStore::open(&path).unwrap(), "r", 3);
    let journal = journal_of(&path);
    let mut earlier = std::fs::read(&journal).unwrap();
    earlier[..8].copy_from_slice(b"FKJRNL1\n");
    std::fs::write(&journal, &earlier).unwrap();
    let store = FileStore::open(&path).unwrap();
    assert_eq!(store.get("r").unwrap(), Some(t(3)));
    assert_eq!(store.compare_and_swap("r", Some(&t(3)), &t(4)).unwrap(), Swap::Swapped);
    drop(store);
    assert_ne!(std::fs::read(&journal).unwrap()[..8], earlier[..8], "made again in this format");
    assert_eq!(FileStore::open(&path).unwrap().get("r").unwrap(), Some(t(4)));
}

#[test]
fn a_journal_of_another_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.redb"), dir.path().join("b.redb"));
    advance(&FileStore::open(&a).unwrap(), "r", 3);
    advance(&FileStore::open(&b).unwrap(), "r", 9);
    std::fs::copy(journal_of(&b), journal_of(&a)).unwrap();
    assert!(corrupt_reason(&a).contains("belongs to another store"));
}

/// A store removed while its journal held advances, and a new one made at its path:
/// the old journal is not taken for the new store's.
#[test]
fn a_journal_left_by_a_removed_store_is_not_taken_by_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let (path, parked) = (dir.path().join("marks.redb"), dir.path().join("parked.journal"));
    let store = FileStore::open(&path).unwrap();
    advance(&store, "r", 5);
    // A copy of the journal as it was while the store ran, holding the advances.
    std::fs::copy(journal_of(&path), &parked).unwrap();
    drop(store);
    std::fs::remove_file(&path).unwrap();
    std::fs::copy(&parked, journal_of(&path)).unwrap();
    assert!(corrupt_reason(&path).contains("has no record of it"));
    // In the earlier development format it cannot be read, and it is not made again.
    let mut earlier = std::fs::read(&parked).unwrap();
    earlier[..8].copy_from_slice(b"FKJRNL1\n");
    std::fs::write(journal_of(&path), &earlier).unwrap();
    assert!(corrupt_reason(&path).contains("earlier development format"));
    assert_eq!(std::fs::read(journal_of(&path)).unwrap(), earlier, "left as it was");
}

#[test]
fn marks_survive_many_folds_and_a_store_only_read_leaves_its_journal_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let store = FileStore::open(&path).unwrap();
    // Enough to fold the journal into the file several times while advancing.
    for r in 0..4 {
        advance(&store, &format!("r{r}"), 2500);
    }
    drop(store);
    let journal = std::fs::read(journal_of(&path)).unwrap();
    let store = FileStore::open(&path).unwrap();
    let marks = store.list().unwrap();
    assert_eq!(marks, (0..4).map(|r| (format!("r{r}"), t(2500))).collect::<Vec<_>>());
    drop(store);
    // No fold and no new epoch: nothing was written to the journal.
    assert!(journal == std::fs::read(journal_of(&path)).unwrap(), "reading the store rewrote its journal");
}
