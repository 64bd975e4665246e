//! SIGKILL never loses an acknowledged mark.
//!
//! A child process (this test binary, re-run as the ignored test `admitting_child`)
//! admits rising tokens through a guard on a durable file store and prints each
//! token only after its admit returned: a printed token is one the writer was told
//! it may use. The parent kills the child with SIGKILL at a random point, reopens
//! the store and checks that it opens, that the mark is at least every printed
//! token, and that a token below the last printed one is refused; then restarts the
//! child on the same store, for several rounds.

// A test states its expectations by panicking.
#![allow(clippy::panic)]

use fencekeeper::store::FileStore;
use fencekeeper::validator::Validator;
use fencekeeper::{Class, Guard, MarkStore, Policy};
use std::io::{BufRead, BufReader, Write};
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
        .args(["admitting_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
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
