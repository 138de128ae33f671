//! Locks passed among one cluster's threads without the coherence machine.
//!
//! Inside a cluster, threads share memory through the hardware: a lock the cluster
//! owns can go from one local thread to the next with one atomic operation; only a
//! lock that leaves the cluster needs the coherence protocol (MGS's split, Yeung,
//! Kubiatowicz, Agarwal, ISCA 1996 §3: hardware coherence inside an SMP node, software
//! between nodes). Without this, every acquire and release of a cached lock took the
//! cluster's machine lock; with 16 threads per cluster that one mutex serialised
//! Water's 150,000 lock operations per run (≈ 14 µs each on a 16-core machine, against
//! ≈ 0.2 µs on 2 threads).
//!
//! The machine sees one thread holding the lock the whole time. When an acquire
//! completes and [`Machine::lock_cacheable`] says the lock is owned and unwanted,
//! the runtime takes it over ([`LockCache::adopt`]); later acquires and releases by
//! local threads flip its word here ([`LockCache::try_acquire`],
//! [`LockCache::try_release`]). When the machine needs it back — its manager recalled
//! it, or a local thread that found it taken asked the machine —
//! [`Action::LockWanted`] comes ([`LockCache::want`]): an idle lock is released through
//! the machine at once by whoever executes that action, a held one by its holder at
//! its release.
//!
//! Memory ordering: a release here is a `Release` store (compare-exchange) and an
//! acquire here or a reclaim an `Acquire` one, so the holder's writes happen before the
//! next holder's accesses and before the flush that diffs them when the lock leaves.
//!
//! [`Machine::lock_cacheable`]: multigrain_coherence::Machine::lock_cacheable
//! [`Action::LockWanted`]: multigrain_coherence::Action::LockWanted

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The runtime does not hold the lock for the cluster: acquires go to the machine.
const MACHINE: u32 = 0;
/// The runtime holds it for the cluster and no thread has it.
const IDLE: u32 = 1;
/// A thread of the cluster has it through the runtime.
const HELD: u32 = 2;
/// With `HELD`: the machine wants it back; the holder's release goes to the machine.
const WANTED: u32 = 4;

/// Locks per lazily allocated chunk of words.
const CHUNK: usize = 4096;

/// What [`LockCache::want`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// The lock was idle here and is now the caller's to release through the machine,
    /// in the same machine call (with a runtime token).
    ReleaseNow,
    /// A thread holds it: its release goes through the machine.
    AtRelease,
    /// The runtime does not hold it: the machine's own holder releases it.
    NotCached,
}

/// One word per lock id (`0..max_locks`), allocated in chunks on first adoption.
pub(crate) struct LockCache {
    chunks: Box<[OnceLock<Box<[AtomicU32]>>]>,
}

impl LockCache {
    /// A cache for lock ids below `max_locks`.
    pub(crate) fn new(max_locks: u32) -> Self {
        let n = (max_locks as usize).div_ceil(CHUNK);
        LockCache {
            chunks: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The word of `lock` if its chunk exists.
    fn word(&self, lock: u32) -> Option<&AtomicU32> {
        let chunk = self.chunks.get(lock as usize / CHUNK)?.get()?;
        chunk.get(lock as usize % CHUNK)
    }

    /// Takes `lock` for the calling thread if the runtime holds it idle. `false`: ask
    /// the machine.
    #[inline]
    pub(crate) fn try_acquire(&self, lock: u32) -> bool {
        self.word(lock).is_some_and(|w| {
            w.compare_exchange(IDLE, HELD, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Releases `lock`, held by the calling thread, here if the runtime holds it and
    /// the machine does not want it. `false`: release it through the machine (the word
    /// says `MACHINE` from now on).
    #[inline]
    pub(crate) fn try_release(&self, lock: u32) -> bool {
        let Some(w) = self.word(lock) else {
            return false;
        };
        match w.compare_exchange(HELD, IDLE, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => true,
            Err(cur) => {
                if cur == HELD | WANTED {
                    // Only the holder leaves this state; the machine's next events
                    // about the lock come through its release.
                    w.store(MACHINE, Ordering::Release);
                }
                false
            }
        }
    }

    /// The machine completed an acquire of `lock` and allows it to be passed among
    /// local threads: its holder now has it through the runtime. Called under the
    /// machine lock, before the holder is woken.
    pub(crate) fn adopt(&self, lock: u32) {
        let Some(chunk) = self.chunks.get(lock as usize / CHUNK) else {
            return;
        };
        let chunk = chunk.get_or_init(|| (0..CHUNK).map(|_| AtomicU32::new(MACHINE)).collect());
        chunk[lock as usize % CHUNK].store(HELD, Ordering::Relaxed);
    }

    /// The machine wants `lock` back ([`multigrain_coherence::Action::LockWanted`]).
    /// Called under the machine lock.
    pub(crate) fn want(&self, lock: u32) -> Wanted {
        let Some(w) = self.word(lock) else {
            return Wanted::NotCached;
        };
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let next = match cur {
                IDLE => MACHINE,
                HELD => HELD | WANTED,
                _ => return Wanted::NotCached,
            };
            match w.compare_exchange(cur, next, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) if cur == IDLE => return Wanted::ReleaseNow,
                Ok(_) => return Wanted::AtRelease,
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_passed_here_until_the_machine_wants_it() {
        let c = LockCache::new(10_000);
        // Not adopted: everything goes to the machine.
        assert!(!c.try_acquire(5000));
        assert!(!c.try_release(5000));
        assert_eq!(c.want(5000), Wanted::NotCached);
        c.adopt(5000);
        assert!(!c.try_acquire(5000), "held by the adopting thread");
        assert!(c.try_release(5000));
        assert!(c.try_acquire(5000));
        assert!(c.try_release(5000));
        // Idle and wanted: the caller releases it through the machine.
        assert_eq!(c.want(5000), Wanted::ReleaseNow);
        assert!(!c.try_acquire(5000));
        assert_eq!(c.want(5000), Wanted::NotCached);
        // Held and wanted: the holder's release goes to the machine, and so does
        // everything after it.
        c.adopt(5000);
        assert_eq!(c.want(5000), Wanted::AtRelease);
        assert_eq!(c.want(5000), Wanted::NotCached);
        assert!(!c.try_acquire(5000));
        assert!(!c.try_release(5000));
        assert!(!c.try_acquire(5000));
        assert!(!c.try_release(5000));
        // Other locks of the chunk are untouched; ids beyond the cache are refused.
        assert!(!c.try_acquire(5001));
        c.adopt(20_000);
        assert!(!c.try_release(20_000));
    }

    #[test]
    fn threads_passing_a_cached_lock_exclude_each_other() {
        let c = std::sync::Arc::new(LockCache::new(1));
        c.adopt(0);
        assert!(c.try_release(0));
        let inside = std::sync::Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (c, inside) = (c.clone(), inside.clone());
                std::thread::spawn(move || {
                    let mut taken = 0;
                    while taken < 10_000 {
                        if c.try_acquire(0) {
                            assert_eq!(inside.fetch_add(1, Ordering::Relaxed), 0);
                            inside.fetch_sub(1, Ordering::Relaxed);
                            assert!(c.try_release(0));
                            taken += 1;
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.want(0), Wanted::ReleaseNow);
    }
}
