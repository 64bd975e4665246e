//! Target 4: store record decoding (`fencekeeper_core::record`).
//!
//! The input is a resource key and a stored value (two lines), then the rest of
//! the case: a token to encode, and a byte to damage.
//!
//! Needs the record codec of the store-integrity work: `scripts/fuzz.sh` skips this
//! target while `crates/core/src/lib.rs` has no `pub mod record`.
//!
//! * `decode` never panics, and accepts only what `encode` writes: a value that
//!   decodes to a token under a resource is byte for byte that token's record under
//!   that resource, and reads as that token without a check too (`legible`).
//! * A bare token is `Unchecked`, never a mark.
//! * Every record round-trips, is ASCII, starts with the tag and fits `MAX_LEN`.
//! * One changed byte in a record, or in its resource key, is always refused: a
//!   CRC32C catches every error burst up to 32 bits.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fencekeeper_core::record::{decode, encode, legible, RecordError, MAX_LEN, TAG};
use fencekeeper_fuzz::input::SmallToken;
use fencekeeper_fuzz::model;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Rest {
    token: SmallToken,
    /// Where to damage the record (or the key), and how.
    at: u16,
    xor: u8,
}

fuzz_target!(|data: &[u8]| {
    let mut lines = data.splitn(3, |&b| b == b'\n');
    let (resource, value) = (lines.next().unwrap_or_default(), lines.next().unwrap_or_default());
    let Ok(input) = Rest::arbitrary_take_rest(Unstructured::new(lines.next().unwrap_or_default())) else { return };
    match decode(resource, value) {
        Ok(token) => {
            assert_eq!(encode(resource, &token).as_bytes(), value);
            assert_eq!(legible(value), Some(token));
        }
        Err(RecordError::Unchecked) => {
            let text = std::str::from_utf8(value).expect("an unchecked value is a token's text");
            assert!(model::token(text).is_ok(), "{text:?}");
        }
        Err(_) => {}
    }

    let token = input.token.token();
    let record = encode(resource, &token);
    let bytes = record.as_bytes();
    assert!(bytes.len() <= MAX_LEN && bytes.is_ascii() && bytes.starts_with(TAG.as_bytes()), "{record:?}");
    assert_eq!(record.as_str().as_bytes(), bytes);
    assert_eq!(decode(resource, bytes), Ok(token));
    assert_eq!(legible(bytes), Some(token));

    if input.xor != 0 {
        let mut damaged = bytes.to_vec();
        damaged[usize::from(input.at) % bytes.len()] ^= input.xor;
        assert!(decode(resource, &damaged).is_err(), "{:?} under {resource:?}", String::from_utf8_lossy(&damaged));
        if !resource.is_empty() {
            let mut other = resource.to_vec();
            other[usize::from(input.at) % resource.len()] ^= input.xor;
            assert!(decode(&other, bytes).is_err(), "{record:?} under {other:?}");
        }
    }
});
