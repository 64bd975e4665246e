//! The HTTP contract, one table for both HTTP hosts: every story of
//! `tests/contract/http.json` runs through the gateway (`fencekeeper serve`) and through
//! a real Envoy with the filter (`fencekeeper envoy-config`), each in front of a
//! recording store (`harness/src/recorder.rs`), and each row is checked on each host:
//! the answer, what reached the store, and the counter that moved. A row a host does
//! not keep fails the test, naming the row, the host, what was expected and what came;
//! a difference between the hosts is accepted only where the row documents it
//! (`differs`, with `expect_gateway` and `expect_envoy`). The conformance vectors run
//! through both hosts too. The table's types and the check of a row are
//! `fencekeeper_harness::http_table`'s, shared with tests/pwhost, which runs the same
//! table through the filter's `.wasm` under Envoy's profile and a portable host's.
//!
//! Each host starts once per configuration of the table and serves every story of that
//! configuration; each host kind has its own etcd, so the gateway and Envoy never see
//! each other's marks although their stories write the same paths.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use anyhow::{bail, Context, Result};
use fencekeeper::conformance::{Kind, Vector, Vectors};
use fencekeeper_harness::envoy::{exchange, Envoy, Reply};
use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::http_table::{
    check, clip, expand, failure, table, Class, Config, Event, Expect, HostKind, Marks, Mode, Outcome, Protocol, Row,
    Table, CLASSES, EVENTS,
};
use fencekeeper_harness::recorder::{Answer, Recorded, Recorder};
use fencekeeper_harness::services::{free_port, http, Etcd};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

// ---------------------------------------------------------------------------
// The hosts
// ---------------------------------------------------------------------------

enum Host {
    Gateway(Gateway),
    Envoy(Envoy),
}

/// A host in front of its own recording store.
struct Fenced {
    host: Host,
    store: Recorder,
}

/// `--protocol`, written only when it is not the default (both hosts refuse it beside
/// `--resource-header`).
fn protocol_args(p: Protocol) -> Vec<String> {
    match p {
        Protocol::Http => vec![],
        Protocol::Webdav => vec!["--protocol".into(), "webdav".into()],
        Protocol::S3 => vec!["--protocol".into(), "s3".into()],
    }
}

fn mode_flag(m: Mode) -> &'static str {
    match m {
        Mode::Correctness => "correctness",
        Mode::Efficiency => "efficiency",
    }
}

/// `fencekeeper serve` flags for `config` (besides `--upstream`).
fn gateway_args(config: &Config, etcd_url: &str) -> Vec<String> {
    let mut a: Vec<String> = vec!["--mode".into(), mode_flag(config.mode).into()];
    a.extend(protocol_args(config.protocol));
    if config.marks == Marks::Etcd {
        a.extend(["--etcd".into(), etcd_url.to_owned()]);
    }
    if config.strict {
        a.push("--strict".into());
    }
    if config.conditional_writes {
        a.extend(["--conditional-writes".into(), "--precondition-probe".into(), "off".into()]);
    }
    if let Some(max) = config.max_body {
        a.extend(["--max-body".into(), max.to_string()]);
    }
    if let Some(t) = &config.upstream_timeout {
        a.extend(["--request-timeout".into(), t.clone()]);
    }
    if let Some(t) = &config.start_grace {
        a.extend(["--start-grace".into(), t.clone()]);
    }
    a
}

/// `fencekeeper envoy-config` flags for `config` in front of `upstream` (`HOST:PORT`),
/// or why the configuration has no Envoy form.
fn envoy_args(config: &Config, etcd_addr: &str, upstream: &str) -> Result<Vec<String>> {
    let mut a: Vec<String> = vec!["--upstream".into(), upstream.to_owned()];
    a.extend(["--mode".into(), mode_flag(config.mode).into()]);
    a.extend(protocol_args(config.protocol));
    match (config.marks, config.mode) {
        // Made-up tokens, not etcd revisions: no provenance check.
        (Marks::Etcd, _) => a.extend(["--etcd".into(), etcd_addr.to_owned(), "--provenance".into(), "off".into()]),
        (Marks::Local, Mode::Efficiency) => a.push("--no-etcd".into()),
        (Marks::Local, Mode::Correctness) => bail!("Envoy keeps marks locally (shared data) in efficiency mode only"),
    }
    if config.strict {
        a.push("--strict".into());
    }
    if config.conditional_writes {
        a.extend(["--conditional-writes".into(), "--precondition-probe".into(), "off".into()]);
    }
    match (config.max_body, config.conditional_writes) {
        (Some(max), true) => a.extend(["--conditional-max-body".into(), max.to_string()]),
        (Some(_), false) => bail!("Envoy bounds a body only with conditional writes (it streams the rest)"),
        (None, _) => {}
    }
    if let Some(t) = &config.upstream_timeout {
        a.extend(["--request-timeout".into(), t.clone()]);
    }
    if let Some(t) = &config.start_grace {
        a.extend(["--start-grace".into(), t.clone()]);
    }
    Ok(a)
}

impl Fenced {
    fn start(kind: HostKind, config: &Config, etcd: &Etcd, extra: &[&str]) -> Result<Fenced> {
        let store = Recorder::start()?;
        let upstream = if config.store_unreachable {
            // A port just freed, that no service of this process is given: nothing
            // listens there.
            SocketAddr::from(([127, 0, 0, 1], free_port()?))
        } else {
            store.addr
        };
        let host = match kind {
            HostKind::Gateway => {
                let mut args = gateway_args(config, &etcd.url());
                args.extend(extra.iter().map(|s| (*s).to_owned()));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Host::Gateway(Gateway::start(&format!("http://{upstream}"), &args)?)
            }
            HostKind::Envoy => {
                let mut args = envoy_args(config, &etcd.client.to_string(), &upstream.to_string())?;
                args.extend(extra.iter().map(|s| (*s).to_owned()));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Host::Envoy(Envoy::start(1, &args)?)
            }
            // tests/pwhost runs the table through the filter on a portable host.
            HostKind::Portable => bail!("no real portable host here: tests/pwhost runs the filter as one"),
        };
        Ok(Fenced { host, store })
    }

    fn addr(&self) -> SocketAddr {
        match &self.host {
            Host::Gateway(g) => g.addr,
            Host::Envoy(e) => e.listen,
        }
    }

    fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Reply> {
        exchange(self.addr(), method, path, headers, body)
    }

    /// Every class's counter and every conditional-write counter, as the host reports
    /// them.
    fn counters(&self) -> Result<(BTreeMap<Class, u64>, BTreeMap<Event, u64>)> {
        let (admin, path) = match &self.host {
            Host::Gateway(g) => (g.admin, "/metrics"),
            Host::Envoy(e) => (e.admin, "/stats?filter=^wasmcustom.fencekeeper."),
        };
        let (status, body) = http(admin, "GET", path, &[], b"")?;
        anyhow::ensure!(status == 200, "{path} answered {status}");
        let text = String::from_utf8(body)?;
        let value = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| match &self.host {
                    Host::Gateway(_) => l.strip_prefix(name)?.strip_prefix(' '),
                    Host::Envoy(_) => l.strip_prefix(name)?.strip_prefix(": "),
                })
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map_or(0, |v| v as u64)
        };
        let gateway = matches!(self.host, Host::Gateway(_));
        let classes =
            CLASSES.iter().map(|&c| (c, value(&if gateway { c.gateway_metric() } else { c.envoy_stat() }))).collect();
        let events = EVENTS.iter().map(|&e| (e, value(&if gateway { e.gateway_metric() } else { e.envoy_stat() })));
        Ok((classes, events.collect()))
    }

    fn log_tail(&self) -> String {
        match &self.host {
            Host::Gateway(g) => g.process.log_tail(),
            Host::Envoy(e) => e.process.log_tail(),
        }
    }
}

/// Start `f(item)` for every item at once, and wait for all.
fn in_parallel<T: Sync, R: std::marker::Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = items.iter().map(|item| s.spawn(|| f(item))).collect();
        // A thread's panic is raised again as it was, so its message is the test's.
        handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    })
}

// ---------------------------------------------------------------------------
// Checking a row
// ---------------------------------------------------------------------------

/// Send `row` through `fenced` and return what differs from `expect` (empty: kept).
fn check_row(fenced: &Fenced, row: &Row, expect: &Expect) -> Vec<String> {
    let send = &row.send;
    let (path, body) = (expand(&send.path), expand(&send.body));
    let headers: Vec<(String, String)> = send.headers.iter().map(|(k, v)| (k.clone(), expand(v))).collect();
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    fenced.store.answer(Answer {
        status: row.store.status,
        headers: row.store.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        body: row.store.body.clone().into_bytes(),
        delay: Duration::from_millis(row.store.delay_ms),
        hang_up: row.store.hang_up,
    });
    fenced.store.take();
    let before = fenced.counters();
    let reply = fenced.send(&send.method, &path, &headers, body.as_bytes());
    let seen = fenced.store.take();
    let after = fenced.counters();
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) => return vec![format!("no answer: {e:#}")],
    };
    let (before, after) = match (before, after) {
        (Ok(before), Ok(after)) => (before, after),
        (Err(e), _) | (_, Err(e)) => return vec![format!("counters: {e:#}")],
    };
    let text = reply.text();
    let outcome = Outcome {
        status: reply.status,
        headers: reply.headers,
        body: text,
        seen,
        classes: CLASSES.iter().map(|c| (*c, after.0[c].saturating_sub(before.0[c]))).collect(),
        events: EVENTS.iter().map(|e| (*e, after.1[e].saturating_sub(before.1[e]))).collect(),
    };
    check(row, expect, &outcome)
}

/// Run every story on `kind`'s hosts, one per configuration, and return the failures.
fn run_table(table: &Table, kind: HostKind) -> Vec<String> {
    let etcd = Etcd::start().unwrap();
    let names: Vec<&String> = table.configs.keys().collect();
    let started = in_parallel(&names, |name| {
        Fenced::start(kind, &table.configs[*name], &etcd, &[]).with_context(|| format!("{} for {name}", kind.name()))
    });
    let hosts: BTreeMap<&str, Fenced> =
        names.iter().map(|n| n.as_str()).zip(started.into_iter().map(Result::unwrap)).collect();
    let mut failures = Vec::new();
    let mut failed = BTreeSet::new();
    for story in &table.stories {
        let fenced = &hosts[story.config.as_str()];
        for (i, row) in story.rows.iter().enumerate() {
            let wrong = check_row(fenced, row, row.expected(kind));
            if !wrong.is_empty() {
                failures.push(failure(kind.name(), story, i, row, &wrong));
                failed.insert(story.config.as_str());
            }
        }
    }
    for name in failed {
        let tail: Vec<String> = hosts[name].log_tail().lines().map(clip).collect();
        failures.push(format!("{} {name}: its log ends:\n{}", kind.name(), tail.join("\n")));
    }
    failures
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

#[test]
fn the_contract_table_is_well_formed() {
    let table = table();
    let mut names = BTreeSet::new();
    let mut owner: BTreeMap<String, &str> = BTreeMap::new();
    let mut rows = 0;
    for story in &table.stories {
        assert!(table.configs.contains_key(&story.config), "story {:?}: no config {:?}", story.story, story.config);
        for row in &story.rows {
            rows += 1;
            assert!(names.insert(row.name.as_str()), "two rows are named {:?}", row.name);
            row.check().unwrap_or_else(|e| panic!("row {:?}: {e:#}", row.name));
            // Each story writes under a first path segment of its own: marks carry
            // over within a story, never between stories on one host.
            let path = row.send.path.split('?').next().unwrap_or_default();
            let top = path.trim_start_matches('/').split('/').next().unwrap_or_default().to_owned();
            let first = owner.entry(top.clone()).or_insert(&story.story);
            assert_eq!(*first, story.story.as_str(), "row {:?}: /{top} belongs to another story", row.name);
        }
    }
    for (name, config) in &table.configs {
        if let Err(e) = envoy_args(config, "127.0.0.1:2379", "127.0.0.1:8000") {
            panic!("config {name} has no Envoy form: {e:#}");
        }
    }
    assert!(rows >= 25, "only {rows} rows");
    assert_eq!(expand("/k/{a*3}{b*1}?{x}"), "/k/aaab?{x}");
}

#[test]
fn every_row_of_the_http_contract_holds_in_the_gateway_and_in_envoy() {
    let table = table();
    let failures = in_parallel(&[HostKind::Gateway, HostKind::Envoy], |&kind| run_table(&table, kind)).concat();
    assert!(failures.is_empty(), "the HTTP contract is broken:\n{}", failures.join("\n"));
}

/// The conformance vectors, through both hosts: each vector on a fresh resource (taken
/// from a header), its mark set up by a first request, then the presented token. The
/// two vectors with leading or trailing spaces are skipped: HTTP drops a header
/// value's surrounding whitespace (RFC 9110 5.5) before any host sees it.
#[test]
fn conformance_vectors_hold_through_the_gateway_and_envoy() {
    let vectors = Vectors::bundled().unwrap();
    let failures = in_parallel(&[HostKind::Gateway, HostKind::Envoy], |&kind| run_vectors(&vectors, kind)).concat();
    assert!(failures.is_empty(), "conformance vectors broken:\n{}", failures.join("\n"));
}

fn run_vectors(vectors: &Vectors, kind: HostKind) -> Vec<String> {
    let etcd = Etcd::start().unwrap();
    let config = |strict| Config {
        about: String::new(),
        mode: Mode::Correctness,
        strict,
        protocol: Protocol::Http,
        marks: Marks::Etcd,
        conditional_writes: false,
        max_body: None,
        upstream_timeout: None,
        start_grace: None,
        store_unreachable: false,
    };
    let header = ["--resource-header", "fencing-resource"];
    let pair = in_parallel(&[false, true], |&strict| Fenced::start(kind, &config(strict), &etcd, &header).unwrap());
    let mut kept = BTreeSet::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (i, v) in vectors.iter().enumerate() {
        if v.presented.as_deref().is_some_and(|p| p.trim() != p) {
            continue;
        }
        // A fresh resource per vector, of the same validity: short keys get a
        // per-vector prefix; the empty and the over-long keys stay as they are.
        let resource = if (1..=1000).contains(&v.resource.len()) {
            format!("v{i}/{}", v.resource)
        } else {
            assert!(kept.insert(v.resource.clone()), "{}: key shared with another vector", v.name);
            v.resource.clone()
        };
        if let Err(e) = check_vector(&pair[usize::from(v.strict)], v, &resource) {
            failures.push(format!("{}: vector {:?}: {e:#}", kind.name(), v.name));
        }
        checked += 1;
    }
    if checked + 2 < vectors.len() {
        failures.push(format!("{}: only {checked} of {} vectors ran", kind.name(), vectors.len()));
    }
    failures
}

fn check_vector(fenced: &Fenced, v: &Vector, resource: &str) -> Result<()> {
    let send = |token: Option<&str>| -> Result<(Reply, Vec<Recorded>)> {
        fenced.store.take();
        let mut h = vec![("fencing-resource", resource)];
        h.extend(token.map(|t| ("fencing-token", t)));
        let reply = fenced.send("PUT", "/conformance", &h, v.name.as_bytes())?;
        Ok((reply, fenced.store.take()))
    };
    if let Some(mark) = &v.mark {
        let (r, _) = send(Some(mark))?;
        anyhow::ensure!(r.status == 201, "setting the mark {mark}: {} {}", r.status, r.text());
    }
    let (reply, seen) = send(v.presented.as_deref())?;
    let got = format!("{} {:?}, fencing-highest {:?}", reply.status, reply.text(), reply.header("fencing-highest"));
    let expect = &v.expect;
    match expect.verdict {
        Kind::Admit => {
            anyhow::ensure!(reply.status == 201 && seen.len() == 1, "expected an admit, got {got}");
            // The mark is now exactly expect.mark: an all-zero token of its arity is
            // refused with it (or admitted, when the mark is all zeros).
            let mark = expect.mark.as_deref().context("an admit without a mark")?;
            let zero = vec!["0"; mark.split('.').count()].join(".");
            let (probe, _) = send(Some(&zero))?;
            if !mark.split('.').all(|c| c == "0") {
                anyhow::ensure!(
                    probe.header("fencing-highest") == Some(mark),
                    "the mark after the admit: expected {mark}, got {} {:?}",
                    probe.status,
                    probe.header("fencing-highest")
                );
            }
        }
        Kind::Stale | Kind::Replayed => {
            let word = if expect.verdict == Kind::Stale { "stale" } else { "replayed" };
            anyhow::ensure!(
                reply.status == 409
                    && reply.header("fencing-highest") == expect.mark.as_deref()
                    && reply.text().starts_with(word)
                    && seen.is_empty(),
                "expected {word} at {:?}, got {got}",
                expect.mark
            );
        }
        Kind::Malformed => anyhow::ensure!(
            reply.status == 400 && reply.text().starts_with("malformed request") && seen.is_empty(),
            "expected malformed, got {got}"
        ),
        Kind::Missing => anyhow::ensure!(reply.status == 428 && seen.is_empty(), "expected missing, got {got}"),
    }
    Ok(())
}
