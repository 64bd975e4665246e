//! A short token text packed into seven 64-bit words: how the validator
//! component's `decide-short` carries the presented text in its arguments, so that
//! the call needs no allocation in the guest (wit/fencekeeper.wit, `short-text`).
//!
//! The host packs, the guest unpacks; both sides use these two functions, so the
//! layout is written once. Bytes go little-endian eight to a word from the first
//! word on, and every byte past the length is zero. Unpacking checks all of that:
//! a length past [`SHORT_TEXT_BYTES`] or a non-zero byte past the length is not a
//! short text, whoever sent it.

/// The longest text a short text carries. Seven words, so that `decide-short`'s
/// arguments (policy, text, mark) stay within the 16 values the component model
/// passes without memory.
pub const SHORT_TEXT_BYTES: usize = 56;

/// The words of a short text.
pub type Words = [u64; SHORT_TEXT_BYTES / 8];

/// `text` as (length, words), or `None` when it is longer than [`SHORT_TEXT_BYTES`].
pub fn pack(text: &[u8]) -> Option<(u8, Words)> {
    if text.len() > SHORT_TEXT_BYTES {
        return None;
    }
    // Only the words the text reaches: this runs on every host call.
    let mut words = [0u64; SHORT_TEXT_BYTES / 8];
    for (word, chunk) in words.iter_mut().zip(text.chunks(8)) {
        let mut le = [0u8; 8];
        le[..chunk.len()].copy_from_slice(chunk);
        *word = u64::from_le_bytes(le);
    }
    Some((text.len() as u8, words))
}

/// The bytes of a packed text and their length, or `None` when the length is past
/// [`SHORT_TEXT_BYTES`] or a byte past it is not zero.
pub fn unpack(len: u8, words: &Words) -> Option<([u8; SHORT_TEXT_BYTES], usize)> {
    let len = usize::from(len);
    if len > SHORT_TEXT_BYTES {
        return None;
    }
    // Word by word, not byte by byte: this runs in the guest on every call.
    let (whole, part) = (len / 8, len % 8);
    let mut rest = words[whole..].iter();
    if part > 0 && rest.next().is_some_and(|w| w >> (8 * part) != 0) {
        return None;
    }
    if rest.any(|&w| w != 0) {
        return None;
    }
    let mut bytes = [0u8; SHORT_TEXT_BYTES];
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(words).take(len.div_ceil(8)) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    Some((bytes, len))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever words arrive, unpacking answers without a panic, and what it
        /// accepts is exactly what packing its bytes gives back.
        #[test]
        fn unpack_accepts_only_what_pack_writes(len in 0u8..=64, words in any::<Words>()) {
            if let Some((bytes, n)) = unpack(len, &words) {
                prop_assert_eq!(pack(&bytes[..n]), Some((len, words)));
            }
        }

        #[test]
        fn pack_then_unpack_is_the_identity(text in proptest::collection::vec(any::<u8>(), 0..=SHORT_TEXT_BYTES)) {
            let (len, words) = pack(&text).unwrap();
            let (bytes, n) = unpack(len, &words).unwrap();
            prop_assert_eq!(&bytes[..n], &text[..]);
        }
    }

    #[test]
    fn every_length_up_to_the_bound_round_trips() {
        let source: [u8; SHORT_TEXT_BYTES] = core::array::from_fn(|i| b'0' + (i % 10) as u8);
        for n in 0..=SHORT_TEXT_BYTES {
            let (len, words) = pack(&source[..n]).unwrap();
            let (bytes, back) = unpack(len, &words).unwrap();
            assert_eq!(&bytes[..back], &source[..n]);
        }
    }

    #[test]
    fn a_longer_text_is_not_packed() {
        assert_eq!(pack(&[b'1'; SHORT_TEXT_BYTES + 1]), None);
    }

    #[test]
    fn a_length_past_the_bound_or_bytes_past_the_length_are_refused() {
        let (_, words) = pack(b"34").unwrap();
        assert!(unpack(SHORT_TEXT_BYTES as u8 + 1, &words).is_none());
        // "34" with a length of 1: the '4' lies past the length.
        assert!(unpack(1, &words).is_none());
        let mut words = pack(b"34").unwrap().1;
        words[6] = 1 << 56;
        assert!(unpack(2, &words).is_none(), "a stray byte in the last word");
        let words = pack(&[b'1'; 16]).unwrap().1;
        assert!(unpack(8, &words).is_none(), "a stray word right after a whole word");
        assert!(unpack(16, &words).is_some());
    }
}
