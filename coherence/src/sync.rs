//! Lock and barrier managers, and lock caching at the clusters. Locks and barriers
//! carry write notices, so they belong to the coherence protocol. Each cluster's
//! [`crate::Machine`] runs the manager of the locks it is home of (`lock mod
//! clusters`) and, on the configured cluster, the barrier manager; these roles are
//! driven by messages like the rest of the machine.
//!
//! # Locks
//!
//! * **Tenures.** The manager hands a lock to one cluster at a time; each hand-over
//!   starts a numbered *tenure* ([`TENURE_MODULUS`]) that ends with the cluster's
//!   [`crate::Message::LockRelease`]. Grants, recalls and releases name their tenure,
//!   and a request names the last tenure its sender was granted, so that messages
//!   the network reorders cannot be mistaken for others (below).
//! * **Manager.** FIFO waiters; a grant carries the lock's vector time and the
//!   interval records the acquirer has not seen ([`crate::interval`]) — as far as the
//!   manager knows: not those up to the time the acquirer last reported (a request or a
//!   release), nor, for the manager's own cluster, those up to its time; a release
//!   likewise leaves out what the manager's cluster log holds (its store fills them
//!   from there), and one `Machine::handle` call sends each record at most once to each
//!   cluster (those messages arrive in order: the machine's calling contract). TreadMarks
//!   (USENIX Winter 1994 §3) sends the write notices the acquirer's vector time lacks;
//!   the rest is this project's (issue 10: 94–98 % of the records were re-sent). A queued
//!   request keeps the vector time it was sent with; the grant is computed when the
//!   lock is handed over. A grant says whether the lock is *contended*: another
//!   cluster held it in one of its last two tenures. While a cluster owns the lock
//!   and another asks for it, the manager sends the owner one
//!   [`crate::Message::LockRecall`], unless the owner will give it back by itself (a
//!   contended grant without release batches; with them an owner may hold a released
//!   contended lock in its batch or keep it for its visit, below, so it is recalled).
//! * **Caching (lazy release).** A cluster keeps a lock whose grant was not contended
//!   until the manager recalls it. While it owns the lock, its threads acquire and
//!   release it without any message and without closing an interval (they share the
//!   cluster's memory through the hardware, so nothing needs to be flushed or
//!   invalidated between them); a thread releasing it while another local thread
//!   waits passes it on directly. When the lock leaves the cluster (after a recall,
//!   once no local thread holds it, or after at most [`MAX_LOCAL_HANDOFFS`] further
//!   hand-offs so that the other cluster gets its turn) the cluster closes its
//!   interval — write-protects and diffs its dirty pages, records its write notices —
//!   and sends `LockRelease` with the records, exactly as an eager release would.
//! * **Eager release of contended locks.** A contended lock is given back that way as
//!   soon as no local thread holds it, so that the next cluster finds it at its
//!   manager instead of waiting for a recall and the give-back (locks that move
//!   between clusters on every use, like Water's per-molecule locks, gain nothing from
//!   caching). The releasing thread never waits: the release completes at once, and
//!   the lock leaves when the homes have acknowledged the diffs (in order).
//! * **Visits.** A cluster's *visit* of a lock is the tenures granted to it one after
//!   the other, no other cluster's tenure between (a push back to the releaser
//!   continues the visit). With release batches (a [`crate::Config::release_batch`]
//!   above one) a contended or pushed lock is not given back at a release that leaves
//!   it with fewer local uses in this visit than the last visit had: the cluster keeps
//!   it for the next local use, as a cached lock, and a request from another cluster
//!   recalls it (with batches the manager recalls contended owners too, above). A lock
//!   cached for many uses and then contended stays so for one visit, until recalled.
//!   Water's per-molecule locks on 2 clusters of 2 threads are taken in turns A, A, B:
//!   each lock used to go back to its manager after the first A and be pushed back for
//!   the second; now it stays (Water 512 × 50 on 2 × 2 over shared memory: 44,500–45,000
//!   → 38,300–38,500 grants per run). Counting only the uses while contended or pushed
//!   kept fewer locks and lost the gain (16 rounds: 1.02 against 0.94 of the time
//!   without visits).
//! * **Pushes.** When a cluster gives a lock back and nobody waits, the manager grants
//!   it at once — unrequested — to the cluster predicted to take it next: the one that
//!   followed the same last two holders the last two times (a *confirmed turn*, so that
//!   a lock taken in turns A, B, B — Water's per-molecule locks on 2 clusters of 2
//!   threads — is predicted as well as one taken A, B), else the other cluster that
//!   took it after the releaser last time, else — for a lock that has no such history
//!   yet — the cluster that most recently took any lock of the same manager after the
//!   releaser (Water's locks are taken in sweeps: from the first time step on, each
//!   lock is pushed from its first contended release). A confirmed turn may lead back
//!   to the releaser itself while another cluster held one of the two tenures (an
//!   uncontended lock is not pushed back: its next request makes the releaser its
//!   caching owner); one unconfirmed observation does not, so that the odd repeat of a
//!   lock taken A, B, A, B (two clusters out of step for a phase) does not send it
//!   back. Locks taken in turns go where they are wanted next before they are asked
//!   for. A pushed lock waits in that cluster's cache: the next local acquire takes it
//!   without a message; it goes back after that use. The grant's records and time take
//!   effect when it arrives (earlier than an acquire needs, which is always allowed),
//!   so that the cluster's time stays current; a push whose records leave a gap in the
//!   cluster's log waits for its first use instead (see below). A manager leaves out of
//!   a push the records its earlier pushes to the same cluster carried (besides those
//!   the cluster reported in its last request or release): a sweep's locks are pushed
//!   long before the cluster reports again, and each push used to resend every record
//!   since (Water 4096 × 3 on 2 × 1: 0.3–2.6 million records per run, 98 % held
//!   already). A push that overtook an earlier one, or follows one given back unused,
//!   then leaves a gap: at its first use (or on arrival, if it answers a request) the
//!   cluster gives it back unused and asks for the lock, and the manager, at an unused
//!   release, forgets what its pushes to that cluster carried, so the grant to the
//!   request carries every record the requester lacks. If another cluster asks first,
//!   the manager recalls the push and stops following that prediction; a push recalled
//!   before any use goes back at once, *unused* (unchanged time, no records), and an
//!   unused release neither teaches the manager nor is pushed on, so pushes cannot
//!   circle between clusters that wait at a barrier. A request that crosses a push to
//!   its sender names an older tenure than the manager last granted that sender: the
//!   push answers it, and the manager drops it. A recall of a tenure already given back
//!   is ignored; one that overtakes its grant is kept until the grant arrives. The
//!   contention history and the predictions survive barriers: a lock that each cluster
//!   takes once per phase of a loop (Water's per-molecule locks, taken once per time
//!   step) is pushed from one phase to the next.
//! * **Sweeps.** Before any lock has moved between two clusters, pushes have nothing
//!   to follow: a cluster that sweeps locks another cluster took first (and caches)
//!   would wait for one recall per lock. When it asks for two neighbouring locks of a
//!   manager in turn, both cached by the same other cluster, the manager recalls the
//!   next ones that only that cluster took as well ([`SWEEP_RECALL`]) and pushes them
//!   to the sweeping cluster as they come back. Water's first force computation:
//!   the cluster that finished its pair forces first sweeps — and caches — most
//!   molecule locks before the other one starts. Pushes can be wrong the same way,
//!   a whole sweep of them: a time step in which one cluster reaches its lock sweep
//!   while the other still computes its pair forces (their order flips with the
//!   VM's noise) found each lock pushed to the other cluster and asked for it, one
//!   recall per lock, answered by that cluster's protocol thread (≈ 20–30 µs each
//!   on 2 vCPUs, ≈ 250 locks in a row). So a sweep over locks pushed to another
//!   cluster recalls the next pushed ones too — if that cluster is *quiet* here: it
//!   has not given back a lock of this manager after using it in the last
//!   [`SWEEP_RECALL`] such releases by others, so it is not sweeping the same locks
//!   itself (two clusters that sweep the same locks at once would pass batches of
//!   them back and forth unused; Water 4096 × 3 over UDP took as many requests and
//!   4,100 unused pushes per cluster without this condition). Such a lock goes to the
//!   sweeping cluster when it comes back, used or not.
//! * **Carried diffs.** A release carries the diffs of the releaser's intervals of
//!   the tenure ([`crate::interval::IntervalDiff`], at most [`MAX_CARRIED_DIFFS`]);
//!   the manager keeps the diffs carried to it by the releases of *any* of its locks
//!   (at most [`MAX_MANAGER_DIFFS`], until a barrier makes them useless) and sends
//!   with a grant those of the intervals whose records the grant carries, so that the
//!   acquirer applies them to its copies instead of invalidating the pages and
//!   fetching them again (lock–data association: the data a lock protects moves with
//!   the lock, as in Midway's entry consistency; Yun et al., CCGrid 2001, for HLRC).
//!   Kept per manager rather than per lock because one interval's diffs travel with
//!   only one of the locks a batch releases together (each diff goes once to each
//!   manager, see `coherence/src/locks.rs`), while its write notice reaches every later
//!   acquirer of every lock of that manager; with several threads per cluster an
//!   interval also holds another thread's writes under another lock (Water 512 × 50
//!   on 2×2: about 1,400 pages per run invalidated at grants that carried none of
//!   their diffs, then fetched again). The release does not wait for the homes to
//!   acknowledge the diffs (see [`crate::hlrc`]).
//! * **Flush ahead.** A thread that must ask another cluster for a lock (or whose
//!   cluster manages it while another cluster holds it) closes the cluster's interval
//!   right after sending the request ([`crate::Config::flush_ahead`]): the open pages
//!   are flushed as at a release, with no lock leaving; the diffs of pages homed here
//!   go to their copysets as updates, the others to their homes. Otherwise the
//!   writes made before the acquire are diffed at the release, inside the critical
//!   section, while the next cluster waits: Water's global-sum locks come right after
//!   phases that rewrote every molecule of the cluster, and each holder's flush of
//!   those pages was passed along the chain of waiting clusters (≈ 250 µs an acquire
//!   on 2 clusters). Now a waiting cluster flushes while it waits. Water 512 × 50,
//!   time with / without, alternating pairs, median (p25–p75): 2×1 over UDP 0.94
//!   (0.88–0.97, 16 pairs), 2×2 0.94 (0.85–1.03, 16); 2×1 over shared memory 1.00
//!   (0.94–1.06, 28; its CORREC+KINETI phase 0.87) and 4×1 1.04 (0.83–1.08, 10), within
//!   the noise (issue 10).
//!
//! Every happens-before chain from a write to another cluster's acquire leaves the
//! writer's cluster through a `LockRelease` or a barrier, each of which flushes every
//! dirty page of the cluster, so the acquirer still sees every write notice that
//! happens-before it.
//!
//! # Barriers
//!
//! One arrival per cluster (threads of a cluster meet locally first — the runtime's
//! job); each arrival carries the cluster's vector time and own records; when all
//! have arrived, each cluster gets a departure with the pages of the records it has
//! not seen, the maximum time, and (hlrc) the single-writer home migrations.
//!
//! Source: lock managers and barrier manager of HLRC (OSDI 1996 §2–3) and TreadMarks
//! (Keleher et al., USENIX Winter 1994 §3: lock managers statically assigned, barrier
//! manager gathers and redistributes write notices; §3.2: a lock stays with its last
//! releaser until another processor requests it); lazy release of locks inside an
//! SMP node and hierarchical barriers from MGS (Yeung, Kubiatowicz, Agarwal, ISCA
//! 1996 §3: synchronization inside a node in hardware, between nodes in software).
//! Contention hints, tenures and pushes are this project's (pushing a lock to its
//! predicted next owner follows the migratory-sharing prediction of Cox and Fowler,
//! ISCA 1993, applied to locks).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use smallvec::{SmallVec, smallvec};

use crate::carried::{CarriedDiffs, newest_per_owner};
use crate::ids::{ClusterId, LockId, PageId};
use crate::interval::{GapError, IntervalDiff, IntervalLog, IntervalRecord, VectorTime};
use crate::lock_table::LockTable;
use crate::message::Message;
use crate::small_map::SmallMap;

/// Why a manager rejected a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SyncError {
    NotHolder(LockId, ClusterId),
    RequestFromHolder(LockId, ClusterId),
    Gap(GapError),
    Episode {
        expected: u32,
        got: u32,
    },
    DuplicateArrival(ClusterId),
    ForeignRecord(ClusterId),
    /// An arrival's update counts name a cluster outside the job or the sender itself.
    BadUpdateCounts(ClusterId),
}

impl From<GapError> for SyncError {
    fn from(e: GapError) -> Self {
        SyncError::Gap(e)
    }
}

/// How many times in a row a recalled lock may still pass between threads of the
/// cluster that owns it before that cluster gives it back to its manager (so that
/// other clusters get their turn).
///
/// Source: bounded local hand-off before a remote request is served (MGS, ISCA 1996
/// §3: fairness between SMP nodes; the bound is this project's choice).
pub const MAX_LOCAL_HANDOFFS: u32 = 8;

/// How many diffs of its tenure a lock release carries to the manager, newest first
/// (older ones of pages homed elsewhere reach acquirers as write notices only; their
/// pages are then invalidated and fetched).
///
/// Source: this project's bound (a few tenures' worth of a lock's critical section).
pub const MAX_CARRIED_DIFFS: usize = 16;

pub use crate::carried::MAX_MANAGER_DIFFS;

/// The most diffs one grant carries: the newest of every owner's among those of its
/// records, taken from the owners in turn (interval indices count per owner); a diff
/// is at most [`crate::diff::MAX_ENCODED`] bytes, so a grant's diffs stay
/// near 256 KiB, well inside a bulk message. The pages of the others are
/// invalidated and fetched, as without a diff.
///
/// Source: this project's bound (issue 10).
pub const MAX_GRANT_DIFFS: usize = 64;

/// How many further locks of a sweep a manager recalls with the one requested: once a
/// cluster has asked, one after the other, for two neighbouring locks of this manager
/// that only another cluster ever took and keeps cached (uncontended grants, given
/// back only when recalled), the manager also recalls the next such locks of that
/// cluster, up to this many among the next `2 × SWEEP_RECALL` locks it manages, and
/// pushes them to the asking cluster as they come back (the manager-wide successor;
/// see the module documentation). Water's first force computation sweeps every
/// molecule lock in turn, after the cluster that finished its pair forces first has
/// swept — and cached — most of them: without this the late cluster waited for one
/// recall per lock (4,096 in a row for 4,096 molecules). The same for two neighbouring
/// locks pushed to another cluster that is quiet here (none of the last this-many
/// used releases of this manager's locks was its own): the next locks pushed to it are
/// recalled and go to the asking cluster when they come back, used or not. Water 512 ×
/// 50, time with / time without, alternating pairs on 2 vCPUs: 2×1 shm 0.90 (20
/// pairs), 2×1 udp 0.90 (10), the default 2×2 job 0.91 (8), 4×1 0.95 (4); Water 4096 ×
/// 3 2×1 udp 0.99 (6); lock requests per cluster ≈ 2,500 → 800–1,800.
///
/// The default of [`crate::Config::sweep_recall`], which the runtime keeps; the model
/// checker's scenarios use 1 to reach the sweep over pushed locks in a few steps
/// (`coherence/tests/model.rs`, `hlrc_pushed_lock_sweep`).
///
/// Source: this project's (issue 10), after the sequential-access prefetching of pages
/// (ArgoDSM fetches 8 pages per miss) applied to lock recalls.
pub const SWEEP_RECALL: usize = 16;

/// Tenure numbers count the grants of one lock modulo `2^20` (they travel in 20 bits
/// of an Express payload), skipping 0, which stands for "never granted".
///
/// Source: this project's message format (issue 4: 40-bit Express payloads).
pub const TENURE_MODULUS: u32 = 1 << 20;

/// The tenure after `t`.
pub(crate) fn next_tenure(t: u32) -> u32 {
    match (t + 1) % TENURE_MODULUS {
        0 => 1,
        n => n,
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct LockState {
    /// The cluster that owns the lock (granted, not yet given back).
    holder: Option<ClusterId>,
    /// The current tenure (while held) or the last one.
    tenure: u32,
    waiters: VecDeque<(ClusterId, VectorTime)>,
    time: VectorTime,
    /// The holder gives the lock back after its use: a recall was sent, or the grant
    /// was contended (and requested).
    recalled: bool,
    /// The holder gives the lock back without a recall (soon after its use): the
    /// grant said the lock is contended, or pushed it.
    eager: bool,
    /// The current tenure was pushed (granted without a request).
    pushed: bool,
    /// A sweep recalled this pushed tenure for that cluster ([`SWEEP_RECALL`]): when
    /// the lock comes back, used or not, and nobody waits, it is pushed there.
    sweep_to: Option<ClusterId>,
    /// The holders of the last two finished tenures, most recent first.
    recent: [Option<ClusterId>; 2],
    /// The last tenure granted to each cluster.
    granted: SmallMap<ClusterId, u32>,
    /// For each cluster, the other cluster that took the lock after its last tenure
    /// (the prediction a push follows unless a confirmed turn says otherwise); `None`
    /// once a push on it was wrong, until the next observation.
    next_of: SmallMap<ClusterId, Option<ClusterId>>,
    /// For each pair of consecutive holders (the older one, `None` before the lock's
    /// first tenure, and the newer one), the cluster that took the lock after them
    /// last time, which may be the newer one again, and whether it did so the time
    /// before too (a confirmed turn, which a push follows).
    turns: SmallMap<(Option<ClusterId>, ClusterId), (ClusterId, bool)>,
}

impl LockState {
    /// No cluster but `c` was ever granted the lock, and `c` keeps it cached (its
    /// grant was uncontended, not pushed). Locks that several clusters took are moved
    /// by pushes and their predictions instead of sweeps ([`SWEEP_RECALL`]).
    fn only_held_by(&self, c: ClusterId) -> bool {
        self.holder == Some(c) && !self.eager && self.granted.keys().all(|&g| g == c)
    }

    /// The cluster predicted to take the lock after the last two holders: a confirmed
    /// turn, else the other cluster that took it after the last holder last time, else
    /// — if it never did and no push there was wrong — `successor`'s, the cluster that
    /// took any lock of this manager after the last holder most recently.
    fn predicted(&self, successor: &BTreeMap<ClusterId, ClusterId>) -> Option<ClusterId> {
        let prev = self.recent[0]?;
        match self.turns.get(&(self.recent[1], prev)) {
            Some(&(next, true)) => Some(next),
            _ => match self.next_of.get(&prev) {
                Some(&next) => next,
                None => successor.get(&prev).copied(),
            },
        }
    }

    /// The push made on [`LockState::predicted`] was wrong (another cluster asked
    /// first): the last holder's successor is forgotten and a confirmed turn becomes
    /// unconfirmed, so that the next release pushes nothing. An unconfirmed turn
    /// stays, so that a wrong push on the successor does not keep the turn from being
    /// confirmed.
    fn forget_prediction(&mut self) {
        let Some(prev) = self.recent[0] else {
            return;
        };
        self.next_of.insert(prev, None);
        if let Some((_, confirmed)) = self.turns.get_mut(&(self.recent[1], prev)) {
            *confirmed = false;
        }
    }

    /// `to` takes the lock after the last two holders (a request granted, or a push
    /// used): the predictions learn it. Returns `(last holder, to)` if they differ,
    /// for the manager-wide successors.
    fn learn(&mut self, to: ClusterId) -> Option<(ClusterId, ClusterId)> {
        let prev = self.recent[0]?;
        let turn = (self.recent[1], prev);
        let confirmed = self.turns.get(&turn).is_some_and(|&(next, _)| next == to);
        self.turns.insert(turn, (to, confirmed));
        (prev != to).then(|| {
            self.next_of.insert(prev, Some(to));
            (prev, to)
        })
    }
}

/// Manager of the locks whose home is this cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct LockManager {
    locks: LockTable<LockState>,
    store: IntervalLog,
    /// The diffs releases carried here, by (owner, interval, page): a grant sends
    /// those of the records it carries (see the module documentation).
    diffs: CarriedDiffs,
    /// The latest vector time each cluster reported in a request or release (to any
    /// lock of this manager): it has seen every record up to it, so grants and pushes
    /// need not send those again.
    seen: BTreeMap<ClusterId, VectorTime>,
    /// For each cluster, the time of the pushes made to it since it last gave a lock
    /// back unused: a cluster takes a push's records when it arrives if its log holds
    /// every earlier one (see [`crate::locks`]), so the next push leaves out what
    /// these carried. A manager pushes a sweep's locks ahead of their use, long before
    /// the cluster reports its time again: without this, every push resent all
    /// records since that report (Water 4096 × 3 on 2×1: 0.3-2.6 million records
    /// per run, 98 % already held). Forgotten at an unused release, which may be a
    /// push whose records the cluster never took (recalled before it arrived, or
    /// deferred behind a barrier).
    pushed_upto: BTreeMap<ClusterId, VectorTime>,
    /// Owners keep released eager locks for a batch ([`crate::Config::release_batch`]
    /// above 1): a contended grant is recalled like any other when a request comes,
    /// since its owner may hold it, released, for a while.
    batching: bool,
    /// For each cluster, the other cluster that most recently took any lock of this
    /// manager after it: the prediction for a lock that has none of its own yet (locks
    /// taken in sweeps, like Water's, are pushed from their first contended release).
    successor: BTreeMap<ClusterId, ClusterId>,
    /// The last lock this manager recalled for a request, `(requester, holder, lock)`,
    /// a sweep's recalls included: a request that follows it with the next lock of the
    /// same holder is a sweep (see [`SWEEP_RECALL`]).
    last_recall: Option<(ClusterId, ClusterId, LockId)>,
    /// For each cluster that gave back a lock of this manager after using it: how many
    /// such releases by other clusters followed its last one, up to `sweep_recall`.
    /// A cluster at the cap (or absent) is *quiet* here — it is not taking this
    /// manager's locks now — so a sweep may take the locks pushed to it ahead of use
    /// (see [`LockManager::recall_sweep`]).
    releases_since: BTreeMap<ClusterId, u8>,
    /// Locks a sweep recalls ahead, and the releases by others that make a cluster
    /// quiet: [`crate::Config::sweep_recall`] ([`SWEEP_RECALL`] by default), `1..=255`.
    sweep_recall: SweepRecall,
}

/// [`LockManager::sweep_recall`]: [`SWEEP_RECALL`] unless the configuration says
/// otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SweepRecall(usize);

impl Default for SweepRecall {
    fn default() -> Self {
        SweepRecall(SWEEP_RECALL)
    }
}

/// The messages a lock manager decided to send, `(destination, message)` in order:
/// mostly one (a grant, a push or a recall, kept inline), sometimes a grant and a
/// recall.
pub(crate) type Sends = SmallVec<[(ClusterId, Message); 1]>;

/// What [`LockManager::acquire`] did with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// Messages to send (a grant, a recall, or nothing while the request waits).
    Send(Sends),
    /// The request crossed a grant made to its sender meanwhile (a push), which
    /// answers it: dropped.
    Stale,
}

impl LockManager {
    /// A manager with no locks yet; `batching`: see [`crate::Config::release_batch`];
    /// `sweep_recall`: see [`crate::Config::sweep_recall`] (`1..=255`, which
    /// `Config::validate` checked).
    pub(crate) fn new(batching: bool, sweep_recall: usize) -> Self {
        Self {
            batching,
            sweep_recall: SweepRecall(sweep_recall),
            ..Self::default()
        }
    }

    /// Makes `to` the holder of `lock` in a new tenure and returns its grant (records
    /// after `their`), followed by a recall when other requests wait and the grant is
    /// not contended.
    fn hand_over(
        &mut self,
        lock: LockId,
        to: ClusterId,
        their: &VectorTime,
        pushed: bool,
        own: &IntervalLog,
    ) -> Result<Sends, SyncError> {
        let mut their = their.clone();
        if let Some(t) = self.seen.get(&to) {
            their.merge(t);
        }
        if pushed && let Some(t) = self.pushed_upto.get(&to) {
            their.merge(t);
        }
        let their = &their;
        let st = self
            .locks
            .get_mut(lock)
            .expect("the caller created the entry");
        let contended = st.recent.iter().flatten().any(|&h| h != to);
        st.tenure = next_tenure(st.tenure);
        st.granted.insert(to, st.tenure);
        if !pushed && let Some((prev, next)) = st.learn(to) {
            self.successor.insert(prev, next);
        }
        st.holder = Some(to);
        st.pushed = pushed;
        st.sweep_to = None;
        st.eager = pushed || contended;
        // A contended grant goes back after its use by itself: it counts as recalled.
        // Others are recalled at once if requests wait (a push is made only when none
        // do, and must be recalled if one comes: it waits for a local use).
        let implied = contended && !pushed && !self.batching;
        let recall = !implied && !st.waiters.is_empty();
        st.recalled = implied || recall;
        let (tenure, time) = (st.tenure, st.time.clone());
        let records = self.store.between_with(own, their, &time)?;
        let diffs = newest_per_owner(
            records
                .iter()
                .filter(|r| r.owner != to)
                .flat_map(|r| self.diffs.of_interval(r.owner, r.index).cloned())
                .collect(),
            MAX_GRANT_DIFFS,
        );
        if pushed {
            self.pushed_upto.entry(to).or_default().merge(&time);
        }
        let stored = self.store.top(to);
        let mut out: Sends = smallvec![(
            to,
            Message::LockGrant {
                lock,
                time,
                records,
                diffs,
                stored,
                tenure,
                contended,
            },
        )];
        if recall {
            out.push((to, Message::LockRecall { lock, tenure }));
        }
        Ok(out)
    }

    /// A request from `from`, which was last granted tenure `seen`: the grant if the
    /// lock is free; else the request waits, and the owner is recalled if it has not
    /// been asked to give the lock back yet. `own` is the manager's cluster's own log:
    /// releases to this manager carry none of its own records, which grants take from
    /// there.
    pub(crate) fn acquire(
        &mut self,
        lock: LockId,
        from: ClusterId,
        time: VectorTime,
        seen: u32,
        own: &IntervalLog,
    ) -> Result<Request, SyncError> {
        self.seen.entry(from).or_default().merge(&time);
        let st = self.locks.get_or_default(lock);
        if st.granted.get(&from).copied().unwrap_or(0) != seen {
            return Ok(Request::Stale);
        }
        let Some(holder) = st.holder else {
            return Ok(Request::Send(
                self.hand_over(lock, from, &time, false, own)?,
            ));
        };
        if holder == from {
            // The owner asks again only after giving its tenure back (the release is
            // on its way): after a recall, a contended grant or a push.
            if !st.recalled && !st.eager {
                return Err(SyncError::RequestFromHolder(lock, from));
            }
            st.waiters.push_back((from, time));
            return Ok(Request::Send(Sends::new()));
        }
        st.waiters.push_back((from, time));
        if st.recalled {
            return Ok(Request::Send(Sends::new()));
        }
        st.recalled = true;
        if st.pushed {
            // Another cluster wants the pushed lock first: the prediction that led
            // to the push was wrong; stop following it.
            st.forget_prediction();
        }
        let swept = st.only_held_by(holder) || st.pushed;
        let tenure = st.tenure;
        let mut out: Sends = smallvec![(holder, Message::LockRecall { lock, tenure })];
        if swept {
            self.recall_sweep(lock, from, holder, &mut out);
        }
        Ok(Request::Send(out))
    }

    /// `from` asked for `lock`, which `holder` keeps cached or was pushed: if the last
    /// recall was for the same two clusters and the lock just before this one (a
    /// sweep), also recall the next locks that `holder` holds the same way and nobody
    /// waits for ([`SWEEP_RECALL`]): those it keeps cached when `from` took a lock of
    /// this manager after `holder` before (so that their pushes go to `from`:
    /// [`LockState::predicted`] falls back on that successor), and those pushed to it
    /// while it is quiet here ([`LockManager::releases_since`]), whose prediction was
    /// wrong like the one asked for (they go to `from` when they come back:
    /// [`LockState::sweep_to`]; their predictions are kept — forgetting them made
    /// Water 512 × 50 over UDP 13 % slower). Each comes back with its holder's
    /// `LockRelease` and, nobody waiting, is pushed to `from`; a request of `from`
    /// that arrives first simply waits for it.
    fn recall_sweep(&mut self, lock: LockId, from: ClusterId, holder: ClusterId, out: &mut Sends) {
        let follows = |prev: LockId| prev < lock && !self.locks.any_between(prev, lock);
        let sweep = matches!(self.last_recall, Some((f, h, prev)) if f == from && h == holder && follows(prev));
        let cached = sweep && self.successor.get(&holder) == Some(&from);
        let quiet = self
            .releases_since
            .get(&holder)
            .is_none_or(|&n| usize::from(n) >= self.sweep_recall.0);
        let mut last = lock;
        if sweep {
            let next = self
                .locks
                .iter_mut_from(lock)
                .skip(1)
                .take(2 * self.sweep_recall.0)
                .filter(|(_, st)| {
                    !st.recalled
                        && st.waiters.is_empty()
                        && ((cached && st.only_held_by(holder))
                            || (quiet && st.pushed && st.holder == Some(holder)))
                })
                .take(self.sweep_recall.0);
            for (l, st) in next {
                st.recalled = true;
                if st.pushed {
                    st.sweep_to = Some(from);
                }
                out.push((
                    holder,
                    Message::LockRecall {
                        lock: l,
                        tenure: st.tenure,
                    },
                ));
                last = l;
            }
        }
        self.last_recall = Some((from, holder, last));
    }

    /// The release of `tenure` by `from` (with the diffs of its intervals); returns
    /// the grant for the next waiter, or, when nobody waits and `from` used the lock, a
    /// push to the cluster predicted to take it next (a confirmed turn, else the other
    /// cluster that took it after `from` last time, else the manager-wide successor;
    /// `from` itself only on a confirmed turn while the lock is contended). An unused
    /// tenure (a push sent back) teaches nothing and pushes nothing, so
    /// pushes cannot bounce between clusters that wait at a barrier.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release(
        &mut self,
        lock: LockId,
        from: ClusterId,
        tenure: u32,
        time: &VectorTime,
        gc: &VectorTime,
        records: Vec<IntervalRecord>,
        diffs: Vec<IntervalDiff>,
        unused: bool,
        own: &IntervalLog,
    ) -> Result<Sends, SyncError> {
        let Some(st) = self.locks.get(lock) else {
            return Err(SyncError::NotHolder(lock, from));
        };
        if st.holder != Some(from) || st.tenure != tenure {
            return Err(SyncError::NotHolder(lock, from));
        }
        // The releaser has passed a barrier at `gc`: every cluster has seen the
        // records up to it, so they will never be granted again.
        self.store.collect_garbage(gc);
        for r in records {
            // A release leaves out the records the manager's cluster log held when
            // the manager last reported its time (see `seen`): the store takes those
            // from the log, so that it stays contiguous.
            self.store.fill_from(own, r.owner, r.index - 1)?;
            self.store.insert(r)?;
        }
        if unused {
            // It may not have taken that push's records: later pushes carry them again.
            self.pushed_upto.remove(&from);
        } else {
            // (An unused release carries the pushed lock's time, which the releaser
            // never took in.)
            self.seen.entry(from).or_default().merge(time);
        }
        let base = self.store.base();
        // Diffs of intervals every cluster has seen are of no use to anyone: not
        // kept (those kept before are dropped at the next barrier's garbage
        // collection; grants never select them, as they carry no such record).
        for d in diffs {
            if d.index > base.get(d.owner) {
                self.diffs.insert(d, MAX_MANAGER_DIFFS);
            }
        }
        let st = self.locks.get_mut(lock).expect("checked above");
        st.time.merge(time);
        if st.pushed
            && !unused
            // The push was right: `from` took the lock after the last two holders.
            && let Some((prev, next)) = st.learn(from)
        {
            self.successor.insert(prev, next);
        }
        st.holder = None;
        st.recalled = false;
        st.eager = false;
        st.pushed = false;
        if !unused {
            st.recent = [Some(from), st.recent[0]];
            for (&c, n) in self.releases_since.iter_mut() {
                if c != from && usize::from(*n) < self.sweep_recall.0 {
                    *n += 1;
                }
            }
            self.releases_since.insert(from, 0);
        }
        if let Some((next, their)) = st.waiters.pop_front() {
            return self.hand_over(lock, next, &their, false, own);
        }
        if let Some(to) = st.sweep_to.take()
            && to != from
        {
            // Recalled for a sweep: to the sweeping cluster, used or not.
            let base = self.store.base();
            return self.hand_over(lock, to, &base, true, own);
        }
        if unused {
            return Ok(Sends::new());
        }
        // Back to the releaser itself only on a confirmed turn and while another cluster
        // held the lock in its last two tenures (such a push goes back after its use);
        // otherwise the releaser's next request makes it a cached, uncontended owner.
        let contended = st.recent.iter().flatten().any(|&h| h != from);
        match st.predicted(&self.successor) {
            Some(next) if next != from || contended => {
                // Every record this manager may still grant: the receiver skips those
                // it has.
                let base = self.store.base();
                self.hand_over(lock, next, &base, true, own)
            }
            _ => Ok(Sends::new()),
        }
    }

    /// Barrier garbage collection: every cluster has seen the records up to `upto`;
    /// their diffs are dropped. Contention history and predictions are kept (see the
    /// module documentation).
    pub(crate) fn collect_garbage(&mut self, upto: &VectorTime) {
        self.store.collect_garbage(upto);
        self.diffs.collect_garbage(upto);
    }

    /// The newest record held (or discarded) per owner: a release to this manager
    /// from its own cluster need not carry records up to it.
    pub(crate) fn store_top(&self) -> VectorTime {
        self.store.tops()
    }

    /// The latest vector time `c` reported to this manager (in a request or a used
    /// release): `c`'s own log holds every record up to it (a cluster's log covers its
    /// time), so neither grants to `c` nor releases to `c`'s manager need carry those.
    pub(crate) fn seen(&self, c: ClusterId) -> Option<&VectorTime> {
        self.seen.get(&c)
    }

    /// This manager's own cluster is at `time`: its grants to that cluster (local
    /// grants and pushes) need not carry the records up to it, which the cluster's log
    /// holds.
    pub(crate) fn note_own_time(&mut self, me: ClusterId, time: &VectorTime) {
        self.seen.entry(me).or_default().merge(time);
    }

    /// The cluster `lock` is granted to, if any (it may be on its way back).
    pub(crate) fn holder(&self, lock: LockId) -> Option<ClusterId> {
        self.locks.get(lock).and_then(|s| s.holder)
    }

    /// Whether the current tenure of `lock` was pushed (granted unrequested): its
    /// receiver may keep the grant's records out of its log until a local thread takes
    /// it (`Pushed::Deferred` in [`crate::locks`]).
    pub(crate) fn is_pushed(&self, lock: LockId) -> bool {
        self.locks.get(lock).is_some_and(|st| st.pushed)
    }

    /// The newest of `c`'s records this manager holds (or discarded).
    pub(crate) fn stored(&self, c: ClusterId) -> u32 {
        self.store.top(c)
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
    updates_sent: Vec<(ClusterId, u64)>,
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

    /// An arrival; when it is the last one, returns the departures to send. Each
    /// departure tells its receiver how many updates every other cluster had sent it
    /// when it arrived (from the arrivals' `updates_sent`; see
    /// [`Message::BarrierDepart`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn arrive(
        &mut self,
        from: ClusterId,
        episode: u32,
        time: VectorTime,
        records: Vec<IntervalRecord>,
        migratable: Vec<PageId>,
        updates_sent: Vec<(ClusterId, u64)>,
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
        if updates_sent
            .iter()
            .any(|&(c, _)| c == from || c.index() >= self.arrivals.len())
        {
            return Err(SyncError::BadUpdateCounts(from));
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
            updates_sent,
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
                for &p in r.pages.iter() {
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
            let records: Vec<IntervalRecord> = arrivals
                .iter()
                .flat_map(|b| b.records.iter())
                .filter(|r| r.owner != to && r.index > a.time.get(r.owner))
                .cloned()
                .collect();
            // In cluster order, as the wire format wants.
            let updates_due: Vec<(ClusterId, u64)> = arrivals
                .iter()
                .enumerate()
                .filter_map(|(from, b)| {
                    let n = b.updates_sent.iter().find(|&&(c, _)| c == to)?.1;
                    Some((ClusterId::new(from as u16)?, n))
                })
                .filter(|&(_, n)| n > 0)
                .collect();
            out.push((
                to,
                Message::BarrierDepart {
                    episode: self.episode,
                    time: max.clone(),
                    records,
                    migrations: migrations.clone(),
                    updates_due,
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

    fn own() -> IntervalLog {
        IntervalLog::default()
    }

    fn lk(n: u32) -> LockId {
        LockId::new(n).unwrap()
    }

    /// The `(cluster, lock)` of every recall among `v`.
    fn recalled(v: &[(ClusterId, Message)]) -> Vec<(u16, u32)> {
        v.iter()
            .filter_map(|(to, msg)| match msg {
                Message::LockRecall { lock, .. } => Some((to.get(), lock.get())),
                _ => None,
            })
            .collect()
    }

    fn sent(r: Request) -> Vec<(ClusterId, Message)> {
        match r {
            Request::Send(v) => v.into_vec(),
            Request::Stale => panic!("request dropped as stale"),
        }
    }

    fn grant_of(v: &[(ClusterId, Message)]) -> (ClusterId, u32, bool, usize) {
        match v {
            [
                (
                    to,
                    Message::LockGrant {
                        tenure,
                        contended,
                        records,
                        ..
                    },
                ),
                ..,
            ] => (*to, *tenure, *contended, records.len()),
            other => panic!("no grant: {other:?}"),
        }
    }

    /// A release leaves out the records its manager's cluster log held (as the
    /// manager last reported its time); the store takes them from that log, so later
    /// records still insert without a gap and grants to others carry all of them.
    #[test]
    fn a_release_may_leave_out_the_records_the_managers_log_holds() {
        let mut m = LockManager::default();
        let z = VectorTime::new();
        let mut log = own();
        log.insert(rec(1, 1, &[1])).unwrap();
        log.insert(rec(1, 2, &[2])).unwrap();
        let (_, tenure, _, _) = grant_of(&sent(m.acquire(l(), c(1), z.clone(), 0, &log).unwrap()));
        let time = VectorTime::from_entries(vec![0, 3]);
        m.release(
            l(),
            c(1),
            tenure,
            &time,
            &z,
            vec![rec(1, 3, &[3])],
            Vec::new(),
            false,
            &log,
        )
        .expect("records 1 and 2 come from the manager's log");
        assert_eq!(m.stored(c(1)), 3);
        let g = sent(m.acquire(l(), c(2), z.clone(), 0, &own()).unwrap());
        assert_eq!(grant_of(&g).3, 3);
    }

    /// The diffs a release carries serve the grant of any lock of the manager whose
    /// records hold their interval: cluster 1 releases lock 3 carrying the diff of
    /// its interval 1, then lock 5 (same interval, no diff: a diff goes once to each
    /// manager); cluster 2's grant of lock 5 carries the diff all the same, and a
    /// grant whose records the acquirer has seen carries none.
    #[test]
    fn a_grant_carries_the_diffs_of_its_records_whatever_lock_brought_them() {
        let mut m = LockManager::default();
        let z = VectorTime::new();
        let (l3, l5) = (LockId::new(3).unwrap(), LockId::new(5).unwrap());
        let diff = IntervalDiff {
            page: p(7),
            owner: c(1),
            index: 1,
            base: VectorTime::new(),
            data: crate::interval::DiffBytes::new(vec![1, 2, 3]),
        };
        let time = VectorTime::from_entries(vec![0, 1]);
        for (lock, diffs) in [(l3, vec![diff.clone()]), (l5, vec![])] {
            let (_, tenure, _, _) =
                grant_of(&sent(m.acquire(lock, c(1), z.clone(), 0, &own()).unwrap()));
            m.release(
                lock,
                c(1),
                tenure,
                &time,
                &z,
                if lock == l3 {
                    vec![rec(1, 1, &[7])]
                } else {
                    vec![]
                },
                diffs,
                false,
                &own(),
            )
            .unwrap();
        }
        let carried = |v: &[(ClusterId, Message)]| match v {
            [(_, Message::LockGrant { diffs, .. }), ..] => diffs.clone(),
            other => panic!("no grant: {other:?}"),
        };
        let g = sent(m.acquire(l5, c(2), z.clone(), 0, &own()).unwrap());
        assert_eq!(carried(&g), vec![diff]);
        // Cluster 0 reports that it has seen interval 1 of cluster 1.
        let g = sent(m.acquire(l3, c(0), time.clone(), 0, &own()).unwrap());
        assert_eq!(carried(&g), vec![]);
    }

    /// A grant carries at most MAX_GRANT_DIFFS diffs, those of the newest intervals.
    #[test]
    fn a_grant_carries_at_most_the_newest_max_grant_diffs() {
        let mut m = LockManager::default();
        let z = VectorTime::new();
        let n = MAX_GRANT_DIFFS as u32 + 6;
        let diff = |index: u32| IntervalDiff {
            page: p(index),
            owner: c(1),
            index,
            base: VectorTime::new(),
            data: crate::interval::DiffBytes::new(vec![0; 12]),
        };
        let (_, tenure, _, _) =
            grant_of(&sent(m.acquire(l(), c(1), z.clone(), 0, &own()).unwrap()));
        m.release(
            l(),
            c(1),
            tenure,
            &VectorTime::from_entries(vec![0, n]),
            &z,
            (1..=n).map(|i| rec(1, i, &[i])).collect(),
            (1..=n).map(diff).collect(),
            false,
            &own(),
        )
        .unwrap();
        let g = sent(m.acquire(l(), c(2), z.clone(), 0, &own()).unwrap());
        let Some((_, Message::LockGrant { diffs, records, .. })) = g.first() else {
            panic!("no grant: {g:?}");
        };
        assert_eq!(records.len(), n as usize);
        let carried: Vec<u32> = diffs.iter().map(|d| d.index).collect();
        assert_eq!(carried, (7..=n).collect::<Vec<_>>());
    }

    /// A cluster that asks in turn for two neighbouring locks another cluster took
    /// first (and caches) gets the next ones of that cluster recalled with the second
    /// and pushed to it as they come back; a lock two clusters took is no part of a
    /// sweep, and asks out of order recall only what was asked for.
    #[test]
    fn a_sweep_over_locks_cached_elsewhere_recalls_the_next_ones() {
        let mut m = LockManager::default();
        let z = VectorTime::new();
        // Cluster 0 takes locks 2, 4, …, 40 first: uncontended grants, cached there.
        for n in (2..=40).step_by(2) {
            grant_of(&sent(m.acquire(lk(n), c(0), z.clone(), 0, &own()).unwrap()));
        }
        // Cluster 1 asks for lock 2: one recall; given back, it goes to cluster 1, and
        // cluster 1 becomes cluster 0's successor at this manager.
        let r = sent(m.acquire(lk(2), c(1), z.clone(), 0, &own()).unwrap());
        assert_eq!(recalled(&r), vec![(0, 2)]);
        let g = m
            .release(lk(2), c(0), 1, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g).0, c(1));
        // Lock 4, the next one: a sweep. Lock 4 and the next SWEEP_RECALL locks that
        // only cluster 0 took are recalled.
        let r = sent(m.acquire(lk(4), c(1), z.clone(), 0, &own()).unwrap());
        let want: Vec<(u16, u32)> = (0..=SWEEP_RECALL as u32).map(|i| (0, 4 + 2 * i)).collect();
        assert_eq!(recalled(&r), want);
        // A recalled-ahead lock given back with nobody waiting is pushed to cluster 1.
        let g = m
            .release(lk(6), c(0), 1, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        let (to, _, contended, _) = grant_of(&g);
        assert_eq!((to, contended), (c(1), true));
        assert!(m.is_pushed(lk(6)));
        // A lock granted to two clusters is no part of a sweep, even cached.
        let mut st = LockState {
            holder: Some(c(0)),
            ..LockState::default()
        };
        st.granted.insert(c(0), 1);
        assert!(st.only_held_by(c(0)));
        st.granted.insert(c(1), 2);
        assert!(!st.only_held_by(c(0)));
        // A request for a lock already recalled only waits.
        assert_eq!(
            sent(m.acquire(lk(8), c(1), z.clone(), 0, &own()).unwrap()),
            vec![]
        );
        // The sweep goes on after the recalled locks: lock 38 follows the last one
        // recalled (36), so lock 40, the last cached one, comes with it.
        let r = sent(m.acquire(lk(38), c(1), z.clone(), 0, &own()).unwrap());
        assert_eq!(recalled(&r), vec![(0, 38), (0, 40)]);
        // Asks out of order are no sweep.
        let mut m2 = LockManager::default();
        for n in [2, 4, 6] {
            grant_of(&sent(
                m2.acquire(lk(n), c(0), z.clone(), 0, &own()).unwrap(),
            ));
        }
        let r = sent(m2.acquire(lk(4), c(1), z.clone(), 0, &own()).unwrap());
        assert_eq!(recalled(&r), vec![(0, 4)]);
        m2.release(lk(4), c(0), 1, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        let r = sent(m2.acquire(lk(2), c(1), z.clone(), 0, &own()).unwrap());
        assert_eq!(recalled(&r), vec![(0, 2)]);
    }

    /// A sweep over locks pushed to another cluster that is not taking this manager's
    /// locks (quiet) recalls the next pushed ones ahead, and each goes to the sweeping
    /// cluster when it comes back unused; while that cluster takes this manager's locks
    /// itself, only the lock asked for is recalled.
    #[test]
    fn a_sweep_over_locks_pushed_to_a_quiet_cluster_recalls_the_next_ones() {
        let z = VectorTime::new();
        // Locks 2, 4, …, 40 taken by cluster 0, then 1, then 0 again: the third release
        // pushes each to cluster 1 (it took the lock after cluster 0 last time).
        // Returns the manager and each lock's last tenure granted to clusters 0 and 1.
        let setup = || {
            let mut m = LockManager::default();
            let mut seen: BTreeMap<(u32, u16), u32> = BTreeMap::new();
            for n in (2..=40).step_by(2) {
                let (_, t, _, _) =
                    grant_of(&sent(m.acquire(lk(n), c(0), z.clone(), 0, &own()).unwrap()));
                seen.insert((n, 0), t);
                // Cluster 1 asks: cluster 0 is recalled and gives it back, used.
                sent(m.acquire(lk(n), c(1), z.clone(), 0, &own()).unwrap());
                let g = m
                    .release(lk(n), c(0), t, &z, &z, vec![], vec![], false, &own())
                    .unwrap();
                let (to, t, _, _) = grant_of(&g);
                assert_eq!(to, c(1));
                seen.insert((n, 1), t);
                let g = m
                    .release(lk(n), c(1), t, &z, &z, vec![], vec![], false, &own())
                    .unwrap();
                // Pushed to cluster 0 once the manager has seen it follow cluster 1;
                // else cluster 0 asks.
                let (to, t, _, _) = if g.is_empty() {
                    grant_of(&sent(
                        m.acquire(lk(n), c(0), z.clone(), seen[&(n, 0)], &own())
                            .unwrap(),
                    ))
                } else {
                    grant_of(&g)
                };
                assert_eq!(to, c(0));
                seen.insert((n, 0), t);
                let g = m
                    .release(lk(n), c(0), t, &z, &z, vec![], vec![], false, &own())
                    .unwrap();
                let (to, t, _, _) = grant_of(&g);
                assert_eq!(to, c(1), "lock {n} pushed to cluster 1");
                assert!(m.is_pushed(lk(n)));
                seen.insert((n, 1), t);
            }
            (m, seen)
        };
        // Cluster 1 gives lock `n`, pushed to it, back unused.
        let unused = |m: &mut LockManager, seen: &BTreeMap<(u32, u16), u32>, n: u32| {
            let t = seen[&(n, 1)];
            m.release(lk(n), c(1), t, &z, &z, vec![], vec![], true, &own())
                .unwrap()
        };
        // Cluster 0 asks for locks 2 and then 4, both pushed to cluster 1.
        let sweep = |m: &mut LockManager, seen: &BTreeMap<(u32, u16), u32>| {
            let r = sent(
                m.acquire(lk(2), c(0), z.clone(), seen[&(2, 0)], &own())
                    .unwrap(),
            );
            assert_eq!(recalled(&r), vec![(1, 2)]);
            // Cluster 1 gives lock 2 back unused: it goes to the waiting cluster 0.
            assert_eq!(grant_of(&unused(m, seen, 2)).0, c(0));
            recalled(&sent(
                m.acquire(lk(4), c(0), z.clone(), seen[&(4, 0)], &own())
                    .unwrap(),
            ))
        };

        // Cluster 0 gives back 16 more locks after using them: cluster 1 is quiet.
        let (mut m, seen) = setup();
        for n in (42..=72).step_by(2) {
            let (_, t, _, _) =
                grant_of(&sent(m.acquire(lk(n), c(0), z.clone(), 0, &own()).unwrap()));
            m.release(lk(n), c(0), t, &z, &z, vec![], vec![], false, &own())
                .unwrap();
        }
        let want: Vec<(u16, u32)> = (0..=SWEEP_RECALL as u32).map(|i| (1, 4 + 2 * i)).collect();
        assert_eq!(sweep(&mut m, &seen), want);
        // A recalled-ahead lock that comes back unused goes to cluster 0, unasked.
        assert_eq!(grant_of(&unused(&mut m, &seen, 6)).0, c(0));
        assert!(m.is_pushed(lk(6)));

        // Cluster 1 released one of this manager's locks just before: not quiet, so
        // only the locks asked for are recalled.
        let (mut m, seen) = setup();
        assert_eq!(sweep(&mut m, &seen), vec![(1, 4)]);
    }

    #[test]
    fn lock_fifo_recalls_pushes_and_notices() {
        let mut m = LockManager::default();
        let z = VectorTime::new();
        let recall = |to: u16, tenure| (c(to), Message::LockRecall { lock: l(), tenure });
        // a free lock is granted at once; nobody else held it: not contended
        let g = sent(m.acquire(l(), c(0), z.clone(), 0, &own()).unwrap());
        assert_eq!(grant_of(&g), (c(0), 1, false, 0));
        assert_eq!(g.len(), 1);
        // the first request behind the owner recalls its tenure, later ones only queue
        assert_eq!(
            sent(m.acquire(l(), c(1), z.clone(), 0, &own()).unwrap()),
            vec![recall(0, 1)]
        );
        assert_eq!(
            sent(
                m.acquire(l(), c(2), VectorTime::from_entries(vec![1]), 0, &own())
                    .unwrap()
            ),
            vec![]
        );
        // only the holder may release, and only its tenure
        assert_eq!(
            m.release(l(), c(1), 1, &z, &z, vec![], vec![], false, &own()),
            Err(SyncError::NotHolder(l(), c(1)))
        );
        assert_eq!(
            m.release(l(), c(0), 2, &z, &z, vec![], vec![], false, &own()),
            Err(SyncError::NotHolder(l(), c(0)))
        );
        let t = VectorTime::from_entries(vec![1]);
        let g = m
            .release(
                l(),
                c(0),
                1,
                &t,
                &z,
                vec![rec(0, 1, &[7])],
                vec![],
                false,
                &own(),
            )
            .unwrap();
        // the next waiter's grant carries the record and says the lock is contended
        // (cluster 0 just held it): that counts as recalled, so no recall follows
        // although cluster 2 waits
        assert_eq!(grant_of(&g), (c(1), 2, true, 1));
        assert_eq!(g.len(), 1);
        // cluster 2 already saw record (0,1)
        let g = m
            .release(l(), c(1), 2, &t, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(2), 3, true, 0));
        // nobody waits and nobody ever took the lock after cluster 2: it stays free
        assert_eq!(
            m.release(l(), c(2), 3, &t, &z, vec![], vec![], false, &own())
                .unwrap(),
            Sends::new()
        );
        let g = sent(m.acquire(l(), c(0), t.clone(), 1, &own()).unwrap());
        assert_eq!(grant_of(&g), (c(0), 4, true, 0));
        // cluster 1 took the lock after cluster 0 last time: cluster 0's release pushes
        // it there without a request, without the record (0,1), which cluster 1 has
        // seen (its last release to this manager said so)
        let g = m
            .release(l(), c(0), 4, &t, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(1), 5, true, 0));
        // cluster 1's own request crossed the push: the push answered it
        assert_eq!(
            m.acquire(l(), c(1), t.clone(), 2, &own()),
            Ok(Request::Stale)
        );
        // another cluster wants the pushed lock first: recall it
        assert_eq!(
            sent(m.acquire(l(), c(2), t.clone(), 3, &own()).unwrap()),
            vec![recall(1, 5)]
        );
        let g = m
            .release(l(), c(1), 5, &t, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(2), 6, true, 0));
        // 2 → 0 was learned before: cluster 2's release pushes to cluster 0
        let g = m
            .release(l(), c(2), 6, &t, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(0), 7, true, 0));
        // cluster 0 sends the push back unused (it waits at a barrier): nothing is
        // pushed on, so pushes cannot bounce between clusters at a barrier
        assert_eq!(
            m.release(l(), c(0), 7, &t, &z, vec![], vec![], true, &own())
                .unwrap(),
            Sends::new()
        );
        let g = sent(m.acquire(l(), c(0), t.clone(), 7, &own()).unwrap());
        assert_eq!(grant_of(&g).1, 8);
        // the prediction 0 → 1 was dropped at the recall, but cluster 1 then used the
        // push before giving it back: it stands again
        let g = m
            .release(l(), c(0), 8, &t, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(1), 9, true, 0));
        assert_eq!(
            m.release(l(), c(1), 9, &t, &z, vec![], vec![], true, &own())
                .unwrap(),
            Sends::new()
        );
        assert_eq!(m.stored_records(), 1);
        m.collect_garbage(&VectorTime::from_entries(vec![1]));
        assert_eq!(m.stored_records(), 0);
    }

    /// Takes lock `l()` for `who` and gives it back, the way a cluster would: a push to
    /// `who` is used; else `who` requests, and a push to another cluster is recalled
    /// and comes back unused before the grant. Returns whether a push had brought the
    /// lock to `who`; `push` is the push pending (cluster, tenure).
    fn take_turn(m: &mut LockManager, push: &mut Option<(u16, u32)>, who: u16) -> bool {
        let z = VectorTime::new();
        let hit = matches!(*push, Some((to, _)) if to == who);
        let tenure = match push.take() {
            Some((to, t)) if to == who => t,
            other => {
                let seen = m
                    .locks
                    .get(l())
                    .and_then(|st| st.granted.get(&c(who)).copied());
                let g = sent(
                    m.acquire(l(), c(who), z.clone(), seen.unwrap_or(0), &own())
                        .unwrap(),
                );
                let g = match other {
                    // the push is recalled and comes back unused; the grant follows
                    Some((to, t)) => {
                        assert_eq!(
                            g,
                            vec![(
                                c(to),
                                Message::LockRecall {
                                    lock: l(),
                                    tenure: t
                                }
                            )]
                        );
                        m.release(l(), c(to), t, &z, &z, vec![], vec![], true, &own())
                            .unwrap()
                            .into_vec()
                    }
                    None => g,
                };
                grant_of(&g).1
            }
        };
        let g = m
            .release(l(), c(who), tenure, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        *push = (!g.is_empty()).then(|| {
            let (to, t, contended, _) = grant_of(&g);
            assert!(contended, "a push goes back after its use");
            (to.get(), t)
        });
        hit
    }

    /// A lock taken in turns 0, 1, 1 (Water's per-molecule locks on 2 clusters × 2
    /// threads): after three rounds (a turn is confirmed when seen twice in a row, and
    /// wrong fallback pushes delay that), every tenure is pushed where it is wanted
    /// next, cluster 1's second one back to cluster 1 itself. A lock that only one
    /// cluster takes is not pushed back to it.
    #[test]
    fn turns_of_two_holders_are_pushed_including_back_to_the_releaser() {
        let mut m = LockManager::default();
        let mut push = None;
        for round in 0..6 {
            let hits: Vec<bool> = [0, 1, 1]
                .map(|who| take_turn(&mut m, &mut push, who))
                .to_vec();
            if round >= 3 {
                assert_eq!(hits, [true; 3], "round {round}");
            }
        }
        // cluster 1 alone from now on (the push to cluster 0 goes back unused): the lock
        // is no longer contended and is never pushed back to cluster 1 (its requests
        // make it the caching owner)
        let hits: Vec<bool> = (0..4).map(|_| take_turn(&mut m, &mut push, 1)).collect();
        assert_eq!(hits, [false; 4]);
        assert_eq!(push, None);
    }

    /// A lock taken in turns 0, 1 whose clusters fall out of step once (0 takes it
    /// twice in a row): one such observation does not send the lock back to its
    /// releaser, and the turns 0, 1 go on being pushed.
    #[test]
    fn one_repeat_does_not_confirm_a_turn_back_to_the_releaser() {
        let mut m = LockManager::default();
        let mut push = None;
        for _ in 0..3 {
            for who in [0, 1] {
                take_turn(&mut m, &mut push, who);
            }
        }
        assert!(take_turn(&mut m, &mut push, 0));
        // out of step: cluster 0 again (the push to cluster 1 goes back unused)
        assert!(!take_turn(&mut m, &mut push, 0));
        assert_ne!(
            push.map(|p| p.0),
            Some(0),
            "pushed back to cluster 0 after one repeat"
        );
        let hits: Vec<bool> = [1, 0, 1, 0, 1]
            .map(|who| take_turn(&mut m, &mut push, who))
            .to_vec();
        assert_eq!(hits[1..], [true; 4]);
    }

    /// A lock with no history of its own is pushed where the manager's other locks went
    /// after the same releaser (Water's sweeps); once it has a history of its own, that
    /// is followed.
    #[test]
    fn a_new_lock_follows_the_managers_other_locks() {
        let (a, b) = (LockId::new(3).unwrap(), LockId::new(5).unwrap());
        let z = VectorTime::new();
        let mut m = LockManager::default();
        // A fresh `lock` taken by `first`, then asked for by `second`: handed over on
        // `first`'s release (a recall), which the manager learns.
        let recalled = |m: &mut LockManager, lock, first: u16, second: u16| {
            sent(m.acquire(lock, c(first), z.clone(), 0, &own()).unwrap());
            sent(m.acquire(lock, c(second), z.clone(), 0, &own()).unwrap());
            let g = m
                .release(lock, c(first), 1, &z, &z, vec![], vec![], false, &own())
                .unwrap();
            assert_eq!(grant_of(&g), (c(second), 2, true, 0));
        };
        // lock a: cluster 0, then cluster 1: 0 → 1 learned
        recalled(&mut m, a, 0, 1);
        // lock b: cluster 1, then cluster 0 (contended); cluster 0's release has no
        // successor of its own on b: pushed to cluster 1, as on lock a
        recalled(&mut m, b, 1, 0);
        let g = m
            .release(b, c(0), 2, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(1), 3, true, 0));
        // cluster 2 wants b first: the push is recalled and comes back unused
        assert_eq!(
            sent(m.acquire(b, c(2), z.clone(), 0, &own()).unwrap()),
            vec![(c(1), Message::LockRecall { lock: b, tenure: 3 })]
        );
        let g = m
            .release(b, c(1), 3, &z, &z, vec![], vec![], true, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(2), 4, true, 0));
        m.release(b, c(2), 4, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        // cluster 0 again: b now has a history of its own (cluster 2 took it after
        // cluster 0), which its next push follows instead of the manager-wide 0 → 1
        let g = sent(m.acquire(b, c(0), z.clone(), 2, &own()).unwrap());
        assert_eq!(grant_of(&g).1, 5);
        let g = m
            .release(b, c(0), 5, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(2), 6, true, 0));
    }

    #[test]
    fn a_cached_owner_must_be_recalled_before_it_asks_again() {
        let mut m = LockManager::default();
        let k = LockId::new(9).unwrap();
        let z = VectorTime::new();
        sent(m.acquire(k, c(1), z.clone(), 0, &own()).unwrap());
        assert_eq!(
            m.acquire(k, c(1), z.clone(), 1, &own()),
            Err(SyncError::RequestFromHolder(k, c(1)))
        );
        // after a recall, the owner's new request may overtake its release
        assert_eq!(
            sent(m.acquire(k, c(2), z.clone(), 0, &own()).unwrap()),
            vec![(c(1), Message::LockRecall { lock: k, tenure: 1 })]
        );
        assert_eq!(
            sent(m.acquire(k, c(1), z.clone(), 1, &own()).unwrap()),
            vec![]
        );
        let g = m
            .release(k, c(1), 1, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        // a contended grant to cluster 2 (cluster 1 waits behind it): no recall, it
        // comes back after its use
        assert_eq!(grant_of(&g), (c(2), 2, true, 0));
        assert_eq!(g.len(), 1);
        let g = m
            .release(k, c(2), 2, &z, &z, vec![], vec![], false, &own())
            .unwrap();
        assert_eq!(grant_of(&g), (c(1), 3, true, 0));
    }

    #[test]
    fn grants_say_whether_another_cluster_held_the_lock_recently() {
        let mut m = LockManager::default();
        let k = LockId::new(4).unwrap();
        let z = VectorTime::new();
        let mut seen = [0u32; 3];
        let mut take = |m: &mut LockManager, who: u16| {
            let g = sent(
                m.acquire(k, c(who), z.clone(), seen[who as usize], &own())
                    .unwrap(),
            );
            let (_, tenure, contended, _) = grant_of(&g);
            seen[who as usize] = tenure;
            let pushed = m
                .release(k, c(who), tenure, &z, &z, vec![], vec![], false, &own())
                .unwrap();
            assert!(pushed.is_empty(), "{pushed:?}");
            contended
        };
        // one cluster using the lock again and again: never contended
        for _ in 0..3 {
            assert!(!take(&mut m, 1));
        }
        // another cluster: contended, and so is cluster 1 for its next two tenures
        assert!(take(&mut m, 2));
        // (cluster 2's release pushed nothing: nobody took the lock after it before)
        let g = sent(m.acquire(k, c(1), z.clone(), 3, &own()).unwrap());
        assert_eq!(grant_of(&g), (c(1), 5, true, 0));
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
                vec![(c(2), 5)],
                true
            )
            .unwrap(),
            None
        );
        assert_eq!(
            b.arrive(c(0), 0, t(vec![]), vec![], vec![], vec![], true),
            Err(SyncError::DuplicateArrival(c(0)))
        );
        assert_eq!(
            b.arrive(
                c(1),
                0,
                t(vec![1, 1]),
                vec![rec(1, 1, &[2])],
                vec![p(2)],
                vec![(c(0), 3), (c(2), 4)],
                true
            )
            .unwrap(),
            None
        );
        let out = b
            .arrive(c(2), 0, t(vec![]), vec![], vec![], vec![], true)
            .unwrap()
            .unwrap();
        let due = |i: usize| match &out[i].1 {
            Message::BarrierDepart { updates_due, .. } => updates_due.clone(),
            m => panic!("{m:?}"),
        };
        // each receiver waits for what the others had sent it when they arrived
        assert_eq!(due(0), vec![(c(1), 3)]);
        assert_eq!(due(1), vec![]);
        assert_eq!(due(2), vec![(c(0), 5), (c(1), 4)]);
        let depart = |i: usize| match &out[i].1 {
            Message::BarrierDepart {
                records,
                migrations,
                time,
                ..
            } => {
                let mut notices: Vec<PageId> = records
                    .iter()
                    .flat_map(|r| r.pages.iter().copied())
                    .collect();
                notices.sort_unstable();
                notices.dedup();
                (notices, migrations.clone(), time.clone())
            }
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
            b.arrive(c(0), 0, t(vec![]), vec![], vec![], vec![], true),
            Err(SyncError::Episode {
                expected: 1,
                got: 0
            })
        );
        // update counts for the sender itself or for a cluster outside the job
        for bad in [vec![(c(1), 1)], vec![(c(3), 1)]] {
            assert_eq!(
                b.arrive(c(1), 1, t(vec![]), vec![], vec![], bad, true),
                Err(SyncError::BadUpdateCounts(c(1)))
            );
        }
    }
}
