//! A file store whose disk fills up refuses advances with an I/O error, loses no
//! acknowledged mark, and takes writes again once there is room, without its user
//! reopening it (redb refuses every transaction after one I/O error until the
//! database is reopened: the store does that itself).
//!
//! The full disk is the process's file-size limit (`RLIMIT_FSIZE`): a write past it
//! fails with EFBIG as a write to a full disk fails with ENOSPC, and it needs no
//! mount and no root. The child half runs under `sh -c 'trap "" XFSZ; ulimit -S -f
//! N; exec ...'` (SIGXFSZ ignored, so the write fails instead of killing the
//! process); "room again" is the child raising its soft limit back to the hard one.
//! The torture run's `disk-full` fault does the same with a real full tmpfs and the
//! gateway (tests/README.md).

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::{FileStore, MarkStore, StoreError, Swap, Token};
use std::process::Command;

/// The soft file-size limit, in the 512-byte blocks of `ulimit -f`: room for the
/// new store and a few commits, not for hundreds of new resources.
const LIMIT_BLOCKS: u64 = 4096;

#[test]
fn a_full_disk_refuses_advances_loses_nothing_and_the_store_writes_again_once_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "trap '' XFSZ; ulimit -S -f {LIMIT_BLOCKS} && exec \"$0\" file_store_disk_full::disk_full_child --exact --ignored --nocapture --test-threads=1"
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .arg(std::env::current_exe().unwrap())
        .env("FK_DISK_FULL_DIR", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("disk full after"), "the limit was never reached:\n{stdout}");
    assert!(stdout.contains("writes again"), "{stdout}");
}

/// The child half: fill the "disk", check what the store answers, make room, write on.
#[test]
#[ignore = "run by the test above under a file-size limit"]
fn disk_full_child() {
    let dir = std::env::var_os("FK_DISK_FULL_DIR").expect("run by its parent test");
    let path = std::path::Path::new(&dir).join("marks.redb");
    let store = FileStore::open(&path).unwrap();
    let one = Token::parse("1").unwrap();
    // New resources need new pages: the file grows until the limit stops it.
    let mut acknowledged = Vec::new();
    let mut failure = None;
    for i in 0..200_000 {
        let resource = format!("/disk-full/{i:06}/{}", "x".repeat(200));
        match store.compare_and_swap(&resource, None, &one) {
            Ok(Swap::Swapped) => acknowledged.push(resource),
            Ok(other) => panic!("a fresh resource answered {other:?}"),
            Err(e) => {
                failure = Some((i, e));
                break;
            }
        }
    }
    let (at, error) = failure.expect("the file-size limit was never reached");
    println!("disk full after {at} new resources: {error}");
    assert!(matches!(error, StoreError::Io { .. }), "an I/O error, not {error:?}");
    let text = error.to_string();
    assert!(text.contains(&path.display().to_string()) && !text.contains('\n'), "{text}");

    // Still full: every call is an error, none a lower or missing mark.
    let refused = store.compare_and_swap("/disk-full/after", None, &one);
    assert!(refused.is_err(), "{refused:?}");
    let read = store.get(&acknowledged[0]);
    assert!(read.is_err() || read.as_ref().unwrap() == &Some(one), "{read:?}");

    // Room again: the soft limit back up to the hard one.
    let limit = rustix::process::getrlimit(rustix::process::Resource::Fsize);
    rustix::process::setrlimit(
        rustix::process::Resource::Fsize,
        rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum },
    )
    .unwrap();
    // The store reopens at most once a second; a few tries span that.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let resumed = loop {
        match store.compare_and_swap("/disk-full/after", None, &one) {
            Ok(swap) => break swap,
            Err(e) if std::time::Instant::now() < deadline => {
                println!("not yet: {e}");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => panic!("the store never wrote again: {e}"),
        }
    };
    assert_eq!(resumed, Swap::Swapped);
    println!("writes again after the disk has room");
    // Every acknowledged mark is there, and so is the new one, in this store and
    // in the file opened afresh.
    for r in acknowledged.iter().step_by(97).chain([acknowledged.last().unwrap()]) {
        assert_eq!(store.get(r).unwrap(), Some(one), "{r}");
    }
    drop(store);
    let reopened = FileStore::open(&path).unwrap();
    let marks = reopened.list().unwrap();
    assert_eq!(marks.len(), acknowledged.len() + 1);
    assert_eq!(reopened.get("/disk-full/after").unwrap(), Some(one));
}
