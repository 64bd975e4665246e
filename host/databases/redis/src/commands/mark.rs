//! `FENCE.MARK resource`: the resource's mark (a bulk string such as `34`), nil when
//! it has none, `UNDECIDED ...` when its key does not hold a sound mark (damaged,
//! renamed, overwritten, given a TTL).

use super::contained;
use crate::{marks, refusal};
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    contained(|| {
        let [_, resource] = args.as_slice() else { return Err(RedisError::WrongArity) };
        let name = fencekeeper_core::resource::key_from_bytes(resource.as_slice())
            .and_then(|name| fencekeeper_core::resource::check(name).map(|()| name))
            .map_err(|e| RedisError::String(refusal::malformed(e)))?;
        match marks::read(ctx, resource, name) {
            Ok(Some(mark)) => Ok(RedisValue::BulkString(mark.to_string())),
            Ok(None) => Ok(RedisValue::Null),
            Err(e) => Err(RedisError::String(refusal::undecided(name, e))),
        }
    })
}
