//! A lock manager's store of carried diffs: the diffs that releases of its locks
//! carried to it, kept to be sent with later grants (see [`crate::sync`], *Carried
//! diffs*), bounded by [`MAX_MANAGER_DIFFS`].
//!
//! When the bound is passed, the store drops the oldest diff (lowest interval) of the
//! owner that has the most diffs stored. Each owner thus keeps its newest diffs, which
//! are the ones a grant needs, because its records are those that the acquirer lacks.
//! Dropping by the lowest key (owner, interval) instead emptied the lowest cluster's
//! share first and then dropped each of its new diffs on arrival. Two clusters that
//! passed a lock back and forth with no barrier between passes filled the store
//! after about 4,100 passes. From then on, every grant from cluster 0 reached
//! cluster 1 without its diff, so cluster 1 invalidated and fetched the page again
//! at each pass (the `bench dsm` lock hand-off over shared memory: 7.7 µs → 21 µs per
//! pass).

use std::collections::{BTreeMap, VecDeque};

use crate::ids::ClusterId;
use crate::interval::{IntervalDiff, VectorTime};

/// How many carried diffs a lock manager keeps, over all its locks, to send with
/// grants (see the module documentation of [`crate::sync`]). Beyond this bound, the
/// oldest diff (lowest interval) of the owner with the most diffs stored is dropped,
/// so that every owner keeps its newest diffs. Diffs of intervals every cluster has
/// seen are not kept at a release, and they are dropped at barriers.
///
/// Source: this project's bound (issue 10).
pub const MAX_MANAGER_DIFFS: usize = 4096;

/// The carried diffs a manager holds: per owner, in (interval, page) order, so that an
/// owner's oldest diff is the front of its queue and a release's new diff (the owner's
/// newest interval) goes to the back. An owner with no diff has no entry, so two stores
/// with the same diffs are equal.
///
/// (A map keyed by (owner, interval, page) with a count per owner, as before, cost a
/// search for the owner with the most diffs, a range lookup and a removal in a map of
/// 4,096 diffs at every release once the bound was reached. In `bench dsm`'s lock
/// hand-off, whose two clusters pass a lock back and forth with no barrier between
/// passes, the manager's handling of the other cluster's release took 1.05–1.92 µs with
/// that map and 1.17–1.79 µs with these queues: per-pair ratio 0.83 (0.78–1.70), six
/// alternating runs of 20,000 timestamped hand-offs each, medians, 2 vCPUs.)
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct CarriedDiffs {
    by_owner: BTreeMap<ClusterId, VecDeque<IntervalDiff>>,
    /// The number of diffs held, over all owners.
    len: usize,
}

impl CarriedDiffs {
    /// Keeps `d` (replacing a diff with the same owner, interval and page), then drops
    /// diffs while more than `bound` are held: each time the oldest of the owner with
    /// the most (the lowest such owner on a tie).
    pub(crate) fn insert(&mut self, d: IntervalDiff, bound: usize) {
        let q = self.by_owner.entry(d.owner).or_default();
        let key = (d.index, d.page);
        // A release carries the owner's newest interval: almost always the back.
        let at = match q.back() {
            Some(b) if (b.index, b.page) >= key => q.partition_point(|x| (x.index, x.page) < key),
            _ => q.len(),
        };
        match q.get_mut(at) {
            Some(x) if (x.index, x.page) == key => *x = d,
            _ => {
                q.insert(at, d);
                self.len += 1;
            }
        }
        while self.len > bound {
            // The owner with the most diffs, the lowest one on a tie.
            let Some(most) = self
                .by_owner
                .iter()
                .max_by(|(a, m), (b, n)| m.len().cmp(&n.len()).then(b.cmp(a)))
                .map(|(&o, _)| o)
            else {
                break;
            };
            self.drop_oldest(most);
        }
    }

    /// The diffs of `owner`'s interval `index`, in page order.
    pub(crate) fn of_interval(
        &self,
        owner: ClusterId,
        index: u32,
    ) -> impl Iterator<Item = &IntervalDiff> {
        self.by_owner.get(&owner).into_iter().flat_map(move |q| {
            let from = first_from(q, index);
            q.range(from..).take_while(move |x| x.index == index)
        })
    }

    /// Drops the diffs of the intervals up to `upto` (every cluster has seen them).
    pub(crate) fn collect_garbage(&mut self, upto: &VectorTime) {
        let mut dropped = 0;
        self.by_owner.retain(|&owner, q| {
            let seen = upto.get(owner);
            let n = q.partition_point(|x| x.index <= seen);
            q.drain(..n);
            dropped += n;
            !q.is_empty()
        });
        self.len -= dropped;
    }

    /// Number of diffs held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// The diffs held as (owner, interval, page), in that order.
    #[cfg(test)]
    fn keys(&self) -> impl Iterator<Item = (ClusterId, u32, crate::ids::PageId)> + '_ {
        self.by_owner
            .iter()
            .flat_map(|(&o, q)| q.iter().map(move |d| (o, d.index, d.page)))
    }

    /// Drops `owner`'s oldest diff.
    fn drop_oldest(&mut self, owner: ClusterId) {
        if let Some(q) = self.by_owner.get_mut(&owner)
            && q.pop_front().is_some()
        {
            self.len -= 1;
            if q.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
    }
}

/// Where `index`'s diffs begin in `q` (sorted by interval): the first position whose
/// interval is `index` or later, `q.partition_point(|x| x.index < index)`. Searched from
/// the back, by doubling steps and then bisecting between the last two probes: a grant
/// asks for the intervals the acquirer lacks, the newest ones, at or near the back of a
/// queue that holds up to [`MAX_MANAGER_DIFFS`]. A bisection of the whole queue makes 12
/// probes 72 bytes apart over 288 KiB, each a cache miss once the queue has left the
/// cache: ≈ 230 ns a lookup against ≈ 60 ns from the back (a standalone loop that
/// touches 2 MiB between lookups), and 3 % of the working (not waiting) samples of
/// `bench dsm`'s lock hand-off over shared memory, whose store stays full (a `perf`
/// profile; sixty-first session).
fn first_from(q: &VecDeque<IntervalDiff>, index: u32) -> usize {
    // Everything from `hi` on is at `index` or later; everything before `lo` earlier.
    let mut hi = q.len();
    let mut step = 1;
    let mut lo = loop {
        if step >= hi {
            break 0;
        }
        let probe = hi - step;
        if q[probe].index < index {
            break probe + 1;
        }
        hi = probe;
        step *= 2;
    };
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if q[mid].index < index {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// At most `bound` of `diffs` (a grant's, see [`crate::sync::MAX_GRANT_DIFFS`]), taken
/// from every owner in turn, newest first, and kept in their order: interval indices
/// count per owner, so the newest of one owner may be older than another owner's
/// oldest, and keeping the highest indices across owners would leave out every diff of
/// an owner whose count runs slower.
pub(crate) fn newest_per_owner(diffs: Vec<IntervalDiff>, bound: usize) -> Vec<IntervalDiff> {
    if diffs.len() <= bound {
        return diffs;
    }
    // Each diff's rank among its owner's, newest first.
    let mut order: Vec<usize> = (0..diffs.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&diffs[a], &diffs[b]);
        x.owner
            .cmp(&y.owner)
            .then(y.index.cmp(&x.index))
            .then(x.page.cmp(&y.page))
    });
    let mut rank = vec![0usize; diffs.len()];
    for (k, &i) in order.iter().enumerate() {
        if k > 0 && diffs[order[k - 1]].owner == diffs[i].owner {
            rank[i] = rank[order[k - 1]] + 1;
        }
    }
    let mut by_rank: Vec<usize> = (0..diffs.len()).collect();
    by_rank.sort_by_key(|&i| (rank[i], diffs[i].owner));
    let mut keep = vec![false; diffs.len()];
    for &i in &by_rank[..bound] {
        keep[i] = true;
    }
    diffs
        .into_iter()
        .zip(keep)
        .filter_map(|(d, k)| k.then_some(d))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PageId;
    use crate::interval::DiffBytes;

    fn diff(owner: u16, index: u32, page: u32) -> IntervalDiff {
        IntervalDiff {
            page: PageId::new(page).unwrap(),
            owner: ClusterId::new(owner).unwrap(),
            index,
            base: VectorTime::new(),
            data: DiffBytes::default(),
        }
    }

    fn held(s: &CarriedDiffs, owner: u16) -> Vec<u32> {
        let o = ClusterId::new(owner).unwrap();
        (0..=u32::from(u16::MAX))
            .filter(|&i| s.of_interval(o, i).next().is_some())
            .collect()
    }

    #[test]
    fn the_bound_keeps_every_owners_newest_diffs() {
        // Two owners releasing in turn, far past the bound: each keeps its newest
        // diffs (lowest keys first would keep none of cluster 0's).
        let mut s = CarriedDiffs::default();
        for i in 1..=100 {
            s.insert(diff(0, i, 7), 10);
            s.insert(diff(1, i, 7), 10);
        }
        assert_eq!(s.len(), 10);
        assert_eq!(held(&s, 0), (96..=100).collect::<Vec<_>>());
        assert_eq!(held(&s, 1), (96..=100).collect::<Vec<_>>());
    }

    #[test]
    fn the_owner_with_the_most_diffs_gives_way() {
        let mut s = CarriedDiffs::default();
        for i in 1..=8 {
            s.insert(diff(2, i, 1), 10);
        }
        s.insert(diff(0, 1, 1), 10);
        s.insert(diff(0, 2, 1), 10);
        // Full: a third diff of cluster 0 drops cluster 2's oldest, not its own.
        s.insert(diff(0, 3, 1), 10);
        assert_eq!(held(&s, 0), [1, 2, 3]);
        assert_eq!(held(&s, 2), (2..=8).collect::<Vec<_>>());
        // The same diff again replaces, it does not count twice.
        s.insert(diff(0, 3, 1), 10);
        assert_eq!(s.len(), 10);
        assert_eq!(held(&s, 2).len(), 7);
    }

    #[test]
    fn diffs_that_come_out_of_order_are_kept_in_order() {
        // A manager may learn an owner's diffs out of interval order (carried by other
        // clusters' releases): each goes to its place, a repeat replaces, and the bound
        // still drops the owner's oldest.
        let mut s = CarriedDiffs::default();
        for (i, p) in [(5, 1), (3, 1), (4, 2), (4, 1), (6, 1)] {
            s.insert(diff(0, i, p), 10);
        }
        let keys = |s: &CarriedDiffs| -> Vec<(u32, u32)> {
            s.keys().map(|(_, i, p)| (i, p.get())).collect()
        };
        assert_eq!(keys(&s), [(3, 1), (4, 1), (4, 2), (5, 1), (6, 1)]);
        let o = ClusterId::new(0).unwrap();
        let pages = |s: &CarriedDiffs, i| -> Vec<u32> {
            s.of_interval(o, i).map(|d| d.page.get()).collect()
        };
        assert_eq!(pages(&s, 4), [1, 2]);
        assert!(pages(&s, 2).is_empty());
        s.insert(diff(0, 4, 2), 10);
        assert_eq!(s.len(), 5);
        s.insert(diff(0, 2, 7), 5);
        // Six diffs for a bound of five: the oldest, the one just inserted, goes.
        assert_eq!(keys(&s), [(3, 1), (4, 1), (4, 2), (5, 1), (6, 1)]);
        let mut upto = VectorTime::new();
        upto.set(o, 4);
        s.collect_garbage(&upto);
        assert_eq!(keys(&s), [(5, 1), (6, 1)]);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn the_search_from_the_back_finds_what_a_bisection_finds() {
        // Every queue of up to 40 diffs with runs of equal intervals, every index
        // around them.
        for len in 0..40u32 {
            for run in 1..5u32 {
                let q: VecDeque<IntervalDiff> =
                    (0..len).map(|k| diff(0, 10 + 2 * (k / run), k)).collect();
                for index in 0..(14 + 2 * len) {
                    assert_eq!(
                        first_from(&q, index),
                        q.partition_point(|x| x.index < index),
                        "len {len} run {run} index {index}"
                    );
                }
            }
        }
    }

    fn owners_and_indices(diffs: &[IntervalDiff]) -> Vec<(u16, u32)> {
        diffs
            .iter()
            .map(|d| (d.owner.index() as u16, d.index))
            .collect()
    }

    #[test]
    fn a_grant_keeps_the_newest_diffs_of_every_owner() {
        // Cluster 0 counts its intervals far slower than cluster 2: the 5 newest of each
        // are kept, in the order given (the highest indices alone would be cluster 2's).
        let mut diffs: Vec<IntervalDiff> = (1..=20).map(|i| diff(0, i, 1)).collect();
        diffs.extend((1001..=1020).map(|i| diff(2, i, 1)));
        let got = owners_and_indices(&newest_per_owner(diffs, 10));
        let want: Vec<(u16, u32)> = (16..=20)
            .map(|i| (0, i))
            .chain((1016..=1020).map(|i| (2, i)))
            .collect();
        assert_eq!(got, want);
        // Within the bound, nothing is dropped or reordered.
        let few = vec![diff(2, 9, 1), diff(0, 3, 2)];
        assert_eq!(newest_per_owner(few.clone(), 10), few);
        // An owner with fewer diffs than its share leaves the rest to the others.
        let mut uneven = vec![diff(1, 7, 1)];
        uneven.extend((1..=9).map(|i| diff(0, i, 3)));
        assert_eq!(
            owners_and_indices(&newest_per_owner(uneven, 4)),
            [(1, 7), (0, 7), (0, 8), (0, 9)]
        );
    }

    #[test]
    fn garbage_collection_recounts() {
        let mut s = CarriedDiffs::default();
        for i in 1..=4 {
            s.insert(diff(0, i, 3), 100);
            s.insert(diff(0, i, 4), 100);
            s.insert(diff(1, i, 3), 100);
        }
        let mut upto = VectorTime::new();
        upto.set(ClusterId::new(0).unwrap(), 3);
        s.collect_garbage(&upto);
        assert_eq!(held(&s, 0), [4]);
        assert_eq!(s.of_interval(ClusterId::new(0).unwrap(), 4).count(), 2);
        assert_eq!(held(&s, 1), [1, 2, 3, 4]);
        // Cluster 1 has the most now (4 against 2): it gives way first, then cluster 0
        // (4 against 3) drops its oldest diff, one of the two of interval 4.
        for i in 5..=6 {
            s.insert(diff(0, i, 3), 6);
        }
        assert_eq!(held(&s, 1), [2, 3, 4]);
        assert_eq!(held(&s, 0), [4, 5, 6]);
        assert_eq!(s.of_interval(ClusterId::new(0).unwrap(), 4).count(), 1);
        assert_eq!(s, {
            // Equal to a store built with the same diffs directly.
            let mut t = CarriedDiffs::default();
            for (o, i, p) in [
                (0, 4, 4),
                (0, 5, 3),
                (0, 6, 3),
                (1, 2, 3),
                (1, 3, 3),
                (1, 4, 3),
            ] {
                t.insert(diff(o, i, p), 100);
            }
            t
        });
    }

    /// One step of a random history: a release carrying a diff of `owner`'s next
    /// interval, or a barrier dropping everything up to `upto` per owner.
    #[derive(Clone, Debug)]
    enum Step {
        Insert { owner: u16, page: u32 },
        Barrier { upto: [u32; 3] },
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            8 => (0u16..3, 0u32..4).prop_map(|(owner, page)| Step::Insert { owner, page }),
            1 => proptest::array::uniform3(0u32..40).prop_map(|upto| Step::Barrier { upto }),
        ]
    }

    proptest::proptest! {
        /// Against a plain list of the diffs kept: the store never holds more than
        /// its bound, its count per owner is that of its diffs, a diff is dropped only
        /// when the bound is passed (or by a barrier), and what the bound drops is
        /// always the oldest diff of an owner that held the most — so no owner with
        /// diffs stored loses its newest to another owner's.
        #[test]
        fn the_store_keeps_its_bound_and_drops_fairly(
            steps in proptest::collection::vec(step(), 1..300),
            bound in 1usize..12,
        ) {
            let mut s = CarriedDiffs::default();
            let mut next = [0u32; 3];
            let mut kept: Vec<(u16, u32, u32)> = Vec::new();
            for st in steps {
                match st {
                    Step::Insert { owner, page } => {
                        next[usize::from(owner)] += 1;
                        let index = next[usize::from(owner)];
                        s.insert(diff(owner, index, page), bound);
                        kept.push((owner, index, page));
                        while kept.len() > bound {
                            let count = |o: u16| kept.iter().filter(|k| k.0 == o).count();
                            let most = (0..3u16).max_by_key(|&o| (count(o), std::cmp::Reverse(o))).unwrap();
                            let oldest = kept
                                .iter()
                                .enumerate()
                                .filter(|(_, k)| k.0 == most)
                                .min_by_key(|(_, k)| (k.1, k.2))
                                .map(|(i, _)| i)
                                .unwrap();
                            kept.remove(oldest);
                        }
                    }
                    Step::Barrier { upto } => {
                        let mut t = VectorTime::new();
                        for (o, &u) in upto.iter().enumerate() {
                            t.set(ClusterId::new(o as u16).unwrap(), u);
                        }
                        s.collect_garbage(&t);
                        kept.retain(|k| k.1 > upto[usize::from(k.0)]);
                    }
                }
                proptest::prop_assert!(s.len() <= bound);
                let mut want = kept.clone();
                want.sort();
                let got: Vec<(u16, u32, u32)> = s
                    .keys()
                    .map(|(o, i, p)| (o.index() as u16, i, p.get()))
                    .collect();
                proptest::prop_assert_eq!(&got, &want);
                for o in 0..3u16 {
                    let n = want.iter().filter(|k| k.0 == o).count();
                    let counted = s.by_owner.get(&ClusterId::new(o).unwrap()).map_or(0, VecDeque::len);
                    proptest::prop_assert_eq!(counted, n);
                }
            }
        }
    }
}
