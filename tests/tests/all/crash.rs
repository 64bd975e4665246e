//! SIGKILL never loses an acknowledged mark.
//!
//! A child process (this test binary, re-run as the ignored test `admitting_child`)
//! admits rising tokens through a guard on a durable file store and prints each
//! token only after its admit returned: a printed token is one the writer was told
//! it may use. The parent kills the child with SIGKILL at a random point, reopens
//! the store and checks that it opens, that the mark is at least every printed
//! token, and that a token below the last printed one is refused; then restarts the
//! child on the same store, for several rounds.
//!
//! The same for an upgrade of an old-format store: killed at any point, the file is
//! either the old store, whole, or the upgraded one, whole.

// A test states its expectations by panicking.
#![allow(clippy::panic)]

use fencekeeper::store::FileStore;
use fencekeeper::validator::Validator;
use fencekeeper::{Class, Guard, MarkStore, Policy};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set (to the store's path) only in the child.
const CHILD_STORE: &str = "FENCEKEEPER_CRASH_CHILD_STORE";
const RESOURCE: &str = "journal/segment-7";
const ROUNDS: usize = 20;
/// The child's own bound, far above what any round reads before the kill.
const CHILD_MAX_ADMITS: u64 = 100_000;

fn validator() -> Validator {
    Validator::bundled(Policy::default()).expect("load the wasm validator")
}

fn guard_on(path: &Path) -> Guard {
    let store: Arc<dyn MarkStore + Send + Sync> =
        Arc::new(FileStore::open(path).expect("the store opens after a SIGKILL"));
    Guard::new(Arc::new(validator()), store)
}

/// The child: admit rising tokens from the stored mark on, printing each one after
/// its admit returned. Does nothing unless started by the parent.
#[test]
#[ignore = "the child process of sigkill_never_loses_an_acknowledged_mark, which runs it"]
fn admitting_child() {
    let Some(path) = std::env::var_os(CHILD_STORE) else { return };
    let guard = guard_on(Path::new(&path));
    let start = guard.mark(RESOURCE).expect("read the mark").map_or(1, |m| m.parts()[0] + 1);
    let mut out = std::io::stdout().lock();
    for token in start..start + CHILD_MAX_ADMITS {
        let d = guard.admit(RESOURCE, Some(&token.to_string()));
        assert!(d.admitted(), "{}", d.reason(RESOURCE));
        // One write per line: the parent never sees half an acknowledgement.
        out.write_all(format!("ack {token}\n").as_bytes()).and_then(|()| out.flush()).expect("stdout");
    }
}

/// Run the child until it has acknowledged `wanted` tokens, then SIGKILL it after a
/// random spin; return every token it acknowledged before it died.
fn run_and_kill(store: &Path, wanted: usize, spin: Duration) -> Vec<u64> {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["crash::admitting_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_STORE, store)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            // A line without its newline was cut by the kill: not acknowledged.
            if let Some(token) = line.strip_prefix("ack ").and_then(|t| t.strip_suffix('\n')) {
                let _ = tx.send(token.parse::<u64>().expect("child prints tokens"));
            }
            line.clear();
        }
    });
    let mut acked = Vec::new();
    while acked.len() < wanted {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(token) => acked.push(token),
            Err(e) => {
                let _ = child.kill();
                panic!("child stopped acknowledging after {} tokens ({e}): {:?}", acked.len(), child.wait());
            }
        }
    }
    // Spin rather than sleep: the kill should land anywhere, including mid-commit.
    let until = Instant::now() + spin;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    assert_eq!(status.signal(), Some(9), "the child must die by SIGKILL, not exit ({status})");
    reader.join().expect("reader thread");
    // Everything printed before the kill was acknowledged too.
    acked.extend(rx.try_iter());
    acked
}

#[test]
fn sigkill_never_loses_an_acknowledged_mark() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("marks.redb");
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.subsec_nanos() as u64);
    eprintln!("crash test seed {seed}");
    let (mut highest_acked, mut unacknowledged_advances) = (0u64, 0);
    for round in 0..ROUNDS as u64 {
        let r = seed.wrapping_mul(6364136223846793005).wrapping_add(round * 1442695040888963407) >> 33;
        let (wanted, spin) = (1 + (r % 200) as usize, Duration::from_micros(r % 3_000));
        let acked = run_and_kill(&store, wanted, spin);
        let last = *acked.last().expect("at least one acknowledged token");
        assert!(acked.windows(2).all(|w| w[0] < w[1]), "round {round}: tokens rise");
        assert!(acked[0] > highest_acked, "round {round}: the restarted child resumed above the last mark");
        highest_acked = last;

        let guard = guard_on(&store);
        let mark = guard.mark(RESOURCE).expect("read the mark").expect("a mark after acknowledged admits");
        assert!(mark.parts()[0] >= last, "round {round} (seed {seed}): mark {mark} lost acknowledged token {last}");
        // A kill between the commit and the print: the mark is ahead of the acks.
        unacknowledged_advances += usize::from(mark.parts()[0] > last);
        let stale = guard.admit(RESOURCE, Some(&(last - 1).to_string()));
        assert_eq!(stale.class(), Class::Stale, "round {round}: {}", stale.reason(RESOURCE));
        // The guard (and its store) must close before the next child opens the file.
        drop(guard);
    }
    eprintln!(
        "{ROUNDS} rounds; in {unacknowledged_advances} the kill landed after a commit and before its acknowledgement"
    );
}

/// Set (to the store's path) only in the upgrading child.
const UPGRADE_CHILD_STORE: &str = "FENCEKEEPER_CRASH_UPGRADE_CHILD_STORE";
/// Marks in the old store: enough that an upgrade takes a while to commit.
const OLD_MARKS: u64 = 3_000;

/// The child of the upgrade test: say so, then upgrade the store in place.
#[test]
#[ignore = "the child process of sigkill_during_an_upgrade_leaves_the_old_store_or_the_upgraded_one, which runs it"]
fn upgrading_child() {
    let Some(path) = std::env::var_os(UPGRADE_CHILD_STORE) else { return };
    let mut out = std::io::stdout().lock();
    out.write_all(b"upgrading\n").and_then(|()| out.flush()).expect("stdout");
    FileStore::upgrade(Path::new(&path)).expect("upgrade");
    out.write_all(b"upgraded\n").and_then(|()| out.flush()).expect("stdout");
}

/// A store in the old format (table `fencekeeper_marks`, bare tokens), as the
/// previous version wrote it: resource `r/N` has mark `N.7`.
fn old_store(path: &Path) {
    let db = redb::Database::create(path).expect("create");
    let txn = db.begin_write().expect("write");
    {
        let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("fencekeeper_marks");
        let mut table = txn.open_table(def).expect("table");
        for n in 0..OLD_MARKS {
            table.insert(format!("r/{n}").as_str(), format!("{n}.7").as_str()).expect("insert");
        }
    }
    txn.commit().expect("commit");
}

/// Every mark of [`old_store`], sorted as a store lists them.
fn old_marks() -> Vec<(String, fencekeeper::Token)> {
    let mut all: Vec<_> =
        (0..OLD_MARKS).map(|n| (format!("r/{n}"), fencekeeper::Token::from_parts(&[n, 7]).expect("token"))).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// The old table's marks, read as the previous version would.
fn format1_marks(path: &Path) -> Vec<(String, fencekeeper::Token)> {
    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::Database::open(path).expect("open");
    let txn = db.begin_read().expect("read");
    let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("fencekeeper_marks");
    let table = txn.open_table(def).expect("the old table is whole");
    let all = table
        .iter()
        .expect("iterate")
        .map(|e| {
            let (k, v) = e.expect("entry");
            (k.value().to_owned(), fencekeeper::Token::parse(v.value()).expect("old token"))
        })
        .collect();
    all
}

/// Start the upgrading child on `store`, SIGKILL it `spin` after it said it starts
/// (or let it finish, with `None`); true if it finished before the kill.
fn upgrade_and_kill(store: &Path, spin: Option<Duration>) -> bool {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["crash::upgrading_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(UPGRADE_CHILD_STORE, store)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child");
    let mut lines = BufReader::new(child.stdout.take().expect("child stdout"));
    // The test harness prints its own lines first.
    let mut line = String::new();
    while !line.ends_with("upgrading\n") {
        line.clear();
        assert!(lines.read_line(&mut line).expect("child stdout") > 0, "the child ended before it started");
    }
    let Some(spin) = spin else {
        assert!(child.wait().expect("reap").success());
        return true;
    };
    let until = Instant::now() + spin;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
    let mut rest = String::new();
    let _ = lines.read_to_string(&mut rest);
    rest.contains("upgraded\n")
}

#[test]
fn sigkill_during_an_upgrade_leaves_the_old_store_or_the_upgraded_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pristine = dir.path().join("old.redb");
    old_store(&pristine);
    let store = dir.path().join("marks.redb");
    // One whole upgrade, to know how long one takes.
    std::fs::copy(&pristine, &store).expect("copy");
    let started = Instant::now();
    assert!(upgrade_and_kill(&store, None));
    let whole = started.elapsed();
    assert_eq!(FileStore::open(&store).expect("upgraded").list().expect("list"), old_marks());
    let (mut old, mut new) = (0, 0);
    for round in 0..12u32 {
        std::fs::copy(&pristine, &store).expect("copy");
        let spin = whole * round / 12;
        upgrade_and_kill(&store, Some(spin));
        match FileStore::open(&store) {
            Ok(upgraded) => {
                assert_eq!(upgraded.list().expect("list"), old_marks(), "round {round}: upgraded, every mark");
                new += 1;
            }
            Err(fencekeeper::StoreError::OldFormat { .. }) => {
                assert_eq!(format1_marks(&store), old_marks(), "round {round}: still old, every mark");
                old += 1;
            }
            Err(e) => panic!("round {round}: after a kill {spin:?} into the upgrade: {e}"),
        }
    }
    eprintln!("12 kills during an upgrade of {whole:?}: {old} left the old store, {new} the upgraded one");
}
