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
//! [`WriteMarks::mark`] uses on other architectures. The compiler
//! keeps both orders the argument needs: it moves no store after a release store and no
//! load before an acquire read-modify-write. Every access is atomic, so there is no data
//! race either way. The runtime's own writes through its view (applying diffs and
//! updates) do not mark: they change the twin as well, so the comparison would find
//! nothing.

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
/// 16 MiB of address space for the default 1 GiB region (1/64 of the region), zeroed
/// lazily by the allocator: memory only for the lines of the pages written.
pub struct WriteMarks {
    base: usize,
    marks: Box<[Mark]>,
}

/// Bytes a page's mark takes: one cache line (x86-64 and most AArch64 cores).
pub const MARK_BYTES: usize = 64;

/// One page's mark, alone in its cache line.
#[derive(bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Mark(AtomicU8);

const _: () = assert!(size_of::<Mark>() == MARK_BYTES && align_of::<Mark>() == MARK_BYTES);

impl std::fmt::Debug for WriteMarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteMarks")
            .field("base", &format_args!("{:#x}", self.base))
            .field("pages", &self.marks.len())
            .finish()
    }
}

impl WriteMarks {
    /// No page marked, one mark per page of `layout`.
    pub fn new(layout: RegionLayout) -> Self {
        WriteMarks {
            base: layout.base(),
            marks: bytemuck::zeroed_slice_box(layout.pages()),
        }
    }

    /// Marks every page holding a byte of `addr .. addr + len` (`len` > 0 bytes). Called
    /// after the store it records.
    ///
    /// # Panics
    /// If the range is not inside the region (callers store only inside it).
    #[inline(always)]
    pub fn mark(&self, addr: usize, len: usize) {
        debug_assert!(len > 0, "an empty store marks nothing");
        let first = (addr - self.base) / PAGE_SIZE;
        let last = (addr + len - 1 - self.base) / PAGE_SIZE;
        for Mark(m) in &self.marks[first..=last] {
            // A plain release store where the hardware's store order makes it enough
            // (see the module documentation); a read-modify-write, which Rust's model
            // asks for, elsewhere.
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            m.store(1, Ordering::Release);
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            m.swap(1, Ordering::Release);
        }
    }

    /// Takes `page`'s mark: whether an application store may have changed it since the
    /// mark was last taken. Called before the page is read.
    ///
    /// # Panics
    /// If `page` is not a page of the region.
    #[inline]
    pub fn take(&self, page: PageIndex) -> bool {
        self.marks[page.0].0.swap(0, Ordering::AcqRel) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks() -> WriteMarks {
        WriteMarks::new(RegionLayout::new(0x1000_0000, 16 * PAGE_SIZE).expect("layout"))
    }

    #[test]
    fn a_page_is_unmarked_until_written_and_its_mark_is_taken_once() {
        let m = marks();
        assert!(!m.take(PageIndex(3)));
        m.mark(0x1000_0000 + 3 * PAGE_SIZE + 8, 8);
        assert!(m.take(PageIndex(3)));
        assert!(!m.take(PageIndex(3)), "taking clears the mark");
        assert!(!m.take(PageIndex(2)) && !m.take(PageIndex(4)));
    }

    #[test]
    fn marks_of_neighbouring_pages_lie_in_different_cache_lines() {
        let m = marks();
        let line = |p: usize| std::ptr::from_ref(&m.marks[p]) as usize / MARK_BYTES;
        for p in 0..15 {
            assert_eq!(line(p) + 1, line(p + 1), "pages {p} and {}", p + 1);
        }
    }

    #[test]
    fn a_store_across_a_page_boundary_marks_both_pages_and_only_them() {
        let m = marks();
        // 16 bytes: the last 8 of page 5 and the first 8 of page 6.
        m.mark(0x1000_0000 + 6 * PAGE_SIZE - 8, 16);
        let marked: Vec<usize> = (0..16).filter(|&p| m.take(PageIndex(p))).collect();
        assert_eq!(marked, vec![5, 6]);
        // Exactly one page's worth ending on its last byte: only that page.
        m.mark(0x1000_0000 + 15 * PAGE_SIZE, PAGE_SIZE);
        let marked: Vec<usize> = (0..16).filter(|&p| m.take(PageIndex(p))).collect();
        assert_eq!(marked, vec![15]);
    }
}
