//! Synchronization inside a cluster: the local half of the hierarchical barrier, and
//! lock hand-off between threads of one cluster.
//!
//! * **Barrier** (MGS, ISCA 1996 §3: synchronization inside an SMP node in hardware,
//!   between nodes in software): the threads of a cluster meet on a local barrier; the
//!   last to arrive performs the cluster's single arrival at the global barrier (the
//!   coherence machine's barrier manager, write notices piggy-backed) and then releases
//!   the others.
//! * **Locks**: a lock is acquired from its manager (the coherence machine, FIFO among
//!   clusters, write notices with the grant) by the first thread of a cluster that wants
//!   it. When the holder unlocks while other threads of the same cluster wait for it, the
//!   lock passes to one of them directly — they share the cluster's memory, so nothing
//!   needs to be flushed or invalidated — at most [`MAX_LOCAL_HANDOFFS`] times in a row;
//!   then it is released to the manager, so that other clusters get their turn.

use super::core::Core;
use crate::error::DsmError;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How many times in a row a lock may pass between threads of one cluster before it is
/// released to its manager.
pub const MAX_LOCAL_HANDOFFS: u32 = 8;

/// How often a thread blocked on a local condition re-checks for a job failure.
const RECHECK: Duration = Duration::from_millis(10);

/// The local half of the barrier of one parallel section.
pub(crate) struct LocalBarrier {
    threads: usize,
    arrived: Mutex<usize>,
    generation: AtomicU64,
    cv: Condvar,
}

impl LocalBarrier {
    pub(crate) fn new(threads: usize) -> Self {
        LocalBarrier {
            threads,
            arrived: Mutex::new(0),
            generation: AtomicU64::new(0),
            cv: Condvar::new(),
        }
    }

    /// Waits for the cluster's other threads; the last one runs `global` (the cluster's
    /// arrival at the global barrier) and then releases everybody.
    pub(crate) fn wait(
        &self,
        core: &Core,
        spin: Duration,
        global: impl FnOnce() -> Result<(), DsmError>,
    ) -> Result<(), DsmError> {
        let mut arrived = self.arrived.lock();
        let generation = self.generation.load(Ordering::Acquire);
        *arrived += 1;
        if *arrived == self.threads {
            *arrived = 0;
            drop(arrived);
            let result = global();
            let _g = self.arrived.lock();
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.cv.notify_all();
            return result;
        }
        drop(arrived);
        let spin_until = Instant::now() + spin;
        while Instant::now() < spin_until {
            if self.generation.load(Ordering::Acquire) != generation {
                return Self::after(core);
            }
            std::thread::yield_now();
        }
        let mut g = self.arrived.lock();
        while self.generation.load(Ordering::Acquire) == generation {
            if core.is_failed() {
                return Err(core.failure_error(Some("waiting at a barrier".into())));
            }
            self.cv.wait_for(&mut g, RECHECK);
        }
        drop(g);
        Self::after(core)
    }

    fn after(core: &Core) -> Result<(), DsmError> {
        if core.is_failed() {
            Err(core.failure_error(Some("waiting at a barrier".into())))
        } else {
            Ok(())
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Held {
    /// Not held by this cluster.
    #[default]
    Free,
    /// Being acquired, held, or being released by a thread of this cluster.
    Busy,
    /// Held by this cluster, released by its last local holder for a local waiter.
    Passed,
}

#[derive(Default)]
struct Entry {
    held: Held,
    waiters: usize,
    handoffs: u32,
}

/// Outcome of [`LocalLocks::lock`].
pub(crate) enum Acquired {
    /// The cluster already held the lock; a local thread passed it on.
    Local,
    /// Acquired from the manager.
    Global,
}

/// Lock state of this cluster's threads.
#[derive(Default)]
pub(crate) struct LocalLocks {
    map: Mutex<HashMap<u32, Entry>>,
    cv: Condvar,
}

impl LocalLocks {
    /// Acquires `id` for the calling thread: from a local holder, or from the manager
    /// with `acquire`.
    pub(crate) fn lock(
        &self,
        core: &Arc<Core>,
        id: u32,
        acquire: impl FnOnce() -> Result<(), DsmError>,
    ) -> Result<Acquired, DsmError> {
        let mut g = self.map.lock();
        let mut counted = false;
        loop {
            let e = g.entry(id).or_default();
            match e.held {
                Held::Free => {
                    e.held = Held::Busy;
                    if counted {
                        e.waiters -= 1;
                    }
                    drop(g);
                    let r = acquire();
                    let mut g = self.map.lock();
                    let e = g.entry(id).or_default();
                    return match r {
                        Ok(()) => {
                            e.handoffs = 0;
                            Ok(Acquired::Global)
                        }
                        Err(err) => {
                            e.held = Held::Free;
                            self.cv.notify_all();
                            Err(err)
                        }
                    };
                }
                Held::Passed => {
                    e.held = Held::Busy;
                    if counted {
                        e.waiters -= 1;
                    }
                    return Ok(Acquired::Local);
                }
                Held::Busy => {
                    if !counted {
                        e.waiters += 1;
                        counted = true;
                    }
                    if core.is_failed() {
                        e.waiters -= 1;
                        return Err(core.failure_error(Some(format!("waiting for lock {id}"))));
                    }
                    self.cv.wait_for(&mut g, RECHECK);
                }
            }
        }
    }

    /// Releases `id`: to a local waiter if there is one (within the hand-off bound),
    /// else to the manager with `release`.
    pub(crate) fn unlock(
        &self,
        id: u32,
        release: impl FnOnce() -> Result<(), DsmError>,
    ) -> Result<(), DsmError> {
        let mut g = self.map.lock();
        let e = g.entry(id).or_default();
        if e.waiters > 0 && e.handoffs < MAX_LOCAL_HANDOFFS {
            e.handoffs += 1;
            e.held = Held::Passed;
            self.cv.notify_all();
            return Ok(());
        }
        drop(g);
        let r = release();
        let mut g = self.map.lock();
        let e = g.entry(id).or_default();
        e.held = Held::Free;
        if e.waiters == 0 {
            g.remove(&id);
        }
        self.cv.notify_all();
        r
    }
}
