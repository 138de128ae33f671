//! Protocol messages between clusters and their wire encoding.
//!
//! # Wire form
//!
//! Every message is one Express word — an 8-bit opcode, the sender's id (filled in
//! by the message layer, not by this crate) and a 40-bit payload — optionally with
//! either
//!
//! * one attached buffer of [`PAGE_SIZE`] bytes (a Tag-On message: a page), whose
//!   contents never pass through this crate: see [`Attachment`], or
//! * a byte body of any length (a bulk message) for variable-length data: vector
//!   timestamps, write-notice lists, diffs ([`IntervalDiff`], opaque bytes).
//!
//! [`Message::to_parts`] gives `(opcode, payload, body)`; [`Message::from_parts`]
//! decodes them and rejects malformed input with a [`DecodeError`] (it never
//! panics). Payload layout: bits 0..24 the page (or 0..20 the lock and 20..40 a
//! tenure number, or 0..32 the barrier episode), bits 24..40 a second field as
//! listed per variant. Unused bits
//! must be zero. Bulk bodies are little-endian; see [`Message::to_parts`].
//!
//! Source: Express and Tag-On messages of StarT-Voyager (paper 004 §5.1, §5.2),
//! field widths from issue 4, message set from HLRC (OSDI 1996 §2), MGS (ISCA 1996
//! §3) and Ivy (Li & Hudak, TOCS 1989 §4.1).

use std::sync::Arc;

use crate::ids::{ClusterId, LockId, MAX_CLUSTERS, MAX_PAGES, PAGE_SIZE, PageId};
use crate::interval::{DiffBytes, IntervalDiff, IntervalRecord, VectorTime};
use smallvec::SmallVec;

/// What a Tag-On message carries in its attached buffer. The data is out of band:
/// the machine never sees page contents.
///
/// * On **send**, for [`Attachment::Page`] the runtime copies its local copy of the
///   page into a pool buffer.
/// * On **receive**, the runtime keeps the buffer with the
///   [`crate::Event::Message`] and checks its length (exactly one page). Actions
///   emitted while handling that event may refer to it ([`crate::Source::Attached`]);
///   the buffer can be released when the call returns.
///
/// Source: Tag-On messages (paper 004 §5.2); zero-copy page transfer (design.md,
/// *messaging*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attachment {
    /// A whole page: the sender's current contents of `page`.
    Page(PageId),
}

/// The body of a message in wire form.
///
/// Source: Express, Tag-On and bulk messages (paper 004 §5; design.md, *messaging*).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    /// Express only: the header word is the whole message.
    None,
    /// Tag-On: one attached buffer, supplied by the runtime (see [`Attachment`]).
    Attached(Attachment),
    /// Bulk: a byte body of any length.
    Bulk(Vec<u8>),
}

/// A message in wire form: opcode, 40-bit payload, body.
///
/// Source: see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Parts {
    /// The 8-bit handler/opcode.
    pub opcode: u8,
    /// The 40-bit payload (always `< 1 << 40`).
    pub payload: u64,
    /// The body.
    pub body: Body,
}

/// Number of payload bits of an Express word.
///
/// Source: issue 4 (64-bit Express word, 8-bit opcode, 40-bit payload).
pub const PAYLOAD_BITS: u32 = 40;

/// A protocol message between clusters. The sender is not part of the message: the
/// message layer delivers it with the Express word's source field, and the runtime
/// passes it as `from` in [`crate::Event::Message`].
///
/// Source: message sets of HLRC (OSDI 1996 §2), MGS (ISCA 1996 §3), Ivy (TOCS 1989
/// §4.1); see each variant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Message {
    /// First-touch: "who is the home of `page`?", to the page's directory manager.
    /// Opcode 0x01, Express. Source: first-touch homes (ArgoDSM
    /// `first_touch_distribution.hpp`), see [`crate::home`].
    HomeQuery {
        /// The page.
        page: PageId,
    },
    /// First-touch reply: `home` is the home of `page`. Opcode 0x02, Express, bits
    /// 24..34 the home. Source: as [`Message::HomeQuery`].
    HomeIs {
        /// The page.
        page: PageId,
        /// Its home.
        home: ClusterId,
    },
    /// hlrc: fetch a copy of `page` from its home, reflecting at least the versions
    /// `need` (per cluster, the last interval whose writes to the page the copy must
    /// hold; see [`IntervalDiff`]): the home answers once it has applied those diffs.
    /// Opcode 0x10, bulk (the time `need`). Source: HLRC (OSDI 1996 §2), page fetch
    /// from the home on a fault, with per-page flush timestamps.
    GetPage {
        /// The page.
        page: PageId,
        /// Versions the copy must reflect (entries of the home itself are ignored).
        need: VectorTime,
    },
    /// A copy of `page` from its home, in reply to [`Message::GetPage`],
    /// [`Message::ScRead`] or [`Message::ScWrite`]. Opcode 0x11; bit 24 `writable`
    /// (sc ownership), bit 25 `zero`. When `zero` is set the page has never been
    /// written and there is no attachment (Express); otherwise Tag-On with the page.
    /// Source: HLRC (OSDI 1996 §2) page reply; Ivy (TOCS 1989 §4.1) read/write
    /// fault reply.
    PageData {
        /// The page.
        page: PageId,
        /// sc: the receiver becomes the page's single writer.
        writable: bool,
        /// The page is all zeros; no buffer attached.
        zero: bool,
    },
    /// hlrc: a diff of one of the sender's intervals, to the page's home (the sender
    /// is `diff.owner`). Opcode 0x12, bits 0..24 the page, bulk (index, base, bytes).
    /// Source: HLRC (OSDI 1996 §2), diffs sent to the home at release.
    Diff {
        /// The diff.
        diff: IntervalDiff,
    },
    /// hlrc: a diff of one of the sender's intervals of a page homed at the sender,
    /// sent at a barrier arrival to a cluster of the page's copyset; kept until the
    /// barrier departure, where a copy that reflects its base applies it instead of
    /// being invalidated (see [`crate::Config::barrier_updates`]). Opcode 0x13,
    /// encoded like `Diff`. Source: update protocols (Munin, SOSP 1991 §3).
    Update {
        /// The diff.
        diff: IntervalDiff,
    },
    /// sc: read fault, to the home. Opcode 0x20, Express. Source: Ivy (TOCS 1989
    /// §4.1), read fault handler.
    ScRead {
        /// The page.
        page: PageId,
    },
    /// sc: write fault (or upgrade of a read-only copy), to the home. Opcode 0x21,
    /// Express. Source: Ivy (TOCS 1989 §4.1), write fault handler.
    ScWrite {
        /// The page.
        page: PageId,
    },
    /// sc: write permission granted on the read-only copy the receiver holds (no
    /// data). Opcode 0x22, Express. Source: Ivy (TOCS 1989 §4.1), write fault on a
    /// page the faulting processor holds read-only.
    ScUpgrade {
        /// The page.
        page: PageId,
    },
    /// sc: drop your read-only copy and acknowledge. Opcode 0x23, Express.
    /// Source: Ivy (TOCS 1989 §4.1), invalidation of the copy set.
    ScInvalidate {
        /// The page.
        page: PageId,
    },
    /// sc: read-only copy dropped. Opcode 0x24, Express. Source: Ivy (TOCS 1989 §4.1).
    ScInvAck {
        /// The page.
        page: PageId,
    },
    /// sc: to the current writer: write the page back to the home and keep a
    /// read-only copy (`invalidate == false`) or none. Opcode 0x25, bit 24
    /// `invalidate`, Express. Source: Ivy (TOCS 1989 §4.1), the owner gives up write
    /// access (here via the home, which acts as the fixed manager).
    ScRecall {
        /// The page.
        page: PageId,
        /// Drop the copy instead of keeping it read-only.
        invalidate: bool,
    },
    /// sc: the former writer's copy of the page, to the home. Opcode 0x26, Tag-On
    /// with the page. Source: as [`Message::ScRecall`].
    ScWriteBack {
        /// The page.
        page: PageId,
    },
    /// Lock request, to the lock's manager; carries the acquirer's vector time and the
    /// last tenure of the lock it was granted. Opcode 0x30, bits 0..20 the lock, bits
    /// 20..40 `seen`, bulk. Source: [`crate::interval`]; tenures in [`crate::sync`].
    LockAcquire {
        /// The lock.
        lock: LockId,
        /// The acquirer's vector time.
        time: VectorTime,
        /// The last tenure of this lock granted to the acquirer (0: none): the
        /// manager drops a request that a later grant (a push) already answered.
        seen: u32,
    },
    /// Lock grant, from the manager, starting a *tenure* of the receiver; carries the
    /// lock's vector time, the interval records the acquirer has not seen, the diffs
    /// of those intervals the manager holds, and whether the lock is *contended*. Sent
    /// in reply to a request, or unrequested to the cluster predicted to want the lock
    /// next (a push). Opcode 0x31, bits 0..20 the lock, bits 20..40 the tenure, bulk
    /// (time, records, diffs, `u32` stored, then one byte: 1 if contended). Source:
    /// [`crate::interval`]; contention, tenures, pushes and carried diffs in
    /// [`crate::sync`].
    LockGrant {
        /// The lock.
        lock: LockId,
        /// The lock's vector time (of its last release).
        time: VectorTime,
        /// Records the acquirer must apply.
        records: Vec<IntervalRecord>,
        /// Diffs of (some of) those records' pages, oldest tenure first.
        diffs: Vec<IntervalDiff>,
        /// The newest of the receiver's own records the manager holds: the receiver's
        /// releases to this manager need not carry those again.
        stored: u32,
        /// The tenure this grant starts (`1..2^20`, wrapping).
        tenure: u32,
        /// Another cluster held the lock in one of its last two tenures: the
        /// receiver gives it back after its first use (eager release) instead of
        /// caching it.
        contended: bool,
    },
    /// Lock release, to the manager, ending the sender's tenure; carries the releaser's
    /// vector time, the time up to which it discarded records at barriers, the
    /// records the manager may lack, the diffs of the releaser's intervals of the
    /// tenure (the first `homed` of them for the receiver as the pages' home), what the
    /// releaser's own lock manager holds of the receiver's records, and whether the
    /// tenure went unused. Opcode 0x32, bits 0..20 the lock, bits 20..40 the tenure,
    /// bulk (time, gc, records, diffs, `u32` homed, `u32` stored, then one byte: 1 if
    /// unused). Source: [`crate::interval`]; pushes and carried diffs in
    /// [`crate::sync`].
    LockRelease {
        /// The lock.
        lock: LockId,
        /// The tenure that ends.
        tenure: u32,
        /// The releaser's vector time when its interval closed.
        time: VectorTime,
        /// The releaser's garbage-collection time (last barrier).
        gc: VectorTime,
        /// Records after the lock's time at grant, up to `time`.
        records: Vec<IntervalRecord>,
        /// The releaser's diffs of its intervals in this tenure.
        diffs: Vec<IntervalDiff>,
        /// How many of `diffs` (the first ones) are for the receiver as their pages'
        /// home: the releaser sent them no other way.
        homed: u32,
        /// The newest of the receiver's own records the releaser's lock manager holds
        /// (as in [`Message::LockGrant`]).
        stored: u32,
        /// No thread of the releaser took the lock in this tenure (a push returned
        /// unused): the manager neither learns from it nor pushes on it.
        unused: bool,
    },
    /// Lock recall, from the manager to the cluster that owns the lock in `tenure`:
    /// another cluster wants it. The owner gives the lock back
    /// ([`Message::LockRelease`]) as soon as no thread of its own holds it (after at
    /// most [`crate::sync::MAX_LOCAL_HANDOFFS`] more hand-offs between its threads). A
    /// recall may overtake its grant (the network reorders): the cluster keeps it
    /// until that tenure starts; a recall of a tenure already over is ignored.
    /// Opcode 0x33, bits 0..20 the lock, bits 20..40 the tenure, Express.
    /// Source: lazy lock release — a lock stays with the last acquiring node until
    /// another node asks for it (TreadMarks, Keleher et al., USENIX Winter 1994 §3.2;
    /// MGS, Yeung et al., ISCA 1996 §3); see [`crate::sync`].
    LockRecall {
        /// The lock.
        lock: LockId,
        /// The tenure recalled.
        tenure: u32,
    },
    /// Barrier arrival of one cluster, to the barrier manager. Opcode 0x38, bits
    /// 0..32 the episode, bulk. Source: [`crate::interval`] and [`crate::hlrc`]
    /// (migration).
    BarrierArrive {
        /// Barrier episode (0, 1, …).
        episode: u32,
        /// The cluster's vector time.
        time: VectorTime,
        /// The cluster's own records since the previous barrier.
        records: Vec<IntervalRecord>,
        /// Pages the cluster wrote as a non-home since the previous barrier and still
        /// holds valid: candidates for single-writer home migration.
        migratable: Vec<PageId>,
        /// For each cluster this one has sent [`Message::Update`]s to, how many it has
        /// sent there since the job began (cumulative, so that a departure can say how
        /// many each receiver must have had before it proceeds).
        updates_sent: Vec<(ClusterId, u64)>,
    },
    /// Barrier departure, from the manager. Opcode 0x39, bits 0..32 the episode,
    /// bulk. Source: [`crate::interval`] and [`crate::hlrc`] (migration).
    BarrierDepart {
        /// Barrier episode.
        episode: u32,
        /// The maximum vector time of all arrivals.
        time: VectorTime,
        /// The records of other clusters that the receiver has not seen.
        records: Vec<IntervalRecord>,
        /// Home migrations, applied by every cluster.
        migrations: Vec<(PageId, ClusterId)>,
        /// For each other cluster that sent the receiver [`Message::Update`]s, how many
        /// it had sent when it arrived (cumulative): the receiver completes the
        /// departure once it has received that many from each, so that an update
        /// from a third cluster, overtaken by the departure, is applied instead of its
        /// copy being invalidated. Source: issue 10 (EM3D on 4 × 1).
        updates_due: Vec<(ClusterId, u64)>,
    },
}

/// Why a wire message could not be decoded.
///
/// Source: issue 4 ("decode errors for malformed input (never panic)").
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// No message has this opcode.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The payload has bits set above bit 40 or in fields the opcode does not use.
    #[error("opcode {opcode:#04x}: payload {payload:#x} has reserved bits set")]
    ReservedBits {
        /// Opcode.
        opcode: u8,
        /// Payload.
        payload: u64,
    },
    /// A bulk opcode arrived without a body.
    #[error("opcode {0:#04x} needs a bulk body")]
    MissingBody(u8),
    /// A non-bulk opcode arrived with a body.
    #[error("opcode {0:#04x} takes no bulk body")]
    UnexpectedBody(u8),
    /// The bulk body ended early.
    #[error("bulk body truncated")]
    Truncated,
    /// The bulk body has bytes after the last field.
    #[error("{0} trailing bytes after the bulk body")]
    TrailingBytes(usize),
    /// A cluster id is out of range.
    #[error("cluster id {0} out of range")]
    BadCluster(u32),
    /// A page id is out of range.
    #[error("page id {0} out of range")]
    BadPage(u32),
    /// An interval record or diff has index 0.
    #[error("interval record or diff with index 0")]
    BadIndex,
    /// A diff is longer than an encoded page can be.
    #[error("diff of {0} bytes is longer than a page's")]
    LongDiff(usize),
    /// A flag byte is neither 0 nor 1.
    #[error("flag byte is neither 0 nor 1")]
    BadFlag,
}

mod op {
    pub const HOME_QUERY: u8 = 0x01;
    pub const HOME_IS: u8 = 0x02;
    pub const GET_PAGE: u8 = 0x10;
    pub const PAGE_DATA: u8 = 0x11;
    pub const DIFF: u8 = 0x12;
    pub const UPDATE: u8 = 0x13;
    pub const SC_READ: u8 = 0x20;
    pub const SC_WRITE: u8 = 0x21;
    pub const SC_UPGRADE: u8 = 0x22;
    pub const SC_INVALIDATE: u8 = 0x23;
    pub const SC_INV_ACK: u8 = 0x24;
    pub const SC_RECALL: u8 = 0x25;
    pub const SC_WRITE_BACK: u8 = 0x26;
    pub const LOCK_ACQUIRE: u8 = 0x30;
    pub const LOCK_GRANT: u8 = 0x31;
    pub const LOCK_RELEASE: u8 = 0x32;
    pub const LOCK_RECALL: u8 = 0x33;
    pub const BARRIER_ARRIVE: u8 = 0x38;
    pub const BARRIER_DEPART: u8 = 0x39;
}

const PAGE_MASK: u64 = (1 << 24) - 1;
const LOCK_MASK: u64 = (1 << 20) - 1;

/// Payload of a lock message: the lock in bits 0..20, a tenure number (`< 2^20`,
/// see [`crate::sync::TENURE_MODULUS`]) in bits 20..40.
fn lock_payload(lock: LockId, tenure: u32) -> u64 {
    u64::from(lock.get()) | (u64::from(tenure) & LOCK_MASK) << 20
}

fn page_payload(page: PageId, hi: u64) -> u64 {
    u64::from(page.get()) | (hi << 24)
}

impl Message {
    /// The page this message concerns, if it is a page message.
    ///
    /// Source: see [`Message`].
    pub fn page(&self) -> Option<PageId> {
        use Message::*;
        match *self {
            HomeQuery { page }
            | HomeIs { page, .. }
            | GetPage { page, .. }
            | PageData { page, .. }
            | ScRead { page }
            | ScWrite { page }
            | ScUpgrade { page }
            | ScInvalidate { page }
            | ScInvAck { page }
            | ScRecall { page, .. }
            | ScWriteBack { page } => Some(page),
            Diff { ref diff } | Update { ref diff } => Some(diff.page),
            LockAcquire { .. }
            | LockGrant { .. }
            | LockRelease { .. }
            | LockRecall { .. }
            | BarrierArrive { .. }
            | BarrierDepart { .. } => None,
        }
    }

    /// This message's opcode: the handler it travels under, as [`Message::to_parts`]
    /// gives it, without encoding the message.
    ///
    /// Source: see the module documentation.
    pub fn opcode(&self) -> u8 {
        use Message::*;
        match self {
            HomeQuery { .. } => op::HOME_QUERY,
            HomeIs { .. } => op::HOME_IS,
            GetPage { .. } => op::GET_PAGE,
            PageData { .. } => op::PAGE_DATA,
            Diff { .. } => op::DIFF,
            Update { .. } => op::UPDATE,
            ScRead { .. } => op::SC_READ,
            ScWrite { .. } => op::SC_WRITE,
            ScUpgrade { .. } => op::SC_UPGRADE,
            ScInvalidate { .. } => op::SC_INVALIDATE,
            ScInvAck { .. } => op::SC_INV_ACK,
            ScRecall { .. } => op::SC_RECALL,
            ScWriteBack { .. } => op::SC_WRITE_BACK,
            LockAcquire { .. } => op::LOCK_ACQUIRE,
            LockGrant { .. } => op::LOCK_GRANT,
            LockRelease { .. } => op::LOCK_RELEASE,
            LockRecall { .. } => op::LOCK_RECALL,
            BarrierArrive { .. } => op::BARRIER_ARRIVE,
            BarrierDepart { .. } => op::BARRIER_DEPART,
        }
    }

    /// The interval records this message carries (none for most kinds).
    ///
    /// Source: see [`Message`].
    pub fn records(&self) -> &[IntervalRecord] {
        use Message::*;
        match self {
            LockGrant { records, .. }
            | LockRelease { records, .. }
            | BarrierArrive { records, .. }
            | BarrierDepart { records, .. } => records,
            _ => &[],
        }
    }

    /// The attached buffer this message carries as a Tag-On message, if any.
    ///
    /// Source: Tag-On messages (paper 004 §5.2).
    pub fn attachment(&self) -> Option<Attachment> {
        match *self {
            Message::PageData {
                page, zero: false, ..
            }
            | Message::ScWriteBack { page } => Some(Attachment::Page(page)),
            _ => None,
        }
    }

    /// Whether this is a synchronization message (lock or barrier).
    ///
    /// Source: statistics of issue 4 ("lock/barrier messages").
    pub fn is_sync(&self) -> bool {
        matches!(
            self,
            Message::LockAcquire { .. }
                | Message::LockGrant { .. }
                | Message::LockRelease { .. }
                | Message::LockRecall { .. }
                | Message::BarrierArrive { .. }
                | Message::BarrierDepart { .. }
        )
    }

    /// Encodes the message into its wire form.
    ///
    /// Bulk bodies (little-endian): a vector time is `u16 n` then `n × u32`; a record
    /// list is `u32 count` then per record `u16 owner, u32 index, u32 n, n × u32
    /// page`; a page list is `u32 count, count × u32`; a migration list is `u32 count`
    /// then `count × (u32 page, u16 home)`; a diff is `u32 page, u16 owner, u32 index`,
    /// the time `base`, `u32 len` and `len` bytes; a diff list is `u32 count` then the
    /// diffs. `GetPage` = time; `Diff` = the diff without its page (in the payload);
    /// `LockAcquire` = time; `LockGrant` = time, records, diffs, `u32` stored, one flag
    /// byte;
    /// `LockRelease` = time, gc, records, diffs, `u32` homed, `u32` stored, one flag
    /// byte; `BarrierArrive` =
    /// time, records, page list, update counts; `BarrierDepart` = time, records,
    /// migration list, update counts. An update-count list is `u32 count` then `count ×
    /// (u16 cluster, u64 updates)`.
    ///
    /// Source: see the module documentation.
    pub fn to_parts(&self) -> Parts {
        let mut v = Vec::new();
        let (opcode, payload, kind) = self.encode(&mut v);
        let body = match kind {
            Kind::Express => Body::None,
            Kind::Attached(a) => Body::Attached(a),
            Kind::Bulk => Body::Bulk(v),
        };
        Parts {
            opcode,
            payload,
            body,
        }
    }

    /// For a bulk message, appends its body to `out` (whatever `out` already holds
    /// stays in front: the runtime encodes a message straight into the bundle it
    /// joins) and returns its opcode and payload; `None` (and `out` unchanged) for an
    /// Express or Tag-On message. The body is the one [`Message::to_parts`] gives.
    ///
    /// Source: see the module documentation.
    pub fn encode_bulk_into(&self, out: &mut Vec<u8>) -> Option<(u8, u64)> {
        let len = out.len();
        match self.encode(out) {
            (opcode, payload, Kind::Bulk) => Some((opcode, payload)),
            _ => {
                out.truncate(len);
                None
            }
        }
    }

    /// Opcode, payload and body kind; a bulk body is appended to `out`.
    fn encode(&self, out: &mut Vec<u8>) -> (u8, u64, Kind) {
        use Message::*;
        let express = |opcode, payload| (opcode, payload, Kind::Express);
        let bulk = |opcode, payload, _: Writer| (opcode, payload, Kind::Bulk);
        match self {
            &HomeQuery { page } => express(op::HOME_QUERY, page_payload(page, 0)),
            &HomeIs { page, home } => {
                express(op::HOME_IS, page_payload(page, u64::from(home.get())))
            }
            GetPage { page, need } => {
                let mut w = Writer(&mut *out);
                w.time(need);
                bulk(op::GET_PAGE, page_payload(*page, 0), w)
            }
            &PageData {
                page,
                writable,
                zero,
            } => {
                let payload = page_payload(page, u64::from(writable) | (u64::from(zero) << 1));
                let kind = match self.attachment() {
                    Some(a) => Kind::Attached(a),
                    None => Kind::Express,
                };
                (op::PAGE_DATA, payload, kind)
            }
            Diff { diff } | Update { diff } => {
                let opcode = if matches!(self, Diff { .. }) {
                    op::DIFF
                } else {
                    op::UPDATE
                };
                let mut w = Writer(&mut *out);
                w.diff_body(diff);
                bulk(opcode, page_payload(diff.page, 0), w)
            }
            &ScRead { page } => express(op::SC_READ, page_payload(page, 0)),
            &ScWrite { page } => express(op::SC_WRITE, page_payload(page, 0)),
            &ScUpgrade { page } => express(op::SC_UPGRADE, page_payload(page, 0)),
            &ScInvalidate { page } => express(op::SC_INVALIDATE, page_payload(page, 0)),
            &ScInvAck { page } => express(op::SC_INV_ACK, page_payload(page, 0)),
            &ScRecall { page, invalidate } => {
                express(op::SC_RECALL, page_payload(page, u64::from(invalidate)))
            }
            &ScWriteBack { page } => (
                op::SC_WRITE_BACK,
                page_payload(page, 0),
                Kind::Attached(Attachment::Page(page)),
            ),
            LockAcquire { lock, time, seen } => {
                let mut w = Writer(&mut *out);
                w.time(time);
                bulk(op::LOCK_ACQUIRE, lock_payload(*lock, *seen), w)
            }
            LockGrant {
                lock,
                time,
                records,
                diffs,
                stored,
                tenure,
                contended,
            } => {
                let mut w = Writer(&mut *out);
                w.time(time);
                w.records(records);
                w.diffs(diffs);
                w.u32(*stored);
                w.0.push(u8::from(*contended));
                bulk(op::LOCK_GRANT, lock_payload(*lock, *tenure), w)
            }
            LockRelease {
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
                let mut w = Writer(&mut *out);
                w.time(time);
                w.time(gc);
                w.records(records);
                w.diffs(diffs);
                w.u32(*homed);
                w.u32(*stored);
                w.0.push(u8::from(*unused));
                bulk(op::LOCK_RELEASE, lock_payload(*lock, *tenure), w)
            }
            &LockRecall { lock, tenure } => express(op::LOCK_RECALL, lock_payload(lock, tenure)),
            BarrierArrive {
                episode,
                time,
                records,
                migratable,
                updates_sent,
            } => {
                let mut w = Writer(&mut *out);
                w.time(time);
                w.records(records);
                w.pages(migratable);
                w.update_counts(updates_sent);
                bulk(op::BARRIER_ARRIVE, u64::from(*episode), w)
            }
            BarrierDepart {
                episode,
                time,
                records,
                migrations,
                updates_due,
            } => {
                let mut w = Writer(&mut *out);
                w.time(time);
                w.records(records);
                w.u32(migrations.len() as u32);
                for &(p, c) in migrations {
                    w.u32(p.get());
                    w.u16(c.get());
                }
                w.update_counts(updates_due);
                bulk(op::BARRIER_DEPART, u64::from(*episode), w)
            }
        }
    }

    /// Whether messages with `opcode` carry a bulk body ([`Body::Bulk`]): exactly the
    /// opcodes [`Message::from_parts`] decodes with `bulk = Some(..)`.
    pub fn opcode_has_bulk_body(opcode: u8) -> bool {
        matches!(
            opcode,
            op::GET_PAGE
                | op::DIFF
                | op::UPDATE
                | op::LOCK_ACQUIRE
                | op::LOCK_GRANT
                | op::LOCK_RELEASE
                | op::BARRIER_ARRIVE
                | op::BARRIER_DEPART
        )
    }

    /// [`Message::from_parts`] for a bulk body that is `body` of the received buffer
    /// `buf`: an [`Message::Update`] whose diff is at least [`SHARED_DIFF_MIN`] bytes
    /// keeps its diff as a range of `buf` ([`DiffBytes::shared`]) instead of a copy
    /// (EM3D and Water receive thousands of whole-page updates per run, each otherwise
    /// copied out of its bundle once more). Every other message decodes as with
    /// `from_parts(opcode, payload, Some(&buf[body]))`. Only updates share, and only
    /// while their message is handled: one applied on arrival (at a barrier, EM3D's
    /// and Water's usual case) never copies its diff, one held for a later grant or
    /// departure is copied out then ([`DiffBytes::unshared`]), so no received buffer
    /// outlives the handling of its bundle.
    ///
    /// # Errors
    /// As [`Message::from_parts`]; [`DecodeError::Truncated`] if `body` is not within
    /// `buf`.
    ///
    /// Source: see the module documentation.
    pub fn from_shared_parts(
        opcode: u8,
        payload: u64,
        buf: &Arc<Vec<u8>>,
        body: std::ops::Range<usize>,
    ) -> Result<Self, DecodeError> {
        let bulk = buf.get(body.clone()).ok_or(DecodeError::Truncated)?;
        Self::decode(opcode, payload, Some(bulk), Some((buf, body.end)))
    }

    /// Decodes a message from its opcode, payload and bulk body (`None` for Express
    /// and Tag-On messages; the attached buffer of a Tag-On message is not needed to
    /// decode the header — check it against [`Message::attachment`]).
    ///
    /// Source: see the module documentation.
    pub fn from_parts(opcode: u8, payload: u64, bulk: Option<&[u8]>) -> Result<Self, DecodeError> {
        Self::decode(opcode, payload, bulk, None)
    }

    /// [`Message::from_parts`]; with `shared = Some((buf, end))`, `bulk` is the part of
    /// `buf` that ends at `end`, and an update's diff of [`SHARED_DIFF_MIN`] bytes or
    /// more is kept as a range of `buf` ([`Message::from_shared_parts`]).
    fn decode(
        opcode: u8,
        payload: u64,
        bulk: Option<&[u8]>,
        shared: Option<(&Arc<Vec<u8>>, usize)>,
    ) -> Result<Self, DecodeError> {
        let reserved = || DecodeError::ReservedBits { opcode, payload };
        if payload >> PAYLOAD_BITS != 0 {
            return Err(reserved());
        }
        match (Self::opcode_has_bulk_body(opcode), bulk.is_some()) {
            (true, false) => return Err(DecodeError::MissingBody(opcode)),
            (false, true) => return Err(DecodeError::UnexpectedBody(opcode)),
            _ => {}
        }
        let page = PageId::new((payload & PAGE_MASK) as u32).ok_or(reserved())?;
        let hi = payload >> 24;
        // Checks that the high field fits `bits` bits.
        let field = |bits: u32| -> Result<u64, DecodeError> {
            if hi >> bits != 0 {
                Err(reserved())
            } else {
                Ok(hi)
            }
        };
        use Message::*;
        let msg = match opcode {
            op::HOME_QUERY => {
                field(0)?;
                HomeQuery { page }
            }
            op::HOME_IS => {
                let h = field(10)?;
                HomeIs {
                    page,
                    home: ClusterId::new(h as u16).ok_or(DecodeError::BadCluster(h as u32))?,
                }
            }
            op::GET_PAGE => {
                field(0)?;
                let mut r = Reader(bulk.unwrap_or(&[]));
                let need = r.time()?;
                r.finish()?;
                GetPage { page, need }
            }
            op::PAGE_DATA => {
                let f = field(2)?;
                PageData {
                    page,
                    writable: f & 1 != 0,
                    zero: f & 2 != 0,
                }
            }
            op::DIFF | op::UPDATE => {
                field(0)?;
                let mut r = Reader(bulk.unwrap_or(&[]));
                let (owner, index, base, data) = r.diff_fields()?;
                r.finish()?;
                let data = match shared {
                    // The diff's bytes end the body (nothing trails them: `finish`
                    // checked).
                    Some((buf, end)) if opcode == op::UPDATE && data.len() >= SHARED_DIFF_MIN => {
                        DiffBytes::shared(buf, end - data.len()..end)
                            .ok_or(DecodeError::Truncated)?
                    }
                    _ => DiffBytes::new(data),
                };
                let diff = IntervalDiff {
                    page,
                    owner,
                    index,
                    base,
                    data,
                };
                if opcode == op::DIFF {
                    Diff { diff }
                } else {
                    Update { diff }
                }
            }
            op::SC_READ => {
                field(0)?;
                ScRead { page }
            }
            op::SC_WRITE => {
                field(0)?;
                ScWrite { page }
            }
            op::SC_UPGRADE => {
                field(0)?;
                ScUpgrade { page }
            }
            op::SC_INVALIDATE => {
                field(0)?;
                ScInvalidate { page }
            }
            op::SC_INV_ACK => {
                field(0)?;
                ScInvAck { page }
            }
            op::SC_RECALL => ScRecall {
                page,
                invalidate: field(1)? != 0,
            },
            op::SC_WRITE_BACK => {
                field(0)?;
                ScWriteBack { page }
            }
            op::LOCK_ACQUIRE | op::LOCK_GRANT | op::LOCK_RELEASE | op::LOCK_RECALL => {
                // Bits 0..20 the lock, bits 20..40 a tenure number.
                let lock = LockId::new((payload & LOCK_MASK) as u32).ok_or(reserved())?;
                let tenure = (payload >> 20) as u32;
                if opcode == op::LOCK_RECALL {
                    return Ok(LockRecall { lock, tenure });
                }
                let mut r = Reader(bulk.unwrap_or(&[]));
                let m = match opcode {
                    op::LOCK_ACQUIRE => LockAcquire {
                        lock,
                        time: r.time()?,
                        seen: tenure,
                    },
                    op::LOCK_GRANT => LockGrant {
                        lock,
                        time: r.time()?,
                        records: r.records()?,
                        diffs: r.diffs()?,
                        stored: r.u32()?,
                        tenure,
                        contended: r.flag()?,
                    },
                    _ => LockRelease {
                        lock,
                        tenure,
                        time: r.time()?,
                        gc: r.time()?,
                        records: r.records()?,
                        diffs: r.diffs()?,
                        homed: r.u32()?,
                        stored: r.u32()?,
                        unused: r.flag()?,
                    },
                };
                r.finish()?;
                m
            }
            op::BARRIER_ARRIVE | op::BARRIER_DEPART => {
                if payload >> 32 != 0 {
                    return Err(reserved());
                }
                let episode = payload as u32;
                let mut r = Reader(bulk.unwrap_or(&[]));
                let m = if opcode == op::BARRIER_ARRIVE {
                    BarrierArrive {
                        episode,
                        time: r.time()?,
                        records: r.records()?,
                        migratable: r.pages()?,
                        updates_sent: r.update_counts()?,
                    }
                } else {
                    let time = r.time()?;
                    let records = r.records()?;
                    let n = r.count(6)?;
                    let mut migrations = Vec::with_capacity(n);
                    for _ in 0..n {
                        migrations.push((r.page()?, r.cluster()?));
                    }
                    BarrierDepart {
                        episode,
                        time,
                        records,
                        migrations,
                        updates_due: r.update_counts()?,
                    }
                };
                r.finish()?;
                m
            }
            _ => return Err(DecodeError::UnknownOpcode(opcode)),
        };
        Ok(msg)
    }
}

/// How a message travels (see [`Body`]); a bulk body is written by [`Writer`].
enum Kind {
    Express,
    Attached(Attachment),
    Bulk,
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn time(&mut self, t: &VectorTime) {
        let e = t.entries();
        // A vector time has at most MAX_CLUSTERS entries (one per cluster).
        self.u16(e.len() as u16);
        for &v in e {
            self.u32(v);
        }
    }
    fn update_counts(&mut self, counts: &[(ClusterId, u64)]) {
        self.u32(counts.len() as u32);
        for &(c, n) in counts {
            self.u16(c.get());
            self.0.extend_from_slice(&n.to_le_bytes());
        }
    }
    fn pages(&mut self, pages: &[PageId]) {
        self.u32(pages.len() as u32);
        for p in pages {
            self.u32(p.get());
        }
    }
    fn records(&mut self, records: &[IntervalRecord]) {
        self.u32(records.len() as u32);
        for r in records {
            self.u16(r.owner.get());
            self.u32(r.index);
            self.pages(&r.pages);
        }
    }
    /// A diff without its page (`Diff` carries the page in the payload).
    fn diff_body(&mut self, d: &IntervalDiff) {
        self.u16(d.owner.get());
        self.u32(d.index);
        self.time(&d.base);
        self.u32(d.data.len() as u32);
        self.0.extend_from_slice(d.data.as_slice());
    }
    fn diffs(&mut self, diffs: &[IntervalDiff]) {
        self.u32(diffs.len() as u32);
        for d in diffs {
            self.u32(d.page.get());
            self.diff_body(d);
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        Ok(*head)
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.take::<1>()? {
            [0] => Ok(false),
            [1] => Ok(true),
            _ => Err(DecodeError::BadFlag),
        }
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    /// A count of items of at least `min_size` bytes each, checked against the bytes
    /// left so that a lying count cannot cause a huge allocation.
    fn count(&mut self, min_size: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size) > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(n)
    }
    fn page(&mut self) -> Result<PageId, DecodeError> {
        let v = self.u32()?;
        if v >= MAX_PAGES {
            return Err(DecodeError::BadPage(v));
        }
        PageId::new(v).ok_or(DecodeError::BadPage(v))
    }
    fn cluster(&mut self) -> Result<ClusterId, DecodeError> {
        let v = self.u16()?;
        ClusterId::new(v).ok_or(DecodeError::BadCluster(u32::from(v)))
    }
    fn time(&mut self) -> Result<VectorTime, DecodeError> {
        let n = usize::from(self.u16()?);
        if n > usize::from(MAX_CLUSTERS) {
            return Err(DecodeError::BadCluster(n as u32));
        }
        if n * 4 > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        let mut v: SmallVec<[u32; 4]> = SmallVec::with_capacity(n);
        for _ in 0..n {
            v.push(self.u32()?);
        }
        Ok(VectorTime::collect_entries(v))
    }
    /// An update-count list: at most one entry per cluster, in increasing cluster order.
    fn update_counts(&mut self) -> Result<Vec<(ClusterId, u64)>, DecodeError> {
        let n = self.count(10)?;
        let mut v: Vec<(ClusterId, u64)> = Vec::with_capacity(n);
        for _ in 0..n {
            let c = self.cluster()?;
            if v.last().is_some_and(|&(prev, _)| prev >= c) {
                return Err(DecodeError::BadCluster(u32::from(c.get())));
            }
            v.push((c, u64::from_le_bytes(self.take()?)));
        }
        Ok(v)
    }
    fn pages(&mut self) -> Result<Vec<PageId>, DecodeError> {
        let n = self.count(4)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.page()?);
        }
        Ok(v)
    }
    fn records(&mut self) -> Result<Vec<IntervalRecord>, DecodeError> {
        let n = self.count(10)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let owner = self.cluster()?;
            let index = self.u32()?;
            if index == 0 {
                return Err(DecodeError::BadIndex);
            }
            let pages = self.pages()?.into();
            v.push(IntervalRecord {
                owner,
                index,
                pages,
            });
        }
        Ok(v)
    }
    fn diff_body(&mut self, page: PageId) -> Result<IntervalDiff, DecodeError> {
        let (owner, index, base, data) = self.diff_fields()?;
        Ok(IntervalDiff {
            page,
            owner,
            index,
            base,
            data: DiffBytes::new(data),
        })
    }
    /// A diff's owner, interval, base time and encoded bytes (not copied).
    fn diff_fields(&mut self) -> Result<(ClusterId, u32, VectorTime, &'a [u8]), DecodeError> {
        let owner = self.cluster()?;
        let index = self.u32()?;
        if index == 0 {
            return Err(DecodeError::BadIndex);
        }
        let base = self.time()?;
        let len = self.u32()? as usize;
        if len > crate::diff::MAX_ENCODED {
            return Err(DecodeError::LongDiff(len));
        }
        let (data, rest) = self.0.split_at_checked(len).ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        Ok((owner, index, base, data))
    }
    fn diffs(&mut self) -> Result<Vec<IntervalDiff>, DecodeError> {
        // page, owner, index, an empty time, a length: 16 bytes at least
        let n = self.count(16)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let page = self.page()?;
            v.push(self.diff_body(page)?);
        }
        Ok(v)
    }
    fn finish(self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.0.len()))
        }
    }
}

/// Smallest diff an [`Message::Update`] decoded by [`Message::from_shared_parts`]
/// shares with its received buffer instead of copying (bytes): smaller ones are copied,
/// so that a buffer of up to a bundle's size is not kept alive for a few words.
///
/// Source: see [`Message::from_shared_parts`].
pub const SHARED_DIFF_MIN: usize = 1024;

/// Largest attached buffer of any message.
///
/// Source: issue 4 (one attached buffer of at most 4096 bytes).
pub const MAX_ATTACHMENT: usize = PAGE_SIZE;

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: u32) -> PageId {
        PageId::new(n).unwrap()
    }
    fn c(n: u16) -> ClusterId {
        ClusterId::new(n).unwrap()
    }

    fn roundtrip(m: Message) {
        let parts = m.to_parts();
        assert_eq!(m.opcode(), parts.opcode, "{m:?}");
        assert!(parts.payload < 1 << PAYLOAD_BITS);
        let bulk = match &parts.body {
            Body::Bulk(b) => Some(b.as_slice()),
            _ => None,
        };
        assert_eq!(Message::opcode_has_bulk_body(parts.opcode), bulk.is_some());
        assert_eq!(
            Message::from_parts(parts.opcode, parts.payload, bulk),
            Ok(m.clone())
        );
        if let Some(b) = bulk {
            // The same body inside a larger received buffer.
            let buf = Arc::new([&[0xAB; 7][..], b, &[0xCD; 5]].concat());
            assert_eq!(
                Message::from_shared_parts(parts.opcode, parts.payload, &buf, 7..7 + b.len()),
                Ok(m.clone())
            );
        }
        match parts.body {
            Body::Attached(a) => assert_eq!(m.attachment(), Some(a)),
            _ => assert_eq!(m.attachment(), None),
        }
    }

    fn update(page: u32, len_words: usize) -> Message {
        let mut data = Vec::new();
        let words: Vec<u64> = (0..len_words as u64).collect();
        let twin = vec![0u8; PAGE_SIZE];
        let mut cur = twin.clone();
        for (i, w) in words.iter().enumerate() {
            cur[i * 8..i * 8 + 8].copy_from_slice(&(w + 1).to_ne_bytes());
        }
        crate::diff::encode(&twin, &cur, &mut data).unwrap();
        Message::Update {
            diff: IntervalDiff {
                page: p(page),
                owner: c(1),
                index: 4,
                base: VectorTime::from_entries(vec![1, 3]),
                data: DiffBytes::new(data),
            },
        }
    }

    #[test]
    fn a_large_update_shares_its_received_buffer() {
        for (words, shares) in [(512, true), (200, true), (10, false)] {
            let m = update(9, words);
            let parts = m.to_parts();
            let Body::Bulk(b) = &parts.body else {
                panic!("an update is bulk")
            };
            let buf = Arc::new([&[1u8; 3][..], b].concat());
            let got = Message::from_shared_parts(parts.opcode, parts.payload, &buf, 3..buf.len());
            assert_eq!(got, Ok(m.clone()), "{words} words");
            assert_eq!(
                Arc::strong_count(&buf),
                if shares { 2 } else { 1 },
                "{words} words"
            );
            // A held update keeps a copy of its own instead.
            let Ok(Message::Update { diff }) = got else {
                panic!("decoded above")
            };
            let own = diff.data.clone().unshared();
            drop(diff);
            assert_eq!(Arc::strong_count(&buf), 1, "{words} words");
            let Message::Update { diff } = &m else {
                unreachable!()
            };
            assert_eq!(own, diff.data);
        }
    }

    #[test]
    fn a_shared_decode_refuses_what_a_copying_one_refuses() {
        let m = update(9, 512);
        let parts = m.to_parts();
        let Body::Bulk(b) = parts.body else {
            panic!("an update is bulk")
        };
        let buf = Arc::new(b.clone());
        let n = b.len();
        // The body's range outside the buffer.
        assert_eq!(
            Message::from_shared_parts(parts.opcode, parts.payload, &buf, 0..n + 1),
            Err(DecodeError::Truncated)
        );
        // Truncated, trailing bytes, reserved payload bits: as `from_parts` says.
        let longer = Arc::new([&b[..], &[0]].concat());
        for (buf, range, payload) in [
            (&buf, 0..n - 1, parts.payload),
            (&longer, 0..n + 1, parts.payload),
            (&buf, 0..n, parts.payload | 1 << 30),
            (&buf, 0..n, parts.payload | 1 << 40),
        ] {
            assert_eq!(
                Message::from_shared_parts(parts.opcode, payload, buf, range.clone()),
                Message::from_parts(parts.opcode, payload, Some(&buf[range.clone()])),
                "{range:?} {payload:#x}"
            );
            assert!(Message::from_parts(parts.opcode, payload, Some(&buf[range])).is_err());
        }
    }

    #[test]
    fn every_variant_roundtrips() {
        let t = VectorTime::from_entries(vec![3, 0, 7]);
        let recs = vec![IntervalRecord {
            owner: c(2),
            index: 7,
            pages: vec![p(1), p(MAX_PAGES - 1)].into(),
        }];
        let diffs = vec![
            IntervalDiff {
                page: p(1),
                owner: c(2),
                index: 7,
                base: t.clone(),
                data: DiffBytes::new(vec![1u8, 2, 3]),
            },
            IntervalDiff {
                page: p(MAX_PAGES - 1),
                owner: c(0),
                index: 1,
                base: VectorTime::new(),
                data: DiffBytes::default(),
            },
        ];
        for m in [
            Message::HomeQuery {
                page: p(MAX_PAGES - 1),
            },
            Message::HomeIs {
                page: p(4),
                home: c(1023),
            },
            Message::GetPage {
                page: p(9),
                need: VectorTime::new(),
            },
            Message::GetPage {
                page: p(9),
                need: t.clone(),
            },
            Message::PageData {
                page: p(9),
                writable: true,
                zero: false,
            },
            Message::PageData {
                page: p(9),
                writable: false,
                zero: true,
            },
            Message::Diff {
                diff: diffs[0].clone(),
            },
            Message::Diff {
                diff: diffs[1].clone(),
            },
            Message::ScRead { page: p(2) },
            Message::ScWrite { page: p(2) },
            Message::ScUpgrade { page: p(2) },
            Message::ScInvalidate { page: p(2) },
            Message::ScInvAck { page: p(2) },
            Message::ScRecall {
                page: p(2),
                invalidate: true,
            },
            Message::ScWriteBack { page: p(2) },
            Message::LockAcquire {
                lock: LockId::new((1 << 20) - 1).unwrap(),
                time: t.clone(),
                seen: (1 << 20) - 1,
            },
            Message::LockGrant {
                lock: LockId::new(5).unwrap(),
                time: t.clone(),
                records: recs.clone(),
                diffs: diffs.clone(),
                stored: 9,
                tenure: 7,
                contended: true,
            },
            Message::LockGrant {
                lock: LockId::new(5).unwrap(),
                time: t.clone(),
                records: vec![],
                diffs: vec![],
                stored: 0,
                tenure: 1,
                contended: false,
            },
            Message::LockRelease {
                lock: LockId::new(5).unwrap(),
                tenure: 3,
                time: t.clone(),
                gc: VectorTime::new(),
                records: recs.clone(),
                diffs,
                homed: 1,
                stored: 3,
                unused: false,
            },
            Message::LockRelease {
                lock: LockId::new(5).unwrap(),
                tenure: 4,
                time: VectorTime::new(),
                gc: VectorTime::new(),
                records: vec![],
                diffs: vec![],
                homed: 0,
                stored: 0,
                unused: true,
            },
            Message::LockRecall {
                lock: LockId::new((1 << 20) - 1).unwrap(),
                tenure: (1 << 20) - 1,
            },
            Message::BarrierArrive {
                episode: u32::MAX,
                time: t.clone(),
                records: recs.clone(),
                migratable: vec![p(3)],
                updates_sent: vec![(c(0), 7), (c(2), u64::MAX)],
            },
            Message::BarrierDepart {
                episode: 1,
                time: t,
                records: recs,
                migrations: vec![(p(3), c(2))],
                updates_due: vec![(c(1), 40)],
            },
        ] {
            roundtrip(m);
        }
    }

    #[test]
    fn malformed_headers_are_rejected() {
        assert_eq!(
            Message::from_parts(0, 0, None),
            Err(DecodeError::UnknownOpcode(0))
        );
        // a grant's flag byte is 0 or 1
        assert_eq!(
            Message::from_parts(
                op::LOCK_GRANT,
                1,
                Some(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2])
            ),
            Err(DecodeError::BadFlag)
        );
        assert!(matches!(
            Message::from_parts(
                op::LOCK_GRANT,
                1,
                Some(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
            ),
            Ok(Message::LockGrant {
                contended: true,
                ..
            })
        ));
        // a lock recall names a lock and a tenure, and carries no body
        assert_eq!(
            Message::from_parts(op::LOCK_RECALL, 3 | 9 << 20, None),
            Ok(Message::LockRecall {
                lock: LockId::new(3).unwrap(),
                tenure: 9
            })
        );
        assert_eq!(
            Message::from_parts(op::LOCK_RECALL, 1, Some(&[])),
            Err(DecodeError::UnexpectedBody(op::LOCK_RECALL))
        );
        assert!(matches!(
            Message::from_parts(op::SC_READ, 1 << 24, None),
            Err(DecodeError::ReservedBits { .. })
        ));
        assert!(matches!(
            Message::from_parts(op::SC_READ, 1 << 40, None),
            Err(DecodeError::ReservedBits { .. })
        ));
        assert_eq!(
            Message::from_parts(op::LOCK_GRANT, 1, None),
            Err(DecodeError::MissingBody(op::LOCK_GRANT))
        );
        assert_eq!(
            Message::from_parts(op::SC_READ, 1, Some(&[])),
            Err(DecodeError::UnexpectedBody(op::SC_READ))
        );
        assert_eq!(
            Message::from_parts(op::GET_PAGE, 1, None),
            Err(DecodeError::MissingBody(op::GET_PAGE))
        );
        // a diff: owner, index (0 is no interval), base, length, bytes
        let diff_body = |index: u32, len: u32| {
            let mut b = vec![1u8, 0];
            b.extend_from_slice(&index.to_le_bytes());
            b.extend_from_slice(&[0, 0]);
            b.extend_from_slice(&len.to_le_bytes());
            b
        };
        assert_eq!(
            Message::from_parts(op::DIFF, 1, Some(&diff_body(0, 0))),
            Err(DecodeError::BadIndex)
        );
        let long = crate::diff::MAX_ENCODED as u32 + 1;
        assert_eq!(
            Message::from_parts(op::DIFF, 1, Some(&diff_body(1, long))),
            Err(DecodeError::LongDiff(long as usize))
        );
        assert_eq!(
            Message::from_parts(op::DIFF, 1, Some(&diff_body(1, 3))),
            Err(DecodeError::Truncated)
        );
        // a record count far larger than the body
        let body = [0u8, 0, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(
            Message::from_parts(op::LOCK_GRANT, 1, Some(&body)),
            Err(DecodeError::Truncated)
        );
        // trailing byte
        assert_eq!(
            Message::from_parts(op::LOCK_ACQUIRE, 1, Some(&[0, 0, 9])),
            Err(DecodeError::TrailingBytes(1))
        );
    }
}
