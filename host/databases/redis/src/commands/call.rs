//! `FENCE.CALL resource token command [arg ...]`: any Redis command that writes keys
//! (`DEL`, `HSET`, `XADD`, `INCRBY`, `EXPIRE`, `LPUSH`, ...), fenced by `token` on
//! `resource`; the answer is the command's.
//!
//! What it may call, and why:
//! * a write (Redis's `write` flag) with at least one key: fencing orders writes,
//!   and a write without keys (`FLUSHALL`, `SWAPDB`) is no resource's write;
//! * none of this module's commands (no nesting) and nothing a script could not run
//!   (`MULTI`, `EVAL`, admin commands: the write runs in script mode);
//! * with the client's ACL user: `FENCE.CALL` never runs what the client could not;
//! * no key that is the resource's mark or any other mark.
//!
//! Its keys move with the command, so it answers Redis's getkeys-api: the resource
//! and the command's own keys, where Redis's key specs put them. Cluster routing,
//! the CROSSSLOT check and ACL key patterns see all of them.

use super::contained;
use crate::command_flags;
use crate::redis_api::{command_keys, declare_key, KeyFlags, KeysError};
use crate::write::{fenced, shown, As, Write};
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

/// Where the command starts in FENCE.CALL's arguments.
const COMMAND_AT: usize = 3;

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    contained(|| {
        if ctx.is_keys_position_request() {
            declare_keys(ctx, &args);
            return Ok(RedisValue::NoReply);
        }
        let [_, resource, token, command @ ..] = args.as_slice() else { return Err(RedisError::WrongArity) };
        let [name, command_args @ ..] = command else { return Err(RedisError::WrongArity) };
        let name = name.as_slice();
        if name.get(..6).is_some_and(|p| p.eq_ignore_ascii_case(b"fence.")) {
            return Err(error(format!("FENCE.CALL runs Redis's own writes, not {}", shown(name))));
        }
        let words: Vec<&[u8]> = command.iter().take(2).map(RedisString::as_slice).collect();
        match command_flags::writes(ctx, &words) {
            Some(true) => {}
            Some(false) => return Err(error(format!("{} does not write; FENCE.CALL fences writes", shown(name)))),
            None => return Err(error(format!("unknown command {}", shown(name)))),
        }
        let keys = match command_keys(ctx, command) {
            Ok(keys) => keys,
            Err(KeysError::Unknown) => return Err(error(format!("unknown command {}", shown(name)))),
            Err(KeysError::Arity) => {
                return Err(error(format!("wrong number of arguments for {} in FENCE.CALL", shown(name))))
            }
        };
        if keys.is_empty() {
            return Err(error(format!("{} names no key; FENCE.CALL fences writes to keys", shown(name))));
        }
        let keys = keys.iter().filter_map(|(at, _)| command.get(*at)).collect();
        let write = Write { name, args: command_args.iter().collect(), keys, run_as: As::Client };
        fenced(ctx, resource, token, write)
    })
}

/// The getkeys-api answer: the resource, then the command's keys.
fn declare_keys(ctx: &Context, args: &[RedisString]) {
    declare_key(ctx, args.len(), 1, KeyFlags::read_write());
    if let Some(command) = args.get(COMMAND_AT..).filter(|c| !c.is_empty()) {
        for (at, flags) in command_keys(ctx, command).unwrap_or_default() {
            declare_key(ctx, args.len(), at + COMMAND_AT, flags);
        }
    }
}

fn error(message: String) -> RedisError {
    RedisError::String(format!("ERR {message}"))
}
