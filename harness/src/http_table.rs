//! Fencekeeper's HTTP contract table (`tests/contract/http.json`), read once for every
//! runner: the real hosts' (`tests/tests/all/http_contract.rs`: the gateway and a real
//! Envoy in front of a recording store) and the in-process proxy-wasm host's
//! (`tests/pwhost`, under Envoy's profile and the strict one). The table's types, its
//! rules, and the check of one row's outcome live here; each runner only sends the
//! row's request through its host and reports what came back.
//!
//! The types' fields are the table's JSON keys, which the table documents in its own
//! `about`; they are not documented twice.
#![allow(missing_docs)]

use crate::recorder::Recorded;
use anyhow::{bail, Result};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The table's text.
pub const TABLE: &str = include_str!("../../tests/contract/http.json");

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    #[allow(dead_code)]
    pub about: Vec<String>,
    pub configs: BTreeMap<String, Config>,
    pub stories: Vec<Story>,
}

/// One host configuration, mapped onto each host's flags by [`gateway_args`] and
/// [`envoy_args`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[allow(dead_code)]
    pub about: String,
    pub mode: Mode,
    #[serde(default)]
    pub strict: bool,
    #[serde(default)]
    pub protocol: Protocol,
    pub marks: Marks,
    #[serde(default)]
    pub conditional_writes: bool,
    /// The largest body (Envoy: only with conditional writes, which hold the body).
    pub max_body: Option<u64>,
    /// How long the host waits for the store's answer.
    pub upstream_timeout: Option<String>,
    /// How long after it starts the host refuses fenced writes.
    pub start_grace: Option<String>,
    /// The host's store is a port nobody listens on: every forwarded request finds
    /// it out of reach (the recording store sees nothing).
    #[serde(default)]
    pub store_unreachable: bool,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Correctness,
    Efficiency,
}

#[derive(Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Http,
    Webdav,
    S3,
}

/// Where the marks live: etcd (both hosts), or local to the host (the gateway's
/// file, Envoy's shared data: efficiency mode only).
#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Marks {
    Etcd,
    Local,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Story {
    pub story: String,
    pub config: String,
    pub rows: Vec<Row>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    pub name: String,
    pub send: Send,
    #[serde(default)]
    pub store: Store,
    pub expect: Option<Expect>,
    pub differs: Option<String>,
    pub expect_gateway: Option<Expect>,
    pub expect_envoy: Option<Expect>,
    /// Why the filter on a portable host answers otherwise than in Envoy.
    pub differs_portable: Option<String>,
    pub expect_portable: Option<Expect>,
}

/// The client's request. `{c*N}` in the path, a header value or the body is `c` N times.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Send {
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: String,
}

/// What the store answers.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    #[serde(default = "created")]
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub delay_ms: u64,
    /// The store closes the connection instead of answering (after the delay).
    #[serde(default)]
    pub hang_up: bool,
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
pub struct Expect {
    pub status: u16,
    /// Response headers with their exact values.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Response headers that must be there, with any value.
    #[serde(default)]
    pub present: Vec<String>,
    /// Response headers that must not be there.
    #[serde(default)]
    pub absent: Vec<String>,
    #[serde(default)]
    pub body: BodyCheck,
    pub forwarded: Forwarded,
    /// The class whose counter moves by one; `None`: none moves.
    pub counts: Option<Class>,
    /// The conditional-write counter that moves by one; `None`: none moves.
    pub event: Option<Event>,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BodyCheck {
    pub equals: Option<String>,
    pub contains: Option<String>,
    pub starts_with: Option<String>,
    /// The body is one line of text (a refusal's reason).
    #[serde(default)]
    pub one_line: bool,
    /// The body is S3's XML error document with this `Code`.
    s3_code: Option<String>,
}

/// What reaches the store: nothing, or the request.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Forwarded {
    Nothing(Nothing),
    Request(ForwardedRequest),
}

#[derive(Debug, PartialEq, Deserialize)]
pub enum Nothing {
    #[serde(rename = "nothing")]
    Nothing,
}

/// The request the store receives: the method, path and body sent (or `path`), with
/// `headers` (each the only value of its name) and without `absent`.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardedRequest {
    pub path: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub absent: Vec<String>,
}

/// The outcomes both hosts count, each by its own name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Admitted,
    Stale,
    Replayed,
    Malformed,
    Missing,
    Undecided,
    Unverified,
    FailedOpen,
}

pub const CLASSES: [Class; 8] = [
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
    pub fn name(self) -> &'static str {
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

    pub fn gateway_metric(self) -> String {
        match self {
            Class::FailedOpen => "fencekeeper_gateway_failed_open_total".to_owned(),
            c => format!("fencekeeper_gateway_requests_total{{class=\"{}\"}}", c.name()),
        }
    }

    pub fn envoy_stat(self) -> String {
        format!("wasmcustom.fencekeeper.{}", self.name())
    }
}

/// The conditional-write counters both hosts count, one per outcome
/// (`fencekeeper_engine::conditional::Event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    NotConditional,
    TooLarge,
    VersionRefused,
    PreconditionFailed,
}

pub const EVENTS: [Event; 4] =
    [Event::NotConditional, Event::TooLarge, Event::VersionRefused, Event::PreconditionFailed];

impl Event {
    pub fn name(self) -> &'static str {
        match self {
            Event::NotConditional => "not_conditional",
            Event::TooLarge => "too_large",
            Event::VersionRefused => "version_refused",
            Event::PreconditionFailed => "precondition_failed",
        }
    }

    pub fn gateway_metric(self) -> String {
        format!("fencekeeper_gateway_{}_total", self.name())
    }

    pub fn envoy_stat(self) -> String {
        match self {
            Event::TooLarge => "wasmcustom.fencekeeper.too_large".to_owned(),
            e => format!("wasmcustom.fencekeeper.conditional.{}", e.name()),
        }
    }
}

/// The table, parsed (a test's table: a mistake in it stops the test that reads it).
#[allow(clippy::panic)]
pub fn table() -> Table {
    serde_json::from_str(TABLE).unwrap_or_else(|e| panic!("tests/contract/http.json: {e}"))
}

impl Row {
    /// The expectation for `kind`: the row's one, or the host's own where the row
    /// documents a difference.
    pub fn expected(&self, kind: HostKind) -> &Expect {
        if let (HostKind::Portable, Some(e)) = (kind, &self.expect_portable) {
            return e;
        }
        match (&self.expect, kind) {
            (Some(e), _) => e,
            // `check` holds every row to giving both where it gives no `expect`.
            (None, HostKind::Gateway) => self.expect_gateway.as_ref().expect("a row that differs gives expect_gateway"),
            (None, HostKind::Envoy | HostKind::Portable) => {
                self.expect_envoy.as_ref().expect("a row that differs gives expect_envoy")
            }
        }
    }

    /// What the table's rules ask of a row, or why it breaks them.
    pub fn check(&self) -> Result<()> {
        match (&self.expect, &self.differs, &self.expect_gateway, &self.expect_envoy) {
            (Some(_), None, None, None) => {}
            (None, Some(why), Some(g), Some(e)) => {
                anyhow::ensure!(!why.trim().is_empty(), "an empty `differs`");
                anyhow::ensure!(g != e, "`differs`, yet both hosts are expected to answer alike: write one `expect`");
            }
            _ => bail!("give `expect`, or `differs` with `expect_gateway` and `expect_envoy`"),
        }
        match (&self.differs_portable, &self.expect_portable) {
            (None, None) => {}
            (Some(why), Some(p)) => {
                anyhow::ensure!(!why.trim().is_empty(), "an empty `differs_portable`");
                anyhow::ensure!(
                    p != self.expected(HostKind::Envoy),
                    "`differs_portable`, yet a portable host is expected to answer as Envoy: leave both out"
                );
            }
            _ => bail!("give `differs_portable` and `expect_portable` together"),
        }
        anyhow::ensure!(
            self.send.method != "HEAD" || self.store.body.is_empty(),
            "a HEAD's store answer has no body (the client reads none)"
        );
        Ok(())
    }
}

/// `{c*N}` in `text` replaced by `c` N times.
pub fn expand(text: &str) -> String {
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKind {
    Gateway,
    Envoy,
    /// The filter on a proxy-wasm host other than Envoy (`"host": "portable"`).
    Portable,
}

impl HostKind {
    pub fn name(self) -> &'static str {
        match self {
            HostKind::Gateway => "gateway",
            HostKind::Envoy => "envoy",
            HostKind::Portable => "portable",
        }
    }
}

/// One failed row, as a runner reports it: the host, the story, the row, and each
/// thing that differed on a line of its own.
pub fn failure(host: &str, story: &Story, i: usize, row: &Row, wrong: &[String]) -> String {
    let mut line = format!("{host}: story {:?} ({}) row {} {:?}:", story.story, story.config, i + 1, row.name);
    for w in wrong {
        line.push_str("\n    ");
        line.push_str(w);
    }
    line
}

/// What a host did with a row's request: its answer, what the store saw, and how
/// much each counter moved.
pub struct Outcome {
    /// The answer's status.
    pub status: u16,
    /// The answer's headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The answer's body, as text.
    pub body: String,
    /// The requests the store saw.
    pub seen: Vec<Recorded>,
    /// How much each class's counter moved.
    pub classes: BTreeMap<Class, u64>,
    /// How much each conditional-write counter moved.
    pub events: BTreeMap<Event, u64>,
}

impl Outcome {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// What differs between `outcome` of `row`'s request and `expect` (empty: kept).
pub fn check(row: &Row, expect: &Expect, outcome: &Outcome) -> Vec<String> {
    check_parts(row, expect, outcome, true)
}

/// [`check`], or with `answer` false all but the answer: what reached the store and
/// the counters, for a host whose answer in that row is another's (a proxy's own
/// answer to a store that failed, which its configuration writes, not the filter).
pub fn check_parts(row: &Row, expect: &Expect, outcome: &Outcome, answer: bool) -> Vec<String> {
    let send = &row.send;
    let (path, body) = (expand(&send.path), expand(&send.body));
    let mut wrong = Vec::new();
    if answer {
        wrong.extend(check_answer(expect, outcome));
    }
    wrong.extend(check_forwarded(&expect.forwarded, &send.method, &path, body.as_bytes(), &outcome.seen));
    let classes = CLASSES.map(|c| (c.name(), outcome.classes.get(&c).copied().unwrap_or(0), expect.counts == Some(c)));
    let events = EVENTS.map(|e| (e.name(), outcome.events.get(&e).copied().unwrap_or(0), expect.event == Some(e)));
    for (name, moved, expected) in classes.into_iter().chain(events) {
        if moved != u64::from(expected) {
            wrong.push(format!("counter {name}: expected +{}, got +{moved}", u64::from(expected)));
        }
    }
    if !wrong.is_empty() {
        let headers: Vec<String> = outcome.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        wrong.push(format!("the answer was {} [{}] {:?}", outcome.status, headers.join("; "), clip(&outcome.body)));
    }
    wrong
}

fn check_answer(expect: &Expect, outcome: &Outcome) -> Vec<String> {
    let mut wrong = Vec::new();
    if outcome.status != expect.status {
        wrong.push(format!("status: expected {}, got {}", expect.status, outcome.status));
    }
    for (name, value) in &expect.headers {
        if outcome.header(name) != Some(value) {
            wrong.push(format!("header {name}: expected {value:?}, got {:?}", outcome.header(name)));
        }
    }
    for name in &expect.present {
        if outcome.header(name).is_none() {
            wrong.push(format!("header {name}: expected present, got none"));
        }
    }
    for name in &expect.absent {
        if let Some(v) = outcome.header(name) {
            wrong.push(format!("header {name}: expected none, got {v:?}"));
        }
    }
    wrong.extend(check_body(&expect.body, &outcome.body));
    wrong
}

pub fn check_body(check: &BodyCheck, text: &str) -> Vec<String> {
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

pub fn check_forwarded(expect: &Forwarded, method: &str, path: &str, body: &[u8], seen: &[Recorded]) -> Vec<String> {
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

pub fn describe(r: &Recorded) -> String {
    let headers: Vec<String> = r.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{} {} [{}] {:?}", r.method, clip(&r.path), headers.join("; "), clip(&String::from_utf8_lossy(&r.body)))
}

pub fn clip(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
}
