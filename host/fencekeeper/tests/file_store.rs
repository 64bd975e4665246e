//! The durable file store (redb): marks survive reopening, a damaged file is an
//! error that names it (never a fresh empty store), marks never go down, and many
//! threads can admit at once.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::{Class, FileStore, Guard, MarkStore, NativeDecider, Policy, StoreError, Swap, Token};
use std::path::Path;
use std::sync::Arc;

fn t(s: &str) -> Token {
    Token::parse(s).unwrap()
}

fn guard(store: FileStore) -> Guard {
    Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(store))
}

/// A store at `path` with marks on two resources, closed again.
fn seeded(path: &Path) {
    let g = guard(FileStore::open(path).unwrap());
    assert!(g.admit("a", Some("34")).admitted());
    assert!(g.admit("b", Some("7.1042")).admitted());
}

fn open_error(path: &Path) -> StoreError {
    let err = FileStore::open(path).expect_err("a damaged store must not open");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "the error must name the file: {text}");
    assert!(!text.contains('\n'), "one line: {text}");
    err
}

#[test]
fn marks_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/marks.redb");
    seeded(&path);
    let g = guard(FileStore::open(&path).unwrap());
    assert_eq!(g.mark("a").unwrap(), Some(t("34")));
    assert_eq!(g.admit("a", Some("33")).class(), Class::Stale);
    assert_eq!(g.store().list().unwrap(), vec![("a".to_string(), t("34")), ("b".to_string(), t("7.1042"))]);
    // No temporary file is left beside the store.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("marks.redb")]);
}

#[test]
fn garbage_file_is_an_error_not_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    let err = open_error(&path);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_eq!(std::fs::read(&path).unwrap(), garbage, "a damaged store must be left as it was");
}

#[test]
fn truncated_file_is_an_error_not_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    seeded(&path);
    let len = std::fs::metadata(&path).unwrap().len();
    for keep in [len / 2, 100] {
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(keep).unwrap();
        drop(file);
        let err = open_error(&path);
        assert!(matches!(err, StoreError::Corrupt { .. } | StoreError::Io { .. }), "{err:?}");
    }
}

#[test]
fn zero_length_file_is_an_error_not_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    std::fs::write(&path, b"").unwrap();
    let err = open_error(&path);
    assert!(err.to_string().contains("empty (zero bytes)"), "{err}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "the file must not be initialised");
}

#[test]
fn redb_file_of_another_application_is_not_a_mark_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    drop(redb::Database::create(&path).unwrap());
    assert!(open_error(&path).to_string().contains("without a fencekeeper_marks table"));
}

#[test]
fn unparsable_stored_mark_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    seeded(&path);
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("fencekeeper_marks");
        txn.open_table(def).unwrap().insert("a", "not-a-token").unwrap();
        txn.commit().unwrap();
    }
    let store = FileStore::open(&path).unwrap();
    assert!(matches!(store.get("a"), Err(StoreError::BadMark { ref resource, .. }) if resource == "a"));
    assert!(store.list().is_err());
    let g = guard(store);
    assert_eq!(g.admit("a", Some("99")).class(), Class::Undecided);
}

#[test]
fn second_open_of_the_same_file_says_it_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let _first = FileStore::open(&path).unwrap();
    let err = open_error(&path);
    assert!(err.to_string().contains("in use by another process"), "{err}");
}

#[test]
fn the_store_never_lowers_a_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    let store = FileStore::open(&path).unwrap();
    assert_eq!(store.compare_and_swap("r", None, &t("10")).unwrap(), Swap::Swapped);
    // Even asked directly, with the right expected value, it refuses to go down or sideways.
    assert_eq!(store.compare_and_swap("r", Some(&t("10")), &t("9")).unwrap(), Swap::Conflict(Some(t("10"))));
    assert_eq!(store.compare_and_swap("r", Some(&t("10")), &t("10")).unwrap(), Swap::Conflict(Some(t("10"))));
    assert_eq!(store.compare_and_swap("r", Some(&t("10")), &t("10.1")).unwrap(), Swap::Conflict(Some(t("10"))));
    assert_eq!(store.compare_and_swap("r", None, &t("11")).unwrap(), Swap::Conflict(Some(t("10"))));
    assert_eq!(store.compare_and_swap("r", Some(&t("10")), &t("11")).unwrap(), Swap::Swapped);
    drop(store);
    assert_eq!(FileStore::open(&path).unwrap().get("r").unwrap(), Some(t("11")));
}

#[test]
fn concurrent_admits_never_lower_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let g = Arc::new(guard(FileStore::open(dir.path().join("marks.redb")).unwrap()));
    let threads: Vec<_> = (0..4u64)
        .map(|thread| {
            let g = g.clone();
            std::thread::spawn(move || {
                let mut best = 0;
                for i in 0..40u64 {
                    let token = i * 4 + thread + 1;
                    let d = g.admit("shared", Some(&token.to_string()));
                    let seen = g.mark("shared").unwrap().unwrap().parts()[0];
                    if d.admitted() {
                        best = token;
                        assert!(seen >= token, "the mark {seen} fell below the admitted {token}");
                    } else {
                        assert_eq!(d.class(), Class::Stale);
                    }
                }
                best
            })
        })
        .collect();
    let best = threads.into_iter().map(|t| t.join().unwrap()).max().unwrap();
    assert_eq!(g.mark("shared").unwrap(), Some(t(&best.to_string())));
}
