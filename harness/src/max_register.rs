//! A linearizability checker for one resource's admits against a max-register.
//!
//! Each admit is one operation with a start and an end stamp from one clock (so "A
//! returned before B was called" is `A.end < B.start`) and what it answered. A history
//! is linearizable against a max-register starting empty exactly when, ordering the
//! operations by the value they saw (the admitted token, or the mark a refusal
//! reported):
//!
//! * that order respects real time (an op that returned before another was called
//!   saw no higher value);
//! * every value seen was written by an admit of that token that began before the
//!   observer returned;
//! * no refusal reports a mark at or below its own token, no two admits both advanced
//!   to one token, and the final mark is the highest token written.
//!
//! An answer may be unknown (a timeout, a 503 from a host that had already sent its
//! compare-and-swap): such an admit may have written its token at any time after it
//! began, or never. It is used as a writer only where a value seen needs it.
//!
//! Used by the integration test `tests/tests/all/concurrency.rs` (threads through one
//! guard) and by the torture harness (`tests/torture`, real hosts over HTTP).

use std::collections::HashMap;

/// What one admit answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Admitted; `Some(true)` if the host said the mark advanced, `Some(false)` if it
    /// said it was unchanged, `None` if it did not say (an HTTP client does not know).
    Admitted {
        /// Whether the mark advanced, when known.
        advanced: Option<bool>,
    },
    /// Refused as stale, reporting the mark.
    Stale {
        /// The mark the refusal reported.
        mark: u64,
    },
    /// No answer that says what happened: the token may or may not have been written.
    Unknown,
}

/// One admit on the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// The presented token.
    pub token: u64,
    /// The answer.
    pub answer: Answer,
    /// Stamp before the call.
    pub start: u64,
    /// Stamp after the return (ignored for [`Answer::Unknown`]: it may act later).
    pub end: u64,
}

impl Op {
    /// The register's value at the op's linearization point, if it saw one.
    pub fn value(&self) -> Option<u64> {
        match self.answer {
            Answer::Admitted { .. } | Answer::Unknown => Some(self.token),
            Answer::Stale { mark } => Some(mark),
        }
    }

    fn known(&self) -> bool {
        self.answer != Answer::Unknown
    }
}

/// What is wrong with a history: one line, and the ops (indexes into the history)
/// that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// What is wrong.
    pub message: String,
    /// The ops involved.
    pub ops: Vec<usize>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn violation(message: String, ops: Vec<usize>) -> Result<(), Violation> {
    Err(Violation { message, ops })
}

/// Check one resource's history against a max-register starting empty; `final_mark`
/// is the store's mark after the run (`None`: not read, nothing checked about it).
pub fn check(ops: &[Op], final_mark: Option<Option<u64>>) -> Result<(), Violation> {
    let mut advanced: HashMap<u64, usize> = HashMap::new();
    // Per value: the earliest-starting known writer, and the earliest unknown one.
    let mut known_writer: HashMap<u64, usize> = HashMap::new();
    let mut unknown_writer: HashMap<u64, usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        match op.answer {
            Answer::Stale { mark } if op.token >= mark => {
                return violation(format!("{op:?}: refused as stale at or above the mark it reported"), vec![i]);
            }
            Answer::Admitted { advanced: Some(true) } => {
                if let Some(other) = advanced.insert(op.token, i) {
                    return violation(
                        format!("{op:?} and {:?} both advanced to one token", ops[other]),
                        vec![other, i],
                    );
                }
            }
            _ => {}
        }
        let writers = if op.known() { &mut known_writer } else { &mut unknown_writer };
        if matches!(op.answer, Answer::Admitted { .. } | Answer::Unknown) {
            let first = writers.entry(op.token).or_insert(i);
            if ops[*first].start > op.start {
                *first = i;
            }
        }
    }
    // Which writer stands for each value: the known one if every observer of the value
    // returned after it began, else an unknown one that began early enough.
    let mut used_unknown: Vec<usize> = Vec::new();
    let mut writer_of: HashMap<u64, usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate().filter(|(_, op)| op.known()) {
        let Some(value) = op.value() else { continue };
        let fits = |w: &usize| op.end >= ops[*w].start;
        let chosen = match writer_of.get(&value) {
            Some(w) if fits(w) => *w,
            _ => match (known_writer.get(&value).filter(|w| fits(w)), unknown_writer.get(&value).filter(|w| fits(w))) {
                (Some(w), _) => *w,
                (None, Some(u)) => {
                    used_unknown.push(*u);
                    *u
                }
                (None, None) => {
                    let near: Vec<usize> = known_writer.get(&value).into_iter().copied().chain([i]).collect();
                    return violation(
                        format!("{op:?} saw value {value}, which no admit that began before it returned wrote"),
                        near,
                    );
                }
            },
        };
        writer_of.insert(value, chosen);
    }
    // Real time: an op that returned before another was called saw no higher value.
    let mut swept: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].known()).collect();
    swept.extend(used_unknown.iter().copied());
    let mut by_end: Vec<usize> = swept.iter().copied().filter(|&i| ops[i].known()).collect();
    by_end.sort_by_key(|&i| ops[i].end);
    swept.sort_by_key(|&i| ops[i].start);
    let (mut done, mut highest): (usize, Option<usize>) = (0, None);
    for i in swept {
        let op = &ops[i];
        while done < by_end.len() && ops[by_end[done]].end < op.start {
            let d = by_end[done];
            if highest.is_none_or(|h| ops[d].value() > ops[h].value()) {
                highest = Some(d);
            }
            done += 1;
        }
        if let Some(h) = highest.filter(|&h| ops[h].value() > op.value()) {
            return violation(
                format!(
                    "{op:?} saw {:?} although {:?} had already returned with {:?}",
                    op.value(),
                    ops[h],
                    ops[h].value()
                ),
                vec![h, i],
            );
        }
    }
    let Some(final_mark) = final_mark else { return Ok(()) };
    let max_known = known_writer.keys().max().copied();
    let fine = match final_mark {
        None => max_known.is_none(),
        Some(m) => {
            max_known.is_none_or(|k| m >= k) && (known_writer.contains_key(&m) || unknown_writer.contains_key(&m))
        }
    };
    if !fine {
        let near: Vec<usize> = max_known.and_then(|k| known_writer.get(&k)).into_iter().copied().collect();
        return violation(
            format!("final mark {final_mark:?} is not the highest token written (highest admitted: {max_known:?})"),
            near,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The checker must reject histories a max-register cannot produce.
    use super::*;

    fn op(token: u64, answer: Answer, start: u64, end: u64) -> Op {
        Op { token, answer, start, end }
    }
    const ADV: Answer = Answer::Admitted { advanced: Some(true) };
    const SAME: Answer = Answer::Admitted { advanced: Some(false) };
    const OK: Answer = Answer::Admitted { advanced: None };
    const LOST: Answer = Answer::Unknown;

    fn stale(mark: u64) -> Answer {
        Answer::Stale { mark }
    }

    #[test]
    fn accepts_a_sequential_history() {
        let h = [op(33, ADV, 0, 1), op(34, ADV, 2, 3), op(33, stale(34), 4, 5), op(34, SAME, 6, 7)];
        assert_eq!(check(&h, Some(Some(34))), Ok(()));
    }

    #[test]
    fn accepts_overlapping_admits_in_either_order() {
        // 34 and 33 overlap: 33 may linearize first and advance too.
        let h = [op(34, ADV, 0, 5), op(33, ADV, 1, 2)];
        assert_eq!(check(&h, Some(Some(34))), Ok(()));
    }

    #[test]
    fn rejects_a_lower_admit_after_a_higher_one_returned() {
        let h = [op(34, ADV, 0, 1), op(33, ADV, 2, 3)];
        assert!(check(&h, Some(Some(34))).is_err());
        let h = [op(34, OK, 0, 1), op(33, OK, 2, 3)];
        assert_eq!(check(&h, Some(Some(34))).map_err(|v| v.ops), Err(vec![0, 1]));
    }

    #[test]
    fn rejects_a_refusal_reporting_a_mark_lower_than_an_earlier_admit() {
        let h = [op(33, ADV, 0, 1), op(35, ADV, 2, 3), op(30, stale(33), 4, 5)];
        assert!(check(&h, Some(Some(35))).is_err());
    }

    #[test]
    fn rejects_a_refusal_citing_a_mark_nobody_wrote_yet() {
        let h = [op(30, stale(33), 0, 1), op(33, ADV, 2, 3)];
        assert!(check(&h, Some(Some(33))).is_err());
    }

    #[test]
    fn rejects_two_advances_to_one_token_and_a_wrong_final_mark() {
        assert!(check(&[op(33, ADV, 0, 3), op(33, ADV, 1, 2)], Some(Some(33))).is_err());
        assert!(check(&[op(33, ADV, 0, 1)], Some(Some(32))).is_err());
        assert!(check(&[op(33, OK, 0, 1)], Some(None)).is_err());
        assert!(check(&[op(30, stale(33), 0, 1)], None).is_err());
    }

    #[test]
    fn an_unknown_answer_may_have_written_its_token_later() {
        // 36 timed out; a refusal afterwards reports 36: the timed-out Txn committed.
        let h = [op(35, OK, 0, 1), op(36, LOST, 2, 3), op(34, stale(36), 10, 11)];
        assert_eq!(check(&h, Some(Some(36))), Ok(()));
        // ...or it did not: the mark stays 35.
        assert_eq!(check(&h[..2], Some(Some(35))), Ok(()));
        // But it cannot have written before it began.
        let h = [op(34, stale(36), 0, 1), op(36, LOST, 2, 3)];
        assert!(check(&h, None).is_err());
        // Nor below a value that had returned before it began.
        let h = [op(37, OK, 0, 1), op(36, LOST, 2, 3), op(30, stale(36), 4, 5)];
        assert!(check(&h, None).is_err());
    }
}
