//! The callback that serves faults, and what it is told about each fault.

use super::layout::PageIndex;
use super::region::RegionOps;

/// Why the access trapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The page is not present (never installed, or invalidated).
    Missing,
    /// The page is present but write-protected and the access was a write.
    WriteProtect,
}

/// What the trapped instruction tried to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// A load.
    Read,
    /// A store (or a read-modify-write instruction).
    Write,
}

/// Where the resolver is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultContext {
    /// In the `SIGBUS` handler of the thread that faulted ([`Delivery::Signal`]). The
    /// thread re-executes the access when the resolver returns; if the page is still not
    /// usable it faults again (and the resolver runs again).
    ///
    /// [`Delivery::Signal`]: super::Delivery::Signal
    FaultingThread,
    /// On a fault-handler thread ([`Delivery::Threads`]). The faulting thread sleeps in
    /// the kernel until an install or unprotect of its page wakes it; that may happen
    /// after the resolver returns, from any thread (e.g. when the page arrives from its
    /// home cluster).
    ///
    /// [`Delivery::Threads`]: super::Delivery::Threads
    HandlerThread,
}

/// One fault, as given to [`FaultResolver::resolve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fault {
    /// The page of the region that faulted.
    pub page: PageIndex,
    /// The faulting address (exact with [`Delivery::Signal`]; page-aligned with
    /// [`Delivery::Threads`]).
    ///
    /// [`Delivery::Signal`]: super::Delivery::Signal
    /// [`Delivery::Threads`]: super::Delivery::Threads
    pub addr: usize,
    /// Missing page or write-protect fault.
    pub kind: FaultKind,
    /// Load or store. A write to a missing page can be installed writable at once
    /// ([`Protection::Writable`](super::Protection::Writable)); a read installed
    /// read-only.
    pub access: Access,
    /// Where the resolver runs.
    pub context: FaultContext,
}

/// Serves the faults of one region; runs the coherence protocol's fault transition and
/// executes its actions through the [`RegionOps`] it is given.
///
/// # Contract
///
/// With [`Delivery::Signal`](super::Delivery::Signal) (the default, and the fast path)
/// `resolve` runs **on the faulting thread, synchronously, inside its `SIGBUS` handler**,
/// in the middle of an application load or store to the region. `SIGBUS` is blocked
/// while it runs. Therefore it must:
///
/// 1. **Not touch region memory with ordinary loads or stores**, nor call anything that
///    does, unless that page is present with the needed access: a second userfaultfd
///    fault while `SIGBUS` is blocked makes the kernel kill the process. Use the
///    `RegionOps` methods ([`RegionOps::install`], [`RegionOps::read_page`] on a page
///    known to be present, [`RegionOps::try_read_page`] on any page).
/// 2. **Not take a lock the interrupted code may hold** — i.e. a non-reentrant lock that
///    application code holds *while* it accesses the DSM region: an application mutex
///    guarding DSM data, `std::io::Stdout`'s lock (`println!("{}", dsm[i])` reads DSM
///    memory inside it — so no `println!` or `tracing` to stdout from here), the DSM
///    runtime's own locks if runtime code touches region memory under them. A lock only
///    ever held for short critical sections that never touch region memory (e.g. the
///    per-page coherence state, a message queue) is fine. Doing otherwise deadlocks the
///    thread; it cannot corrupt memory.
/// 3. **Block until the fault is resolved**, or return and let the access fault again.
///    Blocking is allowed (it is an ordinary thread; `futex` waits, channel receives,
///    polling message queues all work). Returning early makes the access re-execute and
///    fault again, i.e. a retry loop through the kernel (~6 µs per round).
/// 4. **Not drop the region** (its `Drop` waits for running resolvers).
/// 5. **Not unwind**: a panic aborts the process (the handler is `extern "C"`).
///
/// *Allocation is allowed.* The interrupted instruction is an application access to a
/// DSM address. The C allocator (and Rust's default global allocator, which is it) never
/// touches DSM addresses, so the fault can never have interrupted it while it held an
/// arena lock; allocating here is re-entering nothing. This would be false only for a
/// custom global allocator that keeps its own data inside the DSM region, or if another
/// signal handler that interrupted `malloc` accessed DSM memory — both excluded.
/// The layer's own signal path allocates nothing and takes no lock.
///
/// With [`Delivery::Threads`](super::Delivery::Threads) `resolve` runs on a handler
/// thread and rules 1–2 do not apply; it must not block for long (other faults wait for
/// that handler thread), so it should install what it can and let another thread install
/// later pages (which wakes the faulting thread).
///
/// In both modes concurrent faults on one page may call `resolve` several times, on
/// several threads at once; [`RegionOps::install`] reports the losers as
/// [`Install::AlreadyPresent`](super::Install::AlreadyPresent).
pub trait FaultResolver: Send + Sync + 'static {
    /// Serves `fault` on `region` (see the trait documentation for the rules).
    fn resolve(&self, region: &RegionOps, fault: Fault);
}

impl<F> FaultResolver for F
where
    F: Fn(&RegionOps, Fault) + Send + Sync + 'static,
{
    fn resolve(&self, region: &RegionOps, fault: Fault) {
        self(region, fault)
    }
}
