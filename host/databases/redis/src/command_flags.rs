//! Whether a command writes, as Redis says (`COMMAND INFO`'s `write` flag), for
//! `FENCE.CALL`. Redis 7.0 gives a module its commands' key positions but not how
//! each key is used (the flags of `RedisModule_GetCommandKeysWithFlags` are empty
//! for most commands there), so the command's own flag decides.
//!
//! Answers are kept per command name for the life of the process: a command's flags
//! do not change while Redis runs, and a command a module adds later is looked up
//! when first called. Commands with subcommands (`XGROUP CREATE`) are looked up by
//! their full name (`xgroup|create`).

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context};
use std::cell::RefCell;
use std::collections::HashMap;

/// What `COMMAND INFO` says of one name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Info {
    /// No such command.
    Unknown,
    /// A command, writing or not.
    Command { writes: bool },
    /// A container: its subcommands have the flags.
    Container,
}

thread_local! {
    // Commands run on Redis's one thread; the cache is that thread's.
    static KNOWN: RefCell<HashMap<Vec<u8>, Info>> = RefCell::new(HashMap::new());
}

/// Whether the command `args` (its name first) writes: `None` when Redis knows no
/// such command (or subcommand).
pub fn writes(ctx: &Context, args: &[&[u8]]) -> Option<bool> {
    let name = args.first()?.to_ascii_lowercase();
    match lookup(ctx, &name) {
        Info::Command { writes } => Some(writes),
        Info::Unknown => None,
        Info::Container => {
            let mut full = name;
            full.push(b'|');
            full.extend(args.get(1)?.to_ascii_lowercase());
            match lookup(ctx, &full) {
                Info::Command { writes } => Some(writes),
                _ => None,
            }
        }
    }
}

fn lookup(ctx: &Context, name: &[u8]) -> Info {
    if let Some(info) = KNOWN.with(|known| known.borrow().get(name).copied()) {
        return info;
    }
    let info = ask(ctx, name);
    // Only what Redis knows is kept: an unknown name may be a module's, loaded later.
    if info != Info::Unknown {
        KNOWN.with(|known| known.borrow_mut().insert(name.to_vec(), info));
    }
    info
}

/// `COMMAND INFO name`: `[[name, arity, [flags...], first, last, step, [acl...],
/// [tips...], [key specs...], [subcommands...]]]`, or `[nil]`.
fn ask(ctx: &Context, name: &[u8]) -> Info {
    let reply: CallResult = ctx.call_ext("COMMAND", &CallOptionsBuilder::new().build(), &[&b"INFO"[..], name]);
    let Ok(CallReply::Array(answer)) = reply else { return Info::Unknown };
    let Some(Ok(CallReply::Array(entry))) = answer.get(0) else { return Info::Unknown };
    let subcommands = matches!(entry.get(9), Some(Ok(CallReply::Array(subs))) if subs.len() > 0);
    if subcommands {
        return Info::Container;
    }
    let writes = match entry.get(2) {
        Some(Ok(CallReply::Array(flags))) => flags.iter().any(|flag| match flag {
            Ok(CallReply::String(flag)) => flag.as_bytes() == b"write",
            _ => false,
        }),
        _ => false,
    };
    Info::Command { writes }
}
