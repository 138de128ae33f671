//! The boundary between the DSM runtime and whatever starts the job: the [`Site`] the
//! runtime sends and receives through, and a [`Liveness`] oracle that says when another
//! cluster has failed.
//!
//! The job bootstrap (a launcher, a coordinator exchanging addresses, INIs over UDP, or a
//! test harness that exchanges shared-memory segment names) creates each cluster's
//! [`Site`] from [`site_config`], gives it a route to every other cluster, and hands the
//! runtime a [`Transport`]. The runtime needs nothing else from the bootstrap: it maps
//! virtual name *c* to cluster *c*'s protocol queue in its own destination tables (and
//! the names after the clusters to its own [wake-up queues](WAKE_QUEUES)) and sends
//! whatever the route to that site is (shared memory or network, transparently).
//!
//! [`PidLiveness`] is the [`Liveness`] of clusters on one machine: it watches the peers'
//! segment-owner processes through pidfds.

use multigrain_cluster_config::JobConfig;
use multigrain_messaging::{QueueId, QueueSpec, Site, SiteConfig, SiteId};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// The one receive queue the runtime uses at every site: all protocol traffic (requests,
/// replies, lock and barrier messages) arrives here and is polled by the cluster's
/// protocol thread and by its compute threads while they wait.
pub const PROTOCOL_QUEUE: QueueId = QueueId(0);

/// Express slots of the protocol queue. A release can send one diff per dirty page at
/// once; the queue absorbs bursts so that senders rarely find it full.
pub const PROTOCOL_QUEUE_CAPACITY: usize = 8192;

/// Private wake-up queues of a site, after the protocol queue (queue ids
/// `1..=WAKE_QUEUES`). A thread of the runtime that waits (for a page, a lock, a barrier)
/// sleeps in the message layer's blocking receive on the protocol queue *and* its own
/// wake-up queue (thread slot `s` uses queue `1 + s mod WAKE_QUEUES`); all of a site's
/// queues share one doorbell. A thread that completes another's wait while that one
/// sleeps sends an Express no-op to the sleeper's wake-up queue, which only the sleeper
/// polls: it wakes that thread and no message meant for it can be taken by another
/// (a no-op on the shared protocol queue could be, leaving the sleeper asleep until its
/// time slice ran out).
pub const WAKE_QUEUES: usize = 32;

/// Express slots of each wake-up queue (no-ops only; a full queue still rings).
const WAKE_QUEUE_CAPACITY: usize = 16;

/// The wake-up queue of thread slot `slot`.
pub(crate) fn wake_queue(slot: u32) -> QueueId {
    QueueId(1 + (slot as usize % WAKE_QUEUES) as u16)
}

/// Tag-On slots (4 KiB each) of a cluster's buffer pool: page replies, diffs and bulk
/// fragments in flight from this cluster.
pub const POOL_SLOTS: usize = 4096;

/// The message-layer configuration of `cluster`'s [`Site`] in the job `cfg`: one
/// protocol queue ([`PROTOCOL_QUEUE`]) and [`WAKE_QUEUES`] wake-up queues, all on
/// doorbell 0, a pool of [`POOL_SLOTS`] page-sized
/// buffers, bulk messages large enough for a write-notice list naming every page of the
/// region four times, a segment shared with same-host peers, and room for every
/// cluster. The network layer creates the site with this and adds its routes.
///
/// # Panics
/// If `cluster` is not a cluster of `cfg`.
pub fn site_config(cfg: &JobConfig, cluster: usize) -> SiteConfig {
    let clusters = cfg.clusters.len();
    assert!(
        cluster < clusters,
        "cluster {cluster} is not in the job ({clusters} clusters)"
    );
    let pages = usize::try_from(cfg.dsm.pages()).unwrap_or(usize::MAX);
    let defaults = SiteConfig::default();
    // Each fragment carries a little less than a slot; keep bulk messages within half the
    // pool so that two can be in flight.
    let pool_bytes = POOL_SLOTS / 2 * (defaults.slot_size - 64);
    let max_bulk = pages
        .saturating_mul(16)
        .saturating_add(1 << 16)
        .clamp(1 << 20, pool_bytes);
    SiteConfig {
        site: SiteId(cluster as u16),
        queues: std::iter::once(QueueSpec {
            express_capacity: PROTOCOL_QUEUE_CAPACITY,
            basic_capacity: 1,
            doorbell: 0,
        })
        .chain((0..WAKE_QUEUES).map(|_| QueueSpec {
            express_capacity: WAKE_QUEUE_CAPACITY,
            basic_capacity: 1,
            doorbell: 0,
        }))
        .collect(),
        pool_slots: POOL_SLOTS,
        shared: (0..clusters).any(|c| c != cluster && cfg.clusters_on_same_host(cluster, c)),
        max_sites: clusters,
        max_bulk,
        max_reassemblies: defaults.max_reassemblies.max(4 * clusters),
        table_capacity: clusters + WAKE_QUEUES,
        ..defaults
    }
}

/// Tells the runtime that a cluster of the job failed: its process died, it aborted, or
/// it fell silent. Every wait of the runtime consults it, so that no thread waits
/// forever for a cluster that will never answer.
///
/// Implementations must be cheap (the runtime calls it every few milliseconds while
/// waiting) and must never report the calling cluster itself.
pub trait Liveness: Send + Sync {
    /// The first failed cluster and what happened to it, or `None` while all are well.
    fn failure(&self) -> Option<(usize, String)>;
}

/// What the runtime needs from the job bootstrap: this cluster's [`Site`] (created from
/// [`site_config`]) with a route to every cluster of the job, and a [`Liveness`] oracle.
pub struct Transport {
    /// This cluster's message-layer site.
    pub site: Site,
    /// This cluster's id, `0..clusters`.
    pub cluster: usize,
    /// Number of clusters in the job.
    pub clusters: usize,
    /// Reports failed clusters.
    pub liveness: Arc<dyn Liveness>,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("site", &self.site)
            .field("cluster", &self.cluster)
            .field("clusters", &self.clusters)
            .finish_non_exhaustive()
    }
}

/// Why a [`PidLiveness`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LivenessError {
    /// The site has no route to a peer, so its owner process is unknown.
    #[error(
        "cluster {peer} is not attached to the site of cluster {cluster}: attach every \
         same-machine peer (Site::attach_peer) before watching it"
    )]
    NotAttached {
        /// This cluster.
        cluster: usize,
        /// The peer.
        peer: usize,
    },
}

/// How one peer process is watched.
#[derive(Debug)]
enum Watch {
    /// A pidfd: readable once the process has exited (zombies included).
    Pidfd(OwnedFd),
    /// No pidfd support: `kill(pid, 0)` plus a zombie check in `/proc`.
    Pid,
    /// Already gone when the watch was set up.
    Gone,
}

/// [`Liveness`] for clusters on one machine: watches each peer's segment-owner process
/// ([`Site::owner_pid`]) and reports a peer whose process has exited. Peers owned by this
/// same process (several clusters in one process, e.g. benchmarks) are never reported.
#[derive(Debug)]
pub struct PidLiveness {
    peers: Vec<(usize, u32, Watch)>,
}

fn pidfd_open(pid: u32) -> Result<OwnedFd, nix::errno::Errno> {
    // SAFETY: pidfd_open(2) takes a pid and flags and touches no memory of ours; it
    // returns a new descriptor or -1 with errno set.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
    let fd = nix::errno::Errno::result(r)?;
    let fd = i32::try_from(fd).map_err(|_| nix::errno::Errno::EOVERFLOW)?;
    // SAFETY: the kernel just returned `fd` as a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `pid` exists and is not a zombie.
fn pid_running(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    if !multigrain_messaging::segment::process_alive(pid) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

impl PidLiveness {
    /// Watches every other cluster `0..clusters` of `site`, which must be attached.
    ///
    /// # Errors
    /// [`LivenessError::NotAttached`] for a peer without a route.
    pub fn new(site: &Site, cluster: usize, clusters: usize) -> Result<Self, LivenessError> {
        let own = std::process::id();
        let mut peers = Vec::new();
        for peer in (0..clusters).filter(|&c| c != cluster) {
            let pid = site
                .owner_pid(SiteId(peer as u16))
                .ok_or(LivenessError::NotAttached { cluster, peer })?;
            if pid == own {
                continue;
            }
            let watch = match pidfd_open(pid) {
                Ok(fd) => Watch::Pidfd(fd),
                Err(nix::errno::Errno::ESRCH) => Watch::Gone,
                Err(_) => Watch::Pid,
            };
            peers.push((peer, pid, watch));
        }
        Ok(PidLiveness { peers })
    }
}

impl Liveness for PidLiveness {
    fn failure(&self) -> Option<(usize, String)> {
        let dead = |peer: usize, pid: u32| {
            Some((
                peer,
                format!("its process (pid {pid}) exited without finishing the job"),
            ))
        };
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.peers.len());
        for (peer, pid, watch) in &self.peers {
            match watch {
                Watch::Gone => return dead(*peer, *pid),
                Watch::Pid if !pid_running(*pid) => return dead(*peer, *pid),
                Watch::Pid => {}
                Watch::Pidfd(fd) => fds.push(libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }),
            }
        }
        if fds.is_empty() {
            return None;
        }
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structures; timeout 0 never
        // blocks.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        if n <= 0 {
            return None;
        }
        let mut with_fd = self
            .peers
            .iter()
            .filter(|(_, _, w)| matches!(w, Watch::Pidfd(_)));
        for p in &fds {
            let (peer, pid, _) = with_fd.next()?;
            if p.revents != 0 {
                return dead(*peer, *pid);
            }
        }
        None
    }
}

/// A [`Liveness`] that never reports a failure: for jobs whose clusters all live in this
/// process (tests, benchmarks) or whose bootstrap watches the clusters itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct NeverFails;

impl Liveness for NeverFails {
    fn failure(&self) -> Option<(usize, String)> {
        None
    }
}

/// Why [`local_transports`] failed.
#[derive(Debug, thiserror::Error)]
#[error("setting up cluster {cluster} of an in-process job: {source}")]
pub struct LocalJobError {
    /// The cluster being set up.
    pub cluster: usize,
    /// The message layer's error.
    #[source]
    pub source: multigrain_messaging::SiteError,
}

/// Transports for every cluster of `cfg`, all in this process, connected through shared
/// memory (each site attached to every other, segment names unlinked once attached),
/// with [`NeverFails`] liveness. For benchmarks and tests that run several clusters in
/// one process (give each its own [`crate::DsmOptions::region_base`]).
///
/// # Errors
/// [`LocalJobError`] if a site cannot be created or attached.
pub fn local_transports(cfg: &JobConfig) -> Result<Vec<Transport>, LocalJobError> {
    let n = cfg.clusters.len();
    let mut sites = Vec::with_capacity(n);
    for c in 0..n {
        let mut sc = site_config(cfg, c);
        sc.shared = true;
        sites.push(Site::new(sc).map_err(|source| LocalJobError { cluster: c, source })?);
    }
    for (c, site) in sites.iter().enumerate() {
        for (p, peer) in sites.iter().enumerate().filter(|&(p, _)| p != c) {
            let name = peer
                .segment_name()
                .expect("shared sites have a segment name");
            site.attach_peer(SiteId(p as u16), name)
                .map_err(|source| LocalJobError { cluster: c, source })?;
        }
    }
    for s in &sites {
        s.unlink_segment();
    }
    Ok(sites
        .into_iter()
        .enumerate()
        .map(|(cluster, site)| Transport {
            site,
            cluster,
            clusters: n,
            liveness: Arc::new(NeverFails),
        })
        .collect())
}

/// Why an in-process job over the INIs could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackNetError {
    /// A site could not be created.
    #[error("cluster {cluster}: {source}")]
    Site {
        /// The cluster.
        cluster: usize,
        /// Why.
        source: multigrain_messaging::SiteError,
    },
    /// The INIs could not be bound or started (a bind error names the cluster and address).
    #[error(transparent)]
    Net(#[from] multigrain_messaging::net::NetError),
}

/// Like [`local_transports`], but the clusters reach each other through INI threads over
/// UDP on loopback (the inter-cluster path of paper 002, with `cfg`'s `[ini]` settings),
/// for benchmarks of the DSM over the network in one process. Keep the returned INI
/// groups alive as long as the transports.
///
/// # Errors
/// [`LoopbackNetError`] naming the cluster whose site or INIs failed.
pub fn loopback_network_transports(
    cfg: &JobConfig,
) -> Result<(Vec<Transport>, Vec<multigrain_messaging::net::IniGroup>), LoopbackNetError> {
    use multigrain_messaging::net::{NetConfig, connect_loopback};
    let n = cfg.clusters.len();
    let mut sites = Vec::with_capacity(n);
    for c in 0..n {
        let mut sc = site_config(cfg, c);
        sc.shared = false;
        sites.push(Site::new(sc).map_err(|source| LoopbackNetError::Site { cluster: c, source })?);
    }
    let groups = connect_loopback(&sites, &NetConfig::from_job(cfg), cfg.ini.per_cluster)?;
    let transports = sites
        .into_iter()
        .enumerate()
        .map(|(cluster, site)| Transport {
            site,
            cluster,
            clusters: n,
            liveness: Arc::new(NeverFails),
        })
        .collect();
    Ok((transports, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_config_fits_the_job() {
        let cfg = JobConfig::local(3, 2);
        let s = site_config(&cfg, 2);
        assert_eq!(s.site, SiteId(2));
        assert_eq!(s.max_sites, 3);
        assert!(s.shared, "local clusters share a host");
        assert_eq!(s.queues.len(), 1 + WAKE_QUEUES);
        assert!(s.queues.iter().all(|q| q.doorbell == 0));
        assert_eq!(s.table_capacity, 3 + WAKE_QUEUES);
        assert_eq!(wake_queue(0), QueueId(1));
        assert_eq!(wake_queue(WAKE_QUEUES as u32 + 1), QueueId(2));
        assert!(s.max_bulk >= cfg.dsm.pages() as usize * 4);
        let single = site_config(&JobConfig::local(1, 1), 0);
        assert!(!single.shared);
    }

    #[test]
    fn a_finished_child_is_reported_and_a_running_one_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let watch = |pid: u32| PidLiveness {
            peers: vec![(1, pid, Watch::Pidfd(pidfd_open(pid).unwrap()))],
        };
        let live = watch(child.id());
        let fallback = PidLiveness {
            peers: vec![(1, child.id(), Watch::Pid)],
        };
        assert_eq!(live.failure(), None);
        assert_eq!(fallback.failure(), None);
        child.kill().unwrap();
        // Not reaped yet: a zombie still counts as exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while live.failure().is_none() || fallback.failure().is_none() {
            assert!(std::time::Instant::now() < deadline, "exit not detected");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (peer, why) = live.failure().unwrap();
        assert_eq!(peer, 1);
        assert!(why.contains(&child.id().to_string()), "{why}");
        child.wait().unwrap();
        assert!(fallback.failure().is_some());
    }
}
