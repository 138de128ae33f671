//! The twins of a cluster's open pages and the scratch page a flush reads a page into.
//!
//! A twin is the copy of a page taken when the page is opened for writing; each flush
//! diffs the page against it (multiple-writer protocol: TreadMarks, Keleher, Cox,
//! Dwarkadas, Zwaenepoel, USENIX Winter 1994 §4; HLRC, Zhou, Iftode, Li, OSDI 1996 §2).
//!
//! Page buffers come in chunks of [`CHUNK`] pages, allocated at once and faulted in
//! right away, and go back to a free list when their twin is dropped; none is returned
//! to the allocator before the cluster ends. A twin allocated alone came from the
//! allocating thread's `malloc` arena, which glibc grows by one `mprotect` of the
//! arena's next page per twin, and its first write then faulted that fresh page in: a
//! home sharing a private page for the first time spent 2.8 µs of its 3.8 µs there
//! (`bench dsm`'s remote read fault with the home's thread polling, a probe, AMD Zen 5
//! VM, 2026-12-04).

use crate::uffd::PAGE_SIZE;
use std::collections::HashMap;

/// Pages per chunk (256 KiB: above glibc's `mmap` threshold, so a chunk is a mapping of
/// its own rather than part of a thread's arena).
pub(crate) const CHUNK: usize = 64;

/// One page buffer.
type Page = [u8; PAGE_SIZE];

/// Where a buffer lies: chunk and index in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    chunk: u32,
    index: u32,
}

/// The twins by page id, the scratch page, and the free buffers.
pub(crate) struct Twins {
    chunks: Vec<Box<[Page]>>,
    by_page: HashMap<u32, Slot>,
    free: Vec<Slot>,
    scratch: Slot,
}

impl Twins {
    /// An empty set with its scratch page (one chunk).
    pub(crate) fn new() -> Self {
        let mut t = Twins {
            chunks: Vec::new(),
            by_page: HashMap::new(),
            free: Vec::new(),
            scratch: Slot { chunk: 0, index: 0 },
        };
        t.scratch = t.take_free();
        t
    }

    /// A free buffer; a new chunk when none is left.
    fn take_free(&mut self) -> Slot {
        if let Some(s) = self.free.pop() {
            return s;
        }
        let chunk = u32::try_from(self.chunks.len()).expect("fewer than 2^32 chunks");
        let mut pages: Box<[Page]> = vec![[0u8; PAGE_SIZE]; CHUNK].into_boxed_slice();
        // The allocation is zeroed lazily (a fresh mapping): fault every page in now,
        // once per chunk, rather than at each twin's first copy. `black_box` keeps the
        // store of a zero the allocation already holds.
        for p in pages.iter_mut() {
            p[0] = std::hint::black_box(0);
        }
        self.chunks.push(pages);
        self.free
            .extend((1..CHUNK as u32).rev().map(|index| Slot { chunk, index }));
        Slot { chunk, index: 0 }
    }

    #[cfg(test)]
    fn page(&self, s: Slot) -> &Page {
        &self.chunks[s.chunk as usize][s.index as usize]
    }

    fn page_mut(&mut self, s: Slot) -> &mut Page {
        &mut self.chunks[s.chunk as usize][s.index as usize]
    }

    /// A new twin for `page` (its previous one, if any, is freed), to be filled by the
    /// caller with the page's contents.
    pub(crate) fn make(&mut self, page: u32) -> &mut Page {
        let s = self.take_free();
        if let Some(old) = self.by_page.insert(page, s) {
            self.free.push(old);
        }
        self.page_mut(s)
    }

    /// The twin of `page`.
    #[cfg(test)]
    fn get(&self, page: u32) -> Option<&Page> {
        self.by_page.get(&page).map(|&s| self.page(s))
    }

    /// The twin of `page`, to update.
    pub(crate) fn get_mut(&mut self, page: u32) -> Option<&mut Page> {
        let s = *self.by_page.get(&page)?;
        Some(self.page_mut(s))
    }

    /// Drops the twin of `page`; `false` if it had none.
    pub(crate) fn remove(&mut self, page: u32) -> bool {
        match self.by_page.remove(&page) {
            Some(s) => {
                self.free.push(s);
                true
            }
            None => false,
        }
    }

    /// The twin of `page` and the scratch page, both writable.
    pub(crate) fn with_scratch(&mut self, page: u32) -> Option<(&mut Page, &mut Page)> {
        let (t, s) = (*self.by_page.get(&page)?, self.scratch);
        Some(if t.chunk == s.chunk {
            let [a, b] = self.chunks[t.chunk as usize]
                .get_disjoint_mut([t.index as usize, s.index as usize])
                .expect("a twin is never the scratch page");
            (a, b)
        } else {
            let [a, b] = self
                .chunks
                .get_disjoint_mut([t.chunk as usize, s.chunk as usize])
                .expect("distinct chunks");
            (&mut a[t.index as usize], &mut b[s.index as usize])
        })
    }

    /// Makes the scratch page the twin of `page` and its old twin the scratch page (no
    /// copy: the flush just read the page into the scratch page). `false` if `page` has
    /// no twin.
    pub(crate) fn swap_scratch(&mut self, page: u32) -> bool {
        match self.by_page.get_mut(&page) {
            Some(t) => {
                std::mem::swap(t, &mut self.scratch);
                true
            }
            None => false,
        }
    }

    /// Twins held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_page.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twins_keep_their_contents_across_chunks_and_reuse() {
        let mut t = Twins::new();
        let n = 3 * CHUNK as u32;
        for p in 0..n {
            t.make(p).fill(p as u8);
        }
        assert_eq!(t.len(), n as usize);
        assert_eq!(t.chunks.len(), 4, "scratch + 3 × 64 twins need 4 chunks");
        for p in 0..n {
            assert!(t.get(p).unwrap().iter().all(|&b| b == p as u8), "page {p}");
        }
        // Freed buffers are reused before any new chunk.
        for p in 0..CHUNK as u32 {
            assert!(t.remove(p));
        }
        assert!(!t.remove(0), "already dropped");
        for p in n..n + CHUNK as u32 {
            t.make(p).fill(0xEE);
        }
        assert_eq!(t.chunks.len(), 4);
        assert!(
            t.get(CHUNK as u32)
                .unwrap()
                .iter()
                .all(|&b| b == CHUNK as u8)
        );
        // A second twin of a page replaces the first and frees it.
        t.make(n).fill(1);
        assert_eq!(t.get(n).unwrap()[0], 1);
        assert_eq!(t.len(), 3 * CHUNK);
    }

    #[test]
    fn the_scratch_page_swaps_with_a_twin_in_any_chunk() {
        let mut t = Twins::new();
        // Page 0's twin shares the scratch page's chunk; page 1000's lies in the next.
        t.make(0).fill(1);
        for p in 1..CHUNK as u32 {
            t.make(p + 1000).fill(2);
        }
        for page in [0, 1000 + CHUNK as u32 - 1] {
            let before = t.get(page).unwrap()[0];
            let (twin, scratch) = t.with_scratch(page).unwrap();
            assert_eq!(twin[0], before);
            scratch.fill(9);
            assert!(t.swap_scratch(page));
            assert!(t.get(page).unwrap().iter().all(|&b| b == 9));
            let (_, scratch) = t.with_scratch(page).unwrap();
            assert_eq!(scratch[0], before, "the old twin is the scratch page now");
        }
        assert!(t.with_scratch(77).is_none());
        assert!(!t.swap_scratch(77));
        assert!(t.get_mut(77).is_none());
    }
}
