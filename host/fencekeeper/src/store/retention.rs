//! Retention: forget the marks of idle resources, under a floor that never lets a
//! token below a forgotten mark in.
//!
//! A store keeps one mark per resource ever written. For tokens that are ordered
//! across every resource (etcd revisions, ZooKeeper zxids), a store may forget the
//! marks of resources whose mark has not risen for a while, if it first raises one
//! **floor** to at or above every mark it forgets. A resource without a mark is held
//! to the floor: a token below it is refused as stale, with a reason that names
//! retention; a token at or above it is admitted and gives the resource a mark of its
//! own again. The floor only rises, and it is raised (durably) before any mark under
//! it is removed, so at every instant each resource's mark, or the floor where it has
//! none, lies at or above every token it ever admitted.
//!
//! Only a mark that has not risen for the idle time is forgotten: a holder that keeps
//! one token longer than that may find its resource's mark forgotten and its token
//! below the floor (refused, never admitted wrongly). Pick the idle time above the
//! longest time one lock is held.
//!
//! Per-lock counters (a Redis `INCR`, a Redisson fenced lock) are not ordered across
//! resources: one lock's counter at 7 says nothing about another's at 900, and the
//! floor of the two would refuse every holder of the first. Retention is not for
//! them (docs/tokens.md).

use super::{MarkStore, StoreError};
use fencekeeper_core::Token;
use std::collections::HashMap;
use std::time::Duration;

/// The result of one compaction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compaction {
    /// The marks forgotten, sorted by resource.
    pub forgotten: Vec<(String, Token)>,
    /// The floor before.
    pub floor_before: Option<Token>,
    /// The floor now: at or above every mark forgotten, this time or before.
    pub floor: Option<Token>,
    /// Marks kept: not idle long enough, or changed while the compaction ran.
    pub kept: usize,
    /// Marks kept because their tokens have another number of components than the
    /// floor, so no floor can stand for them.
    pub other_arity: usize,
    /// When nothing could be known idle yet: why (the store has not watched its marks
    /// for the idle time), and so nothing was forgotten.
    pub not_yet: Option<String>,
}

/// Stores that can forget idle marks: the file store and etcd.
pub trait Retention: MarkStore {
    /// Forget the marks that have not risen for `idle_for`, raising the floor to at or
    /// above each of them first. Safe to run at any time, beside admits: a mark that
    /// rises while the compaction runs is kept. `now_unix_secs` is the current time
    /// (seconds since the Unix epoch); a wrong clock can make a compaction forget a
    /// mark too early (a holder refused) or too late, never admit a stale token.
    fn compact(&self, idle_for: Duration, now_unix_secs: u64) -> Result<Compaction, StoreError>;
}

/// What a compaction decides from the marks it read: which to forget, and the floor.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The marks to forget, sorted by resource.
    pub forget: Vec<(String, Token)>,
    /// The floor after: the old one, or the highest forgotten mark above it.
    pub floor: Option<Token>,
    /// Idle marks kept for their arity.
    pub other_arity: usize,
}

/// Plan a compaction over `idle` (the marks known idle long enough) under `floor`.
/// The floor's arity is the old floor's, else that of the most idle marks (ties:
/// the fewest components); idle marks of another arity are kept.
pub(crate) fn plan(floor: Option<Token>, mut idle: Vec<(String, Token)>) -> Plan {
    let arity = floor.map(|f| f.arity()).or_else(|| {
        let mut counts: HashMap<usize, usize> = HashMap::new();
        for (_, t) in &idle {
            *counts.entry(t.arity()).or_default() += 1;
        }
        counts.into_iter().max_by_key(|&(arity, n)| (n, std::cmp::Reverse(arity))).map(|(arity, _)| arity)
    });
    let before = idle.len();
    idle.retain(|(_, t)| Some(t.arity()) == arity);
    idle.sort_by(|a, b| a.0.cmp(&b.0));
    let highest = idle.iter().map(|(_, t)| *t).max_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let floor = match (floor, highest) {
        (Some(f), Some(h)) if h.partial_cmp(&f).is_some_and(|o| o.is_gt()) => Some(h),
        (Some(f), _) => Some(f),
        (None, h) => h,
    };
    Plan { other_arity: before - idle.len(), forget: idle, floor }
}

/// Whether `token` may give a resource without a mark its first mark under `floor`:
/// at or above it, and of its arity.
pub fn clears(floor: Option<&Token>, token: &Token) -> bool {
    floor.is_none_or(|f| f.partial_cmp(token).is_some_and(|o| o.is_le()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    fn marks(list: &[(&str, &str)]) -> Vec<(String, Token)> {
        list.iter().map(|(r, t)| ((*r).to_owned(), token!(t))).collect()
    }

    #[test]
    fn the_floor_rises_to_the_highest_forgotten_mark_and_never_falls() {
        let p = plan(None, marks(&[("b", "9"), ("a", "40"), ("c", "12")]));
        assert_eq!(p.floor, Some(token!("40")));
        assert_eq!(p.forget, marks(&[("a", "40"), ("b", "9"), ("c", "12")]));
        let p = plan(Some(token!("100")), marks(&[("a", "40")]));
        assert_eq!(p.floor, Some(token!("100")), "a lower forgotten mark leaves the floor");
        assert_eq!(plan(Some(token!("7")), vec![]).floor, Some(token!("7")));
        assert_eq!(plan(None, vec![]).floor, None);
    }

    #[test]
    fn marks_of_another_arity_than_the_floor_are_kept() {
        let p = plan(Some(token!("5")), marks(&[("a", "1.2"), ("b", "9")]));
        assert_eq!((p.forget, p.other_arity, p.floor), (marks(&[("b", "9")]), 1, Some(token!("9"))));
        let p = plan(None, marks(&[("a", "1.2"), ("b", "9"), ("c", "3.4")]));
        assert_eq!((p.other_arity, p.floor), (1, Some(token!("3.4"))), "the arity of most");
    }

    #[test]
    fn a_first_mark_clears_the_floor_at_or_above_it_and_of_its_arity() {
        assert!(clears(None, &token!("1")));
        assert!(clears(Some(&token!("10")), &token!("10")));
        assert!(clears(Some(&token!("10")), &token!("11")));
        assert!(!clears(Some(&token!("10")), &token!("9")));
        assert!(!clears(Some(&token!("10")), &token!("10.1")), "not comparable: refused");
    }
}
