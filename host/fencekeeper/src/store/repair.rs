//! What an operator does to a store by hand: scan every record, raise a mark whose
//! record is lost or damaged, and, as a separate, deliberate act, set or remove a
//! mark by force (to undo a mark a forged token raised).

use super::{MarkStore, StoreError};
use fencekeeper_core::record;
use fencekeeper_core::Token;

/// One record found by [`Repair::scan`].
#[derive(Debug)]
pub struct Scanned {
    /// The resource (a damaged key is shown lossily, with U+FFFD).
    pub resource: String,
    /// The verified mark, or why the record is not one.
    pub mark: Result<Token, StoreError>,
}

/// What stood in a resource's record before a raise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Previous {
    /// No record.
    None,
    /// A verified mark.
    Mark(Token),
    /// A record that failed its check; what was wrong.
    Damaged(String),
}

/// The outcome of [`Repair::raise`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Raise {
    /// The mark is now the new token, durably; this is what stood there before.
    Raised(Previous),
    /// Nothing was written: the new token does not lie above `floor`, the verified
    /// mark or the token a damaged record still appears to hold.
    Refused {
        /// What the new token would have lowered, or kept, or is not comparable with.
        floor: Token,
        /// What stood there.
        previous: Previous,
    },
}

/// Scanning and raising by hand, for the stores that keep marks for good.
pub trait Repair: MarkStore {
    /// Every record in the store, verified one by one, sorted by resource. A damaged
    /// record is listed with its error rather than ending the scan; an error of the
    /// store itself (unreadable, unreachable) is the whole answer.
    fn scan(&self) -> Result<Vec<Scanned>, StoreError>;

    /// Set `resource`'s mark to `to` if that raises it, whatever state its record is
    /// in: none, verified, or damaged. Refused when `to` is not above the verified
    /// mark, nor above the token a damaged record still appears to hold (a damaged
    /// digit may have made it look lower than it was, never a reason to go lower).
    fn raise(&self, resource: &str, to: &Token) -> Result<Raise, StoreError>;

    /// Set `resource`'s mark to `to`, or remove it (`None`), by force: lower, higher
    /// or equal, whatever state its record is in. Returns what stood there. Lowering
    /// a mark re-admits every token above the new mark, the stale ones included: it is
    /// for undoing a mark a forged token raised, once the honest holders' tokens are
    /// known. Processes that keep a copy of marks (other gateways on one etcd) see the
    /// change at their next read of the store, which they make before any refusal.
    fn force(&self, resource: &str, to: Option<&Token>) -> Result<Previous, StoreError>;
}

/// What the raw value in a record (`None`: no record) holds for `resource`.
pub(crate) fn previous(resource: &str, value: Option<&[u8]>) -> Previous {
    match value.map(|v| record::decode(resource.as_bytes(), v)) {
        None => Previous::None,
        Some(Ok(mark)) => Previous::Mark(mark),
        Some(Err(e)) => Previous::Damaged(e.to_string()),
    }
}

/// Judge a raise against the raw value in a record (`None`: no record): the
/// previous state, and the floor `to` must lie above, if any.
pub(crate) fn judge(resource: &str, value: Option<&[u8]>, to: &Token) -> (Previous, Option<Token>) {
    let previous = previous(resource, value);
    let floor = match (&previous, value) {
        (Previous::Mark(mark), _) => below(mark, to),
        (Previous::Damaged(_), Some(v)) => record::legible(v).and_then(|seen| below(&seen, to)),
        _ => None,
    };
    (previous, floor)
}

/// `Some(mark)` when `to` does not lie strictly above `mark` (lower, equal, or of
/// another arity).
fn below(mark: &Token, to: &Token) -> Option<Token> {
    (to.partial_cmp(mark) != Some(std::cmp::Ordering::Greater)).then_some(*mark)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    #[test]
    fn a_raise_must_go_above_the_mark_and_above_what_a_damaged_record_shows() {
        let good = record::encode(b"r", &token!("50"));
        assert_eq!(judge("r", None, &token!("1")), (Previous::None, None));
        assert_eq!(judge("r", Some(good.as_bytes()), &token!("51")), (Previous::Mark(token!("50")), None));
        assert_eq!(judge("r", Some(good.as_bytes()), &token!("50")).1, Some(token!("50")));
        assert_eq!(judge("r", Some(good.as_bytes()), &token!("49")).1, Some(token!("50")));
        assert_eq!(judge("r", Some(good.as_bytes()), &token!("51.0")).1, Some(token!("50")), "another arity");
        let mut damaged = good.as_bytes().to_vec();
        damaged[4] = b'9'; // "fk2 90 ..."
        let (previous, floor) = judge("r", Some(&damaged), &token!("60"));
        assert!(matches!(previous, Previous::Damaged(_)));
        assert_eq!(floor, Some(token!("90")));
        assert_eq!(judge("r", Some(&damaged), &token!("91")).1, None);
        assert_eq!(judge("r", Some(b"\xff garbage"), &token!("1")).1, None);
        assert_eq!(judge("r", Some(b"34"), &token!("34")).1, Some(token!("34")), "an old bare token is a floor too");
    }
}
