//! Intervals, write notices and vector timestamps (hlrc).
//!
//! # Scheme
//!
//! Each cluster's execution is divided into *intervals*, closed at every release
//! (lock release or barrier arrival) of any of its threads. An interval in which the
//! cluster wrote pages produces an [`IntervalRecord`]: its owner, its index (1, 2, …
//! per owner) and the *write notices* (the pages written). Intervals without writes
//! produce no record and do not advance the index.
//!
//! Every cluster keeps a [`VectorTime`] `V`: `V[j]` is the number of cluster `j`'s
//! records it has *seen* — always a prefix `1..=V[j]` — and, for forwarding, the
//! records themselves (since the last barrier). Seeing a record means having
//! invalidated its pages. This is the vector-timestamp scheme of LRC (Keleher, Cox,
//! Zwaenepoel, ISCA 1992 §4) as used by HLRC (Zhou, Iftode, Li, OSDI 1996 §2), with
//! one change: acquires go through a lock *manager* rather than the last releaser.
//!
//! * **Lock acquire**: the request carries the acquirer's `V_a`. The manager keeps,
//!   per lock, `V_L` (the vector time of the last release of the lock) and a store
//!   of records. The grant carries `V_L` and every record `(j, k)` with
//!   `V_a[j] < k <= V_L[j]`; the acquirer invalidates their pages and sets
//!   `V = max(V, V_L)`.
//! * **Lock release**: the release message carries the releaser's `V_r` (taken when
//!   its interval closed) and every record with `V_g[j] < k <= V_r[j]`, where `V_g` is
//!   the `V_L` it received with its grant; the manager sets `V_L = V_r`. It also
//!   carries the releaser's garbage-collection time (its last barrier, see below),
//!   so that a manager that has not yet processed that barrier's departure discards
//!   the same old records instead of seeing a gap (a lock held across a barrier).
//!
//! **Transitivity** (acquires ordered through different locks): if release `r1` of
//! lock `A` precedes (happens-before) acquire `a2` of lock `B`, there is a chain of
//! release→acquire edges and program order from `r1` to `a2`. Along the chain, each
//! cluster's `V` only grows and each release hands its manager every record up to its
//! `V`, so `V_B` at `a2`'s grant dominates `V` at `r1`; the grant sends every record
//! in `(V_a, V_B]`, and the acquirer already saw those below `V_a`. So the acquirer
//! sees every write notice that happens-before it, whichever locks the chain used.
//! The manager's store holds every record in `(gc, V_L]` for each lock it manages:
//! a release adds `(V_g, V_r]` and `V_g` is the previous `V_L` (the lock was held),
//! so the union over locks is a prefix per owner and grants never find a gap.
//!
//! * **Barrier**: each arrival carries the cluster's `V` and its *own* records since
//!   the previous barrier (every record newer than the previous barrier time was
//!   created by its owner, so the manager receives all of them); the manager sends
//!   each cluster the pages of the records it has not seen and the maximum `V`.
//!   Afterwards every cluster has seen every record, so all clusters and lock
//!   managers discard records up to that time (garbage collection at barriers, as in
//!   TreadMarks/HLRC). This requires barriers to include every thread of the job.
//!
//! Data availability: every write notice `(j, k)` of a page has a diff of that page
//! for interval `k` of cluster `j` ([`IntervalDiff`]), sent to the page's home and
//! carried by the lock handed over. A release does not wait for the home: each
//! cluster keeps per page the *versions* its copy reflects (per owner, the last
//! interval whose writes to the page it holds) and asks the home for at least those
//! versions when it fetches; the home answers once it has applied the diffs (HLRC's
//! per-page flush timestamps, Zhou, Iftode, Li, OSDI 1996 §2). See [`crate::hlrc`].

use std::collections::VecDeque;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::ids::{ClusterId, PageId};

/// A vector timestamp: entry `j` counts the intervals of cluster `j` seen. Missing
/// entries are zero, so the empty vector is the initial time (and sc never grows it).
///
/// Source: vector timestamps of LRC (Keleher, Cox, Zwaenepoel, ISCA 1992 §4) and
/// HLRC (OSDI 1996 §2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct VectorTime(SmallVec<[u32; 4]>);

impl VectorTime {
    /// The zero time.
    ///
    /// Source: see [`VectorTime`].
    pub fn new() -> Self {
        Self(SmallVec::new())
    }

    /// A time from explicit entries (entry `j` for cluster `j`). Only the first
    /// [`crate::MAX_CLUSTERS`] entries can be carried by a message; a longer time
    /// encodes to a body that [`crate::Message::from_parts`] rejects.
    ///
    /// Source: see [`VectorTime`].
    pub fn from_entries(entries: Vec<u32>) -> Self {
        let mut v = Self(SmallVec::from_vec(entries));
        v.trim();
        v
    }

    /// A time from the entries `entries` yields in cluster order, as
    /// [`VectorTime::from_entries`] without a vector in between (up to four clusters
    /// allocate nothing: a lock release asks for its store's base once or twice).
    ///
    /// Source: see [`VectorTime`].
    pub(crate) fn collect_entries(entries: impl IntoIterator<Item = u32>) -> Self {
        let mut v = Self(entries.into_iter().collect());
        v.trim();
        v
    }

    /// Entry for cluster `c` (zero when absent).
    ///
    /// Source: see [`VectorTime`].
    pub fn get(&self, c: ClusterId) -> u32 {
        self.0.get(c.index()).copied().unwrap_or(0)
    }

    /// Sets the entry for cluster `c`.
    ///
    /// Source: see [`VectorTime`].
    pub fn set(&mut self, c: ClusterId, v: u32) {
        if self.0.len() <= c.index() {
            self.0.resize(c.index() + 1, 0);
        }
        self.0[c.index()] = v;
        self.trim();
    }

    /// Entry-wise maximum with `other` (learning what `other` has seen).
    ///
    /// Source: see [`VectorTime`].
    pub fn merge(&mut self, other: &VectorTime) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (a, &b) in self.0.iter_mut().zip(other.0.iter()) {
            *a = (*a).max(b);
        }
    }

    /// Whether every entry of `self` is at least the matching entry of `other`.
    ///
    /// Source: see [`VectorTime`].
    pub fn dominates(&self, other: &VectorTime) -> bool {
        other
            .0
            .iter()
            .enumerate()
            .all(|(i, &b)| self.0.get(i).copied().unwrap_or(0) >= b)
    }

    /// The entries, index = cluster (trailing zeros omitted).
    ///
    /// Source: see [`VectorTime`].
    pub fn entries(&self) -> &[u32] {
        &self.0
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }
}

/// The write notices of one interval of one cluster: the pages it wrote.
///
/// Source: intervals and write notices of LRC (ISCA 1992 §4) and HLRC (OSDI 1996 §2).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IntervalRecord {
    /// The cluster that wrote.
    pub owner: ClusterId,
    /// The interval's index among `owner`'s records (1, 2, …).
    pub index: u32,
    /// The pages written in the interval, sorted, without duplicates (shared: records
    /// are copied between logs, stores and messages without copying their pages).
    pub pages: Arc<[PageId]>,
}

/// The bytes of an encoded diff ([`crate::diff`]), shared without copying between the
/// messages and stores that carry it. The machine never interprets them. Equality,
/// order and hash are those of the bytes.
///
/// Source: diffs of the multiple-writer protocol (Munin SOSP 1991 §3).
#[derive(Clone, Debug)]
pub struct DiffBytes(Shared);

/// Where a [`DiffBytes`] keeps its bytes: a small diff copied into one allocation, a
/// large one's encoding buffer taken over as it is (a page rewritten whole, EM3D's
/// values: 4 KiB not copied again), or a range of a received message buffer that other
/// messages share (an update decoded without copying its diff out of its bundle).
#[derive(Clone, Debug)]
enum Shared {
    /// No bytes, no allocation: a flush's result for each page it found unchanged. (An
    /// empty `Arc<[u8]>` is one static allocation whose count every clone and drop
    /// updates: with two clusters' threads in one process, `bench dsm`'s lock hand-off,
    /// that one contended cache line took ≈ 1 % of the samples; a `perf` profile,
    /// sixty-first session.)
    Empty,
    Copied(Arc<[u8]>),
    Taken(Arc<Vec<u8>>),
    /// `buf[start..end]`, checked in range when made (the buffer never changes).
    Part {
        buf: Arc<Vec<u8>>,
        start: usize,
        end: usize,
    },
}

impl DiffBytes {
    /// Copies encoded diff bytes into one shared allocation (a flush encodes each diff
    /// once, and every message and store then shares those bytes).
    ///
    /// Source: see [`DiffBytes`].
    pub fn new(bytes: impl AsRef<[u8]>) -> Self {
        Self(Shared::Copied(Arc::from(bytes.as_ref())))
    }

    /// Takes over the encoded diff `bytes` without copying them (for a large diff;
    /// [`DiffBytes::new`] allocates once for a small one).
    ///
    /// Source: see [`DiffBytes`].
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self(Shared::Taken(Arc::new(bytes)))
    }

    /// The bytes `range` of `buf`, shared with it without copying (a received bundle's
    /// buffer, which lives as long as any diff made from it); `None` if `range` is not
    /// within `buf`.
    ///
    /// Source: see [`DiffBytes`].
    pub fn shared(buf: &Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Option<Self> {
        buf.get(range.clone())?;
        Some(Self(Shared::Part {
            buf: Arc::clone(buf),
            start: range.start,
            end: range.end,
        }))
    }

    /// These bytes in an allocation of their own: a diff made with
    /// [`DiffBytes::shared`] is copied out of the buffer it shares (so that keeping the
    /// diff does not keep the whole received buffer), any other is returned as it is.
    ///
    /// Source: see [`DiffBytes`].
    pub fn unshared(self) -> Self {
        match self.0 {
            Shared::Part { .. } => Self::new(self.as_slice()),
            _ => self,
        }
    }

    /// The encoded runs.
    ///
    /// Source: see [`DiffBytes`].
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Shared::Empty => &[],
            Shared::Copied(b) => b,
            Shared::Taken(b) => b,
            Shared::Part { buf, start, end } => &buf[*start..*end],
        }
    }

    /// Whether the diff changes nothing.
    ///
    /// Source: see [`DiffBytes`].
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Length in bytes.
    ///
    /// Source: see [`DiffBytes`].
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }
}

impl Default for DiffBytes {
    fn default() -> Self {
        Self(Shared::Empty)
    }
}

impl PartialEq for DiffBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for DiffBytes {}

impl std::hash::Hash for DiffBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl PartialOrd for DiffBytes {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DiffBytes {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

/// The diff of one page made by one cluster for one of its intervals: what an
/// acquirer (or the page's home) applies to bring its copy up to that interval
/// instead of invalidating the page.
///
/// `base` is the page's versions the writer's copy reflected when the diff was taken
/// (per cluster, the last interval whose writes to the page it held; the writer's own
/// entry is its previous diff of the page). A copy may apply the diff only once it
/// reflects at least `base` (ignoring its own entry) and not yet `index` of `owner`:
/// then every write the diff's words depend on is already in the copy, and the diff
/// is applied once. Diffs of one page by different clusters in one interval touch
/// disjoint words (data-race-freedom), so any order that respects `base` is correct.
///
/// Source: lazy diffing and diff application at acquires (TreadMarks, Keleher et al.,
/// USENIX Winter 1994 §3.3); versions of a home's copy (HLRC, Zhou, Iftode, Li, OSDI
/// 1996 §2, per-page flush timestamps); data shipped with the lock that protects it
/// (Midway's entry consistency, Bershad, Zekauskas, Sawdon, COMPCON 1993).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IntervalDiff {
    /// The page.
    pub page: PageId,
    /// The cluster that wrote.
    pub owner: ClusterId,
    /// The interval (`owner`'s record index) the writes belong to.
    pub index: u32,
    /// The versions the diff was taken against (see above).
    pub base: VectorTime,
    /// The encoded runs.
    pub data: DiffBytes,
}

impl IntervalDiff {
    /// Whether a copy of the page that reflects `known` (at cluster `me`) can apply
    /// this diff now.
    ///
    /// Source: see [`IntervalDiff`].
    pub fn applies_to(&self, known: &VectorTime, me: ClusterId) -> bool {
        known.get(self.owner) < self.index
            && self
                .base
                .entries()
                .iter()
                .enumerate()
                .all(|(j, &v)| j == me.index() || known.entries().get(j).copied().unwrap_or(0) >= v)
    }
}

/// Why records could not be merged into a log.
///
/// Source: see the module documentation (records are received as prefixes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("interval record {owner:?}#{index} leaves a gap after #{known}")]
pub struct GapError {
    /// Owner of the offending record.
    pub owner: ClusterId,
    /// Its index.
    pub index: u32,
    /// The highest index already known.
    pub known: u32,
}

/// Records per owner: `base` (records `<= base` were discarded) and the records
/// `base+1 ..= base+len`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct OwnerLog {
    base: u32,
    records: VecDeque<IntervalRecord>,
}

impl OwnerLog {
    fn top(&self) -> u32 {
        self.base + self.records.len() as u32
    }
}

/// A set of interval records kept as a contiguous range per owner (a cluster's
/// knowledge, or a lock manager's store).
///
/// Source: see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct IntervalLog {
    owners: Vec<OwnerLog>,
}

impl IntervalLog {
    fn owner_mut(&mut self, c: ClusterId) -> &mut OwnerLog {
        if self.owners.len() <= c.index() {
            self.owners.resize(c.index() + 1, OwnerLog::default());
        }
        &mut self.owners[c.index()]
    }

    /// Highest index held (or discarded) for `owner`.
    pub(crate) fn top(&self, owner: ClusterId) -> u32 {
        self.owners.get(owner.index()).map_or(0, OwnerLog::top)
    }

    /// Adds a record; returns whether it was new. Records at or below the top are
    /// ignored; a record above `top + 1` is a gap.
    pub(crate) fn insert(&mut self, r: IntervalRecord) -> Result<bool, GapError> {
        let log = self.owner_mut(r.owner);
        let top = log.top();
        if r.index <= top {
            return Ok(false);
        }
        if r.index != top + 1 {
            return Err(GapError {
                owner: r.owner,
                index: r.index,
                known: top,
            });
        }
        log.records.push_back(r);
        Ok(true)
    }

    /// Appends `owner`'s records after this log's top up to `upto` from `other` (which
    /// must hold them). Fails, changing nothing more, at the first one `other` lacks.
    pub(crate) fn fill_from(
        &mut self,
        other: &IntervalLog,
        owner: ClusterId,
        upto: u32,
    ) -> Result<(), GapError> {
        for k in self.top(owner) + 1..=upto {
            let r = other.get(owner, k).ok_or(GapError {
                owner,
                index: k,
                known: self.top(owner).max(other.top(owner)),
            })?;
            self.insert(r.clone())?;
        }
        Ok(())
    }

    /// Every record `(j, k)` with `after[j] < k <= upto[j]`, by owner then index.
    /// Fails when one of them was discarded or never received.
    pub(crate) fn between(
        &self,
        after: &VectorTime,
        upto: &VectorTime,
    ) -> Result<Vec<IntervalRecord>, GapError> {
        self.between_with(&IntervalLog::default(), after, upto)
    }

    /// Record `(owner, index)`, if held.
    fn get(&self, owner: ClusterId, index: u32) -> Option<&IntervalRecord> {
        let log = self.owners.get(owner.index())?;
        if index <= log.base {
            return None;
        }
        log.records.get((index - log.base - 1) as usize)
    }

    /// [`IntervalLog::between`] over the union of this log and `other` (a lock
    /// manager's store and its own cluster's log): every record comes from whichever
    /// holds it.
    pub(crate) fn between_with(
        &self,
        other: &IntervalLog,
        after: &VectorTime,
        upto: &VectorTime,
    ) -> Result<Vec<IntervalRecord>, GapError> {
        let mut out = Vec::new();
        for (j, &hi) in upto.entries().iter().enumerate() {
            let Some(c) = ClusterId::new(j as u16) else {
                continue;
            };
            for k in after.get(c) + 1..=hi {
                let r = self.get(c, k).or_else(|| other.get(c, k)).ok_or(GapError {
                    owner: c,
                    index: k,
                    known: self.top(c).max(other.top(c)),
                })?;
                out.push(r.clone());
            }
        }
        Ok(out)
    }

    /// The highest index held (or discarded) per owner.
    pub(crate) fn tops(&self) -> VectorTime {
        VectorTime::collect_entries(self.owners.iter().map(OwnerLog::top))
    }

    /// The time up to which records were discarded, per owner.
    pub(crate) fn base(&self) -> VectorTime {
        VectorTime::collect_entries(self.owners.iter().map(|o| o.base))
    }

    /// Records of `owner` above `after`.
    pub(crate) fn owned_after(&self, owner: ClusterId, after: u32) -> Vec<IntervalRecord> {
        let Some(log) = self.owners.get(owner.index()) else {
            return Vec::new();
        };
        log.records
            .iter()
            .filter(|r| r.index > after)
            .cloned()
            .collect()
    }

    /// Discards every record `(j, k)` with `k <= upto[j]`.
    pub(crate) fn collect_garbage(&mut self, upto: &VectorTime) {
        if self.owners.len() < upto.entries().len() {
            self.owners
                .resize(upto.entries().len(), OwnerLog::default());
        }
        for (j, log) in self.owners.iter_mut().enumerate() {
            let Some(c) = ClusterId::new(j as u16) else {
                continue;
            };
            let u = upto.get(c);
            while log.base < u {
                if log.records.pop_front().is_none() {
                    log.base = u;
                    break;
                }
                log.base += 1;
            }
        }
    }

    /// Number of records held (for statistics and tests).
    pub(crate) fn len(&self) -> usize {
        self.owners.iter().map(|o| o.records.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: u16) -> ClusterId {
        ClusterId::new(n).unwrap()
    }
    fn hash_of(d: &DiffBytes) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        d.hash(&mut h);
        h.finish()
    }

    #[test]
    fn diff_bytes_compare_and_hash_by_their_bytes_however_kept() {
        let bytes = vec![
            0u8, 0, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
        ];
        let copied = DiffBytes::new(&bytes);
        let taken = DiffBytes::from_vec(bytes.clone());
        assert_eq!(copied, taken);
        assert_eq!(hash_of(&copied), hash_of(&taken));
        assert_eq!(copied.cmp(&taken), std::cmp::Ordering::Equal);
        assert_eq!(taken.as_slice(), &bytes[..]);
        assert_eq!(taken.len(), bytes.len());
        let other = DiffBytes::from_vec(vec![1]);
        assert_ne!(copied, other);
        assert!(copied < other, "ordered as the bytes are");
        assert!(DiffBytes::default().is_empty());
        assert_eq!(DiffBytes::default(), DiffBytes::from_vec(Vec::new()));
    }

    fn rec(o: u16, i: u32) -> IntervalRecord {
        IntervalRecord {
            owner: c(o),
            index: i,
            pages: vec![PageId::new(i).unwrap()].into(),
        }
    }

    #[test]
    fn vector_time_merge_and_dominate() {
        let mut a = VectorTime::from_entries(vec![1, 0, 3]);
        let b = VectorTime::from_entries(vec![2, 1]);
        assert!(!a.dominates(&b));
        a.merge(&b);
        assert_eq!(a.entries(), &[2, 1, 3]);
        assert!(a.dominates(&b));
        a.set(c(2), 0);
        assert_eq!(a.entries(), &[2, 1]);
        assert_eq!(VectorTime::from_entries(vec![0, 0]), VectorTime::new());
    }

    #[test]
    fn log_is_a_prefix_per_owner() {
        let mut l = IntervalLog::default();
        assert_eq!(l.insert(rec(1, 1)), Ok(true));
        assert_eq!(l.insert(rec(1, 1)), Ok(false));
        assert_eq!(
            l.insert(rec(1, 3)),
            Err(GapError {
                owner: c(1),
                index: 3,
                known: 1
            })
        );
        l.insert(rec(1, 2)).unwrap();
        l.insert(rec(0, 1)).unwrap();
        let got = l.between(
            &VectorTime::from_entries(vec![0, 1]),
            &VectorTime::from_entries(vec![1, 2]),
        );
        assert_eq!(got, Ok(vec![rec(0, 1), rec(1, 2)]));
        // asking beyond what is held is an error, not a silent omission
        assert!(
            l.between(&VectorTime::new(), &VectorTime::from_entries(vec![0, 5]))
                .is_err()
        );
        l.collect_garbage(&VectorTime::from_entries(vec![1, 1]));
        assert_eq!(l.len(), 1);
        assert_eq!(l.base(), VectorTime::from_entries(vec![1, 1]));
        assert!(
            l.between(&VectorTime::new(), &VectorTime::from_entries(vec![0, 2]))
                .is_err()
        );
        assert_eq!(l.top(c(1)), 2);
        // garbage collection past the top moves the base
        l.collect_garbage(&VectorTime::from_entries(vec![4, 4]));
        assert_eq!(l.top(c(1)), 4);
        assert_eq!(l.insert(rec(1, 5)), Ok(true));
        assert_eq!(l.owned_after(c(1), 0), vec![rec(1, 5)]);
    }
}
