//! Intervals and flushes: closing this cluster's interval (hlrc: diffing its open
//! pages, recording their write notices) and what runs once the flush is done.

use smallvec::SmallVec;

use crate::action::{Action, FlushPage};
use crate::error::ProtocolError;
use crate::ids::{ClusterId, PageId, PageRange};
use crate::interval::{DiffBytes, IntervalDiff, IntervalRecord};
use crate::machine::{
    Completion, Flushing, MAX_RECENT_DIFFS, Machine, PageAccess, RecentDiff, Resume,
};
use crate::message::Message;
use crate::sync::MAX_CARRIED_DIFFS;

impl Machine {
    /// Closes the open interval (hlrc: flush the open pages — all of them closed at a
    /// barrier, else the idle ones closed and the others kept open — recording the
    /// write notices of those that changed) and then runs `c`.
    pub(crate) fn close_interval(
        &mut self,
        c: Completion,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let all = c == Completion::Barrier;
        if all {
            // The locks waiting for a batch go with the barrier's flush.
            self.take_deferred_releases();
        }
        if self.open.is_empty() {
            return self.resume(Resume::Close(c), out);
        }
        let mut pages = Vec::with_capacity(self.open.len());
        let mut protect = Vec::new();
        for &page in &self.open {
            // A barrier closes every open copy (the departure may invalidate it) but
            // the home's own written pages: their master cannot be invalidated, so
            // they stay writable for the next phase's writes (no fault, no
            // `UFFDIO_WRITEPROTECT`) and go idle and close like at a release.
            let home = self.homes.get(page) == Some(self.me);
            let keep_open =
                (!all || home) && u32::from(self.pages[page.index()].idle) < self.cfg.idle_flushes;
            if !keep_open {
                protect.push(page);
            }
            pages.push(FlushPage { page, keep_open });
        }
        self.start_flush(pages, protect, Resume::Close(c), out);
        Ok(())
    }

    /// Write-protects `protect` (the pages of `pages` that close), then asks the
    /// runtime to flush `pages`; `then` runs when the diffs come back.
    pub(crate) fn start_flush(
        &mut self,
        pages: Vec<FlushPage>,
        mut protect: Vec<PageId>,
        then: Resume,
        out: &mut Vec<Action>,
    ) {
        for r in PageRange::coalesce(&mut protect) {
            out.push(Action::WriteProtect { pages: r });
        }
        self.stats.flushes += 1;
        self.flushing = Some(Flushing {
            pages: pages.clone(),
            then,
        });
        out.push(Action::Flush { pages });
    }

    /// The diffs of a flush: pages that changed get a write notice in a new
    /// interval record, their diff goes to the home (unless homed here, or the lock
    /// this flush releases carries it to its manager, which is the home) and is kept
    /// for carrying with locks; closed pages lose their twin; unchanged open pages
    /// turn idle.
    pub(crate) fn on_flushed(
        &mut self,
        diffs: Vec<DiffBytes>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let Some(f) = self.flushing.take() else {
            return Err(ProtocolError::UnexpectedFlush);
        };
        if diffs.len() != f.pages.len() {
            return Err(ProtocolError::UnexpectedFlush);
        }
        let me = self.me;
        let index = self.time.get(me) + 1;
        // Released locks go to their managers with this flush's diffs.
        let carriers: Vec<ClusterId> = match f.then {
            Resume::Close(Completion::Release | Completion::Barrier) => self
                .leaving
                .iter()
                .map(|&l| self.cfg.lock_manager(l))
                .collect(),
            Resume::Close(Completion::Ahead) | Resume::Grant(_) => Vec::new(),
        };
        // No lock carries the diffs of a flush ahead of a grant: the homes send them to
        // their copies as at a barrier, so that the clusters the next grants go to
        // apply them instead of invalidating the pages.
        let updates = self.cfg.barrier_updates
            && matches!(
                f.then,
                Resume::Close(Completion::Barrier | Completion::Ahead)
            );
        // A release carries the newest MAX_CARRIED_DIFFS diffs of its flush to the
        // next holder; the older ones of pages homed here go to their copysets as
        // updates, ahead of the release, so that the grant applies them too (see
        // `crate::hlrc`, updates at barriers).
        let mut uncarried =
            if self.cfg.barrier_updates && matches!(f.then, Resume::Close(Completion::Release)) {
                diffs
                    .iter()
                    .filter(|d| !d.is_empty())
                    .count()
                    .saturating_sub(MAX_CARRIED_DIFFS)
            } else {
                0
            };
        let mut written = Vec::new();
        for (fp, data) in f.pages.iter().zip(diffs) {
            let home = self.homes.get(fp.page);
            let e = self.entry(fp.page);
            if !fp.keep_open {
                e.access = PageAccess::ReadOnly;
                e.twin = false;
                e.idle = 0;
                self.stats.pages_closed += 1;
            } else {
                self.stats.pages_kept_open += 1;
            }
            let e = self.entry(fp.page);
            if data.is_empty() {
                e.idle = if fp.keep_open {
                    e.idle.saturating_add(1)
                } else {
                    0
                };
                continue;
            }
            e.idle = 0;
            let update = updates || uncarried > 0;
            uncarried = uncarried.saturating_sub(1);
            let base = e.known.clone();
            e.known.set(me, index);
            let diff = IntervalDiff {
                page: fp.page,
                owner: me,
                index,
                base,
                data,
            };
            match home {
                Some(h) if h == me => {
                    if update && let Some(set) = self.copysets.get(&fp.page) {
                        let to: Vec<ClusterId> = set.members().filter(|&c| c != me).collect();
                        for c in to {
                            self.stats.updates_sent += 1;
                            *self.updates_out.entry(c).or_default() += 1;
                            self.send(c, Message::Update { diff: diff.clone() }, out);
                        }
                    }
                }
                Some(h) if carriers.contains(&h) => {
                    self.stats.diffs_via_release += 1;
                    self.for_release.push(diff.clone());
                }
                Some(h) => {
                    self.stats.diffs_sent += 1;
                    self.stats.diff_bytes_sent += diff.data.len() as u64;
                    self.send(h, Message::Diff { diff: diff.clone() }, out);
                }
                None => {
                    return Err(Self::unexpected(
                        "flush of a page without a home",
                        me,
                        fp.page,
                    ));
                }
            }
            if self.recent.len() >= MAX_RECENT_DIFFS {
                self.recent.pop_front();
            }
            self.recent.push_back(RecentDiff {
                diff,
                carried_to: SmallVec::new(),
            });
            written.push(fp.page);
        }
        self.open.retain(|p| self.pages[p.index()].twin);
        if !written.is_empty() {
            written.sort_unstable();
            written.dedup();
            self.log.insert(IntervalRecord {
                owner: me,
                index,
                pages: written.into(),
            })?;
            self.time.set(me, index);
            self.stats.intervals += 1;
        }
        self.resume(f.then, out)
    }

    fn resume(&mut self, r: Resume, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        match r {
            Resume::Close(Completion::Release) => self.give_back_leaving(out),
            Resume::Close(Completion::Barrier) => {
                self.give_back_leaving(out)?;
                if self.fetches.is_empty() {
                    self.arrive(out);
                } else {
                    self.stats.arrivals_held += 1;
                    self.barrier.arrival_held = true;
                }
                Ok(())
            }
            Resume::Close(Completion::Ahead) => {
                debug_assert!(self.leaving.is_empty(), "no lock leaves with a flush ahead");
                Ok(())
            }
            Resume::Grant(g) => self.take_grant(g, out),
        }
    }
}
