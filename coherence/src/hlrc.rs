//! hlrc: home-based lazy release consistency with multiple writers (the default
//! protocol).
//!
//! # Rules
//!
//! Per page and cluster the state is missing (*untouched* at the home: all zeros,
//! never installed; *invalid* elsewhere), *read-only*, or *read-write* (outside the
//! home with a twin). The home's copy is the master copy; the home keeps the
//! copyset.
//!
//! * **Read fault** on a missing non-home page: send `GetPage` to the home; the home
//!   replies with the page (Tag-On) or a zero-page notice; install read-only.
//!   Concurrent faults on the page wait for the same fetch. A fetch is not sent while
//!   this cluster's own diffs of the page are unacknowledged (it must see them).
//! * **Write fault** on a read-only non-home page: `MakeTwin`, `Unprotect`; the page
//!   joins the interval's write set. On a missing page: fetch, then install, twin,
//!   unprotect. At the home: unprotect only (no twin — the master is updated in
//!   place); the page joins the write set, so the home's own writes produce write
//!   notices, *if another cluster may hold a copy* (see *private home pages* below).
//!   If this cluster's previous diff of the page is not yet
//!   acknowledged, the fault waits for the acknowledgement before taking the twin:
//!   at most one diff per page and cluster is in flight, because the network may
//!   deliver two diffs of the same words out of order (the random-program tests
//!   found this; HLRC relies on FIFO channels instead).
//! * **Release** (lock release, barrier arrival): `WriteProtect` every page of the
//!   write set first, then `SendDiff` each non-home one to its home (a thread that
//!   writes concurrently re-faults and makes a fresh twin after the diff); record
//!   the write notices in an interval record ([`crate::interval`]). The home applies
//!   each diff and acknowledges it. The release completes — the lock release or
//!   barrier arrival is sent and the thread resumes — when all diffs of this release
//!   *and of every earlier release of the cluster* are acknowledged (releases
//!   complete in order, because a later release's vector time covers the earlier
//!   intervals). Diffs carry a 16-bit tag naming the release epoch.
//! * **Acquire** (lock grant, barrier departure): for each write notice not yet seen,
//!   invalidate the page unless this cluster is its home (the master is current). A
//!   dirty page (with a twin) is first write-protected and diffed to its home, then
//!   invalidated, so no local write is lost (ArgoDSM writes its dirty data back
//!   before self-invalidation: `swdsm.cpp`, `self_invalidation`); its notice goes
//!   out with the next release, which also waits for that diff's acknowledgement. A
//!   fetch in flight when the notice arrives may return the old contents: its reply
//!   is discarded and the page fetched again.
//!
//! Why a read after an acquire sees the last release before it: the writer's diff
//! was applied at the home before its release completed, hence before the lock or
//! barrier passed the notice on; the acquirer invalidated the page on the notice,
//! and its next fault fetches from the home after that point. (HLRC, Zhou, Iftode,
//! Li, OSDI 1996 §2, enforces the same with per-page flush timestamps; MGS, ISCA 1996
//! §3, also completes a release only after the home has the data.)
//!
//! # Private home pages
//!
//! The home's own writes need write notices only so that clusters holding a copy
//! invalidate it. While the copyset of a home page names no other cluster, nobody
//! else can hold a copy, so the home's write fault makes the page writable *without*
//! adding it to the write set: it stays writable across releases and produces no
//! write notice, no write-protection and no further fault. The first `GetPage` from
//! another cluster ends this: the page joins the write set as it is copied, so the
//! home's next release write-protects it and records a notice for it, and from then
//! on its writes fault and are tracked as above (the copyset never shrinks, except
//! when a migration resets it).
//!
//! Why no notice is lost: a notice for a home write `w` is needed only by a cluster
//! whose copy was taken before `w`. Every copy of a private page is taken by a
//! `GetPage` that puts the page in the write set; a write after the copy is then
//! covered by the notice of the home's next release, which every happens-before
//! chain from that write to another cluster passes through. (Write-protecting the
//! page before the copy instead would cost a `UFFDIO_WRITEPROTECT` — with its TLB
//! shootdown — on the fetch's critical path: 16 → 38 µs per remote fault in `bench
//! dsm`, where both clusters share one process.) A fetch in flight while the page is
//! still private needs no stale mark either: its reply is copied after every write
//! that completed before it. Writes to a private page that precede another
//! cluster's first fetch in the same barrier interval are not in the home's records,
//! so the barrier manager may migrate the page to that single reported writer —
//! correctly, since its copy includes them.
//!
//! Invariant (checked by the model): a home page that is writable and not in the
//! write set is private — no other cluster holds a copy.
//!
//! This is the private/shared page classification of ArgoDSM's Pyxis directory
//! (Kaxiras, Klaftenegger, Norgren, Ros, Sagonas, "Turning Centralized Coherence
//! and Distributed Critical-Section Execution on their Head", HPDC 2015; in
//! etascale/argodsm `src/backend/mpi/swdsm.cpp` the per-page sharer and writer
//! bitmaps `globalSharers`: a page with a single sharer is private and needs no
//! coherence action, and the first remote access turns it shared) applied to the
//! home's write detection in HLRC (Zhou, Iftode, Li, OSDI 1996 §2: home writes need
//! no twin or diff; here they need no notice either while the home is the page's
//! only holder).
//!
//! # Single-writer fast path: home migration at barriers
//!
//! With [`crate::Config::migrate_single_writer`] (default), each barrier arrival
//! lists the pages the cluster wrote since the previous barrier as a non-home and
//! still holds valid. If the barrier manager sees that exactly one cluster wrote such
//! a page in that barrier interval, the page's home moves to that writer; every
//! cluster applies the move from the departure. From then on the writer's writes are
//! home writes — no twin, no diff, no acknowledgement, only write notices — while the
//! page keeps a single writer. The new home's copy is the master: it was flushed at
//! the arrival and nobody else wrote the page in the interval. Every other cluster
//! drops its copy of a migrated page, so its next access fetches from the new home;
//! requests that reach the new home before it has processed the departure are held
//! until it has. This is the home
//! migration of JIAJIA (Hu, Shi, Tang, "Home Migration in Home-based Software DSMs",
//! WSDSM 1999), chosen over MGS-style exclusive single-writer pages (which need a
//! revocation path) because barriers already gather every write notice.

use crate::action::{Action, Source};
use crate::error::ProtocolError;
use crate::home::CopySet;
use crate::ids::{ClusterId, PageId, PageRange};
use crate::interval::IntervalRecord;
use crate::machine::{Fetch, Machine, PageAccess, Phase, Waiter};
use crate::message::Message;

impl Machine {
    fn mark_written(&mut self, page: PageId) {
        let e = self.entry(page);
        if !e.written {
            e.written = true;
            self.written.push(page);
        }
    }

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
        let me = self.me;
        let home = self.homes.get(page);
        match (self.entry(page).access, w.write) {
            (PageAccess::ReadOnly | PageAccess::ReadWrite, false)
            | (PageAccess::ReadWrite, true) => {
                self.stats.spurious_faults += 1;
                Self::wake(page, &[w], out);
                Ok(())
            }
            (PageAccess::ReadOnly, true) => {
                if home != Some(me) && self.entry(page).unacked > 0 {
                    self.stats.twin_waits += 1;
                    self.fetches
                        .insert(page, Fetch::new(vec![w], Phase::AwaitTwin));
                    return Ok(());
                }
                self.hlrc_make_writable(page, &[w], out);
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

    /// A write at the home made `page` writable: tracked (write set, notices) only if
    /// another cluster may hold a copy (see *Private home pages*).
    fn hlrc_home_written(&mut self, page: PageId) {
        if self.hlrc_shared(page) {
            self.mark_written(page);
        } else {
            self.stats.private_home_writes += 1;
        }
    }

    /// Write fault on a valid read-only page: twin (outside the home), unprotect.
    fn hlrc_make_writable(&mut self, page: PageId, waiters: &[Waiter], out: &mut Vec<Action>) {
        let home = self.homes.get(page) == Some(self.me);
        if !home {
            out.push(Action::MakeTwin { page });
            self.stats.twins += 1;
        }
        out.push(Action::Unprotect { page });
        self.entry(page).access = PageAccess::ReadWrite;
        if home {
            self.hlrc_home_written(page);
        } else {
            self.mark_written(page);
        }
        Self::wake(page, waiters, out);
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
        out.push(Action::Install {
            page,
            source: Source::Zero,
            writable: write,
        });
        if write {
            self.entry(page).access = PageAccess::ReadWrite;
            self.hlrc_home_written(page);
        } else {
            self.entry(page).access = PageAccess::ReadOnly;
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
        let phase = self.hlrc_request(page, home, out);
        self.fetches.insert(page, Fetch::new(waiters, phase));
        Ok(())
    }

    /// Sends `GetPage` unless this cluster's diffs of the page are unacknowledged.
    fn hlrc_request(&mut self, page: PageId, home: ClusterId, out: &mut Vec<Action>) -> Phase {
        if self.entry(page).unacked > 0 {
            return Phase::AwaitAcks;
        }
        self.stats.remote_fetches += 1;
        self.send(home, Message::GetPage { page }, out);
        Phase::AwaitPage { stale: false }
    }

    pub(crate) fn on_get_page(
        &mut self,
        from: ClusterId,
        page: PageId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if !self.require_home(from, page, &Message::GetPage { page })? {
            return Ok(());
        }
        let e = self.entry(page);
        if e.access == PageAccess::ReadWrite && !e.written {
            // A private home page (writable, untracked) gets its first remote copy: it
            // joins the write set, so the next release write-protects it and records a
            // notice covering every write from now on.
            self.stats.home_pages_shared += 1;
            self.mark_written(page);
        }
        let zero = match self.entry(page).access {
            PageAccess::Untouched => true,
            PageAccess::ReadOnly | PageAccess::ReadWrite => false,
            PageAccess::Invalid => {
                return Err(Self::unexpected(
                    "fetch of an invalid home page",
                    from,
                    page,
                ));
            }
        };
        if zero {
            self.stats.zero_pages_served += 1;
        } else {
            self.stats.pages_served += 1;
        }
        let me = self.me;
        let set = self.copysets.entry(page).or_insert_with(|| {
            let mut s = CopySet::default();
            s.insert(me);
            s
        });
        set.insert(from);
        self.send(
            from,
            Message::PageData {
                page,
                writable: false,
                zero,
            },
            out,
        );
        Ok(())
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
        if stale {
            // A write notice arrived after the request: the reply may predate the
            // diff it announces. Fetch again (after our own diffs are acknowledged).
            self.stats.stale_refetches += 1;
            let phase = self.hlrc_request(page, from, out);
            if let Some(f) = self.fetches.get_mut(&page) {
                f.phase = phase;
            }
            return Ok(());
        }
        let Some(f) = self.fetches.remove(&page) else {
            return Err(Self::unexpected("page without a fetch", from, page));
        };
        if self.entry(page).access != PageAccess::Invalid {
            return Err(Self::unexpected("page for a valid copy", from, page));
        }
        let write = f.waiters.iter().any(|w| w.write);
        out.push(Action::Install {
            page,
            source: if zero { Source::Zero } else { Source::Attached },
            writable: false,
        });
        if write {
            out.push(Action::MakeTwin { page });
            out.push(Action::Unprotect { page });
            self.stats.twins += 1;
            self.entry(page).access = PageAccess::ReadWrite;
            self.mark_written(page);
        } else {
            self.entry(page).access = PageAccess::ReadOnly;
        }
        Self::wake(page, &f.waiters, out);
        self.inbox.extend(f.deferred);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_diff(
        &mut self,
        from: ClusterId,
        page: PageId,
        tag: u16,
        whole_page: bool,
        attached_len: usize,
        msg: Message,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if !self.require_home(from, page, &msg)? {
            return Ok(());
        }
        if !self.copysets.get(&page).is_some_and(|c| c.contains(from)) {
            return Err(Self::unexpected(
                "diff from a cluster that never fetched the page",
                from,
                page,
            ));
        }
        match self.entry(page).access {
            PageAccess::Untouched => {
                out.push(Action::Install {
                    page,
                    source: Source::Zero,
                    writable: false,
                });
                self.entry(page).access = PageAccess::ReadOnly;
            }
            PageAccess::Invalid => {
                return Err(Self::unexpected(
                    "diff for an invalid home page",
                    from,
                    page,
                ));
            }
            PageAccess::ReadOnly | PageAccess::ReadWrite => {}
        }
        out.push(Action::ApplyDiff { page, whole_page });
        self.stats.diffs_applied += 1;
        if whole_page {
            self.stats.whole_page_diffs_applied += 1;
        }
        self.stats.diff_bytes_applied += attached_len as u64;
        self.send(from, Message::DiffAck { page, tag }, out);
        Ok(())
    }

    pub(crate) fn on_diff_ack(
        &mut self,
        from: ClusterId,
        page: PageId,
        tag: u16,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.homes.get(page) != Some(from)
            || self.entry(page).unacked == 0
            || !self.epochs.ack(tag)
        {
            return Err(Self::unexpected("diff acknowledgement", from, page));
        }
        let e = self.entry(page);
        e.unacked -= 1;
        if e.unacked == 0 {
            match self.fetches.get(&page).map(|f| f.phase) {
                Some(Phase::AwaitAcks) => {
                    let phase = self.hlrc_request(page, from, out);
                    if let Some(f) = self.fetches.get_mut(&page) {
                        f.phase = phase;
                    }
                }
                Some(Phase::AwaitTwin) => {
                    if let Some(f) = self.fetches.remove(&page) {
                        self.hlrc_make_writable(page, &f.waiters, out);
                        self.inbox.extend(f.deferred);
                    }
                }
                _ => {}
            }
        }
        self.complete_ready(out)
    }

    /// `SendDiff` of a dirty non-home page in the open epoch.
    fn send_diff(&mut self, page: PageId, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        let Some(to) = self.homes.get(page) else {
            return Err(Self::unexpected(
                "diff of a page without a home",
                self.me,
                page,
            ));
        };
        out.push(Action::SendDiff {
            to,
            page,
            tag: self.epochs.open.tag,
        });
        self.epochs.open.pending += 1;
        self.entry(page).unacked += 1;
        self.stats.diffs_sent += 1;
        Ok(())
    }

    /// Release: write-protect the write set, diff the non-home pages, record the
    /// interval's write notices.
    pub(crate) fn hlrc_flush_written(
        &mut self,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let mut written = std::mem::take(&mut self.written);
        if written.is_empty() {
            return Ok(());
        }
        let me = self.me;
        let mut protect = Vec::new();
        let mut diffs = Vec::new();
        for &p in &written {
            let home = self.homes.get(p);
            let e = self.entry(p);
            e.written = false;
            if e.access == PageAccess::ReadWrite {
                e.access = PageAccess::ReadOnly;
                protect.push(p);
                if home != Some(me) {
                    diffs.push(p);
                }
            }
        }
        for pages in PageRange::coalesce(&mut protect) {
            out.push(Action::WriteProtect { pages });
        }
        for p in diffs {
            self.send_diff(p, out)?;
        }
        written.sort_unstable();
        written.dedup();
        let index = self.time.get(me) + 1;
        self.log.insert(IntervalRecord {
            owner: me,
            index,
            pages: written,
        })?;
        self.time.set(me, index);
        self.stats.intervals += 1;
        Ok(())
    }

    /// Acquire: apply write notices (invalidate, flushing dirty pages first).
    pub(crate) fn hlrc_apply_notices(
        &mut self,
        mut pages: Vec<PageId>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        pages.sort_unstable();
        pages.dedup();
        let me = self.me;
        let mut protect = Vec::new();
        let mut diffs = Vec::new();
        let mut invalid = Vec::new();
        for p in pages {
            self.check_page(p)?;
            if self.homes.get(p) == Some(me) {
                continue;
            }
            match self.entry(p).access {
                PageAccess::ReadOnly => {
                    invalid.push(p);
                    // A write fault waiting to take a twin now needs a fetch.
                    if let Some(f) = self.fetches.get_mut(&p)
                        && f.phase == Phase::AwaitTwin
                    {
                        f.phase = Phase::AwaitAcks;
                    }
                }
                PageAccess::ReadWrite => {
                    protect.push(p);
                    diffs.push(p);
                    invalid.push(p);
                }
                PageAccess::Invalid => {
                    if let Some(f) = self.fetches.get_mut(&p)
                        && let Phase::AwaitPage { stale } = &mut f.phase
                    {
                        *stale = true;
                    }
                }
                PageAccess::Untouched => {}
            }
        }
        for &p in &invalid {
            self.entry(p).access = PageAccess::Invalid;
        }
        for pages in PageRange::coalesce(&mut protect) {
            out.push(Action::WriteProtect { pages });
        }
        self.stats.diffs_at_acquire += diffs.len() as u64;
        for p in diffs {
            self.send_diff(p, out)?;
        }
        self.stats.invalidations += invalid.len() as u64;
        for pages in PageRange::coalesce(&mut invalid) {
            out.push(Action::Invalidate { pages });
        }
        Ok(())
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

    /// Applies single-writer home migrations from a barrier departure. Every other
    /// cluster drops its copy of a migrated page (even a valid one), so that its next
    /// access fetches from the new home: the new home's copyset is then exact, and no
    /// diff can reach the new home before it has processed the same departure.
    pub(crate) fn hlrc_migrate(
        &mut self,
        from: ClusterId,
        migrations: &[(PageId, ClusterId)],
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let me = self.me;
        let mut invalid = Vec::new();
        for &(p, new) in migrations {
            let old = self.homes.get(p);
            if old == Some(new) {
                continue;
            }
            self.homes.set(p, new);
            let was_home = old == Some(me);
            if was_home {
                self.copysets.remove(&p);
                let e = self.entry(p);
                if e.access == PageAccess::Untouched {
                    e.access = PageAccess::Invalid;
                }
                if e.written {
                    // A private page that another cluster fetched while this cluster
                    // waited at the barrier: in the write set only to be protected at
                    // the next release; no thread has written it since the copy.
                    e.written = false;
                    self.written.retain(|&q| q != p);
                }
            }
            if new != me {
                let e = self.entry(p);
                match e.access {
                    PageAccess::ReadOnly => {
                        e.access = PageAccess::Invalid;
                        invalid.push(p);
                    }
                    // The old home's writable copy (see above) is the master the new
                    // home copied: drop it like a read-only one.
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
