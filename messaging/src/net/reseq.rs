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

/// Where and when a frame arrived (carried into the trace record of its delivery).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The sending INI of the origin site.
    pub(crate) peer_ini: u8,
    /// When its last datagram was read, ns on the INI group's clock.
    pub(crate) arrived_ns: u64,
}

/// A frame ready for its receive queue: what delivery needs, and who sent it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ready<'a> {
    pub(crate) kind: FrameKind,
    pub(crate) queue: u16,
    pub(crate) word: u64,
    pub(crate) tag: u64,
    pub(crate) data: &'a [u8],
    pub(crate) origin: u16,
    pub(crate) lane: u16,
    pub(crate) seq: u32,
    pub(crate) arrival: Arrival,
}

/// An owned copy of a frame held back for ordering or because its queue was full.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub(crate) kind: FrameKind,
    pub(crate) queue: u16,
    pub(crate) word: u64,
    pub(crate) tag: u64,
    pub(crate) data: Vec<u8>,
    pub(crate) arrival: Arrival,
}

impl Held {
    fn of(f: &Frame<'_>, arrival: Arrival) -> Held {
        Held {
            kind: f.kind,
            queue: f.queue,
            word: f.word,
            tag: f.tag,
            data: f.data.to_vec(),
            arrival,
        }
    }

    fn ready(&self, origin: u16, lane: u16, seq: u32) -> Ready<'_> {
        Ready {
            kind: self.kind,
            queue: self.queue,
            word: self.word,
            tag: self.tag,
            data: &self.data,
            origin,
            lane,
            seq,
            arrival: self.arrival,
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
    /// Accepts one frame that arrived as `arrival` says; delivers it and any held
    /// successors that are now in order. Returns the number delivered.
    pub(crate) fn accept(
        &self,
        f: &Frame<'_>,
        arrival: Arrival,
        mut deliver: impl FnMut(&Ready<'_>) -> Delivery,
    ) -> usize {
        let mut lanes = self.lanes.lock();
        let lane = lanes.entry((f.origin, f.lane)).or_default();
        if before(f.seq, lane.next) {
            // Already delivered: the window never duplicates, so only a corrupt or hostile
            // peer gets here. Drop it.
            return 0;
        }
        if f.seq == lane.next && lane.held.is_empty() {
            let ready = Ready {
                kind: f.kind,
                queue: f.queue,
                word: f.word,
                tag: f.tag,
                data: f.data,
                origin: f.origin,
                lane: f.lane,
                seq: f.seq,
                arrival,
            };
            if deliver(&ready) == Delivery::Retry {
                lane.held.insert(f.seq, Held::of(f, arrival));
                return 0;
            }
            lane.next = lane.next.wrapping_add(1);
            return 1;
        }
        lane.held.insert(f.seq, Held::of(f, arrival));
        Self::drain((f.origin, f.lane), lane, &mut deliver)
    }

    fn drain(
        (origin, id): (u16, u16),
        lane: &mut Lane,
        deliver: &mut impl FnMut(&Ready<'_>) -> Delivery,
    ) -> usize {
        let mut n = 0;
        while let Some(h) = lane.held.get(&lane.next) {
            if deliver(&h.ready(origin, id, lane.next)) == Delivery::Retry {
                break;
            }
            lane.held.remove(&lane.next);
            lane.next = lane.next.wrapping_add(1);
            n += 1;
        }
        n
    }

    /// Retries every lane whose next message is held (after queues drained).
    pub(crate) fn retry(&self, mut deliver: impl FnMut(&Ready<'_>) -> Delivery) -> usize {
        let mut lanes = self.lanes.lock();
        lanes
            .iter_mut()
            .map(|(&key, lane)| Self::drain(key, lane, &mut deliver))
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
        let d = |r: &Ready<'_>| {
            if full.get() {
                Delivery::Retry
            } else {
                assert_eq!(
                    u64::from(r.seq),
                    r.word,
                    "the sequence number travels along"
                );
                out.borrow_mut().push(r.word);
                Delivery::Done
            }
        };
        let a = Arrival::default();
        assert_eq!(r.accept(&frame(0, 1), a, d), 0);
        assert_eq!(r.accept(&frame(0, 2), a, d), 0);
        assert_eq!(
            r.accept(&frame(5, 0), a, d),
            1,
            "another lane is independent"
        );
        assert_eq!(r.accept(&frame(0, 0), a, d), 3);
        assert_eq!(
            r.accept(&frame(0, 1), a, d),
            0,
            "an old duplicate is dropped"
        );
        assert_eq!(*out.borrow(), vec![0, 0, 1, 2]);
        full.set(true);
        assert_eq!(r.accept(&frame(0, 3), a, d), 0);
        assert_eq!(r.accept(&frame(0, 4), a, d), 0);
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
