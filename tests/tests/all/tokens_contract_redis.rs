//! The token contract (`tests/contract/tokens.json`) against the Redis module: each row
//! is a `FENCE.SET` on a real redis-server that loads the module, one server per
//! policy (`strict` is a load argument). A row without a token sends the command
//! without its token argument: Redis answers the arity error, the table's written
//! exception (no Redis write can present no token). The mark is read back with
//! `FENCE.MARK`.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use anyhow::{bail, Result};
use fencekeeper_harness::redis::Redis;
use fencekeeper_harness::resp::{Client, Reply};
use fencekeeper_harness::token_table::{self, ByPolicy, Host, Table};
use serde_json::Value;

/// The data key every row writes: never a resource of the table.
const DATA: &[u8] = b"tokens:data";

struct Server {
    _redis: Redis,
    client: Client,
}

impl Server {
    fn start(strict: bool) -> Server {
        let args: &[&str] = if strict { &["strict", "yes"] } else { &[] };
        let redis = Redis::with_module(args, &["--save", "", "--appendonly", "no"]).unwrap();
        let client = redis.client().unwrap();
        Server { _redis: redis, client }
    }
}

struct Module(ByPolicy<Server>);

impl Host for Module {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        let mut args: Vec<&[u8]> = vec![b"FENCE.SET", DATA, resource];
        args.extend(token);
        args.push(b"value");
        match self.0.of(strict).client.call(&args)? {
            Reply::Status(s) => Ok(s.into()),
            Reply::Error(e) => Ok(e.split(' ').next().unwrap_or_default().into()),
            other => bail!("FENCE.SET answered {other:?}"),
        }
    }

    fn mark(&mut self, strict: bool, key: &str) -> Result<Option<String>> {
        match self.0.of(strict).client.cmd(&["FENCE.MARK", key])? {
            Reply::Bulk(mark) => Ok(mark.map(|m| String::from_utf8_lossy(&m).into_owned())),
            other => bail!("FENCE.MARK answered {other:?}"),
        }
    }
}

#[test]
fn every_row_holds_in_the_redis_module() {
    let table = Table::load();
    let mut module = Module(ByPolicy::start(Server::start));
    let misses = token_table::run(&table, &mut module);
    token_table::assert_kept("redis", &misses);
    assert_eq!(
        table.exceptions_of("redis"),
        ["no token, no mark", "no token, with a mark", "strict: no token"],
        "the rows without a token, and only they, are Redis's own"
    );
}
