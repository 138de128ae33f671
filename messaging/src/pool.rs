//! The registered buffer pool behind Tag-On messages.
//!
//! A Tag-On message is an Express header plus a buffer that the data travels in (paper 004
//! §5.2). The buffers are fixed-size *slots* (4096 data bytes by default, one page) in the
//! sending site's segment; the header names `(pool, slot)`. The receiver reads the data in
//! place — through its own mapping of the sender's segment on one machine — and releases
//! the slot when its guard drops, so a page is copied into a buffer once and not again until
//! it is installed.
//!
//! Each slot has a reference count. A writable [`TagOnBuf`] is the only reference; freezing
//! it gives a [`TagOnData`], which is cheap to clone: **multicast** sends one clone per
//! destination and the data is never copied again at the source. The last guard to drop
//! returns the slot to the pool's free list — itself a lock-free [`RawRing`] of slot
//! indices, so allocation and release are one claim each and work across processes.
//!
//! The free list holds only slots that have been used and returned: a slot never handed
//! out is taken from a *fresh* cursor in the pool's header, and only when the free list is
//! empty. So a pool touches as many slots as it ever had in flight at once, not all of
//! them: a page of the pool is mapped, and cleared, the first time a slot in it is used,
//! and a job that keeps a few dozen buffers in flight maps a few dozen pages, not the 16
//! MiB of a DSM cluster's pool (whose pages were populated when the segment was created,
//! ≈ 40 % of the CPU time of starting and stopping a two-cluster job; see
//! [`Pool::warm_end`]).
//!
//! No free slot is [`PoolExhausted`], an error the caller sees; nothing blocks.

use crate::ring::{RawRing, RingLayoutError};
use crate::segment::Segment;
use crate::sync::{AtomicU32, AtomicU64, Ordering, fence};
use std::fmt;
use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::Arc;

const POOL_MAGIC: u64 = 0x6d67_706f_6f6c_0002; // "mgpool" v2 (the fresh cursor)
/// Default slot size: one 4 KiB page of data.
pub const DEFAULT_SLOT_SIZE: usize = 4096;
/// Largest number of slots a pool may have (slot indices are 24 bits in a word).
pub const MAX_SLOTS: usize = 1 << 24;
/// Slots whose pages are mapped when a pool's segment is mapped, with the rings and the
/// pool's bookkeeping before them: 256 × 4 KiB = 1 MiB. A DSM cluster's most buffers in
/// flight at once (the run report's *buffer pool slots used*): 44–54 on Water 512 × 50
/// (2 × 1 and 2 × 2), 45–93 on EM3D, 104–260 on Water 4096 × 3 (2 × 1) — so their
/// messages pay (nearly) no page fault.
pub const WARM_SLOTS: usize = 256;

/// Every slot of the pool is in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "Tag-On buffer pool of site {site} is exhausted: all {slots} slots are in use (raise pool_slots or release received buffers sooner)"
)]
pub struct PoolExhausted {
    /// The site owning the pool.
    pub site: u16,
    /// Its number of slots.
    pub slots: u32,
}

/// A header named a slot that cannot be a live buffer (corrupted or malicious packet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadSlot {
    /// The slot index is past the end of the pool.
    #[error("slot {slot} is out of range (pool has {slots} slots)")]
    OutOfRange {
        /// Index found in the header.
        slot: u32,
        /// Slots in the pool.
        slots: u32,
    },
    /// The slot is free: no sender holds a reference to hand over.
    #[error("slot {0} is not in use (reference count 0)")]
    NotInUse(u32),
    /// The recorded length exceeds the slot size.
    #[error("slot {slot} claims {len} bytes, more than the slot size {slot_size}")]
    BadLength {
        /// Slot index.
        slot: u32,
        /// Recorded length.
        len: u32,
        /// Slot size.
        slot_size: u32,
    },
}

#[repr(C)]
struct PoolHeader {
    magic: u64,
    slot_size: u64,
    slots: u64,
    /// Offsets from the pool header.
    meta_offset: u64,
    free_offset: u64,
    data_offset: u64,
    /// Slots `fresh..slots` have never been handed out (see the module documentation).
    fresh: AtomicU32,
}

/// Per-slot bookkeeping, kept apart from the page-aligned data.
#[repr(C)]
struct SlotMeta {
    refs: AtomicU32,
    len: AtomicU32,
    /// The message's 64-bit tag (e.g. a page number), set by the sender.
    tag: AtomicU64,
}

/// Geometry of a pool inside a segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolLayout {
    slots: usize,
    slot_size: usize,
    meta_offset: usize,
    free_offset: usize,
    data_offset: usize,
    /// Total bytes from the pool header.
    pub(crate) size: usize,
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

impl PoolLayout {
    /// Layout of a pool of `slots` slots of `slot_size` bytes, placed at a page-aligned
    /// offset.
    pub(crate) fn new(slots: usize, slot_size: usize) -> PoolLayout {
        assert!(
            (1..=MAX_SLOTS).contains(&slots),
            "pool needs 1..={MAX_SLOTS} slots, got {slots}"
        );
        assert!(
            slot_size >= 64 && slot_size.is_multiple_of(64),
            "slot size {slot_size} must be a multiple of 64 bytes"
        );
        let ring_cap = slots.max(2).next_power_of_two();
        let ring = RawRing::<u32>::layout(ring_cap);
        let meta_offset = align_up(size_of::<PoolHeader>(), 64);
        let free_offset = align_up(meta_offset + slots * size_of::<SlotMeta>(), ring.align());
        let data_offset = align_up(free_offset + ring.size(), 4096);
        PoolLayout {
            slots,
            slot_size,
            meta_offset,
            free_offset,
            data_offset,
            size: data_offset + slots * slot_size,
        }
    }

    /// Bytes from the pool's first byte through its first [`WARM_SLOTS`] slots (see
    /// [`Pool::warm_end`]).
    pub(crate) fn warm_len(&self) -> usize {
        self.data_offset + self.slots.min(WARM_SLOTS) * self.slot_size
    }
}

/// A view of one site's buffer pool (own or mapped from a peer on the same machine).
pub struct Pool {
    site: u16,
    header: NonNull<PoolHeader>,
    meta: NonNull<SlotMeta>,
    data: NonNull<u8>,
    free: RawRing<u32>,
    slot_size: usize,
    slots: u32,
    /// See [`Pool::warm_end`].
    warm_end: usize,
    _segment: Arc<Segment>,
}

// SAFETY: shared state is atomics (refcounts, lengths, the free ring); slot data is written
// only through the unique `TagOnBuf` and read only after it is frozen and published.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("site", &self.site)
            .field("slots", &self.slots)
            .field("slot_size", &self.slot_size)
            .finish()
    }
}

impl Pool {
    /// Initializes a pool at `offset` in `segment` (which must be fresh) and returns a view.
    pub(crate) fn init(
        segment: &Arc<Segment>,
        offset: usize,
        layout: PoolLayout,
        site: u16,
    ) -> Arc<Pool> {
        assert_eq!(offset % 4096, 0, "pool offset must be page aligned");
        let base = segment
            .at(offset, layout.size)
            .expect("pool fits in its segment");
        // SAFETY: `base..base+layout.size` lies in the segment (checked by `at`), is page
        // aligned, and is not used by anything else (caller contract: a fresh region).
        unsafe {
            base.cast::<PoolHeader>().write(PoolHeader {
                magic: POOL_MAGIC,
                slot_size: layout.slot_size as u64,
                slots: layout.slots as u64,
                meta_offset: layout.meta_offset as u64,
                free_offset: layout.free_offset as u64,
                data_offset: layout.data_offset as u64,
                fresh: AtomicU32::new(0),
            });
        }
        // SAFETY: the meta array, ring and data lie inside the pool's bytes per `PoolLayout`.
        let (meta, ring_mem, data) = unsafe {
            (
                base.add(layout.meta_offset).cast::<SlotMeta>(),
                base.add(layout.free_offset),
                base.add(layout.data_offset),
            )
        };
        for i in 0..layout.slots {
            // SAFETY: slot metadata `i < slots` is inside the meta array, written once here.
            unsafe {
                meta.add(i).write(SlotMeta {
                    refs: AtomicU32::new(0),
                    len: AtomicU32::new(0),
                    tag: AtomicU64::new(0),
                })
            };
        }
        // SAFETY: the ring's bytes are reserved in the layout, aligned, and live as long as the
        // segment, which the Pool keeps alive.
        let free = unsafe {
            RawRing::<u32>::init(ring_mem, layout.slots.max(2).next_power_of_two(), None)
        };
        Arc::new(Pool {
            site,
            header: base.cast(),
            meta,
            data,
            free,
            slot_size: layout.slot_size,
            slots: layout.slots as u32,
            warm_end: offset + layout.warm_len(),
            _segment: segment.clone(),
        })
    }

    /// A view of a pool another process initialized at `offset` in `segment`.
    pub(crate) fn open(
        segment: &Arc<Segment>,
        offset: usize,
        site: u16,
    ) -> Result<Arc<Pool>, RingLayoutError> {
        let available = segment.len().saturating_sub(offset);
        let base =
            segment
                .at(offset, size_of::<PoolHeader>())
                .ok_or(RingLayoutError::OutOfBounds {
                    needed: size_of::<PoolHeader>(),
                    available,
                })?;
        // SAFETY: the header lies inside the mapping (checked by `at`).
        let h = unsafe { base.cast::<PoolHeader>().read() };
        if h.magic != POOL_MAGIC {
            return Err(RingLayoutError::BadMagic(h.magic));
        }
        let layout = PoolLayout::new(
            usize::try_from(h.slots).unwrap_or(0).clamp(1, MAX_SLOTS),
            usize::try_from(h.slot_size).unwrap_or(64).max(64),
        );
        if layout.size > available
            || h.data_offset as usize != layout.data_offset
            || h.meta_offset as usize != layout.meta_offset
            || h.free_offset as usize != layout.free_offset
        {
            return Err(RingLayoutError::OutOfBounds {
                needed: layout.size,
                available,
            });
        }
        // SAFETY: all three regions lie inside the checked `layout.size` bytes.
        let (meta, ring_mem, data) = unsafe {
            (
                base.add(layout.meta_offset).cast::<SlotMeta>(),
                base.add(layout.free_offset),
                base.add(layout.data_offset),
            )
        };
        // SAFETY: the ring was initialized by the creator with slot type u32 in this mapping,
        // which the Pool keeps alive.
        let free =
            unsafe { RawRing::<u32>::open(ring_mem, layout.data_offset - layout.free_offset)? };
        Ok(Arc::new(Pool {
            site,
            header: base.cast(),
            meta,
            data,
            free,
            slot_size: layout.slot_size,
            slots: layout.slots as u32,
            warm_end: offset + layout.warm_len(),
            _segment: segment.clone(),
        }))
    }

    /// A stand-alone pool of `slots` slots of `slot_size` bytes in private memory, owned by
    /// site 0 (for tests, benchmarks and single-process tools; sites create their own).
    ///
    /// # Errors
    /// [`SegmentError`](crate::segment::SegmentError) if the memory cannot be mapped.
    ///
    /// # Panics
    /// If `slots` is 0 or above 2^24, or `slot_size` is not a positive multiple of 64.
    pub fn new_private(
        slots: usize,
        slot_size: usize,
    ) -> Result<Arc<Pool>, crate::segment::SegmentError> {
        let layout = PoolLayout::new(slots, slot_size);
        let segment = Arc::new(Segment::private(layout.size)?);
        let pool = Pool::init(&segment, 0, layout, 0);
        segment.populate(pool.warm_end());
        Ok(pool)
    }

    /// The site that owns this pool (the `pool` field of Tag-On headers).
    pub fn site(&self) -> u16 {
        self.site
    }

    /// Data bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Slots currently free, returned or never used (approximate under concurrency).
    pub fn free_slots(&self) -> usize {
        self.free.len() + (self.slots - self.used_slots()) as usize
    }

    /// Slots handed out at least once: the most this pool has had in flight at once
    /// (see the module documentation), at most [`Pool::slots`].
    pub fn used_slots(&self) -> u32 {
        self.fresh().load(Ordering::Relaxed).min(self.slots)
    }

    /// Offset in the pool's segment just past its first [`WARM_SLOTS`] slots: what a
    /// process that maps the segment maps ahead ([`Segment::populate`]), with the rings
    /// and bookkeeping before it, so that the slots a run uses first pay no page fault,
    /// while the rest of the pool stays unmapped until a run has that many buffers in
    /// flight.
    pub(crate) fn warm_end(&self) -> usize {
        self.warm_end
    }

    #[inline]
    fn fresh(&self) -> &AtomicU32 {
        // SAFETY: the header lies at the start of the pool's bytes, initialized by its
        // creator (`init`; `open` checked its magic and layout), and lives as long as the
        // segment this pool holds; `fresh` is only accessed atomically.
        unsafe { &(*self.header.as_ptr()).fresh }
    }

    /// A slot never handed out, or `None` when every slot has been.
    #[inline]
    fn fresh_slot(&self) -> Option<u32> {
        let fresh = self.fresh();
        let mut n = fresh.load(Ordering::Relaxed);
        loop {
            if n >= self.slots {
                return None;
            }
            match fresh.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(n),
                Err(now) => n = now,
            }
        }
    }

    #[inline]
    fn meta(&self, slot: u32) -> &SlotMeta {
        debug_assert!(slot < self.slots);
        // SAFETY: `slot < slots` (all callers validate), so the entry is initialized and
        // lives as long as the segment this pool holds.
        unsafe { &*self.meta.as_ptr().add(slot as usize) }
    }

    #[inline]
    fn data_ptr(&self, slot: u32) -> *mut u8 {
        // SAFETY: `slot < slots`, so the slot's bytes are inside the data area.
        unsafe { self.data.as_ptr().add(slot as usize * self.slot_size) }
    }

    /// Takes a free slot as a writable buffer of [`Pool::slot_size`] bytes (length 0).
    ///
    /// # Errors
    /// [`PoolExhausted`] when every slot is in use.
    #[inline]
    pub fn alloc(self: &Arc<Self>) -> Result<TagOnBuf, PoolExhausted> {
        // A returned slot first, so that a run keeps reusing the pages it has mapped.
        let slot = loop {
            match self.free.pop() {
                // The free list lies in shared memory: an index past the end (a peer's
                // corrupted segment) is dropped, never used.
                Some(s) if s >= self.slots => continue,
                Some(s) => break s,
                None => {
                    break self.fresh_slot().ok_or(PoolExhausted {
                        site: self.site,
                        slots: self.slots,
                    })?;
                }
            }
        };
        let meta = self.meta(slot);
        meta.refs.store(1, Ordering::Relaxed);
        Ok(TagOnBuf {
            pool: self.clone(),
            slot,
            len: 0,
            tag: 0,
        })
    }

    /// Takes over the reference a sender passed with a Tag-On header naming `slot`
    /// (validated: a corrupted header is refused, never trusted).
    pub(crate) fn adopt(self: &Arc<Self>, slot: u32) -> Result<TagOnData, BadSlot> {
        if slot >= self.slots {
            return Err(BadSlot::OutOfRange {
                slot,
                slots: self.slots,
            });
        }
        let meta = self.meta(slot);
        if meta.refs.load(Ordering::Acquire) == 0 {
            return Err(BadSlot::NotInUse(slot));
        }
        let len = meta.len.load(Ordering::Relaxed);
        if len as usize > self.slot_size {
            return Err(BadSlot::BadLength {
                slot,
                len,
                slot_size: self.slot_size as u32,
            });
        }
        let tag = meta.tag.load(Ordering::Relaxed);
        Ok(TagOnData {
            pool: self.clone(),
            slot,
            len: len as usize,
            tag,
        })
    }

    #[inline]
    fn release(&self, slot: u32) {
        if self.meta(slot).refs.fetch_sub(1, Ordering::Release) == 1 {
            // Every reader's accesses happen before the slot is handed out again.
            fence(Ordering::Acquire);
            // Cannot fail: the free ring has room for every slot and this slot is not in it.
            let _ = self.free.push(slot);
        }
    }
}

/// A writable Tag-On buffer: the only reference to its slot. Fill it, then send it (or
/// [`freeze`](TagOnBuf::freeze) it to multicast). Dropping it returns the slot.
pub struct TagOnBuf {
    pool: Arc<Pool>,
    slot: u32,
    len: usize,
    tag: u64,
}

impl fmt::Debug for TagOnBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TagOnBuf")
            .field("site", &self.pool.site)
            .field("slot", &self.slot)
            .field("len", &self.len)
            .finish()
    }
}

impl TagOnBuf {
    /// Capacity in bytes (the pool's slot size).
    pub fn capacity(&self) -> usize {
        self.pool.slot_size
    }

    /// Current data length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no data has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole slot, to fill in place; set the data length with [`TagOnBuf::set_len`].
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        // SAFETY: this buffer holds the only reference to the slot (refcount 1, not yet
        // published), so nothing else reads or writes these `slot_size` bytes.
        unsafe {
            std::slice::from_raw_parts_mut(self.pool.data_ptr(self.slot), self.pool.slot_size)
        }
    }

    /// Sets the data length.
    ///
    /// # Panics
    /// If `len` exceeds [`TagOnBuf::capacity`].
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.pool.slot_size,
            "length {len} exceeds the slot size {}",
            self.pool.slot_size
        );
        self.len = len;
    }

    /// Sets the 64-bit tag that travels with the buffer (paper 004 §5.2: the Tag-On header's
    /// payload identifies what is shipped, e.g. the page number).
    pub fn set_tag(&mut self, tag: u64) {
        self.tag = tag;
    }

    /// Copies `data` into the buffer and sets the length.
    ///
    /// # Panics
    /// If `data` is longer than [`TagOnBuf::capacity`].
    pub fn fill(&mut self, data: &[u8]) {
        self.as_mut_capacity()[..data.len()].copy_from_slice(data);
        self.set_len(data.len());
    }

    /// The data written so far.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as in `as_mut_capacity`; `len <= slot_size`.
        unsafe { std::slice::from_raw_parts(self.pool.data_ptr(self.slot), self.len) }
    }

    /// Makes the buffer read-only and shareable: clones of the result reference the same
    /// slot (multicast without copying, paper 004 §5.2).
    pub fn freeze(self) -> TagOnData {
        let this = std::mem::ManuallyDrop::new(self);
        let meta = this.pool.meta(this.slot);
        meta.len.store(this.len as u32, Ordering::Relaxed);
        meta.tag.store(this.tag, Ordering::Relaxed);
        // SAFETY: `this` is never used or dropped again; the pool reference moves out once.
        let pool = unsafe { std::ptr::read(&this.pool) };
        TagOnData {
            pool,
            slot: this.slot,
            len: this.len,
            tag: this.tag,
        }
    }
}

impl Drop for TagOnBuf {
    fn drop(&mut self) {
        self.pool.release(self.slot);
    }
}

/// A read-only reference to a Tag-On buffer: what a receiver gets with a Tag-On header,
/// and what a sender multicasts. Clone = one more reference to the same slot (no copy).
/// The slot returns to its pool when the last reference drops.
pub struct TagOnData {
    pool: Arc<Pool>,
    slot: u32,
    len: usize,
    tag: u64,
}

impl fmt::Debug for TagOnData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TagOnData")
            .field("site", &self.pool.site)
            .field("slot", &self.slot)
            .field("len", &self.len)
            .finish()
    }
}

impl Clone for TagOnData {
    fn clone(&self) -> Self {
        self.pool
            .meta(self.slot)
            .refs
            .fetch_add(1, Ordering::Relaxed);
        TagOnData {
            pool: self.pool.clone(),
            slot: self.slot,
            len: self.len,
            tag: self.tag,
        }
    }
}

impl From<TagOnBuf> for TagOnData {
    fn from(buf: TagOnBuf) -> Self {
        buf.freeze()
    }
}

impl TagOnData {
    /// The data.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the slot is frozen (no writer exists once a TagOnData does) and we hold a
        // reference, so its first `len` bytes stay valid and unchanged.
        unsafe { std::slice::from_raw_parts(self.pool.data_ptr(self.slot), self.len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The sender's 64-bit tag (see [`TagOnBuf::set_tag`]).
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The site owning the slot and the slot index (as named in a Tag-On header).
    pub fn location(&self) -> (u16, u32) {
        (self.pool.site, self.slot)
    }

    /// Gives up this reference without releasing the slot: the receiver of the header
    /// that names the slot takes the slot's reference over (see [`Pool::adopt`], which
    /// brings its own reference to the pool). The reference to the pool itself is
    /// dropped here; before the twenty-third session it was forgotten with the rest, so
    /// a pool that had carried one Tag-On message was never freed, nor its segment
    /// unmapped (17 MiB per site of `experiment loggp-calibrate`'s loopback pairs: 6.4 GB
    /// resident after 9 rounds).
    pub(crate) fn into_transfer(self) -> (u16, u32) {
        let loc = self.location();
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so the pool reference is moved
        // out exactly once; dropping it does not touch the slot's reference count, which
        // stays with the header.
        drop(unsafe { std::ptr::read(&this.pool) });
        loc
    }
}

impl std::ops::Deref for TagOnData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for TagOnData {
    fn drop(&mut self) {
        self.pool.release(self.slot);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn pool(slots: usize) -> Arc<Pool> {
        let layout = PoolLayout::new(slots, 4096);
        let seg = Arc::new(Segment::private(layout.size).unwrap());
        Pool::init(&seg, 0, layout, 3)
    }

    #[test]
    fn alloc_fill_freeze_release() {
        let p = pool(2);
        let mut a = p.alloc().unwrap();
        a.fill(b"hello");
        a.set_tag(0xfeed);
        let b = p.alloc().unwrap();
        assert_eq!(p.alloc().unwrap_err(), PoolExhausted { site: 3, slots: 2 });
        drop(b);
        let frozen = a.freeze();
        let copy = frozen.clone();
        assert_eq!(&*copy, b"hello");
        assert_eq!(copy.tag(), 0xfeed);
        drop(frozen);
        assert_eq!(p.free_slots(), 1, "a clone still holds the slot");
        drop(copy);
        assert_eq!(p.free_slots(), 2);
    }

    #[test]
    fn returned_slots_are_reused_before_fresh_ones() {
        let p = pool(8);
        assert_eq!((p.used_slots(), p.free_slots()), (0, 8));
        for _ in 0..100 {
            let mut b = p.alloc().unwrap();
            b.fill(b"x");
            drop(b.freeze());
        }
        assert_eq!(
            p.used_slots(),
            1,
            "one buffer in flight at a time: one slot"
        );
        let held: Vec<_> = (0..3).map(|_| p.alloc().unwrap()).collect();
        assert_eq!((p.used_slots(), p.free_slots()), (3, 5));
        drop(held);
        let again: Vec<_> = (0..8).map(|_| p.alloc().unwrap()).collect();
        assert_eq!(p.used_slots(), 8);
        let mut slots: Vec<u32> = again.iter().map(|b| b.slot).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..8).collect::<Vec<_>>(), "every slot once");
        assert_eq!(p.alloc().unwrap_err(), PoolExhausted { site: 3, slots: 8 });
    }

    #[test]
    fn a_slot_index_past_the_pool_on_the_free_list_is_dropped() {
        let p = pool(2);
        // A peer's corrupted free list (it lies in shared memory).
        p.free.push(7).unwrap();
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        assert_eq!((a.slot, b.slot), (0, 1));
        assert!(p.alloc().is_err());
    }

    #[test]
    fn a_pool_maps_its_first_slots_ahead() {
        let layout = PoolLayout::new(4 * WARM_SLOTS, 4096);
        let seg = Arc::new(Segment::private(layout.size).unwrap());
        let p = Pool::init(&seg, 0, layout, 0);
        assert_eq!(p.warm_end(), layout.data_offset + WARM_SLOTS * 4096);
        let small = pool(3);
        assert_eq!(
            small.warm_end(),
            PoolLayout::new(3, 4096).size,
            "all of a small pool"
        );
    }

    #[test]
    fn a_transfer_keeps_the_slot_but_not_the_pool() {
        let p = pool(2);
        let before = Arc::strong_count(&p);
        let mut b = p.alloc().unwrap();
        b.fill(b"page");
        let (_, slot) = b.freeze().into_transfer();
        assert_eq!(
            Arc::strong_count(&p),
            before,
            "the sender's pool reference is gone"
        );
        assert_eq!(p.free_slots(), 1, "the slot stays with the header");
        let got = p.adopt(slot).unwrap();
        assert_eq!(&*got, b"page");
        drop(got);
        assert_eq!(p.free_slots(), 2);
        assert_eq!(
            Arc::strong_count(&p),
            before,
            "nothing holds the pool any more"
        );
    }

    #[test]
    fn adopt_validates_the_slot() {
        let p = pool(4);
        assert_eq!(
            p.adopt(4).unwrap_err(),
            BadSlot::OutOfRange { slot: 4, slots: 4 }
        );
        assert!(matches!(p.adopt(0), Err(BadSlot::NotInUse(_))));
        let mut b = p.alloc().unwrap();
        b.fill(&[7; 100]);
        let (_, slot) = b.freeze().into_transfer();
        let got = p.adopt(slot).unwrap();
        assert_eq!(got.len(), 100);
        drop(got);
        assert_eq!(p.free_slots(), 4);
    }

    #[test]
    fn a_peer_mapping_sees_the_same_pool() {
        let layout = PoolLayout::new(8, 4096);
        let name = crate::segment::unique_name("pool");
        let seg = Arc::new(Segment::create_shared(&name, layout.size).unwrap());
        let mine = Pool::init(&seg, 0, layout, 1);
        let peer_seg = Arc::new(Segment::open_shared(&name).unwrap());
        let theirs = Pool::open(&peer_seg, 0, 1).unwrap();
        let mut b = mine.alloc().unwrap();
        b.fill(b"across mappings");
        let (_, slot) = b.freeze().into_transfer();
        let got = theirs.adopt(slot).unwrap();
        assert_eq!(&*got, b"across mappings");
        drop(got);
        assert_eq!(mine.free_slots(), 8);
    }
}
