//! The token contract (`tests/contract/tokens.json`) against the C ABI: every row
//! through `fencekeeper_admit` with raw pointers and lengths, as a C caller passes them
//! (a resource that is not UTF-8 goes in as its bytes; no token is a NULL pointer),
//! one guard per policy over the bundled validator and a memory store. The answer is
//! the outcome's class, and a call that fails is a miss.

#![allow(clippy::unwrap_used, clippy::panic, unsafe_code)]

use anyhow::{bail, Result};
use fencekeeper_capi::*;
use fencekeeper_harness::token_table::{self, ByPolicy, Host, Table};
use serde_json::Value;
use std::ffi::CStr;

/// An open guard, closed on drop.
struct Guard(*mut fencekeeper_guard);

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: opened below, used by nobody else any more.
        unsafe { fencekeeper_guard_close(self.0) }
    }
}

fn last_error() -> String {
    // SAFETY: the library's pointer, valid until the next call on this thread.
    unsafe { CStr::from_ptr(fencekeeper_last_error()) }.to_string_lossy().into_owned()
}

fn open(strict: bool) -> Guard {
    // SAFETY: every field of the options is valid when zero (NULL pointers, 0 values).
    let mut options: fencekeeper_options = unsafe { std::mem::zeroed() };
    options.store = FENCEKEEPER_STORE_KIND_MEMORY;
    options.strict = u8::from(strict);
    let mut guard = std::ptr::null_mut();
    // SAFETY: the options hold no pointers; room for one guard pointer.
    let status = unsafe { fencekeeper_guard_open(&options, &mut guard) };
    assert_eq!(status, FENCEKEEPER_OK, "{}", last_error());
    Guard(guard)
}

/// The C ABI, one guard per policy.
struct CAbi(ByPolicy<Guard>);

impl Host for CAbi {
    fn name(&self) -> &'static str {
        "c"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        let mut o = std::mem::MaybeUninit::<fencekeeper_outcome>::uninit();
        let (t, tl) = token.map_or((std::ptr::null(), 0), |t| (t.as_ptr(), t.len()));
        let g = self.0.of(strict).0;
        // SAFETY: the slices' pointers and lengths; room for one outcome.
        let status = unsafe { fencekeeper_admit(g, resource.as_ptr(), resource.len(), t, tl, o.as_mut_ptr()) };
        if status != FENCEKEEPER_OK {
            bail!("fencekeeper_admit returned {status}: {}", last_error());
        }
        // SAFETY: written whole on FENCEKEEPER_OK.
        Ok(Value::from(unsafe { o.assume_init_ref() }.class_))
    }

    fn mark(&mut self, strict: bool, key: &str) -> Result<Option<String>> {
        let mut buffer = [0; FENCEKEEPER_TOKEN_CAP];
        let mut found = false;
        let g = self.0.of(strict).0;
        // SAFETY: a buffer of FENCEKEEPER_TOKEN_CAP bytes and a bool.
        let status = unsafe { fencekeeper_mark(g, key.as_ptr(), key.len(), buffer.as_mut_ptr(), &mut found) };
        if status != FENCEKEEPER_OK {
            bail!("fencekeeper_mark returned {status}: {}", last_error());
        }
        // SAFETY: NUL-terminated by the library.
        let text = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned();
        Ok(found.then_some(text))
    }
}

#[test]
fn every_row_holds_through_the_c_abi() {
    let table = Table::load();
    let mut host = CAbi(ByPolicy::start(open));
    let misses = token_table::run(&table, &mut host);
    token_table::assert_kept("c", &misses);
}
