//! The runtime interface the parallel apps are written against.
//!
//! # Programming model
//!
//! A job has `P` compute threads, numbered `0..P`, grouped into clusters (one cluster = one
//! process of the DSM runtime; the threads backend can emulate several). A parallel app:
//!
//! 1. allocates its shared arrays and locks on the [`Runtime`] *before* any thread starts.
//!    Every process of a job performs the same sequence of allocations with the same
//!    lengths, so array *k* names the same memory everywhere. Fresh arrays hold zeros.
//! 2. calls [`Runtime::run`] once per parallel section; every thread runs the same body
//!    with its own [`Team`] handle.
//!
//! # Memory model (release consistency)
//!
//! Shared arrays are plain words with no ordering of their own. A write by thread A is
//! guaranteed visible to thread B only when A's write is followed by a *release* that B's
//! read follows by the matching *acquire*:
//!
//! * A releases lock `L` (drops the guard of [`Team::lock`]) and B later acquires `L`; or
//! * both pass the same [`Team::barrier`] episode (A writes before, B reads after).
//!
//! Programs must be data-race-free under that rule: two threads may touch the same word
//! between two synchronisation points only if both only read it. The apps in this crate
//! obey it; the DSM backend relies on it (diffs are propagated at releases). The apps touch
//! shared arrays only inside [`Runtime::run`] bodies, never before or after.
//!
//! [`crate::conformance`] checks these guarantees on any backend.

use std::error::Error;

/// How compute threads are grouped into clusters.
///
/// Threads are numbered `0..num_threads()`; cluster ids `0..num_clusters()`; every cluster
/// has at least one thread.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Topology {
    cluster_of: Vec<usize>,
    num_clusters: usize,
}

impl Topology {
    /// `clusters` clusters of `threads_per_cluster` threads each, numbered cluster-major:
    /// thread `t` is in cluster `t / threads_per_cluster`.
    ///
    /// # Errors
    /// [`RuntimeError::BadTopology`] if either count is zero.
    pub fn uniform(clusters: usize, threads_per_cluster: usize) -> Result<Self, RuntimeError> {
        if clusters == 0 || threads_per_cluster == 0 {
            return Err(RuntimeError::BadTopology(format!(
                "{clusters} clusters of {threads_per_cluster} threads: both must be at least 1"
            )));
        }
        Self::from_cluster_of(
            (0..clusters * threads_per_cluster)
                .map(|t| t / threads_per_cluster)
                .collect(),
        )
    }

    /// A topology from an explicit thread → cluster table.
    ///
    /// # Errors
    /// [`RuntimeError::BadTopology`] if the table is empty or some cluster id below the
    /// largest one has no thread.
    pub fn from_cluster_of(cluster_of: Vec<usize>) -> Result<Self, RuntimeError> {
        let Some(&max) = cluster_of.iter().max() else {
            return Err(RuntimeError::BadTopology("no threads".to_owned()));
        };
        let num_clusters = max + 1;
        let mut seen = vec![false; num_clusters];
        for &c in &cluster_of {
            seen[c] = true;
        }
        if let Some(empty) = seen.iter().position(|&s| !s) {
            return Err(RuntimeError::BadTopology(format!(
                "cluster {empty} has no thread (clusters must be numbered 0..{num_clusters} without gaps)"
            )));
        }
        Ok(Self {
            cluster_of,
            num_clusters,
        })
    }

    /// Number of compute threads.
    #[must_use]
    pub fn num_threads(&self) -> usize {
        self.cluster_of.len()
    }

    /// Number of clusters.
    #[must_use]
    pub fn num_clusters(&self) -> usize {
        self.num_clusters
    }

    /// The cluster of `thread`. Panics if `thread >= num_threads()`.
    #[must_use]
    pub fn cluster_of(&self, thread: usize) -> usize {
        self.cluster_of[thread]
    }

    /// The threads of `cluster`, ascending.
    #[must_use]
    pub fn threads_of(&self, cluster: usize) -> Vec<usize> {
        (0..self.num_threads())
            .filter(|&t| self.cluster_of[t] == cluster)
            .collect()
    }
}

/// Errors of a runtime backend.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The thread/cluster description is unusable.
    #[error("bad topology: {0}")]
    BadTopology(String),
    /// A shared allocation could not be satisfied.
    #[error("cannot allocate {words} shared words: {reason}")]
    Alloc {
        /// Requested length in words (8 bytes each).
        words: usize,
        /// Why not.
        reason: String,
    },
    /// A compute thread panicked; the parallel section was abandoned.
    #[error("compute thread {thread} panicked: {message}")]
    ThreadPanicked {
        /// The thread id.
        thread: usize,
        /// The panic payload, if it was a string.
        message: String,
    },
    /// Any other backend failure.
    #[error("runtime backend error")]
    Backend(#[source] Box<dyn Error + Send + Sync>),
}

/// A runtime the parallel apps run on: collective setup, then one [`Team`] handle per
/// compute thread. See the [module docs](self) for the programming and memory model.
pub trait Runtime {
    /// Shared `f64` array handle.
    type F64s: crate::storage::F64Words + Sync + Send;
    /// Shared `u64` array handle.
    type U64s: crate::storage::U64Words + Sync + Send;
    /// Per-thread handle passed to the body of [`Runtime::run`]. It may borrow from the
    /// runtime for the duration of one `run` call (`'t`), as the DSM backend's handle
    /// borrows the cluster's runtime.
    type Team<'t>: Team;

    /// Threads and their clusters; fixed for the runtime's lifetime.
    fn topology(&self) -> &Topology;

    /// Allocates a shared array of `len` `f64` words (8 bytes each; `len` may be 0), all
    /// `0.0`. Collective: every process makes the same calls in the same order.
    ///
    /// # Errors
    /// [`RuntimeError::Alloc`] if the backend cannot provide the memory.
    fn alloc_f64s(&mut self, len: usize) -> Result<Self::F64s, RuntimeError>;

    /// Allocates a shared array of `len` `u64` words (`len` may be 0), all `0`.
    /// Collective, like [`Runtime::alloc_f64s`].
    ///
    /// # Errors
    /// [`RuntimeError::Alloc`] if the backend cannot provide the memory.
    fn alloc_u64s(&mut self, len: usize) -> Result<Self::U64s, RuntimeError>;

    /// Allocates `count` locks and returns the id of the first; the new locks have ids
    /// `first..first + count`. Collective. Ids are small integers starting at 0.
    ///
    /// # Errors
    /// [`RuntimeError::Alloc`] if the backend cannot provide that many locks.
    fn alloc_locks(&mut self, count: usize) -> Result<usize, RuntimeError>;

    /// Runs `body` on every compute thread of the job (each gets its own [`Team`]) and
    /// waits for all of them. Returns the values of the threads that ran *in this process*,
    /// in ascending thread id (all of them for the threads backend).
    ///
    /// # Errors
    /// [`RuntimeError::ThreadPanicked`] if a thread panicked (the others are released from
    /// barriers and fail too), or a backend error.
    fn run<T, F>(&mut self, body: F) -> Result<Vec<T>, RuntimeError>
    where
        T: Send,
        F: Fn(&Self::Team<'_>) -> T + Sync;
}

/// One compute thread's view of the job, valid during [`Runtime::run`].
pub trait Team: Sync {
    /// This thread's id, `0..num_threads()`.
    fn thread_id(&self) -> usize;

    /// The job's topology (same as [`Runtime::topology`]).
    fn topology(&self) -> &Topology;

    /// Number of compute threads in the job.
    fn num_threads(&self) -> usize {
        self.topology().num_threads()
    }

    /// Waits until every thread of the job has called `barrier` for this episode. All
    /// shared writes made before it by any thread are visible to every thread after it.
    fn barrier(&self);

    /// Acquires lock `id` (allocated with [`Runtime::alloc_locks`]; an unallocated id
    /// panics) and holds it until the returned guard is dropped. Writes made by the
    /// previous holder before its release are visible after the acquire.
    #[must_use = "the lock is released when the guard is dropped"]
    fn lock(&self, id: usize) -> impl Sized + '_;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_topology_is_cluster_major() {
        let t = Topology::uniform(3, 2).unwrap();
        assert_eq!(t.num_threads(), 6);
        assert_eq!(t.num_clusters(), 3);
        assert_eq!(
            (0..6).map(|i| t.cluster_of(i)).collect::<Vec<_>>(),
            [0, 0, 1, 1, 2, 2]
        );
        assert_eq!(t.threads_of(1), [2, 3]);
    }

    #[test]
    fn bad_topologies_are_rejected() {
        assert!(matches!(
            Topology::uniform(0, 4),
            Err(RuntimeError::BadTopology(_))
        ));
        assert!(Topology::from_cluster_of(vec![]).is_err());
        let e = Topology::from_cluster_of(vec![0, 2, 2]).unwrap_err();
        assert!(e.to_string().contains("cluster 1 has no thread"), "{e}");
        assert_eq!(
            Topology::from_cluster_of(vec![1, 0, 1])
                .unwrap()
                .threads_of(1),
            [0, 2]
        );
    }
}
