//! Inputs ([`Event`]) and outputs ([`Action`]) of a coherence [`crate::Machine`].
//!
//! The machine decides; the runtime acts. Page-memory terms below refer to the
//! runtime's mapping of the DSM region: *missing* (never installed or invalidated;
//! an access faults), *read-only* (installed and write-protected; a write faults)
//! and *writable*.
//!
//! Source: sans-I/O protocol design (style.md practice 7; quinn-proto
//! `connection/mod.rs`), actions of page-based DSM (Li & Hudak, TOCS 1989 §4.1;
//! HLRC OSDI 1996 §2).

use crate::ids::{ClusterId, FaultToken, LockId, PageId, PageRange, SyncToken};
use crate::interval::DiffBytes;
use crate::message::Message;

/// The most bytes an [`Event`] or an [`Action`] may take. Both move by value between
/// the runtime and the machine several times per lock use; a move of at most 128 bytes
/// compiles to inline vector stores (x86-64: eight of 16 bytes), a larger one to a call
/// of `memcpy`. At 152 and 144 bytes, 10 steps of Water 512 on 2×1 over shared memory
/// made 653,000 calls of 64–255 bytes (≈ 62 per lock acquire; counted with a `perf
/// probe` on glibc's `memmove`); at 128, with the runtime's batches of events no longer
/// pairing an event with its buffer, 90,000. Measured against the
/// build before (fifty-fifth session): `bench dsm`'s lock hand-off over shared memory
/// 4.86 → 4.08 µs and 4.57 → 4.41 µs (two alternating runs); Water 512 × 50 2×1 shm
/// 0.972 × the time (10 alternating pairs). Checked at compile time below: a variant
/// that grows past it should box its large part.
pub const MAX_MOVED_BYTES: usize = 128;

const _: () = assert!(
    std::mem::size_of::<Event>() <= MAX_MOVED_BYTES,
    "an Event grew past MAX_MOVED_BYTES (see its documentation)"
);
const _: () = assert!(
    std::mem::size_of::<Action>() <= MAX_MOVED_BYTES,
    "an Action grew past MAX_MOVED_BYTES (see its documentation)"
);

/// An input to [`crate::Machine::handle`].
///
/// Source: see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// A thread read a page that is missing. `token` comes back in
    /// [`Action::Wake`]. A fault on a page that has meanwhile become readable is
    /// answered with an immediate wake (a *spurious* fault).
    /// Source: read fault handler (Li & Hudak, TOCS 1989 §4.1; HLRC OSDI 1996 §2).
    ReadFault {
        /// The faulting page.
        page: PageId,
        /// Identifies the blocked thread.
        token: FaultToken,
    },
    /// A thread wrote a page that is missing or read-only.
    /// Source: write fault handler (Li & Hudak, TOCS 1989 §4.1; HLRC OSDI 1996 §2:
    /// twin creation on the first write).
    WriteFault {
        /// The faulting page.
        page: PageId,
        /// Identifies the blocked thread.
        token: FaultToken,
    },
    /// A thread wants `lock`; it stays blocked until [`Action::AcquireDone`] — in the
    /// same call when the cluster owns the lock and no local thread holds it (a cached
    /// or pushed lock, see [`crate::sync`]).
    /// Source: acquire of release consistency (HLRC OSDI 1996 §2); lock caching
    /// (TreadMarks, USENIX Winter 1994 §3.2).
    Acquire {
        /// The lock.
        lock: LockId,
        /// Identifies the blocked thread.
        token: SyncToken,
    },
    /// A thread releases `lock`, which it holds; it stays blocked until
    /// [`Action::ReleaseDone`], which comes in the same call: the lock passes to a
    /// waiting local thread, stays cached in the cluster, or leaves it once the homes
    /// have acknowledged the diffs of the interval closed for it, without the thread
    /// waiting for that (see [`crate::sync`]).
    /// Source: release of release consistency (HLRC OSDI 1996 §2; MGS ISCA 1996 §3);
    /// lazy release (TreadMarks, USENIX Winter 1994 §3.2).
    Release {
        /// The lock.
        lock: LockId,
        /// Identifies the blocked thread.
        token: SyncToken,
    },
    /// The cluster arrives at the global barrier: the runtime has gathered all of the
    /// cluster's compute threads locally and passes one arrival. It completes with
    /// [`Action::BarrierDone`], after which the runtime releases the local threads.
    /// Source: hierarchical barrier of MGS (ISCA 1996 §3: SMP-node synchronization
    /// in hardware, inter-node in software); design.md, *dsm*.
    Barrier {
        /// Identifies the arrival.
        token: SyncToken,
    },
    /// A protocol message from another cluster. For a Tag-On message the runtime
    /// keeps the received buffer available while this event is handled and has checked
    /// that it is there, of the length the message needs (see [`crate::Attachment`]).
    /// Source: message handlers of HLRC (OSDI 1996 §2) and Ivy (TOCS 1989 §4.1).
    Message {
        /// The sending cluster (from the Express word's source field).
        from: ClusterId,
        /// The decoded message.
        msg: Message,
    },
    /// The result of the [`Action::Flush`] that ended the previous call: one diff per
    /// page, in the order of the flush's pages (empty when the page did not change).
    /// The runtime passes it right after executing the flush, before any other event.
    /// Source: diff creation at release (Munin SOSP 1991 §3; HLRC OSDI 1996 §2).
    Flushed {
        /// The diffs, one per flushed page.
        diffs: Vec<DiffBytes>,
    },
}

/// One page of an [`Action::Flush`].
///
/// Source: see [`Action::Flush`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlushPage {
    /// The page (installed, with a twin).
    pub page: PageId,
    /// Keep the page writable and its twin, refreshed to the contents diffed; else
    /// the page was write-protected by an earlier action and its twin is discarded.
    pub keep_open: bool,
}

/// Where the contents of an installed page come from.
///
/// Source: zero-fill of never-written pages and installation of fetched pages
/// (design.md, *dsm*: `UFFDIO_ZEROPAGE`/`UFFDIO_COPY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The page buffer attached to the message being handled.
    Attached,
    /// All zeros (the page was never written anywhere).
    Zero,
}

/// An output of [`crate::Machine::handle`], to be executed by the runtime in order.
///
/// Source: see each variant; ordering rules in the [`crate::Machine`] documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Send `msg` to cluster `to`. If [`Message::attachment`] is
    /// [`crate::Attachment::Page`]`(p)`, copy the local page `p` (currently readable)
    /// into a pool buffer and send it as a Tag-On message; otherwise send the
    /// Express or bulk form of [`Message::to_parts`].
    /// Source: message sends of HLRC (OSDI 1996 §2) and Ivy (TOCS 1989 §4.1).
    Send {
        /// Destination cluster.
        to: ClusterId,
        /// The message.
        msg: Message,
    },
    /// Map the page, which is missing, with contents from `source`; write-protected
    /// unless `writable`. (`UFFDIO_COPY`/`UFFDIO_ZEROPAGE`, with
    /// `UFFDIO_COPY_MODE_WP` when read-only; do not wake here — see [`Action::Wake`].)
    /// Source: page installation after a fetch (HLRC OSDI 1996 §2).
    Install {
        /// The page.
        page: PageId,
        /// Where the contents come from.
        source: Source,
        /// Map it writable.
        writable: bool,
    },
    /// Copy the page's current contents (it is installed and write-protected) into
    /// twin storage for this page. Always followed by [`Action::Unprotect`] of the
    /// same page; the twin lives until a [`Action::Flush`] discards it (or
    /// [`Action::DropTwin`]).
    /// Source: twin creation on the first write in an interval (Munin SOSP 1991 §3;
    /// HLRC OSDI 1996 §2).
    MakeTwin {
        /// The page.
        page: PageId,
    },
    /// Make the installed, write-protected page writable (`UFFDIO_WRITEPROTECT`
    /// clearing WP).
    /// Source: write fault on a read-only page (HLRC OSDI 1996 §2; Ivy TOCS 1989 §4.1).
    Unprotect {
        /// The page.
        page: PageId,
    },
    /// Write-protect the installed pages (`UFFDIO_WRITEPROTECT` setting WP); later
    /// writes fault. hlrc emits this before a [`Action::Flush`] that closes the same
    /// pages, so that a thread writing concurrently re-faults and takes a fresh twin
    /// after the diff was computed.
    /// Source: HLRC (OSDI 1996 §2), write detection per interval; issue 4 ordering.
    WriteProtect {
        /// The pages.
        pages: PageRange,
    },
    /// Drop the pages (`madvise(MADV_DONTNEED)`): they become missing and the next
    /// access faults. The machine never invalidates a page that has a twin.
    /// Source: invalidation on write notices (HLRC OSDI 1996 §2) or on an sc
    /// invalidation request (Ivy TOCS 1989 §4.1).
    Invalidate {
        /// The pages.
        pages: PageRange,
    },
    /// hlrc: for each page, in order, read its contents, encode the diff against its
    /// twin ([`crate::diff::encode`]) and either refresh the twin to exactly the
    /// contents read (`keep_open`: the page stays writable, so that later writes of
    /// local threads show up in the next flush) or discard the twin (the page was
    /// write-protected by an earlier action). Always the last action of its call; the
    /// runtime then passes the diffs as [`Event::Flushed`] before any other event.
    /// Words written concurrently by local threads are read as old or new value; a
    /// new value read lands in both diff and twin, an old one shows up in the next
    /// flush.
    /// Source: diffs at release (Munin SOSP 1991 §3; HLRC OSDI 1996 §2); twins kept
    /// across releases instead of write-protecting at every release (this project).
    Flush {
        /// The pages.
        pages: Vec<FlushPage>,
    },
    /// hlrc: apply the encoded diff to the installed page through a view that never
    /// faults, leaving its protection as application threads see it (their concurrent
    /// writes to other words survive), and — when `twin` — to the page's twin too, so
    /// that the next flush does not report the diff's words as this cluster's writes.
    /// Source: the home applies diffs to its master copy (HLRC OSDI 1996 §2); diffs
    /// applied at acquires (TreadMarks, USENIX Winter 1994 §3.3).
    ApplyDiff {
        /// The page.
        page: PageId,
        /// The encoded diff.
        data: DiffBytes,
        /// Apply it to the page's twin as well.
        twin: bool,
    },
    /// hlrc, at the home: copy the page (installed, writable, no twin: a *private*
    /// home page) once into a buffer, send that copy to `to` as
    /// [`Message::PageData`]` { page, writable: false, zero: false }` and make the same
    /// copy the page's twin. Local threads may write the page meanwhile: each word
    /// is in the copy as old or new value, and later writes show up in the next flush.
    /// Source: the private → shared transition of ArgoDSM's classification (see
    /// [`crate::hlrc`]).
    ShareHomePage {
        /// The requester.
        to: ClusterId,
        /// The page.
        page: PageId,
    },
    /// hlrc: discard the page's twin without diffing (no local thread wrote the page
    /// since the twin was made).
    /// Source: see [`crate::hlrc`] (migration of a home page).
    DropTwin {
        /// The page.
        page: PageId,
    },
    /// Wake the threads blocked in faults on the page (`UFFDIO_WAKE` on the page);
    /// they retry their access.
    /// Source: issue 4 (one fetch per page, all waiters woken on install).
    Wake {
        /// The page.
        page: PageId,
        /// The waiting faults, in arrival order.
        tokens: Vec<FaultToken>,
    },
    /// The acquire identified by `token` completed: the thread holds `lock`.
    /// Source: acquire completion (HLRC OSDI 1996 §2).
    AcquireDone {
        /// The lock.
        lock: LockId,
        /// The acquire's token.
        token: SyncToken,
    },
    /// The release identified by `token` completed.
    /// Source: release completion (HLRC OSDI 1996 §2).
    ReleaseDone {
        /// The lock.
        lock: LockId,
        /// The release's token.
        token: SyncToken,
    },
    /// A thread of this cluster holds `lock`, as far as the machine knows, and the lock
    /// is wanted: its manager recalled it, or another local thread waits for it. A
    /// runtime that passes a cached lock among its threads without the machine (see
    /// [`crate::Machine::lock_cacheable`]) must now release it through the machine with
    /// [`Event::Release`]: in the same call when no thread holds
    /// it (with a token of its own), else at the holder's release. A runtime that sends
    /// every release to the machine ignores it. May come more than once.
    /// Source: hardware coherence inside a multiprocessor node, software between nodes
    /// (MGS, ISCA 1996 §3): a lock that stays in the node needs no protocol.
    LockWanted {
        /// The lock.
        lock: LockId,
    },
    /// The barrier arrival identified by `token` completed: release the local threads.
    /// Source: barrier departure (HLRC OSDI 1996 §2).
    BarrierDone {
        /// The arrival's token.
        token: SyncToken,
    },
}
