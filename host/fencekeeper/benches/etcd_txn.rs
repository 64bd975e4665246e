//! etcd's own Txn over its gRPC API: the peer of the gateway's etcd rows in
//! `scripts/bench-etcd.sh`, over the same client the gateway's store uses (one HTTP/2
//! connection, each caller one call at a time), so that the gateway is compared with
//! the Txn it sends and not only with etcd's JSON gateway.
//!
//! `cargo bench --bench etcd_txn -p fencekeeper --features etcd -- ENDPOINT TOKENS CONNS SECONDS`
//! with TOKENS `fixed` (the confirm of `/fixed`'s mark 1, as the gateway sends it),
//! `spread` (the same on `/spread/0` .. `/spread/63` in turn) or `rising` (an
//! unconditional put of a new value each time, as etcd's JSON row); `fixed-range` and
//! `spread-range` make the same confirms as a plain linearizable `Range` of the key,
//! its record compared here (`scripts/bench-confirm-range.sh`). The marks must exist
//! (the scripts write them through the gateway). Prints `REQUESTS_PER_SECOND ERRORS`.

use fencekeeper::etcd::{EtcdClient, EtcdOptions};
use fencekeeper::store::ETCD_DEFAULT_PREFIX;
use fencekeeper_core::Token;
use fencekeeper_etcd_wire::{self as wire, grpc, Op};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    // `cargo bench` passes `--bench`; the operands are the rest.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let [endpoint, tokens, conns, seconds] = args.as_slice() else {
        eprintln!("usage: etcd_txn ENDPOINT fixed|spread|rising CONNS SECONDS");
        std::process::exit(2);
    };
    let (conns, seconds): (usize, u64) = match (conns.parse(), seconds.parse()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => {
            eprintln!("CONNS and SECONDS are numbers");
            std::process::exit(2);
        }
    };
    let client = match EtcdClient::new(endpoint, &EtcdOptions::default()) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let one = Token::from_parts(&[1]).expect("1 is a token");
    let confirm = |resource: &str| {
        let key = wire::mark_key(ETCD_DEFAULT_PREFIX, resource);
        grpc::confirm_txn(&[(key.as_str(), resource, &one)])
    };
    // A plain Range of the key, and the record the answer must hold.
    let read = |resource: &str| {
        let key = wire::mark_key(ETCD_DEFAULT_PREFIX, resource);
        let record = fencekeeper_core::record::encode(resource.as_bytes(), &one);
        (grpc::range_request(&wire::Range::of(key.as_bytes())), record.as_bytes().to_vec())
    };
    let ranged = tokens.ends_with("-range");
    let (messages, records): (Vec<Vec<u8>>, Vec<Vec<u8>>) = match tokens.as_str() {
        "fixed" => (vec![confirm("/fixed")], Vec::new()),
        "spread" => ((0..64).map(|i| confirm(&format!("/spread/{i}"))).collect(), Vec::new()),
        "fixed-range" => [read("/fixed")].into_iter().unzip(),
        "spread-range" => (0..64).map(|i| read(&format!("/spread/{i}"))).unzip(),
        "rising" => (Vec::new(), Vec::new()),
        other => {
            eprintln!("TOKENS is fixed, spread, fixed-range, spread-range or rising, not {other:?}");
            std::process::exit(2);
        }
    };
    let (done, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    std::thread::scope(|s| {
        for worker in 0..conns {
            let (client, messages, records) = (client.clone(), &messages, &records);
            let (done, errors) = (done.clone(), errors.clone());
            s.spawn(move || {
                let mut n = worker as u64 * 1_000_000_000;
                while Instant::now() < until {
                    n += 1;
                    if ranged {
                        let i = n as usize % messages.len();
                        let held = client
                            .range(&messages[i])
                            .is_ok_and(|page| page.kvs.first().map(|kv| &kv.value) == Some(&records[i]));
                        let counter = if held { &done } else { &errors };
                        counter.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let answer = if messages.is_empty() {
                        let value = format!("{n:016}");
                        let put = Op::Put { key: b"/bench/rising", value: value.as_bytes(), lease: None };
                        client.txn(&grpc::txn(&[], &[put], &[]))
                    } else {
                        client.txn(&messages[n as usize % messages.len()])
                    };
                    match answer {
                        Ok(t) if t.succeeded => done.fetch_add(1, Ordering::Relaxed),
                        _ => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
    });
    let rate = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    println!("{rate:.0} {}", errors.load(Ordering::Relaxed));
}
