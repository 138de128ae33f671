//! A compute thread's synchronization: [`Worker`] (its ids, barriers and locks) and
//! [`LockGuard`]; the cluster-wide barrier and the lock calls behind them.

use super::*;

impl Inner {
    /// This cluster's arrival at the global barrier.
    pub(super) fn global_barrier(&self) -> Result<(), DsmError> {
        let core = &self.core;
        let start = core.epoch.elapsed().as_nanos() as u64;
        core.sync(&self.region, |token| Event::Barrier { token }, &|| {
            "at a barrier".into()
        })?;
        let end = core.epoch.elapsed().as_nanos() as u64;
        let sent = core
            .barrier_arrival_sent
            .load(Ordering::Relaxed)
            .clamp(start, end);
        let c = &core.counters;
        bump(&c.barriers, 1);
        bump(&c.barrier_global_ns, end - start);
        bump(&c.barrier_flush_ns, sent - start);
        Ok(())
    }

    pub(super) fn lock(&self, id: u32) -> Result<LockGuard<'_>, DsmError> {
        let me = self.core.me;
        let lock = LockId::new(id).ok_or(DsmError::BadLock {
            cluster: me,
            lock: u64::from(id),
            max: MAX_LOCKS,
        })?;
        if self.core.try_cached_acquire(&self.region, id)? {
            return Ok(LockGuard {
                inner: self,
                id,
                held: true,
            });
        }
        let t0 = FastInstant::now();
        self.core.sync(
            &self.region,
            |token| Event::Acquire { lock, token },
            &|| format!("acquiring lock {id}"),
        )?;
        let c = &self.core.counters;
        let waited = t0.elapsed();
        bump(&c.lock_acquires, 1);
        bump(&c.lock_wait_ns, waited.as_nanos() as u64);
        c.note_lock_wait(id, waited);
        Ok(LockGuard {
            inner: self,
            id,
            held: true,
        })
    }

    fn unlock(&self, id: u32) -> Result<(), DsmError> {
        let lock = LockId::new(id).expect("checked at lock");
        if self.core.lock_cache.try_release(id) {
            return Ok(());
        }
        let t0 = FastInstant::now();
        let r = self.core.sync(
            &self.region,
            |token| Event::Release { lock, token },
            &|| format!("releasing lock {id}"),
        );
        bump(
            &self.core.counters.release_ns,
            t0.elapsed().as_nanos() as u64,
        );
        r
    }
}

/// One compute thread's handle during [`Dsm::run`]: its ids and the synchronization
/// calls. It borrows the runtime for the section; use it on its own thread.
#[derive(Clone, Copy)]
pub struct Worker<'a> {
    pub(super) inner: &'a Inner,
    pub(super) local: usize,
    pub(super) barrier: &'a LocalBarrier,
}

impl std::fmt::Debug for Worker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("thread", &self.thread_id())
            .field("cluster", &self.cluster())
            .finish()
    }
}

impl<'a> Worker<'a> {
    /// This thread's global id, `0..threads()` (cluster-major).
    pub fn thread_id(&self) -> usize {
        self.inner.first_thread(self.cluster()) + self.local
    }

    /// This thread's index within its cluster, `0..cluster_threads()`.
    pub fn local_id(&self) -> usize {
        self.local
    }

    /// This thread's cluster.
    pub fn cluster(&self) -> usize {
        self.inner.core.me
    }

    /// Number of clusters.
    pub fn clusters(&self) -> usize {
        self.inner.core.clusters
    }

    /// Compute threads in the job.
    pub fn threads(&self) -> usize {
        self.inner.threads.iter().sum()
    }

    /// Compute threads in this cluster.
    pub fn cluster_threads(&self) -> usize {
        self.inner.threads[self.cluster()]
    }

    /// Compute threads of each cluster.
    pub fn threads_per_cluster(&self) -> &[usize] {
        &self.inner.threads
    }

    /// Waits until every compute thread of the job has called `barrier` for this
    /// episode; every write made before it by any thread is visible to every thread
    /// after it. Hierarchical: the cluster's threads meet locally, and the last to arrive
    /// takes part in the global barrier for the cluster (write notices piggy-backed).
    ///
    /// # Errors
    /// [`DsmError::PeerFailed`] if the job failed.
    pub fn barrier(&self) -> Result<(), DsmError> {
        let t0 = FastInstant::now();
        let r = self
            .barrier
            .wait(&self.inner.core, self.inner.wait_spin, || {
                self.inner.global_barrier()
            });
        bump(
            &self.inner.core.counters.barrier_wait_ns,
            t0.elapsed().as_nanos() as u64,
        );
        r
    }

    /// Acquires distributed lock `id` (see [`Dsm::lock`]).
    ///
    /// # Errors
    /// As [`Dsm::lock`].
    pub fn lock(&self, id: u32) -> Result<LockGuard<'a>, DsmError> {
        self.inner.lock(id)
    }
}

/// A held distributed lock; released when dropped (an error during that release is
/// logged and makes the job fail) or explicitly with [`LockGuard::unlock`].
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard<'a> {
    inner: &'a Inner,
    id: u32,
    held: bool,
}

impl std::fmt::Debug for LockGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard").field("lock", &self.id).finish()
    }
}

impl LockGuard<'_> {
    /// The lock id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Releases the lock: to a thread of this cluster waiting for it, or to its manager
    /// (hlrc: after the homes acknowledged this cluster's diffs).
    ///
    /// # Errors
    /// [`DsmError::PeerFailed`] if the job failed meanwhile.
    pub fn unlock(mut self) -> Result<(), DsmError> {
        self.held = false;
        self.inner.unlock(self.id)
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if self.held
            && let Err(e) = self.inner.unlock(self.id)
        {
            tracing::error!("releasing lock {}: {e}", self.id);
        }
    }
}
