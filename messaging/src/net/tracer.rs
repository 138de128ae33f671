//! Recording the per-message trace of one INI (the checkpoints of [`super::trace`]).
//!
//! Only the holder of the INI's lock records (the INI thread, or a compute thread running
//! the inline pass), so the recorder needs no synchronisation. A send record is started
//! when the INI takes the message off its hand-off queue and completed when the
//! message's first datagram leaves; in between it waits, in order, per connection —
//! a connection's messages enter the sliding window in the order they were enqueued
//! ([`crate::window::Transmit::starts_message`]). A receive record is written when the
//! message is in its receive queue.

use super::handoff::OutMsg;
use super::reseq::Ready;
use super::trace::{Side, TraceBuffer, TraceRecord};
use crate::window::{ConnHandle, IniAddr};
use std::collections::VecDeque;

/// One INI's trace recorder.
pub(crate) struct IniTracer {
    cluster: u16,
    ini: u16,
    buf: TraceBuffer,
    /// Per connection (by index): records of messages in the connection's send queue,
    /// not yet on the wire, oldest first.
    pending: Vec<VecDeque<TraceRecord>>,
    /// The record of the message waiting outside a full connection send queue.
    stalled: Option<TraceRecord>,
}

impl IniTracer {
    /// A recorder for INI `ini` of `cluster` with `conns` connections, keeping up to
    /// `capacity` records (64 bytes each, reserved now), its span starting at `now_ns`.
    pub(crate) fn new(
        cluster: u16,
        ini: u16,
        conns: usize,
        capacity: usize,
        now_ns: u64,
    ) -> IniTracer {
        IniTracer {
            cluster,
            ini,
            buf: TraceBuffer::new(capacity, now_ns),
            pending: (0..conns).map(|_| VecDeque::new()).collect(),
            stalled: None,
        }
    }

    /// The INI took `m` (`bytes` of data, for `peer`) off its hand-off queue at `now_ns`.
    pub(crate) fn dequeued(
        &self,
        m: &OutMsg,
        peer: IniAddr,
        bytes: usize,
        now_ns: u64,
    ) -> TraceRecord {
        let dequeued = now_ns.max(m.enqueued_ns);
        TraceRecord {
            side: Side::Send,
            kind: m.kind as u8,
            cluster: self.cluster,
            ini: self.ini,
            peer_cluster: peer.site,
            peer_ini: u16::from(peer.ini),
            lane: m.lane,
            seq: m.seq,
            bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
            t: [m.enqueued_ns, dequeued, 0, 0],
        }
    }

    /// The message of `r` is in `conn`'s send queue (behind the ones recorded before).
    pub(crate) fn queued(&mut self, conn: ConnHandle, r: TraceRecord) {
        if let Some(q) = self.pending.get_mut(conn.index()) {
            q.push_back(r);
        }
    }

    /// The message of `r` found `conn`'s send queue full: it waits outside.
    pub(crate) fn stall(&mut self, r: TraceRecord) {
        self.stalled = Some(r);
    }

    /// The stalled message got into `conn`'s send queue.
    pub(crate) fn unstall(&mut self, conn: ConnHandle) {
        if let Some(r) = self.stalled.take() {
            self.queued(conn, r);
        }
    }

    /// The stalled message was given up (its peer failed).
    pub(crate) fn drop_stalled(&mut self) {
        self.stalled = None;
    }

    /// The next `count` messages of `conn` entered the sliding window at `windowed_ns`
    /// and their first datagram (one datagram: a BATCH may start several) left at
    /// `wired_ns`.
    pub(crate) fn on_wire(
        &mut self,
        conn: ConnHandle,
        count: u16,
        windowed_ns: u64,
        wired_ns: u64,
    ) {
        for _ in 0..count {
            let Some(mut r) = self
                .pending
                .get_mut(conn.index())
                .and_then(VecDeque::pop_front)
            else {
                return;
            };
            r.t[2] = windowed_ns.max(r.t[1]);
            r.t[3] = wired_ns.max(r.t[2]);
            self.buf.push(r);
        }
    }

    /// `m` is in its receive queue at `now_ns`. The record goes to the delivering INI
    /// (usually the receiving one; a message the resequencer held back is delivered by
    /// whichever INI of the cluster retries it).
    pub(crate) fn delivered(&mut self, m: &Ready<'_>, now_ns: u64) {
        let arrived = m.arrival.arrived_ns;
        self.buf.push(TraceRecord {
            side: Side::Receive,
            kind: m.kind as u8,
            cluster: self.cluster,
            ini: self.ini,
            peer_cluster: m.origin,
            peer_ini: u16::from(m.arrival.peer_ini),
            lane: m.lane,
            seq: m.seq,
            bytes: u32::try_from(m.data.len()).unwrap_or(u32::MAX),
            t: [arrived, now_ns.max(arrived), 0, 0],
        });
    }

    /// Ends the traced span at `now_ns` and gives the records.
    pub(crate) fn finish(&mut self, now_ns: u64) -> &TraceBuffer {
        self.buf.close(now_ns);
        &self.buf
    }
}
