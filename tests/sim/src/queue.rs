//! The virtual clock and the event queue. Time is nanoseconds since the run began;
//! it moves only when the next event is taken. Events at the same instant are taken
//! in the order they were scheduled (a sequence number breaks ties), so the order
//! never depends on anything but the run itself.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Nanoseconds of virtual time.
pub type Nanos = u64;

/// A millisecond of virtual time.
pub const MS: Nanos = 1_000_000;

struct Entry<E> {
    at: Nanos,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    // Reversed: `BinaryHeap` is a max-heap, the queue takes the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Events ordered by (time, sequence), and the clock they move.
pub struct Queue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
    now: Nanos,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue { heap: BinaryHeap::new(), seq: 0, now: 0 }
    }
}

impl<E> Queue<E> {
    /// The current virtual time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Schedule `event` at `at` (never before now: the past is moved to now).
    pub fn at(&mut self, at: Nanos, event: E) {
        self.seq += 1;
        self.heap.push(Entry { at: at.max(self.now), seq: self.seq, event });
    }

    /// Schedule `event` after `delay`.
    pub fn after(&mut self, delay: Nanos, event: E) {
        self.at(self.now.saturating_add(delay), event);
    }

    /// Take the next event and move the clock to its time.
    pub fn take(&mut self) -> Option<E> {
        let entry = self.heap.pop()?;
        self.now = entry.at;
        Some(entry.event)
    }

    /// Events still scheduled.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// No event scheduled.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_by_time_then_by_scheduling_order() {
        let mut q = Queue::default();
        q.at(5, "b");
        q.at(3, "a");
        q.at(5, "c");
        assert_eq!((q.take(), q.now()), (Some("a"), 3));
        assert_eq!((q.take(), q.now()), (Some("b"), 5));
        // The past is now, after what was already scheduled for now.
        q.at(1, "past");
        assert_eq!((q.take(), q.now()), (Some("c"), 5));
        assert_eq!((q.take(), q.now()), (Some("past"), 5));
        assert_eq!(q.take(), None);
    }
}
