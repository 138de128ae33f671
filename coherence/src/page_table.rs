//! The machine's per-page state, one [`PageEntry`] per page of the region, allocated in
//! chunks when a page of the chunk first changes.
//!
//! A region has as many pages as the job configures (a DSM job's default 1 GiB is 262,144
//! pages) and a run touches few of them: building every entry up front wrote 8 MiB per
//! cluster before the first message and freed it at the end — a quarter of the CPU time
//! of starting and stopping a small two-cluster job. A page whose chunk has never been
//! written reads as its *initial* entry: untouched at its static home, invalid elsewhere
//! (and everywhere under first-touch, whose homes are not known yet), with no twin and
//! the zero version — what [`Machine::new`](crate::Machine::new) gave every page before.
//!
//! Equality and hashing (the model checker's state identity) look at what the pages
//! hold, not at which chunks happen to be allocated: a chunk written back to its initial
//! entries equals one never allocated.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Index, IndexMut};

use crate::config::Config;
use crate::home::initial_home;
use crate::ids::{ClusterId, PageId};
use crate::interval::VectorTime;
use crate::machine::PageAccess;

/// Entries per chunk: 512 × 32 bytes = 16 KiB, four pages of memory.
const CHUNK: usize = 512;

/// One page's state at one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PageEntry {
    pub(crate) access: PageAccess,
    /// hlrc: the page has a twin: it is writable and *open* (listed in
    /// `Machine::open`), and every flush diffs it.
    pub(crate) twin: bool,
    /// hlrc: open and unchanged at this many flushes in a row; at
    /// [`crate::Config::idle_flushes`] the next flush closes it.
    pub(crate) idle: u8,
    /// hlrc: the versions of the page this cluster's copy reflects (per cluster, the
    /// last interval whose writes to the page it holds; this cluster's own entry is
    /// its last diff of the page). For a missing copy, what the next fetch must
    /// reflect. At the home, the diffs applied to the master copy. See
    /// [`crate::interval::IntervalDiff`].
    pub(crate) known: VectorTime,
}

impl PageEntry {
    fn initial(access: PageAccess) -> PageEntry {
        PageEntry {
            access,
            twin: false,
            idle: 0,
            known: VectorTime::new(),
        }
    }
}

/// Every page's [`PageEntry`] at one cluster (see the module documentation).
#[derive(Clone)]
pub(crate) struct PageTable {
    chunks: Vec<Option<Box<[PageEntry]>>>,
    pages: usize,
    me: ClusterId,
    /// The job, for its pages' initial homes ([`initial_home`]).
    cfg: Config,
    untouched: PageEntry,
    invalid: PageEntry,
}

impl PageTable {
    /// The table of cluster `me` in the job `cfg`: every page at its initial entry.
    pub(crate) fn new(me: ClusterId, cfg: &Config) -> PageTable {
        let pages = cfg.pages as usize;
        PageTable {
            chunks: vec![None; pages.div_ceil(CHUNK)],
            pages,
            me,
            cfg: cfg.clone(),
            untouched: PageEntry::initial(PageAccess::Untouched),
            invalid: PageEntry::initial(PageAccess::Invalid),
        }
    }

    /// The initial entry of page `i` (`i < pages`).
    fn initial(&self, i: usize) -> &PageEntry {
        let home_here = PageId::new(i as u32)
            .and_then(|p| initial_home(&self.cfg, p))
            .is_some_and(|h| h == self.me);
        if home_here {
            &self.untouched
        } else {
            &self.invalid
        }
    }

    /// Page `i`'s entry, `None` outside the region.
    pub(crate) fn get(&self, i: usize) -> Option<&PageEntry> {
        if i >= self.pages {
            return None;
        }
        Some(match &self.chunks[i / CHUNK] {
            Some(chunk) => &chunk[i % CHUNK],
            None => self.initial(i),
        })
    }

    /// The pages whose entries differ from their initial ones, in page order.
    fn changed(&self) -> impl Iterator<Item = (usize, &PageEntry)> {
        self.chunks
            .iter()
            .enumerate()
            .filter_map(|(c, chunk)| chunk.as_ref().map(|chunk| (c * CHUNK, chunk)))
            .flat_map(|(first, chunk)| chunk.iter().enumerate().map(move |(j, e)| (first + j, e)))
            .filter(|&(i, e)| e != self.initial(i))
    }
}

impl Index<usize> for PageTable {
    type Output = PageEntry;

    /// # Panics
    /// If `i` is outside the region (as a slice would).
    fn index(&self, i: usize) -> &PageEntry {
        self.get(i).unwrap_or_else(|| {
            panic!(
                "page index {i} out of range for a region of {} pages",
                self.pages
            )
        })
    }
}

impl IndexMut<usize> for PageTable {
    /// Allocates the page's chunk, at its initial entries, the first time.
    ///
    /// # Panics
    /// If `i` is outside the region (as a slice would).
    fn index_mut(&mut self, i: usize) -> &mut PageEntry {
        assert!(
            i < self.pages,
            "page index {i} out of range for a region of {} pages",
            self.pages
        );
        let c = i / CHUNK;
        if self.chunks[c].is_none() {
            let first = c * CHUNK;
            let end = (first + CHUNK).min(self.pages);
            let chunk = (first..end).map(|p| self.initial(p).clone()).collect();
            self.chunks[c] = Some(chunk);
        }
        let chunk = self.chunks[c].as_mut().expect("allocated above");
        &mut chunk[i % CHUNK]
    }
}

impl PartialEq for PageTable {
    fn eq(&self, other: &PageTable) -> bool {
        self.pages == other.pages
            && self.me == other.me
            && self.cfg == other.cfg
            && self.changed().eq(other.changed())
    }
}

impl Eq for PageTable {}

impl Hash for PageTable {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.pages.hash(state);
        self.me.hash(state);
        for (i, e) in self.changed() {
            i.hash(state);
            e.hash(state);
        }
    }
}

impl fmt::Debug for PageTable {
    /// The pages that differ from their initial entries.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.changed()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HomePolicy;
    use std::collections::hash_map::DefaultHasher;

    fn cfg(pages: u32, policy: HomePolicy) -> Config {
        Config {
            home_policy: policy,
            ..Config::new(crate::config::Protocol::Hlrc, 2, pages)
        }
    }

    fn hash(t: &PageTable) -> u64 {
        let mut h = DefaultHasher::new();
        t.hash(&mut h);
        h.finish()
    }

    #[test]
    fn untouched_at_the_static_home_invalid_elsewhere() {
        let c = cfg(3 * CHUNK as u32 + 5, HomePolicy::RoundRobin);
        let me = ClusterId::new(1).unwrap();
        let t = PageTable::new(me, &c);
        for i in [0, 1, 2, 3, CHUNK, 3 * CHUNK + 4] {
            let want = if i % 2 == 1 {
                PageAccess::Untouched
            } else {
                PageAccess::Invalid
            };
            assert_eq!(t[i].access, want, "page {i}");
            assert!(!t[i].twin && t[i].idle == 0 && t[i].known == VectorTime::new());
        }
        assert!(t.get(3 * CHUNK + 5).is_none(), "past the region");
        let first_touch = PageTable::new(me, &cfg(8, HomePolicy::FirstTouch));
        assert!((0..8).all(|i| first_touch[i].access == PageAccess::Invalid));
    }

    #[test]
    fn a_write_allocates_one_chunk_at_its_initial_entries() {
        let c = cfg(4 * CHUNK as u32, HomePolicy::Block);
        let me = ClusterId::new(0).unwrap();
        let mut t = PageTable::new(me, &c);
        let before: Vec<PageEntry> = (0..t.pages).map(|i| t[i].clone()).collect();
        t[CHUNK + 3].access = PageAccess::ReadWrite;
        t[CHUNK + 3].twin = true;
        assert_eq!(t.chunks.iter().filter(|c| c.is_some()).count(), 1);
        for (i, e) in before.iter().enumerate() {
            if i != CHUNK + 3 {
                assert_eq!(&t[i], e, "page {i} keeps its entry");
            }
        }
        assert_eq!(t[CHUNK + 3].access, PageAccess::ReadWrite);
        assert_eq!(t.changed().map(|(i, _)| i).collect::<Vec<_>>(), [CHUNK + 3]);
    }

    #[test]
    fn identity_is_the_pages_not_the_chunks() {
        let c = cfg(2 * CHUNK as u32, HomePolicy::RoundRobin);
        let me = ClusterId::new(0).unwrap();
        let fresh = PageTable::new(me, &c);
        let mut written_back = fresh.clone();
        let saved = written_back[7].clone();
        written_back[7].access = PageAccess::ReadOnly;
        assert_ne!(written_back, fresh);
        written_back[7] = saved;
        assert!(
            written_back.chunks[0].is_some(),
            "the chunk stays allocated"
        );
        assert_eq!(written_back, fresh);
        assert_eq!(hash(&written_back), hash(&fresh));
        let mut other = fresh.clone();
        other[CHUNK + 1].idle = 1;
        assert_ne!(other, fresh);
        assert_ne!(hash(&other), hash(&fresh));
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn a_page_past_the_region_panics_like_a_slice() {
        let c = cfg(10, HomePolicy::RoundRobin);
        let mut t = PageTable::new(ClusterId::new(0).unwrap(), &c);
        t[10].idle = 1;
    }
}
