//! Fencekeeper's validator as a WebAssembly component (`fencekeeper:validator@0.1.0`).
//!
//! One `generate!`, one impl, one `export!`: the impl only converts between the WIT
//! types and `fencekeeper-core`, where every rule lives. The world imports nothing.
//!
//! With the `faults` feature (test builds only, see `faults.rs`) a few reserved
//! resource keys make the guest misbehave, so the host's limits can be tested.
#![no_std]

extern crate alloc;

#[cfg(feature = "faults")]
mod faults;

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use exports::fencekeeper::validator::types as wit;
use exports::fencekeeper::validator::validator::{Guest, GuestChecker};
use fencekeeper_core::{decision, Mode, Policy, Token, Verdict};

wit_bindgen::generate!({
    path: "../../wit",
    world: "fencekeeper",
});

// wasm32-unknown-unknown has no allocator; dlmalloc grows linear memory as needed.
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

// The core never panics on input; reaching this is a bug, and a trap is the only
// honest answer (the host treats it as "cannot decide").
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

const TOKEN_SYNTAX: &str =
    "1 to 4 decimal u64 components joined by '.', compared lexicographically (34, 7.1042); leading zeros allowed";

struct Component;

/// A checker holds nothing but its policy: the guest is a pure function.
struct Checker(Policy);

impl Guest for Component {
    type Checker = Checker;

    fn describe() -> wit::Info {
        wit::Info {
            name: "fencekeeper-validator".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            token_syntax: TOKEN_SYNTAX.into(),
        }
    }
}

impl GuestChecker for Checker {
    fn new(policy: wit::Policy) -> Checker {
        let mode = match policy.mode {
            wit::Mode::Correctness => Mode::Correctness,
            wit::Mode::Efficiency => Mode::Efficiency,
        };
        Checker(Policy { mode, strict: policy.strict })
    }

    fn parse(&self, raw: String) -> Result<Vec<u64>, String> {
        Token::parse(&raw).map(|t| t.parts().to_vec()).map_err(|e| e.to_string())
    }

    fn decide(&self, resource: String, presented: Option<String>, mark: Option<Vec<u64>>) -> wit::Verdict {
        #[cfg(feature = "faults")]
        if let Some(verdict) = faults::inject(&resource, presented.as_deref(), mark.as_deref()) {
            return verdict;
        }
        let mark = match mark.as_deref().map(Token::from_parts).transpose() {
            Ok(mark) => mark,
            Err(e) => return wit::Verdict::Malformed(alloc::format!("the host passed an invalid mark: {e}")),
        };
        to_wit(decision::decide(&self.0, &resource, presented.as_deref(), mark.as_ref()))
    }
}

fn to_wit(verdict: Verdict) -> wit::Verdict {
    let parts = |t: Token| t.parts().to_vec();
    match verdict {
        Verdict::Admit { mark, advanced } => wit::Verdict::Admit(wit::Admitted { mark: parts(mark), advanced }),
        Verdict::Stale { mark } => wit::Verdict::Stale(parts(mark)),
        Verdict::Replayed { mark } => wit::Verdict::Replayed(parts(mark)),
        Verdict::Malformed(m) => wit::Verdict::Malformed(m.to_string()),
        Verdict::Missing => wit::Verdict::Missing,
    }
}

export!(Component);
