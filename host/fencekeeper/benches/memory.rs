//! In-memory admits per second across threads: one `Guard` with the memory store and
//! the bundled wasm validator, beside Redis running the same compare-and-set as a Lua
//! script (`EVALSHA`), the in-memory peer:
//!
//! `cargo bench --bench memory -p fencekeeper -- THREADS SECONDS fixed|rising [REDIS_PORT SHA]`
//!
//! `fixed`: every admit presents the mark (the holder writing again: a read and a
//! decision). `rising`: a higher token each time (every admit advances the mark).
//! Each thread has its own resource, so threads share only the store and the
//! validator. With `REDIS_PORT SHA`, each thread instead holds one connection to
//! Redis on 127.0.0.1 and calls `EVALSHA SHA 1 resource token` for each admit.
//! `scripts/bench-memory.sh` loads the script and runs both, interleaved.
//! Prints one line: `THREADS admits/s`.

use fencekeeper::validator::Validator;
use fencekeeper::{Guard, MemoryStore, Policy};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One admit by whichever side is measured: true if admitted.
trait Admit: Send {
    fn admit(&mut self, resource: &str, token: u64) -> bool;
}

struct Ours(Arc<Guard>);

impl Admit for Ours {
    fn admit(&mut self, resource: &str, token: u64) -> bool {
        self.0.admit(resource, Some(&token.to_string())).admitted()
    }
}

/// A Redis connection speaking RESP, one request at a time (no pipelining: a lock
/// holder's write waits for its admit).
struct Redis {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    sha: String,
    line: String,
}

impl Redis {
    fn connect(port: u16, sha: &str) -> Redis {
        let writer = TcpStream::connect(("127.0.0.1", port)).expect("connect to Redis");
        writer.set_nodelay(true).expect("TCP_NODELAY");
        let reader = BufReader::new(writer.try_clone().expect("clone the socket"));
        Redis { writer, reader, sha: sha.to_owned(), line: String::new() }
    }
}

impl Admit for Redis {
    fn admit(&mut self, resource: &str, token: u64) -> bool {
        let token = token.to_string();
        let args = ["EVALSHA", &self.sha, "1", resource, &token];
        let mut request = format!("*{}\r\n", args.len());
        for a in args {
            request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.writer.write_all(request.as_bytes()).expect("send to Redis");
        self.line.clear();
        self.reader.read_line(&mut self.line).expect("read Redis's answer");
        let answer = self.line.trim_end();
        assert!(answer == ":1" || answer == ":0", "Redis answered {answer:?}");
        answer == ":1"
    }
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are this bench's arguments.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let number = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (threads, seconds) = (number(0, 1).max(1), number(1, 5).max(1));
    let rising = args.get(2).is_some_and(|a| a == "rising");
    let redis = match (args.get(3), args.get(4)) {
        (Some(port), Some(sha)) => Some((port.parse::<u16>().expect("a Redis port"), sha.clone())),
        _ => None,
    };
    let guard = Arc::new(Guard::new(
        Arc::new(Validator::bundled(Policy::default()).expect("load the bundled validator")),
        Arc::new(MemoryStore::new()),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let mut side: Box<dyn Admit> = match &redis {
                Some((port, sha)) => Box::new(Redis::connect(*port, sha)),
                None => Box::new(Ours(guard.clone())),
            };
            let stop = stop.clone();
            // Each thread counts its own admits (a shared counter would make the
            // threads contend on its cache line, which is not the admit's cost).
            std::thread::spawn(move || {
                let resource = format!("bench/{t}");
                let (mut token, mut admits) = (1u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    if rising {
                        token += 1;
                    }
                    assert!(side.admit(&resource, token), "token {token} refused on {resource}");
                    admits += 1;
                }
                admits
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let admits: u64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
    let rate = admits as f64 / start.elapsed().as_secs_f64();
    println!("{threads} {rate:.0}");
}
