//! The token contract (`tests/contract/tokens.json`) against the library: a `Guard`
//! with the bundled validator and a memory store, one per policy. A resource arrives
//! as bytes and is taken as a key with `core::resource::key_from_bytes`, as every
//! host that embeds the library must (docs/architecture.md, "Adding a host"); bytes
//! that are not UTF-8 are malformed there, before the guard.
//!
//! The other Rust-side runners are `tokens_contract_{http,postgres,redis}.rs` and
//! `host/capi/tests/all/tokens_contract.rs`; the Python and Node ones read the file
//! themselves.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use anyhow::Result;
use fencekeeper::{Class, Guard, MemoryStore, Mode, Policy, Validator};
use fencekeeper_harness::token_table::{self, ByPolicy, Host, Table};
use serde_json::Value;
use std::sync::Arc;

/// The library: one guard per policy.
pub(crate) struct Library(ByPolicy<Guard>);

impl Library {
    pub(crate) fn new() -> Library {
        Library(ByPolicy::start(|strict| {
            let validator = Validator::bundled(Policy { mode: Mode::Correctness, strict }).unwrap();
            Guard::new(Arc::new(validator), Arc::new(MemoryStore::new()))
        }))
    }
}

impl Host for Library {
    fn name(&self) -> &'static str {
        "library"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        let class = match fencekeeper_core::resource::key_from_bytes(resource) {
            Ok(key) => {
                let token = token.map(String::from_utf8_lossy);
                self.0.of(strict).admit(key, token.as_deref()).class()
            }
            Err(_) => Class::Malformed,
        };
        Ok(class.name().into())
    }

    fn mark(&mut self, strict: bool, key: &str) -> Result<Option<String>> {
        Ok(self.0.of(strict).mark(key)?.map(|t| t.to_string()))
    }
}

#[test]
fn every_row_holds_in_the_library() {
    let table = Table::load();
    assert!(table.rows.len() >= 40, "about 40 inputs");
    let misses = token_table::run(&table, &mut Library::new());
    token_table::assert_kept("library", &misses);
}

/// The library taking an empty token for no token, as the Redis module did: the
/// table fails it on exactly the empty-token rows, so the table can fail.
struct EmptyIsMissing(Library);

impl Host for EmptyIsMissing {
    fn name(&self) -> &'static str {
        "library"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        self.0.write(strict, resource, token.filter(|t| !t.is_empty()))
    }

    fn mark(&mut self, strict: bool, key: &str) -> Result<Option<String>> {
        self.0.mark(strict, key)
    }
}

#[test]
fn a_host_that_takes_an_empty_token_for_none_fails_the_table_on_the_empty_rows() {
    let table = Table::load();
    let misses = token_table::run(&table, &mut EmptyIsMissing(Library::new()));
    let rows: Vec<&str> = misses.iter().map(|m| m.row.as_str()).collect();
    assert_eq!(
        rows,
        ["an empty token, no mark", "an empty token, with a mark", "an empty token in strict mode"],
        "{}",
        token_table::report("library", &misses)
    );
    assert!(misses[0].what.contains("expected \"malformed\""), "{}", misses[0].what);
}

#[test]
fn the_tables_rules_are_checked() {
    let table = include_str!("../../contract/tokens.json");
    let broken = |from: &str, to: &str| {
        assert!(table.contains(from), "{from}");
        Table::parse(&table.replacen(from, to, 1)).err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(broken("\"unverified\": 403, ", "").contains("http renders no unverified"));
    assert!(broken("\"class\": \"missing\"", "\"class\": \"absent\"").contains("unknown class absent"));
    assert!(broken("\"row\": \"a leading space\"", "\"row\": \"no such row\"").contains("no row"));
    assert!(broken("\"class\": \"admitted\", \"mark\": \"35\",", "\"class\": \"malformed\", \"mark\": \"34\",")
        .contains("expects what the row does"));
}
