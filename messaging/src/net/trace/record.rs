//! One trace record per inter-cluster message per INI, 64 bytes, and the per-INI buffer
//! that holds them (paper 002 §4.4.2: "for each message passing through an INI node, a
//! time-stamp is placed in a trace each time the message passes through a major
//! checkpoint in the protocol stack; traces are kept in memory").
//!
//! Encoding, little-endian:
//!
//! | offset | bytes | send record | receive record |
//! |-------:|------:|-------------|----------------|
//! | 0 | 1 | side: 1 | side: 2 |
//! | 1 | 1 | frame kind (1 Express, 2 Tag-On, 3 Basic, 4 bulk fragment) | same |
//! | 2 | 2 | recording cluster | same |
//! | 4 | 2 | recording INI | same |
//! | 6 | 2 | destination cluster | origin cluster |
//! | 8 | 2 | destination INI | origin INI |
//! | 10 | 2 | origin lane (sending endpoint) | same |
//! | 12 | 4 | sequence number per (lane, destination cluster) | same |
//! | 16 | 4 | data bytes | same |
//! | 20 | 4 | 0 | 0 |
//! | 24 | 8 | enqueued (compute thread hands it over) | arrived (last datagram read) |
//! | 32 | 8 | dequeued (INI takes it from its queue) | delivered (in the receive queue) |
//! | 40 | 8 | windowed (accepted by the sliding window) | 0 |
//! | 48 | 8 | on the wire (first datagram sent) | 0 |
//! | 56 | 8 | 0 | 0 |
//!
//! Times are ns on the recording cluster's `CLOCK_MONOTONIC`; the summary only ever
//! subtracts times taken in one cluster, so clusters on different machines need no common
//! clock.

use super::TraceError;

/// Bytes of one encoded record.
pub const RECORD_BYTES: usize = 64;

/// Which end of the inter-cluster path a record was taken at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Side {
    /// The sending cluster's INI: hand-off queue, sliding window, socket.
    Send = 1,
    /// The receiving cluster's INI: socket, reassembly, delivery.
    Receive = 2,
}

/// One message as one INI saw it. See the module documentation for the layout and the
/// meaning of the four timestamps on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// Send or receive side.
    pub side: Side,
    /// Frame kind (1 Express, 2 Tag-On, 3 Basic, 4 bulk fragment).
    pub kind: u8,
    /// The cluster whose INI recorded this.
    pub cluster: u16,
    /// The recording INI, `0..inis` of its cluster.
    pub ini: u16,
    /// The other end's cluster: destination (send side) or origin (receive side).
    pub peer_cluster: u16,
    /// The other end's INI.
    pub peer_ini: u16,
    /// The sending endpoint's lane.
    pub lane: u16,
    /// Sequence number per (lane, destination cluster): with `lane` and the two clusters
    /// it names one message at both ends.
    pub seq: u32,
    /// Data bytes (frame payload, headers excluded).
    pub bytes: u32,
    /// Timestamps, ns: send side enqueued, dequeued, windowed, on the wire; receive side
    /// arrived, delivered, 0, 0.
    pub t: [u64; 4],
}

impl TraceRecord {
    /// Send side: the compute thread handed the message to the INI's queue.
    pub fn enqueued_ns(&self) -> u64 {
        self.t[0]
    }

    /// Send side: the INI took it from its queue. Receive side: 0.
    pub fn dequeued_ns(&self) -> u64 {
        self.t[1]
    }

    /// Send side: the message's first datagram left through the socket.
    pub fn wired_ns(&self) -> u64 {
        self.t[3]
    }

    /// Receive side: the INI read the message's last datagram.
    pub fn arrived_ns(&self) -> u64 {
        self.t[0]
    }

    /// Receive side: the message was in its destination receive queue.
    pub fn delivered_ns(&self) -> u64 {
        self.t[1]
    }

    /// When the message entered this INI (enqueued or arrived), ns.
    pub fn start_ns(&self) -> u64 {
        self.t[0]
    }

    /// When this INI was done with it (on the wire or delivered), ns.
    pub fn end_ns(&self) -> u64 {
        match self.side {
            Side::Send => self.t[3],
            Side::Receive => self.t[1],
        }
    }

    /// When the INI started working on it (dequeued or arrived), ns.
    pub fn service_start_ns(&self) -> u64 {
        match self.side {
            Side::Send => self.t[1],
            Side::Receive => self.t[0],
        }
    }

    /// Writes the 64-byte encoding into `out`.
    pub fn encode(&self, out: &mut [u8; RECORD_BYTES]) {
        out.fill(0);
        out[0] = self.side as u8;
        out[1] = self.kind;
        out[2..4].copy_from_slice(&self.cluster.to_le_bytes());
        out[4..6].copy_from_slice(&self.ini.to_le_bytes());
        out[6..8].copy_from_slice(&self.peer_cluster.to_le_bytes());
        out[8..10].copy_from_slice(&self.peer_ini.to_le_bytes());
        out[10..12].copy_from_slice(&self.lane.to_le_bytes());
        out[12..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..20].copy_from_slice(&self.bytes.to_le_bytes());
        for (i, t) in self.t.iter().enumerate() {
            out[24 + 8 * i..32 + 8 * i].copy_from_slice(&t.to_le_bytes());
        }
    }

    /// Decodes one record; `index` (its position in the file) only names it in errors.
    ///
    /// # Errors
    /// [`TraceError::BadRecord`] for an unknown side or kind, timestamps out of order
    /// (each checkpoint no earlier than the one before it, unused ones 0) or nonzero
    /// reserved bytes.
    pub fn decode(b: &[u8; RECORD_BYTES], index: u64) -> Result<TraceRecord, TraceError> {
        let bad = |why: &'static str| TraceError::BadRecord { index, why };
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let side = match b[0] {
            1 => Side::Send,
            2 => Side::Receive,
            _ => return Err(bad("side is neither 1 (send) nor 2 (receive)")),
        };
        if !(1..=4).contains(&b[1]) {
            return Err(bad("frame kind is not 1..=4"));
        }
        if u32_at(20) != 0 || u64_at(56) != 0 {
            return Err(bad("reserved bytes are not zero"));
        }
        let t = [u64_at(24), u64_at(32), u64_at(40), u64_at(48)];
        let ordered = match side {
            Side::Send => t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3],
            Side::Receive => t[0] <= t[1] && t[2] == 0 && t[3] == 0,
        };
        if !ordered {
            return Err(bad("timestamps are not in checkpoint order"));
        }
        Ok(TraceRecord {
            side,
            kind: b[1],
            cluster: u16_at(2),
            ini: u16_at(4),
            peer_cluster: u16_at(6),
            peer_ini: u16_at(8),
            lane: u16_at(10),
            seq: u32_at(12),
            bytes: u32_at(16),
            t,
        })
    }
}

/// One INI's trace: records appended by whoever runs the INI's pass (the INI thread, or a
/// compute thread holding the INI's lock in the inline variant), so one writer at a time.
///
/// Memory is reserved up front; a full buffer counts what it drops instead of growing, so
/// tracing never allocates on the message path.
#[derive(Debug)]
pub struct TraceBuffer {
    records: Vec<TraceRecord>,
    capacity: usize,
    dropped: u64,
    first_ns: u64,
    last_ns: u64,
}

impl TraceBuffer {
    /// A buffer for up to `capacity` records (64 bytes each in memory and on disk),
    /// covering the INI's life from `now_ns`.
    pub fn new(capacity: usize, now_ns: u64) -> TraceBuffer {
        TraceBuffer {
            records: Vec::with_capacity(capacity),
            capacity,
            dropped: 0,
            first_ns: now_ns,
            last_ns: now_ns,
        }
    }

    /// Appends `r`, or counts it as dropped when the buffer is full.
    #[inline]
    pub fn push(&mut self, r: TraceRecord) {
        if self.records.len() < self.capacity {
            self.records.push(r);
        } else {
            self.dropped += 1;
        }
    }

    /// Marks the end of the traced span (the INI stopped, or the trace is being written).
    pub fn close(&mut self, now_ns: u64) {
        self.last_ns = self.last_ns.max(now_ns);
    }

    /// The records so far, in the order they were completed.
    pub fn records(&self) -> &[TraceRecord] {
        &self.records
    }

    /// Records that did not fit.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The traced span `(from, to)`, ns: from the buffer's creation to its last
    /// [`close`](TraceBuffer::close).
    pub fn span(&self) -> (u64, u64) {
        (self.first_ns, self.last_ns)
    }
}
