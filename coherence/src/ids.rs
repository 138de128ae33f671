//! Identifiers and sizes shared by every protocol: clusters, pages, locks, tokens.
//!
//! The identifier types check their range on construction, so every value that
//! reaches a [`crate::Message`] fits its field of the 40-bit Express payload
//! (design.md, *messaging*: "pages are < 2^24, clusters < 2^10, locks < 2^20").

use std::fmt;

/// Bytes in one DSM page, the unit of coherence between clusters.
///
/// Source: MGS (Yeung, Kubiatowicz, Agarwal, ISCA 1996) §3 keeps coherence between
/// SMP nodes at virtual-memory page grain; Linux x86-64 pages are 4 KiB.
pub const PAGE_SIZE: usize = 4096;

/// Bytes in one diff word: diffs compare a page with its twin in 8-byte words.
///
/// Source: twins and diffs of the multiple-writer protocol (Carter, Bennett,
/// Zwaenepoel, Munin, SOSP 1991 §3; reused by MGS ISCA 1996 §3 and HLRC, Zhou,
/// Iftode, Li, OSDI 1996 §2). Word grain: a data-race-free program never has two
/// clusters write the same aligned word between synchronizations.
pub const WORD_SIZE: usize = 8;

/// Words in one page ([`PAGE_SIZE`] / [`WORD_SIZE`]).
///
/// Source: see [`WORD_SIZE`].
pub const WORDS_PER_PAGE: usize = PAGE_SIZE / WORD_SIZE;

/// Exclusive upper bound of a cluster number (10 bits in the Express payload).
///
/// Source: message-layer constraint of issue 4 (design.md, *messaging*).
pub const MAX_CLUSTERS: u16 = 1 << 10;

/// Exclusive upper bound of a page number (24 bits in the Express payload).
///
/// Source: message-layer constraint of issue 4 (design.md, *messaging*).
pub const MAX_PAGES: u32 = 1 << 24;

/// Exclusive upper bound of a lock number (20 bits in the Express payload).
///
/// Source: message-layer constraint of issue 4 (design.md, *messaging*).
pub const MAX_LOCKS: u32 = 1 << 20;

macro_rules! checked_id {
    ($(#[$doc:meta])* $name:ident, $repr:ty, $max:expr, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name($repr);

        impl $name {
            #[doc = concat!("The ", $what, " numbered `n`, or `None` when `n` is out of range.")]
            ///
            /// Source: field widths of the Express payload (design.md, *messaging*).
            pub const fn new(n: $repr) -> Option<Self> {
                if n < $max { Some(Self(n)) } else { None }
            }

            #[doc = concat!("The number of this ", $what, ".")]
            ///
            /// Source: field widths of the Express payload (design.md, *messaging*).
            pub const fn get(self) -> $repr {
                self.0
            }

            /// The number as an index into per-item tables.
            ///
            /// Source: field widths of the Express payload (design.md, *messaging*).
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

checked_id!(
    /// A cluster: one OS process, one coherence [`crate::Machine`], several compute
    /// threads sharing one copy of each page. Always `< MAX_CLUSTERS`.
    ///
    /// Source: MGS (ISCA 1996) §2, an SMP node is the unit that shares pages in
    /// software; design.md, *The system in one paragraph*.
    ClusterId, u16, MAX_CLUSTERS, "cluster"
);

checked_id!(
    /// A page of the DSM region, numbered from the region base. Always `< MAX_PAGES`.
    ///
    /// Source: page-grain coherence between clusters, MGS (ISCA 1996) §3.
    PageId, u32, MAX_PAGES, "page"
);

checked_id!(
    /// A distributed lock. Always `< MAX_LOCKS`. Its manager is cluster
    /// `lock mod clusters` (see [`crate::Config::lock_manager`]).
    ///
    /// Source: lock acquire/release as the synchronization points of release
    /// consistency (Gharachorloo et al., ISCA 1990 §3; HLRC, OSDI 1996 §2).
    LockId, u32, MAX_LOCKS, "lock"
);

/// Identifies one blocked page fault (typically the faulting thread), chosen by the
/// runtime and handed back unchanged in [`crate::Action::Wake`].
///
/// Source: issue 4 requirement that concurrent faults on one page cause one fetch and
/// all waiters are woken when the page is installed (MGS ISCA 1996 §3: threads of an
/// SMP node share the node's page copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FaultToken(pub u64);

/// Identifies one blocked synchronization call (acquire, release or barrier) chosen by
/// the runtime and handed back in the matching completion action.
///
/// Source: acquire/release completion of release consistency (HLRC, OSDI 1996 §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SyncToken(pub u64);

/// A run of consecutive pages, so that write-protection and invalidation can be
/// issued as one system call (`UFFDIO_WRITEPROTECT`, `madvise(MADV_DONTNEED)`).
///
/// Source: issue 4 ("invalidate (batched page ranges where possible)").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageRange {
    /// First page of the run.
    pub start: PageId,
    /// Number of pages in the run (at least 1).
    pub count: u32,
}

impl PageRange {
    /// The pages of the run, in increasing order.
    ///
    /// Source: issue 4 (batched page ranges).
    pub fn pages(self) -> impl Iterator<Item = PageId> {
        (self.start.0..self.start.0 + self.count).map(PageId)
    }

    /// Coalesces `pages` (sorted and deduplicated here) into maximal runs.
    ///
    /// Source: issue 4 (batched page ranges).
    pub fn coalesce(pages: &mut Vec<PageId>) -> Vec<PageRange> {
        pages.sort_unstable();
        pages.dedup();
        let mut out: Vec<PageRange> = Vec::new();
        for &p in pages.iter() {
            match out.last_mut() {
                Some(r) if r.start.0 + r.count == p.0 => r.count += 1,
                _ => out.push(PageRange { start: p, count: 1 }),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_check_range() {
        assert!(ClusterId::new(1023).is_some());
        assert!(ClusterId::new(1024).is_none());
        assert!(PageId::new(MAX_PAGES - 1).is_some());
        assert!(PageId::new(MAX_PAGES).is_none());
        assert!(LockId::new(MAX_LOCKS).is_none());
    }

    #[test]
    fn coalesce_makes_maximal_runs() {
        let p = |n| PageId::new(n).unwrap();
        let mut v = vec![p(5), p(1), p(2), p(2), p(3), p(7), p(6)];
        let r = PageRange::coalesce(&mut v);
        assert_eq!(
            r,
            vec![
                PageRange {
                    start: p(1),
                    count: 3
                },
                PageRange {
                    start: p(5),
                    count: 3
                }
            ]
        );
        assert_eq!(r[1].pages().collect::<Vec<_>>(), vec![p(5), p(6), p(7)]);
    }
}
