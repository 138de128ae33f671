//! Job-wide protocol configuration: which protocol, how many clusters and pages, how
//! homes are assigned, where locks and the barrier are managed.

use crate::ids::{ClusterId, LockId, MAX_CLUSTERS, MAX_PAGES, PageId};

/// The page-coherence protocol of a job. All clusters must use the same one.
///
/// Source: design.md, *coherence* (hlrc default, sc baseline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Protocol {
    /// Home-based lazy release consistency with multiple writers, twins and diffs
    /// (HLRC, Zhou, Iftode, Li, OSDI 1996 §2; MGS, ISCA 1996 §3). See [`crate::hlrc`].
    #[default]
    Hlrc,
    /// Sequential consistency, single writer / multiple readers, write-invalidate, the
    /// home as fixed directory (Li & Hudak, TOCS 1989 §4.1, fixed distributed manager).
    /// See [`crate::sc`].
    Sc,
}

/// How the home of each page is chosen.
///
/// Source: home assignment of home-based protocols (HLRC, OSDI 1996 §2: "each page
/// has a designated home"); first-touch as in ArgoDSM
/// (`src/data_distribution/first_touch_distribution.hpp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HomePolicy {
    /// Page `p` lives at cluster `p mod clusters`.
    #[default]
    RoundRobin,
    /// The region is cut into `clusters` contiguous blocks of
    /// `ceil(pages / clusters)` pages; block `i` lives at cluster `i`.
    Block,
    /// The first cluster to fault on a page becomes its home. The decision is made
    /// without races by the page's *directory manager*, cluster `p mod clusters`,
    /// which serializes `HomeQuery` messages and answers every one with the first
    /// requester (like ArgoDSM's compare-and-swap on the owner directory at node
    /// `page mod nodes`). See [`crate::home`].
    FirstTouch,
}

/// Job-wide protocol configuration; every cluster must be built from an equal value.
///
/// Source: design.md, *cluster-config* (protocol and home policy are job settings).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// The protocol.
    pub protocol: Protocol,
    /// Number of clusters, `1..=MAX_CLUSTERS`.
    pub clusters: u16,
    /// Number of pages in the DSM region, `1..=MAX_PAGES`.
    pub pages: u32,
    /// Home assignment.
    pub home_policy: HomePolicy,
    /// hlrc only: at each barrier, move the home of a page written by exactly one
    /// cluster since the previous barrier to that cluster (single-writer fast path;
    /// home migration of JIAJIA: Hu, Shi, Tang, "Home Migration in Home-based Software DSMs", WSDSM 1999). Ignored by sc.
    pub migrate_single_writer: bool,
    /// hlrc only: a fault that fetches page `p` from its home also requests the pages
    /// `p + 1 ..= p + prefetch` that this cluster lacks, whose home is known and is
    /// another cluster, and that are not being fetched — one `GetPage` each, sent
    /// together, so that a sweep over remote pages waits for one round trip per
    /// `prefetch + 1` pages. Their copies are installed read-only when they arrive;
    /// one that a write notice made stale on the way is dropped. 0 turns prefetching
    /// off. This is the window a sweep starts with: a fault that continues the pages
    /// the previous fault prefetched doubles it, up to
    /// [`crate::readahead::MAX_READAHEAD`] ([`crate::readahead`]). Ignored by sc. (ArgoDSM fetches 8 pages per miss: Kaxiras et al., HPDC
    /// 2015, §4; issue 10.)
    pub prefetch: u32,
    /// hlrc only: a write fault on a read-only page that continues the pages the
    /// previous write fault opened also opens up to this many following read-only
    /// pages (twin taken, write protection lifted), so that a sweep of writes takes one
    /// fault per `write_ahead + 1` pages ([`crate::write_ahead`]); `0..=`
    /// [`MAX_WRITE_AHEAD`], 0 turns it off. Ignored by sc. (This project's, issue 10.)
    pub write_ahead: u32,
    /// hlrc only: an open page (writable, with a twin) that a flush finds unchanged
    /// at this many flushes in a row is closed at the next one (write-protected,
    /// diffed a last time, twin dropped); `0..=`[`MAX_IDLE_FLUSHES`], 0 closes every
    /// open page at every flush. A clean open page costs the runtime a look at its
    /// write mark at each flush (`multigrain_dsm::uffd::WriteMarks`; a comparison with
    /// its twin, ≈ 0.25–0.6 µs, before the thirty-third session); a closed one that is
    /// written again a write fault, two `UFFDIO_WRITEPROTECT`s and a new twin (≈ 6–20
    /// µs). Barriers close
    /// every open page but the home's own whatever the count. Ignored by sc. (This
    /// project's, issue 10; see [`DEFAULT_IDLE_FLUSHES`].)
    pub idle_flushes: u32,
    /// The cluster that runs the barrier manager.
    pub barrier_manager: ClusterId,
    /// Release batching, `1..=MAX_RELEASE_BATCH`: a lock that must leave the cluster
    /// by itself after its use (contended or pushed, see [`crate::sync`]) is kept,
    /// released but still owned, until this many such locks wait; then they all leave
    /// together after one flush — one interval, one diff per dirty page, their
    /// `LockRelease`s sent at once. They also leave when any of them is recalled (a
    /// cluster asked for it), when a local thread waits for a lock another cluster
    /// owns, and at a barrier arrival; a local acquire takes a waiting one back at
    /// once. 1 sends every such lock back at its release (no batching).
    /// (Message aggregation of lazy release consistency: TreadMarks, USENIX Winter
    /// 1994 §3.2, sends a lock's write notices only when another processor asks for
    /// it; issue 10.)
    pub release_batch: u32,
    /// hlrc only: at a barrier arrival, the home sends the diff of each page it wrote
    /// in the closing interval to the other clusters of the page's copyset
    /// ([`crate::Message::Update`]); at the departure a copy that reflects the
    /// diff's base applies it instead of being invalidated and fetched again. An
    /// update that finds no such copy is dropped. A release whose flush wrote more
    /// pages than its lock carries diffs ([`crate::sync::MAX_CARRIED_DIFFS`]) sends
    /// the older diffs of the pages homed here the same way, ahead of the lock, and
    /// a grant that brings an update's write notice applies it at once. Arrivals
    /// count the updates sent to each cluster, and a departure that overtook some
    /// (it comes from the barrier manager, they from a third cluster) waits for
    /// them ([`crate::Message::BarrierDepart`]). Ignored by sc. (Update instead of
    /// invalidate for producer–consumer sharing across barriers: the competitive
    /// update protocols of Munin, Carter, Bennett, Zwaenepoel, SOSP 1991 §3; issue 10:
    /// EM3D's boundary pages.)
    pub barrier_updates: bool,
    /// hlrc only: a thread that asks another cluster for a lock first closes the
    /// cluster's interval — flushes its open pages, as a release would, with no lock
    /// leaving — while the request is on its way ([`crate::sync`], *Flush ahead*).
    /// The diffs of pages homed here go to their copysets as updates (with
    /// [`Config::barrier_updates`]), the others to their homes. The critical section
    /// that follows then flushes only what it writes itself, so the next cluster
    /// waiting for the lock no longer waits for this cluster's earlier writes to be
    /// diffed: Water's global-sum locks, taken right after a phase that rewrote every
    /// molecule of the cluster, used to pass each such flush along the chain of
    /// waiting clusters. Ignored by sc. (Issue 10; diffs may always be created and
    /// sent earlier than a release asks: HLRC, OSDI 1996 §2.)
    pub flush_ahead: bool,
    /// hlrc only: how many locks a sweep recalls ahead of its requests, and how many
    /// used releases of a manager's locks by other clusters make a cluster *quiet*
    /// there (see [`crate::sync::SWEEP_RECALL`], the default), `1..=`
    /// [`MAX_SWEEP_RECALL`]. The runtime keeps the default; the model checker's
    /// scenarios set 1, so that a sweep over locks pushed to a quiet cluster takes a
    /// few steps instead of sixteen releases. (This project's, issue 10.)
    pub sweep_recall: u32,
}

/// The default of [`Config::release_batch`].
pub const DEFAULT_RELEASE_BATCH: u32 = 16;

/// The largest [`Config::release_batch`].
pub const MAX_RELEASE_BATCH: u32 = 1024;

/// The default of [`Config::prefetch`]: 7 pages after the faulting one (8 per miss).
pub const DEFAULT_PREFETCH: u32 = 7;

/// The default of [`Config::write_ahead`]: 4 pages after the faulting one. Water 512 ×
/// 50 on 2×1 over shared memory: write faults 14,000 → 3,400 per run; run time with it
/// over without, five alternating A/B sets on the 2-vCPU development VM (10–12 pairs or
/// 5–8 `bench apps` rounds each): medians 0.94, 0.95, 0.96, 0.985 and 1.06 — ≈ 4 %
/// faster, inside the VM's run-to-run spread (single pairs 0.7–1.3).
pub const DEFAULT_WRITE_AHEAD: u32 = 4;

/// The largest [`Config::write_ahead`].
pub const MAX_WRITE_AHEAD: u32 = 64;

/// The default of [`Config::idle_flushes`]. Water's force pages are written under
/// molecule locks and flushed at every release batch: with 2 (the value up to the
/// thirty-first session) a page left unchanged by two batches closed and faulted
/// again a few batches later. Measured then on the 2-vCPU development VM, old (2) over
/// new (8), `multigrain bench apps --compare dsm.idle_flushes=2`, per-round ratio of
/// the run times, median (min–max): Water 512 × 50 2×1 shm 1.07 (0.95–1.19), 2×1 udp
/// 1.08 (0.91–1.23), 2×2 0.99 (0.85–1.07), 4×1 1.04 (0.95–1.11), 4 rounds; Water 4096 ×
/// 3 0.97–1.02 (4 rounds); EM3D 2×1 shm 1.03, udp 1.02, 2×2 1.03 (5 rounds). Write
/// faults on Water 512 × 50 2×1 fall from 4,250–4,900 to 2,750–3,100 per run; 16 and
/// 64 were no better than 8 (2×1 shm, 4 alternating rounds). Raised to 64 (the
/// largest) in the thirty-third session, when the runtime stopped reading open pages
/// that no store had marked since the previous flush (software write detection), so
/// that an idle open page costs next to nothing: Water 512 × 50 2×1 twins 12,069 →
/// 5,555 and write faults 2,966 → 1,563 per run; `bench apps --compare
/// dsm.idle_flushes=64` (8 / 64 is the old / new), per-round ratios new / old, two runs
/// of 8 and 4 rounds: Water 512 × 50 2×1 shm 0.93 and 0.89, udp 0.97 and 0.95, 2×2
/// 0.92 and 1.07; Water 4096 × 3 (4 rounds each) 2×1 shm 1.05 and 1.03, udp 1.06 and
/// 0.79, 2×2 1.00 and 0.98; EM3D 2×1 shm 0.92, udp 1.07, 2×2 1.05 (6 rounds; EM3D
/// flushes only at barriers, which close every open copy).
pub const DEFAULT_IDLE_FLUSHES: u32 = 64;

/// The largest [`Config::idle_flushes`].
pub const MAX_IDLE_FLUSHES: u32 = 64;

/// The largest [`Config::sweep_recall`] (a manager counts a cluster's releases up to
/// it in one byte).
pub const MAX_SWEEP_RECALL: u32 = 255;

/// Why a [`Config`] was rejected.
///
/// Source: issue 4 (clusters < 2^10, pages < 2^24).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `clusters` is 0 or above [`MAX_CLUSTERS`].
    #[error("cluster count {0} is outside 1..={MAX_CLUSTERS}")]
    Clusters(u16),
    /// `pages` is 0 or above [`MAX_PAGES`].
    #[error("page count {0} is outside 1..={MAX_PAGES}")]
    Pages(u32),
    /// The barrier manager or the machine's own id is not a cluster of the job.
    #[error("cluster {0} is not below the cluster count {1}")]
    NoSuchCluster(ClusterId, u16),
    /// `release_batch` is 0 or above [`MAX_RELEASE_BATCH`].
    #[error("release batch {0} is outside 1..={MAX_RELEASE_BATCH}")]
    ReleaseBatch(u32),
    /// `write_ahead` is above [`MAX_WRITE_AHEAD`].
    #[error("write-ahead {0} is outside 0..={MAX_WRITE_AHEAD}")]
    WriteAhead(u32),
    /// `idle_flushes` is above [`MAX_IDLE_FLUSHES`].
    #[error("idle flushes {0} is outside 0..={MAX_IDLE_FLUSHES}")]
    IdleFlushes(u32),
    /// `sweep_recall` is 0 or above [`MAX_SWEEP_RECALL`].
    #[error("sweep recall {0} is outside 1..={MAX_SWEEP_RECALL}")]
    SweepRecall(u32),
}

impl Config {
    /// A configuration with the default home policy (round-robin), single-writer
    /// migration on, [`DEFAULT_PREFETCH`] pages prefetched per fetch,
    /// [`DEFAULT_RELEASE_BATCH`] locks per release batch, updates at barriers, and
    /// the barrier managed by cluster 0.
    ///
    /// Source: design.md, *coherence* (hlrc default, round-robin homes).
    pub fn new(protocol: Protocol, clusters: u16, pages: u32) -> Self {
        Self {
            protocol,
            clusters,
            pages,
            home_policy: HomePolicy::RoundRobin,
            migrate_single_writer: true,
            prefetch: DEFAULT_PREFETCH,
            write_ahead: DEFAULT_WRITE_AHEAD,
            idle_flushes: DEFAULT_IDLE_FLUSHES,
            barrier_manager: ClusterId::new(0).expect("0 is a valid cluster"),
            release_batch: DEFAULT_RELEASE_BATCH,
            barrier_updates: true,
            flush_ahead: true,
            sweep_recall: crate::sync::SWEEP_RECALL as u32,
        }
    }

    /// Checks the ranges of every field.
    ///
    /// Source: issue 4 (identifier widths).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.clusters == 0 || self.clusters > MAX_CLUSTERS {
            return Err(ConfigError::Clusters(self.clusters));
        }
        if self.pages == 0 || self.pages > MAX_PAGES {
            return Err(ConfigError::Pages(self.pages));
        }
        if self.release_batch == 0 || self.release_batch > MAX_RELEASE_BATCH {
            return Err(ConfigError::ReleaseBatch(self.release_batch));
        }
        if self.write_ahead > MAX_WRITE_AHEAD {
            return Err(ConfigError::WriteAhead(self.write_ahead));
        }
        if self.idle_flushes > MAX_IDLE_FLUSHES {
            return Err(ConfigError::IdleFlushes(self.idle_flushes));
        }
        if self.sweep_recall == 0 || self.sweep_recall > MAX_SWEEP_RECALL {
            return Err(ConfigError::SweepRecall(self.sweep_recall));
        }
        if self.barrier_manager.get() >= self.clusters {
            return Err(ConfigError::NoSuchCluster(
                self.barrier_manager,
                self.clusters,
            ));
        }
        Ok(())
    }

    /// The cluster that manages `lock`: `lock mod clusters` (the lock's home).
    ///
    /// Source: distributed lock managers at a static home (Li & Hudak, TOCS 1989 §4.1
    /// fixed distributed manager, applied to locks; HLRC OSDI 1996 §3 lock managers).
    pub fn lock_manager(&self, lock: LockId) -> ClusterId {
        cluster(lock.get() % u32::from(self.clusters))
    }

    /// The page's *static* home under a static policy, or its directory manager under
    /// first-touch (`page mod clusters`).
    ///
    /// Source: see [`HomePolicy`].
    pub fn static_home(&self, page: PageId) -> ClusterId {
        let n = u32::from(self.clusters);
        match self.home_policy {
            HomePolicy::RoundRobin | HomePolicy::FirstTouch => cluster(page.get() % n),
            HomePolicy::Block => {
                let block = self.pages.div_ceil(n).max(1);
                cluster((page.get() / block).min(n - 1))
            }
        }
    }

    /// Whether eager releases wait for a batch ([`Config::release_batch`] above 1).
    /// Then an owner may hold a released contended lock for a while — in its batch, or
    /// kept for its visit (see [`crate::sync`]) — so lock managers recall contended
    /// owners too, and clusters may keep locks for their visits only then: both sides
    /// ask this one question.
    pub(crate) fn batches_releases(&self) -> bool {
        self.release_batch > 1
    }

    /// Whether `page` is inside the region.
    ///
    /// Source: design.md, *dsm* (a region of a fixed number of pages).
    pub fn has_page(&self, page: PageId) -> bool {
        page.get() < self.pages
    }

    /// Whether `c` is a cluster of the job.
    ///
    /// Source: design.md, *messaging* (SiteId indexes the topology).
    pub fn has_cluster(&self, c: ClusterId) -> bool {
        c.get() < self.clusters
    }
}

fn cluster(n: u32) -> ClusterId {
    // The callers reduce `n` modulo the cluster count, which is <= MAX_CLUSTERS.
    ClusterId::new(n as u16).unwrap_or(ClusterId::new(0).expect("0 is a valid cluster"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_homes() {
        let mut c = Config::new(Protocol::Hlrc, 3, 10);
        let p = |n| PageId::new(n).unwrap();
        assert_eq!(c.static_home(p(4)).get(), 1);
        c.home_policy = HomePolicy::Block;
        // blocks of 4: 0..4 -> 0, 4..8 -> 1, 8..10 -> 2
        assert_eq!(c.static_home(p(3)).get(), 0);
        assert_eq!(c.static_home(p(4)).get(), 1);
        assert_eq!(c.static_home(p(9)).get(), 2);
        assert!(c.validate().is_ok());
        c.clusters = 0;
        assert_eq!(c.validate(), Err(ConfigError::Clusters(0)));
    }

    #[test]
    fn counts_out_of_range_are_named() {
        let ok = Config::new(Protocol::Hlrc, 2, 10);
        assert_eq!(ok.idle_flushes, DEFAULT_IDLE_FLUSHES);
        let with = |f: fn(&mut Config)| {
            let mut c = ok.clone();
            f(&mut c);
            c.validate()
        };
        assert_eq!(with(|c| c.idle_flushes = 0), Ok(()));
        assert_eq!(with(|c| c.idle_flushes = MAX_IDLE_FLUSHES), Ok(()));
        assert_eq!(
            with(|c| c.idle_flushes = MAX_IDLE_FLUSHES + 1),
            Err(ConfigError::IdleFlushes(MAX_IDLE_FLUSHES + 1))
        );
        assert_eq!(
            with(|c| c.write_ahead = MAX_WRITE_AHEAD + 1),
            Err(ConfigError::WriteAhead(MAX_WRITE_AHEAD + 1))
        );
        assert_eq!(
            with(|c| c.release_batch = 0),
            Err(ConfigError::ReleaseBatch(0))
        );
        assert_eq!(ok.sweep_recall, crate::sync::SWEEP_RECALL as u32);
        assert_eq!(with(|c| c.sweep_recall = 1), Ok(()));
        assert_eq!(with(|c| c.sweep_recall = MAX_SWEEP_RECALL), Ok(()));
        assert_eq!(
            with(|c| c.sweep_recall = 0),
            Err(ConfigError::SweepRecall(0))
        );
        assert_eq!(
            with(|c| c.sweep_recall = MAX_SWEEP_RECALL + 1),
            Err(ConfigError::SweepRecall(MAX_SWEEP_RECALL + 1))
        );
    }
}
