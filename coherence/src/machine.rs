//! The per-cluster coherence machine: page protocol (hlrc or sc), interval and
//! vector-time bookkeeping, and the manager roles (locks, barrier, first-touch
//! directory) this cluster plays.

use std::collections::{BTreeMap, VecDeque};
use std::mem;

use crate::action::{Action, Event};
use crate::config::{Config, ConfigError, Protocol};
use crate::error::ProtocolError;
use crate::home::{CopySet, HomeMap};
use crate::ids::{ClusterId, FaultToken, LockId, PageId, SyncToken};
use crate::interval::{IntervalLog, IntervalRecord, VectorTime};
use crate::message::Message;
use crate::stats::Stats;
use crate::sync::{BarrierManager, LockManager, MAX_LOCAL_HANDOFFS, Request};

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
    /// Installed and writable (hlrc non-home: with a twin).
    ReadWrite,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PageEntry {
    pub(crate) access: PageAccess,
    /// hlrc: written in the open interval (listed in `Machine::written`).
    pub(crate) written: bool,
    /// hlrc: diffs of this page sent and not yet acknowledged.
    pub(crate) unacked: u32,
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
    /// hlrc: waiting for this cluster's diffs of the page to be acknowledged before
    /// fetching (a fetch must see them).
    AwaitAcks,
    /// hlrc: a write fault on a valid read-only page waits for this cluster's
    /// previous diff of the page to be acknowledged before taking a new twin, so
    /// that at most one diff per page and cluster is in flight (the network may
    /// reorder two diffs of the same words).
    AwaitTwin,
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

/// What to do when a release epoch's diffs are all acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Completion {
    /// The lock leaves this cluster: send `LockRelease` to its manager.
    Release {
        lock: LockId,
        time: VectorTime,
    },
    Barrier,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Epoch {
    pub(crate) tag: u16,
    pub(crate) pending: u32,
    pub(crate) completion: Option<Completion>,
}

/// Release epochs: the open one (collecting diffs sent before the next release,
/// e.g. at an acquire) and the closed ones, completed strictly in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Epochs {
    pub(crate) open: Epoch,
    pub(crate) closed: VecDeque<Epoch>,
}

impl Epochs {
    fn new() -> Self {
        Self {
            open: Epoch {
                tag: 0,
                pending: 0,
                completion: None,
            },
            closed: VecDeque::new(),
        }
    }

    fn close(&mut self, c: Completion) -> Result<(), ProtocolError> {
        if self.closed.len() >= usize::from(u16::MAX) - 1 {
            return Err(ProtocolError::TooManyReleases);
        }
        let next = Epoch {
            tag: self.open.tag.wrapping_add(1),
            pending: 0,
            completion: None,
        };
        let mut e = mem::replace(&mut self.open, next);
        e.completion = Some(c);
        self.closed.push_back(e);
        Ok(())
    }

    pub(crate) fn ack(&mut self, tag: u16) -> bool {
        let e = if self.open.tag == tag {
            Some(&mut self.open)
        } else {
            self.closed.iter_mut().find(|e| e.tag == tag)
        };
        match e {
            Some(e) if e.pending > 0 => {
                e.pending -= 1;
                true
            }
            _ => false,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct BarrierState {
    pub(crate) episode: u32,
    pub(crate) waiting: Option<SyncToken>,
    pub(crate) deferred: Vec<(ClusterId, Message)>,
}

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
    /// The lock is being given back: the interval is closed and the `LockRelease`
    /// waits for the diffs' acknowledgements.
    pub(crate) returning: bool,
    /// A thread of this cluster took the lock in the current tenure.
    pub(crate) used: bool,
    /// The records of a pushed grant, applied (with its time) when a local thread
    /// first takes the lock: an acquire is where write notices take effect, and
    /// applying them earlier would invalidate pages the cluster's threads are
    /// writing under other locks.
    pub(crate) pending: Option<Vec<IntervalRecord>>,
    /// Recalls of tenures other than the one owned or last owned: those that overtook
    /// the grant of their tenure (the network reorders), and stale ones of tenures
    /// given back earlier. The next grant keeps its own and drops the rest: no recall
    /// of a later tenure can exist before that grant arrives.
    pub(crate) early_recalls: Vec<u32>,
    /// Hand-offs between local threads since the lock had to go back.
    pub(crate) handoffs: u32,
    /// Local threads waiting for the lock, in arrival order.
    pub(crate) waiters: VecDeque<SyncToken>,
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

/// The coherence machine of one cluster: a pure state machine, driven by
/// [`Event`]s, producing [`Action`]s. One machine per cluster is shared by all of the
/// cluster's compute threads (they share the cluster's single copy of each page).
///
/// # Calling contract
///
/// 1. **One event at a time.** Call [`Machine::handle`] with one [`Event`]; it
///    appends actions to `out`. Execute *all* of them, *in order*, before passing
///    the machine another event — the simplest way is to hold the machine's lock
///    while executing them. (A runtime may relax this only per page: no event may
///    be handled while an action of an earlier call on the same page is
///    outstanding; `Send`/`*Done` actions carry no page memory operation.) In
///    particular `WriteProtect` must take effect before the following `SendDiff`
///    computes the diff, `MakeTwin` before `Unprotect`, `Send` (which copies the
///    page) before the `Invalidate` that follows it, and `Install` before `Wake`.
/// 2. **Faults.** Pass every userfaultfd fault on the region as
///    [`Event::ReadFault`] (MISSING) or [`Event::WriteFault`] (WP, or MISSING caused
///    by a write) with a token; the thread stays blocked until an
///    [`Action::Wake`] names its token, then retries its access (which may fault
///    again). Concurrent faults on a page produce one fetch; a fault on an
///    accessible page is answered with an immediate wake.
/// 3. **Synchronization.** [`Event::Acquire`], [`Event::Release`] and
///    [`Event::Barrier`] (once per cluster, after the runtime gathered the cluster's
///    threads) block the caller until the matching `AcquireDone`, `ReleaseDone` or
///    `BarrierDone`. A thread must not touch DSM memory between issuing an acquire
///    and its completion. Barriers must include every compute thread of the job.
/// 4. **Messages.** Deliver every received protocol message as [`Event::Message`]
///    with the sender's id, keeping a Tag-On buffer alive during the call; actions
///    emitted during that call may read it ([`crate::Source::Attached`],
///    [`Action::ApplyDiff`]). The machine never refers to it later. The network
///    may reorder messages but must not lose or duplicate them (the message layer's
///    reliable protocol).
/// 5. **Actions.** See each [`Action`] variant. Memory actions only target pages in
///    the state the machine believes (e.g. `Install` only on missing pages), so a
///    runtime error from `UFFDIO_*` indicates a bug.
/// 6. **Errors.** A [`ProtocolError`] is fatal: report it and stop the job.
///
/// Source: sans-I/O protocol engines (style.md practice 7, quinn-proto); protocol
/// rules in [`crate::hlrc`], [`crate::sc`], [`crate::interval`], [`crate::sync`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Machine {
    pub(crate) me: ClusterId,
    pub(crate) cfg: Config,
    pub(crate) homes: HomeMap,
    pub(crate) pages: Vec<PageEntry>,
    pub(crate) fetches: BTreeMap<PageId, Fetch>,
    /// hlrc: pages written in the open interval.
    pub(crate) written: Vec<PageId>,
    /// hlrc: copysets of home pages.
    pub(crate) copysets: BTreeMap<PageId, CopySet>,
    pub(crate) epochs: Epochs,
    /// sc: directory entries of home pages.
    pub(crate) dirs: BTreeMap<PageId, Directory>,
    pub(crate) time: VectorTime,
    pub(crate) log: IntervalLog,
    /// Locks this cluster owns, requests or waits for, or was granted before.
    pub(crate) cluster_locks: BTreeMap<LockId, ClusterLock>,
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
        let pages = (0..cfg.pages)
            .map(|p| PageEntry {
                access: match PageId::new(p).and_then(|p| homes.get(p)) {
                    Some(h) if h == me => PageAccess::Untouched,
                    _ => PageAccess::Invalid,
                },
                written: false,
                unacked: 0,
            })
            .collect();
        Ok(Self {
            me,
            barrier_mgr: (cfg.barrier_manager == me).then(|| BarrierManager::new(cfg.clusters)),
            homes,
            pages,
            cfg,
            fetches: BTreeMap::new(),
            written: Vec::new(),
            copysets: BTreeMap::new(),
            epochs: Epochs::new(),
            dirs: BTreeMap::new(),
            time: VectorTime::new(),
            log: IntervalLog::default(),
            cluster_locks: BTreeMap::new(),
            barrier: BarrierState::default(),
            locks: LockManager::default(),
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

    /// Local access to `page` (`None` outside the region).
    ///
    /// Source: see [`PageAccess`].
    pub fn access(&self, page: PageId) -> Option<PageAccess> {
        self.pages.get(page.index()).map(|e| e.access)
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

    /// Whether nothing is in progress here: no fault pending, no release waiting for
    /// acknowledgements, no acquire or barrier pending, no manager transaction open.
    ///
    /// Source: quiescence of the protocol (used by tests and shutdown).
    pub fn is_quiescent(&self) -> bool {
        self.fetches.is_empty()
            && self.epochs.closed.is_empty()
            && self.epochs.open.pending == 0
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
        if r.is_err() {
            self.inbox.clear();
        }
        r
    }

    fn drain(&mut self, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        while let Some((from, msg)) = self.inbox.pop_front() {
            if msg.attachment().is_some() {
                return Err(ProtocolError::Unexpected {
                    what: "replayed or local message with an attachment",
                    from,
                    page: msg.page(),
                });
            }
            self.on_message(from, msg, 0, out)?;
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

    pub(crate) fn entry(&mut self, page: PageId) -> &mut PageEntry {
        &mut self.pages[page.index()]
    }

    pub(crate) fn send(&mut self, to: ClusterId, msg: Message, out: &mut Vec<Action>) {
        if to == self.me {
            self.inbox.push_back((to, msg));
        } else {
            self.stats.messages_sent += 1;
            if msg.is_sync() {
                self.stats.sync_messages_sent += 1;
            }
            out.push(Action::Send { to, msg });
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
            Event::Message {
                from,
                msg,
                attached_len,
            } => {
                if !self.cfg.has_cluster(from) || from == self.me {
                    return Err(ProtocolError::NoSuchCluster(from));
                }
                self.stats.messages_received += 1;
                self.on_message(from, msg, attached_len, out)
            }
        }
    }

    /// Closes the open interval (hlrc: write-protect and diff dirty pages, record
    /// write notices) and queues `c` to run when its diffs are acknowledged.
    fn close_interval(
        &mut self,
        mut c: Completion,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.cfg.protocol == Protocol::Hlrc {
            self.hlrc_flush_written(out)?;
        }
        if let Completion::Release { time, .. } = &mut c {
            *time = self.time.clone();
        }
        self.epochs.close(c)?;
        self.complete_ready(out)
    }

    /// Runs the completions of closed epochs whose diffs are all acknowledged, in
    /// order (a release never completes before an earlier one of this cluster).
    pub(crate) fn complete_ready(&mut self, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        while self.epochs.closed.front().is_some_and(|e| e.pending == 0) {
            let Some(Epoch {
                completion: Some(c),
                ..
            }) = self.epochs.closed.pop_front()
            else {
                continue;
            };
            match c {
                Completion::Release { lock, time } => {
                    self.give_back(lock, time, out)?;
                }
                Completion::Barrier => {
                    let records = self.log.owned_after(self.me, 0);
                    let migratable =
                        if self.cfg.protocol == Protocol::Hlrc && self.cfg.migrate_single_writer {
                            self.hlrc_migratable(&records)
                        } else {
                            Vec::new()
                        };
                    let msg = Message::BarrierArrive {
                        episode: self.barrier.episode,
                        time: self.time.clone(),
                        records,
                        migratable,
                    };
                    self.send(self.cfg.barrier_manager, msg, out);
                }
            }
        }
        Ok(())
    }

    fn on_message(
        &mut self,
        from: ClusterId,
        msg: Message,
        attached_len: usize,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if let Some(page) = msg.page() {
            self.check_page(page)?;
        }
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
            Message::GetPage { page } if hlrc => self.on_get_page(from, page, out),
            Message::PageData { page, zero, .. } if hlrc => {
                self.on_page_data_hlrc(from, page, zero, out)
            }
            Message::Diff { page, tag } if hlrc => {
                self.on_diff(from, page, tag, false, attached_len, msg, out)
            }
            Message::DiffWholePage { page, tag } if hlrc => {
                self.on_diff(from, page, tag, true, attached_len, msg, out)
            }
            Message::DiffAck { page, tag } if hlrc => self.on_diff_ack(from, page, tag, out),
            Message::GetPage { .. }
            | Message::Diff { .. }
            | Message::DiffWholePage { .. }
            | Message::DiffAck { .. } => wrong("hlrc message in an sc job"),
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
                match self.locks.acquire(lock, from, time, seen)? {
                    Request::Send(msgs) => self.send_manager_messages(msgs, out),
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
                unused,
            } => {
                if self.cfg.lock_manager(lock) != self.me {
                    return wrong("lock release to a cluster that does not manage the lock");
                }
                let msgs = self
                    .locks
                    .release(lock, from, tenure, &time, &gc, records, unused)?;
                self.send_manager_messages(msgs, out);
                Ok(())
            }
            Message::LockRecall { lock, tenure } => self.on_lock_recall(from, lock, tenure, out),
            Message::LockGrant {
                lock,
                time,
                records,
                tenure,
                contended,
            } => self.on_lock_grant(from, lock, time, records, tenure, contended, out),
            Message::BarrierArrive {
                episode,
                time,
                records,
                migratable,
            } => {
                let migrate = hlrc && self.cfg.migrate_single_writer;
                let Some(mgr) = self.barrier_mgr.as_mut() else {
                    return wrong("barrier arrival at a cluster that is not the barrier manager");
                };
                if let Some(departures) =
                    mgr.arrive(from, episode, time, records, migratable, migrate)?
                {
                    for (to, m) in departures {
                        self.send(to, m, out);
                    }
                }
                Ok(())
            }
            Message::BarrierDepart {
                episode,
                time,
                notices,
                migrations,
            } => self.on_barrier_depart(from, episode, time, notices, migrations, out),
        }
    }

    /// Applies newly learned interval records: remembers them for forwarding and
    /// (hlrc) invalidates their pages.
    fn apply_records(
        &mut self,
        records: Vec<IntervalRecord>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let mut pages = Vec::new();
        for r in records {
            let new = r.index > self.log.top(r.owner);
            if new {
                pages.extend_from_slice(&r.pages);
            }
            self.log.insert(r)?;
        }
        self.stats.write_notices_received += pages.len() as u64;
        if self.cfg.protocol == Protocol::Hlrc {
            self.hlrc_apply_notices(pages, out)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn on_lock_grant(
        &mut self,
        from: ClusterId,
        lock: LockId,
        time: VectorTime,
        records: Vec<IntervalRecord>,
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
        let l = self.cluster_locks.entry(lock).or_default();
        if l.owned.is_some() {
            return Err(unexpected("lock grant for a lock this cluster owns"));
        }
        l.owned = Some(time.clone());
        l.tenure = tenure;
        l.handoffs = 0;
        l.used = l.requested;
        let Some(token) = l.requested.then(|| l.waiters.pop_front()) else {
            // Pushed: cached here for the next local acquire, given back after it. Its
            // records wait for that acquire.
            l.busy = false;
            l.recalled = false;
            l.eager = true;
            l.pending = Some(records);
            self.stats.lock_pushes_received += 1;
            if l.early_recalls.contains(&tenure) {
                l.recalled = true;
                l.early_recalls.clear();
                return self.give_back_now(lock, out);
            }
            l.early_recalls.clear();
            return Ok(());
        };
        let Some(token) = token else {
            return Err(unexpected("lock grant without a waiting acquire"));
        };
        l.requested = false;
        l.busy = true;
        l.recalled = l.early_recalls.contains(&tenure);
        l.eager = contended;
        l.early_recalls.clear();
        self.apply_records(records, out)?;
        self.time.merge(&time);
        self.check_log_covers_time()?;
        out.push(Action::AcquireDone { lock, token });
        Ok(())
    }

    /// Sends what the lock manager decided (grants, pushes and recalls).
    fn send_manager_messages(&mut self, msgs: Vec<(ClusterId, Message)>, out: &mut Vec<Action>) {
        for (to, m) in msgs {
            match m {
                Message::LockGrant { .. } => self.stats.lock_grants += 1,
                Message::LockRecall { .. } => self.stats.lock_recalls += 1,
                _ => {}
            }
            self.send(to, m, out);
        }
    }

    /// Sends this cluster's request for `lock` to its manager.
    fn request_lock(&mut self, lock: LockId, out: &mut Vec<Action>) {
        self.stats.lock_requests += 1;
        let mgr = self.cfg.lock_manager(lock);
        let time = self.time.clone();
        let seen = self.cluster_locks.get(&lock).map_or(0, |l| l.tenure);
        self.send(mgr, Message::LockAcquire { lock, time, seen }, out);
    }

    /// A thread of this cluster acquires `lock`: at once if the cluster owns it and
    /// no local thread holds it (a cached or pushed lock), else it waits behind the
    /// local holder or for the manager's grant.
    fn on_acquire(
        &mut self,
        lock: LockId,
        token: SyncToken,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        self.stats.lock_acquires += 1;
        let l = self.cluster_locks.entry(lock).or_default();
        if l.owned.is_some() && !l.busy && !l.returning {
            l.busy = true;
            l.used = true;
            self.stats.lock_local_acquires += 1;
            if let Some(records) = l.pending.take() {
                // The first use of a pushed lock: its grant takes effect now.
                let time = l.owned.clone().unwrap_or_default();
                self.apply_records(records, out)?;
                self.time.merge(&time);
                self.check_log_covers_time()?;
            }
            out.push(Action::AcquireDone { lock, token });
            return Ok(());
        }
        l.waiters.push_back(token);
        if l.owned.is_none() && !l.requested {
            l.requested = true;
            self.request_lock(lock, out);
        }
        Ok(())
    }

    /// A thread of this cluster releases `lock`: to a waiting local thread, into the
    /// cluster's cache, or — when it was recalled, is contended or was pushed here —
    /// back to the manager. The thread never waits: the lock leaves when the diffs of
    /// the interval closed for it are acknowledged.
    fn on_release(
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
            self.stats.lock_local_acquires += 1;
            out.push(Action::ReleaseDone { lock, token });
            out.push(Action::AcquireDone { lock, token: next });
            return Ok(());
        }
        l.busy = false;
        if must_go {
            if !l.recalled {
                self.stats.lock_eager_releases += 1;
            }
            self.give_back_now(lock, out)?;
        }
        out.push(Action::ReleaseDone { lock, token });
        Ok(())
    }

    /// The manager wants `lock` back for `tenure`: give it back now if this cluster
    /// owns that tenure and no local thread holds it, when the local holders are done
    /// otherwise; keep a recall that overtook its grant; ignore one of a tenure this
    /// cluster has already given back.
    fn on_lock_recall(
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
        let l = self.cluster_locks.entry(lock).or_default();
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
            return Ok(());
        }
        self.give_back_now(lock, out)
    }

    /// Gives `lock` back: a pushed lock no thread took goes at once, untouched (its
    /// grant never took effect: same time, no records); otherwise the interval closes
    /// and the `LockRelease` leaves when its diffs are acknowledged (see
    /// [`Machine::give_back`]).
    fn give_back_now(&mut self, lock: LockId, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        let l = held_lock(&mut self.cluster_locks, lock)?;
        if l.used {
            l.returning = true;
            return self.close_interval(
                Completion::Release {
                    lock,
                    time: VectorTime::new(),
                },
                out,
            );
        }
        let Some(time) = l.owned.take() else {
            return Err(ProtocolError::NotHeld(lock));
        };
        l.pending = None;
        l.recalled = false;
        l.eager = false;
        self.stats.lock_pushes_returned += 1;
        let msg = Message::LockRelease {
            lock,
            tenure: l.tenure,
            time,
            gc: self.log.base(),
            records: Vec::new(),
            unused: true,
        };
        self.send(self.cfg.lock_manager(lock), msg, out);
        Ok(())
    }

    /// The interval closed for `lock`'s return has its diffs acknowledged: send the
    /// release to the manager and ask again for the local threads still waiting.
    fn give_back(
        &mut self,
        lock: LockId,
        time: VectorTime,
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
        let gc = self.log.base();
        after.merge(&gc);
        let records = self.log.between(&after, &time)?;
        let mgr = self.cfg.lock_manager(lock);
        self.send(
            mgr,
            Message::LockRelease {
                lock,
                tenure,
                time,
                gc,
                records,
                unused: false,
            },
            out,
        );
        if again {
            self.request_lock(lock, out);
        }
        Ok(())
    }

    /// Invariant: every record counted in the vector time is held (or was discarded
    /// at a barrier), so releases can forward them.
    fn check_log_covers_time(&self) -> Result<(), ProtocolError> {
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

    fn on_barrier_depart(
        &mut self,
        from: ClusterId,
        episode: u32,
        time: VectorTime,
        notices: Vec<PageId>,
        migrations: Vec<(PageId, ClusterId)>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if from != self.cfg.barrier_manager || self.barrier.waiting.is_none() {
            return Err(ProtocolError::Unexpected {
                what: "barrier departure",
                from,
                page: None,
            });
        }
        if episode != self.barrier.episode {
            return Err(ProtocolError::BarrierEpisode {
                expected: self.barrier.episode,
                got: episode,
            });
        }
        for &p in notices.iter().chain(migrations.iter().map(|(p, _)| p)) {
            self.check_page(p)?;
        }
        for &(_, c) in &migrations {
            if !self.cfg.has_cluster(c) {
                return Err(ProtocolError::NoSuchCluster(c));
            }
        }
        if self.cfg.protocol == Protocol::Hlrc {
            self.hlrc_migrate(from, &migrations, out)?;
            self.stats.write_notices_received += notices.len() as u64;
            self.hlrc_apply_notices(notices, out)?;
        }
        self.time.merge(&time);
        // Only what the departure's time covers has been seen by every cluster: this
        // cluster's own time may already be ahead (a cached lock given back while it
        // waited at the barrier closes an interval after its arrival).
        self.log.collect_garbage(&time);
        self.locks.collect_garbage(&time);
        self.barrier.episode = self.barrier.episode.wrapping_add(1);
        self.stats.barriers += 1;
        if let Some(token) = self.barrier.waiting.take() {
            out.push(Action::BarrierDone { token });
        }
        let deferred = mem::take(&mut self.barrier.deferred);
        self.inbox.extend(deferred);
        Ok(())
    }

    /// For a request only the home may serve: `Ok(true)` to serve it here,
    /// `Ok(false)` when it was held back because this cluster may be about to learn
    /// that it is the home (first-touch `HomeIs` or a barrier departure with a
    /// migration is on its way).
    pub(crate) fn require_home(
        &mut self,
        from: ClusterId,
        page: PageId,
        msg: &Message,
    ) -> Result<bool, ProtocolError> {
        if self.homes.get(page) == Some(self.me) {
            return Ok(true);
        }
        if msg.attachment().is_none() {
            if let Some(f) = self.fetches.get_mut(&page)
                && f.phase == Phase::AwaitHome
            {
                f.deferred.push((from, msg.clone()));
                return Ok(false);
            }
            if self.barrier.waiting.is_some() {
                self.barrier.deferred.push((from, msg.clone()));
                return Ok(false);
            }
        }
        Err(ProtocolError::NotHome { page, from })
    }

    fn on_home_query(
        &mut self,
        from: ClusterId,
        page: PageId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.cfg.static_home(page) != self.me
            || self.cfg.home_policy != crate::config::HomePolicy::FirstTouch
        {
            return Err(Self::unexpected("home query", from, page));
        }
        let home = match self.homes.get(page) {
            Some(h) => h,
            None => {
                self.homes.set(page, from);
                from
            }
        };
        self.send(from, Message::HomeIs { page, home }, out);
        Ok(())
    }

    /// First-touch: starts a fault on a page whose home is unknown.
    pub(crate) fn start_home_lookup(
        &mut self,
        page: PageId,
        waiters: Vec<Waiter>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let mgr = self.cfg.static_home(page);
        if mgr == self.me {
            // This cluster is the directory manager and the page is unassigned:
            // the local fault is the first touch.
            self.homes.set(page, self.me);
            self.become_home(page);
            return self.continue_after_home(page, Fetch::new(waiters, Phase::AwaitHome), out);
        }
        self.stats.home_queries += 1;
        self.fetches
            .insert(page, Fetch::new(waiters, Phase::AwaitHome));
        self.send(mgr, Message::HomeQuery { page }, out);
        Ok(())
    }

    fn become_home(&mut self, page: PageId) {
        let me = self.me;
        let e = self.entry(page);
        if e.access == PageAccess::Invalid {
            e.access = PageAccess::Untouched;
        }
        if self.cfg.protocol == Protocol::Hlrc {
            self.copysets.entry(page).or_default().insert(me);
        }
    }

    fn on_home_is(
        &mut self,
        from: ClusterId,
        page: PageId,
        home: ClusterId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if from != self.cfg.static_home(page) || !self.cfg.has_cluster(home) {
            return Err(Self::unexpected("home reply", from, page));
        }
        let Some(f) = self.fetches.remove(&page) else {
            return Err(Self::unexpected("home reply without a query", from, page));
        };
        if f.phase != Phase::AwaitHome {
            return Err(Self::unexpected("home reply without a query", from, page));
        }
        self.homes.set(page, home);
        if home == self.me {
            self.become_home(page);
        }
        self.continue_after_home(page, f, out)
    }

    /// Continues a fault once the page's home is known.
    fn continue_after_home(
        &mut self,
        page: PageId,
        f: Fetch,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let Fetch {
            waiters, deferred, ..
        } = f;
        self.inbox.extend(deferred);
        match self.cfg.protocol {
            Protocol::Hlrc => self.hlrc_fetch_known_home(page, waiters, out),
            Protocol::Sc => {
                let write = waiters.iter().any(|w| w.write);
                self.sc_request(page, write, waiters, out)
            }
        }
    }
}

/// This cluster's state of `lock`, or [`ProtocolError::NotHeld`] if it never had it. A
/// free function over the map (not a method) so the caller can still use `self`'s other
/// fields while it holds the entry.
fn held_lock(
    locks: &mut BTreeMap<LockId, ClusterLock>,
    lock: LockId,
) -> Result<&mut ClusterLock, ProtocolError> {
    locks.get_mut(&lock).ok_or(ProtocolError::NotHeld(lock))
}
