//! The `fencekeeper` PostgreSQL extension against a real PostgreSQL 15 (Debian's,
//! started by the harness in a temporary directory on a free port): its life cycle
//! (CREATE, ALTER ... UPDATE, DROP), the refusal contract as SQLSTATEs, marks that
//! commit and roll back with the row, the trigger on INSERT, UPDATE and DELETE, who
//! may write the marks, pg_dump, and what the extension does to a backend (threads,
//! signal handlers).
//!
//! The extension must be installed first: scripts/test.sh runs
//! scripts/install-postgres-extension.sh after the build.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::pg_wire::{Client, PgError, Row};
use fencekeeper_harness::postgres::{Postgres, USER};
use std::collections::BTreeSet;
use std::process::Command;

/// A server with the extension, and a connection to its database `postgres`.
pub(crate) fn server() -> (Postgres, Client) {
    let pg = Postgres::with_extension(&[]).unwrap();
    let client = pg.connect("postgres").unwrap();
    (pg, client)
}

/// The SQLSTATE, message and detail of a query that must fail.
pub(crate) fn refused(client: &mut Client, sql: &str) -> (String, String, Option<String>) {
    match client.query(sql) {
        Err(PgError::Server(e)) => (e.code, e.message, e.detail),
        other => panic!("{sql}: expected an error, got {other:?}"),
    }
}

/// The one value a query answers.
pub(crate) fn value(client: &mut Client, sql: &str) -> Option<String> {
    client.value(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Attach the fence to `table` on INSERT, UPDATE and DELETE: the resource in the
/// column `resource`, the token in the column `token`.
pub(crate) fn attach(client: &mut Client, table: &str, resource: &str) -> Result<Vec<Row>, PgError> {
    client.query(format!(
        "CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON {table}
             FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('{resource}', 'token')"
    ))
}

/// The objects of the extension, as `\dx+` lists them.
fn objects(client: &mut Client) -> BTreeSet<String> {
    let sql = "SELECT pg_describe_object(classid, objid, 0) FROM pg_depend \
               WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e' \
               AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fencekeeper')";
    client.query(sql).unwrap().into_iter().map(|row| String::from_utf8(row[0].clone().unwrap()).unwrap()).collect()
}

#[test]
fn create_update_and_drop_the_extension_keeping_marks_across_the_update() {
    let pg = Postgres::with_extension(&[]).unwrap();
    let mut fresh = pg.connect("postgres").unwrap();
    fresh.query("CREATE DATABASE upgraded").unwrap();
    let mut c = pg.connect("upgraded").unwrap();
    c.query("CREATE EXTENSION fencekeeper VERSION '0.1.0'").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.admit('orders/7', '34')").as_deref(), Some("t"));
    let (code, ..) = refused(&mut c, "SELECT fencekeeper.mark('orders/7')");
    assert_eq!(code, "42883", "0.1.0 has no mark()");

    c.query("ALTER EXTENSION fencekeeper UPDATE").unwrap();
    assert_eq!(
        value(&mut c, "SELECT extversion FROM pg_extension WHERE extname = 'fencekeeper'").as_deref(),
        Some("0.1.2")
    );
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('orders/7')").as_deref(), Some("34"), "the mark survived");
    assert_eq!(refused(&mut c, "SELECT fencekeeper.admit('orders/7', '33')").0, "FK001");
    assert_eq!(objects(&mut c), objects(&mut fresh), "an update ends where a fresh install does");

    c.query("CREATE TABLE rows (r text, t text)").unwrap();
    c.query("CREATE TRIGGER fenced BEFORE INSERT ON rows FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('r', 't')")
        .unwrap();
    let (code, ..) = refused(&mut c, "DROP EXTENSION fencekeeper");
    assert_eq!(code, "2BP01", "a trigger depends on fence()");
    c.query("DROP EXTENSION fencekeeper CASCADE").unwrap();
    assert_eq!(value(&mut c, "SELECT count(*) FROM pg_namespace WHERE nspname = 'fencekeeper'").as_deref(), Some("0"));
    assert_eq!(value(&mut c, "SELECT count(*) FROM pg_trigger WHERE tgname = 'fenced'").as_deref(), Some("0"));
    c.query("INSERT INTO rows VALUES ('orders/7', '1')").unwrap();
    // And back: a fresh install starts with no marks.
    c.query("CREATE EXTENSION fencekeeper").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('orders/7')"), None);
}

#[test]
fn each_refusal_class_has_its_own_sqlstate_and_a_stale_one_names_the_mark() {
    let (_pg, mut c) = server();
    c.query("SELECT fencekeeper.admit('r', '34')").unwrap();
    let (code, message, detail) = refused(&mut c, "SELECT fencekeeper.admit('r', '33')");
    assert_eq!((code.as_str(), detail.as_deref()), ("FK001", Some("fencing-highest: 34")));
    assert!(message.starts_with("stale fencing token 33 for \"r\": the resource has seen token 34"), "{message}");
    let (code, message, _) = refused(&mut c, "SELECT fencekeeper.admit('r', NULL)");
    assert_eq!(code, "FK003");
    assert!(message.contains("the token argument is NULL"), "{message}");
    for bad in ["'-1'", "'3.x'", "'1.2'", "' 34'", "''"] {
        let (code, message, _) = refused(&mut c, &format!("SELECT fencekeeper.admit('r', {bad})"));
        assert_eq!(code, "FK004", "{bad}: {message}");
    }
    assert_eq!(refused(&mut c, "SELECT fencekeeper.admit('', '35')").0, "FK004", "an empty resource");
    assert_eq!(refused(&mut c, "SELECT fencekeeper.admit(repeat('k', 1025), '35')").0, "FK004", "a 1025-byte key");
    assert_eq!(value(&mut c, "SELECT fencekeeper.admit(repeat('k', 1024), '35')").as_deref(), Some("t"));
    // Strict mode (a superuser's setting): the same token twice is replayed.
    c.query("SET fencekeeper.strict = on").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.admit('r', '35')").as_deref(), Some("t"));
    let (code, _, detail) = refused(&mut c, "SELECT fencekeeper.admit('r', '35')");
    assert_eq!((code.as_str(), detail.as_deref()), ("FK002", Some("fencing-highest: 35")));
    c.query("RESET fencekeeper.strict").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.admit('r', '35')").as_deref(), Some("f"), "the holder writes again");
    // A damaged record is undecided, never a lower mark or no mark.
    c.query("UPDATE fencekeeper.marks SET record = 'fk2 15 00000000' WHERE resource = 'r'").unwrap();
    let (code, message, _) = refused(&mut c, "SELECT fencekeeper.admit('r', '20')");
    assert_eq!(code, "FK006");
    assert!(message.contains("is damaged") && message.contains("fencekeeper.marks"), "{message}");
    assert_eq!(refused(&mut c, "SELECT fencekeeper.mark('r')").0, "FK006");
    assert_eq!(refused(&mut c, "SELECT fencekeeper.admit('r', '99')").0, "FK006", "not even an advance repairs it");
}

#[test]
fn a_rollback_takes_the_advance_and_its_audit_row_back_and_a_savepoint_keeps_the_rest() {
    let (_pg, mut c) = server();
    c.query("SELECT fencekeeper.admit('r', '10')").unwrap();
    c.query("BEGIN; SELECT fencekeeper.admit('r', '11'); ROLLBACK").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('r')").as_deref(), Some("10"));
    assert_eq!(value(&mut c, "SELECT fencekeeper.admit('r', '10')").as_deref(), Some("f"), "10 is the mark again");
    assert_eq!(value(&mut c, "SELECT count(*) FROM fencekeeper.audit").as_deref(), Some("1"));
    // A refusal aborts only up to a savepoint the client set.
    c.query("BEGIN; SELECT fencekeeper.admit('s', '5'); SAVEPOINT a").unwrap();
    assert_eq!(refused(&mut c, "SELECT fencekeeper.admit('s', '4')").0, "FK001");
    c.query("ROLLBACK TO SAVEPOINT a; COMMIT").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('s')").as_deref(), Some("5"));
    let entry = value(&mut c, "SELECT entry::text FROM fencekeeper.audit WHERE resource = 's'").unwrap();
    let entry: serde_json::Value = serde_json::from_str(&entry).unwrap();
    assert_eq!(
        (entry["host"].as_str(), entry["new"].as_str(), entry["old"].is_null()),
        (Some("postgres"), Some("5"), true)
    );
    assert_eq!(entry["user"].as_str(), Some(USER));
    let fields: Vec<&str> = entry.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(fields.len(), fencekeeper_core::audit::FIELDS.len(), "the one audit format: {fields:?}");
}

#[test]
fn the_trigger_fences_inserts_updates_and_deletes() {
    let (_pg, mut c) = server();
    c.query(
        "CREATE TABLE imports (batch text, line int, token bigint, body text);
         CREATE TRIGGER fenced BEFORE INSERT OR UPDATE OR DELETE ON imports
             FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('batch', 'token')",
    )
    .unwrap();
    c.query("INSERT INTO imports VALUES ('b', 1, 40, 'a'), ('b', 2, 40, 'a'), ('c', 1, 7, 'a')").unwrap();
    c.query("INSERT INTO imports VALUES ('b', 3, 41, 'newer holder')").unwrap();
    let (code, _, detail) = refused(&mut c, "INSERT INTO imports VALUES ('b', 4, 40, 'late')");
    assert_eq!((code.as_str(), detail.as_deref()), ("FK001", Some("fencing-highest: 41")));
    // An UPDATE presents the new row's token only when it sets the column: the row's
    // old token is not the writer's (tests/tests/all/postgres_presented.rs has more).
    assert_eq!(refused(&mut c, "UPDATE imports SET body = 'x' WHERE line = 1 AND batch = 'b'").0, "FK003");
    assert_eq!(refused(&mut c, "UPDATE imports SET body = 'x', token = 40 WHERE line = 1 AND batch = 'b'").0, "FK001");
    c.query("UPDATE imports SET body = 'x', token = 41 WHERE line = 1 AND batch = 'b'").unwrap();
    // Moving a row to another resource writes both: 'c' has seen only 7, 'b' 41.
    c.query("UPDATE imports SET batch = 'c', token = 41 WHERE line = 2 AND batch = 'b'").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('c')").as_deref(), Some("41"));
    assert_eq!(refused(&mut c, "UPDATE imports SET batch = 'b', token = 7 WHERE line = 1 AND batch = 'c'").0, "FK001");
    // A DELETE presents the setting fencekeeper.token.
    let (code, message, _) = refused(&mut c, "DELETE FROM imports WHERE batch = 'b'");
    assert!(code == "FK003" && message.contains("fencekeeper.token"), "{code} {message}");
    c.query("BEGIN; SET LOCAL fencekeeper.token = '40'").unwrap();
    assert_eq!(refused(&mut c, "DELETE FROM imports WHERE batch = 'b'").0, "FK001");
    c.query("ROLLBACK; BEGIN; SET LOCAL fencekeeper.token = '41'; DELETE FROM imports WHERE line = 3; COMMIT").unwrap();
    let rows = value(&mut c, "SELECT string_agg(batch || line || ':' || token, ' ' ORDER BY batch, line) FROM imports");
    assert_eq!(rows.as_deref(), Some("b1:41 c1:7 c2:41"));
    // Misuse is an error of its own, not a refusal.
    c.query("CREATE TABLE t (r text, t text)").unwrap();
    c.query("CREATE TRIGGER wrong AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('r', 't')")
        .unwrap();
    assert_eq!(refused(&mut c, "INSERT INTO t VALUES ('r', '1')").0, "39P01");
    c.query("DROP TRIGGER wrong ON t").unwrap();
    c.query("CREATE TRIGGER one BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('r')").unwrap();
    assert_eq!(refused(&mut c, "INSERT INTO t VALUES ('r', '1')").0, "39P01");
    c.query("DROP TRIGGER one ON t").unwrap();
    let no_column =
        "CREATE TRIGGER no_column BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('r', 'tok')";
    assert_eq!(refused(&mut c, no_column).0, "42703", "refused when attached");
    c.query("ALTER EVENT TRIGGER fencekeeper_check_fence DISABLE").unwrap();
    c.query(no_column).unwrap();
    c.query("ALTER EVENT TRIGGER fencekeeper_check_fence ENABLE").unwrap();
    assert_eq!(refused(&mut c, "INSERT INTO t VALUES ('r', '1')").0, "42703", "and at every write");
}

#[test]
fn a_token_column_of_a_type_that_cannot_carry_a_token_is_refused_and_an_integer_array_carries_a_tuple() {
    let (_pg, mut c) = server();
    let fenced = |c: &mut Client, table: &str, token: &str| {
        c.query(format!("CREATE TABLE {table} (r text, token {token})")).unwrap();
        attach(c, table, "r")
    };
    c.query("CREATE DOMAIN money_token AS numeric(10,2); CREATE DOMAIN whole AS numeric(20,0)").unwrap();
    // A numeric's decimal point would be a tuple separator: 7.10 and 7.1 are one
    // number but two tuples. Refused when the trigger is attached.
    for (table, token) in [
        ("numbers", "numeric"),
        ("cents", "numeric(10,2)"),
        ("domained", "money_token"),
        ("floats", "double precision"),
        ("padded", "char(4)"),
        ("texts", "text[]"),
    ] {
        let Err(PgError::Server(e)) = fenced(&mut c, table, token) else { panic!("{token}: attached") };
        assert_eq!(e.code, "42804", "{token}: {}", e.message);
        assert!(e.message.contains("use bigint") && e.message.contains("bigint[] for a tuple"), "{}", e.message);
    }
    // Whole numbers: numeric(20,0) holds every u64, bigint stops below 2^63.
    fenced(&mut c, "wide", "whole").unwrap();
    c.query("INSERT INTO wide VALUES ('wide', 18446744073709551615)").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('wide')").as_deref(), Some("18446744073709551615"));
    // An integer array is a tuple, compared as one.
    fenced(&mut c, "tuples", "bigint[]").unwrap();
    c.query("INSERT INTO tuples VALUES ('t', '{7,10}')").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('t')").as_deref(), Some("7.10"));
    let (code, _, detail) = refused(&mut c, "INSERT INTO tuples VALUES ('t', '{7,9}')");
    assert_eq!((code.as_str(), detail.as_deref()), ("FK001", Some("fencing-highest: 7.10")));
    assert_eq!(refused(&mut c, "INSERT INTO tuples VALUES ('t', '{7,NULL}')").0, "FK004");
    assert_eq!(refused(&mut c, "INSERT INTO tuples VALUES ('t', '{7}')").0, "FK004", "another arity");
    c.query("UPDATE tuples SET token = '{8,0}'").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('t')").as_deref(), Some("8.0"));
    // A fenced column changed to such a type: refused with the ALTER.
    fenced(&mut c, "changed", "bigint").unwrap();
    assert_eq!(refused(&mut c, "ALTER TABLE changed ALTER COLUMN token TYPE numeric").0, "42804");
    // The trigger checks the column at every write too, for a table the event
    // trigger did not see (disabled here by the superuser).
    c.query("ALTER EVENT TRIGGER fencekeeper_check_fence DISABLE").unwrap();
    c.query("ALTER TABLE changed ALTER COLUMN token TYPE numeric").unwrap();
    c.query("ALTER EVENT TRIGGER fencekeeper_check_fence ENABLE").unwrap();
    let (code, message, _) = refused(&mut c, "INSERT INTO changed VALUES ('c', 4)");
    assert!(code == "42804" && message.contains("type numeric"), "{code} {message}");
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('c')"), None);
}

#[test]
fn a_resource_expression_is_evaluated_over_the_row_and_follows_the_table_s_columns() {
    let (_pg, mut c) = server();
    c.query(
        "CREATE TABLE invoices (customer int, token text);
         CREATE TRIGGER fenced BEFORE INSERT ON invoices
             FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('''invoice/'' || customer', 'token')",
    )
    .unwrap();
    c.query("INSERT INTO invoices VALUES (7, '5'), (8, '2')").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('invoice/7')").as_deref(), Some("5"));
    assert_eq!(refused(&mut c, "INSERT INTO invoices VALUES (7, '4')").0, "FK001");
    assert_eq!(refused(&mut c, "INSERT INTO invoices VALUES (NULL, '4')").0, "FK004", "a NULL resource");
    // A column added before the used ones: the kept plan is made again.
    c.query("ALTER TABLE invoices ADD COLUMN note text").unwrap();
    c.query("INSERT INTO invoices VALUES (9, '1', 'x')").unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('invoice/9')").as_deref(), Some("1"));
    // An expression that fails is the expression's own error.
    c.query("CREATE TABLE broken (n int, token text)").unwrap();
    c.query("CREATE TRIGGER fenced BEFORE INSERT ON broken FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('(1 / n)::text', 'token')")
        .unwrap();
    assert_eq!(refused(&mut c, "INSERT INTO broken VALUES (0, '1')").0, "22012");
    c.query("INSERT INTO broken VALUES (1, '1')").unwrap();
}

#[test]
fn only_the_extension_writes_the_marks_and_a_client_role_is_fenced_like_any_other() {
    let (pg, mut admin) = server();
    admin
        .query(
            "CREATE ROLE app LOGIN;
             CREATE TABLE rows (r text, t text);
             CREATE TRIGGER fenced BEFORE INSERT ON rows FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('r', 't');
             GRANT INSERT, SELECT ON rows TO app",
        )
        .unwrap();
    let mut app = Client::connect(pg.addr, "app", "postgres").unwrap();
    app.query("INSERT INTO rows VALUES ('x', '9')").unwrap();
    assert_eq!(value(&mut app, "SELECT fencekeeper.admit('x', '10')").as_deref(), Some("t"));
    assert_eq!(value(&mut app, "SELECT fencekeeper.mark('x')").as_deref(), Some("10"));
    for sql in [
        "UPDATE fencekeeper.marks SET record = 'fk2 1 00000000'",
        "DELETE FROM fencekeeper.marks",
        "SELECT * FROM fencekeeper.marks",
        "DELETE FROM fencekeeper.audit",
    ] {
        assert_eq!(refused(&mut app, sql).0, "42501", "{sql}");
    }
    assert_eq!(refused(&mut app, "SET fencekeeper.strict = off").0, "42501", "the policy is the superuser's");
    assert_eq!(refused(&mut app, "SET fencekeeper.guest = '/tmp/mine.wasm'").0, "42501");
    // An operator of the client's, first on its search_path, cannot redirect the
    // extension's statements (they name pg_catalog's): here `=` would match any row.
    admin.query("GRANT CREATE ON DATABASE postgres TO app").unwrap();
    app.query(
        "CREATE SCHEMA mine;
         CREATE FUNCTION mine.eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         CREATE OPERATOR mine.= (leftarg = text, rightarg = text, function = mine.eq);
         SET search_path = mine, pg_catalog",
    )
    .unwrap();
    assert_eq!(refused(&mut app, "INSERT INTO public.rows VALUES ('x', '9')").0, "FK001");
    assert_eq!(value(&mut app, "SELECT fencekeeper.admit('y', '3')").as_deref(), Some("t"));
    let audit_user =
        value(&mut admin, "SELECT entry->>'user' FROM fencekeeper.audit WHERE resource = 'x' ORDER BY id DESC");
    assert_eq!(audit_user.as_deref(), Some("app"), "the audit names the session's user");
    // The attach check runs for the client's own tables too, under its search_path.
    app.query("CREATE TABLE mine.t (r text, t numeric)").unwrap();
    let attach = "CREATE TRIGGER f BEFORE INSERT ON mine.t FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('r', 't')";
    assert_eq!(refused(&mut app, attach).0, "42804");
    app.query("ALTER TABLE mine.t ALTER COLUMN t TYPE bigint").unwrap();
    app.query(attach).unwrap();
}

#[test]
fn pg_dump_keeps_the_marks_and_the_audit() {
    let (pg, mut c) = server();
    c.query("SELECT fencekeeper.admit('orders/2026-11.csv', '34')").unwrap();
    let dump = Command::new("/usr/lib/postgresql/15/bin/pg_dump")
        .args(["-h", "127.0.0.1", "-p", &pg.addr.port().to_string(), "-U", USER, "postgres"])
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    let dump = String::from_utf8(dump.stdout).unwrap();
    assert!(dump.contains("orders/2026-11.csv\tfk2 34 "), "the marks are in the dump");
    assert!(dump.contains("\"host\":\"postgres\""), "the audit is in the dump");
}

/// The thread count and the caught-signal mask (`SigCgt`) of a process.
fn threads_and_signals(pid: u32) -> (usize, String) {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let caught = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).unwrap().trim().to_owned();
    (threads, caught)
}

#[test]
fn a_backend_running_the_guest_starts_no_thread_and_installs_no_signal_handler() {
    let pg = Postgres::with_extension(&[]).unwrap();
    let mut c = pg.connect("postgres").unwrap();
    let before = threads_and_signals(c.backend_pid);
    assert_eq!(before.0, 1, "a backend is one thread");
    // The first call loads the library, compiles the guest and runs the vectors.
    c.query("SELECT fencekeeper.admit('r', '1'); SELECT fencekeeper.admit('r', 'x')").unwrap_or_default();
    c.query("SELECT fencekeeper.admit('r', '2')").unwrap();
    assert_eq!(threads_and_signals(c.backend_pid), before, "threads and caught signals after the guest ran");
    // The same with the guest compiled in the postmaster and inherited.
    let preloaded = Postgres::with_extension(&["shared_preload_libraries=fencekeeper"]).unwrap();
    let postmaster = threads_and_signals(preloaded.process.child.id());
    assert_eq!(postmaster, threads_and_signals(pg.process.child.id()), "the postmaster's own handlers only");
    let mut c = preloaded.connect("postgres").unwrap();
    let before = threads_and_signals(c.backend_pid);
    c.query("SELECT fencekeeper.admit('r', '1')").unwrap();
    assert_eq!(threads_and_signals(c.backend_pid), before);
    assert_eq!(before.0, 1);
}
