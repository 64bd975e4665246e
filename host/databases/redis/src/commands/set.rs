//! `FENCE.SET key resource token value [SET option ...]`: `SET key value [option
//! ...]`, fenced by `token` on `resource`. The options are SET's own (`EX`, `PX`,
//! `EXAT`, `PXAT`, `KEEPTTL`, `NX`, `XX`, `GET`), checked by SET; the answer is SET's.
//!
//! The common write has a command of its own, beside `FENCE.CALL SET ...`: its keys
//! are declared statically (positions 1 and 2), so every cluster client routes it
//! without asking Redis, and its ACL permission is its own, so a user can be allowed
//! `FENCE.SET` and denied `SET`: writes only through the fence.

use super::contained;
use crate::write::{fenced, As, Write};
use redis_module::{Context, RedisError, RedisResult, RedisString};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    contained(|| {
        let [_, key, resource, token, value, options @ ..] = args.as_slice() else {
            return Err(RedisError::WrongArity);
        };
        let args = [key, value].into_iter().chain(options).collect();
        fenced(ctx, resource, token, Write { name: b"SET", args, keys: vec![key], run_as: As::Module })
    })
}
