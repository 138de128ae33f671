//! The engine of one cluster: its coherence machine, how events are handled and actions
//! executed, how received messages are dispatched, and how a thread waits.
//!
//! This module holds the shared state ([`Core`]), the threads' endpoints and failure
//! handling; [`execute`] hands events to the machine and executes its actions, [`send`]
//! sends (bundles per destination, Express, Tag-On, bulk), [`receive`] dispatches what
//! arrives, [`wait`] is how threads wait and the protocol thread serves, and [`fault`]
//! serves page faults.
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

mod execute;
mod fault;
mod receive;
mod send;
mod wait;

pub(crate) use fault::Resolver;

use super::lock_cache::{LockCache, Wanted};
use super::reseq::{Offer, Resequencer};
use super::slots::{RUNTIME_TOKEN, SentByThread, SlotRef, Slots, thread_slot, token};
use super::twins::Twins;
use super::watch::Waits;
use crate::error::DsmError;
use crate::event_profile::{ActionKind, Profiler};
use crate::pieces::{self, Assembly};
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
    VirtualName,
};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::FastInstant;

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
    /// The most times a waiting thread polls without yielding its CPU (about 20 ns
    /// each when nothing arrives); each thread adapts its own number below it (see
    /// `runtime::spin`).
    pub(crate) busy_polls: u32,
    /// How long a waiting thread polls (yielding once its busy polls found nothing)
    /// before it sleeps on the doorbell.
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
    /// Twins by page, and the scratch page that holds a page's current contents while
    /// its diff is encoded.
    twins: Twins,
    /// The diff being encoded, with room for the largest ([`diff::MAX_ENCODED`]).
    diff_buf: Vec<u8>,
    /// Bulk messages held back by the event being handled, by destination cluster (see
    /// [`Core::handle_one`]); all empty between events.
    outbox: Vec<wire::Bundle>,
    /// Idle cached locks the machine wants back, to be released through it in the
    /// same call (see [`LockCache`]); empty between events.
    reclaim: Vec<LockId>,
    /// The handling time by kind of event and action, with `dsm.event_profile`.
    profile: Option<Box<Profiler>>,
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
    /// Each sender's bundle sent in pieces, being put back together (by sender; only
    /// the thread handling that sender's bundles in order touches it, see `reseq`).
    assembly: Vec<Mutex<Assembly>>,
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
    pub(crate) epoch: FastInstant,
    /// When this cluster's last barrier arrival left for the barrier manager, or was
    /// delivered to it here when this cluster is the manager (ns since `epoch`).
    pub(crate) barrier_arrival_sent: std::sync::atomic::AtomicU64,
    /// Set by a thread of this cluster that polls the protocol queue from inside the
    /// runtime, cleared by the protocol thread: while it keeps being set, the protocol
    /// thread leaves the queue to them (see [`Core::serve`]).
    pub(crate) polled: CachePadded<AtomicBool>,
    /// Whether the protocol thread runs at real-time priority (see `multigrain_messaging::sched`).
    pub(crate) realtime: AtomicBool,
    /// The protocol thread's CPUs where it was bound apart from the process
    /// ([`crate::DsmOptions::protocol_cpus`]), as the kernel lists them; empty otherwise.
    pub(crate) protocol_cpus: std::sync::OnceLock<String>,
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
                twins: Twins::new(),
                diff_buf: Vec::with_capacity(diff::MAX_ENCODED),
                outbox: (0..clusters).map(|_| wire::Bundle::default()).collect(),
                reclaim: Vec::new(),
                profile: None,
            }),
            slots: Slots::new(),
            sent_by_thread: SentByThread::new(threads[me]),
            lock_cache: LockCache::new(MAX_LOCKS),
            reseq: (0..clusters).map(|_| Mutex::default()).collect(),
            assembly: (0..clusters).map(|_| Mutex::default()).collect(),
            liveness,
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            hellos: Mutex::new(vec![None; clusters]),
            peer_stats: Mutex::new(vec![None; clusters]),
            tuning,
            epoch: FastInstant::now(),
            barrier_arrival_sent: std::sync::atomic::AtomicU64::new(0),
            polled: CachePadded::new(AtomicBool::new(false)),
            realtime: AtomicBool::new(false),
            protocol_cpus: std::sync::OnceLock::new(),
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
        self.fail_on_peer_failure(ep, context, |m| {
            let _ = self.dispatch(ops, ep, m);
        })
    }

    /// Fails if this cluster has failed or the liveness oracle reports another's
    /// failure ([`Core::peer_failure`]); in the second case the messages already queued
    /// on `ep` go to `queued` first (handled, or kept for later), then the failure is
    /// recorded and broadcast.
    pub(super) fn fail_on_peer_failure(
        &self,
        ep: &Endpoint,
        context: &dyn Fn() -> String,
        mut queued: impl FnMut(Received),
    ) -> Result<(), DsmError> {
        if self.is_failed() {
            return Err(self.failure_error(Some(context())));
        }
        let Some(f) = self.peer_failure() else {
            return Ok(());
        };
        while let Some(m) = ep.try_recv() {
            queued(m);
        }
        self.record_failure(ep, f, true);
        Err(self.failure_error(Some(context())))
    }

    /// This cluster's statistics now: the runtime's counters, the machine's and the
    /// message layer's, and the messages sent by each thread.
    pub(crate) fn snapshot(&self) -> ClusterStats {
        // Under the machine lock: an event's sends (its bundles included) are made and
        // counted, by their thread, before the lock is released, so the per-thread
        // counts and the message layer's agree (a thread woken by an event's completion
        // can read them while that event still sends).
        let (protocol, by_thread, layer, event_profile) = {
            let st = self.state.lock();
            (
                ProtocolStats::from(*st.machine.stats()),
                self.sent_by_thread.snapshot(),
                LayerStats::from(self.site.stats()),
                st.profile.as_ref().map(|p| p.snapshot()),
            )
        };
        let mut s = ClusterStats {
            realtime_protocol_threads: u64::from(self.realtime.load(Ordering::Relaxed)),
            protocol_cpus: self.protocol_cpus.get().cloned().unwrap_or_default(),
            event_profile,
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

    /// Starts timing the handling of every event and action (`dsm.event_profile`; see
    /// [`crate::EventProfile`]).
    pub(crate) fn enable_event_profile(&self) {
        self.state.lock().profile = Some(Box::new(Profiler::new()));
    }

    /// Counts what `ep` handed to the network since its count was `before` as the
    /// calling thread's (paper 001's m; see [`SentByThread`]).
    #[inline]
    pub(crate) fn note_sent(&self, ep: &Endpoint, before: u64) {
        self.sent_by_thread
            .note_sent(ep.network_sent().wrapping_sub(before));
    }
}
