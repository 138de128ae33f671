//! Synchronization inside a cluster: the local half of the hierarchical barrier
//! (MGS, ISCA 1996 §3: synchronization inside an SMP node in hardware, between nodes in
//! software). The threads of a cluster meet on a local barrier; the last to arrive
//! performs the cluster's single arrival at the global barrier (the coherence machine's
//! barrier manager, write notices piggy-backed) and then releases the others.
//!
//! Locks need nothing here: the coherence machine caches a lock in the cluster that was
//! granted it and passes it between the cluster's threads itself
//! ([`multigrain_coherence::sync`]).

use super::core::Core;
use crate::error::DsmError;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
        let _waiting = core
            .waits
            .enter("at a barrier, waiting for the cluster's other threads".into());
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
