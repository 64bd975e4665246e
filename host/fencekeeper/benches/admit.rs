//! The cost of an admit: the native core against the wasm component (instance
//! reused; with the verdict cache, and without it, which is the honest cost of the
//! sandbox), the bare cost of crossing the component boundary, the guard's loop with
//! a memory store, how admits scale from one thread to two, and the durable file
//! store for advancing (fsync) and non-advancing (read only) admits.
//!
//! `wasm_floor` rows call a hand-written guest that answers at once without reading
//! its arguments (tests/support/wat_guest.rs): what the host and wasmtime cost
//! alone, the floor under any guest's own work.
//!
//! `cargo bench --bench admit -p fencekeeper`; results in BENCHMARKS.md. With
//! `FK_BENCH_SIGNAL_HANDLERS=0` the process's engine is set up without wasmtime's
//! signal handlers, as the Redis module runs it (explicit bounds checks in the
//! compiled guest): the same rows, to compare with a run without it.
//!
//! The in-memory groups measure the bench thread's CPU time, not wall time: on a
//! shared machine wall time also counts the time spent waiting for a core, which
//! says more about the neighbours than about the admit. On an idle machine the two
//! agree. The file-store group measures wall time, since waiting for fsync is the
//! cost being measured.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fencekeeper::store::FileStore;
use fencekeeper::validator::{configure_engine, Conformance, EngineSettings, GuestSource, Limits, Validator};
use fencekeeper::{Decider, Guard, MarkStore, MemoryStore, NativeDecider, Policy, Token};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

#[path = "../tests/support/wat_guest.rs"]
mod wat_guest;

const RESOURCE: &str = "orders/2026.csv";

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`), in nanoseconds.
struct ThreadCpuTime;

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &Nanoseconds
    }
}

/// Formats nanoseconds as ns / µs / ms, like criterion's wall-time formatter.
struct Nanoseconds;

impl ValueFormatter for Nanoseconds {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = match typical {
            t if t < 1e3 => (1.0, "ns"),
            t if t < 1e6 => (1e-3, "µs"),
            _ => (1e-6, "ms"),
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }
    fn scale_throughputs(&self, _typical: f64, _throughput: &Throughput, _values: &mut [f64]) -> &'static str {
        // No benchmark here declares a throughput.
        "ns"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn token(n: u64) -> Token {
    Token::from_parts(&[n]).expect("one component is a valid token")
}

fn wasm() -> Validator {
    if std::env::var("FK_BENCH_SIGNAL_HANDLERS").as_deref() == Ok("0") {
        configure_engine(EngineSettings { signals_based_traps: false })
            .expect("set up the engine before any validator");
    }
    Validator::bundled(Policy::default()).expect("load the bundled validator")
}

fn wasm_uncached() -> Validator {
    wasm().without_verdict_cache()
}

/// A guest that admits token 34 (not advanced) at once, whatever it is asked,
/// without the verdict cache: every call crosses into it.
fn wasm_floor() -> Validator {
    let bytes = wat_guest::answering_admit(34);
    // It answers nothing else right: the conformance vectors would refuse it.
    Validator::load_with(GuestSource::Bytes(&bytes), Policy::default(), Limits::default(), Conformance::Skip)
        .expect("load the floor guest")
        .without_verdict_cache()
}

/// One decision, no store: the core natively and through the component.
fn decide(c: &mut Criterion<ThreadCpuTime>) {
    let mut g = c.benchmark_group("decide");
    let mark = token(34);
    let native = NativeDecider(Policy::default());
    let (wasm, uncached, floor) = (wasm(), wasm_uncached(), wasm_floor());
    g.bench_function("native", |b| b.iter(|| native.decide(black_box(Some("35")), black_box(Some(&mark)))));
    g.bench_function("wasm", |b| b.iter(|| wasm.decide(black_box(Some("35")), black_box(Some(&mark)))));
    g.bench_function("wasm_uncached", |b| b.iter(|| uncached.decide(black_box(Some("35")), black_box(Some(&mark)))));
    g.bench_function("wasm_floor", |b| b.iter(|| floor.decide(black_box(Some("35")), black_box(Some(&mark)))));
    g.finish();
}

/// The cheapest calls through the component boundary, for the fixed cost of a call.
fn component_call(c: &mut Criterion<ThreadCpuTime>) {
    let mut g = c.benchmark_group("component_call");
    let wasm = wasm();
    g.bench_function("parse", |b| b.iter(|| wasm.parse(black_box("34"))));
    g.bench_function("describe", |b| b.iter(|| wasm.describe()));
    g.finish();
}

/// Admits that advance: a fresh, higher token each iteration.
fn advancing(guard: &Guard) -> impl FnMut() + '_ {
    let mut next = 1u64;
    move || {
        next += 1;
        let d = guard.admit(RESOURCE, Some(&next.to_string()));
        assert!(d.admitted(), "{}", d.reason(RESOURCE));
    }
}

/// Admits that reuse the current mark (the holder writing again).
fn repeating(guard: &Guard) -> impl FnMut() + '_ {
    assert!(guard.admit(RESOURCE, Some("34")).admitted());
    move || {
        let d = guard.admit(RESOURCE, Some(black_box("34")));
        assert!(d.admitted());
    }
}

/// The guard's read -> decide -> compare-and-swap loop with the memory store.
fn guard_memory(c: &mut Criterion<ThreadCpuTime>) {
    let mut g = c.benchmark_group("guard_memory");
    let deciders: [(&str, Arc<dyn Decider>); 3] = [
        ("native", Arc::new(NativeDecider(Policy::default()))),
        ("wasm", Arc::new(wasm())),
        ("wasm_uncached", Arc::new(wasm_uncached())),
    ];
    for (name, decider) in deciders {
        let guard = Guard::new(decider.clone(), Arc::new(MemoryStore::new()));
        let mut admit = advancing(&guard);
        g.bench_function(format!("{name}/advancing"), |b| b.iter(&mut admit));
        let guard = Guard::new(decider, Arc::new(MemoryStore::new()));
        let mut admit = repeating(&guard);
        g.bench_function(format!("{name}/repeating"), |b| b.iter(&mut admit));
    }
    // The floor guest admits 34 as the mark, which is what a holder writing again
    // with 34 gets: the guard checks it and finds it true.
    let guard = Guard::new(Arc::new(wasm_floor()), Arc::new(MemoryStore::new()));
    guard.store().compare_and_swap(RESOURCE, None, &token(34)).expect("seed the mark");
    let mut admit = repeating(&guard);
    g.bench_function("wasm_floor/repeating", |b| b.iter(&mut admit));
    g.finish();
}

/// One guard, admits from one thread and from two at once (each on its own
/// resources, advancing, memory store): wall time per admit, so the ratio of the two
/// is the speed-up from a second thread. Nothing on the admit path is shared but the
/// marks, so on two idle cores it should be close to 2.
fn threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads");
    for (name, decider) in [
        ("native", Arc::new(NativeDecider(Policy::default())) as Arc<dyn Decider>),
        ("wasm", Arc::new(wasm_uncached())),
    ] {
        let guard = Arc::new(Guard::new(decider, Arc::new(MemoryStore::new())));
        for n in [1u64, 2] {
            g.bench_function(format!("{name}/{n}"), |b| {
                b.iter_custom(|iters| {
                    let start = std::time::Instant::now();
                    std::thread::scope(|s| {
                        for t in 0..n {
                            let guard = guard.clone();
                            s.spawn(move || {
                                // Each thread its own resource and token counter: nothing
                                // shared but the guard.
                                let resource = format!("{RESOURCE}/{n}/{t}");
                                let mark = guard.mark(&resource).ok().flatten().map_or(0, |m| m.parts()[0]);
                                for token in mark + 1..=mark + iters / n {
                                    let d = guard.admit(&resource, Some(&token.to_string()));
                                    assert!(d.admitted(), "{}", d.reason(&resource));
                                }
                            });
                        }
                    });
                    start.elapsed()
                })
            });
        }
    }
    g.finish();
}

/// The durable store: an advancing admit commits (fsync) before it returns; an admit
/// that reuses the mark only reads.
fn guard_file(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut g = c.benchmark_group("guard_file");
    let open = |name: &str| -> Arc<dyn MarkStore + Send + Sync> {
        Arc::new(FileStore::open(dir.path().join(name)).expect("open the file store"))
    };
    let guard = Guard::new(Arc::new(wasm()), open("advancing.redb"));
    let mut admit = advancing(&guard);
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    g.bench_function("wasm/advancing", |b| b.iter(&mut admit));
    let guard = Guard::new(Arc::new(wasm()), open("repeating.redb"));
    let mut admit = repeating(&guard);
    g.sample_size(20).measurement_time(Duration::from_secs(2));
    g.bench_function("wasm/repeating", |b| b.iter(&mut admit));
    g.finish();
}

/// Short runs: the whole bench takes about a minute on 2 cores.
fn config<M: Measurement>(c: Criterion<M>) -> Criterion<M> {
    c.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = in_memory;
    config = config(Criterion::default().with_measurement(ThreadCpuTime));
    targets = decide, component_call, guard_memory
}
criterion_group! {
    name = durable;
    config = config(Criterion::default());
    targets = threads, guard_file
}
criterion_main!(in_memory, durable);
