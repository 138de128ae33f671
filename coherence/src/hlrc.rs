//! hlrc: home-based lazy release consistency with multiple writers (the default
//! protocol).
//!
//! # Rules
//!
//! Per page and cluster the state is missing (*untouched* at the home: all zeros,
//! never installed; *invalid* elsewhere), *read-only*, or *writable*; a writable page
//! either has a *twin* (it is *open*: every flush diffs it) or is a *private* home
//! page (below). The home's copy is the master copy; the home keeps the copyset.
//! Every copy carries its *versions* (per cluster, the last interval whose writes to
//! the page it reflects; see [`crate::interval::IntervalDiff`]).
//!
//! * **Read fault** on a missing non-home page: send `GetPage` with the versions the
//!   copy must reflect (every write notice of the page seen so far, and this
//!   cluster's own last diff of it) to the home; the home answers with the page
//!   (Tag-On) or a zero-page notice as soon as its master reflects them — it holds
//!   the request until the diffs have arrived — and the copy is installed
//!   read-only. Concurrent faults on the page wait for the same fetch.
//! * **Prefetch** ([`crate::Config::prefetch`]): the same fault also requests the
//!   next few pages that are missing here and homed elsewhere; nobody waits for
//!   them, a fault on one of them joins its fetch, and a reply that a write notice
//!   made stale on its way is dropped (the page stays missing). A barrier arrival
//!   waits until every fetch has landed, so that no reply crosses a home migration.
//! * **Write fault** on a read-only page: `MakeTwin`, `Unprotect`; the page is open. A
//!   write fault that continues the pages the previous one opened also opens the
//!   read-only pages after it, up to [`crate::Config::write_ahead`] (*write-ahead*,
//!   [`crate::write_ahead`]): a sweep of writes takes one fault per few pages.
//!   On a missing page: fetch, then install, twin, unprotect. At the home the same
//!   (a twin lets the home's writes travel as diffs with locks), unless the page is
//!   private (below).
//! * **Flush** (at a release that hands a lock to another cluster, and at a barrier
//!   arrival): every open page is diffed against its twin and the twin refreshed; a
//!   page whose diff is not empty gets a write notice in the interval record that
//!   the flush closes, and its diff goes to the home (unless it is homed here) and
//!   into this cluster's recent diffs, which the lock carries. Open pages stay
//!   writable, so a lock handed back and forth costs no fault and no
//!   `UFFDIO_WRITEPROTECT`; a page unchanged at [`crate::Config::idle_flushes`]
//!   flushes in a row (8 by default) is closed at the next one (write-protected
//!   first, so that a concurrent write re-faults, then diffed a last time), and a
//!   barrier arrival
//!   closes every open copy but the pages homed here (a master is never
//!   invalidated), which stay open into the next phase. The release does not wait
//!   for the home: the versions in the fetches make that unnecessary. The departure
//!   makes every master copy current (below).
//! * **Updates at barriers** ([`crate::Config::barrier_updates`]): the barrier flush
//!   sends the diff of each page homed here that changed to the other clusters of its
//!   copyset ([`crate::Message::Update`]); each keeps them for the departure, whose
//!   write notices apply them as diffs carried with the notices (a copy that reflects a
//!   diff's base stays valid instead of being invalidated and fetched in the next
//!   phase); the others are dropped. A cluster whose arrival is sent applies such an
//!   update at once — those it holds when it arrives, and those that come while it
//!   waits — when nothing but that application would happen to the page at the
//!   departure (a valid copy reflecting the base): no local thread runs until the
//!   departure, which then finds the notice reflected, so the copies are brought up to
//!   date while the cluster waits instead of after it. A release flush that wrote more
//!   pages than its lock carries diffs ([`crate::sync::MAX_CARRIED_DIFFS`]; Water's
//!   positions, written outside any lock and released with a sum's lock) sends the
//!   older diffs of pages homed here the same way, ahead of its `LockRelease`. The
//!   barrier flush also gives back the locks other clusters asked for meanwhile (a sum
//!   taken under a lock just before a barrier, as in every SPLASH program), so a grant
//!   may bring write notices before the departure does: the acquire then applies the
//!   held updates of those notices as it applies carried diffs, and drops the held
//!   updates whose intervals it now knows. With more than two clusters the departure
//!   (from the barrier manager) can reach a cluster before a third cluster's updates:
//!   each arrival counts the updates its cluster has sent to each other one, and a
//!   departure waits until its receiver has received as many as the departure lists
//!   ([`crate::Message::BarrierDepart`]). A copy reflects everything up to the last
//!   departure, so a diff's base is compared with the copy's versions merged with that
//!   departure's time: a migrated home's versions (its copy reflects the whole
//!   departure time) name clusters that never wrote the page. Source: update protocols for
//!   producer–consumer sharing (Munin, Carter, Bennett, Zwaenepoel, SOSP 1991 §3).
//! * **Home**: a received diff is applied to the master (and its twin, when open) as
//!   soon as the master reflects the diff's base — diffs that overtook an earlier
//!   one wait — then acknowledged; a diff the master already reflects (it came with a
//!   lock first) is only acknowledged.
//! * **Acquire** (lock grant): for each write notice `(j, k)` of a page not yet
//!   reflected: if the grant carries the diff and the copy reflects its base, apply
//!   it (page and twin; nothing is invalidated and the copy stays valid); otherwise
//!   invalidate a copy held here — an open page is first write-protected and flushed
//!   — and remember that the next fetch must reflect `(j, k)`. A page homed here
//!   cannot be invalidated: the acquire completes once the master has the diffs.
//!   A fetch in flight when a notice arrives may return the old contents: its reply
//!   is discarded and the page fetched again.
//! * **Barrier departure**: every notice the cluster has not seen invalidates its
//!   copy (homes hold every diff by then).
//!
//! Why a read after an acquire sees the last write before it: every write notice
//! `(j, k)` that happens-before the acquire reaches it (see [`crate::interval`]), and
//! after it the copy reflects `(j, k)`: either the diff was applied to a copy that
//! reflected everything the diff's words depend on (its base), or the copy was
//! dropped and the next fetch returns a master that reflects `(j, k)`. Diffs of one
//! page by different clusters touch disjoint words unless one happens-before the
//! other, and then the later diff's base names the earlier one, so every copy
//! applies them in that order. (HLRC, Zhou, Iftode, Li, OSDI 1996 §2, keeps the same
//! per-page flush timestamps at the home; MGS, ISCA 1996 §3, instead completes a
//! release only after the home has the data.)
//!
//! # Private home pages
//!
//! The home's own writes need tracking only so that clusters holding a copy learn of
//! them. While the copyset of a home page names no other cluster, nobody else can
//! hold a copy, so the home's write fault makes the page writable *without* a twin:
//! it stays writable across releases and produces no write notice, no flush and no
//! further fault. The first `GetPage` from another cluster ends this: the home copies
//! the page once, sends the copy and keeps the same copy as the twin
//! ([`crate::Action::ShareHomePage`]), so every write the requester did not get shows
//! up in the home's next flush, without a `UFFDIO_WRITEPROTECT` on the fetch's
//! critical path. From then on the page is open and tracked like any other (the
//! copyset never shrinks, except when a migration resets it).
//!
//! Invariant (checked by the model): a home page that is writable without a twin is
//! private — no other cluster holds a copy.
//!
//! This is the private/shared page classification of ArgoDSM's Pyxis directory
//! (Kaxiras, Klaftenegger, Norgren, Ros, Sagonas, "Turning Centralized Coherence
//! and Distributed Critical-Section Execution on their Head", HPDC 2015; in
//! etascale/argodsm `src/backend/mpi/swdsm.cpp` the per-page sharer and writer
//! bitmaps `globalSharers`: a page with a single sharer is private and needs no
//! coherence action, and the first remote access turns it shared) applied to the
//! home's write detection in HLRC.
//!
//! # Single-writer fast path: home migration at barriers
//!
//! With [`crate::Config::migrate_single_writer`] (default), each barrier arrival
//! lists the pages the cluster wrote since the previous barrier as a non-home and
//! still holds valid. If the barrier manager sees that exactly one cluster wrote such
//! a page in that barrier interval, the page's home moves to that writer; every
//! cluster applies the move from the departure. From then on the writer's writes are
//! home writes while the page keeps a single writer. The new home's copy is the
//! master: it reflects every write notice up to the departure (every diff was
//! acknowledged before the arrivals, and nobody else wrote the page in the
//! interval). Every other cluster drops its copy of a migrated page, so its next
//! access fetches from the new home; requests that reach the new home before it has
//! processed the departure are held until it has. This is the home migration of
//! JIAJIA (Hu, Shi, Tang, "Home Migration in Home-based Software DSMs", WSDSM 1999).

use smallvec::SmallVec;

use crate::action::{Action, Source};
use crate::error::ProtocolError;
use crate::home::CopySet;
use crate::ids::{ClusterId, PageId, PageRange};
use crate::interval::{IntervalDiff, IntervalRecord, VectorTime};
use crate::machine::{Fetch, MAX_HELD_UPDATES, Machine, PageAccess, Phase, Waiter};
use crate::message::Message;

/// What an acquire's write notices do to each page (see [`Machine::hlrc_plan_notices`]).
#[derive(Debug, Default)]
pub(crate) struct NoticePlan {
    /// Open pages to flush and close before the rest can be done.
    pub(crate) flush: Vec<crate::ids::PageId>,
    /// Diffs to apply, in order, with whether the page has a twin.
    apply: Vec<(IntervalDiff, bool)>,
    /// Valid read-only copies to invalidate.
    invalidate: Vec<PageId>,
    /// `(page, owner, index)`: versions the page's copy must reflect from now on.
    need: Vec<(PageId, ClusterId, u32)>,
    /// Missing pages being fetched whose reply may predate a notice.
    stale: Vec<PageId>,
    /// `(page, owner, index)` of pages homed here still lacking a diff.
    wait: Vec<(PageId, ClusterId, u32)>,
    /// How many of the diffs to apply are held barrier updates rather than diffs
    /// carried with the notices.
    from_held: u64,
}

/// Whether `known` (at cluster `me`) reflects every entry of `need` except `me`'s.
fn reflects(known: &VectorTime, need: &VectorTime, me: ClusterId) -> bool {
    need.entries()
        .iter()
        .enumerate()
        .all(|(j, &v)| j == me.index() || known.entries().get(j).copied().unwrap_or(0) >= v)
}

impl Machine {
    fn wake(page: PageId, waiters: &[Waiter], out: &mut Vec<Action>) {
        out.push(Action::Wake {
            page,
            tokens: waiters.iter().map(|w| w.token).collect(),
        });
    }

    pub(crate) fn hlrc_fault(
        &mut self,
        page: PageId,
        w: Waiter,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let home = self.homes.get(page);
        match (self.entry(page).access, w.write) {
            (PageAccess::ReadOnly | PageAccess::ReadWrite, false)
            | (PageAccess::ReadWrite, true) => {
                self.stats.spurious_faults += 1;
                Self::wake(page, &[w], out);
                Ok(())
            }
            (PageAccess::ReadOnly, true) => {
                self.hlrc_make_writable(page, home == Some(self.me), out);
                Self::wake(page, &[w], out);
                self.hlrc_write_ahead(page, out);
                Ok(())
            }
            (PageAccess::Untouched, _) => self.hlrc_install_home(page, vec![w], out),
            (PageAccess::Invalid, _) => match home {
                None => self.start_home_lookup(page, vec![w], out),
                Some(_) => self.hlrc_fetch_known_home(page, vec![w], out),
            },
        }
    }

    /// Whether a cluster other than this one may hold a copy of `page`, homed here
    /// (its copyset names another cluster).
    pub(crate) fn hlrc_shared(&self, page: PageId) -> bool {
        self.copysets
            .get(&page)
            .is_some_and(|c| c.contains_other_than(self.me))
    }

    /// Makes the installed read-only `page` writable: with a twin (open), unless it is
    /// a private home page.
    fn hlrc_make_writable(&mut self, page: PageId, home: bool, out: &mut Vec<Action>) {
        if home && !self.hlrc_shared(page) {
            self.stats.private_home_writes += 1;
        } else {
            out.push(Action::MakeTwin { page });
            self.stats.twins += 1;
            self.open_page(page);
        }
        out.push(Action::Unprotect { page });
        self.entry(page).access = PageAccess::ReadWrite;
    }

    /// Write-ahead ([`crate::write_ahead`]): after a write fault on `page` that
    /// continues a sweep, opens the read-only pages that follow it, up to
    /// [`crate::Config::write_ahead`] of them and stopping at the first that is not
    /// read-only.
    fn hlrc_write_ahead(&mut self, page: PageId, out: &mut Vec<Action>) {
        let window = self.write_ahead.window(page.get(), self.cfg.write_ahead);
        let mut last = page;
        for i in 1..=window {
            let Some(q) = page.get().checked_add(i).and_then(PageId::new) else {
                break;
            };
            if self.access(q) != Some(PageAccess::ReadOnly) {
                break;
            }
            self.hlrc_make_writable(q, self.homes.get(q) == Some(self.me), out);
            self.stats.write_ahead_pages += 1;
            last = q;
        }
        self.write_ahead.opened(last.get());
    }

    /// Lists `page` (now with a twin) among the open pages.
    fn open_page(&mut self, page: PageId) {
        let e = self.entry(page);
        e.twin = true;
        e.idle = 0;
        self.open.push(page);
    }

    /// Installs an untouched home page for the waiting faults.
    fn hlrc_install_home(
        &mut self,
        page: PageId,
        waiters: Vec<Waiter>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.homes.get(page) != Some(self.me) || self.entry(page).access != PageAccess::Untouched
        {
            return Err(Self::unexpected(
                "install of a home page that is not untouched",
                self.me,
                page,
            ));
        }
        let write = waiters.iter().any(|w| w.write);
        let private = !self.hlrc_shared(page);
        out.push(Action::Install {
            page,
            source: Source::Zero,
            writable: write && private,
        });
        self.entry(page).access = PageAccess::ReadOnly;
        if write {
            if private {
                self.entry(page).access = PageAccess::ReadWrite;
                self.stats.private_home_writes += 1;
            } else {
                self.hlrc_make_writable(page, true, out);
            }
        }
        Self::wake(page, &waiters, out);
        Ok(())
    }

    /// Starts the fetch of a missing page whose home is known.
    pub(crate) fn hlrc_fetch_known_home(
        &mut self,
        page: PageId,
        waiters: Vec<Waiter>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let Some(home) = self.homes.get(page) else {
            return Err(Self::unexpected("fetch without a home", self.me, page));
        };
        if home == self.me {
            return self.hlrc_install_home(page, waiters, out);
        }
        let prefetch = !waiters.is_empty();
        self.hlrc_request(page, home, out);
        self.fetches
            .insert(page, Fetch::new(waiters, Phase::AwaitPage { stale: false }));
        if prefetch {
            let window = self.readahead.window(page.get(), self.cfg.prefetch);
            self.hlrc_prefetch(page, window, out);
        }
        Ok(())
    }

    /// Requests the `window` pages after `page` that this cluster lacks, whose home is
    /// known and is another cluster, and that are not being fetched (see
    /// [`crate::Config::prefetch`] and [`crate::readahead`]): fetches nobody waits for
    /// yet.
    fn hlrc_prefetch(&mut self, page: PageId, window: u32, out: &mut Vec<Action>) {
        // Below the region's end and the data's extent (`Machine::set_extent`).
        let Some(end) = self.extent.min(self.cfg.pages).checked_sub(1) else {
            return;
        };
        let last = page.get().saturating_add(window).min(end);
        for p in (page.get() + 1..=last).filter_map(PageId::new) {
            let Some(home) = self.homes.get(p) else {
                continue;
            };
            if home == self.me
                || self.pages[p.index()].access != PageAccess::Invalid
                || self.fetches.contains_key(&p)
            {
                continue;
            }
            self.stats.prefetches += 1;
            self.hlrc_request(p, home, out);
            self.fetches
                .insert(p, Fetch::new(Vec::new(), Phase::AwaitPage { stale: false }));
        }
    }

    /// Sends `GetPage` with the versions the copy must reflect.
    fn hlrc_request(&mut self, page: PageId, home: ClusterId, out: &mut Vec<Action>) {
        self.stats.remote_fetches += 1;
        let need = self.entry(page).known.clone();
        self.send(home, Message::GetPage { page, need }, out);
    }

    pub(crate) fn on_get_page(
        &mut self,
        from: ClusterId,
        page: PageId,
        need: VectorTime,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let msg = Message::GetPage {
            page,
            need: need.clone(),
        };
        if !self.require_home(from, page, &msg)? {
            return Ok(());
        }
        if self.entry(page).access == PageAccess::Invalid {
            return Err(Self::unexpected(
                "fetch of an invalid home page",
                from,
                page,
            ));
        }
        if !reflects(&self.pages[page.index()].known, &need, self.me) {
            self.stats.fetches_deferred += 1;
            self.deferred_fetches
                .entry(page)
                .or_default()
                .push((from, need));
            return Ok(());
        }
        self.serve_page(from, page, out);
        Ok(())
    }

    /// Sends the master copy of `page` to `from` and adds it to the copyset.
    fn serve_page(&mut self, from: ClusterId, page: PageId, out: &mut Vec<Action>) {
        let me = self.me;
        let e = &self.pages[page.index()];
        let (access, twin) = (e.access, e.twin);
        self.copysets
            .entry(page)
            .or_insert_with(|| {
                let mut s = CopySet::default();
                s.insert(me);
                s
            })
            .insert(from);
        match access {
            PageAccess::ReadWrite if !twin => {
                // A private home page gets its first remote copy: the copy sent is
                // the twin, so every later write shows up in the next flush.
                self.stats.messages_sent += 1;
                self.stats.home_pages_shared += 1;
                self.stats.pages_served += 1;
                self.stats.twins += 1;
                self.open_page(page);
                out.push(Action::ShareHomePage { to: from, page });
            }
            _ => {
                let zero = access == PageAccess::Untouched;
                if zero {
                    self.stats.zero_pages_served += 1;
                } else {
                    self.stats.pages_served += 1;
                }
                self.send(
                    from,
                    Message::PageData {
                        page,
                        writable: false,
                        zero,
                    },
                    out,
                );
            }
        }
    }

    pub(crate) fn on_page_data_hlrc(
        &mut self,
        from: ClusterId,
        page: PageId,
        zero: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.homes.get(page) != Some(from) {
            return Err(Self::unexpected(
                "page from a cluster that is not its home",
                from,
                page,
            ));
        }
        let stale = match self.fetches.get(&page).map(|f| f.phase) {
            Some(Phase::AwaitPage { stale }) => stale,
            _ => return Err(Self::unexpected("page without a fetch", from, page)),
        };
        let waited = self
            .fetches
            .get(&page)
            .is_some_and(|f| !f.waiters.is_empty());
        if stale && waited {
            // A write notice arrived after the request: the reply may predate it.
            // Fetch again, asking for the versions known now.
            self.stats.stale_refetches += 1;
            self.hlrc_request(page, from, out);
            if let Some(f) = self.fetches.get_mut(&page) {
                f.phase = Phase::AwaitPage { stale: false };
            }
            return Ok(());
        }
        let Some(f) = self.fetches.remove(&page) else {
            return Err(Self::unexpected("page without a fetch", from, page));
        };
        if self.entry(page).access != PageAccess::Invalid {
            return Err(Self::unexpected("page for a valid copy", from, page));
        }
        if stale {
            // A prefetch nobody waits for: the page stays missing, and its next
            // fault fetches it with the versions known now.
            self.stats.prefetches_dropped += 1;
        } else {
            out.push(Action::Install {
                page,
                source: if zero { Source::Zero } else { Source::Attached },
                writable: false,
            });
            self.entry(page).access = PageAccess::ReadOnly;
            if f.waiters.iter().any(|w| w.write) {
                self.hlrc_make_writable(page, false, out);
            }
            if f.waiters.is_empty() {
                self.stats.prefetches_installed += 1;
            } else {
                Self::wake(page, &f.waiters, out);
            }
        }
        self.inbox.extend(f.deferred);
        if self.barrier.arrival_held && self.fetches.is_empty() {
            self.barrier.arrival_held = false;
            self.arrive(out);
        }
        Ok(())
    }

    /// A diff from its writer, at the page's home: applied when the master reflects
    /// its base (see [`Machine::hlrc_home_drain`]).
    pub(crate) fn on_diff(
        &mut self,
        from: ClusterId,
        diff: IntervalDiff,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let page = diff.page;
        if diff.owner != from {
            return Err(Self::unexpected("diff of another cluster", from, page));
        }
        match self.require_home(from, page, &Message::Diff { diff: diff.clone() }) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(ProtocolError::NotHome { .. }) if self.homes.get(page).is_some() => {
                // Sent before its writer learned that the page's home moved away at a
                // barrier: the new home's copy has these words. A later fetch of the
                // page here must still reflect them.
                self.stats.stale_diffs_dropped += 1;
                let k = &mut self.entry(page).known;
                if k.get(diff.owner) < diff.index {
                    k.set(diff.owner, diff.index);
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        if self.pages[page.index()].known.get(from) >= diff.index {
            // Already reflected: it came with a lock first, or it is from before the
            // page's home moved here at a barrier (the copy that moved had its words).
            self.stats.stale_diffs_dropped += 1;
            return Ok(());
        }
        if !self.copysets.get(&page).is_some_and(|c| c.contains(from)) {
            return Err(Self::unexpected(
                "diff from a cluster that never fetched the page",
                from,
                page,
            ));
        }
        if self.entry(page).access == PageAccess::Invalid {
            return Err(Self::unexpected(
                "diff for an invalid home page",
                from,
                page,
            ));
        }
        let pending = self.home_pending.entry(page).or_default();
        if pending
            .iter()
            .any(|d| d.owner == from && d.index == diff.index)
        {
            // The same diff by two paths (a message and a lock release): one is enough.
            return Ok(());
        }
        let known = &self.pages[page.index()].known;
        if known.get(from) < diff.index && !diff.applies_to(known, self.me) {
            self.stats.diffs_buffered += 1;
        }
        pending.push(diff);
        self.hlrc_home_drain(page, out);
        Ok(())
    }

    /// At the home: applies every pending diff of `page` whose base the master
    /// reflects, drops those already reflected, then serves the fetches and completes
    /// the acquires and barrier departures that waited for them.
    fn hlrc_home_drain(&mut self, page: PageId, out: &mut Vec<Action>) {
        let me = self.me;
        while let Some(pending) = self.home_pending.get_mut(&page) {
            let known = &self.pages[page.index()].known;
            let Some(i) = pending
                .iter()
                .position(|d| known.get(d.owner) >= d.index || d.applies_to(known, me))
            else {
                break;
            };
            let d = pending.remove(i);
            if pending.is_empty() {
                self.home_pending.remove(&page);
            }
            if self.pages[page.index()].known.get(d.owner) < d.index {
                self.apply_at_home(&d, out);
                self.stats.diffs_applied += 1;
            }
        }
        self.home_release_waiters(page, out);
    }

    /// Applies `d` to the master copy of a page homed here (installing an untouched
    /// page as zeros first).
    fn apply_at_home(&mut self, d: &IntervalDiff, out: &mut Vec<Action>) {
        let page = d.page;
        if self.entry(page).access == PageAccess::Untouched {
            out.push(Action::Install {
                page,
                source: Source::Zero,
                writable: false,
            });
            self.entry(page).access = PageAccess::ReadOnly;
        }
        let e = self.entry(page);
        e.known.set(d.owner, d.index);
        let twin = e.twin;
        self.stats.diff_bytes_applied += d.data.len() as u64;
        out.push(Action::ApplyDiff {
            page,
            data: d.data.clone(),
            twin,
        });
    }

    /// Serves the fetches and completes the acquires waiting for versions of `page`
    /// that its master now reflects.
    fn home_release_waiters(&mut self, page: PageId, out: &mut Vec<Action>) {
        let me = self.me;
        if let Some(waiting) = self.deferred_fetches.remove(&page) {
            let (ready, still): (Vec<_>, Vec<_>) = waiting
                .into_iter()
                .partition(|(_, need)| reflects(&self.pages[page.index()].known, need, me));
            if !still.is_empty() {
                self.deferred_fetches.insert(page, still);
            }
            for (from, _) in ready {
                self.serve_page(from, page, out);
            }
        }
        let (pages, homes, me) = (&self.pages, &self.homes, self.me);
        self.unreflected.retain(|&(p, owner, index)| {
            homes.get(p) == Some(me) && pages[p.index()].known.get(owner) < index
        });
        let mut done = Vec::new();
        self.held.retain_mut(|h| {
            h.waits.retain(|&(p, owner, index)| {
                homes.get(p) == Some(me) && pages[p.index()].known.get(owner) < index
            });
            if h.waits.is_empty() {
                done.push(h.done.clone());
                false
            } else {
                true
            }
        });
        out.extend(done);
    }

    /// Decides what the write notices of `records` (those not seen yet) do to each
    /// page, given the diffs carried with them and the barrier updates held for the
    /// next departure (`held`; see the module documentation). Pure: changes nothing.
    pub(crate) fn hlrc_plan_notices(
        &self,
        records: &[IntervalRecord],
        diffs: &[IntervalDiff],
        held: &[IntervalDiff],
    ) -> Result<NoticePlan, ProtocolError> {
        let me = self.me;
        // `(page, owner, index)` of each notice not reflected yet, grouped by page in
        // page order (a stable sort keeps each page's notices in the order carried);
        // inline for the few notices a lock hand-off or an update brings.
        let mut notices: SmallVec<[(PageId, ClusterId, u32); 16]> = SmallVec::new();
        for r in records {
            // A record seen before may still be unreflected: a page homed here whose
            // diff has not arrived (an earlier acquire waits for it too).
            if r.owner == me {
                continue;
            }
            for &p in r.pages.iter() {
                self.check_page(p)?;
                if self.pages[p.index()].known.get(r.owner) < r.index {
                    notices.push((p, r.owner, r.index));
                }
            }
        }
        notices.sort_by_key(|&(p, _, _)| p);
        let mut plan = NoticePlan::default();
        for group in notices.chunk_by(|a, b| a.0 == b.0) {
            let page = group[0].0;
            let list: SmallVec<[(ClusterId, u32); 4]> =
                group.iter().map(|&(_, o, i)| (o, i)).collect();
            let e = &self.pages[page.index()];
            let home = self.homes.get(page) == Some(me);
            // Apply the carried diffs of these notices whose base the copy reflects,
            // repeatedly, in the order carried (oldest tenure first). A copy reflects
            // everything up to the last departure too (see `BarrierState::depart_time`):
            // a diff's base may name other clusters' intervals that never wrote the
            // page (a migrated home's copy reflects the whole departure time), which
            // the copy's own versions do not list.
            let mut known = e.known.clone();
            if !home {
                known.merge(&self.barrier.depart_time);
            }
            let mut seq: SmallVec<[IntervalDiff; 2]> = SmallVec::new();
            let mut held_in_seq = 0;
            let copy = matches!(e.access, PageAccess::ReadOnly | PageAccess::ReadWrite);
            if copy {
                // Each with whether it is a held update.
                let mut left: SmallVec<[(&IntervalDiff, bool); 4]> = diffs
                    .iter()
                    .map(|d| (d, false))
                    .chain(held.iter().map(|d| (d, true)))
                    .filter(|(d, _)| d.page == page && list.contains(&(d.owner, d.index)))
                    .collect();
                while let Some(i) = left.iter().position(|(d, _)| d.applies_to(&known, me)) {
                    let (d, from_held) = left.remove(i);
                    known.set(d.owner, d.index);
                    held_in_seq += u64::from(from_held);
                    seq.push(d.clone());
                }
            }
            let missing: SmallVec<[(ClusterId, u32); 4]> = list
                .iter()
                .copied()
                .filter(|&(o, i)| known.get(o) < i)
                .collect();
            if home {
                // The master cannot be dropped: apply what can be, wait for the rest.
                if e.access != PageAccess::Untouched {
                    plan.from_held += held_in_seq;
                    plan.apply.extend(seq.into_iter().map(|d| (d, e.twin)));
                }
                plan.wait.extend(missing.iter().map(|&(o, i)| (page, o, i)));
                continue;
            }
            plan.need.extend(list.iter().map(|&(o, i)| (page, o, i)));
            match e.access {
                PageAccess::ReadOnly | PageAccess::ReadWrite if missing.is_empty() => {
                    plan.from_held += held_in_seq;
                    plan.apply.extend(seq.into_iter().map(|d| (d, e.twin)));
                }
                PageAccess::ReadWrite if e.twin => plan.flush.push(page),
                PageAccess::ReadOnly => plan.invalidate.push(page),
                PageAccess::ReadWrite => {
                    return Err(Self::unexpected(
                        "write notice for a writable page without a twin",
                        me,
                        page,
                    ));
                }
                PageAccess::Invalid => {
                    if let Some(f) = self.fetches.get(&page)
                        && matches!(f.phase, Phase::AwaitPage { .. })
                    {
                        plan.stale.push(page);
                    }
                }
                PageAccess::Untouched => {
                    return Err(Self::unexpected(
                        "untouched page that is not homed here",
                        me,
                        page,
                    ));
                }
            }
        }
        Ok(plan)
    }

    /// Carries out a plan without flushes (see [`Machine::hlrc_plan_notices`]); the
    /// notices of pages homed here whose diffs have not arrived are remembered (see
    /// [`Machine::unreflected_before`]).
    pub(crate) fn hlrc_apply_plan(
        &mut self,
        plan: NoticePlan,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let NoticePlan {
            flush,
            apply,
            mut invalidate,
            need,
            stale,
            wait,
            from_held: _,
        } = plan;
        if !flush.is_empty() {
            return Err(Self::unexpected(
                "write notice for an open page at a barrier",
                self.me,
                flush[0],
            ));
        }
        let mut applied_home = Vec::new();
        for (d, twin) in apply {
            let page = d.page;
            self.entry(page).known.set(d.owner, d.index);
            self.stats.carried_diffs_applied += 1;
            self.stats.diff_bytes_applied += d.data.len() as u64;
            if self.homes.get(page) == Some(self.me) {
                applied_home.push(page);
            }
            out.push(Action::ApplyDiff {
                page,
                data: d.data,
                twin,
            });
        }
        self.stats.write_notices_received += need.len() as u64 + wait.len() as u64;
        for (page, owner, index) in need {
            let k = &mut self.entry(page).known;
            if k.get(owner) < index {
                k.set(owner, index);
            }
        }
        for page in stale {
            if let Some(f) = self.fetches.get_mut(&page)
                && let Phase::AwaitPage { stale } = &mut f.phase
            {
                *stale = true;
            }
        }
        for &page in &invalidate {
            self.entry(page).access = PageAccess::Invalid;
        }
        self.stats.invalidations += invalidate.len() as u64;
        for pages in PageRange::coalesce(&mut invalidate) {
            out.push(Action::Invalidate { pages });
        }
        applied_home.dedup();
        for page in applied_home {
            // Diffs that waited for what was just applied, and the fetches and
            // acquires waiting for it.
            self.hlrc_home_drain(page, out);
        }
        for w in wait {
            if !self.unreflected.contains(&w) {
                self.unreflected.push(w);
            }
        }
        Ok(())
    }

    /// The write notices of a barrier departure (no page of this cluster is open but
    /// home pages); the updates received for it act as diffs carried with them.
    pub(crate) fn hlrc_depart_notices(
        &mut self,
        records: &[IntervalRecord],
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let updates = std::mem::take(&mut self.updates);
        let plan = self.hlrc_plan_notices(records, &updates, &[])?;
        // The updates are the only diffs this plan was given: every diff it applies
        // is one of them.
        let applied = plan.apply.len() as u64;
        self.stats.updates_applied += applied;
        self.stats.updates_dropped += updates.len() as u64 - applied;
        self.hlrc_apply_plan(plan, out)
    }

    /// Takes effect after a grant's notices (`plan`, which was given the held
    /// updates): the updates it applied count as applied, and every held update
    /// whose interval this cluster now knows is dropped — the departure would find
    /// no notice for it (its page was updated, or invalidated and will be fetched).
    ///
    /// Why: a cluster's barrier flush also releases the locks other clusters asked
    /// for during the phase (SPLASH's sums under a lock just before a barrier), so
    /// their grants bring the write notices of the flush's interval before the
    /// departure does; the updates that came with the same flush then keep those
    /// pages valid, as the departure would have.
    pub(crate) fn hlrc_apply_grant_plan(
        &mut self,
        plan: NoticePlan,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let applied = plan.from_held;
        self.hlrc_apply_plan(plan, out)?;
        let before = self.updates.len() as u64;
        let pages = &self.pages;
        // Those removed with a valid copy were applied by this plan (`applied`) or
        // came with the grant as carried diffs too (applied from there).
        let mut removed_valid = 0u64;
        self.updates.retain(|u| {
            let e = &pages[u.page.index()];
            let keep = e.known.get(u.owner) < u.index;
            if !keep && matches!(e.access, PageAccess::ReadOnly | PageAccess::ReadWrite) {
                removed_valid += 1;
            }
            keep
        });
        let removed = before - self.updates.len() as u64;
        self.stats.updates_applied += applied;
        self.stats.updates_at_grant += applied;
        self.stats.updates_dropped += removed.saturating_sub(applied);
        self.stats.updates_redundant += removed_valid.saturating_sub(applied);
        Ok(())
    }

    /// An update from `from` for the next barrier departure (see
    /// [`crate::Config::barrier_updates`]): kept if it is one of `from`'s diffs of a
    /// page homed there, else dropped (a home sends updates of its own pages only; a
    /// stale or surplus one only costs the fetch it would have saved).
    pub(crate) fn on_update(
        &mut self,
        from: ClusterId,
        diff: IntervalDiff,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        self.check_page(diff.page)?;
        if diff.owner != from {
            return Err(Self::unexpected(
                "update of another cluster's diff",
                from,
                diff.page,
            ));
        }
        if self.homes.get(diff.page) != Some(from) || self.updates.len() >= MAX_HELD_UPDATES {
            self.stats.updates_dropped += 1;
            return Ok(());
        }
        if self.at_barrier() && self.hlrc_apply_update_now(&diff, out)? {
            return Ok(());
        }
        // Held: in its own allocation, not in the received bundle's buffer
        // (`Message::from_shared_parts`), which a peer could otherwise keep alive.
        self.updates.push(IntervalDiff {
            data: diff.data.unshared(),
            ..diff
        });
        Ok(())
    }

    /// Applies the held updates that can be applied now (see
    /// [`Machine::hlrc_apply_update_now`]), in the order they arrived, once this
    /// cluster's arrival is sent: those that came while its threads still computed
    /// the phase are applied while it waits for the departure, not after it.
    pub(crate) fn hlrc_apply_held_updates(&mut self, out: &mut Vec<Action>) {
        if !self.at_barrier() {
            return;
        }
        for u in std::mem::take(&mut self.updates) {
            // A plan error (a malformed update) leaves it for the departure, which
            // reports it.
            if !matches!(self.hlrc_apply_update_now(&u, out), Ok(true)) {
                self.updates.push(u);
            }
        }
    }

    /// Whether this cluster waits at a barrier with its arrival sent and no flush
    /// under way: no local thread runs until the departure, and every copy but the
    /// pages homed here is closed.
    fn at_barrier(&self) -> bool {
        self.barrier.waiting.is_some() && !self.barrier.arrival_held && self.flushing.is_none()
    }

    /// Applies an update at once, as the departure's notice of its interval would
    /// (see [`Machine::hlrc_depart_notices`]), when this cluster waits at the barrier
    /// and the copy is valid and reflects the update's base: returns whether it did.
    /// Nothing else would happen to the page at the departure, and no local thread
    /// reads it before then (they all wait at the barrier), so the departure finds
    /// the notice reflected; the cluster applies the updates while it waits instead
    /// of after the departure (EM3D on 2 × 1: ≈ 40 updates of 4 KiB per phase each
    /// way). Anything else — no valid copy, a base not yet reflected (an earlier
    /// update held), a fetch in flight — keeps the update for the departure.
    fn hlrc_apply_update_now(
        &mut self,
        diff: &IntervalDiff,
        out: &mut Vec<Action>,
    ) -> Result<bool, ProtocolError> {
        let notice = IntervalRecord {
            owner: diff.owner,
            index: diff.index,
            pages: std::sync::Arc::from([diff.page]),
        };
        let plan = self.hlrc_plan_notices(
            std::slice::from_ref(&notice),
            &[],
            std::slice::from_ref(diff),
        )?;
        let pure = plan.flush.is_empty()
            && plan.invalidate.is_empty()
            && plan.stale.is_empty()
            && plan.wait.is_empty()
            && plan.apply.len() == 1;
        if !pure {
            return Ok(false);
        }
        self.stats.updates_applied += 1;
        self.stats.updates_early += 1;
        self.hlrc_apply_plan(plan, out)?;
        Ok(true)
    }

    /// Pages of `records` (this cluster's own since the last barrier) that it wrote
    /// as a non-home and holds valid: migration candidates.
    pub(crate) fn hlrc_migratable(&self, records: &[IntervalRecord]) -> Vec<PageId> {
        let mut v: Vec<PageId> = records
            .iter()
            .flat_map(|r| r.pages.iter().copied())
            .filter(|&p| {
                self.homes.get(p) != Some(self.me)
                    && self.pages[p.index()].access == PageAccess::ReadOnly
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Applies single-writer home migrations from a barrier departure at `time`.
    /// Every other cluster drops its copy of a migrated page (even a valid one), so
    /// that its next access fetches from the new home: the new home's copyset is then
    /// exact, and no diff can reach the new home before it has processed the same
    /// departure. The new home's copy reflects everything up to the departure.
    pub(crate) fn hlrc_migrate(
        &mut self,
        from: ClusterId,
        migrations: &[(PageId, ClusterId)],
        time: &VectorTime,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let me = self.me;
        let mut invalid = Vec::new();
        for &(p, new) in migrations {
            let old = self.homes.get(p);
            if old == Some(new) {
                continue;
            }
            if self.fetches.contains_key(&p) {
                // Barrier arrivals wait for every fetch, prefetches included.
                return Err(Self::unexpected(
                    "migration of a page being fetched",
                    from,
                    p,
                ));
            }
            self.homes.set(p, new);
            let was_home = old == Some(me);
            if was_home {
                self.copysets.remove(&p);
                if self.deferred_fetches.contains_key(&p) {
                    return Err(Self::unexpected("migration of a busy home page", from, p));
                }
                // Diffs still waiting here are dropped (the new home's copy has their
                // words); a later fetch here must reflect them.
                for d in self.home_pending.remove(&p).unwrap_or_default() {
                    self.stats.stale_diffs_dropped += 1;
                    let k = &mut self.entry(p).known;
                    if k.get(d.owner) < d.index {
                        k.set(d.owner, d.index);
                    }
                }
                let e = self.entry(p);
                if e.access == PageAccess::Untouched {
                    e.access = PageAccess::Invalid;
                }
                if e.twin {
                    // Shared while this cluster waited at the barrier: nothing wrote
                    // it since (its threads are at the barrier).
                    e.twin = false;
                    e.idle = 0;
                    self.open.retain(|&q| q != p);
                    out.push(Action::DropTwin { page: p });
                }
            }
            if new != me {
                let e = self.entry(p);
                match e.access {
                    PageAccess::ReadOnly => {
                        e.access = PageAccess::Invalid;
                        invalid.push(p);
                    }
                    // The old home's writable copy is the master the new home copied:
                    // drop it like a read-only one.
                    PageAccess::ReadWrite if was_home => {
                        e.access = PageAccess::Invalid;
                        invalid.push(p);
                    }
                    PageAccess::ReadWrite => {
                        return Err(Self::unexpected("migration of a dirty page", from, p));
                    }
                    PageAccess::Invalid | PageAccess::Untouched => {}
                }
            } else {
                if self.entry(p).access != PageAccess::ReadOnly {
                    return Err(Self::unexpected(
                        "migration to a cluster without a valid copy",
                        from,
                        p,
                    ));
                }
                let mut set = CopySet::default();
                set.insert(me);
                self.copysets.insert(p, set);
                self.entry(p).known.merge(time);
                self.stats.home_migrations += 1;
            }
        }
        self.stats.invalidations += invalid.len() as u64;
        for pages in PageRange::coalesce(&mut invalid) {
            out.push(Action::Invalidate { pages });
        }
        Ok(())
    }
}
