//! How a mark store grows with the number of resources it has marks for:
//! `cargo bench --bench growth -p fencekeeper --features etcd -- file|etcd=URL N1 N2 ...`.
//!
//! For each N (ascending), marks are added until the store holds N (16 threads, each
//! admit a new resource's first token: an advance), then measured at that size:
//!
//! * the bytes per mark: the file's size (file), or etcd's database size from its
//!   `/metrics` (`etcd_mvcc_db_total_size_in_bytes`; a fresh etcd, no compaction);
//! * admit p50 and p99 (µs) over 2,000 admits of a holder writing again on resources
//!   drawn across the whole store (a read, and for etcd the confirming Txn), and over
//!   2,000 advances of existing marks (a compare-and-swap);
//! * for the file store, the time to open it again (redb verifies every page: what a
//!   gateway's start-up pays) and to list and verify every record (`marks --verify`);
//! * retention (`store::Retention`): a compaction that forgets nothing yet (`--idle-for
//!   365d` the first time: the file store stamps every mark in its since table, whose
//!   bytes a mark are shown beside; etcd reads every mark and records a checkpoint),
//!   then one that forgets every mark (`--idle-for 0s`: on the file store's copy at
//!   each size, on etcd at the last size only, since it empties the store).
//!
//! `FENCEKEEPER_GROWTH_FORGET=no` skips etcd's compaction that forgets every mark
//! (at 10^7 its deletes' tombstones would pass etcd's default 2 GiB quota), and
//! `FENCEKEEPER_GROWTH_COMPACT=no` both of etcd's compactions.
//! With `FENCEKEEPER_GROWTH_FILL=txn`, etcd is filled by Txns of 128 puts of the same
//! keys and records the store's first admits write (10^7 marks in minutes instead of
//! an hour; each Txn is one revision for its 128 marks); what is measured is the same.
//!
//! Prints one Markdown row per N. `scripts/bench-growth.sh` starts etcd and runs both.

use fencekeeper::store::{EtcdStore, Repair, Retention};
use fencekeeper::{FileStore, Guard, MarkStore, NativeDecider, Policy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: u64 = 16;
const SAMPLES: u64 = 2_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let Some(kind) = args.first() else {
        eprintln!("usage: growth file|etcd=URL N1 N2 ...");
        std::process::exit(2);
    };
    let sizes: Vec<u64> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    let dir = std::env::var_os("FENCEKEEPER_BENCH_DIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let path = dir.join(format!("fencekeeper-growth-{}.redb", std::process::id()));
    let etcd = kind.strip_prefix("etcd=").map(str::to_owned);
    let etcd_store = etcd.as_ref().map(|url| Arc::new(EtcdStore::connect(url).expect("connect to etcd")));
    let file_store = etcd.is_none().then(|| Arc::new(FileStore::open(&path).expect("open the file store")));
    let store: Arc<dyn MarkStore + Send + Sync> = match (&etcd_store, &file_store) {
        (Some(store), _) => store.clone(),
        (_, Some(store)) => store.clone(),
        _ => unreachable!("one of the two"),
    };
    let guard = Arc::new(Guard::new(Arc::new(NativeDecider(Policy::default())), store));
    println!(
        "| store | marks | bytes per mark | again p50 | again p99 | advance p50 | advance p99 | open | verify | \
         compact, nothing idle yet | compact, all idle |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut have = 0;
    let last = sizes.last().copied();
    let direct = std::env::var("FENCEKEEPER_GROWTH_FILL").is_ok_and(|v| v == "txn");
    let forget_all = std::env::var("FENCEKEEPER_GROWTH_FORGET").map_or(true, |v| v != "no");
    let compact = std::env::var("FENCEKEEPER_GROWTH_COMPACT").map_or(true, |v| v != "no");
    for n in sizes {
        match &etcd {
            Some(url) if direct => fill_direct(url, have, n),
            _ => fill(&guard, have, n),
        }
        have = n;
        // Again: the resource's own mark (read first, not timed). Advance: above any
        // token given so far.
        let again = latencies(&guard, n, |resource| guard.mark(resource).ok().flatten().map(|m| m.to_string()));
        let round = AtomicU64::new(1_000_000 * n);
        let advance = latencies(&guard, n, |_| Some((round.fetch_add(1, Ordering::Relaxed)).to_string()));
        let (bytes, open, verify, watch, forget) = match (&etcd, &etcd_store) {
            (Some(url), Some(store)) => {
                let bytes = etcd_db_size(url);
                let watch = if compact {
                    timed(|| store.compact(Duration::from_secs(365 * 86_400), now()), 0)
                } else {
                    "-".into()
                };
                let forget = if Some(n) == last && forget_all && compact {
                    timed(|| store.compact(Duration::ZERO, now()), n)
                } else {
                    "-".into()
                };
                (bytes, "-".to_owned(), "-".to_owned(), watch, forget)
            }
            _ => file_figures(&guard, &path, n),
        };
        let name = if etcd.is_some() { "etcd" } else { "file" };
        println!(
            "| {name} | {n} | {:.0} | {} | {} | {} | {} | {open} | {verify} | {watch} | {forget} |",
            bytes as f64 / n as f64,
            again.0,
            again.1,
            advance.0,
            advance.1
        );
    }
    // Advances while the live file store compacts (the pass that stamps every mark):
    // how long a writer can wait for a compaction's write transaction.
    if let (Some(file), Some(n)) = (&file_store, last) {
        let compacting = {
            let file = file.clone();
            std::thread::spawn(move || file.compact(Duration::from_secs(365 * 86_400), now()).expect("compact"))
        };
        let round = AtomicU64::new(2_000_000 * n);
        let mut took = Vec::new();
        while !compacting.is_finished() {
            let i = (took.len() as u64 * 2_654_435_761) % n;
            let (resource, token) = (resource(i), round.fetch_add(1, Ordering::Relaxed).to_string());
            let start = Instant::now();
            assert!(guard.admit(&resource, Some(&token)).admitted());
            took.push(start.elapsed());
        }
        let compaction = compacting.join().expect("the compaction");
        took.sort();
        let at =
            |q: f64| took[((took.len() as f64 * q) as usize).min(took.len().saturating_sub(1))].as_secs_f64() * 1e6;
        println!();
        println!(
            "advances while the live store of {n} marks compacts (kept {}): {} advances, p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
            compaction.kept,
            took.len(),
            at(0.5),
            at(0.99),
            took.last().map_or(0.0, |d| d.as_secs_f64() * 1e6)
        );
    }
    drop(guard);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(FileStore::journal_path(&path));
}

/// Admit token 1 on resources `from..to` (each a new mark), 16 threads.
fn fill(guard: &Arc<Guard>, from: u64, to: u64) {
    let next = Arc::new(AtomicU64::new(from));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (guard, next) = (guard.clone(), next.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= to {
                    return;
                }
                let resource = resource(i);
                let d = guard.admit(&resource, Some("1"));
                assert!(d.admitted(), "{}", d.reason(&resource));
            })
        })
        .collect();
    for w in workers {
        w.join().expect("filler");
    }
}

/// Put the marks of resources `from..to` (token 1) straight into etcd, 128 a Txn
/// (etcd's default `--max-txn-ops`), 16 threads.
fn fill_direct(url: &str, from: u64, to: u64) {
    use fencekeeper::etcd::{EtcdClient, EtcdOptions};
    use fencekeeper_core::record;
    use fencekeeper_etcd_wire::{grpc, mark_key, Op, DEFAULT_PREFIX};
    const PER_TXN: u64 = 128;
    let one = fencekeeper::Token::parse("1").expect("a token");
    let next = Arc::new(AtomicU64::new(from));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (next, url) = (next.clone(), url.to_owned());
            std::thread::spawn(move || {
                let client = EtcdClient::new(&url, &EtcdOptions::default()).expect("connect to etcd");
                loop {
                    let start = next.fetch_add(PER_TXN, Ordering::Relaxed);
                    if start >= to {
                        return;
                    }
                    let marks: Vec<(String, String)> = (start..(start + PER_TXN).min(to))
                        .map(|i| {
                            let r = resource(i);
                            (mark_key(DEFAULT_PREFIX, &r), record::encode(r.as_bytes(), &one).as_str().to_owned())
                        })
                        .collect();
                    let puts: Vec<Op<'_>> = marks
                        .iter()
                        .map(|(k, v)| Op::Put { key: k.as_bytes(), value: v.as_bytes(), lease: None })
                        .collect();
                    let answer = client.txn(&grpc::txn(&[], &puts, &[])).expect("a fill Txn");
                    assert!(answer.succeeded, "a Txn without compares succeeds");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("filler");
    }
}

fn resource(i: u64) -> String {
    format!("bucket/objects/{i:010}")
}

/// p50 and p99 (µs) of SAMPLES admits, one at a time, on resources spread over the
/// store, each with the token `token(resource)` (worked out before the clock starts).
fn latencies(guard: &Guard, n: u64, token: impl Fn(&str) -> Option<String>) -> (String, String) {
    let mut took: Vec<Duration> = (0..SAMPLES)
        .map(|k| {
            // A multiplicative spread over the whole key space.
            let i = (k * 2_654_435_761) % n;
            let resource = resource(i);
            let token = token(&resource).expect("every resource has a mark");
            let start = Instant::now();
            let d = guard.admit(&resource, Some(&token));
            let elapsed = start.elapsed();
            assert!(d.admitted(), "{}", d.reason(&resource));
            elapsed
        })
        .collect();
    took.sort();
    let at =
        |q: f64| format!("{:.0} µs", took[((took.len() as f64 * q) as usize).min(took.len() - 1)].as_secs_f64() * 1e6);
    (at(0.5), at(0.99))
}

/// Seconds since the Unix epoch.
fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The time a compaction took, checking that it forgot `forgets` marks.
fn timed(
    compact: impl FnOnce() -> Result<fencekeeper::store::Compaction, fencekeeper::StoreError>,
    forgets: u64,
) -> String {
    let start = Instant::now();
    let c = compact().expect("compact");
    let took = start.elapsed();
    assert_eq!(c.forgotten.len() as u64, forgets, "{c:?}");
    format!("{:.0} ms", took.as_secs_f64() * 1e3)
}

/// The file's size, the time to open it again (every page verified) and to verify
/// every record; then on the same copy the two compactions, the first one's with the
/// bytes a mark its since table added.
fn file_figures(guard: &Arc<Guard>, path: &std::path::Path, n: u64) -> (u64, String, String, String, String) {
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    // The guard holds the store (redb allows one opener): measure on a copy.
    let copy = path.with_extension("copy.redb");
    std::fs::copy(path, &copy).expect("copy the store");
    // A store in use is its file and its journal (the marks not folded in yet).
    std::fs::copy(FileStore::journal_path(path), FileStore::journal_path(&copy)).expect("copy the journal");
    let start = Instant::now();
    let reopened = FileStore::open(&copy).expect("reopen");
    let open = start.elapsed();
    let start = Instant::now();
    let scanned = reopened.scan().expect("scan");
    let verify = start.elapsed();
    assert!(scanned.iter().all(|s| s.mark.is_ok()));
    let watch = timed(|| reopened.compact(Duration::from_secs(365 * 86_400), now()), 0);
    let stamped = std::fs::metadata(&copy).map(|m| m.len()).unwrap_or(0);
    let watch = format!("{watch} (+{:.0} B a mark)", stamped.saturating_sub(bytes) as f64 / n as f64);
    let forget = timed(|| reopened.compact(Duration::ZERO, now()), n);
    drop(reopened);
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_file(FileStore::journal_path(&copy));
    let _ = guard;
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    (bytes, ms(open), ms(verify), watch, forget)
}

/// etcd's database size, from its metrics.
fn etcd_db_size(url: &str) -> u64 {
    let body = ureq_get(&format!("{}/metrics", url.trim_end_matches('/')));
    body.lines()
        .find(|l| l.starts_with("etcd_mvcc_db_total_size_in_bytes "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A plain HTTP/1.1 GET of `url` (`http://HOST:PORT/path`): the body.
fn ureq_get(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let mut stream = std::net::TcpStream::connect(authority).expect("connect to etcd's metrics");
    let _ = write!(stream, "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}
