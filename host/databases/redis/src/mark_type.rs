//! The `fencemark` data type: one key per resource, named by the resource, holding
//! the core's checked record of its mark (`fk2 TOKEN CRC`, `fencekeeper_core::record`).
//!
//! The value is the record's bytes as written or as loaded, and it is decoded, with
//! its checksum over the key's name, on every read: a record damaged on disk, or a
//! key renamed (`RENAME`), reads as an error, never as a lower mark or another
//! resource's. RDB saves the bytes; the AOF rewrite emits `FENCE.RAISE key record`,
//! the command that replication and the AOF also use for every advance. A loaded
//! value that cannot be a record (too long) is kept as a damaged one, so that the
//! key still reads as an error rather than as no mark.
//!
//! `COPY` is refused for the type (no copy callback): a copy would be another key's
//! damaged mark anyway.

use fencekeeper::Token;
use fencekeeper_core::record::{self, RecordError, MAX_LEN};
use redis_module::native_types::RedisType;
use redis_module::raw;
use std::os::raw::{c_int, c_void};

/// The type's encoding version in RDB: the value is one string, the record.
const ENCODING: c_int = 1;

/// One mark as Redis holds it.
pub struct StoredMark {
    /// The record's bytes, at most one byte past the longest record.
    bytes: Vec<u8>,
    /// How long the loaded value was, when it was longer than any record.
    overlong: Option<usize>,
}

impl StoredMark {
    /// The record of `token` as `resource`'s mark.
    pub fn of(resource: &[u8], token: &Token) -> StoredMark {
        StoredMark { bytes: record::encode(resource, token).as_bytes().to_vec(), overlong: None }
    }

    /// A value as loaded (RDB, AOF, replication): kept as is when it fits a record,
    /// else cut and remembered as damaged. Nothing is checked here; reads check.
    pub fn loaded(bytes: &[u8]) -> StoredMark {
        let overlong = (bytes.len() > MAX_LEN).then_some(bytes.len());
        StoredMark { bytes: bytes[..bytes.len().min(MAX_LEN)].to_vec(), overlong }
    }

    /// Make this the record of `token` for `resource` (in place: no allocation when
    /// the key already holds a mark).
    pub fn set(&mut self, resource: &[u8], token: &Token) {
        self.bytes.clear();
        self.bytes.extend_from_slice(record::encode(resource, token).as_bytes());
        self.overlong = None;
    }

    /// The mark this records for the key named `resource`, verified.
    pub fn decode(&self, resource: &[u8]) -> Result<Token, String> {
        if let Some(len) = self.overlong {
            return Err(format!("it is {len} bytes long, longer than any mark record ({MAX_LEN})"));
        }
        record::decode(resource, &self.bytes).map_err(|e: RecordError| e.to_string())
    }

    /// The bytes as stored.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The type, registered when the module loads.
pub static MARK_TYPE: RedisType = RedisType::new(
    "fencemark",
    ENCODING,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: None,
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// A value from an RDB file (or a replica's full sync). NULL on a read error or an
/// unknown encoding: Redis then refuses the file, as it does any corrupt RDB.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if encver != ENCODING {
        return std::ptr::null_mut();
    }
    match raw::load_string_buffer(rdb) {
        Ok(buffer) => Box::into_raw(Box::new(StoredMark::loaded(buffer.as_ref()))).cast(),
        Err(_) => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes a value of this type, which `rdb_load` or the key API
    // made from a `Box<StoredMark>` and which lives until `free`.
    let mark = unsafe { &*value.cast::<StoredMark>() };
    raw::save_slice(rdb, mark.bytes());
}

unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    // SAFETY: as in `rdb_save`.
    let mark = unsafe { &*value.cast::<StoredMark>() };
    crate::redis_api::emit_raise(aof, key, mark.bytes());
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: as in `rdb_save`.
    let mark = unsafe { &*value.cast::<StoredMark>() };
    std::mem::size_of::<StoredMark>() + mark.bytes.capacity()
}

unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: every value of this type is a `Box<StoredMark>` turned into a pointer
    // (`rdb_load`, `RedisKeyWritable::set_value`); Redis frees each once.
    drop(unsafe { Box::from_raw(value.cast::<StoredMark>()) });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_mark_reads_back_only_under_its_own_key() {
        let mark = StoredMark::of(b"fence:orders", &Token::parse("34").unwrap());
        assert_eq!(mark.decode(b"fence:orders").unwrap().to_string(), "34");
        assert!(mark.decode(b"fence:orderz").unwrap_err().contains("belongs to another resource"));
    }

    #[test]
    fn a_loaded_value_that_is_damaged_or_too_long_is_an_error_never_a_mark() {
        let good = StoredMark::of(b"r", &Token::parse("50").unwrap());
        let mut bytes = good.bytes().to_vec();
        bytes[4] = b'4'; // "fk2 50 ..." reads "fk2 40 ...": a lower mark, if believed
        assert!(StoredMark::loaded(&bytes).decode(b"r").unwrap_err().contains("does not match"));
        let long = StoredMark::loaded(&vec![b'7'; 1 << 20]);
        assert_eq!(
            long.decode(b"r").unwrap_err(),
            format!("it is 1048576 bytes long, longer than any mark record ({MAX_LEN})")
        );
        assert_eq!(long.bytes().len(), MAX_LEN);
        assert!(StoredMark::loaded(b"34").decode(b"r").unwrap_err().contains("old format"));
    }

    #[test]
    fn setting_a_mark_in_place_replaces_a_damaged_value() {
        let mut mark = StoredMark::loaded(&[0xff; 300]);
        mark.set(b"r", &Token::parse("7.2").unwrap());
        assert_eq!(mark.decode(b"r").unwrap().to_string(), "7.2");
    }
}
