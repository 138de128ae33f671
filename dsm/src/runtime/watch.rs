//! What the threads of a cluster wait for: the evidence of the progress watchdog.
//!
//! A cluster makes no progress while every one of its compute threads waits in the
//! runtime (for a page, a lock or a barrier) and none of those waits ends. A thread
//! that computes is making progress, however long it computes, so a long phase on one
//! cluster never looks like a hang: the others wait, but it does not. [`Waits`] records
//! each waiting thread (what it waits for and since when) and the time of the last
//! change (a wait began or ended); [`StallProbe::stall`] turns that into a [`Stall`]
//! when every compute thread waits. The job-wide decision (every cluster stalled for
//! `job.progress_timeout_ms`) is the control plane's.

use super::core::Core;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{Thread, ThreadId};
use std::time::{Duration, Instant};

/// The waiting threads of one cluster and the compute threads running.
pub(crate) struct Waits {
    state: Mutex<State>,
    /// Compute threads inside a parallel section ([`crate::Dsm::run`]).
    active: AtomicUsize,
}

struct State {
    /// Thread → (the thread, what it waits for, since when).
    waiting: HashMap<ThreadId, (Thread, String, Instant)>,
    /// When a wait last began or ended.
    last_change: Instant,
}

/// Removes its thread from [`Waits`] when the wait ends.
pub(crate) struct Waiting<'a> {
    waits: &'a Waits,
}

/// Counts a compute thread as running while it lives.
pub(crate) struct Active<'a> {
    waits: &'a Waits,
}

impl Waits {
    pub(crate) fn new() -> Self {
        Waits {
            state: Mutex::new(State {
                waiting: HashMap::new(),
                last_change: Instant::now(),
            }),
            active: AtomicUsize::new(0),
        }
    }

    /// The calling thread begins to wait for `what` (called once per real wait, not
    /// on the paths that complete at once).
    pub(crate) fn enter(&self, what: String) -> Waiting<'_> {
        let now = Instant::now();
        let thread = std::thread::current();
        let mut st = self.state.lock();
        st.waiting.insert(thread.id(), (thread, what, now));
        st.last_change = now;
        Waiting { waits: self }
    }

    /// The calling thread is a compute thread of a parallel section until the guard
    /// drops.
    pub(crate) fn active(&self) -> Active<'_> {
        self.active.fetch_add(1, Ordering::AcqRel);
        Active { waits: self }
    }

    /// The stall of this cluster, if every compute thread (at least one thread, when
    /// no section runs) waits.
    fn stall(&self) -> Option<Stall> {
        let st = self.state.lock();
        let waiting = st.waiting.len();
        if waiting == 0 || waiting < self.active.load(Ordering::Acquire) {
            return None;
        }
        let now = Instant::now();
        let mut waits: Vec<String> = st
            .waiting
            .values()
            .map(|(thread, what, since)| {
                format!(
                    "{} {what} (for {:.1} s)",
                    thread.name().unwrap_or("a thread"),
                    now.duration_since(*since).as_secs_f64()
                )
            })
            .collect();
        waits.sort();
        Some(Stall {
            duration: now.duration_since(st.last_change),
            waits,
        })
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut st = self.waits.state.lock();
        st.waiting.remove(&std::thread::current().id());
        st.last_change = Instant::now();
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.waits.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A cluster in which every compute thread waits and no wait has ended for
/// [`Stall::duration`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    /// Since the last wait began or ended.
    pub duration: Duration,
    /// One line per waiting thread: its name, what it waits for (e.g. "acquiring lock
    /// 7", "serving a read fault on page 12", "at a barrier") and for how long,
    /// sorted.
    pub waits: Vec<String>,
}

/// A handle on a cluster's [`Stall`] state for a watchdog thread; it outlives
/// nothing (it keeps the runtime's shared state alive, not the runtime).
#[derive(Clone)]
pub struct StallProbe {
    core: Arc<Core>,
}

impl std::fmt::Debug for StallProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StallProbe")
            .field("cluster", &self.core.me)
            .finish()
    }
}

impl StallProbe {
    pub(crate) fn new(core: Arc<Core>) -> Self {
        StallProbe { core }
    }

    /// `Some` while every compute thread of the cluster (or, outside a parallel
    /// section, the thread using the runtime) waits in the runtime; `None` while any
    /// computes or nothing waits.
    pub fn stall(&self) -> Option<Stall> {
        self.core.waits.stall()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stall needs every active thread waiting; it lasts from the last change.
    #[test]
    fn stalled_only_when_every_active_thread_waits() {
        let waits = Waits::new();
        assert_eq!(waits.stall(), None, "nothing waits");
        let a = waits.active();
        let b = waits.active();
        let w = waits.enter("acquiring lock 3".into());
        assert_eq!(waits.stall(), None, "one of two compute threads computes");
        drop(b);
        std::thread::sleep(Duration::from_millis(20));
        let s = waits.stall().expect("the only compute thread waits");
        assert!(s.duration >= Duration::from_millis(20), "{s:?}");
        assert_eq!(s.waits.len(), 1);
        assert!(s.waits[0].contains("acquiring lock 3"), "{s:?}");
        drop(w);
        assert_eq!(waits.stall(), None, "the wait ended");
        drop(a);
        let _w = waits.enter("at a barrier".into());
        let s = waits
            .stall()
            .expect("outside a section, one waiting thread stalls");
        assert!(s.duration < Duration::from_millis(20), "{s:?}");
    }
}
