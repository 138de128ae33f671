//! The one place the message layer gets its atomics and interior-mutability cells.
//!
//! Every lock-free structure in this crate (the Express ring, the Tag-On buffer pool, the
//! destination table, the doorbells) imports its atomics from here, never from `std`
//! directly (`messaging/clippy.toml` forbids the `std` types elsewhere). Under
//! `RUSTFLAGS="--cfg loom"` this module swaps in [loom]'s model-checked types, so the
//! loom tests in `messaging/tests/loom.rs` explore every interleaving of the real code
//! (style.md practice 3, after iceoryx2's `concurrency-sync` shim).
//!
//! [loom]: https://docs.rs/loom

#![allow(clippy::disallowed_types)]

pub(crate) use core::sync::atomic::Ordering;
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::fence;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, fence};

/// Declares a `#[repr(transparent)]` newtype over a `core` atomic with the operations this
/// crate uses. A newtype (not a re-export) lets clippy's `disallowed-types` reject direct
/// use of the `std` types everywhere else, and keeps the layout of the `std` type, which
/// shared segments and the futex rely on.
#[cfg(not(loom))]
macro_rules! atomic_newtype {
    ($name:ident, $inner:ty, $int:ty) => {
        #[derive(Debug, Default)]
        #[repr(transparent)]
        pub(crate) struct $name($inner);

        #[allow(dead_code)]
        impl $name {
            #[inline(always)]
            pub(crate) const fn new(v: $int) -> Self {
                Self(<$inner>::new(v))
            }
            #[inline(always)]
            pub(crate) fn load(&self, o: Ordering) -> $int {
                self.0.load(o)
            }
            #[inline(always)]
            pub(crate) fn store(&self, v: $int, o: Ordering) {
                self.0.store(v, o)
            }
            #[inline(always)]
            pub(crate) fn swap(&self, v: $int, o: Ordering) -> $int {
                self.0.swap(v, o)
            }
            #[inline(always)]
            pub(crate) fn fetch_add(&self, v: $int, o: Ordering) -> $int {
                self.0.fetch_add(v, o)
            }
            #[inline(always)]
            pub(crate) fn fetch_sub(&self, v: $int, o: Ordering) -> $int {
                self.0.fetch_sub(v, o)
            }
            #[inline(always)]
            pub(crate) fn fetch_or(&self, v: $int, o: Ordering) -> $int {
                self.0.fetch_or(v, o)
            }
            #[inline(always)]
            pub(crate) fn compare_exchange(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.0.compare_exchange(current, new, success, failure)
            }
            #[inline(always)]
            pub(crate) fn compare_exchange_weak(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.0.compare_exchange_weak(current, new, success, failure)
            }
            /// The address of the value (for the futex system call).
            #[inline(always)]
            pub(crate) fn as_ptr(&self) -> *mut $int {
                self.0.as_ptr()
            }
        }
    };
}

#[cfg(not(loom))]
atomic_newtype!(AtomicU32, core::sync::atomic::AtomicU32, u32);
#[cfg(not(loom))]
atomic_newtype!(AtomicU64, core::sync::atomic::AtomicU64, u64);

/// `core::cell::UnsafeCell` with loom's closure-based access API, so the same code compiles
/// against both (loom tracks every access made through `with`/`with_mut`).
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a mutable raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// A hint that the caller is busy-waiting; under loom it yields to the model's scheduler
/// so that spin loops terminate.
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Gives up the processor: `std::thread::yield_now`, or loom's.
#[inline]
pub(crate) fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Sleeps 50 µs (under loom, yields to the model's scheduler): how a thread waits for
/// another once a [`Backoff`] has completed, when the other may be preempted on this
/// CPU at a lower priority — a real-time thread's yields reach only threads of its own
/// priority, so one that only yielded could keep the other off the CPU until the
/// kernel's real-time throttling let it run (≈ 1 s; see `Endpoint::recv_timeout`).
#[inline]
pub(crate) fn nap() {
    #[cfg(not(loom))]
    std::thread::sleep(std::time::Duration::from_micros(50));
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Exponential back-off for contended retries (after crossbeam-utils' `Backoff`, whose
/// internals use `std` atomics and so cannot run under loom).
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    const SPIN_LIMIT: u32 = 6;
    const YIELD_LIMIT: u32 = 10;

    /// Backs off in a lock-free retry loop: spins 2^step times (capped).
    #[inline]
    pub(crate) fn spin(&mut self) {
        for _ in 0..1u32 << self.step.min(Self::SPIN_LIMIT) {
            spin_hint();
        }
        if self.step <= Self::SPIN_LIMIT {
            self.step += 1;
        }
    }

    /// Backs off while waiting for another thread to make progress: spins, then yields.
    #[inline]
    pub(crate) fn snooze(&mut self) {
        if self.step <= Self::SPIN_LIMIT {
            for _ in 0..1u32 << self.step {
                spin_hint();
            }
        } else {
            yield_now();
        }
        if self.step <= Self::YIELD_LIMIT {
            self.step += 1;
        }
    }

    /// Waits for another thread to make progress: [`Backoff::snooze`] until the back-off
    /// is completed, then [`nap`] — never an endless run of yields, which a real-time
    /// caller's CPU would not give to a lower-priority thread it waits for.
    #[inline]
    pub(crate) fn snooze_or_nap(&mut self) {
        if self.is_completed() {
            nap();
        } else {
            self.snooze();
        }
    }

    /// True once spinning has stopped paying off and the caller should block instead.
    #[inline]
    pub(crate) fn is_completed(&self) -> bool {
        self.step > Self::YIELD_LIMIT
    }
}
