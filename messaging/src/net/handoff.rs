//! The hand-off queue between compute threads and one INI thread (paper 002 §3.1: a
//! compute thread hands an outgoing inter-cluster message to an INI's queue).
//!
//! A lock-free ring of small plain records; a message's data stays in its Tag-On pool
//! slot until the INI frames it. An idle INI sleeps in `epoll_wait` on its socket and an
//! eventfd; a compute thread writes the eventfd only when the INI has announced that it
//! sleeps (same lost-wake-up argument as the doorbells: `SeqCst` claim, then `SeqCst`
//! load of the flag; the INI stores the flag, then re-checks the ring) — and, with
//! inline INIs, only when its own pass right after the push left the message queued
//! ([`Handoff::push_quiet`]).

use super::frame::FrameKind;
use crate::ring::HeapRing;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// No buffer attached.
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// One outgoing inter-cluster message as handed to an INI.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutMsg {
    pub(crate) kind: FrameKind,
    pub(crate) misscheduled: bool,
    pub(crate) dest_site: u16,
    pub(crate) dest_queue: u16,
    pub(crate) lane: u16,
    pub(crate) seq: u32,
    pub(crate) word: u64,
    /// The pool (site) and slot of the attached buffer, or `NO_SLOT`.
    pub(crate) pool: u16,
    pub(crate) slot: u32,
    /// When the compute thread enqueued it, ns on the job's monotonic clock.
    pub(crate) enqueued_ns: u64,
}

/// A compute → INI queue with its wake-up eventfd and arrival statistics.
pub(crate) struct Handoff {
    pub(crate) ring: HeapRing<OutMsg>,
    sleeping: AtomicU32,
    pub(crate) efd: EventFd,
    /// Messages enqueued, and the sum of the queue lengths they found (mean queue length
    /// seen by arriving messages, paper 002 Table 5.3).
    pub(crate) arrivals: AtomicU64,
    pub(crate) queue_len_sum: AtomicU64,
    /// Messages put here while another INI's queue was empty (paper 002 §5: mis-scheduled).
    pub(crate) misscheduled: AtomicU64,
    /// Times a sender woke the sleeping INI thread to take what it had queued.
    pub(crate) sender_wakeups: AtomicU64,
}

impl Handoff {
    pub(crate) fn new(capacity: usize) -> std::io::Result<Handoff> {
        Ok(Handoff {
            ring: HeapRing::new(capacity),
            sleeping: AtomicU32::new(0),
            efd: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
            arrivals: AtomicU64::new(0),
            queue_len_sum: AtomicU64::new(0),
            misscheduled: AtomicU64::new(0),
            sender_wakeups: AtomicU64::new(0),
        })
    }

    /// Queued messages (approximate).
    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }

    /// Enqueues from a compute thread and wakes the INI if it sleeps; a full queue
    /// hands the message back.
    pub(crate) fn push(&self, msg: OutMsg) -> Result<(), OutMsg> {
        self.push_quiet(msg)?;
        self.wake_if_sleeping();
        Ok(())
    }

    /// [`Handoff::push`] without the wake-up: for a compute thread that runs the INI's
    /// pass itself right after (inline INIs) and wakes the INI only if that pass could
    /// not take the message ([`Handoff::wake_if_sleeping`]).
    pub(crate) fn push_quiet(&self, msg: OutMsg) -> Result<(), OutMsg> {
        let before = self.ring.len() as u64;
        self.ring.push(msg)?;
        self.arrivals.fetch_add(1, Ordering::Relaxed);
        self.queue_len_sum.fetch_add(before, Ordering::Relaxed);
        if msg.misscheduled {
            self.misscheduled.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Wakes the INI if it announced that it sleeps (after a push: the `SeqCst` claim of
    /// the ring slot comes before this `SeqCst` load of the flag).
    pub(crate) fn wake_if_sleeping(&self) {
        if self.sleeping.load(Ordering::SeqCst) != 0 {
            self.sender_wakeups.fetch_add(1, Ordering::Relaxed);
            let _ = self.efd.write(1);
        }
    }

    /// The INI announces it is about to sleep; returns false (and withdraws) if work
    /// arrived meanwhile.
    pub(crate) fn prepare_sleep(&self) -> bool {
        self.sleeping.store(1, Ordering::SeqCst);
        if !self.ring.is_empty() {
            self.sleeping.store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The INI woke up.
    pub(crate) fn woke(&self) {
        self.sleeping.store(0, Ordering::SeqCst);
        let _ = self.efd.read();
    }

    /// Wakes the INI whatever it is doing (shutdown).
    pub(crate) fn kick(&self) {
        let _ = self.efd.write(1);
    }
}
