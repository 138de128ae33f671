//! Software write detection: one mark per page of a region that application stores set,
//! so that a flush reads only the open pages written since the previous flush.
//!
//! A flush at a release compares each open page with its twin. In a lock-intensive
//! program most open pages are unchanged since the previous flush (Water 512 × 50 on 2×1:
//! ≈ 110 open pages at each of ≈ 1,650 release-batch flushes per cluster, a few of them
//! written under the batch's locks), and reading them was the largest single item of the
//! runtime's CPU time (`RegionOps::view_equals`, ≈ 2.7 % of all samples, thirty-third
//! session). Every application store to the region goes through
//! [`SharedArray`](crate::SharedArray), which marks the page(s) it wrote *after* the
//! data; a flush takes a page's mark *before* it reads the page, and skips the page when
//! there was none. This is Midway's software write detection (Zekauskas, Sawdon and
//! Bershad, *Software Write Detection for a Distributed Shared Memory*, OSDI 1994), here
//! as a filter in front of the twin comparison, not a replacement for it: a marked page
//! is still compared and diffed against its twin.
//!
//! Why a skipped page cannot hide a write: a store `W` is followed in its thread by the
//! mark `M` (a `Release` store, unconditional: a thread that skipped the mark because the
//! byte already read 1 could have its `W` still in its store buffer while a flush takes
//! that 1 and reads the page); the flush takes the mark with `S` (an `AcqRel` swap to 0)
//! and reads the page with `R` after it. If `M` comes after `S` in the mark's
//! modification order, the page is marked again and the next flush reads it — as a store
//! that raced with the flush's read of the page was always handled. That next flush exists
//! only for a page that stays open: a flush that closes a page (drops its twin) compares
//! it with its twin whatever the mark says, since a store whose mark is still to come
//! (its thread preempted between the two) would otherwise be lost (thirty-ninth session:
//! about one Water run in 150 on 2×2 ended with wrong energies that way). If `M` comes before
//! `S`, then `W` became visible before `M` did and `M` before `S` ran, so `R` sees `W`:
//! x86-64 makes a thread's stores visible in program order (TSO) and its atomic exchange
//! sees every store made visible before it (ARMv8's release stores and multi-copy
//! atomicity give the same). Rust's memory model alone promises less when `S` reads a
//! *later* mark of another thread (a plain store ends `M`'s release sequence); it would
//! ask every mark to be a read-modify-write, which cost Water 512 × 50 on 2×1 shm 4 %
//! (`swap`, 1.04 (0.76–1.21), 28 alternating pairs, thirty-third session), and which
//! [`ArrayMarks`] uses on other architectures. The compiler
//! keeps both orders the argument needs: it moves no store after a release store and no
//! load before an acquire read-modify-write. Every access is atomic, so there is no data
//! race either way. The runtime's own writes through its view (applying diffs and
//! updates) do not mark: they change the twin as well, so the comparison would find
//! nothing.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use super::layout::{PAGE_SIZE, PageIndex, RegionLayout};

/// The write marks of one region: one per page, 1 when an application store may have
/// changed the page since the mark was last taken (see the module documentation). Each
/// mark has a cache line of its own ([`MARK_BYTES`]), so that threads of a cluster
/// writing different pages never store to the same line: packed one byte per page, the
/// marks of 64 pages (256 KiB of the region) shared a line, and two compute threads of
/// one cluster writing their own pages passed it between their CPUs at every store (a
/// probe of two threads each storing to its own 40 pages on this 2-vCPU VM: 6.8–8.8 ns
/// a store packed, 2.8–5.3 ns padded, as fast as one thread alone; fifty-third session).
///
/// The marks take 16 MiB of address space for the default 1 GiB region (1/64 of the
/// region; 1 GiB for the largest, 64 GiB) and memory only for the lines of the pages
/// written: they are bytes [`MARK_BYTES`] apart in a zeroed byte allocation, which the
/// C library's `calloc` serves from fresh, lazily zeroed pages. (The fifty-third
/// session's `Box<[Mark]>` of 64-byte-aligned marks went through an aligned allocation
/// that Rust zeroes with a `memset`: every cluster process wrote all 16 MiB at start-up,
/// 4,096 page faults and 16 MiB of resident memory each; a 64 GiB region would have
/// written 1 GiB.)
pub struct WriteMarks {
    /// The region's first byte.
    base: usize,
    /// Pages of the region, one mark each.
    pages: usize,
    /// The marks: page `p`'s is `bytes[first + p · MARK_BYTES]`; the other bytes are
    /// never touched.
    bytes: Box<[AtomicU8]>,
    /// Offset of page 0's mark in `bytes`, the first one on a cache-line boundary.
    first: usize,
}

/// Bytes a page's mark takes: one cache line (x86-64 and most AArch64 cores).
pub const MARK_BYTES: usize = 64;

const _: () = assert!(MARK_BYTES.is_power_of_two());

/// Sets a mark: a plain release store where the hardware's store order makes it enough
/// (see the module documentation); a read-modify-write, which Rust's model asks for,
/// elsewhere.
#[inline(always)]
fn set(mark: &AtomicU8) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    mark.store(1, Ordering::Release);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    mark.swap(1, Ordering::Release);
}

/// The write marks of one shared array's pages ([`WriteMarks::of_array`]): what
/// [`SharedArray::set`](crate::SharedArray::set) stores to after each element.
///
/// The same marks as the region's, reached in one step: the mark of the array's first
/// page and the number of its pages sit in the array itself, and an element's page is
/// its offset in the array over [`PAGE_SIZE`]. Through the region's [`WriteMarks`], every
/// store reloaded the `Arc`'s address, then the region's base and the marks' pointer and
/// length from it: the compiler cannot keep fields in registers across an atomic store
/// to the region, which might have changed them. Reading and writing back 20,000 `u64`s
/// in a loop (fifty-fourth session, a probe on this 2-vCPU VM): 3.2 ns an element
/// through the region's marks, 2.1 ns through these, 0.9 ns without a mark, as fast as
/// relaxed atomics in a `Vec`. The rest is the reloads of the array's own fields.
pub struct ArrayMarks {
    /// The mark of the array's first page; page `p`'s is [`MARK_BYTES`] · `p` bytes on.
    first: NonNull<AtomicU8>,
    /// The array's pages.
    pages: usize,
    /// Keeps the marks `first` points into allocated.
    _marks: Arc<WriteMarks>,
}

// SAFETY: `ArrayMarks` only hands out shared references to marks (atomic bytes, `Send`
// and `Sync`) inside the `WriteMarks` that its `Arc` keeps alive; the pointer is never
// written through non-atomically, so moving or sharing it between threads is as safe as
// sharing the `Arc<WriteMarks>` itself.
unsafe impl Send for ArrayMarks {}
// SAFETY: as for `Send` above.
unsafe impl Sync for ArrayMarks {}

impl ArrayMarks {
    /// Marks the array's page `page` (counted from its first page) written. Called
    /// after the store it records.
    ///
    /// # Panics
    /// If `page` is not one of the array's pages.
    #[inline(always)]
    pub fn mark_page(&self, page: usize) {
        if page >= self.pages {
            page_out_of_bounds(page, self.pages);
        }
        // SAFETY: `first` points at the first of `pages` marks `MARK_BYTES` apart inside
        // the `WriteMarks` that `_marks` keeps allocated (`WriteMarks::of_array` took
        // the pointer from the one slice of its bytes that holds them all), and
        // `page < pages`.
        set(unsafe { self.first.add(page * MARK_BYTES).as_ref() });
    }

    /// [`ArrayMarks::mark_page`] without the bounds check, for a caller that has
    /// checked an element index whose page this is.
    ///
    /// # Safety
    /// `page` must be one of the array's pages: less than the `len` given to
    /// [`WriteMarks::of_array`] divided by [`PAGE_SIZE`], rounded up.
    #[inline(always)]
    pub unsafe fn mark_page_unchecked(&self, page: usize) {
        debug_assert!(
            page < self.pages,
            "page {page} of an array of {} pages",
            self.pages
        );
        // SAFETY: as in `mark_page`; the caller promises `page < pages`.
        set(unsafe { self.first.add(page * MARK_BYTES).as_ref() });
    }

    /// Marks the array's pages holding a byte of `offset .. offset + len` (bytes from
    /// the array's start, `len` > 0). Called after the stores it records.
    ///
    /// # Panics
    /// If the range is not inside the array's pages.
    #[inline]
    pub fn mark_bytes(&self, offset: usize, len: usize) {
        debug_assert!(len > 0, "an empty store marks nothing");
        for page in offset / PAGE_SIZE..=(offset + len - 1) / PAGE_SIZE {
            self.mark_page(page);
        }
    }
}

/// The panic of [`ArrayMarks::mark_page`], out of line: with the message's arguments
/// formatted in place, the compiler kept the page index on the stack for it at every
/// store.
#[cold]
#[inline(never)]
#[track_caller]
fn page_out_of_bounds(page: usize, pages: usize) -> ! {
    panic!("page {page} of an array of {pages} pages")
}

impl Clone for ArrayMarks {
    fn clone(&self) -> Self {
        ArrayMarks {
            first: self.first,
            pages: self.pages,
            _marks: Arc::clone(&self._marks),
        }
    }
}

impl std::fmt::Debug for ArrayMarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayMarks")
            .field("pages", &self.pages)
            .finish()
    }
}

impl std::fmt::Debug for WriteMarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteMarks")
            .field("base", &format_args!("{:#x}", self.base))
            .field("pages", &self.pages)
            .finish()
    }
}

impl WriteMarks {
    /// No page marked, one mark per page of `layout`.
    pub fn new(layout: RegionLayout) -> Self {
        let pages = layout.pages();
        // Room to start on a line boundary wherever the allocation lands.
        let bytes: Box<[AtomicU8]> =
            bytemuck::zeroed_slice_box(pages * MARK_BYTES + MARK_BYTES - 1);
        let first = (bytes.as_ptr() as usize).wrapping_neg() % MARK_BYTES;
        WriteMarks {
            base: layout.base(),
            pages,
            bytes,
            first,
        }
    }

    /// Page `page`'s mark.
    ///
    /// # Panics
    /// If `page` is not a page of the region.
    #[inline(always)]
    fn mark_of(&self, page: usize) -> &AtomicU8 {
        assert!(
            page < self.pages,
            "page {page} of a region of {} pages",
            self.pages
        );
        &self.bytes[self.first + page * MARK_BYTES]
    }

    /// The marks of the `len` bytes from `addr` (an array's pages), for the stores'
    /// fast path ([`ArrayMarks`]). The first byte is at offset 0 of the first page
    /// ([`ArrayMarks::mark_page`] counts pages from it).
    ///
    /// # Panics
    /// If the range is not inside the region, or `addr` is not page-aligned.
    pub fn of_array(self: &Arc<Self>, addr: usize, len: usize) -> ArrayMarks {
        assert!(
            addr >= self.base && (addr - self.base).is_multiple_of(PAGE_SIZE),
            "an array's marks start at a page boundary of the region ({addr:#x})"
        );
        let first = (addr - self.base) / PAGE_SIZE;
        let pages = len.div_ceil(PAGE_SIZE);
        assert!(
            first + pages <= self.pages,
            "an array of {pages} pages from page {first} of a region of {} pages",
            self.pages
        );
        // One slice holding all the array's marks, so that the pointer may reach each.
        let start = self.first + first * MARK_BYTES;
        let end = match pages {
            0 => start,
            n => start + (n - 1) * MARK_BYTES + 1,
        };
        let marks = &self.bytes[start..end];
        ArrayMarks {
            first: NonNull::from(marks).cast(),
            pages,
            _marks: Arc::clone(self),
        }
    }

    /// Takes `page`'s mark: whether an application store may have changed it since the
    /// mark was last taken. Called before the page is read.
    ///
    /// # Panics
    /// If `page` is not a page of the region.
    #[inline]
    pub fn take(&self, page: PageIndex) -> bool {
        self.mark_of(page.0).swap(0, Ordering::AcqRel) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks() -> WriteMarks {
        WriteMarks::new(RegionLayout::new(0x1000_0000, 16 * PAGE_SIZE).expect("layout"))
    }

    /// The marks of an array covering the whole region of [`marks`].
    fn whole(m: &Arc<WriteMarks>) -> ArrayMarks {
        m.of_array(0x1000_0000, 16 * PAGE_SIZE)
    }

    #[test]
    fn a_page_is_unmarked_until_written_and_its_mark_is_taken_once() {
        let m = Arc::new(marks());
        assert!(!m.take(PageIndex(3)));
        whole(&m).mark_bytes(3 * PAGE_SIZE + 8, 8);
        assert!(m.take(PageIndex(3)));
        assert!(!m.take(PageIndex(3)), "taking clears the mark");
        assert!(!m.take(PageIndex(2)) && !m.take(PageIndex(4)));
    }

    #[test]
    fn marks_of_neighbouring_pages_lie_in_different_cache_lines() {
        let m = marks();
        let line = |p: usize| std::ptr::from_ref(m.mark_of(p)) as usize / MARK_BYTES;
        for p in 0..15 {
            assert_eq!(line(p) + 1, line(p + 1), "pages {p} and {}", p + 1);
        }
    }

    #[test]
    fn a_store_across_a_page_boundary_marks_both_pages_and_only_them() {
        let m = Arc::new(marks());
        // 16 bytes: the last 8 of page 5 and the first 8 of page 6.
        whole(&m).mark_bytes(6 * PAGE_SIZE - 8, 16);
        let marked: Vec<usize> = (0..16).filter(|&p| m.take(PageIndex(p))).collect();
        assert_eq!(marked, vec![5, 6]);
        // Exactly one page's worth ending on its last byte: only that page.
        whole(&m).mark_bytes(15 * PAGE_SIZE, PAGE_SIZE);
        let marked: Vec<usize> = (0..16).filter(|&p| m.take(PageIndex(p))).collect();
        assert_eq!(marked, vec![15]);
    }

    #[test]
    fn an_arrays_marks_are_the_regions_marks_of_its_pages() {
        let m = Arc::new(marks());
        // An array of 3 pages and a few bytes (4 pages) starting at the region's page 9.
        let a = m.of_array(0x1000_0000 + 9 * PAGE_SIZE, 3 * PAGE_SIZE + 24);
        a.mark_page(0);
        a.mark_page(3);
        let marked: Vec<usize> = (0..16).filter(|&p| m.take(PageIndex(p))).collect();
        assert_eq!(marked, vec![9, 12]);
        // 16 bytes across the boundary of the array's pages 1 and 2; then the array's
        // last byte alone.
        a.mark_bytes(2 * PAGE_SIZE - 8, 16);
        a.clone().mark_bytes(3 * PAGE_SIZE + 23, 1);
        let marked: Vec<usize> = (0..16).filter(|&p| m.take(PageIndex(p))).collect();
        assert_eq!(marked, vec![10, 11, 12]);
    }

    #[test]
    fn an_empty_array_at_the_regions_end_has_no_marks() {
        let m = Arc::new(marks());
        let a = m.of_array(0x1000_0000 + 16 * PAGE_SIZE, 0);
        assert!(std::panic::catch_unwind(|| a.mark_page(0)).is_err());
    }

    #[test]
    #[should_panic(expected = "page 4 of an array of 4 pages")]
    fn a_page_past_an_arrays_end_is_refused() {
        let m = Arc::new(marks());
        m.of_array(0x1000_0000 + 9 * PAGE_SIZE, 3 * PAGE_SIZE + 24)
            .mark_page(4);
    }

    #[test]
    #[should_panic(expected = "start at a page boundary")]
    fn an_arrays_marks_start_at_a_page_boundary() {
        let m = Arc::new(marks());
        let _ = m.of_array(0x1000_0000 + 8, 8);
    }
}
