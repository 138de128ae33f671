//! A map of a few entries kept sorted by key inside its owner (up to [`INLINE`] of them
//! without a heap allocation): the per-cluster maps of a lock manager's per-lock state
//! ([`crate::sync`]: the tenure last granted to each cluster, and the predictions of who
//! takes the lock next).
//!
//! A lock's state is visited once per tenure, and a sweep such as Water's INTERF visits
//! hundreds of locks before it comes back to the first, so its state is cold in the cache
//! at every visit. As ordered maps (`BTreeMap`) each of those three maps was a node of
//! its own on the heap: one more cache miss per map and visit, on top of the state's
//! own. The load that reached the first map's node was half of `LockManager::hand_over`'s
//! own samples in a `perf` profile of Water 512 × 50 on 2×1 over shared memory, and the
//! maps' inserts and lookups about a third of the manager's release (sixty-eighth
//! session). Kept inside the lock's state, the entries arrive with it. The same reason
//! made the locks' table two indexings instead of a B-tree ([`crate::lock_table`]).
//!
//! Measured (2 vCPUs, Water 512 × 50 on 2×1 over shared memory): `hand_over`'s share of
//! the samples 0.97–0.99 % → 0.52–0.59 %, the manager's whole release 2.1–2.2 % →
//! 1.6–1.9 % (two `perf` profiles each); the run 0.988 × the time (p25–p75
//! 0.918–1.023), the median of 60 per-pair ratios against the build before, alternating.
//!
//! Iteration, equality and hashing see the entries in increasing key order, as the
//! ordered map's did (the model checker compares and hashes machine states).
//!
//! Cost: a manager's lock state grew from 152 to 200 bytes (the three maps' inline
//! entries against three map headers); a lock that more than four clusters take keeps its
//! entries on the heap, as before.

use std::fmt;

use smallvec::SmallVec;

/// Entries kept inline, before the map moves them to the heap: every cluster of a job
/// of up to four clusters in the tenure map.
pub(crate) const INLINE: usize = 4;

/// A map from `K` to `V`, sorted by key, its first [`INLINE`] entries stored in place
/// (see the module documentation).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct SmallMap<K, V>(SmallVec<[(K, V); INLINE]>);

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        SmallMap(SmallVec::new())
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for SmallMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    /// Where `key` is (`Ok`), or where it would go (`Err`).
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// The value of `key`, if any.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// The value of `key`, if any, to change.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.find(key).ok().map(move |i| &mut self.0[i].1)
    }

    /// Sets the value of `key`; returns the value it replaced, if any.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    /// The keys, in increasing order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.iter().map(|(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    use proptest::prelude::*;

    use super::*;

    fn hash_of<T: Hash>(t: &T) -> u64 {
        let mut h = DefaultHasher::new();
        t.hash(&mut h);
        h.finish()
    }

    proptest! {
        /// Any sequence of inserts leaves the map holding what an ordered map holds, in
        /// the same order, with the same values returned on the way; maps built in
        /// different orders with the same entries are equal and hash alike.
        #[test]
        fn behaves_as_an_ordered_map(ops in prop::collection::vec((0u8..12, any::<u16>()), 0..40)) {
            let mut small = SmallMap::default();
            let mut ordered = BTreeMap::new();
            for &(k, v) in &ops {
                prop_assert_eq!(small.insert(k, v), ordered.insert(k, v));
            }
            for k in 0u8..14 {
                prop_assert_eq!(small.get(&k), ordered.get(&k));
            }
            prop_assert!(small.keys().eq(ordered.keys()));
            prop_assert_eq!(format!("{small:?}"), format!("{ordered:?}"));
            let mut reversed = SmallMap::default();
            for (&k, &v) in ordered.iter().rev() {
                reversed.insert(k, v);
            }
            prop_assert_eq!(&reversed, &small);
            prop_assert_eq!(hash_of(&reversed), hash_of(&small));
        }
    }

    #[test]
    fn get_mut_changes_only_an_existing_entry() {
        let mut m = SmallMap::default();
        assert!(m.get_mut(&3).is_none());
        m.insert(3, 'a');
        *m.get_mut(&3).expect("present") = 'b';
        assert_eq!(m.get(&3), Some(&'b'));
        assert!(m.get_mut(&4).is_none());
        assert_eq!(m.keys().count(), 1);
    }

    #[test]
    fn more_entries_than_fit_inline_stay_sorted() {
        let mut m = SmallMap::default();
        for k in (0..3 * INLINE as u32).rev() {
            m.insert(k, k * 10);
        }
        assert!(m.keys().copied().eq(0..3 * INLINE as u32));
        assert_eq!(m.get(&7), Some(&70));
    }
}
