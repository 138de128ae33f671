//! Doorbells: how an idle receiver sleeps until a message arrives.
//!
//! Polling alone makes an idle receiver burn a core; paper 003 §4 shows why a time-shared
//! node needs message *events*. A doorbell is a futex word plus a waiter count, placed in
//! the same memory as the rings that ring it (process-private or a shared segment, so it
//! works across processes: the futex is not `FUTEX_PRIVATE`). Several rings may share one
//! doorbell, so one receiver can sleep on all its queues at once.
//!
//! Lost-wakeup argument (all four operations are `SeqCst`): a sender claims a ring slot
//! with a `SeqCst` CAS on the ring's tail and *then* loads `waiters`; a receiver increments
//! `waiters` and *then* loads every tail. If the sender's load misses the increment, the
//! increment follows it in the single total order, so the receiver's tail load sees the
//! claim and the receiver does not sleep. The sender bumps `seq` before `FUTEX_WAKE`, and the
//! receiver sleeps only if `seq` still holds the value it read before registering.

use crate::sync::{AtomicU32, Ordering};

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
    /// wakes sleeping receivers, if any. Costs one load when nobody sleeps.
    #[inline]
    pub(crate) fn ring(&self) {
        if self.waiters.load(Ordering::SeqCst) != 0 {
            self.seq.fetch_add(1, Ordering::SeqCst);
            #[cfg(not(loom))]
            crate::futex::wake_all(&self.seq);
        }
    }

    /// First half of a sleep: registers as a waiter and returns the sequence value to pass
    /// to [`Doorbell::sleep`]. The caller must re-check its rings after this returns and
    /// call [`Doorbell::sleep`] only if they are all empty, then [`Doorbell::unregister`].
    #[inline]
    pub(crate) fn register(&self) -> u32 {
        let seq = self.seq.load(Ordering::SeqCst);
        self.waiters.fetch_add(1, Ordering::SeqCst);
        seq
    }

    /// Undoes [`Doorbell::register`].
    #[inline]
    pub(crate) fn unregister(&self) {
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Sleeps until the doorbell rings after `seq` was read, or `timeout` passes
    /// (spurious wake-ups are possible; callers loop).
    #[cfg(not(loom))]
    pub(crate) fn sleep(&self, seq: u32, timeout: Option<std::time::Duration>) {
        crate::futex::wait(&self.seq, seq, timeout);
    }

    /// Under loom there is no futex: yield to the model's scheduler instead.
    #[cfg(loom)]
    pub(crate) fn sleep(&self, _seq: u32, _timeout: Option<std::time::Duration>) {
        loom::thread::yield_now();
    }

    /// Number of receivers currently registered (diagnostics and tests).
    pub fn waiters(&self) -> u32 {
        self.waiters.load(Ordering::Relaxed)
    }
}
