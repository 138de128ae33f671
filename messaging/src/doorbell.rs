//! Doorbells: how an idle receiver sleeps until a message arrives.
//!
//! Polling alone makes an idle receiver burn a core; paper 003 §4 shows why a time-shared
//! node needs message *events*. A doorbell is a futex word plus a waiter count, placed in
//! the same memory as the rings that ring it (process-private or a shared segment, so it
//! works across processes: the futex is not `FUTEX_PRIVATE`). Several rings may share one
//! doorbell, so one receiver can sleep on all its queues at once.
//!
//! The futex word holds a sequence number (bits 1..32) and an *armed* flag (bit 0): a
//! receiver arms the doorbell before it sleeps; the first sender after that disarms it,
//! bumps the sequence and calls `FUTEX_WAKE`; later senders see it disarmed and make no
//! system call until a receiver arms it again. A burst of messages to a sleeping receiver
//! thus costs one wake-up, not one per message (40 Tag-On updates at an EM3D barrier made
//! 40 `FUTEX_WAKE` calls before).
//!
//! Lost-wakeup argument (every operation below is `SeqCst`): a sender claims a ring slot
//! with a `SeqCst` CAS on the ring's tail and *then* loads `waiters` and the futex word; a
//! receiver increments `waiters`, arms the word (`fetch_or`) and *then* loads every tail.
//! If the sender's loads miss the increment or the arming, those follow the loads in the
//! single total order, so the receiver's tail load sees the claim and the receiver does
//! not sleep. If the sender sees the word armed, it disarms it with a CAS and wakes; if
//! the CAS fails, another sender changed the word (only senders change an armed word)
//! and that sender wakes. The receiver sleeps only while the word still holds the armed
//! value it set, so a disarm between its arming and its `FUTEX_WAIT` makes the wait
//! return at once.

use crate::sync::{AtomicU32, Ordering};

/// Bit 0 of the futex word: a receiver registered since the last wake-up.
const ARMED: u32 = 1;

/// A futex-backed wake-up word shared by the rings of one receiver (see module docs).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Doorbell {
    seq: AtomicU32,
    waiters: AtomicU32,
}

impl Default for Doorbell {
    fn default() -> Self {
        Self::new()
    }
}

impl Doorbell {
    /// A doorbell nobody waits on.
    pub fn new() -> Doorbell {
        Doorbell {
            seq: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
        }
    }

    /// Called by a sender after it has claimed a slot on a ring using this doorbell:
    /// wakes sleeping receivers, if any. Costs one load when nobody sleeps, and two loads
    /// when receivers registered but a wake-up since they armed is already under way.
    #[inline]
    pub(crate) fn ring(&self) {
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        let word = self.seq.load(Ordering::SeqCst);
        if word & ARMED == 0 {
            return;
        }
        let next = (word & !ARMED).wrapping_add(2);
        if self
            .seq
            .compare_exchange(word, next, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            #[cfg(not(loom))]
            crate::futex::wake_all(&self.seq);
        }
    }

    /// First half of a sleep: registers as a waiter, arms the doorbell and returns the
    /// futex value to pass to [`Doorbell::sleep`]. The caller must re-check its rings
    /// after this returns and call [`Doorbell::sleep`] only if they are all empty, then
    /// [`Doorbell::unregister`].
    #[inline]
    pub(crate) fn register(&self) -> u32 {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        self.seq.fetch_or(ARMED, Ordering::SeqCst) | ARMED
    }

    /// Undoes [`Doorbell::register`].
    #[inline]
    pub(crate) fn unregister(&self) {
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Sleeps until a sender disarms the doorbell armed by [`Doorbell::register`] (which
    /// returned `seq`), or `timeout` passes
    /// (spurious wake-ups are possible; callers loop).
    #[cfg(not(loom))]
    pub(crate) fn sleep(&self, seq: u32, timeout: Option<std::time::Duration>) {
        crate::futex::wait(&self.seq, seq, timeout);
    }

    /// Under loom there is no futex: yield to the model's scheduler instead. (loom
    /// allows store-buffering outcomes even between `SeqCst` operations, tokio-rs/loom
    /// #180, so it cannot check the lost-wakeup argument above; the multi-threaded
    /// tests of `tests.rs` exercise it on the hardware.)
    #[cfg(loom)]
    pub(crate) fn sleep(&self, _seq: u32, _timeout: Option<std::time::Duration>) {
        loom::thread::yield_now();
    }

    /// Number of receivers currently registered (diagnostics and tests).
    pub fn waiters(&self) -> u32 {
        self.waiters.load(Ordering::Relaxed)
    }
}
