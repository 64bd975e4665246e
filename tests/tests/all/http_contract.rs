//! The HTTP contract, one table for both HTTP hosts: every story of
//! `tests/contract/http.json` runs through the gateway (`fencekeeper serve`) and through
//! a real Envoy with the filter (`fencekeeper envoy-config`), each in front of a
//! recording store (`harness/src/recorder.rs`), and each row is checked on each host:
//! the answer, what reached the store, and the counter that moved. A row a host does
//! not keep fails the test, naming the row, the host, what was expected and what came;
//! a difference between the hosts is accepted only where the row documents it
//! (`differs`, with `expect_gateway` and `expect_envoy`). The conformance vectors run
//! through both hosts too.
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
use fencekeeper_harness::recorder::{Answer, Recorded, Recorder};
use fencekeeper_harness::services::{free_port, http, Etcd};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

const TABLE: &str = include_str!("../../contract/http.json");

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    #[allow(dead_code)]
    about: Vec<String>,
    configs: BTreeMap<String, Config>,
    stories: Vec<Story>,
}

/// One host configuration, mapped onto each host's flags by [`gateway_args`] and
/// [`envoy_args`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[allow(dead_code)]
    about: String,
    mode: Mode,
    #[serde(default)]
    strict: bool,
    #[serde(default)]
    protocol: Protocol,
    marks: Marks,
    #[serde(default)]
    conditional_writes: bool,
    /// The largest body (Envoy: only with conditional writes, which hold the body).
    max_body: Option<u64>,
    /// How long the host waits for the store's answer.
    upstream_timeout: Option<String>,
    /// How long after it starts the host refuses fenced writes.
    start_grace: Option<String>,
    /// The host's store is a port nobody listens on: every forwarded request finds
    /// it out of reach (the recording store sees nothing).
    #[serde(default)]
    store_unreachable: bool,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Correctness,
    Efficiency,
}

#[derive(Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Protocol {
    #[default]
    Http,
    Webdav,
    S3,
}

/// Where the marks live: etcd (both hosts), or local to the host (the gateway's
/// file, Envoy's shared data: efficiency mode only).
#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Marks {
    Etcd,
    Local,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Story {
    story: String,
    config: String,
    rows: Vec<Row>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    name: String,
    send: Send,
    #[serde(default)]
    store: Store,
    expect: Option<Expect>,
    differs: Option<String>,
    expect_gateway: Option<Expect>,
    expect_envoy: Option<Expect>,
}

/// The client's request. `{c*N}` in the path, a header value or the body is `c` N times.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Send {
    method: String,
    path: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: String,
}

/// What the store answers.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Store {
    #[serde(default = "created")]
    status: u16,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: String,
    #[serde(default)]
    delay_ms: u64,
    /// The store closes the connection instead of answering (after the delay).
    #[serde(default)]
    hang_up: bool,
}

fn created() -> u16 {
    201
}

impl Default for Store {
    fn default() -> Store {
        Store { status: created(), headers: BTreeMap::new(), body: String::new(), delay_ms: 0, hang_up: false }
    }
}

/// What a host must do with a row's request.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    status: u16,
    /// Response headers with their exact values.
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Response headers that must be there, with any value.
    #[serde(default)]
    present: Vec<String>,
    /// Response headers that must not be there.
    #[serde(default)]
    absent: Vec<String>,
    #[serde(default)]
    body: BodyCheck,
    forwarded: Forwarded,
    /// The class whose counter moves by one; `None`: none moves.
    counts: Option<Class>,
    /// The conditional-write counter that moves by one; `None`: none moves.
    event: Option<Event>,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct BodyCheck {
    equals: Option<String>,
    contains: Option<String>,
    starts_with: Option<String>,
    /// The body is one line of text (a refusal's reason).
    #[serde(default)]
    one_line: bool,
    /// The body is S3's XML error document with this `Code`.
    s3_code: Option<String>,
}

/// What reaches the store: nothing, or the request.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(untagged)]
enum Forwarded {
    Nothing(Nothing),
    Request(ForwardedRequest),
}

#[derive(Debug, PartialEq, Deserialize)]
enum Nothing {
    #[serde(rename = "nothing")]
    Nothing,
}

/// The request the store receives: the method, path and body sent (or `path`), with
/// `headers` (each the only value of its name) and without `absent`.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForwardedRequest {
    path: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    absent: Vec<String>,
}

/// The outcomes both hosts count, each by its own name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Class {
    Admitted,
    Stale,
    Replayed,
    Malformed,
    Missing,
    Undecided,
    Unverified,
    FailedOpen,
}

const CLASSES: [Class; 8] = [
    Class::Admitted,
    Class::Stale,
    Class::Replayed,
    Class::Malformed,
    Class::Missing,
    Class::Undecided,
    Class::Unverified,
    Class::FailedOpen,
];

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Admitted => "admitted",
            Class::Stale => "stale",
            Class::Replayed => "replayed",
            Class::Malformed => "malformed",
            Class::Missing => "missing",
            Class::Undecided => "undecided",
            Class::Unverified => "unverified",
            Class::FailedOpen => "failed_open",
        }
    }

    fn gateway_metric(self) -> String {
        match self {
            Class::FailedOpen => "fencekeeper_gateway_failed_open_total".to_owned(),
            c => format!("fencekeeper_gateway_requests_total{{class=\"{}\"}}", c.name()),
        }
    }

    fn envoy_stat(self) -> String {
        format!("wasmcustom.fencekeeper.{}", self.name())
    }
}

/// The conditional-write counters both hosts count, one per outcome
/// (`fencekeeper_engine::conditional::Event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Event {
    NotConditional,
    TooLarge,
    VersionRefused,
    PreconditionFailed,
}

const EVENTS: [Event; 4] = [Event::NotConditional, Event::TooLarge, Event::VersionRefused, Event::PreconditionFailed];

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::NotConditional => "not_conditional",
            Event::TooLarge => "too_large",
            Event::VersionRefused => "version_refused",
            Event::PreconditionFailed => "precondition_failed",
        }
    }

    fn gateway_metric(self) -> String {
        format!("fencekeeper_gateway_{}_total", self.name())
    }

    fn envoy_stat(self) -> String {
        match self {
            Event::TooLarge => "wasmcustom.fencekeeper.too_large".to_owned(),
            e => format!("wasmcustom.fencekeeper.conditional.{}", e.name()),
        }
    }
}

fn table() -> Table {
    serde_json::from_str(TABLE).unwrap_or_else(|e| panic!("tests/contract/http.json: {e}"))
}

impl Row {
    /// The expectation for `kind`: the row's one, or the host's own where the row
    /// documents a difference.
    fn expected(&self, kind: HostKind) -> &Expect {
        match (&self.expect, kind) {
            (Some(e), _) => e,
            (None, HostKind::Gateway) => self.expect_gateway.as_ref().unwrap(),
            (None, HostKind::Envoy) => self.expect_envoy.as_ref().unwrap(),
        }
    }

    /// What the table's rules ask of a row, or why it breaks them.
    fn check(&self) -> Result<()> {
        match (&self.expect, &self.differs, &self.expect_gateway, &self.expect_envoy) {
            (Some(_), None, None, None) => {}
            (None, Some(why), Some(g), Some(e)) => {
                anyhow::ensure!(!why.trim().is_empty(), "an empty `differs`");
                anyhow::ensure!(g != e, "`differs`, yet both hosts are expected to answer alike: write one `expect`");
            }
            _ => bail!("give `expect`, or `differs` with `expect_gateway` and `expect_envoy`"),
        }
        anyhow::ensure!(
            self.send.method != "HEAD" || self.store.body.is_empty(),
            "a HEAD's store answer has no body (the client reads none)"
        );
        Ok(())
    }
}

/// `{c*N}` in `text` replaced by `c` N times.
fn expand(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let repeat = tail.find('}').and_then(|end| {
            let (c, n) = tail[1..end].split_once('*')?;
            let mut chars = c.chars();
            let (c, None) = (chars.next()?, chars.next()) else { return None };
            Some((c.to_string().repeat(n.parse().ok()?), end + 1))
        });
        match repeat {
            Some((text, used)) => {
                out.push_str(&text);
                rest = &tail[used..];
            }
            None => {
                out.push('{');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------
// The hosts
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostKind {
    Gateway,
    Envoy,
}

impl HostKind {
    fn name(self) -> &'static str {
        match self {
            HostKind::Gateway => "gateway",
            HostKind::Envoy => "envoy",
        }
    }
}

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
        a.extend(["--route-timeout".into(), t.clone()]);
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

    let mut wrong = Vec::new();
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) => return vec![format!("no answer: {e:#}")],
    };
    if reply.status != expect.status {
        wrong.push(format!("status: expected {}, got {}", expect.status, reply.status));
    }
    for (name, value) in &expect.headers {
        if reply.header(name) != Some(value) {
            wrong.push(format!("header {name}: expected {value:?}, got {:?}", reply.header(name)));
        }
    }
    for name in &expect.present {
        if reply.header(name).is_none() {
            wrong.push(format!("header {name}: expected present, got none"));
        }
    }
    for name in &expect.absent {
        if let Some(v) = reply.header(name) {
            wrong.push(format!("header {name}: expected none, got {v:?}"));
        }
    }
    wrong.extend(check_body(&expect.body, &reply.text()));
    wrong.extend(check_forwarded(&expect.forwarded, &send.method, &path, body.as_bytes(), &seen));
    match (before, after) {
        (Ok(before), Ok(after)) => {
            let classes =
                CLASSES.map(|c| (c.name(), after.0[&c].saturating_sub(before.0[&c]), expect.counts == Some(c)));
            let events = EVENTS.map(|e| (e.name(), after.1[&e].saturating_sub(before.1[&e]), expect.event == Some(e)));
            for (name, moved, expected) in classes.into_iter().chain(events) {
                if moved != u64::from(expected) {
                    wrong.push(format!("counter {name}: expected +{}, got +{moved}", u64::from(expected)));
                }
            }
        }
        (Err(e), _) | (_, Err(e)) => wrong.push(format!("counters: {e:#}")),
    }
    if !wrong.is_empty() {
        let headers: Vec<String> = reply.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        wrong.push(format!("the answer was {} [{}] {:?}", reply.status, headers.join("; "), clip(&reply.text())));
    }
    wrong
}

fn check_body(check: &BodyCheck, text: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    if let Some(want) = &check.equals {
        if text != want {
            wrong.push(format!("body: expected {want:?}, got {:?}", clip(text)));
        }
    }
    if let Some(want) = &check.contains {
        if !text.contains(want.as_str()) {
            wrong.push(format!("body: expected it to contain {want:?}, got {:?}", clip(text)));
        }
    }
    if let Some(want) = &check.starts_with {
        if !text.starts_with(want.as_str()) {
            wrong.push(format!("body: expected it to start with {want:?}, got {:?}", clip(text)));
        }
    }
    if check.one_line && (text.trim_end().lines().count() != 1 || text.trim().is_empty()) {
        wrong.push(format!("body: expected one line, got {:?}", clip(text)));
    }
    if let Some(code) = &check.s3_code {
        let whole = text.starts_with("<?xml") && text.contains("<Error>") && text.trim_end().ends_with("</Error>");
        if !whole || !text.contains(&format!("<Code>{code}</Code>")) || !text.contains("<Message>") {
            wrong.push(format!("body: expected S3's error document with <Code>{code}</Code>, got {:?}", clip(text)));
        }
    }
    wrong
}

fn check_forwarded(expect: &Forwarded, method: &str, path: &str, body: &[u8], seen: &[Recorded]) -> Vec<String> {
    let summary = || seen.iter().map(describe).collect::<Vec<_>>().join(" | ");
    let want = match expect {
        Forwarded::Nothing(_) if seen.is_empty() => return Vec::new(),
        Forwarded::Nothing(_) => return vec![format!("store: expected nothing, got {}", summary())],
        Forwarded::Request(want) => want,
    };
    let [got] = seen else {
        return vec![format!("store: expected one request, got {}: {}", seen.len(), summary())];
    };
    let mut wrong = Vec::new();
    let path = want.path.as_deref().unwrap_or(path);
    if (got.method.as_str(), got.path.as_str()) != (method, path) {
        wrong.push(format!("store: expected {method} {path}, got {} {}", got.method, got.path));
    }
    if got.body != body {
        wrong.push(format!("store: expected the body sent, got {:?}", clip(&String::from_utf8_lossy(&got.body))));
    }
    for (name, value) in &want.headers {
        if got.values(name) != [value.as_str()] {
            wrong.push(format!("store: header {name}: expected {value:?} alone, got {:?}", got.values(name)));
        }
    }
    for name in &want.absent {
        if !got.values(name).is_empty() {
            wrong.push(format!("store: header {name}: expected none, got {:?}", got.values(name)));
        }
    }
    if !wrong.is_empty() {
        wrong.push(format!("the store saw {}", summary()));
    }
    wrong
}

fn describe(r: &Recorded) -> String {
    let headers: Vec<String> = r.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{} {} [{}] {:?}", r.method, clip(&r.path), headers.join("; "), clip(&String::from_utf8_lossy(&r.body)))
}

fn clip(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
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
                let mut line = format!(
                    "{}: story {:?} ({}) row {} {:?}:",
                    kind.name(),
                    story.story,
                    story.config,
                    i + 1,
                    row.name
                );
                for w in wrong {
                    let _ = write!(line, "\n    {w}");
                }
                failures.push(line);
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
