//! Pure address arithmetic: region layouts, page indices, page ranges, and resolving a
//! fault address to `(region, page)` with bounds checks. No system calls, no unsafe.

use std::fmt;

/// Bytes in one DSM page (x86-64 base pages; `userfaultfd` works at this grain).
pub const PAGE_SIZE: usize = 4096;

/// Default size of a DSM region: 1 GiB reserved (design.md, *dsm*).
pub const DEFAULT_REGION_LEN: usize = 1 << 30;

/// Default base address of a DSM region: 32 TiB, far from where Linux places the heap
/// (just above the executable), shared libraries and thread stacks (just below 128 TiB)
/// on x86-64, so every cluster process can reserve it at the same address.
pub const DEFAULT_REGION_BASE: usize = 0x2000_0000_0000;

/// A page of a region, numbered from the region base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageIndex(pub usize);

impl fmt::Display for PageIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page {}", self.0)
    }
}

/// A run of consecutive pages `start .. start + count`, issued as one system call by the
/// range operations (write-protect, unprotect, invalidate, wake).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageRange {
    /// First page of the run.
    pub start: PageIndex,
    /// Number of pages (0 is an empty range, which every operation accepts as a no-op).
    pub count: usize,
}

impl PageRange {
    /// The range `start .. start + count`.
    pub const fn new(start: PageIndex, count: usize) -> Self {
        PageRange { start, count }
    }

    /// The range holding only `page`.
    pub const fn one(page: PageIndex) -> Self {
        PageRange {
            start: page,
            count: 1,
        }
    }

    /// One past the last page, or `None` when that overflows `usize`.
    pub const fn end(self) -> Option<usize> {
        self.start.0.checked_add(self.count)
    }

    /// The pages of the range in increasing order.
    pub fn pages(self) -> impl Iterator<Item = PageIndex> {
        (self.start.0..self.start.0.saturating_add(self.count)).map(PageIndex)
    }
}

impl fmt::Display for PageRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pages {}..{}",
            self.start.0,
            self.start.0.saturating_add(self.count)
        )
    }
}

/// Why a base address and length cannot be a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The base is 0 or not a multiple of [`PAGE_SIZE`].
    #[error("region base {0:#x} is not a non-zero multiple of the {PAGE_SIZE}-byte page size")]
    BadBase(usize),
    /// The length is 0 or not a multiple of [`PAGE_SIZE`].
    #[error("region length {0:#x} is not a non-zero multiple of the {PAGE_SIZE}-byte page size")]
    BadLength(usize),
    /// `base + len` does not fit in the address space.
    #[error("region {base:#x} + {len:#x} overflows the address space")]
    Overflow {
        /// Requested base.
        base: usize,
        /// Requested length.
        len: usize,
    },
}

/// Where a region lies: `base .. base + len`, both page-aligned, `len > 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionLayout {
    base: usize,
    len: usize,
}

impl RegionLayout {
    /// Checks and builds a layout.
    pub const fn new(base: usize, len: usize) -> Result<Self, LayoutError> {
        if base == 0 || !base.is_multiple_of(PAGE_SIZE) {
            return Err(LayoutError::BadBase(base));
        }
        if len == 0 || !len.is_multiple_of(PAGE_SIZE) {
            return Err(LayoutError::BadLength(len));
        }
        if base.checked_add(len).is_none() {
            return Err(LayoutError::Overflow { base, len });
        }
        Ok(RegionLayout { base, len })
    }

    /// First byte address.
    pub const fn base(self) -> usize {
        self.base
    }

    /// Length in bytes.
    pub const fn len(self) -> usize {
        self.len
    }

    /// Always `false`: a layout has at least one page. (Present for the convention that
    /// pairs `len` with `is_empty`.)
    pub const fn is_empty(self) -> bool {
        false
    }

    /// One past the last byte address.
    pub const fn end(self) -> usize {
        self.base + self.len
    }

    /// Number of pages.
    pub const fn pages(self) -> usize {
        self.len / PAGE_SIZE
    }

    /// Whether `addr` lies in the region.
    pub const fn contains(self, addr: usize) -> bool {
        addr >= self.base && addr < self.end()
    }

    /// The page holding `addr`, or `None` when `addr` is outside the region.
    pub const fn page_of(self, addr: usize) -> Option<PageIndex> {
        if self.contains(addr) {
            Some(PageIndex((addr - self.base) / PAGE_SIZE))
        } else {
            None
        }
    }

    /// The address of the first byte of `page`, or `None` when the page is outside.
    pub const fn page_addr(self, page: PageIndex) -> Option<usize> {
        if page.0 < self.pages() {
            Some(self.base + page.0 * PAGE_SIZE)
        } else {
            None
        }
    }

    /// `(address, length in bytes)` of `range`, or an error when any page of it is
    /// outside the region. An empty range inside or at the end of the region is valid.
    pub const fn range_bytes(self, range: PageRange) -> Result<(usize, usize), OutOfRange> {
        match range.end() {
            Some(end) if end <= self.pages() => Ok((
                self.base + range.start.0 * PAGE_SIZE,
                range.count * PAGE_SIZE,
            )),
            _ => Err(OutOfRange {
                range,
                pages: self.pages(),
            }),
        }
    }

    /// Whether this layout and `other` share an address.
    pub const fn overlaps(self, other: RegionLayout) -> bool {
        self.base < other.end() && other.base < self.end()
    }
}

/// Pages outside the region were named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{range} lie outside the region of {pages} pages")]
pub struct OutOfRange {
    /// The offending range.
    pub range: PageRange,
    /// Pages in the region.
    pub pages: usize,
}

/// Resolves a fault address against several regions: the position in `regions` of the
/// region holding `addr` and the page within it, or `None` when no region holds it.
///
/// Regions never overlap (they are reserved with `MAP_FIXED_NOREPLACE`), so at most one
/// matches.
pub fn resolve(regions: &[RegionLayout], addr: usize) -> Option<(usize, PageIndex)> {
    regions
        .iter()
        .enumerate()
        .find_map(|(i, r)| r.page_of(addr).map(|p| (i, p)))
}

/// Merges `pages` into maximal runs of consecutive pages **in the order given**: a page
/// that continues the current run (`previous + 1`) extends it, anything else starts a
/// new run. Sort and deduplicate first for the fewest runs. Allocates nothing.
pub fn coalesce<I>(pages: I) -> Coalesce<I::IntoIter>
where
    I: IntoIterator<Item = PageIndex>,
{
    Coalesce {
        pages: pages.into_iter(),
        pending: None,
    }
}

/// Iterator returned by [`coalesce`].
#[derive(Debug)]
pub struct Coalesce<I> {
    pages: I,
    pending: Option<PageRange>,
}

impl<I: Iterator<Item = PageIndex>> Iterator for Coalesce<I> {
    type Item = PageRange;

    fn next(&mut self) -> Option<PageRange> {
        loop {
            match self.pages.next() {
                Some(p) => match &mut self.pending {
                    Some(run) if run.end() == Some(p.0) => run.count += 1,
                    Some(_) => return self.pending.replace(PageRange::one(p)),
                    None => self.pending = Some(PageRange::one(p)),
                },
                None => return self.pending.take(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: usize = DEFAULT_REGION_BASE;

    #[test]
    fn layout_rejects_bad_base_length_and_overflow() {
        assert_eq!(
            RegionLayout::new(0, PAGE_SIZE),
            Err(LayoutError::BadBase(0))
        );
        assert_eq!(
            RegionLayout::new(BASE + 1, PAGE_SIZE),
            Err(LayoutError::BadBase(BASE + 1))
        );
        assert_eq!(RegionLayout::new(BASE, 0), Err(LayoutError::BadLength(0)));
        assert_eq!(
            RegionLayout::new(BASE, PAGE_SIZE + 1),
            Err(LayoutError::BadLength(PAGE_SIZE + 1))
        );
        let top = usize::MAX - PAGE_SIZE + 1;
        assert!(matches!(
            RegionLayout::new(top, 2 * PAGE_SIZE),
            Err(LayoutError::Overflow { .. })
        ));
        // The very last page of the address space is representable only if base+len
        // fits in usize; it does not, so it is an overflow too.
        assert!(RegionLayout::new(top, PAGE_SIZE).is_err());
        assert!(RegionLayout::new(top - PAGE_SIZE, PAGE_SIZE).is_ok());
    }

    #[test]
    fn page_of_checks_both_bounds() {
        let l = RegionLayout::new(BASE, 4 * PAGE_SIZE).unwrap();
        assert_eq!(l.pages(), 4);
        assert_eq!(l.page_of(BASE - 1), None);
        assert_eq!(l.page_of(BASE), Some(PageIndex(0)));
        assert_eq!(l.page_of(BASE + PAGE_SIZE - 1), Some(PageIndex(0)));
        assert_eq!(l.page_of(BASE + PAGE_SIZE), Some(PageIndex(1)));
        assert_eq!(l.page_of(BASE + 4 * PAGE_SIZE - 1), Some(PageIndex(3)));
        assert_eq!(l.page_of(BASE + 4 * PAGE_SIZE), None);
        assert_eq!(l.page_of(0), None);
        assert_eq!(l.page_of(usize::MAX), None);
        assert_eq!(l.page_addr(PageIndex(3)), Some(BASE + 3 * PAGE_SIZE));
        assert_eq!(l.page_addr(PageIndex(4)), None);
    }

    #[test]
    fn range_bytes_checks_end_and_overflow() {
        let l = RegionLayout::new(BASE, 4 * PAGE_SIZE).unwrap();
        assert_eq!(
            l.range_bytes(PageRange::new(PageIndex(1), 3)),
            Ok((BASE + PAGE_SIZE, 3 * PAGE_SIZE))
        );
        assert_eq!(
            l.range_bytes(PageRange::new(PageIndex(4), 0)),
            Ok((BASE + 4 * PAGE_SIZE, 0))
        );
        assert!(l.range_bytes(PageRange::new(PageIndex(1), 4)).is_err());
        assert!(l.range_bytes(PageRange::new(PageIndex(5), 0)).is_err());
        assert!(
            l.range_bytes(PageRange::new(PageIndex(usize::MAX), 2))
                .is_err()
        );
        let e = l.range_bytes(PageRange::new(PageIndex(2), 3)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pages 2..5 lie outside the region of 4 pages"
        );
    }

    #[test]
    fn resolve_picks_the_region_and_page() {
        let a = RegionLayout::new(BASE, 2 * PAGE_SIZE).unwrap();
        let b = RegionLayout::new(BASE + 16 * PAGE_SIZE, 8 * PAGE_SIZE).unwrap();
        let rs = [a, b];
        assert_eq!(resolve(&rs, BASE + 5), Some((0, PageIndex(0))));
        assert_eq!(resolve(&rs, BASE + PAGE_SIZE), Some((0, PageIndex(1))));
        assert_eq!(resolve(&rs, BASE + 2 * PAGE_SIZE), None);
        assert_eq!(
            resolve(&rs, BASE + 16 * PAGE_SIZE + 7 * PAGE_SIZE + 4095),
            Some((1, PageIndex(7)))
        );
        assert_eq!(resolve(&rs, BASE + 24 * PAGE_SIZE), None);
        assert_eq!(resolve(&[], BASE), None);
        assert!(!a.overlaps(b));
        assert!(a.overlaps(RegionLayout::new(BASE + PAGE_SIZE, PAGE_SIZE).unwrap()));
    }

    #[test]
    fn coalesce_merges_consecutive_runs_in_order() {
        let p = |v: &[usize]| v.iter().map(|&i| PageIndex(i)).collect::<Vec<_>>();
        let runs: Vec<_> = coalesce(p(&[1, 2, 3, 7, 8, 10, 4])).collect();
        assert_eq!(
            runs,
            vec![
                PageRange::new(PageIndex(1), 3),
                PageRange::new(PageIndex(7), 2),
                PageRange::one(PageIndex(10)),
                PageRange::one(PageIndex(4)),
            ]
        );
        assert_eq!(coalesce(p(&[])).count(), 0);
        assert_eq!(
            coalesce((0..64).map(PageIndex)).collect::<Vec<_>>(),
            vec![PageRange::new(PageIndex(0), 64)]
        );
        // Duplicates are not merged (sort + dedup first); the result still covers them.
        assert_eq!(coalesce(p(&[5, 5])).count(), 2);
    }
}
