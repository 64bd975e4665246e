//! A mark as etcd holds it: the value is the mark's checked record
//! (`fencekeeper_core::record`). Records are deterministic, so a Txn that compares
//! record bytes compares marks, and a damaged value never equals one.

use fencekeeper_core::record::{self, RecordError};
use fencekeeper_core::Token;

/// How a stored value failed to be `resource`'s mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MarkError {
    /// A bare token of the first format, without a checksum: upgrade the store.
    OldFormat,
    /// Damaged, or another resource's record.
    Damaged(RecordError),
}

/// A value read back, verified as `resource`'s mark.
pub fn mark_of(resource: &str, value: &[u8]) -> Result<Token, MarkError> {
    record::decode(resource.as_bytes(), value).map_err(|e| match e {
        RecordError::Unchecked => MarkError::OldFormat,
        other => MarkError::Damaged(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    #[test]
    fn a_value_is_this_resources_mark_or_an_error() {
        let value = record::encode(b"x", &token!("7.1042"));
        assert_eq!(mark_of("x", value.as_bytes()), Ok(token!("7.1042")));
        assert!(matches!(mark_of("y", value.as_bytes()), Err(MarkError::Damaged(_))), "another resource's record");
        assert_eq!(mark_of("x", b"34"), Err(MarkError::OldFormat));
        let mut flipped = value.as_bytes().to_vec();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(mark_of("x", &flipped), Err(MarkError::Damaged(_))));
    }
}
