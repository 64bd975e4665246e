//! The Redis module's commands against a real redis-server that loads it
//! (`--loadmodule target/release/libfencekeeper_redis.so`): fenced writes, their
//! errors, what they may write, and how they behave in MULTI/EXEC, in Lua scripts,
//! under WATCH and under ACLs. Hostile input and guests: `redis_module_hostile.rs`.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::redis::Redis;
use fencekeeper_harness::resp::{Client, Reply};

fn ok() -> Reply {
    Reply::Status("OK".into())
}

fn bulk(text: &str) -> Reply {
    Reply::Bulk(Some(text.as_bytes().to_vec()))
}

fn module() -> (Redis, Client) {
    let redis = Redis::with_module(&[], &["--save", "", "--appendonly", "no"]).unwrap();
    let client = redis.client().unwrap();
    (redis, client)
}

/// The error of `reply`, failing the test when it is not one.
fn error(reply: Reply) -> String {
    match reply {
        Reply::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn a_stale_write_is_refused_with_the_mark_and_the_newer_value_is_kept() {
    let (_redis, mut c) = module();
    assert_eq!(c.cmd(&["FENCE.SET", "orders", "fence:orders", "33", "A's import"]).unwrap(), ok());
    assert_eq!(c.cmd(&["FENCE.SET", "orders", "fence:orders", "34", "B's import"]).unwrap(), ok());
    let stale = error(c.cmd(&["FENCE.SET", "orders", "fence:orders", "33", "A's late write"]).unwrap());
    assert!(
        stale.starts_with("STALE 34 stale fencing token 33 for \"fence:orders\": the resource has seen token 34"),
        "{stale}"
    );
    assert_eq!(c.cmd(&["GET", "orders"]).unwrap(), bulk("B's import"));
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:orders"]).unwrap(), bulk("34"));
    // Redis counts errors by their first word: refusals per class, for free.
    let errors = c.cmd(&["INFO", "errorstats"]).unwrap().text().unwrap();
    assert!(errors.contains("errorstat_STALE:count=1"), "{errors}");
    assert_eq!(c.cmd(&["TYPE", "fence:orders"]).unwrap(), Reply::Status("fencemark".into()));
    // The holder writing again is admitted, options go to SET, SET answers.
    assert_eq!(
        c.cmd(&["FENCE.SET", "orders", "fence:orders", "34", "again", "PX", "60000", "GET"]).unwrap(),
        bulk("B's import")
    );
    assert!(matches!(c.cmd(&["PTTL", "orders"]).unwrap(), Reply::Integer(t) if t > 0));
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:nothing"]).unwrap(), Reply::Bulk(None));
}

#[test]
fn fence_call_fences_any_write_and_answers_with_its_reply() {
    let (_redis, mut c) = module();
    assert_eq!(
        c.cmd(&["FENCE.CALL", "fence:o7", "5", "HSET", "order:7", "state", "new", "qty", "2"]).unwrap(),
        Reply::Integer(2)
    );
    assert_eq!(c.cmd(&["FENCE.CALL", "fence:o7", "6", "HINCRBY", "order:7", "qty", "3"]).unwrap(), Reply::Integer(5));
    assert_eq!(c.cmd(&["FENCE.CALL", "fence:o7", "6", "RPUSH", "log:7", "a", "b"]).unwrap(), Reply::Integer(2));
    let stale = error(c.cmd(&["FENCE.CALL", "fence:o7", "5", "DEL", "order:7"]).unwrap());
    assert!(stale.starts_with("STALE 6 "), "{stale}");
    assert_eq!(c.cmd(&["EXISTS", "order:7"]).unwrap(), Reply::Integer(1));
    assert_eq!(c.cmd(&["FENCE.CALL", "fence:o7", "7", "DEL", "order:7", "log:7"]).unwrap(), Reply::Integer(2));
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:o7"]).unwrap(), bulk("7"));
    // Tuple tokens: (epoch, sequence); the first admit fixes the arity.
    assert_eq!(c.cmd(&["FENCE.SET", "j", "fence:journal", "7.1042", "x"]).unwrap(), ok());
    assert_eq!(c.cmd(&["FENCE.SET", "j", "fence:journal", "8.1", "y"]).unwrap(), ok());
    assert!(error(c.cmd(&["FENCE.SET", "j", "fence:journal", "7.9999", "z"]).unwrap()).starts_with("STALE 8.1 "));
    assert!(error(c.cmd(&["FENCE.SET", "j", "fence:journal", "9", "z"]).unwrap()).starts_with("MALFORMED "));
}

#[test]
fn a_write_that_fails_advances_no_mark() {
    let (_redis, mut c) = module();
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "10", "v"]).unwrap(), ok());
    let syntax = error(c.cmd(&["FENCE.SET", "k", "fence:r", "11", "v", "BOGUS"]).unwrap());
    assert!(syntax.starts_with("ERR syntax error"), "{syntax}");
    let wrongtype = error(c.cmd(&["FENCE.CALL", "fence:r", "12", "HSET", "k", "f", "v"]).unwrap());
    assert!(wrongtype.starts_with("WRONGTYPE"), "{wrongtype}");
    let not_a_number = error(c.cmd(&["FENCE.CALL", "fence:r", "13", "INCR", "k"]).unwrap());
    assert!(not_a_number.contains("not an integer"), "{not_a_number}");
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:r"]).unwrap(), bulk("10"), "no failed write moved the mark");
    // SET NX that sets nothing did run: the admitted holder's mark advances.
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "14", "w", "NX"]).unwrap(), Reply::Bulk(None));
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:r"]).unwrap(), bulk("14"));
}

#[test]
fn fence_call_runs_only_writes_to_keys_that_are_not_marks() {
    let (_redis, mut c) = module();
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "20", "v"]).unwrap(), ok());
    assert_eq!(c.cmd(&["FENCE.SET", "k2", "fence:other", "3", "v"]).unwrap(), ok());
    let refused = [
        (&["FLUSHALL"][..], "\"FLUSHALL\" names no key"),
        (&["SWAPDB", "0", "1"], "\"SWAPDB\" names no key"),
        (&["PUBLISH", "chan", "m"], "\"PUBLISH\" does not write"),
        (&["GET", "k"], "\"GET\" does not write"),
        (&["MULTI"], "\"MULTI\" does not write"),
        (&["EVAL", "return redis.call('DEL', KEYS[1])", "1", "k"], "\"EVAL\" does not write"),
        (&["FENCE.SET", "k", "fence:r", "21", "v"], "FENCE.CALL runs Redis's own writes"),
        (&["fence.call", "fence:r", "21", "DEL", "k"], "FENCE.CALL runs Redis's own writes"),
        (&["NOSUCHCOMMAND", "k"], "unknown command \"NOSUCHCOMMAND\""),
        (&["SET", "k"], "wrong number of arguments for \"SET\""),
        (&["SET", "fence:r", "x"], "is the resource's mark"),
        (&["DEL", "fence:other"], "key \"fence:other\" holds a fencing mark"),
        (&["RENAME", "k", "fence:other"], "key \"fence:other\" holds a fencing mark"),
    ];
    for (command, expected) in refused {
        let mut args = vec!["FENCE.CALL", "fence:r", "21"];
        args.extend_from_slice(command);
        let e = error(c.cmd(&args).unwrap());
        assert!(e.starts_with("ERR ") && e.contains(expected), "{command:?}: {e}");
    }
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:r"]).unwrap(), bulk("20"), "no refused call moved the mark");
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:other"]).unwrap(), bulk("3"));
    assert_eq!(c.cmd(&["GET", "k"]).unwrap(), bulk("v"));
    let own = error(c.cmd(&["FENCE.SET", "fence:r", "fence:r", "22", "v"]).unwrap());
    assert!(own.contains("is the resource's mark"), "{own}");
}

#[test]
fn the_keys_of_each_command_are_declared_for_cluster_routing_and_acls() {
    let (_redis, mut c) = module();
    let keys = |c: &mut Client, args: &[&str]| -> Vec<String> {
        let mut all = vec!["COMMAND", "GETKEYS"];
        all.extend_from_slice(args);
        match c.cmd(&all).unwrap() {
            Reply::Array(Some(keys)) => keys.iter().map(|k| k.text().unwrap()).collect(),
            other => panic!("{args:?}: {other:?}"),
        }
    };
    assert_eq!(keys(&mut c, &["FENCE.SET", "k", "fence:r", "1", "v"]), ["k", "fence:r"]);
    assert_eq!(keys(&mut c, &["FENCE.CALL", "fence:r", "1", "MSET", "a", "1", "b", "2"]), ["fence:r", "a", "b"]);
    assert_eq!(keys(&mut c, &["FENCE.CALL", "fence:r", "1", "XADD", "s", "*", "f", "v"]), ["fence:r", "s"]);
    assert_eq!(keys(&mut c, &["FENCE.MARK", "fence:r"]), ["fence:r"]);
}

#[test]
fn fence_call_runs_as_the_client_and_fence_set_by_its_own_permission() {
    let (redis, mut admin) = module();
    let user =
        ["ACL", "SETUSER", "writer", "on", ">pw", "~*", "+fence.set", "+fence.call", "+fence.mark", "+get", "+hset"];
    assert_eq!(admin.cmd(&user).unwrap(), ok());
    let mut writer = redis.client().unwrap();
    assert_eq!(writer.cmd(&["AUTH", "writer", "pw"]).unwrap(), ok());
    // Writes only through the fence: SET itself is denied, FENCE.SET allowed.
    assert!(error(writer.cmd(&["SET", "k", "v"]).unwrap()).starts_with("NOPERM"));
    assert_eq!(writer.cmd(&["FENCE.SET", "k", "fence:r", "1", "v"]).unwrap(), ok());
    assert_eq!(writer.cmd(&["FENCE.CALL", "fence:r", "1", "HSET", "h", "f", "v"]).unwrap(), Reply::Integer(1));
    let denied = error(writer.cmd(&["FENCE.CALL", "fence:r", "2", "DEL", "k"]).unwrap());
    assert!(denied.contains("acl verification failed"), "{denied}");
    assert_eq!(writer.cmd(&["FENCE.MARK", "fence:r"]).unwrap(), bulk("1"), "a denied call advances nothing");
}

#[test]
fn an_acl_selector_keeps_marks_out_of_reach_of_every_command_but_the_fence() {
    let (redis, mut admin) = module();
    // The root selector: data keys only. A second selector: the fence's commands,
    // over data and marks together (a fenced write names both).
    let user = [
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">pw",
        "~data:*",
        "+@read",
        "+@write",
        "(~data:* ~fence:* +fence.set +fence.call +fence.mark)",
    ];
    assert_eq!(admin.cmd(&user).unwrap(), ok());
    let mut app = redis.client().unwrap();
    assert_eq!(app.cmd(&["AUTH", "app", "pw"]).unwrap(), ok());
    assert_eq!(app.cmd(&["FENCE.SET", "data:k", "fence:r", "1", "v"]).unwrap(), ok());
    assert_eq!(app.cmd(&["FENCE.CALL", "fence:r", "2", "DEL", "data:k"]).unwrap(), Reply::Integer(1));
    for forget in [
        &["DEL", "fence:r"][..],
        &["SET", "fence:r", "x"],
        &["RENAME", "fence:r", "data:m"],
        &["EXPIRE", "fence:r", "1"],
    ] {
        let e = error(app.cmd(forget).unwrap());
        assert!(e.starts_with("NOPERM"), "{forget:?}: {e}");
    }
    assert_eq!(app.cmd(&["FENCE.MARK", "fence:r"]).unwrap(), bulk("2"));
}

#[test]
fn multi_exec_runs_fenced_writes_in_order_and_a_stale_one_fails_alone() {
    let (_redis, mut c) = module();
    assert_eq!(c.cmd(&["MULTI"]).unwrap(), ok());
    for (token, value) in [("60", "first"), ("59", "stale"), ("61", "last")] {
        assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", token, value]).unwrap(), Reply::Status("QUEUED".into()));
    }
    let Reply::Array(Some(results)) = c.cmd(&["EXEC"]).unwrap() else { panic!("EXEC") };
    assert_eq!(results[0], ok());
    assert!(results[1].error().is_some_and(|e| e.starts_with("STALE 60 ")), "{:?}", results[1]);
    assert_eq!(results[2], ok());
    assert_eq!(c.cmd(&["GET", "k"]).unwrap(), bulk("last"));
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:r"]).unwrap(), bulk("61"));
}

#[test]
fn a_lua_script_sees_the_refusal_and_writes_nothing_after_it() {
    let (_redis, mut c) = module();
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "70", "v"]).unwrap(), ok());
    // redis.call raises: the script stops before its next write.
    let script = "redis.call('FENCE.SET', KEYS[1], KEYS[2], ARGV[1], 'x'); return redis.call('SET', KEYS[3], 'after')";
    let e = error(c.cmd(&["EVAL", script, "3", "k", "fence:r", "k2", "69"]).unwrap());
    assert!(e.contains("STALE 70"), "{e}");
    assert_eq!(c.cmd(&["EXISTS", "k2"]).unwrap(), Reply::Integer(0));
    assert_eq!(c.cmd(&["EVAL", script, "3", "k", "fence:r", "k2", "71"]).unwrap(), ok());
    assert_eq!(c.cmd(&["GET", "k"]).unwrap(), bulk("x"));
    // FENCE.CALL runs inside a script too (here its first call: it looks HSET up).
    let call = "return redis.call('FENCE.CALL', KEYS[2], ARGV[1], 'HSET', KEYS[1], 'f', 'v')";
    assert_eq!(c.cmd(&["EVAL", call, "2", "h", "fence:r", "71"]).unwrap(), Reply::Integer(1));
    // redis.pcall hands the script the error, prefix and mark included.
    let pcall = "local r = redis.pcall('FENCE.SET', KEYS[1], KEYS[2], ARGV[1], 'y'); return r['err']";
    let answered = c.cmd(&["EVAL", pcall, "2", "k", "fence:r", "3"]).unwrap().text().unwrap();
    assert!(answered.starts_with("STALE 71 "), "{answered}");
}

#[test]
fn an_advance_aborts_a_transaction_watching_the_mark() {
    let (redis, mut watcher) = module();
    let mut holder = redis.client().unwrap();
    assert_eq!(holder.cmd(&["FENCE.SET", "k", "fence:r", "1", "v"]).unwrap(), ok());
    assert_eq!(watcher.cmd(&["WATCH", "fence:r"]).unwrap(), ok());
    assert_eq!(holder.cmd(&["FENCE.SET", "k", "fence:r", "1", "same token: no advance"]).unwrap(), ok());
    assert_eq!(watcher.cmd(&["MULTI"]).unwrap(), ok());
    assert_eq!(watcher.cmd(&["GET", "k"]).unwrap(), Reply::Status("QUEUED".into()));
    assert!(matches!(watcher.cmd(&["EXEC"]).unwrap(), Reply::Array(Some(_))), "an unchanged mark is no change");
    assert_eq!(watcher.cmd(&["WATCH", "fence:r"]).unwrap(), ok());
    assert_eq!(holder.cmd(&["FENCE.SET", "k", "fence:r", "2", "v"]).unwrap(), ok());
    assert_eq!(watcher.cmd(&["MULTI"]).unwrap(), ok());
    assert_eq!(watcher.cmd(&["GET", "k"]).unwrap(), Reply::Status("QUEUED".into()));
    assert_eq!(watcher.cmd(&["EXEC"]).unwrap(), Reply::Array(None), "the advance touched the watched mark");
}

#[test]
fn an_empty_token_replayed_and_raise_from_a_client_are_refused() {
    let redis = Redis::with_module(&["strict", "yes"], &["--save", "", "--appendonly", "no"]).unwrap();
    let mut c = redis.client().unwrap();
    // An empty token is malformed, as in every host (tests/contract/tokens.json); a
    // command without its token argument is short of its arity.
    let empty = error(c.cmd(&["FENCE.SET", "k", "fence:r", "", "v"]).unwrap());
    assert!(empty.starts_with("MALFORMED malformed request: fencing token is empty"), "{empty}");
    let short = error(c.cmd(&["FENCE.SET", "k", "fence:r", "v"]).unwrap());
    assert!(short.starts_with("ERR wrong number of arguments"), "{short}");
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "34", "v"]).unwrap(), ok());
    let replayed = error(c.cmd(&["FENCE.SET", "k", "fence:r", "34", "again"]).unwrap());
    assert!(replayed.starts_with("REPLAYED 34 replayed fencing token 34"), "{replayed}");
    let raise = error(c.cmd(&["FENCE.RAISE", "fence:r", "fk2 99 00000000"]).unwrap());
    assert!(raise.starts_with("ERR FENCE.RAISE is how replication and the AOF apply an advance"), "{raise}");
    assert_eq!(c.cmd(&["FENCE.MARK", "fence:r"]).unwrap(), bulk("34"));
    assert_eq!(c.cmd(&["GET", "k"]).unwrap(), bulk("v"));
}

#[test]
fn an_advance_is_a_keyspace_event_of_the_module() {
    let (redis, mut c) = module();
    assert_eq!(c.cmd(&["CONFIG", "SET", "notify-keyspace-events", "Kd"]).unwrap(), ok());
    let mut listener = redis.client().unwrap();
    let subscribed = listener.cmd(&["SUBSCRIBE", "__keyspace@0__:fence:r"]).unwrap();
    assert!(matches!(subscribed, Reply::Array(Some(_))), "{subscribed:?}");
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "1", "v"]).unwrap(), ok());
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "1", "again: no advance"]).unwrap(), ok());
    assert_eq!(c.cmd(&["FENCE.SET", "k", "fence:r", "2", "v"]).unwrap(), ok());
    for _ in 0..2 {
        let event = listener.receive().unwrap();
        let expected = ["message", "__keyspace@0__:fence:r", "fence.advance"].map(bulk).to_vec();
        assert_eq!(event, Reply::Array(Some(expected)));
    }
}
