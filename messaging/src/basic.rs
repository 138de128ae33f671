//! Basic messages: variable length up to [`BASIC_MAX`] bytes in a ring guarded by a lock.
//!
//! This is the conventional design that paper 004 §6 measures Express and Tag-On against:
//! a sender must take the queue's lock, copy the message in, advance the tail and unlock;
//! a receiver likewise. It is kept as a real, usable queue kind (and the baseline of the
//! `tagon_vs_basic` benchmark), not because the hot paths need it.
//!
//! The lock is a spin-then-yield lock word inside the ring, so a Basic ring in a shared
//! segment is usable from several processes.

use crate::doorbell::Doorbell;
use crate::sync::{AtomicU32, AtomicU64, Backoff, Ordering, UnsafeCell};
use crate::word::{Handler, SourceId, Word};
use crossbeam_utils::CachePadded;
use std::alloc::Layout;
use std::fmt;
use std::mem::size_of;
use std::ptr::NonNull;

/// Largest Basic message payload, bytes.
pub const BASIC_MAX: usize = 256;
const BASIC_MAGIC: u64 = 0x6d67_6261_7369_0001; // "mgbasi" v1

/// A Basic payload longer than [`BASIC_MAX`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Basic message of {0} bytes exceeds the {BASIC_MAX}-byte limit (use Tag-On or bulk)")]
pub struct BasicTooLong(pub usize);

/// A received Basic message (copied out of the ring).
#[derive(Clone)]
pub struct BasicMsg {
    /// Handler index.
    pub handler: Handler,
    /// Who sent it, as a name in the receiver's destination table.
    pub source: SourceId,
    len: u16,
    data: [u8; BASIC_MAX],
}

impl BasicMsg {
    /// The payload.
    pub fn data(&self) -> &[u8] {
        &self.data[..self.len as usize]
    }
}

impl fmt::Debug for BasicMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicMsg")
            .field("handler", &self.handler)
            .field("source", &self.source)
            .field("len", &self.len)
            .finish()
    }
}

#[repr(C)]
struct BasicHeader {
    lock: CachePadded<AtomicU32>,
    /// Positions, written under the lock; atomics so the doorbell protocol may read them.
    tail: CachePadded<AtomicU64>,
    head: CachePadded<AtomicU64>,
    magic: u64,
    capacity: u64,
    doorbell_offset: i64,
}

#[repr(C, align(64))]
struct BasicSlot {
    word: u64,
    len: u32,
    data: [u8; BASIC_MAX],
}

/// A lock-guarded ring of Basic messages over memory owned elsewhere (see [`crate::ring`]
/// for the ownership contract).
#[derive(Clone, Copy)]
pub(crate) struct BasicRing {
    header: NonNull<BasicHeader>,
    slots: NonNull<UnsafeCell<BasicSlot>>,
    capacity: u64,
    doorbell: Option<NonNull<Doorbell>>,
}

// SAFETY: slot contents are accessed only while holding the ring's lock (acquire on take,
// release on drop), so at most one thread touches a slot at a time; everything else is atomic.
unsafe impl Send for BasicRing {}
// SAFETY: as above.
unsafe impl Sync for BasicRing {}

struct LockGuard<'a>(&'a AtomicU32);

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

impl BasicRing {
    /// Bytes and alignment of a ring with `capacity` slots.
    pub(crate) fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(
            size_of::<BasicHeader>() + capacity * size_of::<BasicSlot>(),
            align_of::<BasicHeader>().max(64),
        )
        .expect("basic ring layout")
    }

    /// Initializes a ring in `mem`.
    ///
    /// # Safety
    /// As [`crate::ring::RawRing::init`]: `mem` valid, aligned, exclusively ours for
    /// `layout(capacity)` bytes and outliving every copy of the view; `doorbell` in the same
    /// mapping.
    pub(crate) unsafe fn init(
        mem: NonNull<u8>,
        capacity: usize,
        doorbell: Option<NonNull<Doorbell>>,
    ) -> BasicRing {
        assert!(capacity >= 1);
        let doorbell_offset = doorbell.map_or(0, |d| {
            d.as_ptr() as isize as i64 - mem.as_ptr() as isize as i64
        });
        let header = mem.cast::<BasicHeader>();
        // SAFETY: caller contract: the block is ours, valid and aligned.
        unsafe {
            header.write(BasicHeader {
                lock: CachePadded::new(AtomicU32::new(0)),
                tail: CachePadded::new(AtomicU64::new(0)),
                head: CachePadded::new(AtomicU64::new(0)),
                magic: BASIC_MAGIC,
                capacity: capacity as u64,
                doorbell_offset,
            });
        }
        // SAFETY: slots follow the header inside the block; zero bytes are a valid empty slot.
        let slots = unsafe { mem.add(size_of::<BasicHeader>()) }.cast::<UnsafeCell<BasicSlot>>();
        for i in 0..capacity {
            // SAFETY: slot `i` is inside the block, written once here.
            unsafe {
                slots.add(i).write(UnsafeCell::new(BasicSlot {
                    word: 0,
                    len: 0,
                    data: [0; BASIC_MAX],
                }))
            };
        }
        BasicRing {
            header,
            slots,
            capacity: capacity as u64,
            doorbell,
        }
    }

    /// A view of a ring initialized elsewhere in the same segment (validated).
    ///
    /// # Safety
    /// As [`crate::ring::RawRing::open`], including the doorbell check.
    pub(crate) unsafe fn open(mem: NonNull<u8>, available: usize) -> Option<BasicRing> {
        if available < size_of::<BasicHeader>() {
            return None;
        }
        let header = mem.cast::<BasicHeader>();
        // SAFETY: the header lies inside the `available` bytes (checked above).
        let h = unsafe { header.as_ref() };
        let capacity = usize::try_from(h.capacity).ok()?;
        if h.magic != BASIC_MAGIC || capacity == 0 || Self::layout(capacity).size() > available {
            return None;
        }
        let doorbell = if h.doorbell_offset == 0 {
            None
        } else {
            // Not dereferenced here: the caller checks it against the doorbells it knows.
            NonNull::new(
                mem.as_ptr()
                    .wrapping_offset(h.doorbell_offset as isize)
                    .cast::<Doorbell>(),
            )
        };
        // SAFETY: inside the checked bounds.
        let slots = unsafe { mem.add(size_of::<BasicHeader>()) }.cast::<UnsafeCell<BasicSlot>>();
        Some(BasicRing {
            header,
            slots,
            capacity: h.capacity,
            doorbell,
        })
    }

    /// Where this ring's doorbell is (for validating a peer's layout).
    pub(crate) fn doorbell_ptr(&self) -> Option<NonNull<Doorbell>> {
        self.doorbell
    }

    fn header(&self) -> &BasicHeader {
        // SAFETY: initialized and outlives the view (constructor contract).
        unsafe { self.header.as_ref() }
    }

    fn slot(&self, pos: u64) -> &UnsafeCell<BasicSlot> {
        // SAFETY: `pos % capacity` indexes the initialized slot array.
        unsafe { &*self.slots.as_ptr().add((pos % self.capacity) as usize) }
    }

    fn lock(&self) -> LockGuard<'_> {
        let word = &*self.header().lock;
        let mut backoff = Backoff::default();
        while word
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // The holder is inside a few stores; if it was preempted on this CPU, nap
            // once the back-off is over so that it can finish (see `sync::nap`).
            backoff.snooze_or_nap();
        }
        LockGuard(word)
    }

    /// Appends a message; `Ok(false)` if the ring is full (nothing written).
    ///
    /// # Errors
    /// [`BasicTooLong`] if `data` exceeds [`BASIC_MAX`].
    pub(crate) fn push(
        &self,
        handler: Handler,
        source: SourceId,
        data: &[u8],
    ) -> Result<bool, BasicTooLong> {
        if data.len() > BASIC_MAX {
            return Err(BasicTooLong(data.len()));
        }
        let h = self.header();
        {
            let _guard = self.lock();
            let tail = h.tail.load(Ordering::Relaxed);
            if tail - h.head.load(Ordering::Relaxed) >= self.capacity {
                return Ok(false);
            }
            self.slot(tail).with_mut(|s| {
                // SAFETY: we hold the lock, so no other thread accesses this slot.
                let s = unsafe { &mut *s };
                s.word = Word::express(handler, source, 0).0;
                s.len = data.len() as u32;
                s.data[..data.len()].copy_from_slice(data);
            });
            // SeqCst: pairs with the doorbell's waiter registration (see doorbell.rs).
            h.tail.store(tail + 1, Ordering::SeqCst);
        }
        if let Some(bell) = self.doorbell {
            // SAFETY: the doorbell outlives the view (constructor contract).
            unsafe { bell.as_ref() }.ring();
        }
        Ok(true)
    }

    /// True if no message is queued: two loads, no lock (the receive loop's fast path).
    #[inline(always)]
    pub(crate) fn looks_empty(&self) -> bool {
        let h = self.header();
        h.tail.load(Ordering::Acquire) == h.head.load(Ordering::Relaxed)
    }

    /// Removes the oldest message, or `None` if empty. A slot whose recorded length is
    /// corrupt is dropped and reported as `Some(Err(len))`.
    pub(crate) fn pop(&self) -> Option<Result<BasicMsg, u32>> {
        let h = self.header();
        if h.tail.load(Ordering::Acquire) == h.head.load(Ordering::Relaxed) {
            return None;
        }
        let _guard = self.lock();
        let head = h.head.load(Ordering::Relaxed);
        if h.tail.load(Ordering::Relaxed) == head {
            return None;
        }
        let msg = self.slot(head).with(|s| {
            // SAFETY: we hold the lock, so no other thread accesses this slot.
            let s = unsafe { &*s };
            if s.len as usize > BASIC_MAX {
                return Err(s.len);
            }
            let w = Word(s.word);
            let mut data = [0u8; BASIC_MAX];
            data[..s.len as usize].copy_from_slice(&s.data[..s.len as usize]);
            Ok(BasicMsg {
                handler: w.handler(),
                source: w.source(),
                len: s.len as u16,
                data,
            })
        });
        h.head.store(head + 1, Ordering::Release);
        Some(msg)
    }

    /// True if a message is queued (used by the doorbell protocol; `SeqCst` on purpose).
    pub(crate) fn has_claimed(&self) -> bool {
        let h = self.header();
        h.tail.load(Ordering::SeqCst) != h.head.load(Ordering::SeqCst)
    }

    /// Corrupts the length of the next message slot to be written (tests of the
    /// rejection path only).
    #[cfg(test)]
    pub(crate) fn corrupt_next_len(&self) {
        let tail = self.header().tail.load(Ordering::Relaxed);
        // SAFETY: test-only, single-threaded: nothing else accesses the slot.
        self.slot(tail.wrapping_sub(1))
            .with_mut(|s| unsafe { (*s).len = 10_000 });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn ring(cap: usize) -> (crate::segment::Segment, BasicRing) {
        let seg = crate::segment::Segment::private(BasicRing::layout(cap).size()).unwrap();
        // SAFETY: a fresh private segment exactly large enough, alive for the test.
        let r = unsafe { BasicRing::init(seg.base(), cap, None) };
        (seg, r)
    }

    #[test]
    fn fifo_with_lengths_up_to_the_limit() {
        let (_seg, r) = ring(3);
        let src = SourceId::new(5).unwrap();
        assert!(r.push(Handler(1), src, b"").unwrap());
        assert!(r.push(Handler(2), src, &[9; BASIC_MAX]).unwrap());
        assert!(r.push(Handler(3), src, b"abc").unwrap());
        assert!(!r.push(Handler(4), src, b"x").unwrap(), "full ring refuses");
        assert_eq!(
            r.push(Handler(4), src, &[0; BASIC_MAX + 1]),
            Err(BasicTooLong(BASIC_MAX + 1))
        );
        let a = r.pop().unwrap().unwrap();
        assert_eq!((a.handler, a.source, a.data()), (Handler(1), src, &b""[..]));
        assert_eq!(r.pop().unwrap().unwrap().data(), &[9; BASIC_MAX][..]);
        assert_eq!(r.pop().unwrap().unwrap().data(), b"abc");
        assert!(r.pop().is_none());
    }

    #[test]
    fn corrupt_length_is_reported_not_trusted() {
        let (_seg, r) = ring(2);
        r.push(Handler(1), SourceId::default(), b"ok").unwrap();
        r.corrupt_next_len();
        assert_eq!(r.pop().unwrap().unwrap_err(), 10_000);
        assert!(r.pop().is_none());
    }
}
