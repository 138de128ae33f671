//! Software write detection: one mark per 64-byte line of a region that application
//! stores set, so that a flush reads only the lines of open pages written since the
//! previous flush.
//!
//! A flush at a release compares each open page with its twin. In a lock-intensive
//! program most open pages are unchanged since the previous flush (Water 512 × 50 on 2×1:
//! ≈ 110 open pages at each of ≈ 1,650 release-batch flushes per cluster, a few of them
//! written under the batch's locks), and reading them was the largest single item of the
//! runtime's CPU time (`RegionOps::view_equals`, ≈ 2.7 % of all samples, thirty-third
//! session). Every application store to the region goes through
//! [`SharedArray`](crate::SharedArray), which marks the line(s) it wrote *after* the
//! data; a flush takes the marks of a page's lines *before* it reads them, skips the page
//! when there was none, and otherwise reads, compares and diffs only the marked lines
//! ([`WriteMarks::take_lines`], `coherence::diff::encode_lines`). This is Midway's
//! software write detection (Zekauskas, Sawdon and Bershad, *Software Write Detection for
//! a Distributed Shared Memory*, OSDI 1994), whose dirty bits also cover small regions
//! of memory rather than pages, here as a filter in front of the twin comparison, not a replacement for it: a marked line is
//! still compared and diffed against its twin. With one mark per page (until the
//! fifty-sixth session) a lock-protected update of a few lines made the flush compare the
//! whole page with its twin, copy it and diff the copy. A page's 64 marks fill one cache
//! line of their own, so threads of a cluster writing different pages still never store
//! to the same line.
//!
//! Why a skipped line cannot hide a write: a store `W` is followed in its thread by the
//! mark `M` of its line (a `Release` store, unconditional: a thread that skipped the mark
//! because the byte already read 1 could have its `W` still in its store buffer while a
//! flush takes that 1 and reads the line); the flush takes the page's marks with `S` and
//! reads the marked lines with `R` after it. `S` loads the 64 marks (relaxed), stores 0
//! to each it found set and then makes one `SeqCst` fence; a mark it loaded as 0 it
//! leaves alone. If `M` comes after the mark `S` loaded in the mark's modification order
//! and after `S`'s store of 0 (or `S` loaded 0 and stored nothing), the line stays marked
//! and the next flush reads it — as a store that raced with the flush's read of the page
//! was always handled. That next flush exists only for a page that stays open: a flush
//! that closes a page (drops its twin) compares the whole page with its twin whatever the
//! marks say, since a store whose mark is still to come (its thread preempted between the
//! two) would otherwise be lost (thirty-ninth session: about one Water run in 150 on 2×2
//! ended with wrong energies that way). If `M` comes before `S`'s store of 0 (the mark
//! `S` loaded, or one that `S`'s store overwrote), then `W` became visible before `M` did
//! and `M` before that store, which is visible before `R` runs (the fence), so `R` sees
//! `W`: x86-64 makes all stores visible in one order that keeps each thread's program
//! order (TSO), and a load after a fence sees every store before the fence's own in that
//! order (ARMv8's release stores, multi-copy atomicity and `dmb` give the same). Rust's
//! memory model alone promises less when `S` meets a *later* mark of another thread (a
//! plain store ends `M`'s release sequence); it would ask every mark to be a
//! read-modify-write, which cost Water 512 × 50 on 2×1 shm 4 % (`swap`, 1.04
//! (0.76–1.21), 28 alternating pairs, thirty-third session), and which [`ArrayMarks`]
//! uses on other architectures, where `S` swaps each set mark to 0 (`AcqRel`) instead of
//! storing and fencing. The compiler keeps the orders the argument needs: it moves no
//! store after a release store and no load before a `SeqCst` fence or an acquire
//! read-modify-write. Every access is atomic, so there is no data race either way. The
//! runtime's own writes through its view (applying diffs and updates) do not mark: they
//! change the twin as well, so the comparison would find nothing.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use multigrain_coherence::diff::{LINE_SIZE, line_indices};

use super::layout::{PAGE_SIZE, PageIndex, RegionLayout};

/// The write marks of one region: one per [`LINE_SIZE`]-byte line, 1 when an
/// application store may have changed the line since the mark was last taken (see the
/// module documentation). The marks of each page fill a cache line of their own
/// ([`MARK_BYTES`]), so that threads of a cluster writing different pages never store to
/// the same line: packed one byte per page, the
/// marks of 64 pages (256 KiB of the region) shared a line, and two compute threads of
/// one cluster writing their own pages passed it between their CPUs at every store (a
/// probe of two threads each storing to its own 40 pages on this 2-vCPU VM: 6.8–8.8 ns
/// a store packed, 2.8–5.3 ns padded, as fast as one thread alone; fifty-third session).
///
/// The marks take 16 MiB of address space for the default 1 GiB region (1/64 of the
/// region; 1 GiB for the largest, 64 GiB) and memory only for the pages written: they
/// are the bytes of a zeroed byte allocation, which the
/// C library's `calloc` serves from fresh, lazily zeroed pages. (The fifty-third
/// session's `Box<[Mark]>` of 64-byte-aligned marks went through an aligned allocation
/// that Rust zeroes with a `memset`: every cluster process wrote all 16 MiB at start-up,
/// 4,096 page faults and 16 MiB of resident memory each; a 64 GiB region would have
/// written 1 GiB.)
pub struct WriteMarks {
    /// The region's first byte.
    base: usize,
    /// Pages of the region, 64 marks each.
    pages: usize,
    /// The marks: line `k` of page `p` has `bytes[first + p · MARK_BYTES + k]` (the
    /// region's line `l` has `bytes[first + l]`); the bytes before `first` and after
    /// the last page's marks are never touched.
    bytes: Box<[AtomicU8]>,
    /// Offset of page 0's marks in `bytes`, the first one on a cache-line boundary.
    first: usize,
}

/// Bytes a page's marks take: one cache line (x86-64 and most AArch64 cores), one byte
/// for each of its [`LINE_SIZE`]-byte lines.
pub const MARK_BYTES: usize = 64;

const _: () = assert!(MARK_BYTES.is_power_of_two() && MARK_BYTES * LINE_SIZE == PAGE_SIZE);

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

/// The write marks of one shared array's lines ([`WriteMarks::of_array`]): what
/// [`SharedArray::set`](crate::SharedArray::set) stores to after each element.
///
/// The same marks as the region's, reached in one step: the mark of the array's first
/// line and the number of its lines sit in the array itself, and an element's line is
/// its offset in the array over [`LINE_SIZE`] (arrays start at a page boundary, so the
/// array's line `l` is line `l mod 64` of its page `l / 64`). Through the region's [`WriteMarks`], every
/// store reloaded the `Arc`'s address, then the region's base and the marks' pointer and
/// length from it: the compiler cannot keep fields in registers across an atomic store
/// to the region, which might have changed them. Reading and writing back 20,000 `u64`s
/// in a loop (fifty-fourth session, a probe on this 2-vCPU VM): 3.2 ns an element
/// through the region's marks, 2.1 ns through these, 0.9 ns without a mark, as fast as
/// relaxed atomics in a `Vec`. The rest is the reloads of the array's own fields.
pub struct ArrayMarks {
    /// The mark of the array's first line; line `l`'s is `l` bytes on.
    first: NonNull<AtomicU8>,
    /// The array's lines.
    lines: usize,
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
    /// Marks the array's line `line` (bytes `64 · line ..`, counted from its first byte)
    /// written. Called after the store it records.
    ///
    /// # Panics
    /// If `line` is not one of the array's lines.
    #[inline(always)]
    pub fn mark_line(&self, line: usize) {
        if line >= self.lines {
            line_out_of_bounds(line, self.lines);
        }
        // SAFETY: `first` points at the first of `lines` consecutive marks inside the
        // `WriteMarks` that `_marks` keeps allocated (`WriteMarks::of_array` took the
        // pointer from the one slice of its bytes that holds them all), and
        // `line < lines`.
        set(unsafe { self.first.add(line).as_ref() });
    }

    /// [`ArrayMarks::mark_line`] without the bounds check, for a caller that has
    /// checked an element index whose line this is.
    ///
    /// # Safety
    /// `line` must be one of the array's lines: less than the `len` given to
    /// [`WriteMarks::of_array`] divided by [`LINE_SIZE`], rounded up.
    #[inline(always)]
    pub unsafe fn mark_line_unchecked(&self, line: usize) {
        debug_assert!(
            line < self.lines,
            "line {line} of an array of {} lines",
            self.lines
        );
        // SAFETY: as in `mark_line`; the caller promises `line < lines`.
        set(unsafe { self.first.add(line).as_ref() });
    }

    /// Marks the array's lines holding a byte of `offset .. offset + len` (bytes from
    /// the array's start, `len` > 0). Called after the stores it records.
    ///
    /// # Panics
    /// If the range is not inside the array's lines.
    #[inline]
    pub fn mark_bytes(&self, offset: usize, len: usize) {
        debug_assert!(len > 0, "an empty store marks nothing");
        for line in offset / LINE_SIZE..=(offset + len - 1) / LINE_SIZE {
            self.mark_line(line);
        }
    }
}

/// The panic of [`ArrayMarks::mark_line`], out of line: with the message's arguments
/// formatted in place, the compiler kept the line index on the stack for it at every
/// store.
#[cold]
#[inline(never)]
#[track_caller]
fn line_out_of_bounds(line: usize, lines: usize) -> ! {
    panic!("line {line} of an array of {lines} lines")
}

impl Clone for ArrayMarks {
    fn clone(&self) -> Self {
        ArrayMarks {
            first: self.first,
            lines: self.lines,
            _marks: Arc::clone(&self._marks),
        }
    }
}

impl std::fmt::Debug for ArrayMarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayMarks")
            .field("lines", &self.lines)
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
    /// No line marked, one mark per line of `layout`.
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

    /// Page `page`'s marks, one per line.
    ///
    /// # Panics
    /// If `page` is not a page of the region.
    #[inline(always)]
    fn marks_of(&self, page: usize) -> &[AtomicU8; MARK_BYTES] {
        assert!(
            page < self.pages,
            "page {page} of a region of {} pages",
            self.pages
        );
        let at = self.first + page * MARK_BYTES;
        self.bytes[at..at + MARK_BYTES]
            .try_into()
            .expect("a page's marks")
    }

    /// The marks of the `len` bytes from `addr` (an array's lines), for the stores'
    /// fast path ([`ArrayMarks`]). The first byte is at offset 0 of the first page
    /// ([`ArrayMarks::mark_line`] counts lines from it).
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
        let lines = len.div_ceil(LINE_SIZE);
        let start = self.first + first * MARK_BYTES;
        let marks = &self.bytes[start..start + lines];
        ArrayMarks {
            first: NonNull::from(marks).cast(),
            lines,
            _marks: Arc::clone(self),
        }
    }

    /// Takes the marks of `page`'s lines: bit `k` of the result is set when an
    /// application store may have changed line `k` (bytes `64k .. 64k + 64`) since its
    /// mark was last taken; 0 when none may have. Called before those lines are read
    /// (see the module documentation for the order it keeps).
    ///
    /// # Panics
    /// If `page` is not a page of the region.
    #[inline]
    pub fn take_lines(&self, page: PageIndex) -> u64 {
        let marks = self.marks_of(page.0);
        // Most pages a flush looks at are unmarked: one pass that only ORs the marks
        // together (no shifts, ≈ 3 × faster than building the mask) tells them apart.
        if marks
            .iter()
            .fold(0u8, |any, m| any | m.load(Ordering::Relaxed))
            == 0
        {
            return 0;
        }
        let mut lines = 0u64;
        for (k, m) in marks.iter().enumerate() {
            lines |= u64::from(m.load(Ordering::Relaxed) != 0) << k;
        }
        if lines == 0 {
            return 0;
        }
        for k in line_indices(lines) {
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            marks[k].store(0, Ordering::Relaxed);
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            marks[k].swap(0, Ordering::AcqRel);
        }
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        std::sync::atomic::fence(Ordering::SeqCst);
        lines
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

    /// The pages of the region of [`marks`] with a marked line, each taken.
    fn take_all(m: &WriteMarks) -> Vec<(usize, u64)> {
        (0..16)
            .map(|p| (p, m.take_lines(PageIndex(p))))
            .filter(|&(_, l)| l != 0)
            .collect()
    }

    #[test]
    fn a_line_is_unmarked_until_written_and_its_mark_is_taken_once() {
        let m = Arc::new(marks());
        assert_eq!(m.take_lines(PageIndex(3)), 0);
        // Bytes 8..16 of page 3 (its line 0), then bytes 130..131 (line 2).
        whole(&m).mark_bytes(3 * PAGE_SIZE + 8, 8);
        whole(&m).mark_bytes(3 * PAGE_SIZE + 130, 1);
        assert_eq!(m.take_lines(PageIndex(3)), 0b101);
        assert_eq!(m.take_lines(PageIndex(3)), 0, "taking clears the marks");
        assert_eq!(m.take_lines(PageIndex(2)) | m.take_lines(PageIndex(4)), 0);
        // The page's last line is its bit 63.
        whole(&m).mark_line(3 * 64 + 63);
        assert_eq!(m.take_lines(PageIndex(3)), 1 << 63);
    }

    #[test]
    fn marks_of_neighbouring_pages_lie_in_different_cache_lines() {
        let m = marks();
        let line = |p: usize| m.marks_of(p).as_ptr() as usize / MARK_BYTES;
        for p in 0..15 {
            assert_eq!(line(p) + 1, line(p + 1), "pages {p} and {}", p + 1);
            assert!((m.marks_of(p).as_ptr() as usize).is_multiple_of(MARK_BYTES));
        }
    }

    #[test]
    fn a_store_across_a_page_boundary_marks_both_lines_and_only_them() {
        let m = Arc::new(marks());
        // 16 bytes: the last 8 of page 5 and the first 8 of page 6.
        whole(&m).mark_bytes(6 * PAGE_SIZE - 8, 16);
        assert_eq!(take_all(&m), vec![(5, 1 << 63), (6, 1)]);
        // Exactly one page's worth ending on its last byte: that page's lines only.
        whole(&m).mark_bytes(15 * PAGE_SIZE, PAGE_SIZE);
        assert_eq!(take_all(&m), vec![(15, u64::MAX)]);
        // 72 bytes from byte 60 of a page: lines 0, 1 and 2.
        whole(&m).mark_bytes(PAGE_SIZE + 60, 72);
        assert_eq!(take_all(&m), vec![(1, 0b111)]);
    }

    #[test]
    fn an_arrays_marks_are_the_regions_marks_of_its_lines() {
        let m = Arc::new(marks());
        // An array of 3 pages and a few bytes (4 pages, 193 lines) starting at the
        // region's page 9.
        let a = m.of_array(0x1000_0000 + 9 * PAGE_SIZE, 3 * PAGE_SIZE + 24);
        a.mark_line(0);
        a.mark_line(65);
        a.mark_line(192);
        assert_eq!(take_all(&m), vec![(9, 1), (10, 0b10), (12, 1)]);
        // 16 bytes across the boundary of the array's pages 1 and 2; then the array's
        // last byte alone.
        a.mark_bytes(2 * PAGE_SIZE - 8, 16);
        a.clone().mark_bytes(3 * PAGE_SIZE + 23, 1);
        assert_eq!(take_all(&m), vec![(10, 1 << 63), (11, 1), (12, 1)]);
    }

    #[test]
    fn an_empty_array_at_the_regions_end_has_no_marks() {
        let m = Arc::new(marks());
        let a = m.of_array(0x1000_0000 + 16 * PAGE_SIZE, 0);
        assert!(std::panic::catch_unwind(|| a.mark_line(0)).is_err());
    }

    #[test]
    #[should_panic(expected = "line 193 of an array of 193 lines")]
    fn a_line_past_an_arrays_end_is_refused() {
        let m = Arc::new(marks());
        m.of_array(0x1000_0000 + 9 * PAGE_SIZE, 3 * PAGE_SIZE + 24)
            .mark_line(193);
    }

    #[test]
    #[should_panic(expected = "start at a page boundary")]
    fn an_arrays_marks_start_at_a_page_boundary() {
        let m = Arc::new(marks());
        let _ = m.of_array(0x1000_0000 + 8, 8);
    }

    /// Stores racing with flushes: every store is either in the lines a take returned
    /// and read after it, or still marked for the next take (the argument of the module
    /// documentation, exercised on the hardware). A writer thread stores increasing
    /// values to one word of each of 64 lines, marking after each store; the flusher
    /// takes the marks and reads the marked lines' words into its copy. When the writer
    /// has finished, one more take must bring the copy up to date: a lost mark would
    /// leave a word of the copy behind.
    #[test]
    fn no_store_is_lost_between_marks_and_takes() {
        use std::sync::atomic::AtomicU64;
        let m = Arc::new(marks());
        let a = whole(&m);
        let page: Arc<Vec<AtomicU64>> = Arc::new((0..512).map(|_| AtomicU64::new(0)).collect());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (page, done) = (Arc::clone(&page), Arc::clone(&done));
            std::thread::spawn(move || {
                for v in 1..=20_000u64 {
                    let line = (v as usize * 7) % 64;
                    page[line * 8].store(v, Ordering::Relaxed);
                    a.mark_line(2 * 64 + line);
                }
                done.store(true, Ordering::Release);
            })
        };
        let mut copy = [0u64; 64];
        let take = |copy: &mut [u64; 64]| {
            for k in line_indices(m.take_lines(PageIndex(2))) {
                copy[k] = page[k * 8].load(Ordering::Relaxed);
            }
        };
        while !done.load(Ordering::Acquire) {
            take(&mut copy);
        }
        writer.join().expect("writer");
        take(&mut copy);
        let expected: Vec<u64> = (0..64)
            .map(|line| page[line * 8].load(Ordering::Relaxed))
            .collect();
        assert_eq!(&copy[..], &expected[..]);
    }
}
