//! Durable advancing admits per second through one `Guard` with the file store:
//! `cargo bench --bench durable -p fencekeeper -- THREADS SECONDS`. Every admit
//! advances a mark (a fresh, higher token), so every admit is on stable storage
//! before it returns; concurrent admits share commits (group commit).
//! `scripts/bench-durable.sh` runs it beside PostgreSQL's conditional UPDATE.
//!
//! Each thread writes its own resource, so the only thing threads share is the store.
//! Prints one line: `THREADS admits/s`.
//!
//! `-- floor SECONDS` measures instead what a lone durable advance cannot do
//! without: one page written and made durable with `fdatasync` (the journal's frame)
//! in a file beside where the store would be. Prints `floor ops/s`.

use fencekeeper::{FileStore, Guard, NativeDecider, Policy};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    // `cargo bench` passes `--bench`; the numbers are the arguments that parse.
    let numbers: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    if std::env::args().any(|a| a == "floor") {
        return floor(numbers.first().copied().unwrap_or(5).max(1));
    }
    let (threads, seconds) = match numbers[..] {
        [t, s, ..] => (t.max(1), s.max(1)),
        [t] => (t.max(1), 5),
        [] => (1, 5),
    };
    let dir = std::env::var_os("FENCEKEEPER_BENCH_DIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let path = dir.join(format!("fencekeeper-durable-{}.redb", std::process::id()));
    let store = FileStore::open(&path).expect("open the file store");
    // The decision is not what is measured here: the native core keeps it out of the way.
    let guard = Arc::new(Guard::new(Arc::new(NativeDecider(Policy::default())), Arc::new(store)));
    let (stop, admits) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (guard, stop, admits) = (guard.clone(), stop.clone(), admits.clone());
            std::thread::spawn(move || {
                let resource = format!("bench/{t}");
                let mut token = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    token += 1;
                    let d = guard.admit(&resource, Some(&token.to_string()));
                    assert!(d.admitted(), "{}", d.reason(&resource));
                    admits.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let rate = admits.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    drop(guard);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(FileStore::journal_path(&path));
    println!("{threads} {rate:.0}");
}

/// One page write followed by `fdatasync` per operation, for `seconds`.
fn floor(seconds: u64) {
    use std::os::unix::fs::FileExt;
    let dir = std::env::var_os("FENCEKEEPER_BENCH_DIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let path = dir.join(format!("fencekeeper-floor-{}.bin", std::process::id()));
    let file = std::fs::File::create(&path).expect("create the floor file");
    let page = [0x5au8; 4096];
    // Allocated first, so the timed syncs flush data, not the file's growth.
    file.write_all_at(&page, 0).expect("write");
    file.sync_all().expect("sync");
    let (start, mut ops) = (Instant::now(), 0u64);
    while start.elapsed() < Duration::from_secs(seconds) {
        file.write_all_at(&page, 0).expect("write");
        file.sync_data().expect("fdatasync");
        ops += 1;
    }
    let rate = ops as f64 / start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    println!("floor {rate:.0}");
}
