//! Statistics of a DSM job: per cluster ([`ClusterStats`]) and summed over the job
//! ([`JobStats`]), serializable with serde.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::AddAssign;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The coherence machine's counters, by name (serialized with the cluster's other
/// statistics).
pub type ProtocolStats = multigrain_coherence::Stats;

/// The message layer's counters for one cluster (from
/// [`multigrain_messaging::MessageStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerStats {
    /// Express messages sent.
    pub express_sent: u64,
    /// Tag-On messages sent.
    pub tag_on_sent: u64,
    /// Bulk messages sent.
    pub bulk_sent: u64,
    /// Bytes sent (payloads).
    pub bytes_sent: u64,
    /// Express messages received.
    pub express_received: u64,
    /// Tag-On messages received.
    pub tag_on_received: u64,
    /// Bulk messages received.
    pub bulk_received: u64,
    /// Messages sent through this process's own segment.
    pub substrate_local: u64,
    /// Messages sent through a same-machine peer's shared segment.
    pub substrate_shm: u64,
    /// Messages handed to an INI for the network (between clusters over UDP; each pays
    /// the emulated *o_s*, paper 001 §3.2). Absent from older reports (read as 0).
    #[serde(default)]
    pub substrate_network: u64,
    /// Sends that found the receive queue full.
    pub queue_full: u64,
    /// Buffer allocations that found the pool empty.
    pub pool_exhausted: u64,
    /// Slots of the cluster's buffer pool used at least once: the most it had in flight
    /// at once (of [`crate::transport::POOL_SLOTS`]). Absent from older reports (read as 0).
    #[serde(default)]
    pub pool_used_slots: u64,
    /// Receive polls of the cluster's threads that also read the sockets of its inline
    /// INIs (paper 000 §3.4's network polls: one poll in `ini.poll_interval_min` to
    /// `ini.poll_interval_max` of a busy loop, every pass of a blocking receive's spin).
    /// 0 without INIs. Absent from older reports (read as 0).
    #[serde(default)]
    pub network_polls: u64,
}

impl From<multigrain_messaging::MessageStats> for LayerStats {
    fn from(s: multigrain_messaging::MessageStats) -> Self {
        LayerStats {
            express_sent: s.sent.express,
            tag_on_sent: s.sent.tag_on,
            bulk_sent: s.sent.bulk,
            bytes_sent: s.sent.bytes,
            express_received: s.received.express,
            tag_on_received: s.received.tag_on,
            bulk_received: s.received.bulk,
            substrate_local: s.substrate.local,
            substrate_shm: s.substrate.shm,
            substrate_network: s.substrate.network,
            queue_full: s.full,
            pool_exhausted: s.pool_exhausted,
            pool_used_slots: s.pool_used_slots,
            network_polls: s.network_polls,
        }
    }
}

impl AddAssign<&LayerStats> for LayerStats {
    fn add_assign(&mut self, o: &LayerStats) {
        self.express_sent += o.express_sent;
        self.tag_on_sent += o.tag_on_sent;
        self.bulk_sent += o.bulk_sent;
        self.bytes_sent += o.bytes_sent;
        self.express_received += o.express_received;
        self.tag_on_received += o.tag_on_received;
        self.bulk_received += o.bulk_received;
        self.substrate_local += o.substrate_local;
        self.substrate_shm += o.substrate_shm;
        self.substrate_network += o.substrate_network;
        self.queue_full += o.queue_full;
        self.pool_exhausted += o.pool_exhausted;
        self.pool_used_slots += o.pool_used_slots;
        self.network_polls += o.network_polls;
    }
}

/// Where a cluster's threads spent their time in the runtime, in nanoseconds summed over
/// threads (wall-clock time; the phases overlap where one contains another, as noted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseTimes {
    /// In `lock` calls: waiting for grants, taking their write notices.
    pub lock_acquire_ns: u64,
    /// Of `lock_acquire_ns`, in acquires that took [`LONG_LOCK_WAIT`] or longer: time
    /// slices, not round trips (see [`LONG_LOCK_WAIT`]).
    pub lock_long_wait_ns: u64,
    /// Acquires that took [`LONG_LOCK_WAIT`] or longer.
    pub lock_long_waits: u64,
    /// In lock releases: flushing the pages written under the lock and sending the
    /// lock (with its diffs) on.
    pub lock_release_ns: u64,
    /// In page faults.
    pub fault_ns: u64,
    /// Of `fault_ns`, in faults that waited for another cluster.
    pub remote_fault_ns: u64,
    /// In barriers (threads of the cluster waiting for each other included).
    pub barrier_ns: u64,
    /// Of `barrier_ns`, the cluster's global part (one thread per barrier): from its
    /// arrival until the departure.
    pub barrier_global_ns: u64,
    /// Of `barrier_global_ns`, flushing the open pages and waiting until the homes
    /// acknowledged this cluster's diffs, before the arrival could be sent.
    pub barrier_flush_ns: u64,
    /// Handling received protocol messages (by any thread, the protocol thread
    /// included; overlaps the phases above when a waiting thread handles them).
    pub dispatch_ns: u64,
    /// Protocol messages handled.
    pub dispatched: u64,
    /// Times a waiting thread went to sleep (its wake-up needs a message or a doorbell).
    pub sleeps: u64,
    /// Time waiting threads spent asleep.
    pub sleep_ns: u64,
}

impl AddAssign<&PhaseTimes> for PhaseTimes {
    fn add_assign(&mut self, o: &PhaseTimes) {
        self.lock_acquire_ns += o.lock_acquire_ns;
        self.lock_long_wait_ns += o.lock_long_wait_ns;
        self.lock_long_waits += o.lock_long_waits;
        self.lock_release_ns += o.lock_release_ns;
        self.fault_ns += o.fault_ns;
        self.remote_fault_ns += o.remote_fault_ns;
        self.barrier_ns += o.barrier_ns;
        self.barrier_global_ns += o.barrier_global_ns;
        self.barrier_flush_ns += o.barrier_flush_ns;
        self.dispatch_ns += o.dispatch_ns;
        self.dispatched += o.dispatched;
        self.sleeps += o.sleeps;
        self.sleep_ns += o.sleep_ns;
    }
}

/// The kernel's boot id (a UUID, new at every boot of a machine); empty if it cannot be
/// read.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The CPUs this process may run on, as the kernel lists them (`Cpus_allowed_list` of
/// `/proc/self/status`, e.g. `0-3,8`); empty if it cannot be read.
pub(crate) fn allowed_cpu_list() -> String {
    cpu_list_of("/proc/self/status")
}

/// The calling thread's `Cpus_allowed_list` (as [`allowed_cpu_list`], for one thread).
pub(crate) fn thread_cpu_list() -> String {
    cpu_list_of("/proc/thread-self/status")
}

fn cpu_list_of(status: &str) -> String {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|l| l.trim().to_owned())
        })
        .unwrap_or_default()
}

/// Statistics of one cluster (or, in [`JobStats::total`], summed over the job). Times
/// are nanoseconds of wall-clock time summed over threads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStats {
    /// The cluster; `None` in a job total (absent from its JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<usize>,
    /// The CPUs this cluster's process may run on when its statistics were taken, as
    /// `/proc/self/status`'s `Cpus_allowed_list` writes them (`0-3,8`): its share where
    /// the launcher bound it (`launch.cpu_bind`). Empty in a job total, or where the
    /// kernel does not say (absent from the JSON then).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cpus: String,
    /// The CPUs this cluster's protocol thread may run on, in the same format, where it
    /// was bound apart from the process (`launch.cpu_bind` = `apart`, or `auto` with a
    /// CPU per compute thread: the other clusters' shares). Empty otherwise, and in a
    /// job total (absent from the JSON then).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol_cpus: String,
    /// The machine this cluster ran on, as the kernel's boot id
    /// (`/proc/sys/kernel/random/boot_id`): clusters with the same one shared that
    /// machine's CPUs (network namespaces and containers on one kernel included).
    /// Empty in a job total, or where the kernel does not say (absent from the JSON).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine: String,
    /// Read faults taken by this cluster's threads.
    pub read_faults: u64,
    /// Write faults taken by this cluster's threads (write to a missing or read-only page).
    pub write_faults: u64,
    /// Faults that had to wait for another cluster (a reply, an acknowledgement).
    pub remote_faults: u64,
    /// Time threads spent inside faults.
    pub fault_ns: u64,
    /// Of `fault_ns`, time in faults that waited for another cluster.
    pub remote_fault_ns: u64,
    /// Pages fetched from their home (hlrc `GetPage`, sc read/write requests).
    pub remote_fetches: u64,
    /// Pages installed (`UFFDIO_COPY` / zero-fill, or `UFFDIO_CONTINUE` of a page the
    /// region's memfd holds).
    pub pages_installed: u64,
    /// Present pages mapped again after the kernel dropped their mapping (reclaim wrote
    /// them to swap; a region with minor faults reports their next access as a fault:
    /// [`RegionOps::remap`](crate::uffd::RegionOps::remap)). 0 on a machine without
    /// memory pressure.
    #[serde(default)]
    pub pages_remapped: u64,
    /// Of `pages_installed`, pages mapped from memory already in place (minor faults:
    /// written through the runtime view and mapped with `UFFDIO_CONTINUE`, see
    /// [`RegionOps::installs_in_place`](crate::uffd::RegionOps::installs_in_place)); 0
    /// where the kernel offers no minor faults (Linux < 6.4).
    #[serde(default)]
    pub pages_installed_in_place: u64,
    /// Twins made.
    pub twins: u64,
    /// Open pages that a flush skipped without reading them, because no application
    /// store had marked them since the previous flush (software write detection, see
    /// [`WriteMarks`](crate::uffd::WriteMarks)); the other open pages a flush diffs are
    /// the protocol's `pages_kept_open` + `pages_closed` minus these.
    #[serde(default)]
    pub flush_pages_unmarked: u64,
    /// Open pages that a flush read only in part: the few lines that application
    /// stores had marked since the previous flush (at most
    /// 32 of a page's 64), compared and diffed line by line instead of
    /// the whole page.
    #[serde(default)]
    pub flush_pages_by_lines: u64,
    /// Diffs sent to homes.
    pub diffs_sent: u64,
    /// Bytes of encoded diffs sent to homes.
    pub diff_bytes_sent: u64,
    /// Diffs applied at this cluster as home.
    pub diffs_applied: u64,
    /// Bytes of diffs applied as home.
    pub diff_bytes_applied: u64,
    /// Pages invalidated.
    pub invalidations: u64,
    /// Invalidation system calls (one per run of consecutive pages).
    pub invalidate_calls: u64,
    /// `lock` calls by this cluster's threads.
    pub lock_acquires: u64,
    /// Of those, acquires served inside the cluster without a message: the cluster
    /// had the lock cached from an earlier use, or a thread of the cluster passed it
    /// on (the coherence machine's `lock_local_acquires`).
    pub lock_local_handoffs: u64,
    /// Of those, acquires taken from the runtime's lock cache, without the coherence
    /// machine: a local thread had released the lock and nobody else wanted it (see the
    /// runtime's `lock_cache` module). Not timed in
    /// `lock_wait_ns` (one atomic operation).
    #[serde(default)]
    pub lock_runtime_acquires: u64,
    /// Time threads spent waiting in `lock`.
    pub lock_wait_ns: u64,
    /// The locks this cluster's threads waited on longest, by lock id: the acquires
    /// that took longer than [`SLOW_LOCK_WAIT`] and their total time; the
    /// [`SLOW_LOCKS_KEPT`] locks with the longest total per cluster (summed by lock in a
    /// job total). Empty in older reports.
    #[serde(default)]
    pub slow_lock_waits: BTreeMap<u32, LockWaits>,
    /// Every lock's acquires that took longer than [`SLOW_LOCK_WAIT`], summed (those
    /// of [`ClusterStats::slow_lock_waits`] and of the locks left out of it).
    #[serde(default)]
    pub slow_lock_waits_all: LockWaits,
    /// Barriers passed by this cluster.
    pub barriers: u64,
    /// Time threads spent waiting in barriers.
    pub barrier_wait_ns: u64,
    /// Clusters whose protocol thread ran at real-time priority (0 or 1 for a
    /// cluster; see `dsm.protocol_priority`).
    #[serde(default)]
    pub realtime_protocol_threads: u64,
    /// Where the threads' time went (see [`PhaseTimes`]).
    #[serde(default)]
    pub time: PhaseTimes,
    /// The runtime's handling time by kind of event and action, where the job's
    /// configuration set `dsm.event_profile` (absent from the JSON otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_profile: Option<crate::EventProfile>,
    /// Messages sent, by kind (coherence opcode names and runtime messages).
    pub messages_sent: BTreeMap<String, u64>,
    /// Messages received, by kind.
    pub messages_received: BTreeMap<String, u64>,
    /// Bytes of bulk bodies sent, by message kind.
    #[serde(default)]
    pub bulk_bytes_sent: BTreeMap<String, u64>,
    /// Bundles sent: message-layer bulk messages each carrying several bulk coherence
    /// messages to one cluster (those messages are counted in `messages_sent` by their
    /// own kind, not as bundles).
    #[serde(default)]
    pub bundles_sent: u64,
    /// Coherence messages sent inside bundles.
    #[serde(default)]
    pub bundled_messages_sent: u64,
    /// Of `bundled_messages_sent`, Express messages (recalls, acknowledgements) that
    /// followed bulk messages of the same event to the same cluster and went as the
    /// bundle's last part instead of a message-layer Express message of their own.
    #[serde(default)]
    pub express_bundled_sent: u64,
    /// Bundles received.
    #[serde(default)]
    pub bundles_received: u64,
    /// Coherence messages received inside bundles.
    #[serde(default)]
    pub bundled_messages_received: u64,
    /// Pieces sent of bundles longer than one message-layer bulk message (each piece
    /// one numbered bundle; the bundle itself counts once in `bundles_sent`).
    #[serde(default)]
    pub bundle_pieces_sent: u64,
    /// Pieces received of bundles sent in pieces (the bundle, once whole, counts once in
    /// `bundles_received`).
    #[serde(default)]
    pub bundle_pieces_received: u64,
    /// The message layer's own counters.
    pub layer: LayerStats,
    /// Messages each compute thread handed to the message layer for the network (its
    /// share of `layer.substrate_network`: the messages that pay the emulated send
    /// overhead *o*, counted by paper 001 §5.1's *m*), one entry per compute thread of
    /// the cluster, indexed by its index in the cluster ([`crate::Worker::local_id`];
    /// entry *i* sums thread *i* of every parallel section). A message counts for the
    /// thread that sent it, whoever's request it serves: a compute thread waiting in the
    /// runtime also answers other clusters' requests. Counted as each send returns, and
    /// read under the coherence machine's lock, where every event's sends are made, so a
    /// snapshot taken while the cluster runs lags `layer.substrate_network` by at most the
    /// sends in flight outside that lock (start-up, statistics); in the statistics of
    /// [`crate::Dsm::finish`], `messages_sent_by_thread` summed, plus
    /// `messages_sent_by_protocol_thread` and `messages_sent_by_other_threads`, is
    /// `layer.substrate_network`. In a job total ([`JobStats::total`]) the clusters'
    /// vectors concatenated in cluster order, so that entry *k* is the job's thread *k*
    /// ([`crate::Worker::thread_id`]). Empty in older reports.
    #[serde(default)]
    pub messages_sent_by_thread: Vec<u64>,
    /// Messages the cluster's protocol thread handed to the message layer for the network
    /// while it served the protocol queue (its share of `layer.substrate_network`). Summed
    /// in a job total.
    #[serde(default)]
    pub messages_sent_by_protocol_thread: u64,
    /// Messages handed to the message layer for the network by threads that are neither
    /// compute threads nor the protocol thread: the thread that calls [`crate::Dsm::join`],
    /// [`crate::Dsm::run`] and [`crate::Dsm::finish`] (start-up, the barrier that ends each
    /// parallel section, initialization between sections, the statistics at the end), or
    /// any thread using the runtime outside a parallel section. Summed in a job total.
    #[serde(default)]
    pub messages_sent_by_other_threads: u64,
    /// The coherence machine's counters.
    pub protocol: ProtocolStats,
}

/// Adds `o` into a job total: every count is summed, except
/// `messages_sent_by_thread`, whose entries are appended (one per compute thread of the
/// job, in the order the clusters are added), and `cpus` and `machine`, which stay the
/// total's own.
impl AddAssign<&ClusterStats> for ClusterStats {
    fn add_assign(&mut self, o: &ClusterStats) {
        self.read_faults += o.read_faults;
        self.write_faults += o.write_faults;
        self.remote_faults += o.remote_faults;
        self.fault_ns += o.fault_ns;
        self.remote_fault_ns += o.remote_fault_ns;
        self.remote_fetches += o.remote_fetches;
        self.pages_installed += o.pages_installed;
        self.pages_remapped += o.pages_remapped;
        self.pages_installed_in_place += o.pages_installed_in_place;
        self.twins += o.twins;
        self.flush_pages_unmarked += o.flush_pages_unmarked;
        self.flush_pages_by_lines += o.flush_pages_by_lines;
        self.diffs_sent += o.diffs_sent;
        self.diff_bytes_sent += o.diff_bytes_sent;
        self.diffs_applied += o.diffs_applied;
        self.diff_bytes_applied += o.diff_bytes_applied;
        self.invalidations += o.invalidations;
        self.invalidate_calls += o.invalidate_calls;
        self.lock_acquires += o.lock_acquires;
        self.lock_local_handoffs += o.lock_local_handoffs;
        self.lock_runtime_acquires += o.lock_runtime_acquires;
        self.lock_wait_ns += o.lock_wait_ns;
        for (&lock, w) in &o.slow_lock_waits {
            *self.slow_lock_waits.entry(lock).or_default() += w;
        }
        self.slow_lock_waits_all += &o.slow_lock_waits_all;
        self.barriers += o.barriers;
        self.barrier_wait_ns += o.barrier_wait_ns;
        self.realtime_protocol_threads += o.realtime_protocol_threads;
        self.time += &o.time;
        if let Some(p) = &o.event_profile {
            *self.event_profile.get_or_insert_with(Default::default) += p;
        }
        for (k, v) in &o.messages_sent {
            *self.messages_sent.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.messages_received {
            *self.messages_received.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.bulk_bytes_sent {
            *self.bulk_bytes_sent.entry(k.clone()).or_default() += v;
        }
        self.bundles_sent += o.bundles_sent;
        self.bundled_messages_sent += o.bundled_messages_sent;
        self.express_bundled_sent += o.express_bundled_sent;
        self.bundles_received += o.bundles_received;
        self.bundled_messages_received += o.bundled_messages_received;
        self.bundle_pieces_sent += o.bundle_pieces_sent;
        self.bundle_pieces_received += o.bundle_pieces_received;
        self.layer += &o.layer;
        self.messages_sent_by_thread
            .extend_from_slice(&o.messages_sent_by_thread);
        self.messages_sent_by_protocol_thread += o.messages_sent_by_protocol_thread;
        self.messages_sent_by_other_threads += o.messages_sent_by_other_threads;
        self.protocol += &o.protocol;
    }
}

/// An acquire that takes longer than this counts in [`ClusterStats::slow_lock_waits`]:
/// a lock passed between clusters over shared memory takes a few µs, through INIs over
/// UDP some tens; waits well past that are a lock held elsewhere or a holder that does
/// not answer soon (computing, descheduled).
pub const SLOW_LOCK_WAIT: Duration = Duration::from_micros(20);

/// An acquire that takes this long or longer counts in [`PhaseTimes::lock_long_waits`]:
/// 25 round trips through INIs over UDP, so not the protocol's messages but a thread
/// that had to wait for a CPU — its own, or the one of the cluster that holds the lock
/// or must answer. With more compute threads than CPUs in a cluster, a thread that
/// waits shares its CPU with one that computes and gets it back when that one blocks
/// or its time slice ends (the scheduler's tick, 4 ms at `CONFIG_HZ=250`): measured on
/// Water 512 × 50, 2 clusters × 2 threads over UDP on 2 vCPUs (one CPU per cluster),
/// 889 of 18,724 acquires over 20 µs took 0.5 ms or more and made up half of the
/// 2.26 s of lock waiting (issue 10 log, thirty-first session).
pub const LONG_LOCK_WAIT: Duration = Duration::from_micros(500);

/// Locks per cluster kept in [`ClusterStats::slow_lock_waits`]: those with the longest
/// total wait.
pub const SLOW_LOCKS_KEPT: usize = 8;

/// One lock's slow acquires at a cluster (see [`ClusterStats::slow_lock_waits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockWaits {
    /// Acquires that took longer than [`SLOW_LOCK_WAIT`].
    pub acquires: u64,
    /// Their total time, ns.
    pub wait_ns: u64,
}

impl AddAssign<&LockWaits> for LockWaits {
    fn add_assign(&mut self, o: &LockWaits) {
        self.acquires += o.acquires;
        self.wait_ns += o.wait_ns;
    }
}

/// Statistics of a whole job, gathered by [`crate::Dsm::finish`] from every cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStats {
    /// One entry per cluster, by cluster id.
    pub clusters: Vec<ClusterStats>,
    /// The sum over all clusters (`cluster` is `None`).
    pub total: ClusterStats,
}

impl JobStats {
    /// Sums `clusters` (sorted by cluster id) into a job total.
    pub fn from_clusters(mut clusters: Vec<ClusterStats>) -> Self {
        clusters.sort_by_key(|c| c.cluster);
        let mut total = ClusterStats::default();
        for c in &clusters {
            total += c;
        }
        JobStats { clusters, total }
    }
}

/// The runtime's own counters of one cluster, updated by any thread.
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) read_faults: AtomicU64,
    pub(crate) write_faults: AtomicU64,
    pub(crate) remote_faults: AtomicU64,
    pub(crate) fault_ns: AtomicU64,
    pub(crate) remote_fault_ns: AtomicU64,
    pub(crate) pages_installed: AtomicU64,
    pub(crate) pages_remapped: AtomicU64,
    pub(crate) pages_installed_in_place: AtomicU64,
    pub(crate) flush_unmarked: AtomicU64,
    pub(crate) flush_by_lines: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) invalidate_calls: AtomicU64,
    pub(crate) lock_acquires: AtomicU64,
    pub(crate) lock_wait_ns: AtomicU64,
    pub(crate) lock_long_wait_ns: AtomicU64,
    pub(crate) lock_long_waits: AtomicU64,
    pub(crate) barriers: AtomicU64,
    pub(crate) barrier_wait_ns: AtomicU64,
    pub(crate) barrier_global_ns: AtomicU64,
    pub(crate) barrier_flush_ns: AtomicU64,
    pub(crate) release_ns: AtomicU64,
    pub(crate) dispatched: AtomicU64,
    pub(crate) dispatch_ns: AtomicU64,
    pub(crate) sleeps: AtomicU64,
    pub(crate) sleep_ns: AtomicU64,
    pub(crate) sent: Box<[AtomicU64; 256]>,
    pub(crate) sent_bytes: Box<[AtomicU64; 256]>,
    pub(crate) received: Box<[AtomicU64; 256]>,
    pub(crate) bundles_sent: AtomicU64,
    pub(crate) bundled_sent: AtomicU64,
    pub(crate) express_bundled_sent: AtomicU64,
    pub(crate) bundles_received: AtomicU64,
    pub(crate) bundled_received: AtomicU64,
    pub(crate) bundle_pieces_sent: AtomicU64,
    pub(crate) bundle_pieces_received: AtomicU64,
    /// Slow acquires by lock id (see [`ClusterStats::slow_lock_waits`]): at most one
    /// entry per lock the cluster's threads waited on.
    pub(crate) slow_locks: Mutex<BTreeMap<u32, LockWaits>>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            read_faults: AtomicU64::new(0),
            write_faults: AtomicU64::new(0),
            remote_faults: AtomicU64::new(0),
            fault_ns: AtomicU64::new(0),
            remote_fault_ns: AtomicU64::new(0),
            pages_installed: AtomicU64::new(0),
            pages_remapped: AtomicU64::new(0),
            pages_installed_in_place: AtomicU64::new(0),
            flush_unmarked: AtomicU64::new(0),
            flush_by_lines: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            invalidate_calls: AtomicU64::new(0),
            lock_acquires: AtomicU64::new(0),
            lock_wait_ns: AtomicU64::new(0),
            lock_long_wait_ns: AtomicU64::new(0),
            lock_long_waits: AtomicU64::new(0),
            barriers: AtomicU64::new(0),
            barrier_wait_ns: AtomicU64::new(0),
            barrier_global_ns: AtomicU64::new(0),
            barrier_flush_ns: AtomicU64::new(0),
            release_ns: AtomicU64::new(0),
            dispatched: AtomicU64::new(0),
            dispatch_ns: AtomicU64::new(0),
            sleeps: AtomicU64::new(0),
            sleep_ns: AtomicU64::new(0),
            sent: Box::new([const { AtomicU64::new(0) }; 256]),
            sent_bytes: Box::new([const { AtomicU64::new(0) }; 256]),
            received: Box::new([const { AtomicU64::new(0) }; 256]),
            bundles_sent: AtomicU64::new(0),
            bundled_sent: AtomicU64::new(0),
            express_bundled_sent: AtomicU64::new(0),
            bundles_received: AtomicU64::new(0),
            bundled_received: AtomicU64::new(0),
            bundle_pieces_sent: AtomicU64::new(0),
            bundle_pieces_received: AtomicU64::new(0),
            slow_locks: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Counters {
    /// Notes an acquire of `lock` that took `wait`, if longer than [`SLOW_LOCK_WAIT`]
    /// (and among the long ones if [`LONG_LOCK_WAIT`] or longer).
    pub(crate) fn note_lock_wait(&self, lock: u32, wait: Duration) {
        if wait <= SLOW_LOCK_WAIT {
            return;
        }
        if wait >= LONG_LOCK_WAIT {
            bump(&self.lock_long_waits, 1);
            bump(&self.lock_long_wait_ns, wait.as_nanos() as u64);
        }
        let mut slow = self.slow_locks.lock().unwrap_or_else(|e| e.into_inner());
        let w = slow.entry(lock).or_default();
        w.acquires += 1;
        w.wait_ns += wait.as_nanos() as u64;
    }

    /// The [`SLOW_LOCKS_KEPT`] locks with the longest total slow wait, and the sum over
    /// every lock.
    fn slowest_locks(&self) -> (BTreeMap<u32, LockWaits>, LockWaits) {
        let slow = self.slow_locks.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = LockWaits::default();
        for w in slow.values() {
            all += w;
        }
        let mut v: Vec<(u32, LockWaits)> = slow.iter().map(|(&l, &w)| (l, w)).collect();
        v.sort_by_key(|&(l, w)| (std::cmp::Reverse(w.wait_ns), l));
        v.truncate(SLOW_LOCKS_KEPT);
        (v.into_iter().collect(), all)
    }
}

pub(crate) fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

fn by_kind(table: &[AtomicU64; 256]) -> BTreeMap<String, u64> {
    table
        .iter()
        .enumerate()
        .filter_map(|(h, c)| {
            let n = c.load(Ordering::Relaxed);
            (n > 0).then(|| (crate::wire::op_name(h as u8).to_string(), n))
        })
        .collect()
}

impl Counters {
    /// A snapshot, completed with the machine's and the message layer's counters.
    pub(crate) fn snapshot(
        &self,
        cluster: usize,
        protocol: ProtocolStats,
        layer: LayerStats,
    ) -> ClusterStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (slow_lock_waits, slow_lock_waits_all) = self.slowest_locks();
        ClusterStats {
            cluster: Some(cluster),
            cpus: allowed_cpu_list(),
            protocol_cpus: String::new(),
            machine: boot_id(),
            read_faults: g(&self.read_faults),
            write_faults: g(&self.write_faults),
            remote_faults: g(&self.remote_faults),
            fault_ns: g(&self.fault_ns),
            remote_fault_ns: g(&self.remote_fault_ns),
            remote_fetches: protocol.remote_fetches,
            realtime_protocol_threads: 0,
            event_profile: None,
            pages_installed: g(&self.pages_installed),
            pages_remapped: g(&self.pages_remapped),
            pages_installed_in_place: g(&self.pages_installed_in_place),
            twins: protocol.twins,
            flush_pages_unmarked: g(&self.flush_unmarked),
            flush_pages_by_lines: g(&self.flush_by_lines),
            diffs_sent: protocol.diffs_sent,
            diff_bytes_sent: protocol.diff_bytes_sent,
            diffs_applied: protocol.diffs_applied,
            diff_bytes_applied: protocol.diff_bytes_applied,
            invalidations: g(&self.invalidations),
            invalidate_calls: g(&self.invalidate_calls),
            lock_acquires: g(&self.lock_acquires),
            lock_local_handoffs: protocol.lock_local_acquires,
            lock_runtime_acquires: 0,
            lock_wait_ns: g(&self.lock_wait_ns),
            slow_lock_waits,
            slow_lock_waits_all,
            barriers: g(&self.barriers),
            barrier_wait_ns: g(&self.barrier_wait_ns),
            time: PhaseTimes {
                lock_acquire_ns: g(&self.lock_wait_ns),
                lock_long_wait_ns: g(&self.lock_long_wait_ns),
                lock_long_waits: g(&self.lock_long_waits),
                lock_release_ns: g(&self.release_ns),
                fault_ns: g(&self.fault_ns),
                remote_fault_ns: g(&self.remote_fault_ns),
                barrier_ns: g(&self.barrier_wait_ns),
                barrier_global_ns: g(&self.barrier_global_ns),
                barrier_flush_ns: g(&self.barrier_flush_ns),
                dispatch_ns: g(&self.dispatch_ns),
                dispatched: g(&self.dispatched),
                sleeps: g(&self.sleeps),
                sleep_ns: g(&self.sleep_ns),
            },
            messages_sent: by_kind(&self.sent),
            bulk_bytes_sent: by_kind(&self.sent_bytes),
            messages_received: by_kind(&self.received),
            bundles_sent: g(&self.bundles_sent),
            bundled_messages_sent: g(&self.bundled_sent),
            express_bundled_sent: g(&self.express_bundled_sent),
            bundles_received: g(&self.bundles_received),
            bundled_messages_received: g(&self.bundled_received),
            bundle_pieces_sent: g(&self.bundle_pieces_sent),
            bundle_pieces_received: g(&self.bundle_pieces_received),
            layer,
            messages_sent_by_thread: Vec::new(),
            messages_sent_by_protocol_thread: 0,
            messages_sent_by_other_threads: 0,
            protocol,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_totals_sum_every_field_and_round_trip_through_json() {
        let mut a = ClusterStats {
            cluster: Some(1),
            read_faults: 3,
            lock_wait_ns: 10,
            ..Default::default()
        };
        a.messages_sent.insert("GetPage".into(), 2);
        a.protocol.diffs_applied = 4;
        a.layer.express_sent = 7;
        a.bundles_sent = 2;
        a.bundled_messages_received = 5;
        a.messages_sent_by_thread = vec![4, 5];
        a.messages_sent_by_protocol_thread = 3;
        a.messages_sent_by_other_threads = 1;
        let mut b = a.clone();
        b.cluster = Some(0);
        b.messages_sent.insert("Diff".into(), 1);
        b.messages_sent_by_thread = vec![7];
        let job = JobStats::from_clusters(vec![a, b]);
        assert_eq!(job.clusters[0].cluster, Some(0));
        assert_eq!(job.total.cluster, None);
        let total = serde_json::to_value(&job.total).unwrap();
        assert!(total.get("cluster").is_none(), "no sentinel: {total}");
        assert_eq!(job.total.read_faults, 6);
        assert_eq!(job.total.lock_wait_ns, 20);
        assert_eq!(job.total.messages_sent["GetPage"], 4);
        assert_eq!(job.total.messages_sent["Diff"], 1);
        assert_eq!(job.total.protocol.diffs_applied, 8);
        assert_eq!(job.total.layer.express_sent, 14);
        assert_eq!(job.total.bundles_sent, 4);
        assert_eq!(job.total.bundled_messages_received, 10);
        // Per-thread counts: cluster 0's threads, then cluster 1's (the job's thread ids).
        assert_eq!(job.total.messages_sent_by_thread, vec![7, 4, 5]);
        assert_eq!(job.total.messages_sent_by_protocol_thread, 6);
        assert_eq!(job.total.messages_sent_by_other_threads, 2);
        let json = serde_json::to_string(&job).unwrap();
        assert_eq!(serde_json::from_str::<JobStats>(&json).unwrap(), job);
    }

    #[test]
    fn long_lock_waits_count_from_the_threshold_on_and_sum_in_a_job_total() {
        let c = Counters::default();
        c.note_lock_wait(1, Duration::from_micros(499));
        c.note_lock_wait(1, LONG_LOCK_WAIT);
        c.note_lock_wait(2, Duration::from_millis(3));
        let mut s = ClusterStats::default();
        s.time.lock_long_waits = c.lock_long_waits.load(Ordering::Relaxed);
        s.time.lock_long_wait_ns = c.lock_long_wait_ns.load(Ordering::Relaxed);
        assert_eq!(
            (s.time.lock_long_waits, s.time.lock_long_wait_ns),
            (2, 3_500_000)
        );
        // The 499 µs wait is slow but not long.
        assert_eq!(c.slowest_locks().1.acquires, 3);
        let job = JobStats::from_clusters(vec![s.clone(), s]);
        assert_eq!(
            (
                job.total.time.lock_long_waits,
                job.total.time.lock_long_wait_ns
            ),
            (4, 7_000_000)
        );
        // Older JSON without the fields reads as zero.
        let t: PhaseTimes = serde_json::from_str(r#"{"lock_acquire_ns": 5}"#).unwrap();
        assert_eq!((t.lock_acquire_ns, t.lock_long_waits), (5, 0));
    }

    #[test]
    fn slow_lock_waits_keep_the_longest_locks_and_sum_by_lock_in_a_job_total() {
        let c = Counters::default();
        // At or below the threshold: not counted.
        c.note_lock_wait(1, SLOW_LOCK_WAIT);
        c.note_lock_wait(1, Duration::from_micros(5));
        assert_eq!(c.slowest_locks(), (BTreeMap::new(), LockWaits::default()));
        // Lock l waits (l + 1) ms once; lock 3 a second time.
        for l in 0..(SLOW_LOCKS_KEPT as u32 + 4) {
            c.note_lock_wait(l, Duration::from_millis(u64::from(l) + 1));
        }
        c.note_lock_wait(3, Duration::from_millis(20));
        let (kept, all) = c.slowest_locks();
        assert_eq!(kept.len(), SLOW_LOCKS_KEPT);
        // The sum covers the locks left out too: 1 + 2 + … + 12 ms, and 20 ms more.
        assert_eq!(
            all,
            LockWaits {
                acquires: SLOW_LOCKS_KEPT as u64 + 5,
                wait_ns: 98_000_000
            }
        );
        // The shortest totals are dropped: locks 0, 1, 2 (1-3 ms) and 4 (5 ms).
        assert!(!kept.contains_key(&0) && !kept.contains_key(&4), "{kept:?}");
        assert_eq!(
            kept[&3],
            LockWaits {
                acquires: 2,
                wait_ns: 24_000_000
            }
        );
        let a = ClusterStats {
            cluster: Some(0),
            slow_lock_waits: kept.clone(),
            slow_lock_waits_all: all,
            ..Default::default()
        };
        let mut b = ClusterStats {
            cluster: Some(1),
            ..Default::default()
        };
        b.slow_lock_waits.insert(
            3,
            LockWaits {
                acquires: 1,
                wait_ns: 1_000,
            },
        );
        let job = JobStats::from_clusters(vec![a, b]);
        assert_eq!(
            job.total.slow_lock_waits[&3],
            LockWaits {
                acquires: 3,
                wait_ns: 24_001_000
            }
        );
        assert_eq!(job.total.slow_lock_waits.len(), SLOW_LOCKS_KEPT);
        assert_eq!(job.total.slow_lock_waits_all, all);
        let json = serde_json::to_string(&job).unwrap();
        assert_eq!(serde_json::from_str::<JobStats>(&json).unwrap(), job);
    }

    #[test]
    fn reports_without_per_thread_counts_still_parse() {
        let mut v = serde_json::to_value(ClusterStats::default()).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in [
            "messages_sent_by_thread",
            "messages_sent_by_protocol_thread",
            "messages_sent_by_other_threads",
            "slow_lock_waits",
            "slow_lock_waits_all",
        ] {
            assert!(o.remove(k).is_some(), "{k} is serialized");
        }
        let s: ClusterStats = serde_json::from_value(v).unwrap();
        assert!(s.messages_sent_by_thread.is_empty());
        assert_eq!(s.messages_sent_by_protocol_thread, 0);
    }
}
