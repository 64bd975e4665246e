//! The library's `MarkStore` over one command's context: the mark of one resource,
//! read from its key, and the advance the admit decided, held until the write it
//! admitted has succeeded ([`Marks::commit`]).
//!
//! A command runs alone on Redis's thread, so a compare-and-swap is a compare and a
//! note: nothing else can change the key between the read and the commit. Holding
//! the advance rather than writing it at once means a write that fails (a wrong
//! type, a syntax error in the command) leaves the mark where it was, as a rolled
//! back transaction would.

use crate::mark_type::{StoredMark, MARK_TYPE};
use crate::redis_api;
use fencekeeper::{MarkStore, StoreError, Swap, Token};
use redis_module::key::KeyFlags;
use redis_module::{Context, KeyType, NotifyEvent, RedisString};
use std::cell::Cell;

/// The keyspace event of an advance (type `module`), for whoever subscribes.
const ADVANCE_EVENT: &str = "fence.advance";

/// One resource's mark, as one command sees it.
pub struct Marks<'a> {
    ctx: &'a Context,
    key: &'a RedisString,
    resource: &'a str,
    advance: Cell<Option<Token>>,
}

impl<'a> Marks<'a> {
    /// The mark of `resource`, the name of `key`.
    pub fn new(ctx: &'a Context, key: &'a RedisString, resource: &'a str) -> Marks<'a> {
        Marks { ctx, key, resource, advance: Cell::new(None) }
    }

    /// Store the advance the admit decided, if it decided one, and send it to the
    /// replicas and the AOF as `FENCE.RAISE resource record`: they apply it without
    /// running the guest. Returns the new mark.
    pub fn commit(self) -> Result<Option<Token>, StoreError> {
        let Some(token) = self.advance.get() else { return Ok(None) };
        let name = self.resource.as_bytes();
        let key = self.ctx.open_key_writable(self.key);
        let written = match key.get_value::<StoredMark>(&MARK_TYPE) {
            Ok(Some(mark)) => {
                mark.set(name, &token);
                Ok(())
            }
            Ok(None) => key.set_value(&MARK_TYPE, StoredMark::of(name, &token)),
            Err(e) => Err(e),
        };
        written.map_err(|e| self.damaged(format!("it could not be written: {e}")))?;
        drop(key);
        let record = fencekeeper_core::record::encode(name, &token);
        self.ctx.replicate("FENCE.RAISE", &[name, record.as_bytes()]);
        self.ctx.notify_keyspace_event(NotifyEvent::MODULE, ADVANCE_EVENT, self.key);
        Ok(Some(token))
    }

    fn damaged(&self, detail: String) -> StoreError {
        damaged(self.resource, detail)
    }
}

/// The mark of `resource` held in `key`, verified: `None` when the key does not
/// exist, an error when it is not a sound mark (another type, a damaged or foreign
/// record, a TTL).
pub fn read(ctx: &Context, key: &RedisString, resource: &str) -> Result<Option<Token>, StoreError> {
    let opened = ctx.open_key_with_flags(key, KeyFlags::NOTOUCH);
    let token = match opened.get_value::<StoredMark>(&MARK_TYPE) {
        Ok(None) => return Ok(None),
        Ok(Some(mark)) => mark.decode(resource.as_bytes()).map_err(|detail| damaged(resource, detail))?,
        Err(_) => {
            let holds = type_name(opened.key_type());
            return Err(damaged(
                resource,
                format!("the key holds a {holds}, not a fencing mark (overwritten by another command?)"),
            ));
        }
    };
    drop(opened);
    if let Some(ttl) = redis_api::expire_ms(ctx, key) {
        return Err(damaged(
            resource,
            format!(
                "it expires in {ttl} ms (a TTL was set on it); an expired mark re-admits stale writers, PERSIST it"
            ),
        ));
    }
    Ok(Some(token))
}

fn damaged(resource: &str, detail: String) -> StoreError {
    StoreError::Damaged { resource: resource.to_owned(), store: format!("Redis key {resource:?}"), detail }
}

fn type_name(kind: KeyType) -> &'static str {
    match kind {
        KeyType::String => "string",
        KeyType::List => "list",
        KeyType::Hash => "hash",
        KeyType::Set => "set",
        KeyType::ZSet => "sorted set",
        KeyType::Stream => "stream",
        KeyType::Module => "value of another module's type",
        KeyType::Empty => "nothing",
    }
}

impl MarkStore for Marks<'_> {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        if resource != self.resource {
            return Err(StoreError::Unsupported("another resource's mark within one command"));
        }
        match self.advance.get() {
            Some(advanced) => Ok(Some(advanced)),
            None => read(self.ctx, self.key, resource),
        }
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        let current = self.get(resource)?;
        // Marks only rise, whatever the caller asks.
        if current.as_ref() != expected || !fencekeeper::store::raises(current.as_ref(), new) {
            return Ok(Swap::Conflict(current));
        }
        self.advance.set(Some(*new));
        Ok(Swap::Swapped)
    }
}
