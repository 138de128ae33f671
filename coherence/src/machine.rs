//! The per-cluster coherence machine: its state, event dispatch and message handling,
//! and the state the protocols ([`crate::hlrc`], [`crate::sc`]) and the cluster side of
//! the locks ([`crate::locks`]) share. Intervals and flushes are in `flush.rs`, barrier
//! arrival and departure in `barrier.rs`, first-touch home lookup in `home_lookup.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::mem;

use smallvec::SmallVec;

use crate::action::{Action, Event, FlushPage};
use crate::config::{Config, ConfigError, Protocol};
use crate::error::ProtocolError;
use crate::home::{CopySet, HomeMap};
use crate::ids::{ClusterId, FaultToken, LockId, PageId, SyncToken};
use crate::interval::{IntervalDiff, IntervalLog, IntervalRecord, VectorTime};
use crate::lock_table::LockTable;
use crate::locks::{ClusterLock, Grant};
use crate::message::Message;
pub(crate) use crate::page_table::PageEntry;
use crate::page_table::PageTable;
use crate::readahead::Readahead;
use crate::stats::Stats;
use crate::sync::{BarrierManager, LockManager, Request};
use crate::write_ahead::WriteAhead;

/// Local access to a page at one cluster, as the machine has arranged it with the
/// runtime.
///
/// Source: page states of Ivy (Li & Hudak, TOCS 1989 §4.1: nil, read, write) and
/// HLRC (OSDI 1996 §2: invalid, read-only, read-write with twin).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageAccess {
    /// Home only: never installed; its contents are all zeros. Accesses fault.
    Untouched,
    /// Not installed (or invalidated). Accesses fault.
    Invalid,
    /// Installed and write-protected.
    ReadOnly,
    /// Installed and writable (hlrc: with a twin, or a private home page).
    ReadWrite,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Waiter {
    pub(crate) token: FaultToken,
    pub(crate) write: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// First-touch: waiting for `HomeIs`.
    AwaitHome,
    /// hlrc: `GetPage` sent; `stale` when a write notice arrived meanwhile.
    AwaitPage { stale: bool },
    /// sc: a read or write request is outstanding at the home.
    Sc { write: bool },
}

/// A page fault in progress: one fetch, many waiting faults.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Fetch {
    pub(crate) waiters: Vec<Waiter>,
    pub(crate) phase: Phase,
    /// Messages that cannot be handled until this fetch completes.
    pub(crate) deferred: Vec<(ClusterId, Message)>,
}

impl Fetch {
    pub(crate) fn new(waiters: Vec<Waiter>, phase: Phase) -> Self {
        Self {
            waiters,
            phase,
            deferred: Vec::new(),
        }
    }
}

/// What closes an interval, run once its flush is done.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Completion {
    /// The locks of [`Machine::leaving`] leave this cluster: send each one's
    /// `LockRelease` to its manager.
    Release,
    /// The barrier arrival (sent once this cluster's diffs are acknowledged).
    Barrier,
    /// Nothing: a thread waits for a lock requested from its manager, and the
    /// interval closes meanwhile ([`crate::Config::flush_ahead`]); no lock leaves.
    Ahead,
}

/// What a flush was started for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Resume {
    /// An interval closes (a lock leaves, a barrier, a flush ahead of a lock's grant).
    Close(Completion),
    /// A grant (or push) whose write notices hit open pages without a diff to apply:
    /// the pages were flushed and closed first; the grant is taken now.
    Grant(Grant),
}

/// A flush in progress: the pages of the [`Action::Flush`] and what comes next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Flushing {
    pub(crate) pages: Vec<FlushPage>,
    pub(crate) then: Resume,
}

/// An acquire (or a barrier departure) whose write notices name pages homed here
/// whose diffs have not arrived yet: it completes when the master copy has them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Held {
    /// `(page, owner, index)`: the home must have applied that interval's diff.
    pub(crate) waits: Vec<(PageId, ClusterId, u32)>,
    /// The completion to emit.
    pub(crate) done: Action,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct BarrierState {
    pub(crate) episode: u32,
    pub(crate) waiting: Option<SyncToken>,
    /// hlrc: the arrival waits for the prefetches in flight (so that no reply can
    /// cross a home migration at the departure).
    pub(crate) arrival_held: bool,
    pub(crate) deferred: Vec<(ClusterId, Message)>,
    /// hlrc: a departure received before every update the other clusters had sent
    /// here when they arrived (see [`Message::BarrierDepart`]); it completes when the
    /// last of them is received.
    pub(crate) held_depart: Option<HeldDepart>,
    /// hlrc: the time of the last departure completed here. Every copy this cluster
    /// holds valid (not homed here) reflects every write up to it: the departure
    /// applied or invalidated on each notice it covers, and a copy fetched since
    /// came from a home that reflected the notices this cluster had seen.
    pub(crate) depart_time: VectorTime,
}

/// A barrier departure waiting for updates ([`BarrierState::held_depart`]): the
/// fields of its [`Message::BarrierDepart`] and its sender.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HeldDepart {
    pub(crate) from: ClusterId,
    pub(crate) episode: u32,
    pub(crate) time: VectorTime,
    pub(crate) records: Vec<IntervalRecord>,
    pub(crate) migrations: Vec<(PageId, ClusterId)>,
    pub(crate) updates_due: Vec<(ClusterId, u64)>,
}

/// sc directory entry at the home.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Directory {
    /// A remote cluster holding the page writable (the home's copy is then invalid).
    pub(crate) remote_owner: Option<ClusterId>,
    /// Remote clusters holding read-only copies.
    pub(crate) readers: CopySet,
    pub(crate) busy: Option<Txn>,
    pub(crate) queue: VecDeque<(ClusterId, bool)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Txn {
    pub(crate) requester: ClusterId,
    pub(crate) write: bool,
    pub(crate) acks: u32,
    pub(crate) writeback_from: Option<ClusterId>,
}

/// Own diffs kept for carrying with locks (newest last); older ones are dropped.
///
/// Source: this project's bound (see [`crate::sync`], carried diffs).
pub(crate) const MAX_RECENT_DIFFS: usize = 64;

/// hlrc: one of [`Machine::recent`]'s diffs and the managers a `LockRelease` has
/// carried it to already: each goes once to each manager, not again with every later
/// release whose tenure it falls in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RecentDiff {
    /// The diff.
    pub(crate) diff: IntervalDiff,
    /// The managers it was carried to, sorted.
    pub(crate) carried_to: SmallVec<[ClusterId; 2]>,
}

/// How many barrier updates a cluster keeps for the next departure; more are dropped
/// (their pages are invalidated and fetched as without updates).
pub(crate) const MAX_HELD_UPDATES: usize = 1 << 16;

/// The coherence machine of one cluster: a pure state machine, driven by
/// [`Event`]s, producing [`Action`]s. One machine per cluster is shared by all of the
/// cluster's compute threads (they share the cluster's single copy of each page).
///
/// # Calling contract
///
/// 1. **One event at a time.** Call [`Machine::handle`] with one [`Event`]; it
///    appends actions to `out`. Execute *all* of them, *in order*, before passing
///    the machine another event — the simplest way is to hold the machine's lock
///    while executing them. In particular `WriteProtect` must take effect before the
///    `Flush` that diffs the same pages, `MakeTwin` before `Unprotect`, `Send`
///    (which copies the page) before the `Invalidate` that follows it, and `Install`
///    before `Wake`.
/// 2. **Flushes.** When the actions end with [`Action::Flush`], execute it and pass
///    its result as [`Event::Flushed`] right away, before any other event (the
///    machine refuses other events meanwhile); that call's actions may end with
///    another flush.
/// 3. **Faults.** Pass every userfaultfd fault on the region as
///    [`Event::ReadFault`] (MISSING) or [`Event::WriteFault`] (WP, or MISSING caused
///    by a write) with a token; the thread stays blocked until an
///    [`Action::Wake`] names its token, then retries its access (which may fault
///    again). Concurrent faults on a page produce one fetch; a fault on an
///    accessible page is answered with an immediate wake.
/// 4. **Synchronization.** [`Event::Acquire`], [`Event::Release`] and
///    [`Event::Barrier`] (once per cluster, after the runtime gathered the cluster's
///    threads) block the caller until the matching `AcquireDone`, `ReleaseDone` or
///    `BarrierDone`. A thread must not touch DSM memory between issuing an acquire
///    and its completion. Barriers must include every compute thread of the job.
///    A runtime may let a lock that [`Machine::lock_cacheable`] allows pass between
///    its threads without the machine (the machine sees one holder), and must release
///    it through the machine once an [`Action::LockWanted`] names it.
/// 5. **Messages.** Deliver every received protocol message as [`Event::Message`]
///    with the sender's id, keeping a Tag-On buffer alive during the call; actions
///    emitted during that call may read it ([`crate::Source::Attached`]). The machine
///    never refers to it later. The network may reorder messages but must not lose
///    or duplicate them (the message layer's reliable protocol), with one exception:
///    the `Send`s of one [`Machine::handle`] call to one cluster must be delivered
///    in the order emitted (the runtime sends them through one endpoint, in one
///    bundle or one after the other, numbers its bundles per destination, and the
///    receiving runtime handles each sender's bundles in that order, whichever of
///    its threads received them): a later grant or release of the call leaves out
///    the interval records an earlier one to the same cluster carried.
/// 6. **Actions.** See each [`Action`] variant. Memory actions only target pages in
///    the state the machine believes (e.g. `Install` only on missing pages), so a
///    runtime error from `UFFDIO_*` indicates a bug.
/// 7. **Errors.** A [`ProtocolError`] is fatal: report it and stop the job.
///
/// Source: sans-I/O protocol engines (style.md practice 7, quinn-proto); protocol
/// rules in [`crate::hlrc`], [`crate::sc`], [`crate::interval`], [`crate::sync`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Machine {
    pub(crate) me: ClusterId,
    pub(crate) cfg: Config,
    pub(crate) homes: HomeMap,
    pub(crate) pages: PageTable,
    pub(crate) fetches: BTreeMap<PageId, Fetch>,
    /// hlrc: the prefetch window of the next demand fetch ([`crate::readahead`]).
    pub(crate) readahead: Readahead,
    /// hlrc: the pages from the region's start that the application's data covers
    /// ([`Machine::set_extent`]); read-ahead stays below it. The region's pages until
    /// set (`u32::MAX`: no bound of its own).
    pub(crate) extent: u32,
    /// hlrc: where a write fault continues a sweep ([`crate::write_ahead`]).
    pub(crate) write_ahead: WriteAhead,
    /// hlrc: pages with a twin (writable, diffed at every flush), in opening order.
    pub(crate) open: Vec<PageId>,
    /// hlrc: this cluster's recent diffs in interval order, newest last, carried by
    /// the locks it gives back (at most [`MAX_RECENT_DIFFS`]; dropped at barriers).
    pub(crate) recent: VecDeque<RecentDiff>,
    /// hlrc, at the home: received diffs that cannot be applied yet (their base is
    /// not reflected), by page.
    pub(crate) home_pending: BTreeMap<PageId, Vec<IntervalDiff>>,
    /// hlrc, at the home: fetches waiting for diffs, by page: `(requester, need)`.
    pub(crate) deferred_fetches: BTreeMap<PageId, Vec<(ClusterId, VectorTime)>>,
    /// hlrc: acquires waiting for diffs of pages homed here.
    pub(crate) held: Vec<Held>,
    /// hlrc: write notices `(page, owner, index)` of pages homed here that this
    /// cluster has seen but whose diffs have not reached the master yet. An acquire
    /// whose lock time covers one waits for it, even when the notice came with an
    /// earlier grant (the cluster's time no longer says it is new).
    pub(crate) unreflected: Vec<(PageId, ClusterId, u32)>,
    /// hlrc: diffs of the flush just done that the lock releases it is for carry to
    /// the pages' home, one of their managers, instead of a `Diff` message.
    pub(crate) for_release: Vec<IntervalDiff>,
    /// Locks released by their last local holder that must leave the cluster (eager)
    /// but wait for a batch ([`Config::release_batch`]); still owned, not busy.
    pub(crate) deferred_releases: Vec<LockId>,
    /// The locks given back by the flush in progress (or just done): their
    /// `LockRelease`s go out when it completes.
    pub(crate) leaving: Vec<LockId>,
    /// During one [`Machine::handle`] call: per destination and message kind
    /// (grant: `false`, release: `true`), the highest interval record index per owner
    /// that a message of the call already carries there.
    pub(crate) event_sent: Vec<(ClusterId, bool, VectorTime)>,
    /// hlrc: updates received for the next barrier departure (see
    /// [`Config::barrier_updates`]), at most [`MAX_HELD_UPDATES`].
    pub(crate) updates: Vec<IntervalDiff>,
    /// hlrc: [`Message::Update`]s sent to each cluster since the job began (reported
    /// in barrier arrivals).
    pub(crate) updates_out: BTreeMap<ClusterId, u64>,
    /// hlrc: [`Message::Update`]s received from each cluster since the job began (a
    /// departure waits until they reach what it says each sender had sent).
    pub(crate) updates_in: BTreeMap<ClusterId, u64>,
    /// hlrc: the flush in progress (between [`Action::Flush`] and
    /// [`Event::Flushed`]).
    pub(crate) flushing: Option<Flushing>,
    /// hlrc: copysets of home pages.
    pub(crate) copysets: BTreeMap<PageId, CopySet>,
    /// sc: directory entries of home pages.
    pub(crate) dirs: BTreeMap<PageId, Directory>,
    pub(crate) time: VectorTime,
    pub(crate) log: IntervalLog,
    /// Locks this cluster owns, requests or waits for, or was granted before.
    pub(crate) cluster_locks: LockTable<ClusterLock>,
    /// Per lock manager, the merge of the lock times of the grants it sent here: its
    /// record store holds every record up to it, so releases need not resend those.
    pub(crate) manager_seen: BTreeMap<ClusterId, VectorTime>,
    pub(crate) barrier: BarrierState,
    pub(crate) locks: LockManager,
    pub(crate) barrier_mgr: Option<BarrierManager>,
    pub(crate) stats: Stats,
    /// Messages to handle before `handle` returns: to self, or replayed.
    pub(crate) inbox: VecDeque<(ClusterId, Message)>,
}

impl Machine {
    /// The machine of cluster `me` in a job configured by `cfg` (the same value at
    /// every cluster). Pages start missing everywhere; their contents are zeros.
    ///
    /// Source: initial state of a home-based protocol (HLRC OSDI 1996 §2: the home
    /// holds the master copy).
    pub fn new(me: ClusterId, cfg: Config) -> Result<Self, ConfigError> {
        cfg.validate()?;
        if !cfg.has_cluster(me) {
            return Err(ConfigError::NoSuchCluster(me, cfg.clusters));
        }
        let homes = HomeMap::new(&cfg);
        let pages = PageTable::new(me, &cfg);
        let batching = cfg.batches_releases();
        let sweep_recall = cfg.sweep_recall as usize;
        Ok(Self {
            me,
            barrier_mgr: (cfg.barrier_manager == me).then(|| BarrierManager::new(cfg.clusters)),
            homes,
            pages,
            cfg,
            fetches: BTreeMap::new(),
            readahead: Readahead::default(),
            extent: u32::MAX,
            write_ahead: WriteAhead::default(),
            open: Vec::new(),
            recent: VecDeque::new(),
            home_pending: BTreeMap::new(),
            deferred_fetches: BTreeMap::new(),
            held: Vec::new(),
            unreflected: Vec::new(),
            for_release: Vec::new(),
            deferred_releases: Vec::new(),
            leaving: Vec::new(),
            event_sent: Vec::new(),
            updates: Vec::new(),
            updates_out: BTreeMap::new(),
            updates_in: BTreeMap::new(),
            flushing: None,
            copysets: BTreeMap::new(),
            dirs: BTreeMap::new(),
            time: VectorTime::new(),
            log: IntervalLog::default(),
            cluster_locks: LockTable::default(),
            manager_seen: BTreeMap::new(),
            barrier: BarrierState::default(),
            locks: LockManager::new(batching, sweep_recall),
            stats: Stats::default(),
            inbox: VecDeque::new(),
        })
    }

    /// This cluster.
    ///
    /// Source: see [`Machine`].
    pub fn me(&self) -> ClusterId {
        self.me
    }

    /// The job configuration.
    ///
    /// Source: see [`Config`].
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters since creation or the last [`Machine::take_stats`].
    ///
    /// Source: see [`Stats`].
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Returns the counters and resets them to zero.
    ///
    /// Source: see [`Stats`].
    pub fn take_stats(&mut self) -> Stats {
        mem::take(&mut self.stats)
    }

    /// The home of `page` as known here (`None`: first-touch, not yet decided or
    /// not yet learned).
    ///
    /// Source: see [`crate::home`].
    pub fn home_of(&self, page: PageId) -> Option<ClusterId> {
        self.homes.get(page)
    }

    /// Bounds hlrc's read-ahead ([`crate::Config::prefetch`], [`crate::readahead`]) to the
    /// first `pages` pages of the region (at most the region's): the pages the
    /// application's shared data covers, which the runtime raises at every allocation. A
    /// prefetch past the last of them would fetch pages nothing reads (zero pages from
    /// their homes). Without a call, read-ahead may run to the region's end.
    pub fn set_extent(&mut self, pages: u32) {
        self.extent = pages.min(self.cfg.pages);
    }

    /// Local access to `page` (`None` outside the region).
    ///
    /// Source: see [`PageAccess`].
    pub fn access(&self, page: PageId) -> Option<PageAccess> {
        self.pages.get(page.index()).map(|e| e.access)
    }

    /// hlrc: whether `page` has a twin here (it is writable and diffed at every
    /// flush). Always `false` under sc.
    ///
    /// Source: see [`crate::hlrc`].
    pub fn has_twin(&self, page: PageId) -> bool {
        self.pages.get(page.index()).is_some_and(|e| e.twin)
    }

    /// hlrc: the versions of `page` this cluster's copy reflects (see
    /// [`crate::interval::IntervalDiff`]); empty under sc.
    ///
    /// Source: see [`crate::hlrc`].
    pub fn versions(&self, page: PageId) -> Option<&VectorTime> {
        self.pages.get(page.index()).map(|e| &e.known)
    }

    /// The copyset of a page homed here: hlrc, the clusters that fetched it since it
    /// was homed here (plus this one); sc, the remote read-only holders. Empty for
    /// pages homed elsewhere.
    ///
    /// Source: the directory of the home (HLRC OSDI 1996 §2; Ivy TOCS 1989 §4.1).
    pub fn copyset(&self, page: PageId) -> Vec<ClusterId> {
        match self.cfg.protocol {
            Protocol::Hlrc => self
                .copysets
                .get(&page)
                .map(|c| c.iter().collect())
                .unwrap_or_default(),
            Protocol::Sc => self
                .dirs
                .get(&page)
                .map(|d| d.readers.iter().collect())
                .unwrap_or_default(),
        }
    }

    /// sc: the remote cluster that holds `page` writable, as recorded by its home
    /// (`None` at other clusters or when the home or nobody holds it writable).
    ///
    /// Source: Ivy (TOCS 1989 §4.1), the owner field of the manager's table.
    pub fn remote_owner(&self, page: PageId) -> Option<ClusterId> {
        self.dirs.get(&page).and_then(|d| d.remote_owner)
    }

    /// This cluster's vector time (hlrc; always zero under sc).
    ///
    /// Source: see [`crate::interval`].
    pub fn vector_time(&self) -> &VectorTime {
        &self.time
    }

    /// Whether an [`Action::Flush`] waits for its [`Event::Flushed`].
    ///
    /// Source: see the calling contract of [`Machine`].
    pub fn is_flushing(&self) -> bool {
        self.flushing.is_some()
    }

    /// Whether nothing is in progress here: no fault pending, no diff waiting at this
    /// home for an earlier one, no fetch or acquire waiting for diffs, no acquire or
    /// barrier pending, no manager transaction open. Open pages (twins) may remain.
    ///
    /// Source: quiescence of the protocol (used by tests and shutdown).
    pub fn is_quiescent(&self) -> bool {
        self.fetches.is_empty()
            && self.home_pending.is_empty()
            && self.deferred_fetches.is_empty()
            && self.held.is_empty()
            && self.flushing.is_none()
            && self
                .cluster_locks
                .values()
                .all(|l| l.waiters.is_empty() && !l.requested && !l.returning)
            && self.barrier.waiting.is_none()
            && self
                .dirs
                .values()
                .all(|d| d.busy.is_none() && d.queue.is_empty())
    }

    /// Number of interval records this cluster keeps for forwarding, as a cluster
    /// and as a lock manager (bounded by barrier garbage collection).
    ///
    /// Source: see [`crate::interval`].
    pub fn stored_records(&self) -> usize {
        self.log.len() + self.locks.stored_records()
    }

    /// Handles one event, appending the resulting actions to `out`. See the calling
    /// contract in the [`Machine`] documentation.
    ///
    /// Source: see [`Machine`].
    pub fn handle(&mut self, event: Event, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        let r = self.dispatch(event, out).and_then(|()| self.drain(out));
        self.event_sent.clear();
        if r.is_err() {
            self.inbox.clear();
            self.flushing = None;
        }
        r
    }

    /// Handles the messages queued to self, until a flush interrupts.
    fn drain(&mut self, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        while self.flushing.is_none()
            && let Some((from, msg)) = self.inbox.pop_front()
        {
            if msg.attachment().is_some() {
                return Err(ProtocolError::Unexpected {
                    what: "replayed or local message with an attachment",
                    from,
                    page: msg.page(),
                });
            }
            self.on_message(from, msg, out)?;
        }
        Ok(())
    }

    pub(crate) fn check_page(&self, page: PageId) -> Result<(), ProtocolError> {
        if self.cfg.has_page(page) {
            Ok(())
        } else {
            Err(ProtocolError::NoSuchPage(page))
        }
    }

    /// Checks received records: pages in the region, owners in the job, and none of
    /// this cluster's own that it never made.
    fn check_records(
        &self,
        from: ClusterId,
        records: &[IntervalRecord],
    ) -> Result<(), ProtocolError> {
        for r in records {
            if !self.cfg.has_cluster(r.owner) {
                return Err(ProtocolError::NoSuchCluster(r.owner));
            }
            if r.owner == self.me && r.index > self.time.get(self.me) {
                return Err(ProtocolError::Unexpected {
                    what: "a record of this cluster that it never made",
                    from,
                    page: None,
                });
            }
            for &p in r.pages.iter() {
                self.check_page(p)?;
            }
        }
        Ok(())
    }

    pub(crate) fn entry(&mut self, page: PageId) -> &mut PageEntry {
        &mut self.pages[page.index()]
    }

    pub(crate) fn send(&mut self, to: ClusterId, mut msg: Message, out: &mut Vec<Action>) {
        if to == self.me {
            self.inbox.push_back((to, msg));
        } else {
            self.skip_records_sent(to, &mut msg);
            self.stats.messages_sent += 1;
            if msg.is_sync() {
                self.stats.sync_messages_sent += 1;
            }
            out.push(Action::Send { to, msg });
        }
    }

    /// Leaves out of a grant or release to `to` the records an earlier grant
    /// (release) to `to` in this [`Machine::handle`] call carried (they arrive
    /// first: calling contract, point 5), and notes what this one carries. Grants
    /// feed the receiver's log and releases its lock manager's store, so each kind
    /// counts apart. The records of one message are, per owner, consecutive from what
    /// the sender believed the receiver held, so the receiver then holds every record
    /// up to the highest sent. Except a push's: its receiver may keep them out of its
    /// log until a local thread takes the lock (it waits at a barrier this manager
    /// has passed), so a later grant of the call must carry them again (a Water run on
    /// 8 × 2 clusters failed with a gap in the log before this exception).
    fn skip_records_sent(&mut self, to: ClusterId, msg: &mut Message) {
        let (records, release, counts) = match msg {
            Message::LockGrant { lock, records, .. } => {
                (records, false, !self.locks.is_pushed(*lock))
            }
            Message::LockRelease { records, .. } => (records, true, true),
            _ => return,
        };
        let sent = match self
            .event_sent
            .iter_mut()
            .find(|(c, r, _)| *c == to && *r == release)
        {
            Some((_, _, t)) => t,
            None => {
                self.event_sent.push((to, release, VectorTime::new()));
                &mut self.event_sent.last_mut().expect("just pushed").2
            }
        };
        let before = records.len();
        records.retain(|r| r.index > sent.get(r.owner));
        self.stats.records_skipped += (before - records.len()) as u64;
        if !counts {
            return;
        }
        for r in records.iter() {
            if sent.get(r.owner) < r.index {
                sent.set(r.owner, r.index);
            }
        }
    }

    pub(crate) fn unexpected(what: &'static str, from: ClusterId, page: PageId) -> ProtocolError {
        ProtocolError::Unexpected {
            what,
            from,
            page: Some(page),
        }
    }

    fn dispatch(&mut self, event: Event, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        if let Event::Flushed { diffs } = event {
            return self.on_flushed(diffs, out);
        }
        if self.flushing.is_some() {
            return Err(ProtocolError::FlushPending);
        }
        match event {
            Event::ReadFault { page, token } | Event::WriteFault { page, token } => {
                self.check_page(page)?;
                let write = matches!(event, Event::WriteFault { .. });
                if write {
                    self.stats.write_faults += 1;
                } else {
                    self.stats.read_faults += 1;
                }
                let w = Waiter { token, write };
                if let Some(f) = self.fetches.get_mut(&page) {
                    if f.waiters.is_empty() {
                        self.stats.prefetch_hits += 1;
                    }
                    f.waiters.push(w);
                    self.stats.coalesced_faults += 1;
                    return Ok(());
                }
                match self.cfg.protocol {
                    Protocol::Hlrc => self.hlrc_fault(page, w, out),
                    Protocol::Sc => self.sc_fault(page, w, out),
                }
            }
            Event::Acquire { lock, token } => self.on_acquire(lock, token, out),
            Event::Release { lock, token } => self.on_release(lock, token, out),
            Event::Barrier { token } => {
                if self.barrier.waiting.is_some() {
                    return Err(ProtocolError::BarrierBusy);
                }
                self.barrier.waiting = Some(token);
                self.close_interval(Completion::Barrier, out)
            }
            Event::Message { from, msg } => {
                if !self.cfg.has_cluster(from) || from == self.me {
                    return Err(ProtocolError::NoSuchCluster(from));
                }
                self.stats.messages_received += 1;
                self.on_message(from, msg, out)
            }
            Event::Flushed { .. } => unreachable!("handled above"),
        }
    }

    // ----- messages -----------------------------------------------------------------

    fn on_message(
        &mut self,
        from: ClusterId,
        msg: Message,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if let Some(page) = msg.page() {
            self.check_page(page)?;
        }
        self.check_records(from, msg.records())?;
        let hlrc = self.cfg.protocol == Protocol::Hlrc;
        let msg_page = msg.page();
        let wrong = |what| {
            Err(ProtocolError::Unexpected {
                what,
                from,
                page: msg_page,
            })
        };
        match msg {
            Message::HomeQuery { page } => self.on_home_query(from, page, out),
            Message::HomeIs { page, home } => self.on_home_is(from, page, home, out),
            Message::GetPage { page, need } if hlrc => self.on_get_page(from, page, need, out),
            Message::PageData { page, zero, .. } if hlrc => {
                self.on_page_data_hlrc(from, page, zero, out)
            }
            Message::Diff { diff } if hlrc => self.on_diff(from, diff, out),
            Message::Update { diff } if hlrc => {
                *self.updates_in.entry(from).or_default() += 1;
                self.on_update(from, diff, out)?;
                self.resume_held_departure(out)
            }
            Message::GetPage { .. } | Message::Diff { .. } | Message::Update { .. } => {
                wrong("hlrc message in an sc job")
            }
            Message::PageData {
                page,
                writable,
                zero,
            } => self.on_page_data_sc(from, page, writable, zero, out),
            Message::ScRead { page } | Message::ScWrite { page } if !hlrc => {
                let write = matches!(msg, Message::ScWrite { .. });
                self.on_sc_request(from, page, write, msg, out)
            }
            Message::ScUpgrade { page } if !hlrc => self.on_sc_upgrade(from, page, out),
            Message::ScInvalidate { page } if !hlrc => self.on_sc_invalidate(from, page, msg, out),
            Message::ScInvAck { page } if !hlrc => self.on_sc_inv_ack(from, page, out),
            Message::ScRecall { page, invalidate } if !hlrc => {
                self.on_sc_recall(from, page, invalidate, msg, out)
            }
            Message::ScWriteBack { page } if !hlrc => self.on_sc_write_back(from, page, out),
            Message::ScRead { .. }
            | Message::ScWrite { .. }
            | Message::ScUpgrade { .. }
            | Message::ScInvalidate { .. }
            | Message::ScInvAck { .. }
            | Message::ScRecall { .. }
            | Message::ScWriteBack { .. } => wrong("sc message in an hlrc job"),
            Message::LockAcquire { lock, time, seen } => {
                if self.cfg.lock_manager(lock) != self.me {
                    return wrong("lock request to a cluster that does not manage the lock");
                }
                self.locks.note_own_time(self.me, &self.time);
                match self.locks.acquire(lock, from, time, seen, &self.log)? {
                    Request::Send(msgs) => {
                        for (_, m) in &msgs {
                            if let Message::LockRecall { lock: l, .. } = m
                                && *l != lock
                            {
                                self.stats.lock_sweep_recalls += 1;
                                // A cached lock a sweep recalls is never a pushed one
                                // (pushed tenures are eager), so this tells them apart.
                                if self.locks.is_pushed(*l) {
                                    self.stats.lock_sweep_pushed_recalls += 1;
                                }
                            }
                        }
                        self.send_manager_messages(msgs, out);
                    }
                    Request::Stale => self.stats.lock_stale_requests += 1,
                }
                Ok(())
            }
            Message::LockRelease {
                lock,
                tenure,
                time,
                gc,
                records,
                diffs,
                homed,
                stored,
                unused,
            } => {
                if self.cfg.lock_manager(lock) != self.me {
                    return wrong("lock release to a cluster that does not manage the lock");
                }
                self.note_stored(from, stored);
                if diffs.iter().any(|d| d.owner != from) || homed as usize > diffs.len() {
                    return wrong("lock release carrying another cluster's diffs");
                }
                // The first `homed` diffs are for this cluster as their pages' home (the
                // releaser sent them no other way).
                let home: Vec<IntervalDiff> = if hlrc {
                    diffs[..homed as usize].to_vec()
                } else {
                    Vec::new()
                };
                self.stats.records_received += records.len() as u64;
                self.stats.records_known += records
                    .iter()
                    .filter(|r| r.index <= self.locks.stored(r.owner))
                    .count() as u64;
                self.locks.note_own_time(self.me, &self.time);
                let msgs = self.locks.release(
                    lock, from, tenure, &time, &gc, records, diffs, unused, &self.log,
                )?;
                if self.locks.is_pushed(lock)
                    && msgs
                        .iter()
                        .any(|(to, m)| *to == from && matches!(m, Message::LockGrant { .. }))
                {
                    self.stats.lock_pushes_back += 1;
                }
                self.send_manager_messages(msgs, out);
                for d in home {
                    self.on_diff(from, d, out)?;
                }
                Ok(())
            }
            Message::LockRecall { lock, tenure } => self.on_lock_recall(from, lock, tenure, out),
            Message::LockGrant {
                lock,
                time,
                records,
                diffs,
                stored,
                tenure,
                contended,
            } => self.on_lock_grant(
                from, lock, time, records, diffs, stored, tenure, contended, out,
            ),
            Message::BarrierArrive {
                episode,
                time,
                records,
                migratable,
                updates_sent,
            } => {
                let migrate = hlrc && self.cfg.migrate_single_writer;
                let Some(mgr) = self.barrier_mgr.as_mut() else {
                    return wrong("barrier arrival at a cluster that is not the barrier manager");
                };
                if let Some(departures) = mgr.arrive(
                    from,
                    episode,
                    time,
                    records,
                    migratable,
                    updates_sent,
                    migrate,
                )? {
                    for (to, m) in departures {
                        self.send(to, m, out);
                    }
                }
                Ok(())
            }
            Message::BarrierDepart { .. } if self.barrier.held_depart.is_some() => {
                wrong("second barrier departure while one waits for updates")
            }
            Message::BarrierDepart {
                episode,
                time,
                records,
                migrations,
                updates_due,
            } => self.on_barrier_depart(
                HeldDepart {
                    from,
                    episode,
                    time,
                    records,
                    migrations,
                    updates_due,
                },
                out,
            ),
        }
    }

    /// Invariant: every record counted in the vector time is held (or was discarded
    /// at a barrier), so releases can forward them.
    pub(crate) fn check_log_covers_time(&self) -> Result<(), ProtocolError> {
        for (j, &t) in self.time.entries().iter().enumerate() {
            let Some(c) = ClusterId::new(j as u16) else {
                continue;
            };
            let known = self.log.top(c);
            if known < t {
                return Err(ProtocolError::Gap(crate::interval::GapError {
                    owner: c,
                    index: t,
                    known,
                }));
            }
        }
        Ok(())
    }

    /// The notices of pages homed here, covered by `time`, whose diffs the master
    /// copies still lack.
    pub(crate) fn unreflected_before(
        &mut self,
        time: &VectorTime,
    ) -> Vec<(PageId, ClusterId, u32)> {
        let (pages, homes, me) = (&self.pages, &self.homes, self.me);
        self.unreflected.retain(|&(p, owner, index)| {
            homes.get(p) == Some(me) && pages[p.index()].known.get(owner) < index
        });
        self.unreflected
            .iter()
            .copied()
            .filter(|&(_, owner, index)| index <= time.get(owner))
            .collect()
    }

    /// `from`'s lock manager holds this cluster's records up to `stored`: releases to it
    /// need not carry those.
    pub(crate) fn note_stored(&mut self, from: ClusterId, stored: u32) {
        let me = self.me;
        let seen = self.manager_seen.entry(from).or_default();
        if seen.get(me) < stored {
            seen.set(me, stored);
        }
    }

    /// Sends what the lock manager decided (grants, pushes and recalls).
    pub(crate) fn send_manager_messages(
        &mut self,
        msgs: impl IntoIterator<Item = (ClusterId, Message)>,
        out: &mut Vec<Action>,
    ) {
        for (to, m) in msgs {
            match m {
                Message::LockGrant { .. } => self.stats.lock_grants += 1,
                Message::LockRecall { .. } => self.stats.lock_recalls += 1,
                _ => {}
            }
            self.send(to, m, out);
        }
    }
}
