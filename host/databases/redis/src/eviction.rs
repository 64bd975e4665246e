//! Whether Redis could evict a mark. An evicted mark is a forgotten one: the next
//! token, however stale, would be admitted as the resource's first. Marks never
//! carry a TTL (a mark key with one is refused when read, `marks`), so only the
//! `allkeys-*` policies can evict them; under those every fenced write is refused
//! as undecided, in both modes: it is the server's configuration, not an outage,
//! that would lose the mark.

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context, ContextFlags};

/// An error when the server's `maxmemory-policy` may evict keys without a TTL.
///
/// Most servers have no eviction (no `maxmemory`, or `noeviction`), which the
/// context's flags say for free; only then is the policy itself read.
pub fn check(ctx: &Context) -> Result<(), String> {
    if !ctx.get_flags().contains(ContextFlags::EVICTED) {
        return Ok(());
    }
    let policy = policy(ctx);
    match policy.as_deref() {
        Some(p) if p.starts_with("volatile-") => Ok(()),
        other => Err(format!(
            "maxmemory-policy {} lets Redis evict fencing marks, which would re-admit stale writers; \
             set maxmemory-policy noeviction (or a volatile-* policy)",
            other.unwrap_or("(unreadable)")
        )),
    }
}

/// `CONFIG GET maxmemory-policy`, run as the module (not as the client: reading the
/// policy is the module's business, whatever the client's ACL allows).
fn policy(ctx: &Context) -> Option<String> {
    let reply: CallResult = ctx.call_ext("CONFIG", &CallOptionsBuilder::new().build(), &["GET", "maxmemory-policy"]);
    let Ok(CallReply::Array(pair)) = reply else { return None };
    let value = match pair.get(1) {
        Some(Ok(CallReply::String(value))) => value.to_string(),
        _ => None,
    };
    value
}
