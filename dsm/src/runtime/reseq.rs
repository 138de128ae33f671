//! Handling each sender's bundles in the order it numbered them.
//!
//! A cluster numbers its bundles to each destination (see the wire module's
//! [Bundles](crate::wire#bundles)). The receiving cluster's threads take messages from
//! its protocol queue concurrently and then race for the coherence machine, so the
//! thread holding bundle *n* + 1 may get there first. The machine's calling contract
//! (point 5) needs the messages one event sent to one cluster handled in the order
//! emitted, and those may span several bundles. A [`Resequencer`] per sender lets one
//! thread at a time handle that sender's bundles, in number order: a thread that holds
//! the next bundle takes it; one that holds a later bundle leaves it here, and the
//! thread that finishes the bundle before it takes it on. Nobody waits.
//!
//! Source: this project (issue 10; Water 4096 × 3 on 8 × 2 clusters failed about once
//! in 18 runs without it); the reorder buffer of TCP and of the INIs' sliding window
//! (`multigrain-window`) works the same way.

use std::collections::BTreeMap;

/// How far ahead of the next expected bundle a held one may be. Bundles wait here only
/// while another thread of this cluster holds their predecessor — received, about to be
/// handled, or received while one of its own sends was blocked (then handled after that
/// event) — so a correct sender is rarely more than a few ahead; the bound only stops a
/// broken peer from making this cluster hold bundles without end (every peer is
/// authenticated, see the INIs' MAC).
pub(crate) const MAX_HELD: usize = 1 << 16;

/// Bundles of one sender: the number of the next one to handle, whether a thread is
/// handling bundles of this sender now, and the later bundles that arrived first.
#[derive(Debug, Default)]
pub(crate) struct Resequencer {
    next: u32,
    busy: bool,
    held: BTreeMap<u32, Vec<u8>>,
}

/// What to do with an offered bundle.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Handle it now, then call [`Resequencer::done`].
    Take(Vec<u8>),
    /// Kept for the thread that handles its predecessor.
    Held,
}

impl Resequencer {
    /// A received bundle numbered `seq`, with its body.
    ///
    /// # Errors
    /// A reason naming the number if the bundle was handled or is held already
    /// (a duplicate or replay), or if it is [`MAX_HELD`] or more ahead of the next one.
    pub(crate) fn offer(&mut self, seq: u32, data: Vec<u8>) -> Result<Offer, String> {
        if seq == self.next && !self.busy {
            self.busy = true;
            return Ok(Offer::Take(data));
        }
        let ahead = seq.wrapping_sub(self.next);
        if ahead == 0 || ahead as usize >= MAX_HELD || self.held.contains_key(&seq) {
            return Err(format!(
                "bundle number {seq} is not among the next {MAX_HELD} expected (next {})",
                self.next
            ));
        }
        self.held.insert(seq, data);
        Ok(Offer::Held)
    }

    /// The bundle taken last has been handled: returns the next one if it is held (to
    /// handle now, then call `done` again); otherwise the sender's next bundle goes to
    /// whichever thread receives it.
    pub(crate) fn done(&mut self) -> Option<Vec<u8>> {
        debug_assert!(self.busy, "done without a bundle taken");
        self.next = self.next.wrapping_add(1);
        let next = self.held.remove(&self.next);
        self.busy = next.is_some();
        next
    }

    /// Bundles held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: u8) -> Vec<u8> {
        vec![n]
    }

    #[test]
    fn bundles_in_order_are_taken_at_once() {
        let mut r = Resequencer::default();
        for n in 0..5u8 {
            assert_eq!(r.offer(u32::from(n), body(n)), Ok(Offer::Take(body(n))));
            assert_eq!(r.done(), None);
        }
    }

    /// Bundles 1 and 2 arrive while 0 is handled (or before it arrives): they wait,
    /// and the thread that finishes 0 takes 1, then 2, in order.
    #[test]
    fn later_bundles_wait_for_the_thread_handling_their_predecessor() {
        let mut r = Resequencer::default();
        assert_eq!(r.offer(2, body(2)), Ok(Offer::Held));
        assert_eq!(r.offer(0, body(0)), Ok(Offer::Take(body(0))));
        assert_eq!(r.offer(1, body(1)), Ok(Offer::Held));
        assert_eq!(r.held(), 2);
        assert_eq!(r.done(), Some(body(1)));
        assert_eq!(r.done(), Some(body(2)));
        assert_eq!(r.done(), None);
        assert_eq!(r.held(), 0);
        // The next one goes to whoever receives it.
        assert_eq!(r.offer(3, body(3)), Ok(Offer::Take(body(3))));
    }

    #[test]
    fn numbers_wrap() {
        let mut r = Resequencer {
            next: u32::MAX,
            ..Resequencer::default()
        };
        assert_eq!(r.offer(0, body(0)), Ok(Offer::Held));
        assert_eq!(r.offer(u32::MAX, body(9)), Ok(Offer::Take(body(9))));
        assert_eq!(r.done(), Some(body(0)));
        assert_eq!(r.done(), None);
    }

    /// A duplicate, a replay of a handled bundle, or one far ahead is refused, never
    /// held or handled twice.
    #[test]
    fn duplicates_replays_and_far_numbers_are_refused() {
        let mut r = Resequencer::default();
        assert_eq!(r.offer(0, body(0)), Ok(Offer::Take(body(0))));
        let e = r.offer(0, body(0)).unwrap_err();
        assert!(e.contains("bundle number 0"), "{e}");
        assert_eq!(r.offer(1, body(1)), Ok(Offer::Held));
        assert!(r.offer(1, body(1)).is_err());
        assert_eq!(r.done(), Some(body(1)));
        assert_eq!(r.done(), None);
        assert!(r.offer(1, body(1)).is_err(), "a replay of a handled bundle");
        assert!(r.offer(2 + MAX_HELD as u32, body(0)).is_err());
        assert_eq!(r.offer(1 + MAX_HELD as u32, body(0)), Ok(Offer::Held));
        assert_eq!(r.held(), 1);
    }
}
