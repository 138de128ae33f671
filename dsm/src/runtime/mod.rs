//! The DSM runtime of one cluster: [`Dsm`] (join a job, allocate shared arrays, run
//! compute threads, synchronize, finish), the per-thread [`Worker`] handle, and
//! [`LockGuard`].

pub(crate) mod core;
mod join;
mod lock_cache;
mod reseq;
pub(crate) mod slots;
mod spin;
pub(crate) mod sync;
mod twins;
mod watch;
mod worker;

use self::core::{Core, Resolver, Tuning};
use self::sync::LocalBarrier;
use crate::array::SharedArray;
use crate::error::DsmError;
use crate::stats::{ClusterStats, JobStats, bump};
use crate::transport::{PROTOCOL_QUEUE, Transport, WAKE_QUEUES};
use crate::uffd::{Backing, PAGE_SIZE, PageIndex, PageRange, Region, RegionConfig};
use crate::wire::RuntimeOp;
use bytemuck::Pod;
use multigrain_cluster_config::{
    HomePolicy, JobConfig, Link, Protocol as CfgProtocol, ProtocolPriority,
};
use multigrain_coherence::{
    ClusterId, Config, Event, HomePolicy as Homes, LockId, MAX_LOCKS, Machine, Protocol,
};
use multigrain_messaging::{
    Destination, Express, QueueId, SiteId, SourceId, TableWriter, VirtualName,
};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The clock of the runtime's timers: every lock call, dispatch, wait and fault is timed
/// for the run report, several times per lock hand-off, and a waiting thread's busy and
/// yielding phases are timed with it too. `quanta` reads the TSC: ≈ 8 ns a read on the
/// development VM against ≈ 21 ns for `std::time::Instant` (`bench dsm`'s lock hand-off
/// over shared memory 2.18 → 2.07 µs, 4 alternating runs; forty-seventh session). What
/// decides an error — a peer's timeout, the join's deadline, the stall watchdog, a send
/// that cannot get a buffer — keeps `std::time::Instant`, the kernel's monotonic clock.
pub(crate) type FastInstant = quanta::Instant;

pub use self::core::FAULT_EXIT_CODE;
pub use self::watch::{Stall, StallProbe};
pub use self::worker::{LockGuard, Worker};
pub(crate) use join::map_destinations;

/// How many times a waiting thread polls the protocol queue without yielding its CPU
/// before it polls yielding (about 20 ns a poll when nothing arrives, so ≈ 20 µs): the
/// reply to a request over shared memory usually comes within that, and a yield to
/// another runnable thread costs a context switch each way. Each thread adapts its own
/// number up to this one (see [`spin`]): where compute threads outnumber the CPUs, the
/// busy polls of a long wait are another thread's compute time.
const BUSY_POLLS: u32 = 1000;

/// How long the protocol thread naps, off the doorbell, while the cluster's own threads
/// keep polling the protocol queue (see `Core::serve`). A message that arrives while
/// the cluster's threads compute waits at most for their next poll or two naps,
/// whichever comes first; in exchange the protocol thread does not take the CPU from a
/// compute thread for every message. Measured on Water 2×1 over shared memory (2
/// vCPUs, 2026-11-21): 200 µs took 0.80 s on 512 × 50 and 2.1 s on 4096 × 3, 50 µs
/// 1.2 s and 2.7 s, no nap (a yield) 1.1 s and 2.6 s. Re-measured 2026-11-26 (3
/// alternating rounds, 2×1, median): Water 512 × 50 over shm 0.50 s with 200 µs, 0.43 s
/// with 1 ms, 0.39 s with 2 ms and 5 ms; over udp 0.85 / 0.58 / 0.58 / 0.54 s; EM3D
/// (20,000 nodes per thread, 100 iterations) over shm 0.159 / 0.148 / 0.137 / 0.145 s,
/// over udp 0.339 / 0.261 / 0.268 / 0.284 s; 30 ms was slower again over udp. With
/// 200 µs the protocol threads slept and were woken ≈ 5,600 times in a Water 512 × 50
/// run, each wake-up preempting a compute thread.
const HANDOVER: Duration = Duration::from_millis(2);
pub use multigrain_coherence::sync::MAX_LOCAL_HANDOFFS;

/// Tuning of a cluster's runtime beyond the job configuration. `Default` is what a job
/// should use.
///
/// # Why the waits poll for a millisecond
///
/// A thread sleeping on a futex and woken by a message takes 50–150 µs to run again on
/// the development VM (2 vCPUs), several times a whole remote fault. Waiting threads
/// therefore poll first, yielding the CPU between polls so that the thread that will
/// produce the awaited message runs even when there are more runnable threads than
/// cores. Measured with the multi-process counter test (4 clusters × 2 threads, 80,000
/// lock-protected increments, hlrc): polling 50 µs 23 s, 200 µs 11 s, 500 µs 1.4 s,
/// 1 ms 1.2 s, 2 ms 1.1 s; never polling 44 s. Re-measured after waits got their own
/// wake-up queues (no lost wake-ups) and locks became cached in clusters, on Water
/// 512 × 50 over UDP: 2×1 / 2×2 took 4.2 / 6.3 s sleeping at once (the message layer's
/// blocking receive, on the INI sockets or the doorbell), 4.6 / 4.9 s after 50 µs of
/// polling, 3.8 / 4.3 s after 200 µs and 3.8 / 3.7 s after 1 ms; 3 ms was within the
/// noise of 1 ms. A wake-up costs more than a whole exchange here, so polling stays.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DsmOptions {
    /// Map this cluster's region at this address instead of `dsm.region_base`. Only for
    /// running several clusters of one job in one process (benchmarks, tests): array
    /// addresses then differ between clusters, so never pass addresses between them.
    /// `None` (the default) uses the configuration.
    pub region_base: Option<usize>,
    /// How long a thread waiting for a page, a lock or a barrier polls the protocol
    /// queue (yielding between polls) before it sleeps in the message layer's blocking
    /// receive. `None` (the default): the job configuration's `dsm.wait_spin_us`, 1 ms
    /// unless set ([`multigrain_cluster_config::DEFAULT_WAIT_SPIN_US`]). Not applied
    /// while more threads of the cluster wait than the process has CPUs: they sleep at
    /// once.
    pub wait_spin: Option<Duration>,
    /// How long the protocol thread polls after a message before it sleeps. `None`
    /// (the default): 1 ms where this cluster reaches another one through INIs over
    /// UDP — the protocol thread is then also the network's receiver, and a datagram
    /// that finds it asleep waits for a wake-up — and zero where every other cluster
    /// is reached over shared memory, whose messages the cluster's own waiting threads
    /// poll. Measured with `multigrain bench apps` (Water, 2 vCPUs, 2 rounds): over
    /// shared memory 512 × 50 took 0.89 s with zero and 1.29 s with 1 ms (a spinning
    /// protocol thread takes CPU from the compute threads); over UDP 1.55 s with 1 ms
    /// and 2.62 s with zero, and 4096 × 3 3.1 s against 5.8 s.
    pub server_spin: Option<Duration>,
    /// The CPUs the protocol thread binds itself to when it starts (CPU numbers, as
    /// `sched_setaffinity` names them). `None` (the default): it runs where the process
    /// runs. `multigrain launch` places each cluster's protocol thread on the other
    /// clusters' CPUs when it binds clusters that share a host apart
    /// (`launch.cpu_bind = "apart"`, and `auto` with a CPU per compute thread): it then
    /// answers them on the CPUs of the threads that wait for the answers, not on those
    /// of its own computing threads. A binding the kernel refuses is logged and the
    /// thread runs where the process runs.
    pub protocol_cpus: Option<Vec<usize>>,
}

impl DsmOptions {
    /// The job configuration's default `dsm.wait_spin_us` (1 ms), as a `Duration`: how
    /// long a waiting thread polls before it sleeps, unless the job sets it.
    pub const DEFAULT_WAIT_SPIN: Duration =
        Duration::from_micros(multigrain_cluster_config::DEFAULT_WAIT_SPIN_US);
}

/// One cluster's DSM runtime: the region (mapped at the same address in every cluster
/// and kept coherent at page grain), its coherence machine, and the protocol thread.
///
/// # Use
///
/// ```no_run
/// # use multigrain_dsm::*;
/// let cfg = multigrain_cluster_config::JobConfig::local(2, 2);
/// # let transport = || transport::local_transports(&cfg).expect("sites").remove(0);
/// // 1. Join: every cluster process, with its Transport from the job bootstrap.
/// let mut dsm = Dsm::join(transport(), &cfg)?;
/// // 2. Allocate collectively (same calls, same order, in every cluster), before `run`.
/// let counter = dsm.alloc::<u64>(1)?;
/// let data = dsm.alloc::<f64>(1 << 16)?;
/// // 3. Run this cluster's compute threads; each gets a Worker.
/// dsm.run(|w| -> Result<(), DsmError> {
///     for i in (w.thread_id()..data.len()).step_by(w.threads()) {
///         data.set(i, i as f64);
///     }
///     w.barrier()?; // every write before is visible everywhere after
///     let _g = w.lock(0)?; // a distributed lock
///     counter.set(0, counter.get(0) + 1);
///     Ok(())
/// })?;
/// // 4. Finish: a final barrier, statistics summed over the job, threads joined.
/// let stats = dsm.finish()?;
/// println!("{} remote faults", stats.total.remote_faults);
/// # Ok::<(), DsmError>(())
/// ```
///
/// # Memory model
///
/// Release consistency (hlrc) or sequential consistency (sc), chosen by `dsm.protocol`:
/// a write is guaranteed visible to another thread after a release → acquire between
/// them (a lock passed on, or a barrier); programs must be data-race-free at that grain.
/// Threads of one cluster share its single copy of each page.
///
/// # Failures
///
/// A cluster that dies, aborts or falls silent (as the [`crate::Liveness`] of the
/// transport reports) makes every other cluster fail: synchronization calls return
/// [`DsmError::PeerFailed`] naming it, and a thread blocked in a page fault, which cannot
/// return an error, prints it and ends its process with [`FAULT_EXIT_CODE`].
pub struct Dsm {
    inner: Arc<Inner>,
    server: Option<JoinHandle<()>>,
    next_offset: usize,
    next_lock: u32,
    /// Joined, and neither finished nor failed at start-up.
    live: bool,
}

/// What a [`Dsm`] shares with its [`Worker`]s.
struct Inner {
    core: Arc<Core>,
    region: Arc<Region>,
    running: AtomicBool,
    threads: Vec<usize>,
    options: DsmOptions,
    /// How long a waiting thread polls before it sleeps: [`DsmOptions::wait_spin`], or
    /// else `dsm.wait_spin_us`.
    wait_spin: Duration,
    peer_timeout: Duration,
    /// The compute threads' scheduling policy (`dsm.thread_policy`).
    thread_policy: multigrain_cluster_config::ThreadPolicy,
    /// Whether [`Dsm::alloc`] puts an array's pages in the region's memory at once
    /// (`dsm.populate`; only with minor faults).
    populate: bool,
}

impl std::fmt::Debug for Dsm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dsm")
            .field("cluster", &self.inner.core.me)
            .field("clusters", &self.inner.core.clusters)
            .field("region", &*self.inner.region)
            .finish_non_exhaustive()
    }
}
impl Dsm {
    /// This cluster's id.
    pub fn cluster(&self) -> usize {
        self.inner.core.me
    }

    /// Number of clusters in the job.
    pub fn clusters(&self) -> usize {
        self.inner.core.clusters
    }

    /// Compute threads of each cluster (`clusters[c].threads` of the configuration).
    pub fn threads_per_cluster(&self) -> &[usize] {
        &self.inner.threads
    }

    /// Compute threads in the job.
    pub fn total_threads(&self) -> usize {
        self.inner.threads.iter().sum()
    }

    /// The global id of cluster `cluster`'s first compute thread: threads are numbered
    /// cluster-major, `0..total_threads()`.
    ///
    /// # Panics
    /// If `cluster >= clusters()`.
    pub fn first_thread(&self, cluster: usize) -> usize {
        self.inner.first_thread(cluster)
    }

    /// The cluster of global thread `thread`, or `None` beyond the job's threads.
    pub fn cluster_of_thread(&self, thread: usize) -> Option<usize> {
        let mut first = 0;
        for (c, &n) in self.inner.threads.iter().enumerate() {
            if thread < first + n {
                return Some(c);
            }
            first += n;
        }
        None
    }

    /// The region's first address (the same in every cluster unless
    /// [`DsmOptions::region_base`] overrode it).
    pub fn region_base(&self) -> usize {
        self.inner.region.layout().base()
    }

    /// The region's length in bytes.
    pub fn region_len(&self) -> usize {
        self.inner.region.layout().len()
    }

    /// Bytes of the region not yet allocated.
    pub fn free_bytes(&self) -> usize {
        self.region_len() - self.next_offset
    }

    /// The options this runtime was joined with.
    pub fn options(&self) -> &DsmOptions {
        &self.inner.options
    }

    /// Allocates a zeroed array of `len` elements of `T` in the region. **Collective**:
    /// every cluster makes the same sequence of `alloc` calls (same types, same lengths)
    /// before any [`Dsm::run`], so that array *k* lies at the same address everywhere.
    /// Each array starts on a fresh page (no false sharing between arrays). Memory is
    /// never freed. `T`'s size must be a positive multiple of 8 bytes (see
    /// [`SharedArray`] for why). The region is written only through the array's
    /// methods: they mark the pages they store to, and a release's flush reads only
    /// marked pages (software write detection, [`WriteMarks`](crate::uffd::WriteMarks)),
    /// so a store through a raw pointer to [`Dsm::region_base`] would not reach the
    /// other clusters.
    ///
    /// With `dsm.populate` (the default) and minor faults (Linux ≥ 6.4, see
    /// [`RegionOps::minor_faults`](crate::uffd::RegionOps::minor_faults)), the array's
    /// pages are put in this cluster's memory now, zero-filled
    /// ([`RegionOps::populate`](crate::uffd::RegionOps::populate)): each page's first
    /// fault then maps memory already in place instead of allocating it.
    ///
    /// # Errors
    /// [`DsmError::OutOfSpace`] when the region is full, [`DsmError::Config`] for an
    /// element size that is not a positive multiple of 8, or when the memory to populate
    /// the array is not there.
    pub fn alloc<T: Pod>(&mut self, len: usize) -> Result<SharedArray<T>, DsmError> {
        let me = self.cluster();
        let size = std::mem::size_of::<T>();
        if size == 0 || !size.is_multiple_of(8) {
            return Err(DsmError::Config {
                cluster: me,
                reason: format!(
                    "shared array elements must be a positive multiple of 8 bytes, {} is {size} \
                     bytes: the protocol merges writes of different clusters by 8-byte words, \
                     so smaller elements written by different clusters could overwrite each \
                     other (pad the type, or pack several values into one element)",
                    std::any::type_name::<T>()
                ),
            });
        }
        let align = std::mem::align_of::<T>().max(PAGE_SIZE);
        let region = self.region_len();
        let offset = self.next_offset.next_multiple_of(align);
        let end = len
            .checked_mul(size)
            .and_then(|b| b.checked_add(offset))
            .filter(|&e| e <= region)
            .ok_or(DsmError::OutOfSpace {
                cluster: me,
                bytes: len.saturating_mul(size),
                available: region.saturating_sub(offset),
                region,
            })?;
        if self.inner.populate && self.inner.region.minor_faults() {
            let first = PageIndex(offset / PAGE_SIZE);
            let pages = end.div_ceil(PAGE_SIZE) - first.0;
            self.inner
                .region
                .populate(PageRange::new(first, pages))
                .map_err(|e| DsmError::Config {
                    cluster: me,
                    reason: format!(
                        "allocating the memory of a shared array of {} KiB failed ({e}): \
                         dsm.populate = true puts every array's pages in memory when it is \
                         allocated; free memory, or set dsm.populate = false to allocate \
                         each page at its first access",
                        pages * PAGE_SIZE / 1024
                    ),
                })?;
        }
        // hlrc's read-ahead stops at the last array's end (every cluster allocates the
        // same arrays, so each knows the extent).
        let extent = u32::try_from(end.div_ceil(PAGE_SIZE)).unwrap_or(u32::MAX);
        self.inner.core.state.lock().machine.set_extent(extent);
        self.next_offset = end;
        Ok(SharedArray::new(
            Arc::clone(&self.inner.region),
            self.region_base() + offset,
            len,
        ))
    }

    /// Reserves `count` lock ids and returns the first (ids `first..first + count`).
    /// Collective like [`Dsm::alloc`]. Any id below [`MAX_LOCKS`] may also be used
    /// without reserving it; reserving only keeps independent parts of a program apart.
    ///
    /// # Errors
    /// [`DsmError::BadLock`] beyond [`MAX_LOCKS`] ids.
    pub fn alloc_locks(&mut self, count: usize) -> Result<u32, DsmError> {
        let first = self.next_lock;
        let end = u64::from(first) + count as u64;
        if end > u64::from(MAX_LOCKS) {
            return Err(DsmError::BadLock {
                cluster: self.cluster(),
                lock: end - 1,
                max: MAX_LOCKS,
            });
        }
        self.next_lock = end as u32;
        Ok(first)
    }

    /// Runs `body` on each of this cluster's compute threads (`clusters[c].threads` of
    /// the configuration; every cluster of the job calls `run` for the same parallel
    /// section) and waits for them. Each thread gets a [`Worker`] with its ids and the
    /// synchronization calls. Ends with a barrier of the whole job, so every write of the
    /// section is visible everywhere afterwards. Returns the threads' results in order of
    /// their ids.
    ///
    /// # Errors
    /// [`DsmError::ThreadPanicked`] if a thread panicked (the job is aborted: the other
    /// clusters fail with [`DsmError::PeerFailed`]), [`DsmError::PeerFailed`], or
    /// [`DsmError::Config`] if a section is already running.
    pub fn run<T, F>(&self, body: F) -> Result<Vec<T>, DsmError>
    where
        T: Send,
        F: Fn(&Worker<'_>) -> T + Sync,
    {
        let inner = &self.inner;
        let me = inner.core.me;
        if inner.running.swap(true, Ordering::AcqRel) {
            return Err(DsmError::Config {
                cluster: me,
                reason: "Dsm::run called while a parallel section is running".into(),
            });
        }
        struct Reset<'a>(&'a AtomicBool);
        impl Drop for Reset<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _reset = Reset(&inner.running);
        if inner.core.is_failed() {
            return Err(inner
                .core
                .failure_error(Some("starting a parallel section".into())));
        }
        let n = inner.threads[me];
        let first = inner.first_thread(me);
        let barrier = LocalBarrier::new(n);
        let outcomes: Vec<Result<T, DsmError>> = std::thread::scope(|s| {
            let mut handles = Vec::with_capacity(n);
            for local in 0..n {
                let worker = Worker {
                    inner,
                    local,
                    barrier: &barrier,
                };
                let body = &body;
                let thread = first + local;
                // A panic aborts the job at once (from the panicking thread), so that the
                // other threads, here and elsewhere, stop waiting for this one.
                let run_one = move || {
                    multigrain_messaging::sched::set_policy(worker.inner.thread_policy);
                    slots::set_compute_index(Some(local));
                    let _active = worker.inner.core.waits.active();
                    catch_unwind(AssertUnwindSafe(|| body(&worker))).map_err(|payload| {
                        let message = payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "(non-string panic payload)".into());
                        let e = DsmError::ThreadPanicked {
                            cluster: me,
                            thread,
                            message,
                        };
                        worker.inner.abort(&e);
                        e
                    })
                };
                let spawned = std::thread::Builder::new()
                    .name(format!("dsm-c{me}-t{local}"))
                    .spawn_scoped(s, run_one);
                match spawned {
                    Ok(h) => handles.push(Ok(h)),
                    Err(source) => {
                        let e = DsmError::Spawn {
                            cluster: me,
                            what: "a compute thread",
                            source,
                        };
                        inner.abort(&e);
                        handles.push(Err(e));
                    }
                }
            }
            handles
                .into_iter()
                .enumerate()
                .map(|(local, h)| {
                    h?.join().unwrap_or_else(|_| {
                        Err(DsmError::ThreadPanicked {
                            cluster: me,
                            thread: first + local,
                            message: "panicked while reporting a panic".into(),
                        })
                    })
                })
                .collect()
        });
        let results = outcomes.into_iter().collect::<Result<Vec<T>, DsmError>>()?;
        inner.global_barrier()?;
        Ok(results)
    }

    /// A barrier of the whole job, entered by one thread per cluster: for use outside
    /// [`Dsm::run`] (between parallel sections, e.g. after one thread initialized
    /// data). Inside `run`, compute threads use [`Worker::barrier`].
    ///
    /// # Errors
    /// [`DsmError::Config`] inside `run`; [`DsmError::PeerFailed`].
    pub fn barrier(&self) -> Result<(), DsmError> {
        if self.inner.running.load(Ordering::Acquire) {
            return Err(DsmError::Config {
                cluster: self.cluster(),
                reason: "Dsm::barrier inside a parallel section: use Worker::barrier".into(),
            });
        }
        self.inner.global_barrier()
    }

    /// Acquires distributed lock `id` for the calling thread until the guard is dropped
    /// (or [`LockGuard::unlock`]ed). Writes made by the previous holder before its release
    /// are visible after the acquire. Any thread of the process may call it (compute
    /// threads usually through [`Worker::lock`]).
    ///
    /// # Errors
    /// [`DsmError::BadLock`] for `id >= MAX_LOCKS`; [`DsmError::PeerFailed`].
    pub fn lock(&self, id: u32) -> Result<LockGuard<'_>, DsmError> {
        self.inner.lock(id)
    }

    /// A handle for a watchdog thread: whether every compute thread of this cluster
    /// waits in the runtime, for what, and since when ([`StallProbe::stall`]). The
    /// job's runner reports it to the control plane, which fails the job when every
    /// cluster has stalled for `job.progress_timeout_ms`.
    pub fn stall_probe(&self) -> StallProbe {
        StallProbe::new(Arc::clone(&self.inner.core))
    }

    /// This cluster's statistics so far.
    pub fn stats(&self) -> ClusterStats {
        self.inner.core.snapshot()
    }

    /// Finishes the job: a last barrier, then every cluster sends its statistics to
    /// every other, then the protocol thread is stopped and joined and the region is
    /// unmapped (as soon as no [`SharedArray`] refers to it). Every cluster must call it.
    /// Returns the statistics of every cluster and their sum.
    ///
    /// # Errors
    /// [`DsmError::PeerFailed`] if a cluster failed or did not deliver its statistics
    /// within `job.peer_timeout_ms`.
    pub fn finish(mut self) -> Result<JobStats, DsmError> {
        let inner = Arc::clone(&self.inner);
        let core = &inner.core;
        let me = core.me;
        inner.global_barrier()?;
        let mine = core.snapshot();
        let json = serde_json::to_vec(&mine).map_err(|e| DsmError::Internal {
            cluster: me,
            detail: format!("encoding statistics: {e}"),
        })?;
        core.peer_stats.lock()[me] = Some(mine);
        let deadline = Instant::now() + inner.peer_timeout;
        core.with_thread(|_, ep| {
            for c in (0..core.clusters).filter(|&c| c != me) {
                core.send_runtime_bulk(&inner.region, ep, c, RuntimeOp::Stats, &json)?;
            }
            loop {
                let missing: Vec<usize> = {
                    let s = core.peer_stats.lock();
                    (0..core.clusters).filter(|&c| s[c].is_none()).collect()
                };
                let Some(&late) = missing.first() else {
                    return Ok(());
                };
                core.check_liveness(&inner.region, ep, &|| "finishing the job".into())?;
                if Instant::now() >= deadline {
                    return Err(DsmError::PeerFailed {
                        cluster: late,
                        reason: format!(
                            "it did not send its statistics within {} ms of the final barrier",
                            inner.peer_timeout.as_millis()
                        ),
                        detected_by: me,
                        context: Some("finishing the job".into()),
                    });
                }
                if let Some(m) = ep.recv_timeout(Duration::from_millis(2)) {
                    core.dispatch(&inner.region, ep, m)?;
                }
            }
        })?;
        self.live = false;
        self.shutdown();
        let all = core
            .peer_stats
            .lock()
            .iter()
            .map(|s| s.clone().unwrap_or_default())
            .collect();
        Ok(JobStats::from_clusters(all))
    }

    /// Stops and joins the protocol thread.
    fn shutdown(&mut self) {
        let core = &self.inner.core;
        if self.live {
            // Leaving without `finish`: the other clusters must not wait for us.
            self.live = false;
            self.inner.abort(&DsmError::PeerFailed {
                cluster: core.me,
                reason: "its runtime was shut down before the job finished".into(),
                detected_by: core.me,
                context: None,
            });
        }
        if let Some(server) = self.server.take() {
            core.stop.store(true, Ordering::Release);
            let _ = core.with_thread(|_, ep| {
                core.ring_own_doorbell(ep);
                Ok(())
            });
            if server.join().is_err() {
                tracing::error!("cluster {}: the protocol thread panicked", core.me);
            }
        }
    }
}

impl Drop for Dsm {
    /// Stops and joins the protocol thread; the region is unmapped when the last
    /// [`SharedArray`] is gone too. Without [`Dsm::finish`] the other clusters are told
    /// that this cluster left, and fail.
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn first_thread(&self, cluster: usize) -> usize {
        self.threads[..cluster].iter().sum()
    }

    /// Aborts the job because of `e`, raised here.
    fn abort(&self, e: &DsmError) {
        let _ = self.core.with_thread(|_, ep| {
            self.core.fail_with(ep, e);
            Ok(())
        });
    }
}
