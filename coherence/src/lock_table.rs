//! Per-lock state indexed by lock number: the table behind a cluster's locks
//! ([`crate::Machine`]) and a manager's ([`crate::sync::LockManager`]).
//!
//! Every acquire and release looks a lock up two or three times (the cluster's state,
//! the manager's, the lock cache's check); in an ordered map keyed by [`LockId`] those
//! lookups were 4 % of a compute thread's samples in Water 512 × 50 on 2 × 1 over shared
//! memory (perf, 26,000 lock operations per cluster: a B-tree descent with a cache miss
//! per level). Here a lookup is two indexings: lock numbers are dense in practice
//! (applications allocate them from 0), so the table is a vector of chunks of
//! [`CHUNK`] slots, each chunk allocated on the first use of one of its locks — any of
//! the [`crate::MAX_LOCKS`] numbers may be used, and one used number costs one chunk,
//! not a table of a million slots. Iteration is in increasing lock number, as the
//! ordered map's was; equality and hashing see only the locks present (the model
//! checker compares and hashes machine states).
//!
//! Memory: a cluster's lock state is 200 bytes, a manager's 200 too (152 until its
//! per-cluster maps moved inside it, [`crate::small_map`]), so a chunk is 13 KiB, and a
//! table naming every one of the 2^20 locks ≈ 200 MiB — what an ordered map holding them
//! all took too. Locks are created by local use and by messages of the
//! job's other clusters, each checked first (a recall only from the lock's manager, a
//! request only for a lock managed here; between machines every datagram is
//! authenticated, so only from members of the job): a misbehaving member reaches that
//! bound with 16,384 messages naming locks 64 apart, where it took a million with the
//! map.
//!
//! Measured (2 vCPUs, Water 512 × 50, builds before and after alternating, median of
//! the per-pair time ratios, p25–p75; chunks of 256 slots then, the same two indexings):
//! 2 × 1 over shared memory 0.955 (0.91–1.03) over 24 pairs; 2 × 2 over UDP 0.92 (8
//! pairs).

use std::hash::{Hash, Hasher};

use crate::ids::LockId;

/// Log2 of the slots per chunk.
const CHUNK_BITS: u32 = 6;

/// Slots per chunk (locks whose numbers differ only in their low [`CHUNK_BITS`] bits).
const CHUNK: usize = 1 << CHUNK_BITS;

/// State `V` per lock, for the locks that have any (see the module documentation).
#[derive(Clone)]
pub(crate) struct LockTable<V> {
    chunks: Vec<Option<Box<[Option<V>]>>>,
    len: usize,
}

impl<V> Default for LockTable<V> {
    fn default() -> Self {
        LockTable {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

fn split(lock: LockId) -> (usize, usize) {
    let i = lock.index();
    (i >> CHUNK_BITS, i & (CHUNK - 1))
}

fn id(chunk: usize, slot: usize) -> LockId {
    LockId::new(((chunk << CHUNK_BITS) | slot) as u32).expect("a slot of a stored lock")
}

impl<V> LockTable<V> {
    /// The state of `lock`, if it has any.
    pub(crate) fn get(&self, lock: LockId) -> Option<&V> {
        let (c, s) = split(lock);
        self.chunks.get(c)?.as_ref()?[s].as_ref()
    }

    /// The state of `lock`, if it has any, for update.
    pub(crate) fn get_mut(&mut self, lock: LockId) -> Option<&mut V> {
        let (c, s) = split(lock);
        self.chunks.get_mut(c)?.as_mut()?[s].as_mut()
    }

    /// The state of `lock`, created as `V::default()` if it had none.
    pub(crate) fn get_or_default(&mut self, lock: LockId) -> &mut V
    where
        V: Default,
    {
        let (c, s) = split(lock);
        if self.chunks.len() <= c {
            self.chunks.resize_with(c + 1, || None);
        }
        let chunk = self.chunks[c].get_or_insert_with(|| (0..CHUNK).map(|_| None).collect());
        let slot = &mut chunk[s];
        if slot.is_none() {
            self.len += 1;
        }
        slot.get_or_insert_with(V::default)
    }

    /// Every lock with a state, in increasing lock number.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (LockId, &V)> {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| {
            chunk.iter().flat_map(move |slots| {
                slots
                    .iter()
                    .enumerate()
                    .filter_map(move |(s, v)| v.as_ref().map(|v| (id(c, s), v)))
            })
        })
    }

    /// The states of every lock, in increasing lock number.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Every lock numbered `from` or above with a state, in increasing lock number,
    /// for update.
    pub(crate) fn iter_mut_from(&mut self, from: LockId) -> impl Iterator<Item = (LockId, &mut V)> {
        let (first, first_slot) = split(from);
        self.chunks
            .iter_mut()
            .enumerate()
            .skip(first)
            .flat_map(move |(c, chunk)| {
                let skip = if c == first { first_slot } else { 0 };
                chunk.iter_mut().flat_map(move |slots| {
                    slots
                        .iter_mut()
                        .enumerate()
                        .skip(skip)
                        .filter_map(move |(s, v)| v.as_mut().map(|v| (id(c, s), v)))
                })
            })
    }

    /// Whether any lock numbered strictly between `low` and `high` has a state.
    pub(crate) fn any_between(&self, low: LockId, high: LockId) -> bool {
        if low >= high {
            return false;
        }
        let (first, first_slot) = split(low);
        let (last, last_slot) = split(high);
        (first..=last.min(self.chunks.len().saturating_sub(1))).any(|c| {
            let Some(slots) = self.chunks[c].as_ref() else {
                return false;
            };
            let from = if c == first { first_slot + 1 } else { 0 };
            let to = if c == last { last_slot } else { CHUNK };
            from < to && slots[from..to].iter().any(Option::is_some)
        })
    }
}

impl<V: PartialEq> PartialEq for LockTable<V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl<V: Eq> Eq for LockTable<V> {}

impl<V: Hash> Hash for LockTable<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.len.hash(state);
        for (lock, v) in self.iter() {
            lock.hash(state);
            v.hash(state);
        }
    }
}

impl<V: std::fmt::Debug> std::fmt::Debug for LockTable<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::hash::DefaultHasher;

    fn lock(n: u32) -> LockId {
        LockId::new(n).unwrap()
    }

    fn hash(t: &LockTable<u32>) -> u64 {
        let mut h = DefaultHasher::new();
        t.hash(&mut h);
        h.finish()
    }

    #[test]
    fn behaves_as_an_ordered_map() {
        // Numbers across chunks, the last valid one included, inserted out of order.
        let ids = [5, 0, 300, 255, 256, 1_048_575, 7, 513, 512];
        let mut t = LockTable::default();
        let mut m = BTreeMap::new();
        for (k, &n) in ids.iter().enumerate() {
            *t.get_or_default(lock(n)) += k as u32 + 1;
            *m.entry(lock(n)).or_default() += k as u32 + 1;
        }
        *t.get_or_default(lock(300)) += 10;
        *m.get_mut(&lock(300)).unwrap() += 10;
        assert_eq!(t.iter().count(), m.len());
        assert!(
            t.iter()
                .map(|(l, &v)| (l, v))
                .eq(m.iter().map(|(&l, &v)| (l, v)))
        );
        for n in [0, 1, 255, 256, 257, 511, 512, 1_048_575, 1_000_000] {
            assert_eq!(t.get(lock(n)), m.get(&lock(n)), "lock {n}");
        }
        *t.get_mut(lock(7)).unwrap() = 70;
        assert_eq!(t.get(lock(7)), Some(&70));
        assert!(t.get_mut(lock(8)).is_none());
        let from: Vec<_> = t.iter_mut_from(lock(256)).map(|(l, v)| (l, *v)).collect();
        let want: Vec<_> = m.range(lock(256)..).map(|(&l, &v)| (l, v)).collect();
        assert_eq!(from, want);
        let from: Vec<_> = t.iter_mut_from(lock(6)).map(|(l, _)| l.get()).collect();
        assert_eq!(from, [7, 255, 256, 300, 512, 513, 1_048_575]);
    }

    #[test]
    fn any_between_excludes_both_ends() {
        let mut t = LockTable::<u32>::default();
        for n in [4, 10, 300] {
            t.get_or_default(lock(n));
        }
        assert!(!t.any_between(lock(4), lock(10)));
        assert!(t.any_between(lock(3), lock(10)));
        assert!(t.any_between(lock(4), lock(11)));
        assert!(!t.any_between(lock(10), lock(300)));
        assert!(t.any_between(lock(10), lock(301)));
        assert!(t.any_between(lock(0), lock(5000)));
        assert!(!t.any_between(lock(300), lock(1_048_575)));
        assert!(!t.any_between(lock(10), lock(4)));
        assert!(!t.any_between(lock(4), lock(4)));
    }

    #[test]
    fn equality_and_hash_follow_the_contents() {
        // The same locks and states, created in another order.
        let mut a = LockTable::<u32>::default();
        let mut b = LockTable::<u32>::default();
        *a.get_or_default(lock(3)) = 1;
        *a.get_or_default(lock(600)) = 2;
        *b.get_or_default(lock(600)) = 2;
        *b.get_or_default(lock(3)) = 1;
        assert_eq!(a, b);
        assert_eq!(hash(&a), hash(&b));
        *b.get_mut(lock(600)).unwrap() = 3;
        assert_ne!(a, b);
        b.get_or_default(lock(4));
        *b.get_mut(lock(600)).unwrap() = 2;
        assert_ne!(a, b, "a lock with a default state still counts");
    }
}
