//! The durable file store (redb): marks survive reopening, a damaged file is an
//! error that names it (never a fresh empty store), marks never go down, and many
//! threads can admit at once. Every record is checked: a damaged digit, a record
//! under another key, a non-UTF-8 key are errors, never a lower or a missing mark;
//! scan and raise repair by hand, a forced set lowers or clears a mark; an
//! old-format store is refused, then upgraded.
//! Damage to the file's bytes themselves is `file_store_corruption.rs`.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::store::{Previous, Raise, Repair, Upgrade};
use fencekeeper::{Class, FileStore, Guard, MarkStore, NativeDecider, Policy, StoreError, Swap, Token};
use fencekeeper_core::token;
use std::path::Path;
use std::sync::Arc;

fn guard(store: FileStore) -> Guard {
    Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(store))
}

/// A store at `path` with marks on two resources, closed again.
fn seeded(path: &Path) {
    let g = guard(FileStore::open(path).unwrap());
    assert!(g.admit("a", Some("34")).admitted());
    assert!(g.admit("b", Some("7.1042")).admitted());
}

/// Why the store at `path` does not open: an error that names the file, in one line.
/// Shared by the modules on the file store.
pub(crate) fn open_error(path: &Path) -> StoreError {
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
    assert_eq!(g.mark("a").unwrap(), Some(token!("34")));
    assert_eq!(g.admit("a", Some("33")).class(), Class::Stale);
    assert_eq!(g.store().list().unwrap(), vec![("a".to_string(), token!("34")), ("b".to_string(), token!("7.1042"))]);
    // No temporary file is left beside the store: only its journal.
    let mut names: Vec<_> =
        std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, vec![std::ffi::OsString::from("marks.redb"), std::ffi::OsString::from("marks.redb.journal")]);
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
    assert!(open_error(&path).to_string().contains("without a fencekeeper_marks_v2 table"));
}

/// Write `value` under `key` straight into the store's table, as a careless tool would.
fn poke(path: &Path, key: &[u8], value: &[u8]) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("fencekeeper_marks_v2");
    txn.open_table(def).unwrap().insert(key, value).unwrap();
    txn.commit().unwrap();
}

fn raw(path: &Path, key: &[u8]) -> Vec<u8> {
    let db = redb::Database::open(path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("fencekeeper_marks_v2");
    let table = txn.open_table(def).unwrap();
    let value = table.get(key).unwrap().unwrap().value().to_vec();
    value
}

fn damaged(result: Result<Option<Token>, StoreError>, path: &Path) -> String {
    let err = result.expect_err("a damaged record must be an error");
    assert!(matches!(err, StoreError::Damaged { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()) && !text.contains('\n'), "{text}");
    text
}

#[test]
fn a_flipped_digit_in_a_stored_mark_is_an_error_not_a_lower_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    {
        let g = guard(FileStore::open(&path).unwrap());
        assert!(g.admit("r", Some("50")).admitted());
    }
    let mut value = raw(&path, b"r");
    assert!(value.starts_with(b"fk2 50 "), "{value:?}");
    value[4] ^= 0x01; // '5' -> '4': "fk2 40 ..."
    poke(&path, b"r", &value);
    let store = FileStore::open(&path).unwrap();
    assert!(damaged(store.get("r"), &path).contains("\"r\""));
    assert!(store.list().is_err());
    let g = guard(store);
    let d = g.admit("r", Some("49"));
    assert_eq!(d.class(), Class::Undecided, "{}", d.reason("r"));
    assert!(!d.admitted());
}

#[test]
fn a_record_moved_to_another_key_is_an_error_there_and_leaves_no_mark_behind_silently() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    seeded(&path);
    // A damaged key: the record of "a" now sits under "q" (and a good one under "a"
    // stays, so the damage is only where it landed).
    poke(&path, b"q", &raw(&path, b"a"));
    let store = FileStore::open(&path).unwrap();
    assert!(damaged(store.get("q"), &path).contains("another resource"));
    assert_eq!(store.get("a").unwrap(), Some(token!("34")));
    assert!(matches!(store.list(), Err(StoreError::Damaged { ref resource, .. }) if resource == "q"));
}

#[test]
fn a_key_that_is_not_utf8_is_reported_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    seeded(&path);
    poke(&path, b"\xffa", &raw(&path, b"a"));
    let store = FileStore::open(&path).unwrap();
    let err = store.list().unwrap_err();
    assert!(err.to_string().contains("not UTF-8"), "{err}");
    let scan = store.scan().unwrap();
    let bad: Vec<_> = scan.iter().filter(|s| s.mark.is_err()).map(|s| s.resource.as_str()).collect();
    assert_eq!(bad, vec!["\u{fffd}a"]);
}

#[test]
fn scan_reports_every_damaged_record_and_the_good_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    seeded(&path);
    poke(&path, b"c", b"34");
    poke(&path, b"d", b"fk2 garbage");
    let scan = FileStore::open(&path).unwrap().scan().unwrap();
    let summary: Vec<(String, bool)> = scan.iter().map(|s| (s.resource.clone(), s.mark.is_ok())).collect();
    let expected = [("a", true), ("b", true), ("c", false), ("d", false)];
    assert_eq!(summary, expected.map(|(r, ok)| (r.to_owned(), ok)));
    assert_eq!(scan[1].mark.as_ref().unwrap(), &token!("7.1042"));
}

#[test]
fn raise_only_raises_and_repairs_a_damaged_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    seeded(&path);
    let mut value = raw(&path, b"a");
    value[4] = b'9'; // "fk2 94 ...": damaged, and looks higher than it was
    poke(&path, b"a", &value);
    let store = FileStore::open(&path).unwrap();
    // Not below a verified mark, nor to another arity.
    assert_eq!(
        store.raise("b", &token!("7.1041")).unwrap(),
        Raise::Refused { floor: token!("7.1042"), previous: Previous::Mark(token!("7.1042")) }
    );
    assert!(matches!(store.raise("b", &token!("8")).unwrap(), Raise::Refused { .. }));
    // Not below what the damaged record still shows.
    assert!(matches!(store.raise("a", &token!("60")).unwrap(), Raise::Refused { floor, .. } if floor == token!("94")));
    assert!(store.get("a").is_err(), "a refused raise writes nothing");
    assert!(matches!(store.raise("a", &token!("95")).unwrap(), Raise::Raised(Previous::Damaged(_))));
    assert_eq!(store.raise("b", &token!("7.2000")).unwrap(), Raise::Raised(Previous::Mark(token!("7.1042"))));
    assert_eq!(store.raise("new", &token!("3")).unwrap(), Raise::Raised(Previous::None));
    drop(store);
    let g = guard(FileStore::open(&path).unwrap());
    assert_eq!(g.admit("a", Some("94")).class(), Class::Stale);
    assert_eq!(
        g.store().list().unwrap(),
        vec![("a".into(), token!("95")), ("b".into(), token!("7.2000")), ("new".into(), token!("3"))]
    );
}

#[test]
fn a_forced_set_lowers_replaces_or_clears_a_mark_whatever_its_record_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.redb");
    seeded(&path);
    let mut value = raw(&path, b"a");
    value[4] = b'9';
    poke(&path, b"a", &value);
    let store = FileStore::open(&path).unwrap();
    assert!(matches!(store.force("a", Some(&token!("20"))).unwrap(), Previous::Damaged(_)));
    assert_eq!(
        store.force("b", Some(&token!("3"))).unwrap(),
        Previous::Mark(token!("7.1042")),
        "lower, and another arity"
    );
    assert_eq!(store.force("b", None).unwrap(), Previous::Mark(token!("3")));
    assert_eq!(store.force("b", None).unwrap(), Previous::None, "clearing nothing is no error");
    drop(store);
    let g = guard(FileStore::open(&path).unwrap());
    assert_eq!(g.store().list().unwrap(), vec![("a".into(), token!("20"))]);
    assert!(g.admit("a", Some("21")).admitted(), "the lowered mark is the mark");
    assert!(g.admit("b", Some("1.1")).admitted(), "a cleared resource takes any first token");
}

/// A store written by the previous version (format 1: bare tokens, no checksums),
/// made by `fencekeeper admit` before this format existed.
const FORMAT1: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/format1.redb");

#[test]
fn an_old_format_store_is_refused_with_the_upgrade_command_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    std::fs::copy(FORMAT1, &path).unwrap();
    let err = open_error(&path);
    assert!(matches!(err, StoreError::OldFormat { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("fencekeeper marks --store {} --upgrade", path.display())), "{err}");
    // Opening verified the file and wrote no mark: it still holds its format-1 marks.
    assert_eq!(format1_marks(&path), 3);
}

fn format1_marks(path: &Path) -> u64 {
    use redb::{ReadableDatabase, ReadableTableMetadata};
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("fencekeeper_marks");
    let table = txn.open_table(def).unwrap();
    table.len().unwrap()
}

#[test]
fn upgrade_converts_an_old_store_in_place_with_the_same_marks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    std::fs::copy(FORMAT1, &path).unwrap();
    let expected = vec![
        ("invoices/7".to_string(), token!("7.1042")),
        ("journal/segment-7".to_string(), token!("50")),
        ("orders/2026.csv".to_string(), token!("34")),
    ];
    assert_eq!(FileStore::upgrade(&path).unwrap(), Upgrade::Upgraded(expected.clone()));
    assert_eq!(FileStore::upgrade(&path).unwrap(), Upgrade::Current, "a second upgrade changes nothing");
    assert!(raw(&path, b"orders/2026.csv").starts_with(b"fk2 34 "));
    let g = guard(FileStore::open(&path).unwrap());
    assert_eq!(g.store().list().unwrap(), expected);
    assert_eq!(g.admit("journal/segment-7", Some("49")).class(), Class::Stale);
}

#[test]
fn a_failed_upgrade_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    std::fs::copy(FORMAT1, &path).unwrap();
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("fencekeeper_marks");
        txn.open_table(def).unwrap().insert("zz/bad", "4O").unwrap();
        txn.commit().unwrap();
    }
    let err = FileStore::upgrade(&path).unwrap_err();
    assert!(err.to_string().contains("zz/bad") && err.to_string().contains("nothing was upgraded"), "{err}");
    // The same old store: still refused as old, every old mark still there.
    assert!(matches!(FileStore::open(&path), Err(StoreError::OldFormat { .. })));
    assert_eq!(format1_marks(&path), 4);
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
    assert_eq!(store.compare_and_swap("r", None, &token!("10")).unwrap(), Swap::Swapped);
    // Even asked directly, with the right expected value, it refuses to go down or sideways.
    assert_eq!(
        store.compare_and_swap("r", Some(&token!("10")), &token!("9")).unwrap(),
        Swap::Conflict(Some(token!("10")))
    );
    assert_eq!(
        store.compare_and_swap("r", Some(&token!("10")), &token!("10")).unwrap(),
        Swap::Conflict(Some(token!("10")))
    );
    assert_eq!(
        store.compare_and_swap("r", Some(&token!("10")), &token!("10.1")).unwrap(),
        Swap::Conflict(Some(token!("10")))
    );
    assert_eq!(store.compare_and_swap("r", None, &token!("11")).unwrap(), Swap::Conflict(Some(token!("10"))));
    assert_eq!(store.compare_and_swap("r", Some(&token!("10")), &token!("11")).unwrap(), Swap::Swapped);
    drop(store);
    assert_eq!(FileStore::open(&path).unwrap().get("r").unwrap(), Some(token!("11")));
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
    assert_eq!(g.mark("shared").unwrap(), Some(token!(&best.to_string())));
}
