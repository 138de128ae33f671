//! Message-layer statistics: what was sent and received, by kind and substrate, and what
//! was rejected and why.
//!
//! Counting must not slow the hot path: each [`Endpoint`](crate::Endpoint) owns its
//! counters and is their only writer (a plain load and store, no locked instruction), and
//! a snapshot sums every endpoint's counters. Rare events (rejected packets, exhausted
//! pools) go to site-wide atomic counters.

use crate::sync::{AtomicU64, Ordering};
use serde::Serialize;

/// A counter with a single writer: incrementing costs a load and a store, no bus lock.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning endpoint calls this.
    #[inline(always)]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// Adds `n` from any thread (an atomic read-modify-write).
    #[inline]
    pub(crate) fn add_shared(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Message counts by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KindCounts {
    /// Express messages.
    pub express: u64,
    /// Tag-On messages.
    pub tag_on: u64,
    /// Basic messages.
    pub basic: u64,
    /// Bulk messages (whole messages, not fragments).
    pub bulk: u64,
    /// Bulk fragments.
    pub bulk_fragments: u64,
    /// Payload bytes (Tag-On data, Basic data, bulk data; Express words count 8).
    pub bytes: u64,
}

impl KindCounts {
    /// Total messages of every kind (fragments not counted separately).
    pub fn messages(&self) -> u64 {
        self.express + self.tag_on + self.basic + self.bulk
    }

    fn add(&mut self, o: &KindCounts) {
        self.express += o.express;
        self.tag_on += o.tag_on;
        self.basic += o.basic;
        self.bulk += o.bulk;
        self.bulk_fragments += o.bulk_fragments;
        self.bytes += o.bytes;
    }
}

/// Sent messages by substrate (paper 000: the multi-protocol layer's two paths).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SubstrateCounts {
    /// To a queue of the same site (in-process).
    pub local: u64,
    /// Deposited directly into a same-machine peer's shared segment.
    pub shm: u64,
    /// Handed to an INI for the network.
    pub network: u64,
}

/// Packets rejected on receipt, by reason (corrupted or malicious input: counted, never a
/// panic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RejectCounts {
    /// A word with the reserved kind bits.
    pub bad_kind: u64,
    /// A Tag-On or bulk header naming a pool this site does not know.
    pub unknown_pool: u64,
    /// A header naming an invalid slot (out of range, free, bad length).
    pub bad_slot: u64,
    /// A Basic slot with an impossible length.
    pub bad_basic: u64,
    /// A bulk fragment with an inconsistent header.
    pub bad_fragment: u64,
    /// A bulk message refused for the reassembly limits (too long, too many at once).
    pub reassembly_limit: u64,
}

impl RejectCounts {
    /// Sum of every reason.
    pub fn total(&self) -> u64 {
        self.bad_kind
            + self.unknown_pool
            + self.bad_slot
            + self.bad_basic
            + self.bad_fragment
            + self.reassembly_limit
    }
}

/// A point-in-time sum of a site's message statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MessageStats {
    /// Messages sent, by kind.
    pub sent: KindCounts,
    /// Messages received, by kind.
    pub received: KindCounts,
    /// Messages sent, by substrate.
    pub substrate: SubstrateCounts,
    /// Sends that found the receive queue full (each retry of a blocking send counts).
    pub full: u64,
    /// Allocations that found the buffer pool empty.
    pub pool_exhausted: u64,
    /// Network polls made by this site's receiving threads (paper 000 §3.4): receive polls
    /// that also passed over the sockets of the inline INIs (`ini.inline`; with INI
    /// threads only, such a poll reads nothing). An INI thread's own passes are not
    /// counted.
    pub network_polls: u64,
    /// Slots of this site's buffer pool handed out at least once: the most it has had in
    /// flight at once ([`Pool::used_slots`](crate::Pool::used_slots)).
    pub pool_used_slots: u64,
    /// Rejected packets.
    pub rejected: RejectCounts,
}

/// One endpoint's counters (single writer: the endpoint). Written on every message, so
/// aligned to 128 bytes (a pair of cache lines, the unit of x86's adjacent-line prefetch,
/// as in crossbeam's `CachePadded`): two endpoints' counters allocated back to back must
/// not share a line, or every send would move it between their threads.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct EndpointCounters {
    pub(crate) sent: KindCounters,
    pub(crate) received: KindCounters,
    pub(crate) local: Counter,
    pub(crate) shm: Counter,
    pub(crate) network: Counter,
    pub(crate) full: Counter,
    pub(crate) network_polls: Counter,
}

#[derive(Debug, Default)]
pub(crate) struct KindCounters {
    pub(crate) express: Counter,
    pub(crate) tag_on: Counter,
    pub(crate) basic: Counter,
    pub(crate) bulk: Counter,
    pub(crate) bulk_fragments: Counter,
    pub(crate) bytes: Counter,
}

impl KindCounters {
    fn snapshot(&self) -> KindCounts {
        KindCounts {
            express: self.express.get(),
            tag_on: self.tag_on.get(),
            basic: self.basic.get(),
            bulk: self.bulk.get(),
            bulk_fragments: self.bulk_fragments.get(),
            bytes: self.bytes.get(),
        }
    }
}

/// Site-wide counters for rare events, written by any thread.
#[derive(Debug, Default)]
pub(crate) struct SiteCounters {
    pub(crate) pool_exhausted: Counter,
    pub(crate) bad_kind: Counter,
    pub(crate) unknown_pool: Counter,
    pub(crate) bad_slot: Counter,
    pub(crate) bad_basic: Counter,
    pub(crate) bad_fragment: Counter,
    pub(crate) reassembly_limit: Counter,
}

impl SiteCounters {
    pub(crate) fn snapshot<'a>(
        &self,
        endpoints: impl Iterator<Item = &'a EndpointCounters>,
    ) -> MessageStats {
        let mut s = MessageStats {
            pool_exhausted: self.pool_exhausted.get(),
            rejected: RejectCounts {
                bad_kind: self.bad_kind.get(),
                unknown_pool: self.unknown_pool.get(),
                bad_slot: self.bad_slot.get(),
                bad_basic: self.bad_basic.get(),
                bad_fragment: self.bad_fragment.get(),
                reassembly_limit: self.reassembly_limit.get(),
            },
            ..MessageStats::default()
        };
        for e in endpoints {
            s.sent.add(&e.sent.snapshot());
            s.received.add(&e.received.snapshot());
            s.substrate.local += e.local.get();
            s.substrate.shm += e.shm.get();
            s.substrate.network += e.network.get();
            s.full += e.full.get();
            s.network_polls += e.network_polls.get();
        }
        s
    }
}
