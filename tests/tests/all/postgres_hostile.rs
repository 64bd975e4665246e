//! Hostile input and hostile guests against the extension in a real PostgreSQL: NULLs,
//! a mebibyte token, bytes that are not UTF-8 (a SQL_ASCII database takes any bytes),
//! and the fault-injection guest (guest/artifacts/test-guests/guest_faults.wasm) that
//! traps, loops, eats memory, floods its reason or lies, plus guests that do not load.
//! Each write is refused with its SQLSTATE and a one-line message, its transaction
//! aborts, no mark moves, and the server and every connection carry on.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

#[path = "../../../host/fencekeeper/tests/support/wat_guest.rs"]
mod wat_guest;

use fencekeeper::validator::guest_path;
use fencekeeper_harness::pg_wire::{literal, Client, PgError};
use fencekeeper_harness::postgres::Postgres;

/// The SQLSTATE and message of a query that must fail.
fn refused(client: &mut Client, sql: impl AsRef<[u8]>) -> (String, String) {
    match client.query(sql.as_ref()) {
        Err(PgError::Server(e)) => (e.code, e.message),
        other => panic!("{}: expected an error, got {other:?}", String::from_utf8_lossy(sql.as_ref())),
    }
}

fn value(client: &mut Client, sql: impl AsRef<[u8]>) -> Option<String> {
    client.value(sql.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(sql.as_ref())))
}

/// A message a client can print: one line, short, no control characters.
fn one_line(message: &str) {
    assert!(message.len() < 1000, "{} bytes: {}", message.len(), &message[..200]);
    assert!(!message.chars().any(char::is_control), "{message:?}");
}

/// The server is alive, no backend crashed, and a fresh connection admits.
fn carries_on(pg: &mut Postgres, resource: &str) {
    pg.process.check_alive().unwrap();
    let log = pg.log();
    assert!(!log.contains("terminated by signal") && !log.contains("PANIC"), "{log}");
    let mut fresh = pg.connect("postgres").unwrap();
    assert_eq!(
        value(&mut fresh, format!("SELECT fencekeeper.admit({}, '1')", literal(resource))).as_deref(),
        Some("t")
    );
}

#[test]
fn nulls_and_a_mebibyte_token_or_key_are_malformed_and_the_connection_carries_on() {
    let mut pg = Postgres::with_extension(&[]).unwrap();
    let mut c = pg.connect("postgres").unwrap();
    for sql in ["SELECT fencekeeper.admit(NULL, '1')", "SELECT fencekeeper.admit(NULL, NULL)"] {
        assert_eq!(refused(&mut c, sql).0, "FK004", "{sql}");
    }
    let mebibyte = 1 << 20;
    for sql in [
        format!("SELECT fencekeeper.admit('r', repeat('9', {mebibyte}))"),
        format!("SELECT fencekeeper.admit('r', '{}')", "1".repeat(mebibyte)),
        format!("SELECT fencekeeper.admit(repeat('k', {mebibyte}), '1')"),
    ] {
        let (code, message) = refused(&mut c, &sql);
        assert_eq!(code, "FK004", "{message}");
        one_line(&message);
    }
    // Through the trigger, the mebibyte is TOASTed in the row before it is read.
    c.query(
        "CREATE TABLE rows (r text, t text);
         CREATE TRIGGER fenced BEFORE INSERT ON rows FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('r', 't')",
    )
    .unwrap();
    let (code, message) = refused(&mut c, format!("INSERT INTO rows VALUES ('r', repeat('0', {mebibyte}) || '7')"));
    assert_eq!(code, "FK004");
    one_line(&message);
    assert_eq!(refused(&mut c, "INSERT INTO rows VALUES ('r', NULL)").0, "FK003");
    assert_eq!(refused(&mut c, "INSERT INTO rows VALUES (NULL, '7')").0, "FK004");
    assert_eq!(value(&mut c, "SELECT count(*) FROM fencekeeper.marks").as_deref(), Some("0"), "no mark moved");
    assert_eq!(value(&mut c, "SELECT count(*) FROM rows").as_deref(), Some("0"));
    carries_on(&mut pg, "r");
}

#[test]
fn text_that_is_not_utf8_is_malformed_never_merged_and_other_encodings_are_converted() {
    let mut pg = Postgres::with_extension(&[]).unwrap();
    let mut admin = pg.connect("postgres").unwrap();
    admin.query("CREATE DATABASE raw ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").unwrap();
    admin.query("CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").unwrap();
    let mut raw = pg.connect("raw").unwrap();
    raw.query("CREATE EXTENSION fencekeeper").unwrap();
    // A SQL_ASCII database keeps whatever bytes a client sends.
    for key in [&b"a\xffb"[..], b"a\xfeb", b"\xc3"] {
        let sql = [&b"SELECT fencekeeper.admit('"[..], key, b"', '1')"].concat();
        let (code, message) = refused(&mut raw, sql);
        assert!(code == "FK004" && message.contains("not UTF-8"), "{code} {message}");
        one_line(&message);
    }
    let (code, message) = refused(&mut raw, &b"SELECT fencekeeper.admit('k', '3\xff')"[..]);
    assert!(code == "FK004" && message.contains("token"), "{code} {message}");
    raw.query(
        "CREATE TABLE rows (r text, t text);
         CREATE TRIGGER fenced BEFORE INSERT ON rows FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('r', 't')",
    )
    .unwrap();
    assert_eq!(refused(&mut raw, &b"INSERT INTO rows VALUES ('\xff', '1')"[..]).0, "FK004");
    assert_eq!(value(&mut raw, "SELECT count(*) FROM fencekeeper.marks").as_deref(), Some("0"));
    assert_eq!(value(&mut raw, "SELECT fencekeeper.admit('k', '3')").as_deref(), Some("t"), "UTF-8 text is fine");
    // LATIN1 text is converted: 'caf\xe9' is the key "café", as in any other host.
    let mut latin = pg.connect("latin").unwrap();
    latin.query("CREATE EXTENSION fencekeeper").unwrap();
    assert_eq!(value(&mut latin, &b"SELECT fencekeeper.admit('caf\xe9', '5')"[..]).as_deref(), Some("t"));
    let (code, message) = refused(&mut latin, &b"SELECT fencekeeper.admit('caf\xe9', '4')"[..]);
    // The message reaches a LATIN1 client readable: no UTF-8 bytes sent as LATIN1.
    assert!(code == "FK001" && message.contains("\"caf\\u{e9}\""), "{code} {message}");
    let audit = value(&mut latin, "SELECT convert_to(entry->>'resource', 'UTF8')::text FROM fencekeeper.audit");
    assert_eq!(audit.as_deref(), Some("\\x636166c3a9"), "the audit holds the UTF-8 key");
    let kept = value(&mut latin, &b"SELECT count(*) FROM fencekeeper.marks WHERE resource = 'caf\xe9'"[..]);
    assert_eq!(kept.as_deref(), Some("1"), "the marks table holds the key in the database's encoding");
    carries_on(&mut pg, "after-encodings");
}

#[test]
fn a_guest_that_traps_loops_grows_or_lies_is_refused_and_the_server_and_other_connections_carry_on() {
    let mut pg = Postgres::with_extension(&[]).unwrap();
    let mut faulty = pg.connect("postgres").unwrap();
    let mut honest = pg.connect("postgres").unwrap();
    // A copy in the server's directory: the checkout may not be readable by the
    // server's user (a clone under a 0700 directory).
    let bytes = std::fs::read(guest_path("test-guests/guest_faults.wasm")).unwrap();
    let guest = pg.place("guest_faults.wasm", &bytes).unwrap();
    faulty.query(format!("SET fencekeeper.guest = {}", literal(&guest.display().to_string()))).unwrap();
    assert_eq!(value(&mut faulty, "SELECT fencekeeper.admit('seed', '64023.1.0.5')").as_deref(), Some("t"));
    let faults = [
        ("fault-trap", "FK006", "unreachable"),
        ("fault-loop", "FK006", "fuel"),
        ("fault-grow", "FK006", "memory"),
        // Its 2 MiB reason runs it out of fuel first, with the default budget.
        ("fault-reason", "FK006", "fuel"),
        // Admits a token below the mark as advancing: the host proves it stale.
        ("64023.1.0.4", "FK001", "stale"),
        // Raises the mark to the maximum (a lock-out): a breach, undecided.
        ("64023.2.0.6", "FK006", ""),
        // Admits "the mark it was given" for a higher token.
        ("64023.3.0.9", "FK006", ""),
        // Answers a verdict of arity 0.
        ("64023.5.0.9", "FK006", ""),
        // Its two decides disagree.
        ("64023.6.0.9", "FK006", ""),
    ];
    for (i, (token, expected, says)) in faults.into_iter().enumerate() {
        let (code, message) = refused(&mut faulty, format!("SELECT fencekeeper.admit('seed', '{token}')"));
        assert_eq!(code, expected, "{token}: {message}");
        assert!(message.contains(says), "{token}: {message}");
        one_line(&message);
        // Nothing moved, and both connections go on.
        assert_eq!(value(&mut honest, "SELECT fencekeeper.mark('seed')").as_deref(), Some("64023.1.0.5"), "{token}");
        assert_eq!(value(&mut faulty, "SELECT 1").as_deref(), Some("1"));
        assert!(value(&mut honest, format!("SELECT fencekeeper.admit('honest', '{i}')")).is_some());
    }
    // The faulted instance was discarded; the same session's guest serves again.
    assert_eq!(value(&mut faulty, "SELECT fencekeeper.admit('seed', '64023.1.0.6')").as_deref(), Some("t"));
    carries_on(&mut pg, "after-faults");
}

#[test]
fn a_guest_that_does_not_load_refuses_every_write_as_undecided_saying_why() {
    let mut pg = Postgres::with_extension(&[]).unwrap();
    // Calls every token malformed: it fails the conformance vectors when it loads.
    let liar = pg.place("liar.wasm", &wat_guest::component("", "")).unwrap();
    let not_wasm = pg.place("not.wasm", b"#!/bin/sh\n").unwrap();
    let missing = pg.place("gone.wasm", b"").unwrap().with_file_name("missing.wasm");
    let mut c = pg.connect("postgres").unwrap();
    for (guest, says) in [(&liar, "conformance vector"), (&not_wasm, "not WebAssembly"), (&missing, "cannot read")] {
        c.query(format!("SET fencekeeper.guest = {}", literal(&guest.display().to_string()))).unwrap();
        let (code, message) = refused(&mut c, "SELECT fencekeeper.admit('r', '1')");
        assert!(code == "FK006" && message.contains(says), "{}: {code} {message}", guest.display());
        one_line(&message);
    }
    c.query("RESET fencekeeper.guest").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.admit('r', '1')").as_deref(), Some("t"), "the bundled guest again");
    carries_on(&mut pg, "after-loads");
}
