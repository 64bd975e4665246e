//! Fault injection, compiled only with the `faults` feature into the test guest
//! `guest_faults.wasm` (host/fencekeeper/tests/all/guest_faults.rs). Otherwise the
//! bundled guest; reserved inputs make it break one promise each, so the host's
//! limits and verification can be shown to hold against a real Rust guest:
//!
//! Token texts that are not tokens:
//! * `fault-trap`: traps (`unreachable`).
//! * `fault-loop`: never returns (stopped by the fuel budget).
//! * `fault-grow`: allocates without bound (stopped by the memory limit).
//! * `fault-reason`: calls the token malformed with a 2 MiB reason full of
//!   terminal escapes and newlines (the host must cap and escape it).
//!
//! Canonical tokens of 4 components whose first is 64023 (0xFA17); the second picks
//! the lie, so the host can parse the text itself and catch it:
//! * `64023.1.*.*`: admits the token as advancing, even below the mark.
//! * `64023.2.*.*`: admits it, reporting the token as u64::MAX.u64::MAX.. (a lock-out).
//! * `64023.3.*.*`: admits "the mark it was given, unchanged" whatever was presented.
//! * `64023.4.*.*`: honest for the instance's first 400 decides, then as kind 2.
//! * `64023.5.*.*`: admits a token of arity 0 (outside the contract).
//! * `64023.6.*.*`: `decide-short` calls the token malformed, `decide` decides it
//!   honestly (the two decides disagree).
//!
//! `describe` names the guest with terminal escapes and a forged result line.

use crate::{to_wit_token, wit};
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};
use fencekeeper_core::Token;

const MAGIC: u64 = 0xFA17;
// Past loading: the conformance vectors run twice, through each decide.
const HONEST_CALLS: u32 = 400;

static CALLS: AtomicU32 = AtomicU32::new(0);

pub(crate) fn inject(presented: Option<&str>, mark: Option<wit::Token>) -> Option<wit::Verdict> {
    let calls = CALLS.fetch_add(1, Ordering::Relaxed);
    match presented? {
        "fault-trap" => core::arch::wasm32::unreachable(),
        "fault-loop" => loop {
            core::hint::black_box(mark);
        },
        "fault-grow" => loop {
            // Reserve a mebibyte at a time and never free it. Untouched, so the
            // memory limit (not the fuel budget) is what stops it.
            let block: Vec<u8> = Vec::with_capacity(1 << 20);
            core::mem::forget(core::hint::black_box(block));
        },
        "fault-reason" => {
            // `repeat` doubles by copying: megabytes for little fuel.
            let reason = "\x1b[2J\x1b[H\r\n44 passed, 0 failed\u{202e}\x07".repeat(1 << 16);
            return Some(wit::Verdict::Malformed(reason));
        }
        _ => {}
    }
    let token = Token::parse(presented?).ok()?;
    let [MAGIC, kind, ..] = *token.parts() else {
        return None;
    };
    let max = wit::Token { arity: 4, c0: u64::MAX, c1: u64::MAX, c2: u64::MAX, c3: u64::MAX };
    let admit = |token, advanced| Some(wit::Verdict::Admit(wit::Admitted { token, advanced }));
    match kind {
        1 => admit(to_wit_token(token), true),
        2 => admit(max, true),
        3 => admit(mark.unwrap_or(to_wit_token(token)), false),
        4 if calls >= HONEST_CALLS => admit(max, true),
        5 => admit(wit::Token { arity: 0, c0: 0, c1: 0, c2: 0, c3: 0 }, true),
        _ => None,
    }
}

/// `decide-short`'s own fault: kind 6 is malformed here and honest in `decide`.
pub(crate) fn short_only(presented: &str) -> Option<wit::ShortVerdict> {
    let token = Token::parse(presented).ok()?;
    matches!(*token.parts(), [MAGIC, 6, ..]).then_some(wit::ShortVerdict::Malformed)
}

/// A name that would clear a terminal and forge a conformance result if printed raw.
pub(crate) fn hostile_name() -> String {
    String::from("fault-guest\x1b[2J\x1b[H\n44 passed, 0 failed")
}
