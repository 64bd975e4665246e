//! The HTTP contract table (`tests/contract/http.json`) through the filter's `.wasm` in
//! the in-process host, under Envoy's profile and under the strict one (configured
//! `"host": "portable"`), with the marks in a real etcd through its JSON API. Each
//! row's request goes through the filter, the row's store answer comes back through
//! it, and the outcome is checked by the same rules as the real hosts' runner
//! (`fencekeeper_harness::http_table`), against Envoy's expectation where the table
//! says the hosts differ.
//!
//! Where a store hangs up or answers after the proxy's timeout, the answer is the
//! proxy's own (Envoy's local reply configuration writes it, nginx its own page): what
//! reached the store and the counters are checked there, not the answer. The filter's
//! own HEADs to the store (conditional writes) get the row's store answer, as the
//! recording store gives them. Left to the real hosts: a store that is down (the
//! proxy answers before the filter's response path runs).

use crate::common::filter;
use fencekeeper_harness::http_table::{
    check_parts, expand, failure, table, Config, Expect, HostKind, Marks, Mode, Outcome, Protocol, Row, CLASSES, EVENTS,
};
use fencekeeper_harness::recorder::Recorded;
use fencekeeper_harness::services::{self, Etcd};
use fencekeeper_pwhost::{CallAnswer, Callout, Profile, Proxy, Request, State};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;

/// Why a configuration is left to the real hosts, if it is.
fn left_out(config: &Config) -> Option<&'static str> {
    config.store_unreachable.then_some("a store that is down gets the proxy's own answer")
}

/// The store as the rows script it: its answer to the row now running, and every
/// request it saw (the filter's own HEADs, through `conditional_store_cluster`, and
/// what the proxy forwarded).
#[derive(Default)]
struct Store {
    answer: Option<Scripted>,
    seen: Vec<Recorded>,
}

/// The store's answer to the row now running.
struct Scripted {
    status: u16,
    headers: Vec<(String, String)>,
    delay_ms: u64,
}

type Shared = Rc<RefCell<Store>>;

fn recorded(headers: &[(String, String)], body: Vec<u8>) -> Recorded {
    let value = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    Recorded {
        method: value(":method").unwrap_or_default(),
        path: value(":path").unwrap_or_default(),
        headers: headers
            .iter()
            .filter(|(n, _)| !n.starts_with(':'))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
            .collect(),
        body,
    }
}

/// Whether a row's answer is the proxy's own rather than the filter's: the store hung
/// up, or answered after the proxy's timeout. Envoy's local reply configuration (or
/// nginx) writes that answer; what reached the store and the counters are still the
/// filter's, and are checked.
fn answer_is_the_proxys(row: &Row, timeout_ms: Option<u64>) -> bool {
    row.store.hang_up || timeout_ms.is_some_and(|t| row.store.delay_ms >= t)
}

fn millis(duration: &str) -> u64 {
    let (n, unit) = duration.split_at(duration.find(|c: char| !c.is_ascii_digit()).unwrap_or(duration.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("a duration: {duration}"));
    match unit {
        "ms" => n,
        "s" => n * 1000,
        "m" => n * 60_000,
        _ => panic!("a duration: {duration}"),
    }
}

/// The filter's configuration for `config` under `profile`, its marks in `etcd` under
/// `prefix`.
fn plugin_config(config: &Config, profile: &Profile, etcd: &Etcd, prefix: &str) -> Value {
    let mut c = json!({
        "mode": match config.mode { Mode::Correctness => "correctness", Mode::Efficiency => "efficiency" },
        "strict": config.strict,
        // Made-up tokens, not etcd revisions.
        "provenance": "off",
    });
    c["protocol"] = json!(match config.protocol {
        Protocol::Http => "http",
        Protocol::Webdav => "webdav",
        Protocol::S3 => "s3",
    });
    c["etcd"] = match config.marks {
        // This host's gRPC calls reach no etcd: both profiles take the JSON API.
        Marks::Etcd => json!({"cluster": etcd.client.to_string(), "api": "json", "key_prefix": prefix}),
        Marks::Local => Value::Null,
    };
    if profile.name == "strict" {
        c["host"] = json!("portable");
        if config.marks == Marks::Etcd {
            c["gate"] = json!({"shared": false});
        }
    }
    if let Some(grace) = &config.start_grace {
        c["start_grace_ms"] = json!(millis(grace));
    }
    if config.conditional_writes {
        // As `envoy-config --conditional-writes --precondition-probe off` writes it.
        let timeout = config.upstream_timeout.as_deref().map_or(60_000, millis);
        c["gate"] = Value::Null;
        c["conditional_writes"] = json!(true);
        c["conditional_deletes"] = json!(true);
        c["conditional_store_cluster"] = json!(STORE);
        c["conditional_lend_ms"] = json!(timeout + 60_000);
        if let Some(max) = config.max_body {
            c["conditional_max_body"] = json!(max);
        }
    }
    c
}

/// The store's cluster, as the filter's HEADs name it.
const STORE: &str = "store";

/// A proxy whose HTTP calls go to etcd's client port (the address they name), or to
/// the scripted `store`.
fn start(profile: Profile, config: &Value, store: &Shared) -> Proxy {
    let store = Rc::clone(store);
    let answerer = Box::new(move |call: &Callout| {
        if call.upstream == STORE {
            let mut store = store.borrow_mut();
            store.seen.push(recorded(
                &call
                    .headers
                    .iter()
                    .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect::<Vec<_>>(),
                call.body.clone(),
            ));
            return match &store.answer {
                Some(a) if a.delay_ms < u64::from(call.timeout_ms) => {
                    let mut answer = CallAnswer::new(a.status, Vec::new());
                    answer
                        .headers
                        .extend(a.headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.clone().into_bytes())));
                    answer
                }
                _ => CallAnswer::failed(),
            };
        }
        let Ok(addr) = call.upstream.parse::<SocketAddr>() else { return CallAnswer::failed() };
        let headers: Vec<(String, String)> = ["content-type", "authorization"]
            .iter()
            .filter_map(|n| call.header(n).map(|v| ((*n).to_owned(), v)))
            .collect();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let (method, path) = (call.header(":method").unwrap_or_default(), call.header(":path").unwrap_or_default());
        match services::http(addr, &method, &path, &headers, &call.body) {
            Ok((status, body)) => CallAnswer::new(status, body),
            Err(_) => CallAnswer::failed(),
        }
    });
    Proxy::start_answering(filter(), profile, &config.to_string(), 1, answerer).unwrap_or_else(|e| panic!("{e}"))
}

/// Every counter the table compares, as the filter counts them.
fn counters(proxy: &Proxy) -> (Vec<u64>, Vec<u64>) {
    let read = |stat: String| proxy.metric(stat.trim_start_matches("wasmcustom.")).unwrap_or(0) as u64;
    (CLASSES.iter().map(|c| read(c.envoy_stat())).collect(), EVENTS.iter().map(|e| read(e.envoy_stat())).collect())
}

/// Send `row` through `proxy`, the store answering as the row says (`timeout`: the
/// proxy's, in ms).
fn run_row(proxy: &mut Proxy, store: &Shared, row: &Row, expect: &Expect, timeout: Option<u64>) -> Vec<String> {
    let send = &row.send;
    let request = Request {
        method: send.method.clone(),
        path: expand(&send.path),
        headers: send.headers.iter().map(|(k, v)| (k.clone(), expand(v))).collect(),
        body: expand(&send.body).into_bytes(),
    };
    let body = if send.method == "HEAD" { Vec::new() } else { row.store.body.clone().into_bytes() };
    let headers: Vec<(String, String)> = row.store.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let scripted = Scripted { status: row.store.status, headers: headers.clone(), delay_ms: row.store.delay_ms };
    *store.borrow_mut() = Store { answer: Some(scripted), seen: Vec::new() };
    let before = counters(proxy);
    let id = proxy.send(0, request);
    let mut waited = 0;
    let answer = loop {
        match proxy.state(id) {
            State::AtUpstream => {
                let forwarded = proxy.forwarded(id).unwrap_or_default().to_vec();
                let sent = recorded(&forwarded, proxy.forwarded_body(id).unwrap_or_default().to_vec());
                store.borrow_mut().seen.push(sent);
                match timeout {
                    Some(t) if row.store.delay_ms >= t => {
                        proxy.advance(t);
                        proxy.give_up(id);
                    }
                    _ if row.store.hang_up => {
                        proxy.advance(row.store.delay_ms);
                        proxy.reset(id);
                    }
                    _ => {
                        proxy.advance(row.store.delay_ms);
                        proxy.respond_fully(id, row.store.status, &headers, &body);
                    }
                }
            }
            State::Held if waited < 30_000 => {
                proxy.advance(10);
                waited += 10;
            }
            State::Answered(answer) => break answer,
            other => return vec![format!("no answer: {other:?} ({:?})", proxy.violations())],
        }
    };
    let after = counters(proxy);
    let outcome = Outcome {
        status: answer.status,
        headers: answer.headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.clone())).collect(),
        body: answer.body.clone(),
        seen: std::mem::take(&mut store.borrow_mut().seen),
        classes: CLASSES.iter().zip(after.0.iter().zip(&before.0)).map(|(c, (a, b))| (*c, a - b)).collect(),
        events: EVENTS.iter().zip(after.1.iter().zip(&before.1)).map(|(e, (a, b))| (*e, a - b)).collect(),
    };
    let mut wrong = check_parts(row, expect, &outcome, !answer_is_the_proxys(row, timeout));
    wrong.extend(proxy.violations().into_iter().map(|v| format!("host rule broken: {v}")));
    wrong
}

/// Every story the in-process host runs, under `profile`: the failures, and how many
/// rows ran.
fn run_table(profile: &Profile, etcd: &Etcd) -> (Vec<String>, usize) {
    let table = table();
    let mut proxies: BTreeMap<&str, (Proxy, Shared)> = BTreeMap::new();
    let (mut failures, mut ran) = (Vec::new(), 0);
    for story in &table.stories {
        let config = &table.configs[&story.config];
        if left_out(config).is_some() {
            continue;
        }
        let (proxy, store) = proxies.entry(story.config.as_str()).or_insert_with(|| {
            let prefix = format!("/{}/{}/", profile.name, story.config);
            let store = Shared::default();
            (start(profile.clone(), &plugin_config(config, profile, etcd, &prefix), &store), store)
        });
        let timeout = config.upstream_timeout.as_deref().map(millis);
        for (i, row) in story.rows.iter().enumerate() {
            ran += 1;
            let kind = if profile.name == "strict" { HostKind::Portable } else { HostKind::Envoy };
            let wrong = run_row(proxy, store, row, row.expected(kind), timeout);
            if !wrong.is_empty() {
                failures.push(failure(profile.name, story, i, row, &wrong));
            }
        }
    }
    (failures, ran)
}

#[test]
fn every_row_of_the_http_contract_the_filter_answers_holds_under_envoys_profile() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("etcd: {e:#}"));
    let (failures, ran) = run_table(&Profile::envoy(), &etcd);
    assert!(failures.is_empty(), "the HTTP contract is broken in the envoy profile:\n{}", failures.join("\n"));
    assert!(ran >= 60, "only {ran} rows ran");
}

#[test]
fn every_row_of_the_http_contract_the_filter_answers_holds_under_the_strict_profile_configured_portable() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("etcd: {e:#}"));
    let (failures, ran) = run_table(&Profile::strict(), &etcd);
    assert!(failures.is_empty(), "the HTTP contract is broken in the strict profile:\n{}", failures.join("\n"));
    assert!(ran >= 60, "only {ran} rows ran");
}
