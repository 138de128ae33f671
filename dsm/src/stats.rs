//! Statistics of a DSM job: per cluster ([`ClusterStats`]) and summed over the job
//! ([`JobStats`]), serializable with serde.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::AddAssign;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! protocol_stats {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        /// The coherence machine's counters ([`multigrain_coherence::Stats`]), by name.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct ProtocolStats {
            $($(#[$doc])* pub $field: u64,)*
        }

        impl From<multigrain_coherence::Stats> for ProtocolStats {
            fn from(s: multigrain_coherence::Stats) -> Self {
                ProtocolStats { $($field: s.$field,)* }
            }
        }

        impl AddAssign<&ProtocolStats> for ProtocolStats {
            fn add_assign(&mut self, o: &ProtocolStats) {
                $(self.$field += o.$field;)*
            }
        }
    };
}

protocol_stats!(
    /// Read faults handled by the machine (including spurious and coalesced ones).
    read_faults,
    /// Write faults handled by the machine (including spurious and coalesced ones).
    write_faults,
    /// Faults on a page that had meanwhile become accessible.
    spurious_faults,
    /// Faults that joined a fetch already in progress (concurrent faults on one page).
    coalesced_faults,
    /// Page requests sent to a home.
    remote_fetches,
    /// hlrc fetches repeated because a write notice overtook the reply.
    stale_refetches,
    /// First-touch home queries sent.
    home_queries,
    /// Pages served with contents by this home.
    pages_served,
    /// Zero-page replies sent by this home.
    zero_pages_served,
    /// Twins made.
    twins,
    /// hlrc: write faults at the home on pages no other cluster holds (kept writable
    /// across releases, no write notices).
    private_home_writes,
    /// hlrc: private writable home pages another cluster fetched (tracked from then on).
    home_pages_shared,
    /// Write faults that waited for the previous diff's acknowledgement.
    twin_waits,
    /// Diffs sent.
    diffs_sent,
    /// Diffs sent at an acquire (dirty page invalidated by a write notice).
    diffs_at_acquire,
    /// Diffs applied at this home.
    diffs_applied,
    /// Of `diffs_applied`, whole-page diffs.
    whole_page_diffs_applied,
    /// Bytes of diffs applied at this home.
    diff_bytes_applied,
    /// Pages invalidated.
    invalidations,
    /// Write notices received.
    write_notices_received,
    /// Intervals with writes closed.
    intervals,
    /// Lock acquires sent to managers.
    lock_acquires,
    /// Lock grants issued as manager.
    lock_grants,
    /// Barriers completed.
    barriers,
    /// hlrc single-writer home migrations to this cluster.
    home_migrations,
    /// sc invalidations sent as home.
    sc_invalidations_sent,
    /// sc recalls sent as home.
    sc_recalls,
    /// sc ownership grants as home.
    sc_ownership_grants,
    /// Protocol messages sent to other clusters.
    messages_sent,
    /// Of those, lock and barrier messages.
    sync_messages_sent,
    /// Protocol messages received.
    messages_received,
);

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
    /// Sends that found the receive queue full.
    pub queue_full: u64,
    /// Buffer allocations that found the pool empty.
    pub pool_exhausted: u64,
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
            queue_full: s.full,
            pool_exhausted: s.pool_exhausted,
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
        self.queue_full += o.queue_full;
        self.pool_exhausted += o.pool_exhausted;
    }
}

/// Statistics of one cluster (or, in [`JobStats::total`], summed over the job). Times
/// are nanoseconds of wall-clock time summed over threads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStats {
    /// The cluster (`usize::MAX` in a job total).
    pub cluster: usize,
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
    /// Pages installed (`UFFDIO_COPY` / zero-fill).
    pub pages_installed: u64,
    /// Twins made.
    pub twins: u64,
    /// Diffs sent to homes.
    pub diffs_sent: u64,
    /// Bytes of encoded diffs (or whole pages) sent.
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
    /// Of those, locks passed on between threads of this cluster without messages.
    pub lock_local_handoffs: u64,
    /// Time threads spent waiting in `lock`.
    pub lock_wait_ns: u64,
    /// Barriers passed by this cluster.
    pub barriers: u64,
    /// Time threads spent waiting in barriers.
    pub barrier_wait_ns: u64,
    /// Messages sent, by kind (coherence opcode names and runtime messages).
    pub messages_sent: BTreeMap<String, u64>,
    /// Messages received, by kind.
    pub messages_received: BTreeMap<String, u64>,
    /// The message layer's own counters.
    pub layer: LayerStats,
    /// The coherence machine's counters.
    pub protocol: ProtocolStats,
}

impl AddAssign<&ClusterStats> for ClusterStats {
    fn add_assign(&mut self, o: &ClusterStats) {
        self.read_faults += o.read_faults;
        self.write_faults += o.write_faults;
        self.remote_faults += o.remote_faults;
        self.fault_ns += o.fault_ns;
        self.remote_fault_ns += o.remote_fault_ns;
        self.remote_fetches += o.remote_fetches;
        self.pages_installed += o.pages_installed;
        self.twins += o.twins;
        self.diffs_sent += o.diffs_sent;
        self.diff_bytes_sent += o.diff_bytes_sent;
        self.diffs_applied += o.diffs_applied;
        self.diff_bytes_applied += o.diff_bytes_applied;
        self.invalidations += o.invalidations;
        self.invalidate_calls += o.invalidate_calls;
        self.lock_acquires += o.lock_acquires;
        self.lock_local_handoffs += o.lock_local_handoffs;
        self.lock_wait_ns += o.lock_wait_ns;
        self.barriers += o.barriers;
        self.barrier_wait_ns += o.barrier_wait_ns;
        for (k, v) in &o.messages_sent {
            *self.messages_sent.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.messages_received {
            *self.messages_received.entry(k.clone()).or_default() += v;
        }
        self.layer += &o.layer;
        self.protocol += &o.protocol;
    }
}

/// Statistics of a whole job, gathered by [`crate::Dsm::finish`] from every cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStats {
    /// One entry per cluster, by cluster id.
    pub clusters: Vec<ClusterStats>,
    /// The sum over all clusters (`cluster` is `usize::MAX`).
    pub total: ClusterStats,
}

impl JobStats {
    /// Sums `clusters` (sorted by cluster id) into a job total.
    pub fn from_clusters(mut clusters: Vec<ClusterStats>) -> Self {
        clusters.sort_by_key(|c| c.cluster);
        let mut total = ClusterStats {
            cluster: usize::MAX,
            ..ClusterStats::default()
        };
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
    pub(crate) diffs_sent: AtomicU64,
    pub(crate) diff_bytes_sent: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) invalidate_calls: AtomicU64,
    pub(crate) lock_acquires: AtomicU64,
    pub(crate) lock_local_handoffs: AtomicU64,
    pub(crate) lock_wait_ns: AtomicU64,
    pub(crate) barriers: AtomicU64,
    pub(crate) barrier_wait_ns: AtomicU64,
    pub(crate) sent: Box<[AtomicU64; 256]>,
    pub(crate) received: Box<[AtomicU64; 256]>,
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
            diffs_sent: AtomicU64::new(0),
            diff_bytes_sent: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            invalidate_calls: AtomicU64::new(0),
            lock_acquires: AtomicU64::new(0),
            lock_local_handoffs: AtomicU64::new(0),
            lock_wait_ns: AtomicU64::new(0),
            barriers: AtomicU64::new(0),
            barrier_wait_ns: AtomicU64::new(0),
            sent: Box::new([const { AtomicU64::new(0) }; 256]),
            received: Box::new([const { AtomicU64::new(0) }; 256]),
        }
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
        ClusterStats {
            cluster,
            read_faults: g(&self.read_faults),
            write_faults: g(&self.write_faults),
            remote_faults: g(&self.remote_faults),
            fault_ns: g(&self.fault_ns),
            remote_fault_ns: g(&self.remote_fault_ns),
            remote_fetches: protocol.remote_fetches,
            pages_installed: g(&self.pages_installed),
            twins: protocol.twins,
            diffs_sent: g(&self.diffs_sent),
            diff_bytes_sent: g(&self.diff_bytes_sent),
            diffs_applied: protocol.diffs_applied,
            diff_bytes_applied: protocol.diff_bytes_applied,
            invalidations: g(&self.invalidations),
            invalidate_calls: g(&self.invalidate_calls),
            lock_acquires: g(&self.lock_acquires),
            lock_local_handoffs: g(&self.lock_local_handoffs),
            lock_wait_ns: g(&self.lock_wait_ns),
            barriers: g(&self.barriers),
            barrier_wait_ns: g(&self.barrier_wait_ns),
            messages_sent: by_kind(&self.sent),
            messages_received: by_kind(&self.received),
            layer,
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
            cluster: 1,
            read_faults: 3,
            lock_wait_ns: 10,
            ..Default::default()
        };
        a.messages_sent.insert("GetPage".into(), 2);
        a.protocol.diffs_applied = 4;
        a.layer.express_sent = 7;
        let mut b = a.clone();
        b.cluster = 0;
        b.messages_sent.insert("Diff".into(), 1);
        let job = JobStats::from_clusters(vec![a, b]);
        assert_eq!(job.clusters[0].cluster, 0);
        assert_eq!(job.total.read_faults, 6);
        assert_eq!(job.total.lock_wait_ns, 20);
        assert_eq!(job.total.messages_sent["GetPage"], 4);
        assert_eq!(job.total.messages_sent["Diff"], 1);
        assert_eq!(job.total.protocol.diffs_applied, 8);
        assert_eq!(job.total.layer.express_sent, 14);
        let json = serde_json::to_string(&job).unwrap();
        assert_eq!(serde_json::from_str::<JobStats>(&json).unwrap(), job);
    }
}
