//! Fault injection, compiled only with the `faults` feature into the test guest
//! `guest_faults.wasm`. Each reserved resource key breaks one promise a guest makes,
//! so the host's limits and checks can be shown to hold:
//! * `fault/trap`: traps (`unreachable`).
//! * `fault/loop`: never returns (stopped by the fuel budget).
//! * `fault/grow`: allocates without bound (stopped by the memory limit).
//! * `fault/lower`: admits the presented token as advancing even when it is below
//!   the mark (the host must not believe it).
//! * `fault/contract`: admits an empty token (outside the 1..=4 component contract).
//!
//! Every other key gets the normal decision.

use crate::wit;
use alloc::vec::Vec;

pub(crate) fn inject(resource: &str, presented: Option<&str>, mark: Option<&[u64]>) -> Option<wit::Verdict> {
    match resource {
        "fault/trap" => core::arch::wasm32::unreachable(),
        "fault/loop" => loop {
            core::hint::black_box(mark);
        },
        "fault/grow" => loop {
            // Reserve a mebibyte at a time and never free it. Untouched, so the
            // memory limit (not the fuel budget) is what stops it.
            let block: Vec<u8> = Vec::with_capacity(1 << 20);
            core::mem::forget(core::hint::black_box(block));
        },
        "fault/lower" => {
            let token = fencekeeper_core::Token::parse(presented?).ok()?;
            Some(wit::Verdict::Admit(wit::Admitted { mark: token.parts().to_vec(), advanced: true }))
        }
        "fault/contract" => Some(wit::Verdict::Admit(wit::Admitted { mark: Vec::new(), advanced: true })),
        _ => None,
    }
}
