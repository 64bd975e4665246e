//! A fenced write: the one path of `FENCE.SET` and `FENCE.CALL`, run in one command
//! on Redis's thread, so nothing else runs between its steps.
//!
//! 1. The keys the write touches are checked: none may be the resource's own key or
//!    hold a mark, so a fenced write can never overwrite a mark.
//! 2. The mark is read from the resource's key and the token admitted against it
//!    (`Guard::admit_in`: bounds, the guest, the verdict checked); an advance is held.
//! 3. The write runs (`RedisModule_Call`, replicated as Redis executes it). If it
//!    fails, its error is the answer and the mark stays where it was.
//! 4. The advance is stored and replicated (`marks::Marks::commit`); the write's own
//!    reply is the answer.

use crate::mark_type::{StoredMark, MARK_TYPE};
use crate::marks::Marks;
use crate::{eviction, fence, redis_api, refusal};
use fencekeeper::GuestText;
use redis_module::{
    CallOptions, CallOptionsBuilder, CallReply, CallResult, Context, RedisError, RedisResult, RedisString, RedisValue,
};
use std::borrow::Cow;

/// Who the write runs as.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum As {
    /// The module: the fenced command's own ACL permission is the one that counts
    /// (`FENCE.SET` is a command in its own right; Redis checked its keys).
    Module,
    /// The client's ACL user: `FENCE.CALL` never runs a command the client could
    /// not run itself.
    Client,
}

/// One fenced write: the command and the keys it touches.
pub struct Write<'a> {
    /// The command's name.
    pub name: &'a [u8],
    /// Its arguments, as Redis will run it.
    pub args: Vec<&'a RedisString>,
    /// Those of its arguments that are keys.
    pub keys: Vec<&'a RedisString>,
    /// Whose permissions the write runs with.
    pub run_as: As,
}

/// Admit `token` on `resource` and, if admitted, apply `write`. Replies itself
/// (with the write's reply, or its error); refusals are the returned error.
pub fn fenced(ctx: &Context, resource: &RedisString, token: &RedisString, write: Write<'_>) -> RedisResult {
    let Some(guard) = fence::guard() else {
        return Err(RedisError::Str("UNDECIDED the fencekeeper module did not finish loading"));
    };
    let name = fencekeeper_core::resource::key_from_bytes(resource.as_slice())
        .map_err(|e| RedisError::String(refusal::malformed(e)))?;
    check_targets(ctx, resource, &write.keys)?;
    eviction::check(ctx).map_err(|cause| RedisError::String(refusal::undecided(name, cause)))?;
    // Redis takes the name as a C string: one with a NUL byte cannot be a command.
    let command = match std::str::from_utf8(write.name) {
        Ok(name) if !name.contains('\0') => name,
        _ => return Err(RedisError::String(format!("ERR unknown command {}", shown(write.name)))),
    };

    let marks = Marks::new(ctx, resource, name);
    let decision = guard.admit_in(&marks, name, Some(&token_text(token)));
    if !decision.admitted() {
        return Err(RedisError::String(refusal::error(&decision, name)));
    }
    let reply: CallResult = ctx.call_ext(command, &options(write.run_as), write.args.as_slice());
    match reply {
        Ok(CallReply::Unknown) => Err(RedisError::String(refusal::undecided(
            name,
            "Redis did not run the write (no reply); the mark is unchanged",
        ))),
        Ok(reply) => {
            // Cannot fail for a key the checks above read as a mark or as nothing.
            // Were it to, the write has happened and the mark not: say so loudly.
            if let Err(e) = marks.commit() {
                ctx.log_warning(&format!("fencekeeper: a write was applied but its mark not stored: {e}"));
                return Err(RedisError::String(refusal::undecided(name, e)));
            }
            redis_api::reply_with(ctx, &reply);
            Ok(RedisValue::NoReply)
        }
        Err(error) => {
            redis_api::reply_with_error(ctx, &error);
            Ok(RedisValue::NoReply)
        }
    }
}

/// How the write is called: replicated as executed (`!`), errors as replies (`E`),
/// in the client's protocol (`0`), refused if it could not run in a script (`S`:
/// no MULTI, EVAL, admin commands), and with the client's ACL when asked (`C`).
fn options(run_as: As) -> CallOptions {
    let options = CallOptionsBuilder::new()
        .replicate()
        .errors_as_replies()
        .script_mode()
        .resp(redis_module::CallOptionResp::Auto);
    match run_as {
        As::Client => options.verify_acl().build(),
        As::Module => options.build(),
    }
}

/// The token argument as text. A command always carries one (its arity says so), so
/// a token is always presented: an empty one is malformed, as in every host (the
/// core's `Malformed::Empty`), never missing. Bytes that are not UTF-8 become
/// U+FFFD, which no token contains, so they stay malformed; the guard bounds the
/// length before anything reads it.
fn token_text(token: &RedisString) -> Cow<'_, str> {
    String::from_utf8_lossy(token.as_slice())
}

/// The write touches neither the resource's own key nor any other mark.
fn check_targets(ctx: &Context, resource: &RedisString, keys: &[&RedisString]) -> Result<(), RedisError> {
    for key in keys {
        if key.as_slice() == resource.as_slice() {
            return Err(RedisError::String(format!(
                "ERR the write's key {} is the resource's mark; name the resource apart from the keys it fences",
                shown(key.as_slice())
            )));
        }
        if let Ok(Some(_)) = ctx.open_key(key).get_value::<StoredMark>(&MARK_TYPE) {
            return Err(RedisError::String(format!(
                "ERR key {} holds a fencing mark; a fenced write never writes a mark",
                shown(key.as_slice())
            )));
        }
    }
    Ok(())
}

/// Client bytes for a message: escaped, one line, bounded.
pub fn shown(bytes: &[u8]) -> String {
    format!("\"{}\"", GuestText::new(&String::from_utf8_lossy(bytes)))
}
