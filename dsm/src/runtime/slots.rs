//! Per-thread waiting state: each thread that uses a cluster's runtime owns a *slot*
//! (its endpoint on the protocol queue and a completion word). A fault, acquire,
//! release or barrier of that thread carries a token naming the slot and a sequence
//! number; whoever executes the machine's `Wake`/`*Done` action stores the sequence
//! number into the slot, and the owner, polling, sees it.
//!
//! A thread finds its slot through a thread-local table (one entry per runtime it has
//! used), so the `SIGBUS` handler needs no argument to find it. Slots go back to the
//! runtime's free list when the thread exits; their endpoints are kept for reuse.

use super::core::Core;
use super::spin::{ADAPTIVE_KINDS, SpinBudget, WaitKind};
use crossbeam_utils::CachePadded;
use multigrain_messaging::Endpoint;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::Thread;

/// Threads of one process that may use one runtime at the same time.
pub(crate) const MAX_THREADS: usize = 1024;

/// One thread's waiting state.
pub(crate) struct Slot {
    /// The thread's handle on the protocol queue (created on first use, kept for the
    /// next owner of the slot).
    pub(crate) ep: Mutex<Option<Endpoint>>,
    /// Sequence number of the last completed wait.
    done: AtomicU32,
    /// The owner sleeps on the protocol queue's doorbell: a completer must ring it.
    sleeping: AtomicBool,
    /// The owner's last sequence number.
    seq: AtomicU32,
    /// The owner sleeps parked (see [`Slot::prepare_park`]) rather than on the doorbell:
    /// a completer unparks `thread` instead of sending a wake-up message.
    parked: AtomicBool,
    /// The thread that parks; set before `parked`.
    thread: Mutex<Option<Thread>>,
    /// Locks its owners took from the runtime's lock cache (counted per slot: one
    /// counter for the cluster would be a cache line every thread writes; padded, since
    /// the owner writes it on every cached acquire and the slots lie side by side).
    runtime_acquires: CachePadded<AtomicU64>,
    /// The owner's busy polls per wait, for faults and for locks (see [`SpinBudget`]).
    busy_budgets: [SpinBudget; ADAPTIVE_KINDS],
}

impl Slot {
    fn new() -> Self {
        Slot {
            ep: Mutex::new(None),
            done: AtomicU32::new(0),
            sleeping: AtomicBool::new(false),
            seq: AtomicU32::new(0),
            parked: AtomicBool::new(false),
            thread: Mutex::new(None),
            runtime_acquires: CachePadded::new(AtomicU64::new(0)),
            busy_budgets: std::array::from_fn(|_| SpinBudget::new(super::BUSY_POLLS)),
        }
    }

    /// Counts a lock the owner took from the runtime's lock cache.
    pub(crate) fn note_runtime_acquire(&self) {
        let n = self.runtime_acquires.load(Ordering::Relaxed);
        self.runtime_acquires.store(n + 1, Ordering::Relaxed);
    }

    /// The owner's busy-poll budget for waits of `kind`; `None` for barriers, which
    /// always busy-poll the full `busy_polls` (see [`WaitKind`]).
    pub(crate) fn busy_budget(&self, kind: WaitKind) -> Option<&SpinBudget> {
        self.busy_budgets.get(kind as usize)
    }

    /// A fresh sequence number for the owner's next wait.
    pub(crate) fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    /// Whether the wait numbered `seq` completed.
    #[inline]
    pub(crate) fn is_done(&self, seq: u32) -> bool {
        self.done.load(Ordering::Acquire) == seq
    }

    /// Marks the owner as about to sleep on the doorbell; returns `true` if the wait
    /// completed meanwhile (then it must not sleep). Pairs with [`Slots::complete`]: one
    /// of the two sees the other's store (both sequentially consistent).
    pub(crate) fn prepare_sleep(&self, seq: u32) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        if self.done.load(Ordering::SeqCst) == seq {
            self.sleeping.store(false, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Marks the owner as about to park (`std::thread::park_timeout`) until its wait
    /// completes; returns `true` if it completed meanwhile (then it must not park). Like
    /// [`Slot::prepare_sleep`], but the completer unparks the calling thread instead of
    /// sending a message to the slot's wake-up queue: only this thread wakes, where a
    /// message rings the doorbell that every thread sleeping on the protocol queue
    /// shares (see `Core::wait`).
    pub(crate) fn prepare_park(&self, seq: u32) -> bool {
        {
            let mut t = self.thread.lock();
            if t.as_ref()
                .is_none_or(|t| t.id() != std::thread::current().id())
            {
                *t = Some(std::thread::current());
            }
        }
        self.parked.store(true, Ordering::SeqCst);
        if self.prepare_sleep(seq) {
            self.parked.store(false, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// The owner woke up.
    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
        self.parked.store(false, Ordering::Relaxed);
    }
}

/// The slots of one runtime.
pub(crate) struct Slots {
    slots: Box<[Slot]>,
    free: Mutex<Vec<u32>>,
}

/// The token of a release the runtime makes itself (an idle cached lock the machine
/// wants back; see `super::lock_cache`): no slot waits for its completion.
pub(crate) const RUNTIME_TOKEN: u64 = u64::MAX;

/// The token of wait `seq` of slot `slot` (as carried by `FaultToken`/`SyncToken`).
pub(crate) fn token(slot: u32, seq: u32) -> u64 {
    (u64::from(slot) << 32) | u64::from(seq)
}

impl Slots {
    pub(crate) fn new() -> Self {
        Slots {
            slots: (0..MAX_THREADS).map(|_| Slot::new()).collect(),
            free: Mutex::new((0..MAX_THREADS as u32).rev().collect()),
        }
    }

    pub(crate) fn get(&self, i: u32) -> &Slot {
        &self.slots[i as usize]
    }

    /// Locks taken from the runtime's lock cache, by every thread so far.
    pub(crate) fn runtime_acquires(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.runtime_acquires.load(Ordering::Relaxed))
            .sum()
    }

    fn alloc(&self) -> Option<u32> {
        self.free.lock().pop()
    }

    fn release(&self, i: u32) {
        self.free.lock().push(i);
    }

    /// Completes the wait named by `token`. A parked owner is unparked here; returns
    /// the slot when its owner sleeps on the doorbell and must be woken (by a message to
    /// the slot's wake-up queue).
    pub(crate) fn complete(&self, token: u64) -> Option<u32> {
        let index = (token >> 32) as u32;
        let Some(slot) = self.slots.get(index as usize) else {
            tracing::error!("completion of unknown token {token:#x}");
            return None;
        };
        slot.done.store(token as u32, Ordering::SeqCst);
        if !slot.sleeping.load(Ordering::SeqCst) {
            return None;
        }
        // `parked` is stored before `sleeping` (both SeqCst), so a sleeper seen here
        // shows whether it parks.
        if slot.parked.load(Ordering::SeqCst) {
            if let Some(t) = slot.thread.lock().as_ref() {
                t.unpark();
            }
            return None;
        }
        Some(index)
    }
}

/// A thread's claim on a slot of one runtime; returns the slot when the thread exits.
struct Claim {
    runtime: u64,
    core: Weak<Core>,
    slot: u32,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(core) = self.core.upgrade() {
            core.slots.release(self.slot);
        }
    }
}

thread_local! {
    static CLAIMS: RefCell<Vec<Claim>> = const { RefCell::new(Vec::new()) };
    static COMPUTE_INDEX: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    static PROTOCOL_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Records that this thread is its cluster's protocol thread (in `Core::serve`), for
/// [`SentByThread::note_sent`].
pub(crate) fn set_protocol_thread() {
    PROTOCOL_THREAD.with(|c| c.set(true));
}

/// Records that this thread is compute thread `index` of its cluster (in
/// [`crate::Dsm::run`]); the `static` INI policy sends its messages through INI
/// `index mod K` (paper 002 §3.1).
pub(crate) fn set_compute_index(index: Option<usize>) {
    COMPUTE_INDEX.with(|c| c.set(index));
}

/// This thread's compute-thread index in its cluster, if it is one.
pub(crate) fn compute_index() -> Option<usize> {
    COMPUTE_INDEX.with(std::cell::Cell::get)
}

/// This thread's slot in `core`, claimed on first use. `None` when every slot is taken
/// (or the thread is exiting and its table is gone: a fresh slot is claimed then, and
/// released by the caller through the returned guard's drop).
pub(crate) fn thread_slot(core: &Arc<Core>) -> Option<SlotRef> {
    let found = CLAIMS.try_with(|claims| {
        let Ok(mut claims) = claims.try_borrow_mut() else {
            return Err(());
        };
        if let Some(c) = claims.iter().find(|c| c.runtime == core.id) {
            return Ok(Some(c.slot));
        }
        // Drop claims of runtimes that are gone.
        claims.retain(|c| c.core.strong_count() > 0);
        let slot = core.slots.alloc();
        if let Some(slot) = slot {
            claims.push(Claim {
                runtime: core.id,
                core: Arc::downgrade(core),
                slot,
            });
        }
        Ok(slot)
    });
    match found {
        Ok(Ok(slot)) => slot.map(|slot| SlotRef {
            slot,
            temporary: None,
        }),
        // Thread-local storage unavailable (thread exiting) or in use further up this
        // thread's stack: use a temporary slot for this one wait.
        Ok(Err(())) | Err(_) => core.slots.alloc().map(|slot| SlotRef {
            slot,
            temporary: Some(Arc::clone(core)),
        }),
    }
}

/// A slot index held for one operation.
pub(crate) struct SlotRef {
    pub(crate) slot: u32,
    temporary: Option<Arc<Core>>,
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        if let Some(core) = self.temporary.take() {
            core.slots.release(self.slot);
        }
    }
}

/// Messages each thread of a cluster handed to the message layer for the network (the
/// site's `substrate.network` count, split by the thread that sent them; see
/// [`crate::ClusterStats::messages_sent_by_thread`]).
///
/// One counter per compute-thread index, one for the protocol thread and one for every
/// other thread, each on its own cache-line pair: a compute thread writes only its own
/// counter, so no line moves between threads on a send. Each send is counted as it
/// returns, by the thread that made it (its endpoint's own count before and after), so
/// what a thread sent under the machine lock is counted before the lock is released.
pub(crate) struct SentByThread {
    compute: Box<[CachePadded<AtomicU64>]>,
    protocol: CachePadded<AtomicU64>,
    other: CachePadded<AtomicU64>,
}

impl SentByThread {
    /// Counters for a cluster of `compute_threads` compute threads.
    pub(crate) fn new(compute_threads: usize) -> Self {
        SentByThread {
            compute: (0..compute_threads)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            protocol: CachePadded::new(AtomicU64::new(0)),
            other: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// Counts `n` messages sent by compute thread `index` of the cluster, or by some
    /// other thread (not the protocol thread) when `index` is `None` or out of range.
    #[inline]
    pub(crate) fn note_thread(&self, index: Option<usize>, n: u64) {
        if n == 0 {
            return;
        }
        let counter = index
            .and_then(|i| self.compute.get(i))
            .unwrap_or(&self.other);
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` messages sent by the calling thread: the protocol thread, compute
    /// thread [`compute_index`], or another thread.
    #[inline]
    pub(crate) fn note_sent(&self, n: u64) {
        if n == 0 {
            return;
        }
        if PROTOCOL_THREAD.with(std::cell::Cell::get) {
            self.protocol.fetch_add(n, Ordering::Relaxed);
        } else {
            self.note_thread(compute_index(), n);
        }
    }

    /// The counts so far: per compute thread (by index), the protocol thread's, the
    /// other threads'.
    pub(crate) fn snapshot(&self) -> (Vec<u64>, u64, u64) {
        (
            self.compute
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            self.protocol.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
        )
    }
}
