//! The DSM backend of [`Runtime`]: the parallel apps on [`multigrain_dsm`], one
//! [`DsmRuntime`] per cluster process.
//!
//! * Shared arrays are [`SharedArray`]s in the DSM region ([`DsmF64s`], [`DsmU64s`]):
//!   every cluster makes the same allocations in the same order (the apps do), so array
//!   *k* lies at the same address everywhere; pages move between clusters at page grain
//!   under the job's coherence protocol (hlrc or sc).
//! * [`Runtime::run`] is [`Dsm::run`]: this cluster's compute threads run the body, each
//!   with a [`DsmTeam`] around its [`Worker`]; [`Team::barrier`] is the DSM's hierarchical
//!   barrier and [`Team::lock`] its distributed lock (hand-off inside the cluster, the
//!   lock's manager between clusters). `run` returns the values of *this cluster's*
//!   threads; the thread ids are global and cluster-major, so thread 0 is in cluster 0.
//! * The [`Topology`] is the job's: cluster `c` has `clusters[c].threads` of the
//!   configuration.
//!
//! # Failures
//!
//! The [`Team`] calls cannot return errors. When a barrier or a lock fails because the job
//! failed (a cluster died, aborted or fell silent: [`DsmError::PeerFailed`]), the calling
//! thread unwinds quietly; every other thread of the job fails the same way at its next
//! synchronisation, and [`Runtime::run`] returns [`RuntimeError::Backend`] holding the
//! first [`DsmError`]. Any other runtime error in a synchronisation call becomes a panic
//! of that thread.
//!
//! A compute thread that panics (a bug, a failed check) makes [`Dsm::run`] abort the job
//! at once: this cluster's `run` returns [`RuntimeError::ThreadPanicked`] with the panic
//! message (or [`RuntimeError::Backend`] with the runtime error that caused it), and the
//! other clusters' `run` returns [`RuntimeError::Backend`] with
//! [`DsmError::PeerFailed`] naming this cluster.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;

use multigrain_dsm::{Dsm, DsmError, JobStats, SharedArray, Worker};

use crate::storage::{F64Words, U64Words};
use crate::team::{Runtime, RuntimeError, Team, Topology};

/// A shared `f64` array in the DSM region.
#[derive(Debug, Clone)]
pub struct DsmF64s(SharedArray<f64>);

impl DsmF64s {
    /// The underlying DSM array.
    #[must_use]
    pub fn shared(&self) -> &SharedArray<f64> {
        &self.0
    }
}

impl F64Words for DsmF64s {
    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    fn get(&self, i: usize) -> f64 {
        self.0.get(i)
    }

    #[inline]
    fn set(&self, i: usize, value: f64) {
        self.0.set(i, value);
    }

    #[inline]
    fn get_array<const N: usize>(&self, start: usize) -> [f64; N] {
        let mut out = [0.0; N];
        self.0.read(start, &mut out);
        out
    }
}

/// A shared `u64` array in the DSM region.
#[derive(Debug, Clone)]
pub struct DsmU64s(SharedArray<u64>);

impl DsmU64s {
    /// The underlying DSM array.
    #[must_use]
    pub fn shared(&self) -> &SharedArray<u64> {
        &self.0
    }
}

impl U64Words for DsmU64s {
    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    fn get(&self, i: usize) -> u64 {
        self.0.get(i)
    }

    #[inline]
    fn set(&self, i: usize, value: u64) {
        self.0.set(i, value);
    }
}

/// One cluster's [`Runtime`] on the DSM (see the [module docs](self)).
pub struct DsmRuntime {
    dsm: Dsm,
    topology: Topology,
    num_locks: usize,
}

impl std::fmt::Debug for DsmRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DsmRuntime")
            .field("dsm", &self.dsm)
            .field("topology", &self.topology)
            .field("num_locks", &self.num_locks)
            .finish_non_exhaustive()
    }
}

impl DsmRuntime {
    /// The runtime of the cluster that joined the job as `dsm`.
    ///
    /// # Errors
    /// [`RuntimeError::BadTopology`] if the job has a cluster without threads.
    pub fn new(dsm: Dsm) -> Result<Self, RuntimeError> {
        let cluster_of = dsm
            .threads_per_cluster()
            .iter()
            .enumerate()
            .flat_map(|(c, &n)| std::iter::repeat_n(c, n))
            .collect();
        let topology = Topology::from_cluster_of(cluster_of)?;
        if topology.num_clusters() != dsm.clusters() {
            return Err(RuntimeError::BadTopology(format!(
                "the job has {} clusters but only {} have compute threads",
                dsm.clusters(),
                topology.num_clusters()
            )));
        }
        Ok(Self {
            dsm,
            topology,
            num_locks: 0,
        })
    }

    /// This cluster's DSM runtime (ids, statistics, sections of its own with
    /// [`Dsm::run`]).
    #[must_use]
    pub fn dsm(&self) -> &Dsm {
        &self.dsm
    }

    /// This cluster's DSM runtime, for collective allocations of other element types.
    pub fn dsm_mut(&mut self) -> &mut Dsm {
        &mut self.dsm
    }

    /// Finishes the job ([`Dsm::finish`]): a last barrier, then every cluster's
    /// statistics. Every cluster must call it.
    ///
    /// # Errors
    /// As [`Dsm::finish`].
    pub fn finish(self) -> Result<JobStats, DsmError> {
        self.dsm.finish()
    }

    /// The DSM runtime, without finishing.
    #[must_use]
    pub fn into_inner(self) -> Dsm {
        self.dsm
    }
}

fn alloc_error(words: usize, e: &DsmError) -> RuntimeError {
    RuntimeError::Alloc {
        words,
        reason: e.to_string(),
    }
}

/// Unwinding payload of a thread whose synchronisation failed because the job failed
/// (the error is kept in the section's failure slot).
struct SyncFailed;

impl Runtime for DsmRuntime {
    type F64s = DsmF64s;
    type U64s = DsmU64s;
    type Team<'t> = DsmTeam<'t>;

    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn alloc_f64s(&mut self, len: usize) -> Result<DsmF64s, RuntimeError> {
        self.dsm
            .alloc::<f64>(len)
            .map(DsmF64s)
            .map_err(|e| alloc_error(len, &e))
    }

    fn alloc_u64s(&mut self, len: usize) -> Result<DsmU64s, RuntimeError> {
        self.dsm
            .alloc::<u64>(len)
            .map(DsmU64s)
            .map_err(|e| alloc_error(len, &e))
    }

    fn alloc_locks(&mut self, count: usize) -> Result<usize, RuntimeError> {
        let first = self
            .dsm
            .alloc_locks(count)
            .map_err(|e| RuntimeError::Alloc {
                words: count,
                reason: e.to_string(),
            })?;
        let first = first as usize;
        self.num_locks = first + count;
        Ok(first)
    }

    fn run<T, F>(&mut self, body: F) -> Result<Vec<T>, RuntimeError>
    where
        T: Send,
        F: Fn(&Self::Team<'_>) -> T + Sync,
    {
        let failure: Mutex<Option<DsmError>> = Mutex::new(None);
        let (topology, num_locks) = (&self.topology, self.num_locks);
        let cluster = self.dsm.cluster();
        let outcome = self.dsm.run(|worker| {
            let team = DsmTeam {
                worker,
                topology,
                failure: &failure,
                num_locks,
            };
            match catch_unwind(AssertUnwindSafe(|| body(&team))) {
                Ok(v) => Some(v),
                Err(payload) if payload.is::<SyncFailed>() => None,
                // A panic: `Dsm::run` aborts the job and reports it.
                Err(payload) => resume_unwind(payload),
            }
        });
        let recorded = failure
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (outcome, recorded) {
            // A runtime error that made a thread panic: the cause.
            (_, Some(e)) if !matches!(e, DsmError::PeerFailed { .. }) => {
                Err(RuntimeError::Backend(Box::new(e)))
            }
            // A thread of this cluster panicked (the others then saw the job fail).
            (
                Err(DsmError::ThreadPanicked {
                    thread, message, ..
                }),
                _,
            ) => Err(RuntimeError::ThreadPanicked { thread, message }),
            (_, Some(e)) | (Err(e), None) => Err(RuntimeError::Backend(Box::new(e))),
            (Ok(values), None) => values
                .into_iter()
                .collect::<Option<Vec<T>>>()
                .ok_or_else(|| {
                    RuntimeError::Backend(Box::new(DsmError::Internal {
                        cluster,
                        detail: "a compute thread abandoned the section without an error".into(),
                    }))
                }),
        }
    }
}

/// The [`Team`] handle of the DSM backend: one compute thread's [`Worker`].
pub struct DsmTeam<'t> {
    worker: &'t Worker<'t>,
    topology: &'t Topology,
    failure: &'t Mutex<Option<DsmError>>,
    num_locks: usize,
}

impl std::fmt::Debug for DsmTeam<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DsmTeam")
            .field("worker", self.worker)
            .finish_non_exhaustive()
    }
}

impl<'t> DsmTeam<'t> {
    /// The DSM worker handle (cluster and local ids, the runtime).
    #[must_use]
    pub fn worker(&self) -> &'t Worker<'t> {
        self.worker
    }

    /// A synchronisation failed. If the job failed, unwind quietly (every thread will);
    /// otherwise keep the error as the cause and panic, so that `Dsm::run` aborts the job.
    fn sync_failed(&self, e: DsmError) -> ! {
        let job_failed = matches!(e, DsmError::PeerFailed { .. });
        let message = e.to_string();
        {
            let mut slot = self
                .failure
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let replace = match &*slot {
                None => true,
                Some(DsmError::PeerFailed { .. }) => !job_failed,
                Some(_) => false,
            };
            if replace {
                *slot = Some(e);
            }
        }
        if job_failed {
            resume_unwind(Box::new(SyncFailed))
        }
        resume_unwind(Box::new(message))
    }
}

impl Team for DsmTeam<'_> {
    fn thread_id(&self) -> usize {
        self.worker.thread_id()
    }

    fn topology(&self) -> &Topology {
        self.topology
    }

    fn barrier(&self) {
        if let Err(e) = self.worker.barrier() {
            self.sync_failed(e);
        }
    }

    fn lock(&self, id: usize) -> impl Sized + '_ {
        let lock = match u32::try_from(id) {
            Ok(l) if id < self.num_locks => l,
            _ => panic!(
                "lock id {id} was never allocated ({} locks exist)",
                self.num_locks
            ),
        };
        match self.worker.lock(lock) {
            Ok(guard) => guard,
            Err(e) => self.sync_failed(e),
        }
    }
}
