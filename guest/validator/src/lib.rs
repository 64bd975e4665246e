//! Fencekeeper's validator as a WebAssembly component (`fencekeeper:validator@0.3.0`).
//!
//! One `generate!`, one impl, one `export!`: the impl only converts between the WIT
//! types and `fencekeeper-core`, where every rule lives. The world imports nothing.
//!
//! With the `faults` feature (test builds only, see `faults.rs`) a few reserved
//! token texts make the guest misbehave, so the host's limits and checks can be
//! tested against a guest that is otherwise this one.
#![no_std]

extern crate alloc;

#[cfg(feature = "faults")]
mod faults;

use alloc::string::{String, ToString};
use exports::fencekeeper::validator::types as wit;
use exports::fencekeeper::validator::validator::Guest;
use fencekeeper_core::{decision, short_text, Mode, Policy, Token, Verdict};

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

impl Guest for Component {
    fn parse(raw: String) -> Result<wit::Token, String> {
        Token::parse(&raw).map(to_wit_token).map_err(|e| e.to_string())
    }

    fn decide(policy: wit::Policy, presented: Option<String>, mark: Option<wit::Token>) -> wit::Verdict {
        judge(policy, presented.as_deref(), mark)
    }

    fn decide_short(policy: wit::Policy, presented: wit::ShortText, mark: Option<wit::Token>) -> wit::ShortVerdict {
        let t = presented;
        let unpacked = short_text::unpack(t.len, &[t.w0, t.w1, t.w2, t.w3, t.w4, t.w5, t.w6]);
        let Some((bytes, len)) = unpacked else { return wit::ShortVerdict::Malformed };
        // The host packs a `str`; anything else is malformed, like any bad text.
        let Ok(text) = core::str::from_utf8(&bytes[..len]) else { return wit::ShortVerdict::Malformed };
        #[cfg(feature = "faults")]
        if let Some(verdict) = faults::short_only(text) {
            return verdict;
        }
        match judge(policy, Some(text), mark) {
            wit::Verdict::Admit(a) => wit::ShortVerdict::Admit(a),
            wit::Verdict::Stale(r) => wit::ShortVerdict::Stale(r),
            wit::Verdict::Replayed(r) => wit::ShortVerdict::Replayed(r),
            // A text is presented, so `missing` cannot come back; if it did, the
            // host's `decide` would say so and the two would disagree.
            wit::Verdict::Malformed(_) | wit::Verdict::Missing => wit::ShortVerdict::Malformed,
        }
    }

    fn describe() -> wit::Info {
        #[cfg(feature = "faults")]
        let name = faults::hostile_name();
        #[cfg(not(feature = "faults"))]
        let name = "fencekeeper-validator".into();
        wit::Info { name, version: env!("CARGO_PKG_VERSION").into(), token_syntax: TOKEN_SYNTAX.into() }
    }
}

/// The verdict on `presented` against `mark`: both `decide`s answer with this.
fn judge(policy: wit::Policy, presented: Option<&str>, mark: Option<wit::Token>) -> wit::Verdict {
    #[cfg(feature = "faults")]
    if let Some(verdict) = faults::inject(presented, mark) {
        return verdict;
    }
    let policy = Policy {
        mode: match policy.mode {
            wit::Mode::Correctness => Mode::Correctness,
            wit::Mode::Efficiency => Mode::Efficiency,
        },
        strict: policy.strict,
    };
    let mark = match mark.map(from_wit_token).transpose() {
        Ok(mark) => mark,
        Err(e) => return wit::Verdict::Malformed(alloc::format!("the host passed an invalid mark: {e}")),
    };
    to_wit(decision::decide(&policy, presented, mark.as_ref()))
}

pub(crate) fn to_wit_token(t: Token) -> wit::Token {
    let [c0, c1, c2, c3] = t.to_array();
    wit::Token { arity: t.arity() as u8, c0, c1, c2, c3 }
}

fn from_wit_token(t: wit::Token) -> Result<Token, fencekeeper_core::Malformed> {
    Token::from_array([t.c0, t.c1, t.c2, t.c3], usize::from(t.arity))
}

fn to_wit(verdict: Verdict) -> wit::Verdict {
    match verdict {
        Verdict::Admit { mark, advanced } => wit::Verdict::Admit(wit::Admitted { token: to_wit_token(mark), advanced }),
        Verdict::Stale { mark, presented } => {
            wit::Verdict::Stale(wit::Refused { token: to_wit_token(presented), mark: to_wit_token(mark) })
        }
        Verdict::Replayed { mark } => {
            wit::Verdict::Replayed(wit::Refused { token: to_wit_token(mark), mark: to_wit_token(mark) })
        }
        Verdict::Malformed(m) => wit::Verdict::Malformed(m.to_string()),
        Verdict::Missing => wit::Verdict::Missing,
    }
}

export!(Component);
