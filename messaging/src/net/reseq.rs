//! Restoring each sender's order at the receiving site.
//!
//! A sliding-window connection delivers in order, but a scheduling policy may send one
//! lane's (one sending endpoint's) messages through different INIs and connections, so
//! they can arrive out of order. Every frame carries a sequence number per (origin lane,
//! destination site); the receiving site delivers each lane's messages in that order,
//! holding early arrivals. A message that cannot be delivered yet (its queue is full, the
//! pool is exhausted) blocks its lane and is retried — nothing is dropped.

use super::frame::{Frame, FrameKind};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

/// An owned copy of a frame held back for ordering or because its queue was full.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub(crate) kind: FrameKind,
    pub(crate) queue: u16,
    pub(crate) word: u64,
    pub(crate) tag: u64,
    pub(crate) data: Vec<u8>,
}

impl Held {
    fn of(f: &Frame<'_>) -> Held {
        Held {
            kind: f.kind,
            queue: f.queue,
            word: f.word,
            tag: f.tag,
            data: f.data.to_vec(),
        }
    }
}

/// What a delivery attempt achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// In the destination queue (or rejected as malformed and counted): move on.
    Done,
    /// Queue full or pool exhausted: try again later.
    Retry,
}

#[derive(Debug, Default)]
struct Lane {
    next: u32,
    held: BTreeMap<u32, Held>,
}

/// Per-lane resequencing state of one site (shared by its INIs).
#[derive(Debug, Default)]
pub(crate) struct Resequencer {
    lanes: Mutex<HashMap<(u16, u16), Lane>>,
}

/// Wrapping comparison of 32-bit sequence numbers: true if `a` comes before `b`.
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

impl Resequencer {
    /// Accepts one frame; delivers it and any held successors that are now in order.
    /// Returns the number delivered.
    pub(crate) fn accept(
        &self,
        f: &Frame<'_>,
        mut deliver: impl FnMut(FrameKind, u16, u64, u64, &[u8]) -> Delivery,
    ) -> usize {
        let mut lanes = self.lanes.lock();
        let lane = lanes.entry((f.origin, f.lane)).or_default();
        if before(f.seq, lane.next) {
            // Already delivered: the window never duplicates, so only a corrupt or hostile
            // peer gets here. Drop it.
            return 0;
        }
        if f.seq == lane.next && lane.held.is_empty() {
            if deliver(f.kind, f.queue, f.word, f.tag, f.data) == Delivery::Retry {
                lane.held.insert(f.seq, Held::of(f));
                return 0;
            }
            lane.next = lane.next.wrapping_add(1);
            return 1;
        }
        lane.held.insert(f.seq, Held::of(f));
        Self::drain(lane, &mut deliver)
    }

    fn drain(
        lane: &mut Lane,
        deliver: &mut impl FnMut(FrameKind, u16, u64, u64, &[u8]) -> Delivery,
    ) -> usize {
        let mut n = 0;
        while let Some(h) = lane.held.get(&lane.next) {
            if deliver(h.kind, h.queue, h.word, h.tag, &h.data) == Delivery::Retry {
                break;
            }
            lane.held.remove(&lane.next);
            lane.next = lane.next.wrapping_add(1);
            n += 1;
        }
        n
    }

    /// Retries every lane whose next message is held (after queues drained).
    pub(crate) fn retry(
        &self,
        mut deliver: impl FnMut(FrameKind, u16, u64, u64, &[u8]) -> Delivery,
    ) -> usize {
        let mut lanes = self.lanes.lock();
        lanes
            .values_mut()
            .map(|lane| Self::drain(lane, &mut deliver))
            .sum()
    }

    /// Messages held back.
    pub(crate) fn held(&self) -> usize {
        self.lanes.lock().values().map(|l| l.held.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(lane: u16, seq: u32) -> Frame<'static> {
        Frame {
            kind: FrameKind::Express,
            queue: 0,
            origin: 1,
            lane,
            seq,
            word: u64::from(seq),
            tag: 0,
            data: &[],
        }
    }

    #[test]
    fn restores_order_per_lane_and_retries_when_full() {
        let r = Resequencer::default();
        let out = std::cell::RefCell::new(Vec::new());
        let full = std::cell::Cell::new(false);
        let d = |_: FrameKind, _: u16, w: u64, _: u64, _: &[u8]| {
            if full.get() {
                Delivery::Retry
            } else {
                out.borrow_mut().push(w);
                Delivery::Done
            }
        };
        assert_eq!(r.accept(&frame(0, 1), d), 0);
        assert_eq!(r.accept(&frame(0, 2), d), 0);
        assert_eq!(r.accept(&frame(5, 0), d), 1, "another lane is independent");
        assert_eq!(r.accept(&frame(0, 0), d), 3);
        assert_eq!(r.accept(&frame(0, 1), d), 0, "an old duplicate is dropped");
        assert_eq!(*out.borrow(), vec![0, 0, 1, 2]);
        full.set(true);
        assert_eq!(r.accept(&frame(0, 3), d), 0);
        assert_eq!(r.accept(&frame(0, 4), d), 0);
        assert_eq!(r.held(), 2);
        full.set(false);
        assert_eq!(r.retry(d), 2);
        assert_eq!(*out.borrow(), vec![0, 0, 1, 2, 3, 4]);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn sequence_numbers_wrap() {
        assert!(before(u32::MAX, 0));
        assert!(!before(0, u32::MAX));
        assert!(before(5, 6));
    }
}
