//! The engine of one cluster: its coherence machine, how events are handled and actions
//! executed, how received messages are dispatched, and how a thread waits.
//!
//! # Threads
//!
//! Every thread that touches the region or synchronizes drives the machine itself:
//!
//! * a **faulting thread** (in its `SIGBUS` handler) passes the fault to the machine,
//!   executes the resulting actions and, if the page must come from elsewhere, waits by
//!   polling the protocol queue itself — yielding between polls for
//!   [`crate::DsmOptions::wait_spin`], then sleeping in the message layer's blocking
//!   receive on the protocol queue and its own wake-up queue — handling
//!   every protocol message that arrives meanwhile, whoever it is for (at most one
//!   such sleeper per CPU: the others park until their own completion, see
//!   [`Core::wait`]). The reply that
//!   completes its fault is usually handled by the thread itself:
//!   no other thread's wake-up is on the critical path;
//! * a thread in an acquire, release or barrier waits the same way;
//! * the **protocol thread** serves what arrives while no other thread polls (page
//!   requests for pages homed here, diffs, lock and barrier managers): while the
//!   cluster's threads keep polling it naps off the doorbell, otherwise it polls for
//!   [`crate::DsmOptions::server_spin`] after each message, then blocks on the queue
//!   (see [`Core::serve`]).
//!
//! The machine sits behind one mutex. A lock the cluster owns and no one else wants is
//! the exception: its acquires and releases skip the machine and flip one word of the
//! runtime's lock cache ([`super::lock_cache`]), so threads of one cluster do not take
//! the mutex for locks that stay in it. An event and all its actions are handled under
//! the mutex, in order (the machine's calling contract); the mutex is never held while
//! application memory is touched, so taking it in a `SIGBUS` handler is safe (the
//! interrupted code cannot hold it). Page contents are read and written through the
//! region's runtime view, which never faults.
//!
//! # Completions
//!
//! The machine names waiting threads by token ([`super::slots`]). A completion for
//! another thread that sleeps is followed by a no-op message to that thread's own
//! wake-up queue ([`crate::WAKE_QUEUES`]): only the sleeper polls it, so no other thread
//! can swallow the wake-up. (With the no-op on the shared protocol queue, another poller
//! often took it and the sleeper slept its whole 2 ms slice: the 4 × 2 counter test of
//! `tests/cluster.rs` took 37–70 s instead of 0.9 s once locks stayed cached in
//! clusters and waits grew longer than the spin.) Sleeps are still bounded (a few
//! milliseconds), for slots that share a wake-up queue.
//!
//! A thread that synchronizes first handles what has arrived on the protocol queue, also
//! when it takes a lock from the runtime's cache: a thread that keeps taking a cached
//! lock never waits, so it must see a recall of that lock itself (its `LockWanted` makes
//! the holder's next release go through the machine).

use super::lock_cache::{LockCache, Wanted};
use super::reseq::{Offer, Resequencer};
use super::slots::{RUNTIME_TOKEN, SentByThread, SlotRef, Slots, thread_slot, token};
use super::watch::Waits;
use crate::error::DsmError;
use crate::stats::{ClusterStats, Counters, LayerStats, ProtocolStats, bump};
use crate::transport::{Liveness, PROTOCOL_QUEUE, WAKE_QUEUES, wake_queue};
use crate::uffd::{
    Access, Fault, FaultKind, FaultResolver, Install, PAGE_SIZE, PageIndex, PageRange, Protection,
    RegionOps,
};
use crate::wire::{self, Outgoing, RuntimeOp};
use crossbeam_utils::CachePadded;
use multigrain_coherence::diff;
use multigrain_coherence::{
    Action, ClusterId, DiffBytes, Event, FaultToken, FlushPage, LockId, MAX_LOCKS, Machine,
    Message, PageId, Source, SyncToken,
};
use multigrain_messaging::{
    BulkSendError, Endpoint, Express, Handler, Message as Received, SendError, Site, TagOnBuf,
    TagOnData, VirtualName,
};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Exit status of a process whose page fault could not be served because of this
/// cluster's own failure (the protocol broke here): the faulting access cannot
/// continue, so the runtime prints the error to standard error and ends the process
/// with this status. When another cluster's failure is the reason, the process ends
/// with the control plane's `EXIT_PEER_FAILED` (3) instead, as every cluster does that
/// stops because of another.
pub const FAULT_EXIT_CODE: i32 = 70;

/// Timing knobs of the waits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// How many times a waiting thread polls without yielding its CPU (about 20 ns
    /// each when nothing arrives).
    pub(crate) busy_polls: u32,
    /// How long a waiting thread polls (yielding once `busy_polls` polls found
    /// nothing) before it sleeps on the doorbell.
    pub(crate) spin: Duration,
    /// How recently a thread of the cluster must have polled the protocol queue for
    /// the protocol thread to leave it to them.
    pub(crate) handover: Duration,
    /// Longest single sleep of a waiting thread.
    pub(crate) slice: Duration,
    /// How often a waiting thread asks the liveness oracle.
    pub(crate) liveness_period: Duration,
    /// How long a blocking send waits before asking the liveness oracle.
    pub(crate) send_slice: Duration,
}

/// A failed cluster and why.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub(crate) cluster: usize,
    pub(crate) reason: String,
}

/// What the machine mutex protects.
pub(crate) struct State {
    pub(crate) machine: Machine,
    actions: Vec<Action>,
    /// Twins by page.
    twins: HashMap<u32, Box<[u8; PAGE_SIZE]>>,
    /// Twin buffers for reuse.
    spare: Vec<Box<[u8; PAGE_SIZE]>>,
    /// A page's current contents while its diff is encoded.
    scratch: Box<[u8; PAGE_SIZE]>,
    /// The diff being encoded, with room for the largest ([`diff::MAX_ENCODED`]).
    diff_buf: Vec<u8>,
    /// Bulk messages held back by the event being handled, by destination cluster (see
    /// [`Core::handle_one`]); all empty between events.
    outbox: Vec<wire::Bundle>,
    /// Idle cached locks the machine wants back, to be released through it in the
    /// same call (see [`LockCache`]); empty between events.
    reclaim: Vec<LockId>,
}

/// A received message waiting to be handled.
pub(crate) enum Incoming {
    /// As the message layer delivered it.
    Msg(Received),
    /// A Tag-On message whose buffer was copied out and released at once.
    Copied {
        handler: Handler,
        source: usize,
        tag: u64,
        data: Vec<u8>,
    },
}

/// Messages received while the machine was busy (during blocking sends), handled once it
/// is free. Tag-On buffers are copied out and released immediately: holding them would
/// keep the sender's pool slots, and a sender waiting for its pool while holding ours
/// would never get them back.
#[derive(Default)]
pub(crate) struct Pending(VecDeque<Incoming>);

impl Pending {
    fn push(&mut self, m: Received) {
        self.0.push_back(match m {
            Received::TagOn(t) => Incoming::Copied {
                handler: t.handler,
                source: usize::from(t.source.get()),
                tag: t.data.tag(),
                data: t.data.as_slice().to_vec(),
            },
            other => Incoming::Msg(other),
        });
    }
}

/// The Tag-On buffer of the message being handled, with its sender.
type Attached<'a> = Option<(usize, &'a [u8])>;

/// One cluster's runtime state, shared by its threads and its fault resolver.
pub(crate) struct Core {
    /// Distinguishes runtimes in thread-local tables.
    pub(crate) id: u64,
    pub(crate) me: usize,
    pub(crate) clusters: usize,
    pub(crate) site: Site,
    proto_ep: Mutex<Endpoint>,
    pub(crate) state: Mutex<State>,
    pub(crate) slots: Slots,
    /// Network messages sent, by sending thread (see [`SentByThread`]).
    pub(crate) sent_by_thread: SentByThread,
    /// Locks passed among this cluster's threads without the machine.
    pub(crate) lock_cache: LockCache,
    /// Each sender's bundles, handled in the order it numbered them (by sender).
    reseq: Vec<Mutex<Resequencer>>,
    liveness: Arc<dyn Liveness>,
    failure: Mutex<Option<Failure>>,
    failed: AtomicBool,
    pub(crate) counters: Counters,
    pub(crate) stop: AtomicBool,
    /// Start-up fingerprints received, by cluster.
    pub(crate) hellos: Mutex<Vec<Option<u64>>>,
    /// Shutdown statistics received, by cluster; a cluster that sent them is done.
    pub(crate) peer_stats: Mutex<Vec<Option<ClusterStats>>>,
    pub(crate) tuning: Tuning,
    /// Start of this runtime's clock for the timestamps below.
    pub(crate) epoch: Instant,
    /// When this cluster last sent its barrier arrival (ns since `epoch`).
    pub(crate) barrier_arrival_sent: std::sync::atomic::AtomicU64,
    /// Set by a thread of this cluster that polls the protocol queue from inside the
    /// runtime, cleared by the protocol thread: while it keeps being set, the protocol
    /// thread leaves the queue to them (see [`Core::serve`]).
    pub(crate) polled: CachePadded<AtomicBool>,
    /// Whether the protocol thread runs at real-time priority (see `multigrain_messaging::sched`).
    pub(crate) realtime: AtomicBool,
    /// What this cluster's threads wait for (the progress watchdog's evidence).
    pub(crate) waits: Waits,
    /// Threads in [`Core::wait`] now.
    waiting: CachePadded<AtomicUsize>,
    /// Threads of [`Core::wait`] asleep on the protocol queue's doorbell now.
    doorbell_sleepers: CachePadded<AtomicUsize>,
    /// CPUs this process may run on: the most threads that sleep on the doorbell, and
    /// the most waiting threads that still yield-poll (see [`Core::wait`]).
    cpus: usize,
}

fn next_runtime_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn name(c: usize) -> VirtualName {
    VirtualName(c as u16)
}

impl Core {
    /// The runtime of cluster `me`; `threads`: the compute threads of each cluster of
    /// the job.
    pub(crate) fn new(
        me: usize,
        threads: &[usize],
        site: Site,
        endpoint: Endpoint,
        machine: Machine,
        liveness: Arc<dyn Liveness>,
        tuning: Tuning,
    ) -> Core {
        let clusters = threads.len();
        Core {
            id: next_runtime_id(),
            me,
            clusters,
            site,
            proto_ep: Mutex::new(endpoint),
            state: Mutex::new(State {
                machine,
                actions: Vec::new(),
                twins: HashMap::new(),
                spare: Vec::new(),
                scratch: Box::new([0; PAGE_SIZE]),
                diff_buf: Vec::with_capacity(diff::MAX_ENCODED),
                outbox: (0..clusters).map(|_| wire::Bundle::default()).collect(),
                reclaim: Vec::new(),
            }),
            slots: Slots::new(),
            sent_by_thread: SentByThread::new(threads[me]),
            lock_cache: LockCache::new(MAX_LOCKS),
            reseq: (0..clusters).map(|_| Mutex::default()).collect(),
            liveness,
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            hellos: Mutex::new(vec![None; clusters]),
            peer_stats: Mutex::new(vec![None; clusters]),
            tuning,
            epoch: Instant::now(),
            barrier_arrival_sent: std::sync::atomic::AtomicU64::new(0),
            polled: CachePadded::new(AtomicBool::new(false)),
            realtime: AtomicBool::new(false),
            waits: Waits::new(),
            waiting: CachePadded::new(AtomicUsize::new(0)),
            doorbell_sleepers: CachePadded::new(AtomicUsize::new(0)),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }

    /// A new handle on the protocol queue that spins `spin` before sleeping.
    pub(crate) fn new_endpoint(&self, spin: Duration) -> Endpoint {
        let mut ep = self.proto_ep.lock().share();
        ep.set_spin(spin);
        ep
    }

    /// The endpoint of thread slot `slot`: the protocol queue and the slot's wake-up
    /// queue ([`crate::WAKE_QUEUES`]), sleeping at once when a blocking receive finds
    /// nothing. Falls back to a plain protocol-queue handle if the site cannot make one
    /// (its wake-ups then come from the protocol queue and the sleep slice).
    fn slot_endpoint(&self, slot: u32) -> Endpoint {
        let made = self
            .site
            .create_endpoint(&[PROTOCOL_QUEUE, wake_queue(slot)])
            .map_err(|e| e.to_string())
            .and_then(|(mut ep, table)| {
                super::map_destinations(&table, self.me, self.clusters)?;
                ep.set_spin(Duration::ZERO);
                Ok(ep)
            });
        made.unwrap_or_else(|e| {
            tracing::warn!("cluster {}: no wake-up queue for slot {slot}: {e}", self.me);
            self.new_endpoint(Duration::ZERO)
        })
    }

    /// Wakes the thread of slot `slot`, which sleeps waiting: a no-op to its wake-up
    /// queue.
    fn wake_slot(&self, ep: &Endpoint, slot: u32) {
        let noop = Express::new(RuntimeOp::Noop.handler(), 0).expect("zero payload");
        let name = VirtualName((self.clusters + slot as usize % WAKE_QUEUES) as u16);
        // A full wake-up queue has rung the doorbell already.
        let _ = ep.send_express(name, noop);
    }

    /// Runs `f` with this thread's slot and endpoint.
    pub(crate) fn with_thread<R>(
        self: &Arc<Self>,
        f: impl FnOnce(u32, &Endpoint) -> Result<R, DsmError>,
    ) -> Result<R, DsmError> {
        let slot: SlotRef = thread_slot(self).ok_or(DsmError::TooManyThreads {
            cluster: self.me,
            max: super::slots::MAX_THREADS,
        })?;
        let s = self.slots.get(slot.slot);
        let index = super::slots::compute_index();
        let mut guard = s.ep.try_lock();
        let temporary;
        let ep: &Endpoint = match guard.as_mut() {
            Some(guard) => {
                let ep = guard.get_or_insert_with(|| self.slot_endpoint(slot.slot));
                // Slots are reused by later threads: name the current one each time.
                ep.set_thread_index(index.unwrap_or(slot.slot as usize));
                ep
            }
            // Used further up this thread's stack (never expected): a temporary handle.
            None => {
                temporary = self.new_endpoint(Duration::ZERO);
                &temporary
            }
        };
        f(slot.slot, ep)
    }

    // ----- failure -----------------------------------------------------------------

    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Records the job's first failure; with `broadcast`, tells every other live
    /// cluster (so that all of them blame the same cluster).
    pub(crate) fn record_failure(&self, ep: &Endpoint, f: Failure, broadcast: bool) {
        {
            let mut g = self.failure.lock();
            if g.is_some() {
                return;
            }
            *g = Some(f.clone());
            self.failed.store(true, Ordering::Release);
        }
        tracing::error!(
            "cluster {}: job failed: cluster {}: {}",
            self.me,
            f.cluster,
            f.reason
        );
        if broadcast {
            let mut body = (f.cluster as u16).to_le_bytes().to_vec();
            body.extend_from_slice(f.reason.as_bytes());
            for c in (0..self.clusters).filter(|&c| c != self.me && c != f.cluster) {
                let before = ep.network_sent();
                let _ = ep.send_bulk(
                    name(c),
                    RuntimeOp::Abort.handler(),
                    &body,
                    Some(Duration::from_millis(100)),
                    drop,
                );
                self.note_sent(ep, before);
            }
        }
    }

    /// Records `e`, raised by this cluster, as the job's failure (and tells the others).
    pub(crate) fn fail_with(&self, ep: &Endpoint, e: &DsmError) {
        if self.is_failed() {
            return;
        }
        self.record_failure(
            ep,
            Failure {
                cluster: e.blamed_cluster(),
                reason: e.to_string(),
            },
            true,
        );
    }

    /// The recorded failure as an error for a thread that was doing `context`.
    pub(crate) fn failure_error(&self, context: Option<String>) -> DsmError {
        let f = self.failure.lock().clone().unwrap_or(Failure {
            cluster: self.me,
            reason: "the job was aborted".into(),
        });
        DsmError::PeerFailed {
            cluster: f.cluster,
            reason: f.reason,
            detected_by: self.me,
            context,
        }
    }

    /// Whether `c` has finished the job (its shutdown statistics arrived).
    fn peer_finished(&self, c: usize) -> bool {
        self.peer_stats.lock().get(c).is_some_and(Option::is_some)
    }

    /// Asks the liveness oracle (only where the machine is not locked). A failed cluster
    /// makes this cluster fail: the messages already queued are handled first (a dying
    /// cluster's abort names the real culprit), then the failure is recorded and
    /// broadcast.
    pub(crate) fn check_liveness(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        context: &dyn Fn() -> String,
    ) -> Result<(), DsmError> {
        if self.is_failed() {
            return Err(self.failure_error(Some(context())));
        }
        let Some(f) = self.peer_failure() else {
            return Ok(());
        };
        while let Some(m) = ep.try_recv() {
            let _ = self.dispatch(ops, ep, m);
        }
        self.record_failure(ep, f, true);
        Err(self.failure_error(Some(context())))
    }

    // ----- events and actions ------------------------------------------------------

    /// Handles `event` (with the received Tag-On buffer `attachment`, if any) and
    /// executes its actions, then dispatches the messages received meanwhile.
    pub(crate) fn handle(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        event: Event,
        attachment: Attached<'_>,
    ) -> Result<(), DsmError> {
        let mut pending = Pending::default();
        self.handle_one(ops, ep, event, attachment, &mut pending)?;
        self.drain_pending(ops, ep, &mut pending)
    }

    fn drain_pending(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        while let Some(m) = pending.0.pop_front() {
            self.dispatch_one(ops, ep, m, pending)?;
        }
        Ok(())
    }

    /// Handles `event` and executes its actions under the machine lock, in order.
    ///
    /// # Bundling
    ///
    /// A bulk coherence message is not sent at once: it joins the bundle of its
    /// destination ([`State::outbox`], [`wire::Bundle`]). The bundle for a cluster is
    /// sent, as one message-layer message ([`RuntimeOp::Bundle`], or the plain bulk
    /// message when it holds one),
    ///
    /// * before any other message (Express, Tag-On) to that cluster, so that what one
    ///   cluster sends another arrives in the order the machine emitted it;
    /// * when the next bulk message would take it past [`wire::MAX_BUNDLE_BYTES`]
    ///   (a message longer than that is sent alone, after the bundle);
    /// * before a diff is applied or pages are flushed, when the bundles hold a lock or
    ///   barrier message: the barrier manager's departure to another cluster goes out
    ///   before the manager applies the updates of its own departure, so both clusters
    ///   apply theirs at the same time (EM3D: ≈ 40 updates of 4 KiB per phase each way),
    ///   and a grant leaves before the diffs that came with the release it follows are
    ///   applied;
    /// * at the end of the event's actions (the follow-up `Flushed` event's included),
    ///   still under the lock, so no later event's message to that cluster can
    ///   overtake it. Bundles leave in cluster order, so messages to *different*
    ///   clusters may leave in another order than emitted: the machine's calling
    ///   contract lets the network reorder messages. A held message's bytes were
    ///   encoded when its action executed (only Tag-On sends read the region, and
    ///   those are not held).
    ///
    /// Messages received while a send blocks go to `pending`, as for any send.
    fn handle_one(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        event: Event,
        attachment: Attached<'_>,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        // Slots whose owners sleep and must be woken once the machine is unlocked.
        let mut wake: Vec<u32> = Vec::new();
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let mut actions = std::mem::take(&mut st.actions);
            let (mut event, mut attachment) = (event, attachment);
            let mut result = Ok(());
            // A lock or barrier message waits in a bundle (see Bundling).
            let mut sync_held = false;
            // An action list that ends with a flush is followed by the flush's result
            // (the machine's calling contract), under the same lock.
            loop {
                actions.clear();
                if let Err(e) = st.machine.handle(event, &mut actions) {
                    result = Err(DsmError::Violation {
                        cluster: self.me,
                        source: e,
                    });
                    break;
                }
                let mut flushed = None;
                for a in actions.drain(..) {
                    if sync_held && matches!(a, Action::ApplyDiff { .. } | Action::Flush { .. }) {
                        // A grant or departure waits for no page work of this call.
                        sync_held = false;
                        if let Err(e) = self.send_bundles(ep, &mut st.outbox, pending) {
                            result = Err(e);
                            break;
                        }
                    }
                    let r = match a {
                        Action::Flush { pages } => {
                            self.flush(ops, st, &pages).map(|d| flushed = Some(d))
                        }
                        a => {
                            sync_held |= matches!(&a, Action::Send { msg, .. } if msg.is_sync());
                            self.execute(ops, ep, st, a, attachment, pending, &mut wake)
                        }
                    };
                    if let Err(e) = r {
                        result = Err(e);
                        break;
                    }
                }
                match flushed {
                    Some(diffs) if result.is_ok() => {
                        event = Event::Flushed { diffs };
                        attachment = None;
                    }
                    // An idle cached lock the machine wants back: the runtime releases
                    // it, under the same lock (a thread that found it gone asks the
                    // machine next, which must know it is free by then).
                    None if result.is_ok() && !st.reclaim.is_empty() => {
                        let lock = st.reclaim.pop().expect("checked non-empty");
                        event = Event::Release {
                            lock,
                            token: SyncToken(RUNTIME_TOKEN),
                        };
                        attachment = None;
                    }
                    _ => break,
                }
            }
            st.actions = actions;
            if result.is_ok() {
                result = self.send_bundles(ep, &mut st.outbox, pending);
            }
            // After a failure, what is still held is dropped: the job is failing.
            st.outbox.iter_mut().for_each(wire::Bundle::clear);
            st.reclaim.clear();
            if let Err(e) = result {
                drop(guard);
                self.fail_with(ep, &e);
                return Err(e);
            }
        }
        for slot in wake {
            self.wake_slot(ep, slot);
        }
        Ok(())
    }

    /// Sends a no-op to this cluster's own protocol queue: wakes every thread sleeping on
    /// its doorbell.
    pub(crate) fn ring_own_doorbell(&self, ep: &Endpoint) {
        let noop = Express::new(RuntimeOp::Noop.handler(), 0).expect("zero payload");
        // A full queue wakes sleepers by itself.
        let _ = ep.send_express(name(self.me), noop);
    }

    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        st: &mut State,
        action: Action,
        attachment: Attached<'_>,
        pending: &mut Pending,
        wake: &mut Vec<u32>,
    ) -> Result<(), DsmError> {
        let op_err = |source| DsmError::PageOp {
            cluster: self.me,
            source,
        };
        let idx = |p: PageId| PageIndex(p.index());
        let range = |r: multigrain_coherence::PageRange| {
            PageRange::new(PageIndex(r.start.index()), r.count as usize)
        };
        match action {
            Action::Send { to, msg } => {
                if matches!(msg, Message::BarrierArrive { .. }) {
                    self.barrier_arrival_sent
                        .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
                self.send_message(ops, ep, to.index(), &msg, pending, &mut st.outbox)
            }
            Action::Install {
                page,
                source,
                writable,
            } => {
                let prot = if writable {
                    Protection::Writable
                } else {
                    Protection::ReadOnly
                };
                let outcome = match source {
                    Source::Zero => ops.install_zero(idx(page), prot),
                    Source::Attached => {
                        let data: &[u8; PAGE_SIZE] = attachment
                            .and_then(|(_, d)| d.try_into().ok())
                            .ok_or_else(|| {
                                self.internal(format!("install of {page:?} without a page buffer"))
                            })?;
                        // UFFDIO_COPY straight from the received pool buffer: the page's
                        // only copy since the sender filled the buffer.
                        ops.install(idx(page), data, prot)
                    }
                }
                .map_err(op_err)?;
                if outcome == Install::AlreadyPresent {
                    return Err(self.internal(format!(
                        "{page:?} was present although the protocol had it missing"
                    )));
                }
                bump(&self.counters.pages_installed, 1);
                Ok(())
            }
            Action::MakeTwin { page } => {
                let mut twin = st.spare.pop().unwrap_or_else(|| Box::new([0; PAGE_SIZE]));
                ops.view_read(idx(page), &mut twin).map_err(op_err)?;
                st.twins.insert(page.get(), twin);
                Ok(())
            }
            Action::DropTwin { page } => {
                let twin = st
                    .twins
                    .remove(&page.get())
                    .ok_or_else(|| self.internal(format!("drop of {page:?} without a twin")))?;
                st.spare.push(twin);
                Ok(())
            }
            Action::ShareHomePage { to, page } => {
                self.share_home_page(ops, ep, st, to.index(), page, pending)
            }
            Action::Unprotect { page } => ops.unprotect(PageRange::one(idx(page))).map_err(op_err),
            Action::WriteProtect { pages } => ops.write_protect(range(pages)).map_err(op_err),
            Action::Invalidate { pages } => {
                ops.invalidate(range(pages)).map_err(op_err)?;
                bump(&self.counters.invalidations, u64::from(pages.count));
                bump(&self.counters.invalidate_calls, 1);
                Ok(())
            }
            Action::ApplyDiff { page, data, twin } => self.apply_diff(ops, st, page, &data, twin),
            Action::Flush { .. } => {
                Err(self.internal("a flush that is not the last action".into()))
            }
            Action::Wake { tokens, .. } => {
                for t in tokens {
                    if let Some(slot) = self.slots.complete(t.0) {
                        wake.push(slot);
                    }
                }
                Ok(())
            }
            Action::AcquireDone { lock, token } => {
                if st.machine.lock_cacheable(lock) {
                    self.lock_cache.adopt(lock.get());
                }
                if let Some(slot) = self.slots.complete(token.0) {
                    wake.push(slot);
                }
                Ok(())
            }
            Action::ReleaseDone { token, .. } if token.0 == RUNTIME_TOKEN => Ok(()),
            Action::LockWanted { lock } => {
                if self.lock_cache.want(lock.get()) == Wanted::ReleaseNow {
                    st.reclaim.push(lock);
                }
                Ok(())
            }
            Action::ReleaseDone { token, .. } | Action::BarrierDone { token } => {
                if let Some(slot) = self.slots.complete(token.0) {
                    wake.push(slot);
                }
                Ok(())
            }
        }
    }

    fn internal(&self, detail: String) -> DsmError {
        DsmError::Internal {
            cluster: self.me,
            detail,
        }
    }

    /// Sends `msg` to `to`, or holds it in `to`'s bundle (see [`Core::handle_one`]).
    fn send_message(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        to: usize,
        msg: &Message,
        pending: &mut Pending,
        outbox: &mut [wire::Bundle],
    ) -> Result<(), DsmError> {
        let bundle = outbox.get_mut(to).ok_or_else(|| {
            self.internal(format!(
                "a message to cluster {to} of a job of {}",
                self.clusters
            ))
        })?;
        match bundle.push_message(msg) {
            wire::Push::Added => return Ok(()),
            wire::Push::Full(part) => {
                self.send_bundle(ep, to, bundle, pending)?;
                bundle.push_part(part);
                return Ok(());
            }
            wire::Push::NotBulk => {}
        }
        match wire::outgoing(msg) {
            Some(Outgoing::Express { handler, payload }) => {
                self.send_held(ep, to, outbox, pending)?;
                self.send_express(ep, to, handler, payload, pending)
            }
            Some(Outgoing::Page { handler, tag, page }) => {
                self.send_held(ep, to, outbox, pending)?;
                let mut buf = self.alloc_buffer(ep, pending)?;
                let dst: &mut [u8; PAGE_SIZE] = (&mut buf.as_mut_capacity()[..PAGE_SIZE])
                    .try_into()
                    .expect("pool slots hold a page");
                // The one copy of the page on its way: from the master (or the writer's
                // copy) into the pool buffer, through the runtime view.
                ops.view_read(PageIndex(page as usize), dst)
                    .map_err(|source| DsmError::PageOp {
                        cluster: self.me,
                        source,
                    })?;
                buf.set_len(PAGE_SIZE);
                buf.set_tag(tag);
                self.send_tag_on(ep, to, handler, buf, pending)
            }
            // `push_message` above took every bulk message.
            None => Err(self.internal(format!(
                "a bulk {} message the bundle did not take",
                wire::op_name(msg.to_parts().opcode)
            ))),
        }
    }

    /// Sends the bulk messages held for `to`, if any.
    fn send_held(
        &self,
        ep: &Endpoint,
        to: usize,
        outbox: &mut [wire::Bundle],
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        match outbox.get_mut(to) {
            Some(bundle) => self.send_bundle(ep, to, bundle, pending),
            None => Ok(()),
        }
    }

    /// Sends every bundle held, in cluster order.
    fn send_bundles(
        &self,
        ep: &Endpoint,
        outbox: &mut [wire::Bundle],
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        for (to, bundle) in outbox.iter_mut().enumerate() {
            self.send_bundle(ep, to, bundle, pending)?;
        }
        Ok(())
    }

    /// Sends `bundle` to `to` as the next numbered [`RuntimeOp::Bundle`] (nothing if it
    /// is empty) and empties it. The per-kind counters count the messages inside.
    /// Called with the machine locked, so bundles to a cluster leave in the order of
    /// their numbers.
    fn send_bundle(
        &self,
        ep: &Endpoint,
        to: usize,
        bundle: &mut wire::Bundle,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let Some(data) = bundle.seal() else {
            return Ok(());
        };
        let sent = self
            .post_bulk(ep, to, RuntimeOp::Bundle.handler(), data, pending)
            .map(|()| {
                for &(h, len) in bundle.parts() {
                    bump(&self.counters.sent[usize::from(h.0)], 1);
                    bump(&self.counters.sent_bytes[usize::from(h.0)], len as u64);
                }
                bump(&self.counters.bundles_sent, 1);
                bump(&self.counters.bundled_sent, bundle.parts().len() as u64);
            });
        bundle.clear();
        sent
    }

    fn send_error(&self, to: usize, what: &'static str, reason: String) -> DsmError {
        DsmError::Send {
            cluster: self.me,
            to,
            what,
            reason,
        }
    }

    /// Waited too long on a send or a buffer, with the machine locked: is every cluster
    /// still alive? (Messages queued meanwhile are kept for later, not handled here.)
    fn send_stalled(
        &self,
        ep: &Endpoint,
        pending: &mut Pending,
        context: &dyn Fn() -> String,
    ) -> Result<(), DsmError> {
        if self.is_failed() {
            return Err(self.failure_error(Some(context())));
        }
        let Some(f) = self.peer_failure() else {
            return Ok(());
        };
        while let Some(m) = ep.try_recv() {
            pending.push(m);
        }
        self.record_failure(ep, f, true);
        Err(self.failure_error(Some(context())))
    }

    /// The liveness oracle's report, unless it names this cluster or one that finished.
    fn peer_failure(&self) -> Option<Failure> {
        let (cluster, reason) = self.liveness.failure()?;
        // A failure of this cluster that it did not record itself was declared by the
        // job (the progress watchdog, or a coordinator that stopped hearing from it):
        // this cluster stops too.
        let ours = cluster == self.me && !self.is_failed();
        ((cluster != self.me || ours) && !self.peer_finished(cluster))
            .then_some(Failure { cluster, reason })
    }

    fn send_express(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        payload: u64,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let mut msg = Express::new(handler, payload)
            .map_err(|e| self.send_error(to, wire::op_name(handler.0), e.to_string()))?;
        let before = ep.network_sent();
        loop {
            match ep.send_express_blocking(name(to), msg, Some(self.tuning.send_slice), |m| {
                pending.push(m)
            }) {
                Ok(()) => {
                    self.note_sent(ep, before);
                    bump(&self.counters.sent[usize::from(handler.0)], 1);
                    return Ok(());
                }
                Err(SendError::Timeout(m)) => {
                    msg = m;
                    self.send_stalled(ep, pending, &|| format!("sending to cluster {to}"))?;
                }
                Err(e) => {
                    return Err(self.send_error(to, wire::op_name(handler.0), e.to_string()));
                }
            }
        }
    }

    fn alloc_buffer(&self, ep: &Endpoint, pending: &mut Pending) -> Result<TagOnBuf, DsmError> {
        let mut since = Instant::now();
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match ep.alloc() {
                Ok(b) => return Ok(b),
                Err(_) => {
                    // Our buffers come back as the receivers handle them; keep our own
                    // queue moving meanwhile.
                    while let Some(m) = ep.try_recv() {
                        pending.push(m);
                    }
                    if since.elapsed() >= self.tuning.send_slice {
                        self.send_stalled(ep, pending, &|| {
                            "waiting for a free message buffer".into()
                        })?;
                        since = Instant::now();
                    }
                    // Sleep once spinning is over: a real-time protocol thread that only
                    // yielded would keep the threads that free buffers off its CPU.
                    if backoff.is_completed() {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        backoff.snooze();
                    }
                }
            }
        }
    }

    fn send_tag_on(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        buf: TagOnBuf,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let mut data: TagOnData = buf.freeze();
        let before = ep.network_sent();
        loop {
            match ep.send_tag_on_blocking(
                name(to),
                handler,
                data,
                Some(self.tuning.send_slice),
                |m| pending.push(m),
            ) {
                Ok(()) => {
                    self.note_sent(ep, before);
                    bump(&self.counters.sent[usize::from(handler.0)], 1);
                    return Ok(());
                }
                Err(SendError::Timeout(d)) => {
                    data = d;
                    self.send_stalled(ep, pending, &|| format!("sending to cluster {to}"))?;
                }
                Err(e) => {
                    return Err(self.send_error(to, wire::op_name(handler.0), e.to_string()));
                }
            }
        }
    }

    /// Sends one bulk message and counts it.
    fn send_bulk(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        data: &[u8],
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        self.post_bulk(ep, to, handler, data, pending)?;
        bump(&self.counters.sent[usize::from(handler.0)], 1);
        bump(
            &self.counters.sent_bytes[usize::from(handler.0)],
            data.len() as u64,
        );
        Ok(())
    }

    /// Sends one bulk message (uncounted).
    fn post_bulk(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        data: &[u8],
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let before = ep.network_sent();
        loop {
            match ep.send_bulk(name(to), handler, data, Some(self.tuning.send_slice), |m| {
                pending.push(m)
            }) {
                Ok(()) => {
                    self.note_sent(ep, before);
                    return Ok(());
                }
                // Fragments already sent are discarded by the receiver; send it all again.
                Err(BulkSendError::Pool(_)) | Err(BulkSendError::Send(SendError::Timeout(()))) => {
                    self.send_stalled(ep, pending, &|| format!("sending to cluster {to}"))?;
                }
                Err(e) => {
                    return Err(self.send_error(to, wire::op_name(handler.0), e.to_string()));
                }
            }
        }
    }

    /// Sends a runtime bulk message (statistics) to `to`.
    pub(crate) fn send_runtime_bulk(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        to: usize,
        op: RuntimeOp,
        data: &[u8],
    ) -> Result<(), DsmError> {
        let mut pending = Pending::default();
        self.send_bulk(ep, to, op.handler(), data, &mut pending)?;
        self.drain_pending(ops, ep, &mut pending)
    }

    /// Executes a flush: diffs each page against its twin (through the runtime view,
    /// which never faults), then refreshes the twin to exactly the contents diffed
    /// (`keep_open`) or discards it (the page was write-protected by an earlier
    /// action). A word a local thread writes meanwhile is read as its old or its new
    /// value; a new value lands in both diff and twin, an old one shows up in the next
    /// flush.
    fn flush(
        &self,
        ops: &RegionOps,
        st: &mut State,
        pages: &[FlushPage],
    ) -> Result<Vec<DiffBytes>, DsmError> {
        let mut diffs = Vec::with_capacity(pages.len());
        for fp in pages {
            let key = fp.page.get();
            let twin = st
                .twins
                .get_mut(&key)
                .ok_or_else(|| self.internal(format!("flush of {:?} without a twin", fp.page)))?;
            ops.view_read(PageIndex(fp.page.index()), &mut st.scratch)
                .map_err(|source| DsmError::PageOp {
                    cluster: self.me,
                    source,
                })?;
            // Encoded into a buffer with room for the largest diff (a vector grown by
            // doubling took ten reallocations for a page rewritten whole): an unchanged
            // page allocates nothing, a small diff is copied out, a large one takes the
            // buffer along.
            st.diff_buf.clear();
            diff::encode(&twin[..], &st.scratch[..], &mut st.diff_buf)
                .map_err(|e| self.internal(format!("diff of {:?}: {e}", fp.page)))?;
            let out = if st.diff_buf.len() < diff::MAX_ENCODED / 2 {
                st.diff_buf.clone()
            } else {
                std::mem::replace(&mut st.diff_buf, Vec::with_capacity(diff::MAX_ENCODED))
            };
            if fp.keep_open {
                if !out.is_empty() {
                    // The contents just diffed become the twin; the old twin, the next
                    // scratch buffer (no copy).
                    std::mem::swap(twin, &mut st.scratch);
                }
            } else if let Some(t) = st.twins.remove(&key) {
                st.spare.push(t);
            }
            diffs.push(DiffBytes::new(out));
        }
        Ok(diffs)
    }

    /// Sends a private home page's first copy to `to` and makes the same copy its
    /// twin (see [`Action::ShareHomePage`]).
    fn share_home_page(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        st: &mut State,
        to: usize,
        page: PageId,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        self.send_held(ep, to, &mut st.outbox, pending)?;
        let mut buf = self.alloc_buffer(ep, pending)?;
        let dst: &mut [u8; PAGE_SIZE] = (&mut buf.as_mut_capacity()[..PAGE_SIZE])
            .try_into()
            .expect("pool slots hold a page");
        ops.view_read(PageIndex(page.index()), dst)
            .map_err(|source| DsmError::PageOp {
                cluster: self.me,
                source,
            })?;
        let mut twin = st.spare.pop().unwrap_or_else(|| Box::new([0; PAGE_SIZE]));
        twin.copy_from_slice(&dst[..]);
        st.twins.insert(page.get(), twin);
        let parts = Message::PageData {
            page,
            writable: false,
            zero: false,
        }
        .to_parts();
        buf.set_len(PAGE_SIZE);
        buf.set_tag(parts.payload);
        self.send_tag_on(ep, to, Handler(parts.opcode), buf, pending)
    }

    /// Applies an encoded diff to a page through the runtime view (only the diff's
    /// words are stored, so the protection application threads see is unchanged and
    /// their concurrent writes to other words survive), and to its twin when `twin`.
    fn apply_diff(
        &self,
        ops: &RegionOps,
        st: &mut State,
        page: PageId,
        data: &DiffBytes,
        twin: bool,
    ) -> Result<(), DsmError> {
        let data = data.as_slice();
        diff::validate(data, PAGE_SIZE)
            .map_err(|e| self.internal(format!("diff of {page:?}: {e}")))?;
        let p = PageIndex(page.index());
        if twin {
            let t = st.twins.get_mut(&page.get()).ok_or_else(|| {
                self.internal(format!("diff for the twin of {page:?}, which has none"))
            })?;
            diff::apply(&mut t[..], data)
                .map_err(|e| self.internal(format!("diff of {page:?}: {e}")))?;
        }
        // Run encoding of `multigrain_coherence::diff` (validated above): a 4-byte LE
        // header, bits 0..16 the first word and 16..32 the word count, then the words.
        let mut pos = 0;
        while pos < data.len() {
            let h = u32::from_le_bytes(data[pos..pos + 4].try_into().expect("4 bytes"));
            let (first, words) = ((h & 0xffff) as usize, (h >> 16) as usize);
            pos += 4;
            ops.view_write_words(p, first, &data[pos..pos + words * 8])
                .map_err(|source| DsmError::PageOp {
                    cluster: self.me,
                    source,
                })?;
            pos += words * 8;
        }
        Ok(())
    }

    // ----- receiving ---------------------------------------------------------------

    /// Handles one received message and everything received while handling it.
    pub(crate) fn dispatch(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        m: Received,
    ) -> Result<(), DsmError> {
        let t0 = Instant::now();
        let mut pending = Pending::default();
        let r = self
            .dispatch_one(ops, ep, Incoming::Msg(m), &mut pending)
            .and_then(|()| self.drain_pending(ops, ep, &mut pending));
        bump(&self.counters.dispatched, 1);
        bump(&self.counters.dispatch_ns, t0.elapsed().as_nanos() as u64);
        r
    }

    fn dispatch_one(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        m: Incoming,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let (from, handler) = match &m {
            Incoming::Msg(m) => (usize::from(m.source().get()), m.handler()),
            Incoming::Copied {
                source, handler, ..
            } => (*source, *handler),
        };
        let malformed = |reason: String| DsmError::Malformed {
            cluster: self.me,
            from,
            reason,
        };
        if from >= self.clusters {
            return Err(malformed(format!("source id {from} is not a cluster")));
        }
        let bundle = handler == RuntimeOp::Bundle.handler();
        if !bundle {
            // A bundle's messages are counted one by one below.
            bump(&self.counters.received[usize::from(handler.0)], 1);
        }
        let m = match m {
            Incoming::Msg(m) => m,
            Incoming::Copied { tag, data, .. } => {
                return self.protocol_message(
                    ops,
                    ep,
                    from,
                    handler,
                    tag,
                    None,
                    Some(&data),
                    pending,
                );
            }
        };
        if bundle {
            return self.bundle_message(ops, ep, from, m, pending);
        }
        if let Some(op) = RuntimeOp::from_handler(handler) {
            return self.runtime_message(ep, op, from, m);
        }
        match m {
            Received::Express(e) => {
                self.protocol_message(ops, ep, from, handler, e.payload, None, None, pending)
            }
            Received::TagOn(t) => self.protocol_message(
                ops,
                ep,
                from,
                handler,
                t.data.tag(),
                None,
                Some(t.data.as_slice()),
                pending,
            ),
            // Every bulk coherence message travels in a numbered bundle, so that the
            // receiver can handle them in the order sent.
            Received::Bulk(_) => Err(malformed(format!(
                "a bulk {} message outside a bundle",
                wire::op_name(handler.0)
            ))),
            Received::Basic(_) => Err(malformed("the DSM protocol sends no Basic messages".into())),
        }
    }

    /// Handles a received [`RuntimeOp::Bundle`] in its sender's order: if it is the
    /// sender's next one, handles it and then every later one already received (see
    /// [`super::reseq`]); otherwise leaves it to the thread that handles its
    /// predecessor.
    fn bundle_message(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        from: usize,
        m: Received,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let malformed = |reason: String| self.malformed_bundle(from, reason);
        let Received::Bulk(b) = m else {
            return Err(malformed("wrong message kind".into()));
        };
        let seq = wire::bundle_seq(&b.data)
            .ok_or_else(|| malformed(format!("{} bytes, no sequence number", b.data.len())))?;
        let offer = self.reseq[from]
            .lock()
            .offer(seq, b.data)
            .map_err(malformed)?;
        let Offer::Take(mut data) = offer else {
            return Ok(());
        };
        loop {
            self.bundle_parts(ops, ep, from, &data, pending)?;
            match self.reseq[from].lock().done() {
                Some(next) => data = next,
                None => return Ok(()),
            }
        }
    }

    /// The error for a bundle from `from` that cannot be right.
    fn malformed_bundle(&self, from: usize, reason: String) -> DsmError {
        DsmError::Malformed {
            cluster: self.me,
            from,
            reason: format!("Bundle: {reason}"),
        }
    }

    /// Checks all of a bundle body from `from`, then handles its messages in order,
    /// each as a bulk message received alone from `from`.
    fn bundle_parts(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        from: usize,
        data: &[u8],
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let parts = wire::decode_bundle(data).map_err(|r| self.malformed_bundle(from, r))?;
        bump(&self.counters.bundles_received, 1);
        bump(&self.counters.bundled_received, parts.len() as u64);
        for p in parts {
            bump(&self.counters.received[usize::from(p.handler.0)], 1);
            self.protocol_message(
                ops,
                ep,
                from,
                p.handler,
                p.payload,
                Some(p.body),
                None,
                pending,
            )?;
        }
        Ok(())
    }

    /// Decodes a coherence message and hands it to the machine.
    #[allow(clippy::too_many_arguments)]
    fn protocol_message(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        from: usize,
        handler: Handler,
        payload: u64,
        bulk: Option<&[u8]>,
        data: Option<&[u8]>,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let msg = Message::from_parts(handler.0, payload, bulk)
            .map_err(|e| DsmError::malformed(self.me, from, e))?;
        wire::check_attachment(&msg, data).map_err(|reason| DsmError::Malformed {
            cluster: self.me,
            from,
            reason,
        })?;
        let event = Event::Message {
            from: ClusterId::new(from as u16).expect("below the cluster count"),
            msg,
            attached_len: data.map_or(0, <[u8]>::len),
        };
        self.handle_one(ops, ep, event, data.map(|d| (from, d)), pending)
    }

    fn runtime_message(
        &self,
        ep: &Endpoint,
        op: RuntimeOp,
        from: usize,
        m: Received,
    ) -> Result<(), DsmError> {
        let malformed = |reason: &str| DsmError::Malformed {
            cluster: self.me,
            from,
            reason: format!("{}: {reason}", wire::op_name(op as u8)),
        };
        match (op, m) {
            (RuntimeOp::Noop, _) => Ok(()),
            (RuntimeOp::Hello, Received::Express(e)) => {
                self.hellos.lock()[from] = Some(e.payload);
                Ok(())
            }
            (RuntimeOp::Abort, Received::Bulk(b)) => {
                let (c, reason) = b
                    .data
                    .split_first_chunk::<2>()
                    .ok_or_else(|| malformed("truncated"))?;
                let cluster = usize::from(u16::from_le_bytes(*c));
                let reason = String::from_utf8_lossy(reason);
                self.record_failure(
                    ep,
                    Failure {
                        cluster,
                        reason: format!("{reason} (reported by cluster {from})"),
                    },
                    false,
                );
                Ok(())
            }
            (RuntimeOp::Stats, Received::Bulk(b)) => {
                let stats: ClusterStats =
                    serde_json::from_slice(&b.data).map_err(|e| malformed(&e.to_string()))?;
                self.peer_stats.lock()[from] = Some(stats);
                Ok(())
            }
            _ => Err(malformed("wrong message kind")),
        }
    }

    // ----- waiting -----------------------------------------------------------------

    /// Waits until wait `seq` of `slot` completes, handling every message that arrives
    /// meanwhile (see the module documentation).
    pub(crate) fn wait(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        slot: u32,
        seq: u32,
        context: &dyn Fn() -> String,
    ) -> Result<(), DsmError> {
        let s = self.slots.get(slot);
        if s.is_done(seq) {
            return Ok(());
        }
        let _waiting = self.waits.enter(context());
        let _counted = Counted::enter(&self.waiting);
        let start = Instant::now();
        let spin_until = start + self.tuning.spin;
        let mut next_check = start + self.tuning.liveness_period;
        let mut busy = self.tuning.busy_polls;
        loop {
            if s.is_done(seq) {
                return Ok(());
            }
            self.note_poll();
            if let Some(m) = ep.try_recv() {
                self.dispatch(ops, ep, m)?;
                continue;
            }
            if busy > 0 {
                // The reply to a request usually comes within microseconds: poll
                // without giving the CPU away first (a yield to another runnable thread
                // costs a context switch each way).
                busy -= 1;
                std::hint::spin_loop();
                continue;
            }
            if self.is_failed() {
                return Err(self.failure_error(Some(context())));
            }
            let now = Instant::now();
            // More waiting threads than CPUs (hundreds of compute threads per core):
            // yielding ones would keep every core busy and starve the threads that
            // produce what they wait for, so they sleep at once.
            let crowded = self.waiting.load(Ordering::Relaxed) > self.cpus;
            if now < spin_until && !crowded {
                // Then yield rather than burn the core: with more runnable threads than
                // cores (compute threads of several clusters on one machine) the thread
                // that will produce our message may be waiting for this very core.
                std::thread::yield_now();
                continue;
            }
            if now >= next_check {
                self.check_liveness(ops, ep, context)?;
                next_check = now + self.tuning.liveness_period;
            }
            let slept = Instant::now();
            // At most one thread per CPU sleeps on the doorbell, serving the protocol
            // queue when it rings; the others park until their own completion. Every
            // message rings the doorbell, which wakes all its sleepers: with 256
            // sleepers per cluster each message cost 256 wake-ups and the cores did
            // little else (Water 8 × 1 on 2 × 256 threads took minutes).
            if self.doorbell_sleepers.fetch_add(1, Ordering::SeqCst) >= self.cpus {
                self.doorbell_sleepers.fetch_sub(1, Ordering::SeqCst);
                if s.prepare_park(seq) {
                    return Ok(());
                }
                std::thread::park_timeout(self.tuning.liveness_period.max(self.tuning.slice));
                s.awake();
                bump(&self.counters.sleeps, 1);
                bump(&self.counters.sleep_ns, slept.elapsed().as_nanos() as u64);
                continue;
            }
            if s.prepare_sleep(seq) {
                self.doorbell_sleepers.fetch_sub(1, Ordering::SeqCst);
                return Ok(());
            }
            let m = ep.recv_timeout(self.tuning.slice);
            self.doorbell_sleepers.fetch_sub(1, Ordering::SeqCst);
            s.awake();
            bump(&self.counters.sleeps, 1);
            bump(&self.counters.sleep_ns, slept.elapsed().as_nanos() as u64);
            if let Some(m) = m {
                self.dispatch(ops, ep, m)?;
            }
        }
    }

    /// Passes a synchronization event (built from its token) to the machine and waits
    /// for its completion.
    pub(crate) fn sync(
        self: &Arc<Self>,
        ops: &RegionOps,
        event: impl FnOnce(SyncToken) -> Event,
        context: &dyn Fn() -> String,
    ) -> Result<(), DsmError> {
        if self.is_failed() {
            return Err(self.failure_error(Some(context())));
        }
        self.with_thread(|slot, ep| {
            self.serve_arrived(ops, ep)?;
            let s = self.slots.get(slot);
            let seq = s.next_seq();
            self.handle(ops, ep, event(SyncToken(token(slot, seq))), None)?;
            self.wait(ops, ep, slot, seq, context)
        })
    }

    /// Serves a fault of the calling thread (see [`Resolver`]).
    fn fault(self: &Arc<Self>, ops: &RegionOps, fault: Fault) -> Result<(), DsmError> {
        let t0 = Instant::now();
        let write = fault.access == Access::Write || fault.kind == FaultKind::WriteProtect;
        let page = PageId::new(fault.page.0 as u32).ok_or_else(|| {
            self.internal(format!(
                "fault on {} beyond the protocol's pages",
                fault.page
            ))
        })?;
        bump(
            if write {
                &self.counters.write_faults
            } else {
                &self.counters.read_faults
            },
            1,
        );
        let waited = self.with_thread(|slot, ep| {
            let s = self.slots.get(slot);
            let seq = s.next_seq();
            let token = FaultToken(token(slot, seq));
            let event = if write {
                Event::WriteFault { page, token }
            } else {
                Event::ReadFault { page, token }
            };
            self.handle(ops, ep, event, None)?;
            if s.is_done(seq) {
                return Ok(false);
            }
            let what = if write { "write" } else { "read" };
            self.wait(ops, ep, slot, seq, &|| {
                format!("serving a {what} fault on page {}", page.get())
            })?;
            Ok(true)
        })?;
        let ns = t0.elapsed().as_nanos() as u64;
        bump(&self.counters.fault_ns, ns);
        if waited {
            bump(&self.counters.remote_faults, 1);
            bump(&self.counters.remote_fault_ns, ns);
        }
        Ok(())
    }

    // ----- statistics --------------------------------------------------------------

    pub(crate) fn snapshot(&self) -> ClusterStats {
        // Under the machine lock: an event's sends (its bundles included) are made and
        // counted, by their thread, before the lock is released, so the per-thread
        // counts and the message layer's agree (a thread woken by an event's completion
        // can read them while that event still sends).
        let (protocol, by_thread, layer) = {
            let st = self.state.lock();
            (
                ProtocolStats::from(*st.machine.stats()),
                self.sent_by_thread.snapshot(),
                LayerStats::from(self.site.stats()),
            )
        };
        let mut s = ClusterStats {
            realtime_protocol_threads: u64::from(self.realtime.load(Ordering::Relaxed)),
            ..self.counters.snapshot(self.me, protocol, layer)
        };
        let cached = self.slots.runtime_acquires();
        s.lock_acquires += cached;
        s.lock_local_handoffs += cached;
        s.lock_runtime_acquires = cached;
        (
            s.messages_sent_by_thread,
            s.messages_sent_by_protocol_thread,
            s.messages_sent_by_other_threads,
        ) = by_thread;
        s
    }

    /// Takes `lock` for the calling thread from the runtime's lock cache, if it is
    /// there idle (see [`LockCache`]); `false`: ask the machine ([`Core::sync`]).
    ///
    /// First serves what has arrived on the protocol queue, as [`Core::sync`] does: a
    /// thread that keeps taking a cached lock (a holder waiting for its turn, say) must
    /// see the other cluster's recall of it, or the lock stays here until the protocol
    /// thread gets a CPU (measured with `bench dsm`'s hand-off, 2 vCPUs: 3.3 acquires
    /// per hand-off over shared memory and 12 over UDP without this, 1.4 and 2.6 before
    /// the cache).
    ///
    /// # Errors
    /// As [`Core::dispatch`] (a message that cannot be handled).
    #[inline]
    pub(crate) fn try_cached_acquire(
        self: &Arc<Self>,
        ops: &RegionOps,
        lock: u32,
    ) -> Result<bool, DsmError> {
        if self.is_failed() {
            return Ok(false);
        }
        self.with_thread(|slot, ep| {
            self.serve_arrived(ops, ep)?;
            if !self.lock_cache.try_acquire(lock) {
                return Ok(false);
            }
            self.slots.get(slot).note_runtime_acquire();
            Ok(true)
        })
    }

    /// Counts what `ep` handed to the network since its count was `before` as the
    /// calling thread's (paper 001's m; see [`SentByThread`]).
    #[inline]
    pub(crate) fn note_sent(&self, ep: &Endpoint, before: u64) {
        self.sent_by_thread
            .note_sent(ep.network_sent().wrapping_sub(before));
    }

    /// Handles what has arrived on the protocol queue, before a synchronization: a
    /// thread that keeps taking a lock cached in its cluster never waits, so it must
    /// notice a recall of that lock itself (with every thread busy, the protocol thread
    /// may not run for a while).
    ///
    /// # Errors
    /// As [`Core::dispatch`].
    fn serve_arrived(&self, ops: &RegionOps, ep: &Endpoint) -> Result<(), DsmError> {
        self.note_poll();
        while let Some(m) = ep.try_recv() {
            self.dispatch(ops, ep, m)?;
        }
        Ok(())
    }

    /// Notes that a thread of this cluster is polling the protocol queue from inside
    /// the runtime (see [`Core::serve`]).
    #[inline]
    pub(crate) fn note_poll(&self) {
        // Read-mostly: the line is written only after the protocol thread cleared it.
        if !self.polled.load(Ordering::Relaxed) {
            self.polled.store(true, Ordering::Relaxed);
        }
    }

    /// Serves the protocol queue until `stop` is set (the protocol thread's loop).
    ///
    /// The cluster's own threads poll the queue whenever they are in the runtime
    /// (every lock operation, fault and barrier, and all the time while they wait), so
    /// while one of them polled during its last nap of [`Tuning::handover`] the
    /// protocol thread only naps again (not registered on the queue's doorbell: senders
    /// pay no wake-up, and it takes no CPU from them). Once the cluster's threads have
    /// been away for a whole nap — they compute, or sleep — it serves: it handles what
    /// is queued, polls (yielding) for `spin` after the last message it handled, then
    /// sleeps in the message layer's blocking receive, woken by the next message. (Measured on Water 512 × 50, 2×1
    /// over shared memory: a protocol thread spinning after every message, as before,
    /// took a quarter of each core; one always asleep on the doorbell made every
    /// message a futex wake-up; see the README.)
    ///
    /// `thread_index` is the protocol thread's index for the `static` INI policy.
    pub(crate) fn serve(&self, ops: &RegionOps, spin: Duration, thread_index: usize) {
        let ep = self.new_endpoint(Duration::ZERO);
        ep.set_thread_index(thread_index);
        super::slots::set_protocol_thread();
        let mut reported = false;
        let mut last = Instant::now();
        let mut handle = |m, last: &mut Instant| {
            *last = Instant::now();
            if let Err(e) = self.dispatch(ops, &ep, m)
                && !reported
            {
                reported = true;
                self.fail_with(&ep, &e);
                tracing::error!("cluster {}: protocol thread: {e}", self.me);
            }
        };
        while !self.stop.load(Ordering::Acquire) {
            if let Some(m) = ep.try_recv() {
                handle(m, &mut last);
                continue;
            }
            if self.polled.swap(false, Ordering::Relaxed) {
                std::thread::sleep(self.tuning.handover);
                continue;
            }
            if last.elapsed() < spin {
                std::thread::yield_now();
                continue;
            }
            if let Some(m) = ep.recv_timeout(Duration::from_millis(100)) {
                handle(m, &mut last);
            }
        }
    }
}

/// The fault resolver of a cluster's region: serves each fault on the faulting thread.
pub(crate) struct Resolver {
    pub(crate) core: Arc<Core>,
}

impl FaultResolver for Resolver {
    fn resolve(&self, region: &RegionOps, fault: Fault) {
        if let Err(e) = self.core.fault(region, fault) {
            let _ = self.core.with_thread(|_, ep| {
                self.core.fail_with(ep, &e);
                Ok(())
            });
            fatal_fault(self.core.me, fault.page.0, &e);
        }
    }
}

/// The faulting access cannot continue: report and end the process.
fn fatal_fault(cluster: usize, page: usize, e: &DsmError) -> ! {
    // Another cluster's failure is not this cluster's: exit as every cluster does that
    // stops because of another (so that launchers tell the cause from the consequences).
    let code = if e.blamed_cluster() == cluster {
        FAULT_EXIT_CODE
    } else {
        multigrain_messaging::control::EXIT_PEER_FAILED
    };
    let msg = format!(
        "multigrain-dsm: cluster {cluster}: the page fault on page {page} cannot be served: {e}; \
         exiting with status {code}\n"
    );
    // SAFETY: write(2) of a buffer we own to standard error; async-signal-safe. The
    // standard library's stderr lock is not taken (the interrupted code may hold it).
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    // SAFETY: _exit(2) ends the process at once without running any handler.
    unsafe { libc::_exit(code) }
}

/// Counts a thread in a counter for as long as the guard lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn enter(counter: &'a AtomicUsize) -> Counted<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        Counted(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
