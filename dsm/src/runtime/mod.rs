//! The DSM runtime of one cluster: [`Dsm`] (join a job, allocate shared arrays, run
//! compute threads, synchronize, finish), the per-thread [`Worker`] handle, and
//! [`LockGuard`].

pub(crate) mod core;
mod lock_cache;
mod reseq;
pub(crate) mod slots;
pub(crate) mod sync;
mod watch;

use self::core::{Core, Resolver, Tuning};
use self::sync::LocalBarrier;
use crate::array::SharedArray;
use crate::error::DsmError;
use crate::stats::{ClusterStats, JobStats, bump};
use crate::transport::{PROTOCOL_QUEUE, Transport, WAKE_QUEUES};
use crate::uffd::{Backing, PAGE_SIZE, Region, RegionConfig};
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

pub use self::core::FAULT_EXIT_CODE;
pub use self::watch::{Stall, StallProbe};

/// How many times a waiting thread polls the protocol queue without yielding its CPU
/// before it polls yielding (about 20 ns a poll when nothing arrives, so ≈ 20 µs): the
/// reply to a request over shared memory usually comes within that, and a yield to
/// another runnable thread costs a context switch each way.
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsmOptions {
    /// Map this cluster's region at this address instead of `dsm.region_base`. Only for
    /// running several clusters of one job in one process (benchmarks, tests): array
    /// addresses then differ between clusters, so never pass addresses between them.
    /// `None` (the default) uses the configuration.
    pub region_base: Option<usize>,
    /// How long a thread waiting for a page, a lock or a barrier polls the protocol
    /// queue (yielding between polls) before it sleeps in the message layer's blocking
    /// receive. Default 1 ms. Not applied while more threads of the cluster wait than
    /// the process has CPUs: they sleep at once.
    pub wait_spin: Duration,
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
}

impl Default for DsmOptions {
    fn default() -> Self {
        DsmOptions {
            region_base: None,
            wait_spin: Duration::from_millis(1),
            server_spin: None,
        }
    }
}

/// A 40-bit fingerprint of everything the clusters of a job must agree on.
fn fingerprint(cfg: &JobConfig) -> u64 {
    let text = format!(
        "{}|{}|{:#x}|{}|{}|{:?}",
        cfg.dsm.protocol.as_str(),
        cfg.dsm.home.as_str(),
        cfg.dsm.region_base,
        cfg.dsm.region_size,
        cfg.clusters.len(),
        cfg.clusters.iter().map(|c| c.threads).collect::<Vec<_>>()
    );
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h & ((1 << 40) - 1)
}

/// Maps the virtual names of a runtime endpoint: name `c < clusters` to cluster `c`'s
/// protocol queue, name `clusters + i` to this cluster's wake-up queue `1 + i`
/// ([`crate::WAKE_QUEUES`]); the source id is this cluster's id.
pub(crate) fn map_destinations(
    table: &TableWriter,
    me: usize,
    clusters: usize,
) -> Result<(), String> {
    let source = SourceId::new(me as u16)
        .ok_or_else(|| format!("cluster id {me} does not fit a source id"))?;
    let names = (0..clusters)
        .map(|c| (c, SiteId(c as u16), PROTOCOL_QUEUE))
        .chain((0..WAKE_QUEUES).map(|i| (clusters + i, SiteId(me as u16), QueueId(1 + i as u16))));
    for (name, site, queue) in names {
        table
            .map(
                VirtualName(name as u16),
                Destination {
                    site,
                    queue,
                    source,
                },
            )
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The coherence configuration of a job.
fn coherence_config(cfg: &JobConfig, me: usize) -> Result<Config, DsmError> {
    let pages = u32::try_from(cfg.dsm.pages()).map_err(|_| DsmError::Config {
        cluster: me,
        reason: format!(
            "dsm.region_size {} is too large: at most {} pages of {PAGE_SIZE} bytes",
            cfg.dsm.region_size,
            multigrain_coherence::MAX_PAGES
        ),
    })?;
    let protocol = match cfg.dsm.protocol {
        CfgProtocol::Hlrc => Protocol::Hlrc,
        CfgProtocol::Sc => Protocol::Sc,
    };
    let mut c = Config::new(protocol, cfg.clusters.len() as u16, pages);
    c.prefetch = cfg.dsm.prefetch;
    c.release_batch = cfg.dsm.release_batch;
    c.barrier_updates = cfg.dsm.barrier_updates.enabled();
    c.home_policy = match cfg.dsm.home {
        HomePolicy::RoundRobin => Homes::RoundRobin,
        HomePolicy::Block => Homes::Block,
        HomePolicy::FirstTouch => Homes::FirstTouch,
    };
    Ok(c)
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
    peer_timeout: Duration,
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
    /// Joins the job `cfg` as cluster `transport.cluster`: maps the region
    /// (`dsm.region_base`, `dsm.region_size`) and registers it with userfaultfd, creates
    /// the coherence machine (`dsm.protocol`, `dsm.home`), checks with every other
    /// cluster that they run the same configuration (within `job.startup_timeout_ms`),
    /// and starts the protocol thread. Every cluster of the job must call it.
    ///
    /// # Errors
    /// [`DsmError::Config`] when the transport and the configuration disagree or a route
    /// is missing, [`DsmError::Region`] when the region cannot be created (address taken,
    /// userfaultfd unavailable), [`DsmError::ConfigMismatch`],
    /// [`DsmError::StartupTimeout`], [`DsmError::PeerFailed`].
    pub fn join(transport: Transport, cfg: &JobConfig) -> Result<Dsm, DsmError> {
        Dsm::join_with(transport, cfg, DsmOptions::default())
    }

    /// [`Dsm::join`] with non-default [`DsmOptions`].
    ///
    /// # Errors
    /// As [`Dsm::join`].
    pub fn join_with(
        transport: Transport,
        cfg: &JobConfig,
        options: DsmOptions,
    ) -> Result<Dsm, DsmError> {
        let Transport {
            site,
            cluster: me,
            clusters,
            liveness,
        } = transport;
        let config_err = |reason: String| DsmError::Config {
            cluster: me,
            reason,
        };
        if clusters != cfg.clusters.len() || me >= clusters {
            return Err(config_err(format!(
                "the transport is for cluster {me} of {clusters}, the configuration has {} clusters",
                cfg.clusters.len()
            )));
        }
        if site.id() != SiteId(me as u16) {
            return Err(config_err(format!(
                "the transport's site is {}, expected site {me}",
                site.id()
            )));
        }
        if let Some(c) = (0..clusters).find(|&c| !site.reaches(SiteId(c as u16))) {
            return Err(config_err(format!(
                "the site has no route to cluster {c}: attach or connect every cluster before joining"
            )));
        }
        let machine_cfg = coherence_config(cfg, me)?;
        let machine = Machine::new(ClusterId::new(me as u16).expect("checked"), machine_cfg)
            .map_err(|source| DsmError::Protocol {
                cluster: me,
                source,
            })?;
        let (endpoint, table) =
            site.create_endpoint(&[PROTOCOL_QUEUE])
                .map_err(|source| DsmError::Site {
                    cluster: me,
                    source,
                })?;
        map_destinations(&table, me, clusters).map_err(config_err)?;
        let peer_timeout = cfg.job.peer_timeout();
        let tuning = Tuning {
            busy_polls: BUSY_POLLS,
            handover: HANDOVER,
            spin: options.wait_spin,
            slice: Duration::from_millis(2),
            liveness_period: (peer_timeout / 8)
                .clamp(Duration::from_millis(1), Duration::from_millis(20)),
            send_slice: (peer_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        };
        let threads: Vec<usize> = cfg.clusters.iter().map(|c| c.threads).collect();
        let core = Arc::new(Core::new(
            me, &threads, site, endpoint, machine, liveness, tuning,
        ));
        let base = match options.region_base {
            Some(b) => b,
            None => usize::try_from(cfg.dsm.region_base).map_err(|_| {
                config_err(format!(
                    "dsm.region_base {:#x} does not fit",
                    cfg.dsm.region_base
                ))
            })?,
        };
        let len = usize::try_from(cfg.dsm.region_size)
            .map_err(|_| config_err("dsm.region_size does not fit".into()))?;
        let region_cfg = RegionConfig::new(base, len).with_backing(Backing::SharedMemory);
        let region = Region::new(
            region_cfg,
            Arc::new(Resolver {
                core: Arc::clone(&core),
            }),
        )
        .map_err(|source| DsmError::Region {
            cluster: me,
            source,
        })?;
        let mut dsm = Dsm {
            inner: Arc::new(Inner {
                core,
                region: Arc::new(region),
                running: AtomicBool::new(false),
                threads,
                options,
                peer_timeout,
            }),
            server: None,
            next_offset: 0,
            next_lock: 0,
            live: false,
        };
        dsm.inner
            .hello(fingerprint(cfg), cfg.job.startup_timeout())?;
        let core = Arc::clone(&dsm.inner.core);
        let region = Arc::clone(&dsm.inner.region);
        let over_udp = (0..clusters).any(|c| cfg.link_between(me, c) == Link::Udp);
        let spin = options.server_spin.unwrap_or(if over_udp {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        });
        dsm.live = true;
        let priority = cfg.dsm.protocol_priority;
        // The `static` INI policy maps compute thread i to INI i mod K; the protocol
        // thread counts as the thread after the cluster's compute threads.
        let protocol_thread_index = dsm.inner.threads[me];
        let (started, start) = std::sync::mpsc::channel();
        dsm.server = Some(
            std::thread::Builder::new()
                .name(format!("dsm-protocol-{me}"))
                .spawn(move || {
                    let realtime = match priority {
                        ProtocolPriority::Normal => Ok(false),
                        ProtocolPriority::Auto | ProtocolPriority::Realtime => {
                            multigrain_messaging::sched::make_realtime().map(|()| true)
                        }
                    };
                    let ok = realtime.is_ok() || priority != ProtocolPriority::Realtime;
                    let realtime = realtime.map_err(|e| e.to_string());
                    let _ = started.send(realtime.clone());
                    if !ok {
                        return;
                    }
                    let realtime = realtime.unwrap_or(false);
                    core.realtime.store(realtime, Ordering::Relaxed);
                    // A real-time thread never polls: it would keep the compute
                    // threads off its CPU.
                    core.serve(
                        &region,
                        if realtime { Duration::ZERO } else { spin },
                        protocol_thread_index,
                    )
                })
                .map_err(|source| DsmError::Spawn {
                    cluster: me,
                    what: "the protocol thread",
                    source,
                })?,
        );
        match start.recv() {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                tracing::debug!("cluster {me}: the protocol thread runs at normal priority");
            }
            Ok(Err(e)) if priority == ProtocolPriority::Realtime => {
                return Err(config_err(format!(
                    "dsm.protocol_priority = \"realtime\": the protocol thread cannot run \
                     real-time ({e}); run as root, give the executable CAP_SYS_NICE, raise \
                     RLIMIT_RTPRIO (`ulimit -r 1`), or set dsm.protocol_priority = \"auto\""
                )));
            }
            Ok(Err(e)) => tracing::info!(
                "cluster {me}: the protocol thread runs at normal priority ({e}: real-time \
                 priority needs root, CAP_SYS_NICE or RLIMIT_RTPRIO ≥ 1); requests that \
                 arrive while every thread computes wait for the scheduler"
            ),
            Err(_) => {
                return Err(config_err("the protocol thread ended at its start".into()));
            }
        }
        Ok(dsm)
    }

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
    /// [`SharedArray`] for why).
    ///
    /// # Errors
    /// [`DsmError::OutOfSpace`] when the region is full, [`DsmError::Config`] for an
    /// element size that is not a positive multiple of 8.
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
    /// Start-up: tells every other cluster our fingerprint and waits for theirs.
    fn hello(&self, fp: u64, timeout: Duration) -> Result<(), DsmError> {
        let core = &self.core;
        let me = core.me;
        core.hellos.lock()[me] = Some(fp);
        let deadline = Instant::now() + timeout;
        core.with_thread(|_, ep| {
            let hello = Express::new(RuntimeOp::Hello.handler(), fp).expect("40-bit fingerprint");
            let mut early = Vec::new();
            let before = ep.network_sent();
            for c in (0..core.clusters).filter(|&c| c != me) {
                ep.send_express_blocking(VirtualName(c as u16), hello, Some(timeout), |m| {
                    early.push(m)
                })
                .map_err(|e| DsmError::Send {
                    cluster: me,
                    to: c,
                    what: "Hello",
                    reason: e.to_string(),
                })?;
            }
            core.note_sent(ep, before);
            for m in early {
                core.dispatch(&self.region, ep, m)?;
            }
            loop {
                let missing: Vec<usize> = {
                    let h = core.hellos.lock();
                    if let Some((peer, theirs)) = h
                        .iter()
                        .enumerate()
                        .find_map(|(c, f)| f.filter(|&f| f != fp).map(|f| (c, f)))
                    {
                        return Err(DsmError::ConfigMismatch {
                            cluster: me,
                            peer,
                            ours: fp,
                            theirs,
                        });
                    }
                    (0..core.clusters).filter(|&c| h[c].is_none()).collect()
                };
                if missing.is_empty() {
                    return Ok(());
                }
                core.check_liveness(&self.region, ep, &|| "joining the job".into())?;
                if Instant::now() >= deadline {
                    return Err(DsmError::StartupTimeout {
                        cluster: me,
                        missing,
                        timeout_ms: timeout.as_millis() as u64,
                    });
                }
                if let Some(m) = ep.recv_timeout(Duration::from_millis(2)) {
                    core.dispatch(&self.region, ep, m)?;
                }
            }
        })
    }

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

    /// This cluster's arrival at the global barrier.
    fn global_barrier(&self) -> Result<(), DsmError> {
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

    fn lock(&self, id: u32) -> Result<LockGuard<'_>, DsmError> {
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
        let t0 = Instant::now();
        self.core.sync(
            &self.region,
            |token| Event::Acquire { lock, token },
            &|| format!("acquiring lock {id}"),
        )?;
        let c = &self.core.counters;
        bump(&c.lock_acquires, 1);
        bump(&c.lock_wait_ns, t0.elapsed().as_nanos() as u64);
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
        let t0 = Instant::now();
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
    inner: &'a Inner,
    local: usize,
    barrier: &'a LocalBarrier,
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
        let t0 = Instant::now();
        let r = self
            .barrier
            .wait(&self.inner.core, self.inner.options.wait_spin, || {
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
