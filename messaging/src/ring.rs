//! The bounded lock-free MPMC FIFO under every Express and Tag-On queue.
//!
//! Any number of threads (in one process, or in several processes mapping the same
//! segment) push and pop with no lock. A push is committed by one atomic claim of the tail
//! (a CAS, like the "packet assignment" of paper 000 §3.3) followed by a release store that
//! publishes the slot; a pop likewise claims the head. This is Vyukov's bounded MPMC queue,
//! as in crossbeam's `ArrayQueue`, with the layout of paper 000 §3.1: **one slot per cache
//! line**, so that neighbouring messages never share a line, and no pointers in the shared
//! structure — the ring is a header followed by its slots, found by offset.
//!
//! Each slot holds a sequence *stamp*. Slot `i` starts with stamp `i`. A producer at tail
//! position `p` may write slot `p mod cap` only when its stamp is `p`; it then stores
//! `p + 1`. A consumer at head position `p` may read the slot when its stamp is `p + 1` and
//! then stores `p + cap`, handing the slot to the producer of the next lap. Positions are
//! 64-bit and never wrap in practice (2^64 messages).
//!
//! A full ring hands the value back ([`Ring::push`] returns `Err(value)`); an empty ring
//! answers `None` at once. Nothing is ever dropped.

use crate::doorbell::Doorbell;
use crate::shm_safe::ShmSafe;
use crate::sync::{AtomicU64, Backoff, Ordering, UnsafeCell};
use crossbeam_utils::CachePadded;
use std::alloc::Layout;
use std::marker::PhantomData;
use std::mem::{MaybeUninit, size_of};
use std::ptr::NonNull;

const RING_MAGIC: u64 = 0x6d67_7269_6e67_0001; // "mgring" v1

/// The fixed part of a ring, at the start of its memory block. Producers write `tail`,
/// consumers write `head`; each sits on its own cache line(s).
#[repr(C)]
pub(crate) struct RingHeader {
    tail: CachePadded<AtomicU64>,
    head: CachePadded<AtomicU64>,
    meta: CachePadded<RingMeta>,
}

/// Immutable after initialization; read by a peer that maps the ring.
#[repr(C)]
struct RingMeta {
    magic: u64,
    capacity: u64,
    slot_size: u64,
    /// Byte offset from the header to this ring's [`Doorbell`], or 0 for none.
    doorbell_offset: i64,
}

/// One message slot; `align(64)` gives every slot its own cache line (paper 000 §3.1).
#[repr(C, align(64))]
struct Slot<T> {
    stamp: AtomicU64,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// Why a block of memory does not hold a usable ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingLayoutError {
    /// The magic number is wrong: not a ring, or a ring from another version.
    #[error("no ring at this offset (magic {0:#x})")]
    BadMagic(u64),
    /// The capacity is not a power of two, or the slot size does not match this build.
    #[error(
        "ring has capacity {capacity} and slot size {slot_size}; this build expects a power of two and {expected}"
    )]
    BadGeometry {
        /// Capacity found.
        capacity: u64,
        /// Slot size found, bytes.
        slot_size: u64,
        /// Slot size this build uses, bytes.
        expected: u64,
    },
    /// The ring would extend past the end of the memory block.
    #[error("ring of {needed} bytes does not fit in the {available} bytes left in the segment")]
    OutOfBounds {
        /// Bytes the ring needs.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
}

/// A ring over memory owned elsewhere (a segment or a heap block): the ring's owner keeps
/// the memory alive for as long as any `RawRing` copy is used.
pub(crate) struct RawRing<T> {
    header: NonNull<RingHeader>,
    slots: NonNull<Slot<T>>,
    mask: u64,
    doorbell: Option<NonNull<Doorbell>>,
    _marker: PhantomData<T>,
}

impl<T> Clone for RawRing<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for RawRing<T> {}

// SAFETY: a RawRing is a view of a structure whose every shared field is an atomic or is
// accessed only under the stamp protocol (a slot's value is written by the one producer
// that claimed it and read by the one consumer that claimed it, ordered by release/acquire
// on the stamp). Moving values of `T: Send` between threads through it is what `Send` allows.
unsafe impl<T: Send> Send for RawRing<T> {}
// SAFETY: as above; all methods take `&self` and synchronize through atomics.
unsafe impl<T: Send> Sync for RawRing<T> {}

impl<T: ShmSafe> RawRing<T> {
    /// A view of a ring that another process (or earlier code) initialized at `mem`,
    /// validating its header against this build and `available` bytes. Only plain-data
    /// element types ([`ShmSafe`]) may be read from memory another process writes.
    ///
    /// # Safety
    /// `mem` must point into a live mapping with at least `available` bytes from `mem`,
    /// aligned for [`RingHeader`], that outlives every copy of the view; the ring there must
    /// have been initialized by [`RawRing::init`] with the same `T`. The caller must check
    /// [`RawRing::doorbell_ptr`] against the mapping before the ring is used.
    pub(crate) unsafe fn open(
        mem: NonNull<u8>,
        available: usize,
    ) -> Result<RawRing<T>, RingLayoutError> {
        if available < size_of::<RingHeader>() {
            return Err(RingLayoutError::OutOfBounds {
                needed: size_of::<RingHeader>(),
                available,
            });
        }
        let header = mem.cast::<RingHeader>();
        // SAFETY: the header lies within `available` bytes of a live mapping (checked above).
        let meta = unsafe { &(*header.as_ptr()).meta };
        if meta.magic != RING_MAGIC {
            return Err(RingLayoutError::BadMagic(meta.magic));
        }
        let expected = size_of::<Slot<T>>() as u64;
        if !meta.capacity.is_power_of_two() || meta.capacity < 2 || meta.slot_size != expected {
            return Err(RingLayoutError::BadGeometry {
                capacity: meta.capacity,
                slot_size: meta.slot_size,
                expected,
            });
        }
        let capacity = usize::try_from(meta.capacity).unwrap_or(usize::MAX);
        let needed =
            size_of::<RingHeader>().saturating_add(capacity.saturating_mul(size_of::<Slot<T>>()));
        if needed > available {
            return Err(RingLayoutError::OutOfBounds { needed, available });
        }
        let doorbell = if meta.doorbell_offset == 0 {
            None
        } else {
            // Not dereferenced here: the caller checks it against the doorbells it knows.
            NonNull::new(
                mem.as_ptr()
                    .wrapping_offset(meta.doorbell_offset as isize)
                    .cast::<Doorbell>(),
            )
        };
        // SAFETY: within the bounds checked above.
        let slots = unsafe { mem.add(size_of::<RingHeader>()) }.cast::<Slot<T>>();
        Ok(RawRing {
            header,
            slots,
            mask: meta.capacity - 1,
            doorbell,
            _marker: PhantomData,
        })
    }
}

impl<T> RawRing<T> {
    /// Bytes a ring of `capacity` slots occupies, and its alignment.
    pub(crate) fn layout(capacity: usize) -> Layout {
        let bytes = size_of::<RingHeader>() + capacity * size_of::<Slot<T>>();
        Layout::from_size_align(bytes, align_of::<RingHeader>().max(align_of::<Slot<T>>()))
            .expect("ring layout overflows")
    }

    /// Initializes a ring of `capacity` slots (a power of two ≥ 2) in `mem` and returns a view.
    ///
    /// # Safety
    /// `mem` must be valid for writes of `Self::layout(capacity).size()` bytes, aligned to
    /// `Self::layout(capacity).align()`, not in use by anything else, and must outlive every
    /// copy of the returned view. `doorbell`, if given, must be valid and outlive them too,
    /// and lie in the same mapping as `mem` (it is stored as an offset).
    pub(crate) unsafe fn init(
        mem: NonNull<u8>,
        capacity: usize,
        doorbell: Option<NonNull<Doorbell>>,
    ) -> RawRing<T> {
        assert!(
            capacity.is_power_of_two() && capacity >= 2,
            "ring capacity {capacity} must be a power of two ≥ 2"
        );
        let header = mem.cast::<RingHeader>();
        let doorbell_offset = doorbell.map_or(0, |d| {
            d.as_ptr() as isize as i64 - mem.as_ptr() as isize as i64
        });
        // SAFETY: the caller guarantees `mem` is valid, aligned and exclusively ours for the
        // header and `capacity` slots that follow it.
        unsafe {
            header.write(RingHeader {
                tail: CachePadded::new(AtomicU64::new(0)),
                head: CachePadded::new(AtomicU64::new(0)),
                meta: CachePadded::new(RingMeta {
                    magic: RING_MAGIC,
                    capacity: capacity as u64,
                    slot_size: size_of::<Slot<T>>() as u64,
                    doorbell_offset,
                }),
            });
        }
        // SAFETY: the slots start right after the header, inside the caller's block.
        let slots = unsafe { mem.add(size_of::<RingHeader>()) }.cast::<Slot<T>>();
        for i in 0..capacity {
            // SAFETY: slot `i < capacity` lies inside the block; it is written once here.
            unsafe {
                slots.add(i).write(Slot {
                    stamp: AtomicU64::new(i as u64),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                });
            }
        }
        RawRing {
            header,
            slots,
            mask: capacity as u64 - 1,
            doorbell,
            _marker: PhantomData,
        }
    }

    #[inline(always)]
    fn header(&self) -> &RingHeader {
        // SAFETY: the header is initialized and outlives the view (constructor contract).
        unsafe { self.header.as_ref() }
    }

    #[inline(always)]
    fn slot(&self, pos: u64) -> &Slot<T> {
        // SAFETY: `pos & mask < capacity`, so the slot is inside the initialized array,
        // which outlives the view.
        unsafe { &*self.slots.as_ptr().add((pos & self.mask) as usize) }
    }

    /// Number of slots.
    pub(crate) fn capacity(&self) -> usize {
        (self.mask + 1) as usize
    }

    /// Where this ring's doorbell is (for validating a peer's layout).
    pub(crate) fn doorbell_ptr(&self) -> Option<NonNull<Doorbell>> {
        self.doorbell
    }

    /// The doorbell senders ring after a push, if the ring has one.
    pub(crate) fn doorbell(&self) -> Option<&Doorbell> {
        // SAFETY: the doorbell outlives the view (constructor contract).
        self.doorbell.map(|d| unsafe { &*d.as_ptr() })
    }

    /// Appends `value`; on a full ring returns it back as `Err(value)`.
    ///
    /// The commit point is the CAS that claims the tail (paper 000 §3.3); the release store
    /// of the stamp then publishes the value. Rings the doorbell if a receiver sleeps.
    #[inline]
    pub(crate) fn push(&self, value: T) -> Result<(), T> {
        let header = self.header();
        let mut backoff = Backoff::default();
        let mut pos = header.tail.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(pos);
            let stamp = slot.stamp.load(Ordering::Acquire);
            let diff = stamp.wrapping_sub(pos) as i64;
            if diff == 0 {
                // SeqCst: orders the claim before the doorbell's waiter check (see doorbell.rs).
                match header.tail.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the successful CAS claimed `pos` for this producer,
                        // which publishes it once, here.
                        unsafe { self.publish(pos, value) };
                        return Ok(());
                    }
                    Err(current) => {
                        pos = current;
                        backoff.spin();
                    }
                }
            } else if diff < 0 {
                // The slot still holds last lap's value: the ring is full.
                return Err(value);
            } else {
                // Another producer claimed this position; catch up.
                backoff.spin();
                pos = header.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Removes the oldest value, or `None` at once if the ring is empty.
    #[inline]
    pub(crate) fn pop(&self) -> Option<T> {
        let header = self.header();
        let mut backoff = Backoff::default();
        let mut pos = header.head.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(pos);
            let stamp = slot.stamp.load(Ordering::Acquire);
            let diff = stamp.wrapping_sub(pos + 1) as i64;
            if diff == 0 {
                match header.head.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the stamp (acquired above) says the producer of position
                        // `pos` has written the value; the CAS made us its only consumer.
                        let value = slot.value.with(|v| unsafe { v.read().assume_init() });
                        slot.stamp.store(pos + self.mask + 1, Ordering::Release);
                        return Some(value);
                    }
                    Err(current) => {
                        pos = current;
                        backoff.spin();
                    }
                }
            } else if diff < 0 {
                return None;
            } else {
                backoff.spin();
                pos = header.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Claims the next position as [`RawRing::push`] does and returns it, without
    /// writing it: the state of a producer preempted between its claim and its write
    /// (tests; the ring must not be full).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn claim_unwritten(&self) -> u64 {
        let header = self.header();
        let pos = header.tail.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            self.slot(pos).stamp.load(Ordering::Acquire),
            pos,
            "the ring has room"
        );
        pos
    }

    /// Writes `value` at `pos`, claimed by [`RawRing::claim_unwritten`], as the rest of
    /// [`RawRing::push`] does (tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn write_claimed(&self, pos: u64, value: T) {
        // SAFETY: `pos` came from `claim_unwritten` (this test helper's contract) and is
        // published once, here.
        unsafe { self.publish(pos, value) };
    }

    /// Writes `value` into the slot at `pos`, publishes it with the slot's stamp and
    /// rings the doorbell if a receiver sleeps.
    ///
    /// # Safety
    /// The caller must have claimed `pos` (the tail's CAS in [`RawRing::push`]) and not
    /// published it yet: it is then the slot's only writer, and no consumer reads the
    /// slot before the stamp says it is written.
    #[inline(always)]
    unsafe fn publish(&self, pos: u64, value: T) {
        let slot = self.slot(pos);
        // SAFETY: the caller claimed `pos` and has not published it (this function's
        // contract), so no other producer writes this slot and no consumer reads it
        // before the stamp below.
        slot.value
            .with_mut(|v| unsafe { v.write(MaybeUninit::new(value)) });
        slot.stamp.store(pos + 1, Ordering::Release);
        if let Some(bell) = self.doorbell() {
            bell.ring();
        }
    }

    /// True if a producer has claimed a position no consumer has taken yet (the value may
    /// still be in flight). Used by the doorbell protocol; `SeqCst` on purpose.
    #[inline]
    pub(crate) fn has_claimed(&self) -> bool {
        let header = self.header();
        header.tail.load(Ordering::SeqCst) != header.head.load(Ordering::SeqCst)
    }

    /// Approximate number of queued values (exact when no operation is in flight).
    pub(crate) fn len(&self) -> usize {
        let header = self.header();
        let tail = header.tail.load(Ordering::Relaxed);
        let head = header.head.load(Ordering::Relaxed);
        tail.saturating_sub(head).min(self.mask + 1) as usize
    }
}

/// A ring that owns its memory on the heap: used inside one process (INI send queues, the
/// loom tests), where no peer needs to map it.
pub struct HeapRing<T> {
    raw: RawRing<T>,
    block: NonNull<u8>,
    layout: Layout,
}

// SAFETY: see RawRing; the heap block is owned and freed only in Drop.
unsafe impl<T: Send> Send for HeapRing<T> {}
// SAFETY: see RawRing.
unsafe impl<T: Send> Sync for HeapRing<T> {}

impl<T> HeapRing<T> {
    /// A ring of `capacity` slots (rounded up to a power of two, at least 2).
    pub fn new(capacity: usize) -> HeapRing<T> {
        let capacity = capacity.max(2).next_power_of_two();
        let layout = RawRing::<T>::layout(capacity);
        // SAFETY: the layout has non-zero size (the header alone is several cache lines).
        let block = NonNull::new(unsafe { std::alloc::alloc(layout) })
            .unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // SAFETY: `block` is a fresh allocation of exactly `layout`, freed only in Drop,
        // after the ring (and every borrow of it) is gone.
        let raw = unsafe { RawRing::init(block, capacity, None) };
        HeapRing { raw, block, layout }
    }

    /// Appends `value`; a full ring returns it as `Err(value)`.
    #[inline]
    pub fn push(&self, value: T) -> Result<(), T> {
        self.raw.push(value)
    }

    /// Removes the oldest value, or `None` at once if empty.
    #[inline]
    pub fn pop(&self) -> Option<T> {
        self.raw.pop()
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.raw.capacity()
    }

    /// Approximate number of queued values.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// True if nothing is queued (approximate under concurrency).
    pub fn is_empty(&self) -> bool {
        !self.raw.has_claimed()
    }
}

impl<T> Drop for HeapRing<T> {
    fn drop(&mut self) {
        while self.raw.pop().is_some() {}
        let capacity = self.raw.capacity();
        // SAFETY: we own the block; no other reference exists (`&mut self`). Dropping the
        // header and slots in place runs the (loom) atomics' destructors; the values were
        // drained above, and `MaybeUninit` never drops its contents.
        unsafe {
            std::ptr::drop_in_place(self.raw.header.as_ptr());
            for i in 0..capacity {
                std::ptr::drop_in_place(self.raw.slots.as_ptr().add(i));
            }
            std::alloc::dealloc(self.block.as_ptr(), self.layout);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fifo_full_and_empty() {
        let ring = HeapRing::<u64>::new(4);
        assert_eq!(ring.pop(), None);
        for i in 0..4 {
            ring.push(i).unwrap();
        }
        assert_eq!(ring.push(99), Err(99), "a full ring hands the value back");
        assert_eq!(ring.len(), 4);
        for i in 0..4 {
            assert_eq!(ring.pop(), Some(i));
        }
        assert_eq!(ring.pop(), None);
        for lap in 0..1000u64 {
            ring.push(lap).unwrap();
            assert_eq!(ring.pop(), Some(lap));
        }
    }

    #[test]
    fn one_slot_per_cache_line() {
        assert_eq!(size_of::<Slot<u64>>(), 64);
        assert_eq!(align_of::<Slot<u64>>(), 64);
    }

    #[test]
    fn open_validates_the_header() {
        let ring = HeapRing::<u64>::new(8);
        let size = RawRing::<u64>::layout(8).size();
        // SAFETY: the block is live for the test and holds a u64 ring of `size` bytes.
        let view = unsafe { RawRing::<u64>::open(ring.block, size) }.unwrap();
        view.push(7).unwrap();
        assert_eq!(ring.pop(), Some(7));
        // SAFETY: as above; a too-small bound must be refused, not read past.
        let short = unsafe { RawRing::<u64>::open(ring.block, size - 1) };
        assert!(matches!(short, Err(RingLayoutError::OutOfBounds { .. })));
        // SAFETY: as above; a different slot type has a different slot size... same here, so
        // check the magic path with a corrupted copy instead.
        let mut bytes = vec![0u8; size + 128];
        let p = NonNull::new(
            bytes
                .as_mut_ptr()
                .wrapping_add(bytes.as_ptr().align_offset(128)),
        )
        .unwrap();
        // SAFETY: `p` points to at least `size` zeroed bytes of `bytes`, alive here.
        let bad = unsafe { RawRing::<u64>::open(p, size) };
        assert!(matches!(bad, Err(RingLayoutError::BadMagic(0))));
    }
}
