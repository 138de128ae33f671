//! Lock and barrier managers. Locks and barriers carry write notices, so they belong
//! to the coherence protocol. Each cluster's [`crate::Machine`] runs the manager of
//! the locks it is home of (`lock mod clusters`) and, on the configured cluster, the
//! barrier manager; these roles are driven by messages like the rest of the machine.
//!
//! * **Lock manager**: one holder per lock, FIFO waiters; a grant carries the lock's
//!   vector time and the interval records the acquirer has not seen
//!   ([`crate::interval`]). A queued request keeps the vector time it was sent with;
//!   the grant is computed when the lock is handed over.
//! * **Barrier manager**: one arrival per cluster (threads of a cluster meet locally
//!   first — the runtime's job); each arrival carries the cluster's vector time and
//!   own records; when all have arrived, each cluster gets a departure with the
//!   pages of the records it has not seen, the maximum time, and (hlrc) the
//!   single-writer home migrations.
//!
//! Source: lock managers and barrier manager of HLRC (OSDI 1996 §2–3) and
//! TreadMarks (Keleher et al., USENIX Winter 1994 §3: lock managers statically
//! assigned, barrier manager gathers and redistributes write notices); hierarchical
//! barriers from MGS (ISCA 1996 §3).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::ids::{ClusterId, LockId, PageId};
use crate::interval::{GapError, IntervalLog, IntervalRecord, VectorTime};
use crate::message::Message;

/// Why a manager rejected a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SyncError {
    NotHolder(LockId, ClusterId),
    Gap(GapError),
    Episode { expected: u32, got: u32 },
    DuplicateArrival(ClusterId),
    ForeignRecord(ClusterId),
}

impl From<GapError> for SyncError {
    fn from(e: GapError) -> Self {
        SyncError::Gap(e)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct LockState {
    holder: Option<ClusterId>,
    waiters: VecDeque<(ClusterId, VectorTime)>,
    time: VectorTime,
}

/// Manager of the locks whose home is this cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct LockManager {
    locks: BTreeMap<LockId, LockState>,
    store: IntervalLog,
}

impl LockManager {
    fn grant(
        &self,
        lock: LockId,
        st: &LockState,
        their: &VectorTime,
    ) -> Result<Message, SyncError> {
        Ok(Message::LockGrant {
            lock,
            time: st.time.clone(),
            records: self.store.between(their, &st.time)?,
        })
    }

    /// A request from `from`; returns the grant to send if the lock was free.
    pub(crate) fn acquire(
        &mut self,
        lock: LockId,
        from: ClusterId,
        time: VectorTime,
    ) -> Result<Option<(ClusterId, Message)>, SyncError> {
        let st = self.locks.entry(lock).or_default();
        if st.holder.is_some() {
            st.waiters.push_back((from, time));
            return Ok(None);
        }
        st.holder = Some(from);
        let st = &self.locks[&lock];
        Ok(Some((from, self.grant(lock, st, &time)?)))
    }

    /// A release by `from`; returns the grant for the next waiter, if any.
    pub(crate) fn release(
        &mut self,
        lock: LockId,
        from: ClusterId,
        time: &VectorTime,
        gc: &VectorTime,
        records: Vec<IntervalRecord>,
    ) -> Result<Option<(ClusterId, Message)>, SyncError> {
        let Some(st) = self.locks.get(&lock) else {
            return Err(SyncError::NotHolder(lock, from));
        };
        if st.holder != Some(from) {
            return Err(SyncError::NotHolder(lock, from));
        }
        // The releaser has passed a barrier at `gc`: every cluster has seen the
        // records up to it, so they will never be granted again.
        self.store.collect_garbage(gc);
        for r in records {
            self.store.insert(r)?;
        }
        let st = self.locks.get_mut(&lock).expect("checked above");
        st.time.merge(time);
        st.holder = None;
        let Some((next, their)) = st.waiters.pop_front() else {
            return Ok(None);
        };
        st.holder = Some(next);
        let st = &self.locks[&lock];
        Ok(Some((next, self.grant(lock, st, &their)?)))
    }

    /// Barrier garbage collection: every cluster has seen the records up to `upto`.
    /// Idle locks whose time is covered are forgotten.
    pub(crate) fn collect_garbage(&mut self, upto: &VectorTime) {
        self.store.collect_garbage(upto);
        self.locks.retain(|_, st| {
            st.holder.is_some() || !st.waiters.is_empty() || !upto.dominates(&st.time)
        });
    }

    /// Number of interval records held (tests and statistics).
    pub(crate) fn stored_records(&self) -> usize {
        self.store.len()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Arrival {
    time: VectorTime,
    records: Vec<IntervalRecord>,
    migratable: Vec<PageId>,
}

/// The barrier manager (on one configured cluster).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BarrierManager {
    episode: u32,
    arrivals: Vec<Option<Arrival>>,
}

impl BarrierManager {
    pub(crate) fn new(clusters: u16) -> Self {
        Self {
            episode: 0,
            arrivals: vec![None; usize::from(clusters)],
        }
    }

    /// An arrival; when it is the last one, returns the departures to send.
    pub(crate) fn arrive(
        &mut self,
        from: ClusterId,
        episode: u32,
        time: VectorTime,
        records: Vec<IntervalRecord>,
        migratable: Vec<PageId>,
        migrate: bool,
    ) -> Result<Option<Vec<(ClusterId, Message)>>, SyncError> {
        if episode != self.episode {
            return Err(SyncError::Episode {
                expected: self.episode,
                got: episode,
            });
        }
        if records.iter().any(|r| r.owner != from) {
            return Err(SyncError::ForeignRecord(from));
        }
        let slot = self
            .arrivals
            .get_mut(from.index())
            .ok_or(SyncError::DuplicateArrival(from))?;
        if slot.is_some() {
            return Err(SyncError::DuplicateArrival(from));
        }
        *slot = Some(Arrival {
            time,
            records,
            migratable,
        });
        if self.arrivals.iter().any(Option::is_none) {
            return Ok(None);
        }
        let arrivals: Vec<Arrival> = self.arrivals.iter_mut().filter_map(Option::take).collect();
        let mut max = VectorTime::new();
        for a in &arrivals {
            max.merge(&a.time);
        }
        // Writers of each page since the previous barrier.
        let mut writers: BTreeMap<PageId, BTreeSet<ClusterId>> = BTreeMap::new();
        for a in &arrivals {
            for r in &a.records {
                for &p in &r.pages {
                    writers.entry(p).or_default().insert(r.owner);
                }
            }
        }
        let mut migrations = Vec::new();
        if migrate {
            for (c, a) in arrivals.iter().enumerate() {
                for &p in &a.migratable {
                    let single = writers
                        .get(&p)
                        .is_some_and(|w| w.len() == 1 && w.first().map(|c| c.index()) == Some(c));
                    if single && let Some(c) = ClusterId::new(c as u16) {
                        migrations.push((p, c));
                    }
                }
            }
            migrations.sort_unstable();
            migrations.dedup_by_key(|m| m.0);
        }
        let mut out = Vec::with_capacity(arrivals.len());
        for (c, a) in arrivals.iter().enumerate() {
            let Some(to) = ClusterId::new(c as u16) else {
                continue;
            };
            let mut notices: Vec<PageId> = arrivals
                .iter()
                .flat_map(|b| b.records.iter())
                .filter(|r| r.owner != to && r.index > a.time.get(r.owner))
                .flat_map(|r| r.pages.iter().copied())
                .collect();
            notices.sort_unstable();
            notices.dedup();
            out.push((
                to,
                Message::BarrierDepart {
                    episode: self.episode,
                    time: max.clone(),
                    notices,
                    migrations: migrations.clone(),
                },
            ));
        }
        self.episode = self.episode.wrapping_add(1);
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: u16) -> ClusterId {
        ClusterId::new(n).unwrap()
    }
    fn p(n: u32) -> PageId {
        PageId::new(n).unwrap()
    }
    fn l() -> LockId {
        LockId::new(3).unwrap()
    }
    fn rec(o: u16, i: u32, pages: &[u32]) -> IntervalRecord {
        IntervalRecord {
            owner: c(o),
            index: i,
            pages: pages.iter().map(|&n| p(n)).collect(),
        }
    }

    #[test]
    fn lock_fifo_and_notices() {
        let mut m = LockManager::default();
        let g = m.acquire(l(), c(0), VectorTime::new()).unwrap();
        assert!(
            matches!(g, Some((to, Message::LockGrant { ref records, .. })) if to == c(0) && records.is_empty())
        );
        assert_eq!(m.acquire(l(), c(1), VectorTime::new()).unwrap(), None);
        assert_eq!(
            m.acquire(l(), c(2), VectorTime::from_entries(vec![1]))
                .unwrap(),
            None
        );
        // only the holder may release
        assert_eq!(
            m.release(l(), c(1), &VectorTime::new(), &VectorTime::new(), vec![]),
            Err(SyncError::NotHolder(l(), c(1)))
        );
        let t = VectorTime::from_entries(vec![1]);
        let g = m
            .release(l(), c(0), &t, &VectorTime::new(), vec![rec(0, 1, &[7])])
            .unwrap();
        assert_eq!(
            g,
            Some((
                c(1),
                Message::LockGrant {
                    lock: l(),
                    time: t.clone(),
                    records: vec![rec(0, 1, &[7])]
                }
            ))
        );
        let g = m
            .release(l(), c(1), &t, &VectorTime::new(), vec![])
            .unwrap();
        // cluster 2 already saw record (0,1)
        assert_eq!(
            g,
            Some((
                c(2),
                Message::LockGrant {
                    lock: l(),
                    time: t,
                    records: vec![]
                }
            ))
        );
        assert_eq!(m.stored_records(), 1);
        m.collect_garbage(&VectorTime::from_entries(vec![1]));
        assert_eq!(m.stored_records(), 0);
    }

    #[test]
    fn barrier_notices_and_migration() {
        let mut b = BarrierManager::new(3);
        let t = |v: Vec<u32>| VectorTime::from_entries(v);
        assert_eq!(
            b.arrive(
                c(0),
                0,
                t(vec![1]),
                vec![rec(0, 1, &[1, 2])],
                vec![p(1), p(2)],
                true
            )
            .unwrap(),
            None
        );
        assert_eq!(
            b.arrive(c(0), 0, t(vec![]), vec![], vec![], true),
            Err(SyncError::DuplicateArrival(c(0)))
        );
        assert_eq!(
            b.arrive(
                c(1),
                0,
                t(vec![1, 1]),
                vec![rec(1, 1, &[2])],
                vec![p(2)],
                true
            )
            .unwrap(),
            None
        );
        let out = b
            .arrive(c(2), 0, t(vec![]), vec![], vec![], true)
            .unwrap()
            .unwrap();
        let depart = |i: usize| match &out[i].1 {
            Message::BarrierDepart {
                notices,
                migrations,
                time,
                ..
            } => (notices.clone(), migrations.clone(), time.clone()),
            m => panic!("{m:?}"),
        };
        // page 1 had one writer (0), page 2 two writers: only page 1 migrates
        assert_eq!(depart(0).1, vec![(p(1), c(0))]);
        // cluster 0 has not seen (1,1); cluster 1 saw (0,1) already
        assert_eq!(depart(0).0, vec![p(2)]);
        assert_eq!(depart(1).0, vec![]);
        assert_eq!(depart(2).0, vec![p(1), p(2)]);
        assert_eq!(depart(2).2, t(vec![1, 1]));
        assert_eq!(
            b.arrive(c(0), 0, t(vec![]), vec![], vec![], true),
            Err(SyncError::Episode {
                expected: 1,
                got: 0
            })
        );
    }
}
