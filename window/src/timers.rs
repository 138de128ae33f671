//! Software timer lists (thesis §3.2.2).
//!
//! The thesis keeps one `send_timers` and one `ack_timers` structure per INI node. Since
//! every timer of a kind has the same fixed timeout (§3.2.1), a timer started later
//! expires no earlier than every pending one, so each structure is a FIFO ordered by
//! deadline: start = push at the back, expiry = pop at the front, both O(1). The thesis
//! stores "ticks to go" relative to the previous record; storing the absolute deadline
//! is the same order with simpler arithmetic.
//!
//! Cancellation is lazy: where the thesis de-links records on an ACK, the owner here
//! leaves the record in place and, when it reaches the front, checks whether it is still
//! current (for SEND timers: the frame is still unacknowledged and was last sent at
//! `deadline - timeout`). A record is thus touched once when pushed and once when
//! popped, and the list holds at most the timers started within one timeout.
//!
//! An adaptive retransmission timeout (ours, [`crate::WindowConfig::adaptive_timeout`])
//! is never shorter than the fixed SEND timeout, so the list keeps its order: a record
//! is pushed for one fixed timeout, and one that expires before its frame's own timeout
//! is pushed again (at most one fixed timeout later), until that timeout has passed.

use super::Micros;
use std::collections::VecDeque;

/// A FIFO of timers of one fixed-timeout kind, ordered by deadline (thesis §3.2.2).
///
/// Contract: deadlines are pushed in non-decreasing order, which holds when every timer
/// of the list is started as `now + timeout` with one fixed `timeout` and a monotonic
/// `now`. A deadline earlier than the last one pushed is raised to it, so the list stays
/// ordered and the timer fires late rather than never.
#[derive(Debug, Clone)]
pub struct TimerList<T> {
    entries: VecDeque<(Micros, T)>,
}

impl<T> Default for TimerList<T> {
    fn default() -> Self {
        TimerList {
            entries: VecDeque::new(),
        }
    }
}

impl<T> TimerList<T> {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a timer for `item` expiring at `deadline` (µs). O(1) amortized.
    pub fn push(&mut self, deadline: Micros, item: T) {
        let deadline = match self.entries.back() {
            Some(&(last, _)) if last > deadline => last,
            _ => deadline,
        };
        self.entries.push_back((deadline, item));
    }

    /// The earliest deadline, if any timer is pending (possibly a lazily cancelled one).
    pub fn next_deadline(&self) -> Option<Micros> {
        self.entries.front().map(|&(d, _)| d)
    }

    /// The earliest timer, without removing it.
    pub fn peek(&self) -> Option<&(Micros, T)> {
        self.entries.front()
    }

    /// Removes and returns the earliest timer, whatever its deadline.
    pub fn pop(&mut self) -> Option<(Micros, T)> {
        self.entries.pop_front()
    }

    /// Removes and returns the earliest timer if its deadline is at or before `now`.
    pub fn pop_expired(&mut self, now: Micros) -> Option<(Micros, T)> {
        match self.entries.front() {
            Some(&(d, _)) if d <= now => self.entries.pop_front(),
            _ => None,
        }
    }

    /// Number of timer records held, lazily cancelled ones included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expires_in_deadline_order() {
        let mut t = TimerList::new();
        assert!(t.is_empty());
        assert_eq!(t.next_deadline(), None);
        t.push(Micros(10), 'a');
        t.push(Micros(10), 'b');
        t.push(Micros(25), 'c');
        assert_eq!(t.len(), 3);
        assert_eq!(t.next_deadline(), Some(Micros(10)));
        assert_eq!(t.pop_expired(Micros(9)), None);
        assert_eq!(t.pop_expired(Micros(10)), Some((Micros(10), 'a')));
        assert_eq!(t.pop_expired(Micros(24)), Some((Micros(10), 'b')));
        assert_eq!(t.pop_expired(Micros(24)), None);
        assert_eq!(t.peek(), Some(&(Micros(25), 'c')));
        assert_eq!(t.pop_expired(Micros(100)), Some((Micros(25), 'c')));
        assert_eq!(t.pop(), None);
    }

    #[test]
    fn earlier_deadline_is_raised_not_reordered() {
        let mut t = TimerList::new();
        t.push(Micros(50), 1);
        t.push(Micros(40), 2);
        assert_eq!(t.pop(), Some((Micros(50), 1)));
        assert_eq!(t.pop(), Some((Micros(50), 2)));
    }

    #[test]
    fn fixed_timeout_fifo_matches_a_sorted_reference() {
        // Timers started at random non-decreasing times with one fixed timeout expire
        // exactly in the order and at the times a sorted reference says.
        let timeout = Micros(700);
        let mut now = Micros(0);
        let mut t = TimerList::new();
        let mut reference = Vec::new();
        let mut x: u64 = 12345;
        for i in 0..1000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            now = now + Micros((x >> 33) % 50);
            t.push(now + timeout, i);
            reference.push((now + timeout, i));
        }
        reference.sort_by_key(|&(d, i)| (d, i));
        let mut got = Vec::new();
        let mut clock = Micros(0);
        while let Some(d) = t.next_deadline() {
            clock = clock.max(d);
            while let Some(e) = t.pop_expired(clock) {
                got.push(e);
            }
        }
        assert_eq!(got, reference);
    }
}
