//! Tokens from Consul, by values only: Consul does not install on these machines, so
//! nothing here talks to a live Consul (docs/tokens.md says so). The KV entries below
//! are written by hand in the shape Consul's HTTP API documents for `GET /v1/kv/KEY`
//! (`CreateIndex`, `ModifyIndex`, `LockIndex`, `Session`); the indexes follow Consul's
//! documented rules: an acquire bumps `LockIndex` and `ModifyIndex`, a session
//! invalidated with the `release` behavior bumps `ModifyIndex`, one with the `delete`
//! behavior deletes the key, and a key made again starts over at `LockIndex` 1.
//!
//! The token is the lock key's `ModifyIndex` read (consistently) right after the
//! acquire, while `Session` is ours: a Raft index, which only grows. The bundled guard
//! admits the holders' tokens in order and refuses a paused holder's; `LockIndex`, the
//! count of acquisitions of one key, would refuse the newest holder once the key was
//! deleted and made again.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper::{Class, Guard, MemoryStore, Mode, Policy, Validator};
use serde_json::Value;
use std::sync::Arc;

/// What holders read back, in order: each `GET /v1/kv/locks/orders?consistent` right
/// after its acquire succeeded.
const ACQUISITIONS: [(&str, &str); 3] = [
    (
        "session-1",
        r#"[{"CreateIndex":118,"ModifyIndex":120,"LockIndex":1,"Key":"locks/orders","Flags":0,"Value":null,"Session":"session-1"}]"#,
    ),
    // session-1 was invalidated (behavior release: ModifyIndex 131), then session-2 acquired.
    (
        "session-2",
        r#"[{"CreateIndex":118,"ModifyIndex":140,"LockIndex":2,"Key":"locks/orders","Flags":0,"Value":null,"Session":"session-2"}]"#,
    ),
    // session-2 had behavior delete: invalidated, the key went; session-3 made it again.
    (
        "session-3",
        r#"[{"CreateIndex":175,"ModifyIndex":175,"LockIndex":1,"Key":"locks/orders","Flags":0,"Value":null,"Session":"session-3"}]"#,
    ),
];

/// The fencing token of a KV read: the key's ModifyIndex, if `session` holds it.
fn token(read: &str, session: &str) -> Option<String> {
    let entries: Value = serde_json::from_str(read).unwrap();
    let entry = entries.get(0)?;
    (entry.get("Session")?.as_str()? == session).then(|| entry.get("ModifyIndex")?.as_u64().map(|i| i.to_string()))?
}

fn guard() -> Guard {
    let validator = Validator::bundled(Policy { mode: Mode::Correctness, strict: false }).unwrap();
    Guard::new(Arc::new(validator), Arc::new(MemoryStore::new()))
}

#[test]
fn consul_modify_index_at_acquisition_orders_holders_across_a_deleted_key() {
    let guard = guard();
    let tokens: Vec<String> = ACQUISITIONS.iter().map(|(session, read)| token(read, session).unwrap()).collect();
    assert_eq!(tokens, ["120", "140", "175"]);
    for (i, token) in tokens.iter().enumerate() {
        assert!(guard.admit("orders", Some(token)).admitted(), "holder {} with {token}", i + 1);
        if i > 0 {
            // The holder before, paused through the change of holder, writes late.
            let late = guard.admit("orders", Some(&tokens[i - 1]));
            assert_eq!(late.class(), Class::Stale, "holder {}'s late write with {}", i, tokens[i - 1]);
        }
    }
}

#[test]
fn lock_index_would_refuse_the_newest_holder_once_the_key_was_made_again() {
    let guard = guard();
    let lock_index = |read: &str| {
        let entries: Value = serde_json::from_str(read).unwrap();
        entries[0]["LockIndex"].as_u64().unwrap().to_string()
    };
    assert!(guard.admit("orders", Some(&lock_index(ACQUISITIONS[0].1))).admitted());
    assert!(guard.admit("orders", Some(&lock_index(ACQUISITIONS[1].1))).admitted());
    let newest = guard.admit("orders", Some(&lock_index(ACQUISITIONS[2].1)));
    assert_eq!(newest.class(), Class::Stale, "LockIndex started over at 1 with the new key");
}

#[test]
fn a_read_that_another_session_holds_gives_no_token() {
    assert_eq!(token(ACQUISITIONS[1].1, "session-1"), None);
    let released =
        r#"[{"CreateIndex":118,"ModifyIndex":131,"LockIndex":1,"Key":"locks/orders","Flags":0,"Value":null}]"#;
    assert_eq!(token(released, "session-1"), None);
}

/// Consul's indexes are uint64 JSON numbers; above 2^53 a client that reads numbers
/// as doubles (JavaScript's) would round them, and two holders could share a token.
#[test]
fn indexes_beyond_double_precision_keep_every_digit() {
    let read = r#"[{"ModifyIndex":9007199254740993,"LockIndex":7,"Key":"k","Session":"s"}]"#;
    assert_eq!(token(read, "s").as_deref(), Some("9007199254740993"));
    let max = format!(r#"[{{"ModifyIndex":{},"Session":"s"}}]"#, u64::MAX);
    let text = token(&max, "s").unwrap();
    assert!(guard().admit("k", Some(&text)).admitted(), "u64::MAX is a token");
}
