//! The cluster side of the locks: acquiring and releasing among the cluster's
//! threads, caching a granted lock, giving it back (recalled, contended or pushed)
//! with the diffs of the intervals it protected, and taking a grant (its write
//! notices and carried diffs). The managers are in [`crate::sync`], whose module
//! documentation states the rules (tenures, caching, pushes, carried diffs).

use std::collections::VecDeque;

use smallvec::SmallVec;

use crate::action::{Action, FlushPage};
use crate::config::Protocol;
use crate::error::ProtocolError;
use crate::ids::{ClusterId, LockId, PageId, SyncToken};
use crate::interval::{IntervalDiff, IntervalRecord, VectorTime};
use crate::lock_table::LockTable;
use crate::machine::{Completion, Held, Machine, Resume};
use crate::message::Message;
use crate::sync::{MAX_CARRIED_DIFFS, MAX_LOCAL_HANDOFFS, next_tenure};

/// A lock as seen by this cluster (not as its manager): owned or not, held by a
/// local thread or cached, requested, recalled. See [`crate::sync`] (lock caching,
/// tenures, pushes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct ClusterLock {
    /// While this cluster owns the lock (granted by the manager and not yet given
    /// back): the lock's vector time at the grant.
    pub(crate) owned: Option<VectorTime>,
    /// The tenure owned, or the last one granted to this cluster (0: none).
    pub(crate) tenure: u32,
    /// A thread of this cluster holds the lock.
    pub(crate) busy: bool,
    /// A `LockAcquire` is outstanding.
    pub(crate) requested: bool,
    /// The manager asked for the lock back: it goes as soon as no local thread holds
    /// it (after at most [`MAX_LOCAL_HANDOFFS`] hand-offs).
    pub(crate) recalled: bool,
    /// Give the lock back soon after a release, without waiting for a recall: the
    /// grant said it is contended, or it was pushed here.
    pub(crate) eager: bool,
    /// The lock is being given back: its interval is being flushed.
    pub(crate) returning: bool,
    /// A thread of this cluster took the lock in the current tenure.
    pub(crate) used: bool,
    /// Another cluster had to recall the lock while it waited here for a release
    /// batch: its eager releases skip the batch (a lock passed back and forth on
    /// requests is wanted at once; see [`crate::Config::release_batch`]) until it
    /// comes here as a push again (nobody was waiting for it then).
    pub(crate) wanted: bool,
    /// A pushed grant no local thread has used yet.
    pub(crate) pushed: Option<Pushed>,
    /// Recalls of tenures other than the one owned or last owned: those that overtook
    /// the grant of their tenure (the network reorders), and stale ones of tenures
    /// given back earlier. The next grant keeps its own and drops the rest: no recall
    /// of a later tenure can exist before that grant arrives.
    pub(crate) early_recalls: Vec<u32>,
    /// Hand-offs between local threads since the lock had to go back.
    pub(crate) handoffs: u32,
    /// Local uses (acquires by this cluster's threads) in the current *visit*: the
    /// tenures granted here one after the other, no other cluster's tenure between.
    pub(crate) visit_uses: u32,
    /// `visit_uses` of the last visit with any: a contended or pushed lock released
    /// after fewer uses than that in this visit is kept for the next local use instead
    /// of going back (see [`crate::sync`], *Visits*).
    pub(crate) expect_uses: u32,
    /// This cluster's interval index when a local thread first took the current
    /// tenure: the release carries the diffs of the intervals closed after it.
    pub(crate) since: u32,
    /// Local threads waiting for the lock, in arrival order.
    pub(crate) waiters: VecDeque<SyncToken>,
}

/// A pushed grant before its first local use.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pushed {
    /// Its notices took effect when it arrived (pages homed here may still lack some
    /// of their diffs: the first local acquire waits for those).
    Taken,
    /// Its records leave a gap in this cluster's log: it arrived from a manager that
    /// has passed a barrier this cluster is still waiting at (its records stop at the
    /// departure, which this cluster has not processed), or it overtook an earlier
    /// push whose records it leaves out (the manager's `pushed_upto` in
    /// [`crate::sync`]). Taken at the first local acquire if the gap has closed by
    /// then, else given back untouched and the lock asked for.
    Deferred {
        /// The lock's time.
        time: VectorTime,
        /// Its records.
        records: Vec<IntervalRecord>,
        /// Its diffs.
        diffs: Vec<IntervalDiff>,
    },
}

/// A grant being taken: the lock's time, the records the cluster has not seen and
/// the diffs carried with them; `token` names the acquiring thread, `None` for a push
/// (taken when it arrives, used by a later local acquire).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Grant {
    pub(crate) lock: LockId,
    pub(crate) token: Option<SyncToken>,
    pub(crate) time: VectorTime,
    pub(crate) records: Vec<IntervalRecord>,
    pub(crate) diffs: Vec<IntervalDiff>,
}

impl Machine {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_lock_grant(
        &mut self,
        from: ClusterId,
        lock: LockId,
        time: VectorTime,
        records: Vec<IntervalRecord>,
        diffs: Vec<IntervalDiff>,
        stored: u32,
        tenure: u32,
        contended: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let unexpected = |what| ProtocolError::Unexpected {
            what,
            from,
            page: None,
        };
        if self.cfg.lock_manager(lock) != from {
            return Err(unexpected(
                "lock grant from a cluster that does not manage it",
            ));
        }
        for d in &diffs {
            self.check_page(d.page)?;
            if !self.cfg.has_cluster(d.owner) {
                return Err(ProtocolError::NoSuchCluster(d.owner));
            }
        }
        if self
            .cluster_locks
            .get(lock)
            .is_some_and(|l| l.owned.is_some())
        {
            return Err(unexpected("lock grant for a lock this cluster owns"));
        }
        // The manager's store holds every record up to the lock's time, and this
        // cluster's own up to `stored`.
        self.manager_seen.entry(from).or_default().merge(&time);
        self.note_stored(from, stored);
        let covered = self.covers(&time, &records);
        let l = self.cluster_locks.get_or_default(lock);
        // The tenure right after this cluster's last one continues its visit.
        if l.tenure == 0 || next_tenure(l.tenure) != tenure {
            if l.visit_uses > 0 {
                l.expect_uses = l.visit_uses;
            }
            l.visit_uses = 0;
        }
        l.owned = Some(time.clone());
        l.tenure = tenure;
        l.handoffs = 0;
        l.used = l.requested;
        let Some(token) = l.requested.then(|| l.waiters.pop_front()) else {
            // Pushed: cached here for the next local acquire, given back after it. Its
            // notices take effect now — earlier than an acquire needs them, which is
            // always allowed, and with the carried diffs mostly updates, not
            // invalidations — so that this cluster's time stays current and the next
            // pushes need not resend the records.
            l.busy = false;
            l.recalled = false;
            l.eager = true;
            l.wanted = false;
            self.stats.lock_pushes_received += 1;
            let recalled = l.early_recalls.contains(&tenure);
            l.early_recalls.clear();
            if recalled {
                l.recalled = true;
                l.pushed = Some(Pushed::Taken);
                return self.give_back_now(lock, out);
            }
            if !covered {
                let l = self.cluster_locks.get_or_default(lock);
                l.pushed = Some(Pushed::Deferred {
                    time,
                    records,
                    diffs,
                });
                return Ok(());
            }
            return self.take_grant(
                Grant {
                    lock,
                    token: None,
                    time,
                    records,
                    diffs,
                },
                out,
            );
        };
        let Some(token) = token else {
            return Err(unexpected("lock grant without a waiting acquire"));
        };
        if !covered {
            // A push that answered this cluster's request (the manager dropped the
            // request as stale) and left out records of an earlier push that this
            // cluster has not taken: refused like a pushed lock at its first use.
            let l = self.cluster_locks.get_or_default(lock);
            l.waiters.push_front(token);
            return self.refuse_push(lock, out);
        }
        l.requested = false;
        l.busy = true;
        l.recalled = l.early_recalls.contains(&tenure);
        l.eager = contended;
        l.visit_uses += 1;
        l.early_recalls.clear();
        self.take_grant(
            Grant {
                lock,
                token: Some(token),
                time,
                records,
                diffs,
            },
            out,
        )
    }

    /// A local thread takes a grant: its write notices take effect (hlrc: carried
    /// diffs applied, other pages invalidated — after flushing open pages that must
    /// be invalidated — and pages homed here waited for), the time is merged, and the
    /// acquire completes (at once, or when the home pages have their diffs).
    pub(crate) fn take_grant(
        &mut self,
        g: Grant,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if g.token.is_some() {
            let since = self.time.get(self.me);
            if let Some(l) = self.cluster_locks.get_mut(g.lock) {
                l.since = since;
            }
        }
        if self.cfg.protocol == Protocol::Hlrc {
            let plan = self.hlrc_plan_notices(&g.records, &g.diffs, &self.updates)?;
            if !plan.flush.is_empty() {
                let pages = plan
                    .flush
                    .iter()
                    .map(|&page| FlushPage {
                        page,
                        keep_open: false,
                    })
                    .collect();
                self.stats.diffs_at_acquire += plan.flush.len() as u64;
                self.start_flush(pages, plan.flush, Resume::Grant(g), out);
                return Ok(());
            }
            self.hlrc_apply_grant_plan(plan, out)?;
        }
        self.stats.records_received += g.records.len() as u64;
        for r in g.records {
            if !self.log.insert(r)? {
                self.stats.records_known += 1;
            }
        }
        self.time.merge(&g.time);
        self.check_log_covers_time()?;
        match g.token {
            Some(token) => self.complete_acquire(g.lock, token, &g.time, out),
            None => {
                if let Some(l) = self.cluster_locks.get_mut(g.lock) {
                    l.pushed = Some(Pushed::Taken);
                }
            }
        }
        Ok(())
    }

    /// Whether this cluster's log and `records` hold every record up to `time` (a
    /// grant can be taken without a gap).
    fn covers(&self, time: &VectorTime, records: &[IntervalRecord]) -> bool {
        time.entries().iter().enumerate().all(|(j, &t)| {
            let Some(c) = ClusterId::new(j as u16) else {
                return true;
            };
            (self.log.top(c) + 1..=t).all(|k| records.iter().any(|r| r.owner == c && r.index == k))
        })
    }

    /// Completes an acquire of a lock whose time is `time`: at once, or — when pages
    /// homed here still lack diffs of notices that time covers — once they have
    /// arrived.
    fn complete_acquire(
        &mut self,
        lock: LockId,
        token: SyncToken,
        time: &VectorTime,
        out: &mut Vec<Action>,
    ) {
        let waits = self.unreflected_before(time);
        let done = Action::AcquireDone { lock, token };
        if waits.is_empty() {
            out.push(done);
        } else {
            self.stats.acquires_held += 1;
            self.held.push(Held { waits, done });
        }
    }

    /// Sends this cluster's request for `lock` to its manager.
    fn request_lock(&mut self, lock: LockId, out: &mut Vec<Action>) {
        self.stats.lock_requests += 1;
        let mgr = self.cfg.lock_manager(lock);
        let time = self.time.clone();
        let seen = self.cluster_locks.get(lock).map_or(0, |l| l.tenure);
        self.send(mgr, Message::LockAcquire { lock, time, seen }, out);
    }

    /// A thread of this cluster acquires `lock`: at once if the cluster owns it and
    /// no local thread holds it (a cached or pushed lock), else it waits behind the
    /// local holder or for the manager's grant.
    pub(crate) fn on_acquire(
        &mut self,
        lock: LockId,
        token: SyncToken,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        self.stats.lock_acquires += 1;
        let l = self.cluster_locks.get_or_default(lock);
        if l.owned.is_some() && !l.busy && !l.returning {
            let pushed = l.pushed.take();
            // Released into a batch and taken again before it left: it stays.
            self.deferred_releases.retain(|&d| d != lock);
            let covered = match &pushed {
                Some(Pushed::Deferred { time, records, .. }) => self.covers(time, records),
                _ => true,
            };
            let l = self.cluster_locks.get_or_default(lock);
            if !covered {
                // A deferred push whose records still leave a gap.
                l.waiters.push_back(token);
                return self.refuse_push(lock, out);
            }
            l.busy = true;
            l.used = true;
            l.visit_uses += 1;
            self.stats.lock_local_acquires += 1;
            match pushed {
                // The first use of a pushed lock: its notices took effect on arrival,
                // or take effect now.
                Some(Pushed::Taken) => {
                    l.since = self.time.get(self.me);
                    let time = l.owned.clone().unwrap_or_default();
                    self.complete_acquire(lock, token, &time, out);
                    return Ok(());
                }
                Some(Pushed::Deferred {
                    time,
                    records,
                    diffs,
                }) => {
                    return self.take_grant(
                        Grant {
                            lock,
                            token: Some(token),
                            time,
                            records,
                            diffs,
                        },
                        out,
                    );
                }
                None => {
                    out.push(Action::AcquireDone { lock, token });
                    return Ok(());
                }
            }
        }
        let l = self.cluster_locks.get_or_default(lock);
        l.waiters.push_back(token);
        if l.busy {
            // The holder may be passing it among local threads without the machine.
            out.push(Action::LockWanted { lock });
        }
        if l.owned.is_none() && !l.requested {
            l.requested = true;
            self.request_lock(lock, out);
            if self.deferred_releases.is_empty() {
                return self.flush_ahead(lock, out);
            }
            // This thread waits for another cluster, which may wait for a lock of the
            // batch: the batch goes now.
            return self.give_back_deferred(out);
        }
        Ok(())
    }

    /// A local thread waits for `lock`, just requested from its manager: close the
    /// interval while the request is on its way ([`crate::Config::flush_ahead`]) —
    /// unless the manager is this cluster and will grant it at once (no other cluster
    /// holds it), or a flush is already under way.
    fn flush_ahead(&mut self, lock: LockId, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        let me = self.me;
        let waits =
            self.cfg.lock_manager(lock) != me || self.locks.holder(lock).is_some_and(|h| h != me);
        if !self.cfg.flush_ahead
            || self.cfg.protocol != Protocol::Hlrc
            || !waits
            || self.flushing.is_some()
            || self.open.is_empty()
        {
            return Ok(());
        }
        self.stats.flushes_ahead += 1;
        self.close_interval(Completion::Ahead, out)
    }

    /// A thread of this cluster releases `lock`: to a waiting local thread, into the
    /// cluster's cache, or — when it was recalled, is contended or was pushed here —
    /// back to the manager. The thread never waits: the lock leaves as soon as the
    /// interval closed for it is flushed.
    pub(crate) fn on_release(
        &mut self,
        lock: LockId,
        token: SyncToken,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let l = held_lock(&mut self.cluster_locks, lock)?;
        if l.owned.is_none() || !l.busy {
            return Err(ProtocolError::NotHeld(lock));
        }
        let must_go = l.recalled || l.eager;
        if !l.waiters.is_empty() && (!must_go || l.handoffs < MAX_LOCAL_HANDOFFS) {
            let next = l.waiters.pop_front().expect("checked non-empty");
            if must_go {
                l.handoffs += 1;
            }
            l.visit_uses += 1;
            self.stats.lock_local_acquires += 1;
            out.push(Action::ReleaseDone { lock, token });
            out.push(Action::AcquireDone { lock, token: next });
            return Ok(());
        }
        l.busy = false;
        out.push(Action::ReleaseDone { lock, token });
        if must_go {
            if self.cfg.batches_releases()
                && !l.recalled
                && !l.wanted
                && l.waiters.is_empty()
                && l.visit_uses < l.expect_uses
            {
                // Its last visit here had more local uses: kept for the next one. With
                // release batches a request from another cluster recalls even a
                // contended lock (it may wait in a batch), so it recalls this one too.
                self.stats.lock_visit_keeps += 1;
                return Ok(());
            }
            if !l.recalled {
                self.stats.lock_eager_releases += 1;
            }
            if l.recalled || !l.waiters.is_empty() || l.wanted {
                // Asked for, or local threads wait beyond their hand-offs, or it was
                // asked for while it waited for a batch before: it goes now (the
                // local waiters ask again once it has left).
                return self.give_back_now(lock, out);
            }
            self.deferred_releases.push(lock);
            if self.deferred_releases.len() >= self.cfg.release_batch as usize {
                return self.give_back_deferred(out);
            }
        }
        Ok(())
    }

    /// Whether a local thread that holds `lock` (its `AcquireDone` just executed) may
    /// pass it to other threads of this cluster without the machine, until an
    /// [`Action::LockWanted`] for it: the cluster owns it, and no release would do more
    /// than mark it free — it is not recalled, not to be given back after its release
    /// (contended or pushed: see [`crate::sync`]), not being given back, and no other
    /// local thread waits for it. While the runtime passes it around, the machine sees
    /// one thread holding it; any event that needs it back emits `LockWanted`.
    ///
    /// Source: hardware coherence inside a multiprocessor node, software between nodes
    /// (MGS, ISCA 1996 §3); the machine's own local hand-off does nothing more for such
    /// a lock (its release only marks it free).
    pub fn lock_cacheable(&self, lock: LockId) -> bool {
        self.cluster_locks.get(lock).is_some_and(|l| {
            l.owned.is_some()
                && l.busy
                && !l.recalled
                && !l.eager
                && !l.returning
                && l.waiters.is_empty()
                && l.pushed.is_none()
        })
    }

    /// Moves the locks waiting for a batch into [`Machine::leaving`], marked as
    /// returning (the flush that closes their interval is about to start).
    pub(crate) fn take_deferred_releases(&mut self) {
        for lock in std::mem::take(&mut self.deferred_releases) {
            if let Some(l) = self.cluster_locks.get_mut(lock) {
                l.returning = true;
                self.leaving.push(lock);
            }
        }
    }

    /// Gives back every lock waiting for a batch, after one flush.
    pub(crate) fn give_back_deferred(
        &mut self,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.deferred_releases.is_empty() {
            return Ok(());
        }
        self.stats.release_batches += 1;
        self.take_deferred_releases();
        self.close_interval(Completion::Release, out)
    }

    /// Sends the `LockRelease` of every lock of [`Machine::leaving`] (their interval
    /// is flushed).
    pub(crate) fn give_back_leaving(&mut self, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        for lock in std::mem::take(&mut self.leaving) {
            self.give_back(lock, out)?;
        }
        // Diffs for a manager none of the leaving locks went to cannot remain: the
        // carriers were exactly those managers.
        debug_assert!(self.for_release.is_empty());
        Ok(())
    }

    /// The manager wants `lock` back for `tenure`: give it back now if this cluster
    /// owns that tenure and no local thread holds it, when the local holders are done
    /// otherwise; keep a recall that overtook its grant; ignore one of a tenure this
    /// cluster has already given back.
    pub(crate) fn on_lock_recall(
        &mut self,
        from: ClusterId,
        lock: LockId,
        tenure: u32,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.cfg.lock_manager(lock) != from {
            return Err(ProtocolError::Unexpected {
                what: "lock recall from a cluster that does not manage it",
                from,
                page: None,
            });
        }
        let l = self.cluster_locks.get_or_default(lock);
        if l.tenure != tenure {
            // Not granted yet, or a stale recall of an older tenure (which the next
            // grant drops).
            if !l.early_recalls.contains(&tenure) {
                l.early_recalls.push(tenure);
            }
            return Ok(());
        }
        if l.owned.is_none() || l.returning {
            // Given back already (a pushed lock returns after its first use without
            // waiting for the recall the manager may have sent meanwhile).
            return Ok(());
        }
        l.recalled = true;
        if l.busy {
            // It goes at the holder's release (which the runtime may have to route
            // through the machine first).
            out.push(Action::LockWanted { lock });
            return Ok(());
        }
        if self.deferred_releases.contains(&lock) {
            l.wanted = true;
        }
        self.give_back_now(lock, out)
    }

    /// Gives back untouched a pushed lock whose records leave a gap in this cluster's
    /// log — an earlier push that carried the missing ones was given back before it
    /// took effect, or has not arrived yet (the manager leaves out of a push what its
    /// earlier pushes to the same cluster carried) — and asks for it again: the
    /// manager's grant to a request carries every record the request's time lacks. The
    /// local threads waiting for the lock (at least one) stay queued.
    fn refuse_push(&mut self, lock: LockId, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        self.stats.lock_pushes_refused += 1;
        let l = held_lock(&mut self.cluster_locks, lock)?;
        l.busy = false;
        l.used = false;
        l.requested = false;
        self.give_back_now(lock, out)?;
        let l = held_lock(&mut self.cluster_locks, lock)?;
        l.requested = true;
        self.request_lock(lock, out);
        // This thread waits for another cluster, which may wait for a lock of the
        // batch: the batch goes now (as for any request).
        self.give_back_deferred(out)
    }

    /// Gives `lock` back: a pushed lock no thread took goes at once, untouched (its
    /// grant never took effect: same time, no records); otherwise the interval closes
    /// and the `LockRelease` leaves once it is flushed (see [`Machine::give_back`]).
    pub(crate) fn give_back_now(
        &mut self,
        lock: LockId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let l = held_lock(&mut self.cluster_locks, lock)?;
        if l.used {
            l.returning = true;
            self.deferred_releases.retain(|&d| d != lock);
            self.leaving.push(lock);
            // The locks waiting for a batch go with it: one flush for all.
            if !self.deferred_releases.is_empty() {
                self.stats.release_batches += 1;
            }
            self.take_deferred_releases();
            return self.close_interval(Completion::Release, out);
        }
        let Some(time) = l.owned.take() else {
            return Err(ProtocolError::NotHeld(lock));
        };
        l.pushed = None;
        l.recalled = false;
        l.eager = false;
        self.stats.lock_pushes_returned += 1;
        let mgr = self.cfg.lock_manager(lock);
        let msg = Message::LockRelease {
            lock,
            tenure: l.tenure,
            time,
            gc: self.log.base(),
            records: Vec::new(),
            diffs: Vec::new(),
            homed: 0,
            stored: self.locks.stored(mgr),
            unused: true,
        };
        self.send(mgr, msg, out);
        Ok(())
    }

    /// The interval closed for `lock`'s return is flushed: send the release to the
    /// manager, with the records it may lack and this cluster's diffs of the tenure,
    /// and ask again for the local threads still waiting.
    pub(crate) fn give_back(
        &mut self,
        lock: LockId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let l = held_lock(&mut self.cluster_locks, lock)?;
        let Some(mut after) = l.owned.take() else {
            return Err(ProtocolError::NotHeld(lock));
        };
        l.returning = false;
        l.recalled = false;
        l.eager = false;
        l.handoffs = 0;
        let tenure = l.tenure;
        let again = !l.waiters.is_empty();
        if again {
            l.requested = true;
        }
        let since = l.since;
        let gc = self.log.base();
        after.merge(&gc);
        let mgr = self.cfg.lock_manager(lock);
        // Records the manager's store already holds: exactly known when this cluster
        // is the manager, else at least those of the grants it sent here. Its own
        // records it takes from its cluster's log.
        if mgr == self.me {
            after.merge(&self.locks.store_top());
        } else {
            if let Some(t) = self.manager_seen.get(&mgr) {
                after.merge(t);
            }
            // And what the manager's cluster log holds: its grants take records from
            // there too.
            if let Some(t) = self.locks.seen(mgr) {
                after.merge(t);
            }
        }
        after.set(mgr, after.get(mgr).max(self.time.get(mgr)));
        let time = self.time.clone();
        let records = self.log.between(&after, &time)?;
        // `recent` is in interval order: the tenure's diffs are its tail, of which the
        // release carries the newest MAX_CARRIED_DIFFS.
        let first = self.recent.partition_point(|r| r.diff.index <= since);
        let from = first + (self.recent.len() - first).saturating_sub(MAX_CARRIED_DIFFS);
        // First the diffs this release carries to the manager as their pages' home
        // (the first release of the flush to that manager takes them), then the
        // others of the tenure.
        let (mut diffs, rest): (Vec<IntervalDiff>, Vec<IntervalDiff>) =
            std::mem::take(&mut self.for_release)
                .into_iter()
                .partition(|d| self.homes.get(d.page) == Some(mgr));
        self.for_release = rest;
        let homed: SmallVec<[(PageId, u32); 4]> = diffs.iter().map(|d| (d.page, d.index)).collect();
        // A diff goes once to each manager: the manager keeps the diffs carried to it
        // for every one of its locks and sends them with any grant whose records hold
        // their interval (see `crate::sync`), so a later release of the same batch or
        // a later batch need not carry it again.
        // (Only a diff carried as its page's home may lie before `from`; `recent` is in
        // interval order, so none lies before the oldest such diff's interval. Scanning
        // all of `recent` from its front for them was half of this function's own time
        // in `bench dsm`'s lock hand-off over shared memory, whose releases carry the
        // protected page's diff to its home: a `perf` profile, sixty-first session.)
        let start = match homed.iter().map(|&(_, index)| index).min() {
            None => from,
            Some(oldest) => from.min(self.recent.partition_point(|r| r.diff.index < oldest)),
        };
        for (i, r) in self.recent.iter_mut().enumerate().skip(start) {
            let homed_here = homed.contains(&(r.diff.page, r.diff.index));
            if i < from && !homed_here {
                continue;
            }
            // Kept sorted: the same marks are the same state, whatever their order.
            let Err(at) = r.carried_to.binary_search(&mgr) else {
                continue;
            };
            r.carried_to.insert(at, mgr);
            if !homed_here {
                diffs.push(r.diff.clone());
            }
        }
        let homed = homed.len() as u32;
        self.stats.carried_diffs_sent += diffs.len() as u64;
        self.send(
            mgr,
            Message::LockRelease {
                lock,
                tenure,
                time,
                gc,
                records,
                diffs,
                homed,
                stored: self.locks.stored(mgr),
                unused: false,
            },
            out,
        );
        if again {
            self.request_lock(lock, out);
        }
        Ok(())
    }
}

/// This cluster's state of `lock`, or [`ProtocolError::NotHeld`] if it never had it. A
/// free function over the map (not a method) so the caller can still use `self`'s other
/// fields while it holds the entry.
fn held_lock(
    locks: &mut LockTable<ClusterLock>,
    lock: LockId,
) -> Result<&mut ClusterLock, ProtocolError> {
    locks.get_mut(lock).ok_or(ProtocolError::NotHeld(lock))
}
