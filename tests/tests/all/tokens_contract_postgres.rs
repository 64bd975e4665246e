//! The token contract (`tests/contract/tokens.json`) against the PostgreSQL extension:
//! each row is an INSERT into a table fenced by `fencekeeper.fence`, on a real server,
//! in a SQL_ASCII database, which keeps the bytes a client sends, so that a resource
//! that is not UTF-8 reaches the trigger (a UTF8 database refuses such bytes itself,
//! 22021, before any trigger runs). No token is a NULL token column; strict mode is
//! the superuser's `SET fencekeeper.strict`. The mark is read back with
//! `fencekeeper.mark(resource)`, the documented way.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::postgres_extension::value;
use anyhow::Result;
use fencekeeper_harness::pg_wire::{literal, Client, PgError};
use fencekeeper_harness::postgres::Postgres;
use fencekeeper_harness::token_table::{self, Host, Table};
use serde_json::Value;

struct Extension {
    _pg: Postgres,
    client: Client,
}

impl Extension {
    fn start() -> Extension {
        let pg = Postgres::with_extension(&[]).unwrap();
        let mut admin = pg.connect("postgres").unwrap();
        admin.query("CREATE DATABASE raw ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").unwrap();
        let mut client = pg.connect("raw").unwrap();
        client
            .query(
                "CREATE EXTENSION fencekeeper;
                 CREATE TABLE tokens (resource text, token text);
                 CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON tokens
                     FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('resource', 'token')",
            )
            .unwrap();
        Extension { _pg: pg, client }
    }
}

/// A string literal of any bytes but a quote (none in the table).
fn quoted(bytes: &[u8]) -> Vec<u8> {
    assert!(!bytes.contains(&b'\''), "a quote in a table value");
    [&b"'"[..], bytes, b"'"].concat()
}

impl Host for Extension {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        self.client.query(format!("SET fencekeeper.strict = {}", if strict { "on" } else { "off" }))?;
        let token = token.map_or(b"NULL".to_vec(), quoted);
        let sql = [&b"INSERT INTO tokens VALUES ("[..], &quoted(resource), b", ", &token, b")"].concat();
        match self.client.query(sql) {
            Ok(_) => Ok("00000".into()),
            Err(PgError::Server(e)) => Ok(e.code.into()),
            Err(e) => Err(e.into()),
        }
    }

    fn mark(&mut self, _strict: bool, key: &str) -> Result<Option<String>> {
        Ok(value(&mut self.client, &format!("SELECT fencekeeper.mark({})", literal(key))))
    }
}

#[test]
fn every_row_holds_in_the_postgres_extension() {
    let table = Table::load();
    let misses = token_table::run(&table, &mut Extension::start());
    token_table::assert_kept("postgres", &misses);
    assert!(table.exceptions_of("postgres").is_empty(), "PostgreSQL answers every row as the table says");
}
