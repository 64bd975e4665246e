//! The token contract (`tests/contract/tokens.json`) against both HTTP hosts: each row
//! is a PUT of `/RESOURCE` (percent-encoded: a resource that is not UTF-8 is sent as
//! `%FF`, which the hosts decode) with the token in `fencing-token` (no header for no
//! token), through the gateway (`fencekeeper serve`, marks in its file store, read back
//! through its admin lookup) and through a real Envoy with the filter (marks in a real
//! etcd, read back from etcd with the library's store), one instance of each per
//! policy, each in front of a recording store that answers 201. Correctness mode, no
//! provenance check (the table's tokens are made up, not etcd revisions).

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use anyhow::Result;
use fencekeeper::store::EtcdStore;
use fencekeeper::MarkStore;
use fencekeeper_harness::envoy::{exchange, Envoy};
use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::recorder::Recorder;
use fencekeeper_harness::services::Etcd;
use fencekeeper_harness::token_table::{self, ByPolicy, Host, Table};
use serde_json::Value;
use std::net::SocketAddr;

/// A PUT of `resource` with `token`: the answer's status.
fn put(addr: SocketAddr, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
    let token = token.map(|t| std::str::from_utf8(t).expect("the table's tokens are UTF-8"));
    let headers: Vec<(&str, &str)> = token.map(|t| ("fencing-token", t)).into_iter().collect();
    Ok(exchange(addr, "PUT", &token_table::http_path(resource), &headers, b"body")?.status.into())
}

/// The gateway, one per policy, each with its own mark file, in front of one store.
struct Gateways {
    gateways: ByPolicy<Gateway>,
    _store: Recorder,
}

impl Gateways {
    fn start() -> Gateways {
        let store = Recorder::start().unwrap();
        let gateways = ByPolicy::start(|strict| {
            let args: &[&str] = if strict { &["--strict"] } else { &[] };
            Gateway::start(&store.url(), args).unwrap()
        });
        Gateways { gateways, _store: store }
    }
}

impl Host for Gateways {
    fn name(&self) -> &'static str {
        "http"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        put(self.gateways.of(strict).addr, resource, token)
    }

    fn mark(&mut self, strict: bool, key: &str) -> Result<Option<String>> {
        self.gateways.of(strict).mark(&format!("/{key}"))
    }
}

/// Envoy with the filter, one per policy, both on one etcd (the rows' resources
/// differ), which the marks are read back from.
struct Envoys {
    envoys: ByPolicy<Envoy>,
    marks: EtcdStore,
    _etcd: Etcd,
    _store: Recorder,
}

impl Envoys {
    fn start() -> Envoys {
        let etcd = Etcd::start().unwrap();
        let store = Recorder::start().unwrap();
        let (upstream, client) = (store.addr.to_string(), etcd.client.to_string());
        let args = ["--upstream", upstream.as_str(), "--etcd", client.as_str(), "--provenance", "off"];
        let envoys = ByPolicy::start(|strict| {
            let policy: &[&str] = if strict { &["--strict"] } else { &[] };
            Envoy::start(1, &[&args[..], policy].concat()).unwrap()
        });
        let marks = EtcdStore::connect(&etcd.url()).unwrap();
        Envoys { envoys, marks, _etcd: etcd, _store: store }
    }
}

impl Host for Envoys {
    fn name(&self) -> &'static str {
        "http"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        put(self.envoys.of(strict).listen, resource, token)
    }

    fn mark(&mut self, _strict: bool, key: &str) -> Result<Option<String>> {
        Ok(self.marks.get(&format!("/{key}"))?.map(|t| t.to_string()))
    }
}

/// What the HTTP hosts answer otherwise, and only that: the token with a space before
/// or after it, which HTTP takes off a header value before a host sees it.
fn http_exceptions_are_the_spaces(table: &Table) {
    assert_eq!(table.exceptions_of("http"), ["a leading space", "a trailing space"]);
}

#[test]
fn every_row_holds_in_the_gateway() {
    let table = Table::load();
    let misses = token_table::run(&table, &mut Gateways::start());
    token_table::assert_kept("the gateway", &misses);
    http_exceptions_are_the_spaces(&table);
}

#[test]
fn every_row_holds_in_envoy_with_the_filter() {
    let table = Table::load();
    let misses = token_table::run(&table, &mut Envoys::start());
    token_table::assert_kept("Envoy with the filter", &misses);
    http_exceptions_are_the_spaces(&table);
}
