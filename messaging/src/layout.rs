//! The layout of a site's segment: every receive ring, doorbell and the Tag-On pool, found
//! by offset from a header at byte 0 (paper 000 §3.1: the queue block is mapped by peers,
//! so it holds offsets, never pointers).
//!
//! ```text
//! 0        SiteHeader      magic, build fingerprint, site id, owner pid, counts, offsets
//!          QueueEntry[n]   per receive queue: Express ring offset/capacity, Basic ring, doorbell
//!          Doorbell[d]     one cache line each
//!          rings           Express ring, Basic ring, ... (128-byte aligned)
//! page     Tag-On pool     header, slot metadata, free-slot ring, page-aligned slots
//! ```

use crate::basic::BasicRing;
use crate::doorbell::Doorbell;
use crate::names::SiteId;
use crate::pool::{Pool, PoolLayout};
use crate::ring::RawRing;
use crate::segment::Segment;
use crate::sync::{AtomicU32, Ordering};
use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::Arc;

const SITE_MAGIC: u64 = 0x6d67_7369_7465_0001; // "mgsite" v1
/// The segment layout's version, in the fingerprint: 2 since the pool's header has a
/// cursor of never-used slots (a peer built before it is refused as incompatible).
const VERSION: u64 = 2;

/// A receive queue's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSpec {
    /// Express/Tag-On ring slots (rounded up to a power of two).
    pub express_capacity: usize,
    /// Basic ring slots (each 320 bytes).
    pub basic_capacity: usize,
    /// The doorbell this queue rings; queues one receiver sleeps on share a doorbell.
    pub doorbell: u16,
}

impl Default for QueueSpec {
    fn default() -> Self {
        QueueSpec {
            express_capacity: 1024,
            basic_capacity: 64,
            doorbell: 0,
        }
    }
}

#[repr(C)]
struct SiteHeader {
    magic: u64,
    fingerprint: u64,
    site: u32,
    owner_pid: u32,
    queues: u32,
    doorbells: u32,
    total_len: u64,
    queues_offset: u64,
    doorbells_offset: u64,
    pool_offset: u64,
    /// Peers that have mapped this segment.
    attached: AtomicU32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct QueueEntry {
    express_offset: u64,
    basic_offset: u64,
    express_capacity: u32,
    basic_capacity: u32,
    doorbell: u32,
    _reserved: u32,
}

/// Describes this build's structure sizes, so a peer built differently is refused rather
/// than misread.
fn fingerprint() -> u64 {
    let parts = [
        VERSION,
        size_of::<SiteHeader>() as u64,
        size_of::<QueueEntry>() as u64,
        size_of::<Doorbell>() as u64,
        RawRing::<u64>::layout(2).size() as u64,
        BasicRing::layout(1).size() as u64,
        PoolLayout::new(1, 64).size as u64,
    ];
    parts.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, p| {
        (h ^ p).wrapping_mul(0x0100_0000_01b3)
    })
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

struct Plan {
    queues_offset: usize,
    doorbells_offset: usize,
    entries: Vec<QueueEntry>,
    doorbells: usize,
    pool_offset: usize,
    pool: PoolLayout,
    total: usize,
}

fn plan(queues: &[QueueSpec], pool_slots: usize, slot_size: usize) -> Plan {
    let doorbells = queues
        .iter()
        .map(|q| usize::from(q.doorbell) + 1)
        .max()
        .unwrap_or(1);
    let queues_offset = align_up(size_of::<SiteHeader>(), 64);
    let doorbells_offset = align_up(queues_offset + queues.len() * size_of::<QueueEntry>(), 64);
    let mut off = align_up(doorbells_offset + doorbells * size_of::<Doorbell>(), 128);
    let mut entries = Vec::with_capacity(queues.len());
    for q in queues {
        let cap = q.express_capacity.max(2).next_power_of_two();
        let ring = RawRing::<u64>::layout(cap);
        let express_offset = align_up(off, ring.align());
        off = express_offset + ring.size();
        let basic_capacity = q.basic_capacity.max(1);
        let basic = BasicRing::layout(basic_capacity);
        let basic_offset = align_up(off, basic.align());
        off = basic_offset + basic.size();
        entries.push(QueueEntry {
            express_offset: express_offset as u64,
            basic_offset: basic_offset as u64,
            express_capacity: cap as u32,
            basic_capacity: basic_capacity as u32,
            doorbell: u32::from(q.doorbell),
            _reserved: 0,
        });
    }
    let pool = PoolLayout::new(pool_slots, slot_size);
    let pool_offset = align_up(off, 4096);
    Plan {
        queues_offset,
        doorbells_offset,
        entries,
        doorbells,
        pool_offset,
        pool,
        total: pool_offset + pool.size,
    }
}

/// Why a segment does not hold a usable site.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Not a multigrain site segment.
    #[error("segment is not a multigrain site (magic {0:#x})")]
    BadMagic(u64),
    /// Built by an incompatible multigrain build.
    #[error(
        "segment was written by an incompatible multigrain build (layout fingerprint {found:#x}, this build {expected:#x}); run the same binary on every cluster"
    )]
    Incompatible {
        /// Fingerprint found.
        found: u64,
        /// This build's fingerprint.
        expected: u64,
    },
    /// Belongs to another site than expected.
    #[error("segment belongs to site {found}, expected site {expected}")]
    WrongSite {
        /// Site found.
        found: u32,
        /// Site expected.
        expected: u16,
    },
    /// An offset or size points outside the segment.
    #[error("segment layout is corrupt: {0}")]
    Corrupt(String),
}

/// A view of one site's segment: its rings, doorbells and pool.
pub(crate) struct MappedSite {
    pub(crate) segment: Arc<Segment>,
    pub(crate) express: Box<[RawRing<u64>]>,
    pub(crate) basic: Box<[BasicRing]>,
    pub(crate) queue_doorbell: Box<[u16]>,
    doorbells: Box<[NonNull<Doorbell>]>,
    pub(crate) pool: Arc<Pool>,
    header: NonNull<SiteHeader>,
}

// SAFETY: every pointer in a MappedSite points into `segment`, which it keeps alive; the
// structures pointed to synchronize through atomics (see ring, basic, doorbell).
unsafe impl Send for MappedSite {}
// SAFETY: as above.
unsafe impl Sync for MappedSite {}

impl MappedSite {
    /// Lays out a fresh site in `segment`.
    pub(crate) fn create(
        segment: Arc<Segment>,
        site: SiteId,
        queues: &[QueueSpec],
        pool_slots: usize,
        slot_size: usize,
    ) -> MappedSite {
        let p = plan(queues, pool_slots, slot_size);
        assert!(
            p.total <= segment.len(),
            "segment of {} bytes is smaller than the site layout ({})",
            segment.len(),
            p.total
        );
        // Map the rings, the pool's bookkeeping and its first slots before writing them.
        segment.populate(p.pool_offset + p.pool.warm_len());
        let base = segment.base();
        // SAFETY: the header is at offset 0 of a fresh segment of at least `p.total` bytes.
        unsafe {
            base.cast::<SiteHeader>().write(SiteHeader {
                magic: SITE_MAGIC,
                fingerprint: fingerprint(),
                site: u32::from(site.0),
                owner_pid: std::process::id(),
                queues: queues.len() as u32,
                doorbells: p.doorbells as u32,
                total_len: p.total as u64,
                queues_offset: p.queues_offset as u64,
                doorbells_offset: p.doorbells_offset as u64,
                pool_offset: p.pool_offset as u64,
                attached: AtomicU32::new(0),
            });
        }
        for (i, e) in p.entries.iter().enumerate() {
            // SAFETY: the entry table lies inside the planned header area.
            unsafe {
                base.add(p.queues_offset + i * size_of::<QueueEntry>())
                    .cast::<QueueEntry>()
                    .write(*e)
            };
        }
        let doorbells: Box<[NonNull<Doorbell>]> = (0..p.doorbells)
            .map(|i| {
                // SAFETY: doorbell `i` lies inside the planned doorbell area.
                let d = unsafe { base.add(p.doorbells_offset + i * size_of::<Doorbell>()) }
                    .cast::<Doorbell>();
                // SAFETY: as above; written once.
                unsafe { d.write(Doorbell::new()) };
                d
            })
            .collect();
        let mut express = Vec::with_capacity(queues.len());
        let mut basic = Vec::with_capacity(queues.len());
        for e in &p.entries {
            let bell = doorbells[e.doorbell as usize];
            // SAFETY: the planned ring areas are disjoint, aligned, inside the segment, and the
            // segment outlives the views (MappedSite holds it). The doorbell is in the same mapping.
            unsafe {
                express.push(RawRing::<u64>::init(
                    base.add(e.express_offset as usize),
                    e.express_capacity as usize,
                    Some(bell),
                ));
                basic.push(BasicRing::init(
                    base.add(e.basic_offset as usize),
                    e.basic_capacity as usize,
                    Some(bell),
                ));
            }
        }
        let pool = Pool::init(&segment, p.pool_offset, p.pool, site.0);
        MappedSite {
            queue_doorbell: queues.iter().map(|q| q.doorbell).collect(),
            express: express.into(),
            basic: basic.into(),
            doorbells,
            pool,
            header: base.cast(),
            segment,
        }
    }

    /// Maps a site another process created, validating every offset against the segment.
    pub(crate) fn open(segment: Arc<Segment>, expected: SiteId) -> Result<MappedSite, LayoutError> {
        let len = segment.len();
        if len < size_of::<SiteHeader>() {
            return Err(LayoutError::Corrupt(format!(
                "segment of {len} bytes is too small for a header"
            )));
        }
        let base = segment.base();
        let header = base.cast::<SiteHeader>();
        // SAFETY: the header lies inside the segment (checked above).
        let h = unsafe { header.as_ref() };
        if h.magic != SITE_MAGIC {
            return Err(LayoutError::BadMagic(h.magic));
        }
        if h.fingerprint != fingerprint() {
            return Err(LayoutError::Incompatible {
                found: h.fingerprint,
                expected: fingerprint(),
            });
        }
        if h.site != u32::from(expected.0) {
            return Err(LayoutError::WrongSite {
                found: h.site,
                expected: expected.0,
            });
        }
        let corrupt = |what: &str| LayoutError::Corrupt(what.to_owned());
        let nq = h.queues as usize;
        let nd = h.doorbells as usize;
        let qoff = h.queues_offset as usize;
        let doff = h.doorbells_offset as usize;
        segment
            .at(qoff, nq.saturating_mul(size_of::<QueueEntry>()))
            .ok_or_else(|| corrupt("queue table out of bounds"))?;
        segment
            .at(doff, nd.saturating_mul(size_of::<Doorbell>()))
            .ok_or_else(|| corrupt("doorbells out of bounds"))?;
        let doorbells: Box<[NonNull<Doorbell>]> = (0..nd)
            // SAFETY: inside the doorbell area checked above.
            .map(|i| unsafe { base.add(doff + i * size_of::<Doorbell>()) }.cast::<Doorbell>())
            .collect();
        let mut express = Vec::with_capacity(nq);
        let mut basic = Vec::with_capacity(nq);
        let mut queue_doorbell = Vec::with_capacity(nq);
        for i in 0..nq {
            // SAFETY: entry `i` lies in the queue table checked above.
            let e = unsafe {
                base.add(qoff + i * size_of::<QueueEntry>())
                    .cast::<QueueEntry>()
                    .read()
            };
            let eo = e.express_offset as usize;
            let bo = e.basic_offset as usize;
            let ring_mem = segment
                .at(eo, 0)
                .ok_or_else(|| corrupt("express ring offset out of bounds"))?;
            let basic_mem = segment
                .at(bo, 0)
                .ok_or_else(|| corrupt("basic ring offset out of bounds"))?;
            if (e.doorbell as usize) >= nd || !eo.is_multiple_of(128) || !bo.is_multiple_of(64) {
                return Err(corrupt(
                    "queue entry misaligned or names a missing doorbell",
                ));
            }
            // SAFETY: `ring_mem` is inside the live segment with `len - eo` bytes after it;
            // `open` validates the ring's own header and bounds before trusting it.
            let ring = unsafe { RawRing::<u64>::open(ring_mem, len - eo) }
                .map_err(|err| LayoutError::Corrupt(err.to_string()))?;
            // SAFETY: as above for the Basic ring.
            let b = unsafe { BasicRing::open(basic_mem, len - bo) }
                .ok_or_else(|| corrupt("basic ring header invalid"))?;
            let bell = Some(doorbells[e.doorbell as usize]);
            if ring.doorbell_ptr() != bell || b.doorbell_ptr() != bell {
                return Err(corrupt(
                    "a ring's doorbell offset disagrees with its queue entry",
                ));
            }
            express.push(ring);
            basic.push(b);
            queue_doorbell.push(e.doorbell as u16);
        }
        let pool = Pool::open(&segment, h.pool_offset as usize, expected.0)
            .map_err(|err| LayoutError::Corrupt(format!("pool: {err}")))?;
        // The peer's rings and the slots it uses first: no page fault when first read.
        segment.populate(pool.warm_end());
        h.attached.fetch_add(1, Ordering::AcqRel);
        Ok(MappedSite {
            express: express.into(),
            basic: basic.into(),
            queue_doorbell: queue_doorbell.into(),
            doorbells,
            pool,
            header,
            segment,
        })
    }

    /// Bytes a segment for this site needs.
    pub(crate) fn segment_size(queues: &[QueueSpec], pool_slots: usize, slot_size: usize) -> usize {
        plan(queues, pool_slots, slot_size).total
    }

    /// The doorbell with index `i`.
    pub(crate) fn doorbell(&self, i: u16) -> Option<&Doorbell> {
        // SAFETY: doorbells point into the segment this view keeps alive.
        self.doorbells
            .get(usize::from(i))
            .map(|d| unsafe { d.as_ref() })
    }

    /// How many peers have mapped this segment.
    pub(crate) fn attached(&self) -> u32 {
        // SAFETY: the header is inside the live segment.
        unsafe { self.header.as_ref() }
            .attached
            .load(Ordering::Acquire)
    }

    /// The pid of the process that created this segment.
    pub(crate) fn owner_pid(&self) -> u32 {
        // SAFETY: the header is inside the live segment.
        unsafe { self.header.as_ref() }.owner_pid
    }
}
