//! `FENCE.RAISE resource record`: how an advance reaches the replicas and the AOF.
//! A fenced write sends it beside the write's own effect, and the AOF rewrite emits
//! one per mark; they apply the checked record without running the guest again (a
//! replica or a restart decides nothing a second time).
//!
//! Only the replication stream and AOF loading may run it: clients advance marks
//! with `FENCE.SET` and `FENCE.CALL`, where the guest decides.
//!
//! It only raises: a record below the key's sound mark is refused and the mark kept.
//! A record that fails its check is stored as it came, damaged, so that the key
//! reads as an error rather than keeping the lower mark it held before (an AOF
//! damaged in that command must not lower the mark).

use super::contained;
use crate::mark_type::{StoredMark, MARK_TYPE};
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};
use std::cmp::Ordering;

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    contained(|| {
        let [_, key, record] = args.as_slice() else { return Err(RedisError::WrongArity) };
        if !ctx.get_flags().intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
            return Err(RedisError::Str(
                "ERR FENCE.RAISE is how replication and the AOF apply an advance; \
                 advance a mark with FENCE.SET or FENCE.CALL",
            ));
        }
        let name = key.as_slice();
        let incoming = StoredMark::loaded(record.as_slice());
        let new = incoming.decode(name);
        let opened = ctx.open_key_writable(key);
        if let (Ok(new), Ok(Some(current))) = (&new, opened.get_value::<StoredMark>(&MARK_TYPE)) {
            if let Ok(mark) = current.decode(name) {
                if !matches!(mark.partial_cmp(new), Some(Ordering::Less | Ordering::Equal)) {
                    return Err(RedisError::String(format!(
                        "ERR FENCE.RAISE would lower the mark {mark} to {new}; refused, the mark is kept"
                    )));
                }
            }
        }
        if opened.get_value::<StoredMark>(&MARK_TYPE).is_err() {
            // The stream says this key is a mark now, whatever it held.
            opened.delete()?;
        }
        opened.set_value(&MARK_TYPE, incoming)?;
        drop(opened);
        // A replica's own AOF records what it applies (Redis does not propagate a
        // module command by itself); while loading, Redis propagates nothing.
        ctx.replicate_verbatim();
        match new {
            Ok(_) => Ok(RedisValue::SimpleStringStatic("OK")),
            Err(detail) => {
                ctx.log_warning(&format!("fencekeeper: FENCE.RAISE stored a damaged mark record: {detail}"));
                Err(RedisError::String(format!("ERR the record is damaged ({detail}); stored as damaged")))
            }
        }
    })
}
