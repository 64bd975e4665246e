//! No write through the `fencekeeper.fence` trigger is admitted without a token its
//! writer presented (issue 41): an UPDATE presents the token column only when it
//! sets it, else the setting `fencekeeper.token`; a DELETE only the setting; a
//! token column the table fills itself (DEFAULT, identity, generated) is refused.
//! Against a real PostgreSQL 15, as the other `postgres_*` modules.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::postgres_extension::{attach, refused, server, value};
use fencekeeper_harness::pg_wire::{Client, PgError};

/// A fenced `orders` table whose row 1 the holder of 40 wrote and the newest
/// holder, 41, then updated: mark 41, the row `amount 200, token 41`.
fn orders(c: &mut Client) {
    c.query("CREATE TABLE orders (account text, id int PRIMARY KEY, amount int, token bigint)").unwrap();
    attach(c, "orders", "account").unwrap();
    c.query(
        "INSERT INTO orders VALUES ('acme', 1, 100, 40), ('acme', 2, 100, 40);
         UPDATE orders SET amount = 200, token = 41 WHERE id = 1",
    )
    .unwrap();
}

/// Row `id` as `amount:token`.
fn row(c: &mut Client, id: u32) -> String {
    value(c, &format!("SELECT amount || ':' || token FROM orders WHERE id = {id}")).unwrap_or_default()
}

#[test]
fn a_stale_holder_s_update_that_leaves_the_token_column_is_refused_as_missing() {
    let (_pg, mut c) = server();
    orders(&mut c);
    // The hole: the row holds 41, the newest holder's token; the stale holder sends none.
    let (code, message, _) = refused(&mut c, "UPDATE orders SET amount = 0 WHERE id = 1");
    assert_eq!(code, "FK003", "{message}");
    assert!(message.contains("\"token\"") && message.contains("SET LOCAL fencekeeper.token"), "{message}");
    assert_eq!(row(&mut c, 1), "200:41", "the row is unchanged");
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('acme')").as_deref(), Some("41"));
    // Setting another column to itself, or a row still at the old token: the same.
    assert_eq!(refused(&mut c, "UPDATE orders SET amount = amount WHERE id = 1").0, "FK003");
    assert_eq!(refused(&mut c, "UPDATE orders SET amount = 0 WHERE id = 2").0, "FK003", "not FK001: no token was sent");
    // INSERT ... ON CONFLICT DO UPDATE: the proposed row is an INSERT (its token
    // admitted), the change of the existing row an UPDATE that must set the column.
    let upsert = "INSERT INTO orders VALUES ('acme', 1, 0, 41) ON CONFLICT (id) DO UPDATE SET amount = excluded.amount";
    assert_eq!(refused(&mut c, upsert).0, "FK003");
    assert_eq!(row(&mut c, 1), "200:41");
    c.query(format!("{upsert}, token = excluded.token")).unwrap();
    assert_eq!(row(&mut c, 1), "0:41");
}

#[test]
fn setting_the_token_column_to_the_value_it_had_presents_that_token() {
    let (_pg, mut c) = server();
    orders(&mut c);
    // A stale holder that copies the newest holder's token presents it: the fence
    // checks order, not identity, as in every host.
    c.query("UPDATE orders SET amount = 0, token = 41 WHERE id = 1").unwrap();
    assert_eq!(row(&mut c, 1), "0:41");
    c.query("UPDATE orders SET amount = 1, token = token WHERE id = 1").unwrap();
    assert_eq!(row(&mut c, 1), "1:41", "naming the column presents its value, whatever the expression");
    c.query("SET fencekeeper.strict = on").unwrap();
    let (code, _, detail) = refused(&mut c, "UPDATE orders SET amount = 2, token = 41 WHERE id = 1");
    assert_eq!((code.as_str(), detail.as_deref()), ("FK002", Some("fencing-highest: 41")), "strict: replayed");
    assert_eq!(row(&mut c, 1), "1:41");
}

#[test]
fn an_update_without_the_column_presents_the_transaction_s_fencekeeper_token() {
    let (_pg, mut c) = server();
    orders(&mut c);
    c.query("BEGIN; SET LOCAL fencekeeper.token = '40'").unwrap();
    let (code, _, detail) = refused(&mut c, "UPDATE orders SET amount = 0 WHERE id = 1");
    assert_eq!((code.as_str(), detail.as_deref()), ("FK001", Some("fencing-highest: 41")));
    c.query("ROLLBACK").unwrap();
    assert_eq!(row(&mut c, 1), "200:41");
    c.query("BEGIN; SET LOCAL fencekeeper.token = '41'; UPDATE orders SET amount = 7 WHERE id = 1; COMMIT").unwrap();
    assert_eq!(row(&mut c, 1), "7:41");
    // A higher token advances the mark; the column keeps what it held.
    c.query("BEGIN; SET LOCAL fencekeeper.token = '42'; UPDATE orders SET amount = 8 WHERE id = 1; COMMIT").unwrap();
    assert_eq!((row(&mut c, 1), value(&mut c, "SELECT fencekeeper.mark('acme')")), ("8:41".into(), Some("42".into())));
    // SET LOCAL ends with its transaction.
    assert_eq!(refused(&mut c, "UPDATE orders SET amount = 9 WHERE id = 1").0, "FK003");
    // An UPDATE that sets the column presents the column, whatever the setting says.
    c.query("BEGIN; SET LOCAL fencekeeper.token = '42'").unwrap();
    assert_eq!(refused(&mut c, "UPDATE orders SET amount = 9, token = 41 WHERE id = 1").0, "FK001");
    c.query("ROLLBACK").unwrap();
    assert_eq!(row(&mut c, 1), "8:41");
    // A row moved to another resource presents the setting for both.
    c.query("BEGIN; SET LOCAL fencekeeper.token = '42'; UPDATE orders SET account = 'new' WHERE id = 1; COMMIT")
        .unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('new')").as_deref(), Some("42"));
}

#[test]
fn a_delete_presents_only_the_setting_and_is_judged_by_it() {
    let (_pg, mut c) = server();
    orders(&mut c);
    let (code, message, _) = refused(&mut c, "DELETE FROM orders WHERE id = 1");
    assert!(code == "FK003" && message.contains("fencekeeper.token"), "{code} {message}");
    c.query("BEGIN; SET LOCAL fencekeeper.token = '40'").unwrap();
    let (code, _, detail) = refused(&mut c, "DELETE FROM orders WHERE id = 1");
    assert_eq!((code.as_str(), detail.as_deref()), ("FK001", Some("fencing-highest: 41")));
    c.query("ROLLBACK").unwrap();
    assert_eq!(value(&mut c, "SELECT count(*) FROM orders").as_deref(), Some("2"));
    c.query("BEGIN; SET LOCAL fencekeeper.token = '41'; DELETE FROM orders WHERE id = 1; COMMIT").unwrap();
    assert_eq!(value(&mut c, "SELECT string_agg(id::text, ',') FROM orders").as_deref(), Some("2"));
    // The row's token is not the writer's: one at 41 still needs the setting.
    c.query("BEGIN; SET LOCAL fencekeeper.token = '41'; UPDATE orders SET token = 41 WHERE id = 2; COMMIT").unwrap();
    assert_eq!(refused(&mut c, "DELETE FROM orders WHERE id = 2").0, "FK003");
}

#[test]
fn a_token_column_the_table_fills_itself_is_refused_so_an_insert_cannot_leave_it_out() {
    let (_pg, mut c) = server();
    c.query("CREATE DOMAIN defaulted AS bigint DEFAULT 7; CREATE SEQUENCE counter").unwrap();
    for (table, token) in [
        ("constant", "bigint DEFAULT 0"),
        ("counted", "bigint DEFAULT nextval('counter')"),
        ("identity", "bigint GENERATED ALWAYS AS IDENTITY"),
        ("generated", "bigint GENERATED ALWAYS AS (line + 100) STORED"),
        ("domain", "defaulted"),
    ] {
        c.query(format!("CREATE TABLE {table} (batch text, line int, token {token})")).unwrap();
        let Err(PgError::Server(e)) = attach(&mut c, table, "batch") else {
            panic!("{table}: the trigger was attached")
        };
        assert_eq!(e.code, "55000", "{table}: {}", e.message);
        assert!(e.message.contains("token its writer never sent") && e.message.contains("DROP DEFAULT"), "{e:?}");
        c.query(format!("INSERT INTO {table} (batch, line) VALUES ('b', 1)")).unwrap();
        assert_eq!(value(&mut c, "SELECT fencekeeper.mark('b')"), None, "{table}: no trigger, no mark");
    }
    // A default added to a fenced table's token column is refused with the ALTER.
    c.query("CREATE TABLE plain (batch text, line int, token bigint)").unwrap();
    attach(&mut c, "plain", "batch").unwrap();
    assert_eq!(refused(&mut c, "ALTER TABLE plain ALTER COLUMN token SET DEFAULT 0").0, "55000");
    // Without one, an INSERT that leaves the column out sends NULL: missing.
    let (code, message, _) = refused(&mut c, "INSERT INTO plain (batch, line) VALUES ('b', 2)");
    assert!(code == "FK003" && message.contains("the column \"token\" is NULL"), "{code} {message}");
    // A domain's default names no table; the trigger checks the column at every
    // write, and refuses even an INSERT that sends its token: the table is wrong.
    c.query("CREATE DOMAIN later AS bigint; CREATE TABLE typed (batch text, line int, token later)").unwrap();
    attach(&mut c, "typed", "batch").unwrap();
    c.query("INSERT INTO typed VALUES ('b', 1, 5); ALTER DOMAIN later SET DEFAULT 99").unwrap();
    assert_eq!(refused(&mut c, "INSERT INTO typed (batch, line) VALUES ('b', 2)").0, "55000");
    assert_eq!(refused(&mut c, "INSERT INTO typed VALUES ('b', 2, 6)").0, "55000");
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('b')").as_deref(), Some("5"));
}

#[test]
fn a_partition_whose_columns_are_in_another_order_knows_which_column_an_update_sets() {
    let (_pg, mut c) = server();
    c.query(
        "CREATE TABLE orders (account text, id int, amount int, token bigint) PARTITION BY LIST (account);
         CREATE TABLE orders_acme (filler int, token bigint, amount int, id int, account text);
         ALTER TABLE orders_acme DROP COLUMN filler;
         ALTER TABLE orders ATTACH PARTITION orders_acme FOR VALUES IN ('acme')",
    )
    .unwrap();
    attach(&mut c, "orders", "account").unwrap();
    c.query("INSERT INTO orders VALUES ('acme', 1, 100, 41)").unwrap();
    assert_eq!(refused(&mut c, "UPDATE orders SET amount = 0 WHERE id = 1").0, "FK003");
    assert_eq!(refused(&mut c, "UPDATE orders SET amount = 0, token = 40 WHERE id = 1").0, "FK001");
    c.query("UPDATE orders SET amount = 0, token = 42 WHERE id = 1").unwrap();
    assert_eq!(row(&mut c, 1), "0:42");
    // A row moved to another partition is, to PostgreSQL, a DELETE from the old one
    // (its BEFORE DELETE trigger fires) and an INSERT into the new: the DELETE
    // presents the setting only, so such an UPDATE needs it.
    c.query("CREATE TABLE orders_other PARTITION OF orders FOR VALUES IN ('other')").unwrap();
    let (code, message, _) = refused(&mut c, "UPDATE orders SET account = 'other', token = 42 WHERE id = 1");
    assert!(code == "FK003" && message.contains("a DELETE presents"), "{code} {message}");
    c.query(
        "BEGIN; SET LOCAL fencekeeper.token = '42';
         UPDATE orders SET account = 'other', token = 42 WHERE id = 1; COMMIT",
    )
    .unwrap();
    assert_eq!(value(&mut c, "SELECT fencekeeper.mark('other')").as_deref(), Some("42"));
    assert_eq!(value(&mut c, "SELECT account FROM orders_other WHERE id = 1").as_deref(), Some("other"));
}

#[test]
fn a_merge_is_judged_by_the_targets_its_update_actions_name() {
    let (_pg, mut c) = server();
    orders(&mut c);
    let merge = "MERGE INTO orders o USING (SELECT 1 AS id) s ON o.id = s.id WHEN MATCHED THEN";
    assert_eq!(refused(&mut c, &format!("{merge} UPDATE SET amount = 5")).0, "FK003");
    assert_eq!(refused(&mut c, &format!("{merge} DELETE")).0, "FK003");
    c.query(format!("{merge} UPDATE SET amount = 5, token = 41")).unwrap();
    assert_eq!(row(&mut c, 1), "5:41");
    // The documented limit: the statement names its targets once, for all its
    // actions, so a branch that does not set the column counts as setting it.
    let two = "MERGE INTO orders o USING (SELECT 1 AS id) s ON o.id = s.id \
               WHEN MATCHED AND o.amount < 0 THEN UPDATE SET token = 99 WHEN MATCHED THEN UPDATE SET amount = 6";
    c.query(two).unwrap();
    assert_eq!(row(&mut c, 1), "6:41");
}
