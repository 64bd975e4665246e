//! One file per command. Each runs its work inside [`contained`]: a panic (a bug;
//! no input is meant to cause one) is the command's error, never an unwind into
//! Redis, which would end the server.

pub mod call;
pub mod mark;
pub mod raise;
pub mod set;

use redis_module::{RedisError, RedisResult};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn contained(command: impl FnOnce() -> RedisResult) -> RedisResult {
    catch_unwind(AssertUnwindSafe(command)).unwrap_or(Err(RedisError::Str(
        "UNDECIDED the fencekeeper module failed on this command (a bug: see the server's log); \
         check the mark and the data before writing again",
    )))
}
