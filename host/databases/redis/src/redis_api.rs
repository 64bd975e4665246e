//! The module API calls redis-module does not wrap, each behind a safe function:
//! replying with a command's reply as it came, asking Redis which arguments of a
//! command are keys (and how it uses them), declaring our own keys with their flags,
//! a key's TTL, and emitting a command in the AOF rewrite.

use redis_module::{raw, CallReply, Context, ErrorReply, RedisString};
use std::os::raw::{c_char, c_int, c_void};

/// A function of Redis's module API, or `None` when this Redis lacks it.
macro_rules! api {
    ($name:ident) => {
        // SAFETY: the API table is written once, by RedisModule_Init when the module
        // loads, before any command or callback runs; afterwards it is only read.
        unsafe { raw::$name }
    };
}

/// How a command uses a key (`REDISMODULE_CMD_KEY_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyFlags(pub c_int);

impl KeyFlags {
    /// A key that is read and may be updated: a mark a fenced command may advance,
    /// and any key whose use Redis does not say (7.0 gives most commands' keys no
    /// flags): claiming both read and write makes ACL key patterns check both.
    pub fn read_write() -> KeyFlags {
        KeyFlags(
            (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE) as c_int,
        )
    }
}

/// Why Redis would not say which arguments of a command are keys.
#[derive(Debug, PartialEq, Eq)]
pub enum KeysError {
    /// No such command.
    Unknown,
    /// The command exists, with another number of arguments.
    Arity,
}

/// The keys of the command `args` (its name first): each key's index in `args` and
/// how the command uses it, as far as Redis says (0: not said). Empty for a command
/// without keys.
pub fn command_keys(ctx: &Context, args: &[RedisString]) -> Result<Vec<(usize, KeyFlags)>, KeysError> {
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    let Ok(argc) = c_int::try_from(argv.len()) else { return Err(KeysError::Arity) };
    let (mut count, mut flags): (c_int, *mut c_int) = (0, std::ptr::null_mut());
    let Some(get_keys) = api!(RedisModule_GetCommandKeysWithFlags) else { return Err(KeysError::Unknown) };
    // SAFETY: `argv` holds `argc` live strings (borrowed from `args`) and Redis only
    // reads them; `count` and `flags` are written by Redis.
    let positions = unsafe { get_keys(ctx.ctx, argv.as_mut_ptr(), argc, &mut count, &mut flags) };
    if positions.is_null() {
        // NULL with errno: ENOENT (unknown), EINVAL (arity), 0 (no keys).
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(ENOENT) => Err(KeysError::Unknown),
            Some(EINVAL) => Err(KeysError::Arity),
            _ => Ok(Vec::new()),
        };
    }
    let count = usize::try_from(count).unwrap_or(0);
    // SAFETY: on success Redis returns `count` positions and (asked for) `count`
    // flags, both allocated with its allocator, for the caller to free once.
    let keys = unsafe {
        let keys = (0..count)
            .map(|i| {
                let at = usize::try_from(*positions.add(i)).unwrap_or(usize::MAX);
                (at, KeyFlags(if flags.is_null() { 0 } else { *flags.add(i) }))
            })
            .collect();
        free(positions.cast());
        if !flags.is_null() {
            free(flags.cast());
        }
        keys
    };
    Ok(keys)
}

/// errno values as Linux defines them (the module runs inside redis-server on Linux).
const ENOENT: i32 = 2;
const EINVAL: i32 = 22;

/// # Safety
/// `ptr` was allocated by Redis's allocator and is not used again.
unsafe fn free(ptr: *mut c_void) {
    if let Some(free) = api!(RedisModule_Free) {
        // SAFETY: per this function's contract.
        unsafe { free(ptr) };
    }
}

/// Declare argument `at` a key, used as `flags` say (the getkeys-api answer of a
/// command whose keys move: `FENCE.CALL`). Positions past the arguments are not
/// declared: Redis would read past its array.
pub fn declare_key(ctx: &Context, argc: usize, at: usize, flags: KeyFlags) {
    let (Some(declare), Ok(pos)) = (api!(RedisModule_KeyAtPosWithFlags), c_int::try_from(at)) else {
        return;
    };
    if at == 0 || at >= argc {
        return;
    }
    let flags = if flags.0 == 0 { KeyFlags::read_write() } else { flags };
    // SAFETY: called only while Redis asks this command for its keys (the caller
    // checks `is_keys_position_request`), with a position inside its arguments.
    unsafe { declare(ctx.ctx, pos, flags.0) };
}

/// Answer the client with `reply`, a command's reply as Redis produced it (any type,
/// in the client's protocol).
pub fn reply_with(ctx: &Context, reply: &CallReply) {
    match (reply.get_raw(), api!(RedisModule_ReplyWithCallReply)) {
        // SAFETY: `raw` is the live reply `reply` owns (freed when it drops, after
        // this), and Redis copies it into the client's output.
        (Some(raw), Some(reply_with)) => unsafe {
            reply_with(ctx.ctx, raw);
        },
        _ => {
            ctx.reply_error_string("UNDECIDED the command ran, but Redis gave the module no reply to pass on");
        }
    }
}

/// Answer the client with an error a command answered.
pub fn reply_with_error(ctx: &Context, error: &ErrorReply) {
    if let (ErrorReply::RedisError(e), Some(reply_with)) = (error, api!(RedisModule_ReplyWithCallReply)) {
        // SAFETY: as in `reply_with`.
        unsafe { reply_with(ctx.ctx, e.get_raw()) };
        return;
    }
    let text = error.to_utf8_string().unwrap_or_else(|| "ERR the command failed".to_owned());
    ctx.reply_error_string(&text);
}

/// The TTL of key `name` in milliseconds, or `None` when it has none (or does not
/// exist). Opens the key itself: redis-module's `RedisKey::to_raw_parts` closes the
/// key it hands out (2.0.8), so a key of the crate's cannot be asked.
pub fn expire_ms(ctx: &Context, name: &RedisString) -> Option<i64> {
    let (Some(open), Some(get_expire), Some(close)) =
        (api!(RedisModule_OpenKey), api!(RedisModule_GetExpire), api!(RedisModule_CloseKey))
    else {
        return None;
    };
    // SAFETY: a read-only open of a live key name in the command's context; the key
    // is closed before returning, and GetExpire accepts the NULL that a missing key
    // opens as.
    let ttl = unsafe {
        let key = open(ctx.ctx, name.inner, raw::REDISMODULE_READ as c_int).cast::<raw::RedisModuleKey>();
        let ttl = get_expire(key);
        close(key);
        ttl
    };
    (ttl != raw::REDISMODULE_NO_EXPIRE as i64).then_some(ttl)
}

/// In an AOF rewrite: `FENCE.RAISE key record`, the command that recreates a mark.
pub fn emit_raise(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, record: &[u8]) {
    const COMMAND: &[u8] = b"FENCE.RAISE\0";
    // `s`: a RedisModuleString; `b`: a buffer and its length.
    const FORMAT: &[u8] = b"sb\0";
    if let Some(emit) = api!(RedisModule_EmitAOF) {
        // SAFETY: Redis calls aof_rewrite with a live IO context and key name; the
        // format names exactly the three arguments that follow, and Redis copies
        // the buffer before returning.
        unsafe {
            emit(
                aof,
                COMMAND.as_ptr().cast::<c_char>(),
                FORMAT.as_ptr().cast::<c_char>(),
                key,
                record.as_ptr().cast::<c_char>(),
                record.len(),
            )
        };
    }
}
