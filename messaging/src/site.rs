//! A site: one cluster process's message layer — its receive queues, its Tag-On pool, its
//! routes to other sites, and the endpoints that job code sends and receives through.
//!
//! The runtime creates one [`Site`] per process, attaches peers, and creates endpoints;
//! creating an endpoint yields the endpoint (for job code) and the [`TableWriter`] that
//! fills its destination table (kept by the runtime: paper 004 §4.1's protection rule).
//!
//! Routes (paper 000, multi-protocol): a destination on this site is reached through its
//! own segment; a site on the same machine whose segment this site has mapped with
//! [`Site::attach_peer`] is reached by depositing directly into that segment.

use crate::bulk::Reassembly;
use crate::endpoint::Endpoint;
use crate::layout::{LayoutError, MappedSite, QueueSpec};
use crate::names::{DestinationTable, QueueId, SiteId, TableWriter};
use crate::pool::{DEFAULT_SLOT_SIZE, Pool, PoolExhausted, TagOnBuf};
use crate::remote::RemoteRoute;
use crate::segment::{Segment, SegmentError, sweep_stale, unique_name};
use crate::stats::{EndpointCounters, MessageStats, SiteCounters};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};

/// How a site is configured. `Default` gives one queue, 1024 pool slots of 4 KiB,
/// a private segment, room for 256 sites, 1 MiB bulk messages.
#[derive(Clone, Debug)]
pub struct SiteConfig {
    /// This site's id.
    pub site: SiteId,
    /// Receive queues, indexed by [`QueueId`].
    pub queues: Vec<QueueSpec>,
    /// Tag-On buffer slots in this site's pool.
    pub pool_slots: usize,
    /// Data bytes per slot (4096: one page).
    pub slot_size: usize,
    /// Create a shared segment that same-machine peers can map (else private memory).
    pub shared: bool,
    /// Largest site id + 1 this site can route to.
    pub max_sites: usize,
    /// Largest bulk message, bytes.
    pub max_bulk: usize,
    /// Bulk messages a queue reassembles at once.
    pub max_reassemblies: usize,
    /// Names per destination table.
    pub table_capacity: usize,
    /// Emulated latency *L* on shared-memory links (paper 001 §3.2; the job's
    /// `emulation.latency_us`): every message from another site over shared memory is
    /// held this long by the receiving endpoint before delivery. Zero (the default): off.
    pub shm_latency: std::time::Duration,
    /// Emulated send overhead *o_s* on shared-memory links (paper 001 §3.2; the job's
    /// `emulation.send_overhead_us`): the sending thread busy-loops this long before it
    /// deposits each message into another site's segment. Zero (the default): off.
    pub shm_send_overhead: std::time::Duration,
    /// Emulated receive overhead *o_r* on shared-memory links (paper 001 §3.2; the job's
    /// `emulation.recv_overhead_us`): the receiving thread busy-loops this long for each
    /// message from another site over shared memory that its poll takes. Zero (the
    /// default): off.
    pub shm_recv_overhead: std::time::Duration,
}

impl Default for SiteConfig {
    fn default() -> Self {
        SiteConfig {
            site: SiteId(0),
            queues: vec![QueueSpec::default()],
            pool_slots: 1024,
            slot_size: DEFAULT_SLOT_SIZE,
            shared: false,
            max_sites: 256,
            max_bulk: 1 << 20,
            max_reassemblies: 64,
            table_capacity: 1024,
            shm_latency: std::time::Duration::ZERO,
            shm_send_overhead: std::time::Duration::ZERO,
            shm_recv_overhead: std::time::Duration::ZERO,
        }
    }
}

/// Errors creating a site, attaching a peer or creating an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    /// The segment could not be created or mapped.
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// A peer's segment is not a compatible site.
    #[error("peer segment {name}: {source}")]
    Layout {
        /// Segment name.
        name: String,
        /// What is wrong with it.
        source: LayoutError,
    },
    /// The configuration is unusable.
    #[error("invalid site configuration: {0}")]
    Config(String),
    /// The peer was already attached, or is this site.
    #[error("{0} is already attached (or is this site)")]
    AlreadyAttached(SiteId),
    /// An endpoint named a queue this site does not have.
    #[error("{queue} does not exist at {site} (it has {count} queues)")]
    NoSuchQueue {
        /// This site.
        site: SiteId,
        /// The queue asked for.
        queue: QueueId,
        /// How many queues exist.
        count: usize,
    },
}

/// Which substrate a route uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Substrate {
    /// This site's own segment.
    Local,
    /// A same-machine peer's shared segment.
    Shm,
    /// The network, through this cluster's INIs.
    Network,
}

pub(crate) enum Route {
    Segment {
        site: Arc<MappedSite>,
        substrate: Substrate,
    },
    Network(Arc<dyn RemoteRoute>),
}

pub(crate) struct SiteInner {
    pub(crate) id: SiteId,
    pub(crate) own: Arc<MappedSite>,
    routes: Box<[OnceLock<Route>]>,
    pub(crate) pools: Arc<[OnceLock<Arc<Pool>>]>,
    pub(crate) reassembly: Box<[Mutex<Reassembly>]>,
    pub(crate) counters: SiteCounters,
    endpoints: Mutex<Vec<Arc<EndpointCounters>>>,
    next_bulk: AtomicU64,
    next_lane: AtomicU64,
    /// This site's route to other machines (its INIs), once started: endpoints poll it
    /// (paper 000 §3.4).
    pub(crate) net: OnceLock<Arc<dyn RemoteRoute>>,
    /// Per receive queue, the messages from shared-memory peers held for the emulated
    /// latency *L* (`None`: no latency emulated). Per queue and not per endpoint: every
    /// endpoint polling a queue can deliver what another one took off it, even while
    /// that one blocks elsewhere (e.g. in a barrier among its cluster's threads).
    pub(crate) delay: Option<Box<[Mutex<crate::delay::DelayLine>]>>,
    /// Whether a receive must look at where each message came from: a latency *L* or a
    /// receive overhead *o_r* is emulated on some link (shared memory or network). One
    /// load on the receive path when off. 0 or 1.
    pub(crate) rx_emulated: AtomicU32,
    pub(crate) config: SiteConfig,
}

impl SiteInner {
    #[inline]
    pub(crate) fn route(&self, site: SiteId) -> Option<&Route> {
        self.routes.get(usize::from(site.0))?.get()
    }

    /// Busy-waits the emulated send overhead *o_s* of a message leaving over `substrate`
    /// (paper 001 §3.2): shared memory here; the network route pays its own (see
    /// [`RemoteRoute::submit`]); nothing within the site.
    #[inline]
    pub(crate) fn emulate_send_overhead(&self, substrate: Substrate) {
        if substrate == Substrate::Shm && !self.config.shm_send_overhead.is_zero() {
            crate::delay::spin_for(self.config.shm_send_overhead);
        }
    }

    #[inline]
    pub(crate) fn pool_of(&self, site: u16) -> Option<&Arc<Pool>> {
        self.pools.get(usize::from(site))?.get()
    }

    pub(crate) fn next_bulk_sequence(&self) -> u32 {
        self.next_bulk.fetch_add(1, Ordering::Relaxed) as u32
    }

    /// A fresh lane id for a new endpoint (the unit of ordering on the network path).
    pub(crate) fn next_lane(&self) -> u16 {
        self.next_lane.fetch_add(1, Ordering::Relaxed) as u16
    }

    pub(crate) fn register(&self, counters: Arc<EndpointCounters>) {
        self.endpoints.lock().push(counters);
    }
}

/// One process's message layer (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Site {
    inner: Arc<SiteInner>,
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Site")
            .field("id", &self.inner.id)
            .field("segment", &self.inner.own.segment.name())
            .finish()
    }
}

impl Site {
    /// Creates a site: maps its segment (shared or private), lays out its queues and pool.
    /// A shared site first sweeps stale segments left by dead processes.
    ///
    /// # Errors
    /// [`SiteError::Config`] for an unusable configuration, [`SiteError::Segment`] if the
    /// segment cannot be created.
    pub fn new(config: SiteConfig) -> Result<Site, SiteError> {
        if config.queues.is_empty() || config.queues.len() > usize::from(u16::MAX) {
            return Err(SiteError::Config(format!(
                "a site needs 1..=65535 queues, got {}",
                config.queues.len()
            )));
        }
        if usize::from(config.site.0) >= config.max_sites {
            return Err(SiteError::Config(format!(
                "site id {} is not below max_sites {}",
                config.site.0, config.max_sites
            )));
        }
        if !(1..=crate::pool::MAX_SLOTS).contains(&config.pool_slots)
            || config.slot_size < 64
            || !config.slot_size.is_multiple_of(64)
        {
            return Err(SiteError::Config(format!(
                "pool needs 1..={} slots of a multiple of 64 bytes, got {} x {}",
                crate::pool::MAX_SLOTS,
                config.pool_slots,
                config.slot_size
            )));
        }
        if config.slot_size <= crate::bulk::FRAGMENT_HEADER {
            return Err(SiteError::Config(
                "slot size too small for bulk fragments".into(),
            ));
        }
        let size = MappedSite::segment_size(&config.queues, config.pool_slots, config.slot_size);
        let segment = if config.shared {
            sweep_stale();
            Segment::create_shared(&unique_name(&format!("s{}", config.site.0)), size)?
        } else {
            Segment::private(size)?
        };
        let own = Arc::new(MappedSite::create(
            Arc::new(segment),
            config.site,
            &config.queues,
            config.pool_slots,
            config.slot_size,
        ));
        let routes: Box<[OnceLock<Route>]> =
            (0..config.max_sites).map(|_| OnceLock::new()).collect();
        let pools: Arc<[OnceLock<Arc<Pool>>]> =
            (0..config.max_sites).map(|_| OnceLock::new()).collect();
        let _ = routes[usize::from(config.site.0)].set(Route::Segment {
            site: own.clone(),
            substrate: Substrate::Local,
        });
        let _ = pools[usize::from(config.site.0)].set(own.pool.clone());
        let inner = SiteInner {
            id: config.site,
            reassembly: (0..config.queues.len())
                .map(|_| Mutex::new(Reassembly::default()))
                .collect(),
            own,
            routes,
            pools,
            counters: SiteCounters::default(),
            endpoints: Mutex::new(Vec::new()),
            next_bulk: AtomicU64::new(0),
            next_lane: AtomicU64::new(0),
            net: OnceLock::new(),
            delay: (!config.shm_latency.is_zero()).then(|| {
                (0..config.queues.len())
                    .map(|_| Mutex::new(crate::delay::DelayLine::new(config.shm_latency)))
                    .collect()
            }),
            rx_emulated: AtomicU32::new(u32::from(
                !config.shm_latency.is_zero() || !config.shm_recv_overhead.is_zero(),
            )),
            config,
        };
        Ok(Site {
            inner: Arc::new(inner),
        })
    }

    /// This site's id.
    pub fn id(&self) -> SiteId {
        self.inner.id
    }

    /// The shared-memory name peers pass to [`Site::attach_peer`]; `None` for a private site.
    pub fn segment_name(&self) -> Option<&str> {
        self.inner.own.segment.name()
    }

    /// Maps the shared segment of same-machine peer `site`, named `segment_name`, so that
    /// messages to it are deposited directly into its queues and its Tag-On buffers can be
    /// read in place.
    ///
    /// # Errors
    /// [`SiteError::Segment`] if it cannot be mapped, [`SiteError::Layout`] if it is not a
    /// compatible site segment of `site`, [`SiteError::AlreadyAttached`] if `site` already
    /// has a route, [`SiteError::Config`] if `site` is beyond `max_sites`.
    pub fn attach_peer(&self, site: SiteId, segment_name: &str) -> Result<(), SiteError> {
        let i = usize::from(site.0);
        if i >= self.inner.routes.len() {
            return Err(SiteError::Config(format!(
                "{site} is not below max_sites {}",
                self.inner.routes.len()
            )));
        }
        if self.inner.routes[i].get().is_some() {
            return Err(SiteError::AlreadyAttached(site));
        }
        let segment = Arc::new(Segment::open_shared(segment_name)?);
        let mapped = MappedSite::open(segment, site).map_err(|source| SiteError::Layout {
            name: segment_name.to_owned(),
            source,
        })?;
        let mapped = Arc::new(mapped);
        let pool = mapped.pool.clone();
        self.inner.routes[i]
            .set(Route::Segment {
                site: mapped,
                substrate: Substrate::Shm,
            })
            .map_err(|_| SiteError::AlreadyAttached(site))?;
        let _ = self.inner.pools[i].set(pool);
        Ok(())
    }

    /// How many peers have mapped this site's segment.
    pub fn attached_peers(&self) -> u32 {
        self.inner.own.attached()
    }

    /// Removes this site's segment name once every peer has attached, so nothing is left in
    /// `/dev/shm` even if the process is later killed. Existing mappings keep working.
    pub fn unlink_segment(&self) {
        self.inner.own.segment.unlink();
    }

    /// True if `site` has a route (itself, or an attached peer).
    pub fn reaches(&self, site: SiteId) -> bool {
        self.inner.route(site).is_some()
    }

    /// The pid of the process owning `site`'s segment, if it is this site or an attached peer.
    pub fn owner_pid(&self, site: SiteId) -> Option<u32> {
        match self.inner.route(site)? {
            Route::Segment { site, .. } => Some(site.owner_pid()),
            Route::Network(_) => None,
        }
    }

    /// Routes `site` through this cluster's INIs (called by the INI layer at start-up).
    pub(crate) fn add_network_route(
        &self,
        site: SiteId,
        link: Arc<dyn RemoteRoute>,
    ) -> Result<(), SiteError> {
        let i = usize::from(site.0);
        let slot = self.inner.routes.get(i).ok_or_else(|| {
            SiteError::Config(format!(
                "{site} is not below max_sites {}",
                self.inner.routes.len()
            ))
        })?;
        if !link.recv_overhead().is_zero() {
            self.inner.rx_emulated.store(1, Ordering::Relaxed);
        }
        slot.set(Route::Network(link))
            .map_err(|_| SiteError::AlreadyAttached(site))
    }

    pub(crate) fn inner_arc(&self) -> &Arc<SiteInner> {
        &self.inner
    }

    /// How `site` is reached from here, if at all.
    pub fn substrate(&self, site: SiteId) -> Option<Substrate> {
        match self.inner.route(site)? {
            Route::Segment { substrate, .. } => Some(*substrate),
            Route::Network(_) => Some(Substrate::Network),
        }
    }

    /// Creates an endpoint that receives from `queues` (polled in this priority order,
    /// highest first) and sends through a fresh, empty destination table. Returns the
    /// endpoint, for job code, and the writer of its table, for the runtime.
    ///
    /// # Errors
    /// [`SiteError::NoSuchQueue`] if a queue does not exist.
    pub fn create_endpoint(
        &self,
        queues: &[QueueId],
    ) -> Result<(Endpoint, TableWriter), SiteError> {
        let count = self.inner.own.express.len();
        if let Some(&queue) = queues.iter().find(|q| usize::from(q.0) >= count) {
            return Err(SiteError::NoSuchQueue {
                site: self.inner.id,
                queue,
                count,
            });
        }
        let table = DestinationTable::new(self.inner.config.table_capacity);
        let endpoint = Endpoint::new(self.inner.clone(), table.clone(), queues);
        Ok((endpoint, TableWriter::new(table)))
    }

    /// Allocates a Tag-On buffer from this site's pool.
    ///
    /// # Errors
    /// [`PoolExhausted`] when every slot is in use.
    pub fn alloc(&self) -> Result<TagOnBuf, PoolExhausted> {
        crate::endpoint::alloc_from(&self.inner)
    }

    /// This site's Tag-On pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.inner.own.pool
    }

    /// A snapshot of the message statistics of every endpoint of this site.
    pub fn stats(&self) -> MessageStats {
        let eps = self.inner.endpoints.lock();
        let mut s = self.inner.counters.snapshot(eps.iter().map(|e| &**e));
        s.pool_used_slots = u64::from(self.inner.own.pool.used_slots());
        s
    }

    #[cfg(test)]
    pub(crate) fn inner(&self) -> &Arc<SiteInner> {
        &self.inner
    }
}
