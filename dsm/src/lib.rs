//! The multigrain DSM runtime: a region of memory kept coherent at page grain between
//! cluster processes, on Linux userfaultfd and the multigrain message layer (MGS, Yeung,
//! Kubiatowicz, Agarwal, ISCA 1996, rebuilt on commodity Linux).
//!
//! # API
//!
//! * [`Dsm`] — one cluster's runtime. [`Dsm::join`] a job with a [`Transport`] (this
//!   cluster's message-layer site, routes to every cluster, a [`Liveness`] oracle) and
//!   the [`JobConfig`](multigrain_cluster_config::JobConfig) (protocol, home policy,
//!   region base and size, threads per cluster, timeouts); [`Dsm::alloc`] typed
//!   [`SharedArray`]s collectively; [`Dsm::run`] the cluster's compute threads, each with
//!   a [`Worker`] (global and local thread ids, [`Worker::barrier`], [`Worker::lock`]
//!   returning a [`LockGuard`]); [`Dsm::finish`] with the job's [`JobStats`].
//! * [`transport`] — the boundary to the job bootstrap: [`site_config`], [`Transport`],
//!   [`Liveness`], [`PidLiveness`] for same-machine peers, [`local_transports`] for
//!   several clusters in one process.
//! * [`uffd`] — the userfaultfd region layer the runtime is built on.
//! * [`bench`](mod@bench) — measurement kernels (fault latency beside UDP and bare-fault
//!   baselines, write fault and release cost, diff throughput, diff application).
//!
//! # Design
//!
//! **Region.** Each cluster maps the region at the same address (`dsm.region_base`),
//! backed by a memfd, registered with userfaultfd for missing and write-protect faults
//! ([`uffd::Backing::SharedMemory`]). A second, unregistered mapping of the same memfd —
//! the *runtime view* — is where the runtime reads pages it sends or twins and writes
//! the diffs it applies as a home: never faulting, never changing what application
//! threads see. One coherence [`Machine`](multigrain_coherence::Machine) (hlrc or sc) per
//! cluster, behind one mutex, decides; the runtime executes its actions.
//!
//! **Threads and the fault path.** Faults are delivered as `SIGBUS` to the faulting
//! thread, which passes the fault to the machine and executes the actions itself
//! (`UFFDIO_COPY` of a zero page for an untouched home page; twin + unprotect for a write
//! to a read-only page; a request to the home otherwise). When the page must come from
//! another cluster the thread waits by polling the cluster's protocol queue itself and
//! handles every message that arrives meanwhile — including the reply that installs its
//! page (`UFFDIO_COPY` straight from the received pool buffer). No other thread's
//! wake-up is on the critical path of a remote fault. Concurrent faults on a page join
//! one fetch; a fault blocks only the threads touching that page. One protocol thread per
//! cluster blocks on the same queue and serves requests (pages homed here, diffs, lock
//! and barrier managers) while no other thread polls.
//!
//! **Waits.** A waiting thread (page, lock, barrier) polls the protocol queue, yielding
//! the CPU between polls, for `dsm.wait_spin_us` (1 ms; [`DsmOptions::wait_spin`]), then sleeps in the message
//! layer's blocking receive (on the sockets with INIs, else on the doorbell) in slices of
//! 2 ms. A thread that completes another thread's wait while that one sleeps sends a
//! no-op to the sleeper's own wake-up queue ([`WAKE_QUEUES`]). At most one waiting
//! thread per CPU sleeps that way (every message wakes all of them); the others park
//! until their own wait completes (the completer unparks exactly that thread), and when
//! more threads wait than there are CPUs none yield-polls: hundreds of compute threads
//! per core would otherwise keep every CPU busy with wake-ups. Every wait asks the
//! [`Liveness`] oracle every few milliseconds and fails — naming the failed cluster —
//! when a cluster died, aborted or fell silent.
//!
//! **Messages.** Requests and acknowledgements are Express messages, pages and diffs
//! Tag-On messages (the page copied once into a pool buffer), vector times and write
//! notices bulk messages; the coherence opcode is the handler index and the sender's
//! cluster id the source id ([`transport`], `wire` in the source).
//!
//! **Synchronization.** Barriers are hierarchical: a cluster's threads meet locally and
//! the last one arrives at the global barrier for the cluster, write notices piggy-backed.
//! Locks are managed per lock at the lock's home (FIFO between clusters, write notices
//! with the grant) and cached by the cluster that was granted one (lazy release,
//! TreadMarks/MGS): its threads acquire and release it without any message until the
//! manager recalls it for another cluster; a recalled lock still passes between the
//! cluster's threads up to [`MAX_LOCAL_HANDOFFS`] times before it leaves
//! ([`multigrain_coherence::sync`]). Under hlrc a home page that no other cluster has
//! fetched stays writable across releases: its home's writes need no write notice
//! until another cluster takes a copy (`multigrain_coherence::hlrc`, *private home
//! pages*).
//!
//! **Applying a diff at the home** (measured, `cargo bench -p multigrain-dsm --bench
//! dsm`, 4 KiB page with 10% of its words changed): storing the diff's words through the
//! runtime view takes 0.16 µs and leaves the application's mapping untouched; the
//! alternative on anonymous memory — the page is read-only, so copy it, apply the diff
//! to the copy, drop the page and reinstall the copy read-only — takes 3.8 µs, and
//! application threads touching the page meanwhile fault. The memfd costs elsewhere:
//! `UFFDIO_COPY` 2.1 µs instead of 1.4 µs, and invalidation must punch a hole
//! (`MADV_REMOVE`: 4.0 µs per page, 41 µs per 64-page run, vs `MADV_DONTNEED` 1.9 and
//! 15 µs).
//!
//! # Memory model and failures
//!
//! Release consistency (hlrc) or sequential consistency (sc), chosen by `dsm.protocol`:
//! a write is guaranteed visible to another thread after a release → acquire between
//! them (a lock passed on, or a barrier); programs must be data-race-free at the grain of
//! 8-byte words. A cluster that fails makes every other cluster fail:
//! synchronization calls return [`DsmError::PeerFailed`] naming it, and a thread in a
//! page fault, which cannot return an error, prints it and ends its process with
//! [`FAULT_EXIT_CODE`].
#![deny(unsafe_op_in_unsafe_fn)]

mod array;
pub mod bench;
mod error;
mod event_profile;
mod pieces;
mod runtime;
mod stats;
pub mod transport;
pub mod uffd;
mod wire;

pub use array::SharedArray;
pub use error::DsmError;
pub use event_profile::{EventProfile, EventTime};
pub use runtime::{
    Dsm, DsmOptions, FAULT_EXIT_CODE, LockGuard, MAX_LOCAL_HANDOFFS, Stall, StallProbe, Worker,
};
pub use stats::{
    ClusterStats, JobStats, LONG_LOCK_WAIT, LayerStats, LockWaits, PhaseTimes, ProtocolStats,
    SLOW_LOCK_WAIT, SLOW_LOCKS_KEPT,
};
pub use transport::{
    Liveness, LivenessError, LocalJobError, NeverFails, PROTOCOL_QUEUE, PidLiveness, Transport,
    WAKE_QUEUES, local_transports, site_config,
};
pub use wire::op_name;
