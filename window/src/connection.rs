//! One sliding-window connection: local INI ↔ one remote INI (thesis §3.2.1).
//!
//! Sender: a queue of whole messages; the message being sent and every message with
//! unacknowledged frames are kept whole, and an in-flight frame is (message, fragment
//! index), so a retransmission re-reads the original message at its offset (thesis
//! §4.4.1: no extra copy but the one into the datagram). New frames that fit together go
//! out in one BATCH datagram ([`WindowConfig::coalesce`]); a retransmission goes alone,
//! and the receiver takes a BATCH's frames one by one, as if they had arrived back to
//! back.
//!
//! Receiver: selective repeat. Frames in the window but ahead of the next expected one
//! are buffered in a ring of `window` slots (allocated on the first out-of-order frame,
//! each slot's buffer reused); in-order frames are reassembled straight from the
//! datagram. Every gap found is NAKed once; the SEND timeout recovers a lost NAK or a
//! lost retransmission.
//!
//! Selective ACK (ours; the thesis assumes a low loss rate): while frames are buffered
//! beyond a gap, the receiver's ACKs go out as standalone ACK frames carrying a bitmap of
//! what it holds (a piggy-backed ACK does not settle them), and the sender marks those
//! frames so their SEND timers no longer resend them. Without it, one frame lost twice
//! stalls the cumulative ACK and every later frame of the window times out and is resent.
//!
//! Timers are not owned here: the [`Ini`](super::Ini) keeps the per-kind lists of
//! thesis §3.2.2 and asks the connection whether a record is still current (lazy
//! cancellation by generation number).

use super::ini::{EnqueueError, Event, Rejected};
use super::stats::ConnStats;
use super::timers::TimerList;
use super::wire::{self, ConnId, FrameKind, Header};
use super::{ConnHandle, IniAddr, MAX_RTO_FACTOR, Micros, WindowConfig};
use std::collections::VecDeque;

/// Protocol parameters derived once from a validated [`WindowConfig`].
#[derive(Debug, Clone)]
pub(crate) struct Params {
    pub(crate) epoch: u64,
    /// Seals this INI's datagrams (derived from [`WindowConfig::mac_key`] and the epoch;
    /// its counter is this INI's: one `Params` per [`crate::Ini`]).
    pub(crate) key: wire::DatagramKey,
    pub(crate) window: u32,
    pub(crate) max_payload: usize,
    pub(crate) send_timeout: Micros,
    /// Largest adaptive retransmission timeout; equal to `send_timeout` when the timeout
    /// is fixed ([`WindowConfig::adaptive_timeout`] off).
    pub(crate) max_rto: Micros,
    pub(crate) ack_timeout: Micros,
    pub(crate) ack_every: u32,
    pub(crate) nak: bool,
    pub(crate) max_retransmits: Option<u32>,
    pub(crate) send_queue_capacity: usize,
    pub(crate) max_message_len: usize,
    pub(crate) initial_seq: u32,
    pub(crate) coalesce: bool,
}

impl Params {
    pub(crate) fn new(c: &WindowConfig) -> Params {
        Params {
            epoch: c.epoch,
            key: wire::DatagramKey::new(&c.mac_key, c.epoch),
            window: c.window,
            max_payload: c.max_payload(),
            send_timeout: c.send_timeout,
            max_rto: if c.adaptive_timeout {
                Micros(
                    c.send_timeout
                        .0
                        .saturating_mul(MAX_RTO_FACTOR)
                        .min(c.peer_timeout.0 / 16)
                        .max(c.send_timeout.0),
                )
            } else {
                c.send_timeout
            },
            ack_timeout: c.ack_timeout,
            ack_every: c.ack_every,
            nak: c.nak,
            max_retransmits: c.max_retransmits,
            send_queue_capacity: c.send_queue_capacity,
            max_message_len: c.max_message_len,
            initial_seq: c.initial_seq,
            coalesce: c.coalesce,
        }
    }

    /// Byte range of fragment `index` in a message of `len` bytes.
    fn fragment(&self, len: usize, index: u16) -> std::ops::Range<usize> {
        let start = usize::from(index) * self.max_payload;
        start..(start + self.max_payload).min(len)
    }

    /// Fragments needed for a message of `len` bytes (an empty message is one frame).
    /// `len <= max_message_len` keeps this within `u16` (checked by `validate`).
    fn frag_count(&self, len: usize) -> u16 {
        let n = len.div_ceil(self.max_payload).max(1);
        u16::try_from(n).unwrap_or(u16::MAX)
    }
}

/// The retransmission timeout of one connection (RFC 6298 §2–5, see
/// [`WindowConfig::adaptive_timeout`]): smoothed round trip and its mean deviation, µs.
#[derive(Clone, Copy, Debug)]
struct Rto {
    /// Timeout given to the next transmission.
    current: Micros,
    /// Smoothed round trip, µs; `None` before the first sample.
    srtt: Option<u64>,
    /// Mean deviation of the round trip, µs.
    rttvar: u64,
    /// When the timeout last backed off: the expiry of a frame sent before then belongs
    /// to the same loss episode and does not back off again (RFC 6298 §5.5 doubles once
    /// per expiry of its single timer; here every frame has its own).
    backed_off_at: Option<Micros>,
}

impl Rto {
    fn new(initial: Micros) -> Rto {
        Rto {
            current: initial,
            srtt: None,
            rttvar: 0,
            backed_off_at: None,
        }
    }

    /// Takes a round-trip sample `r` (RFC 6298 §2.2–2.3, gains 1/8 and 1/4) and sets the
    /// timeout to SRTT + 4·RTTVAR within `send_timeout..=max_rto`, ending any back-off.
    fn sample(&mut self, r: Micros, p: &Params) {
        let r = r.0;
        let (srtt, rttvar) = match self.srtt {
            None => (r, r / 2),
            Some(s) => (
                s - s / 8 + r / 8,
                self.rttvar - self.rttvar / 4 + s.abs_diff(r) / 4,
            ),
        };
        self.srtt = Some(srtt);
        self.rttvar = rttvar;
        self.current = Micros(
            srtt.saturating_add(rttvar.max(1).saturating_mul(4))
                .clamp(p.send_timeout.0, p.max_rto.0),
        );
        self.backed_off_at = None;
    }

    /// A frame last sent at `sent_at` timed out at `now`: doubles the timeout (at most
    /// `max_rto`) unless a frame sent after `sent_at` already did. Returns whether it
    /// doubled.
    fn back_off(&mut self, sent_at: Micros, now: Micros, p: &Params) -> bool {
        if self.backed_off_at.is_some_and(|t| sent_at < t) || self.current >= p.max_rto {
            return false;
        }
        self.current = Micros(self.current.0.saturating_mul(2).min(p.max_rto.0));
        self.backed_off_at = Some(now);
        true
    }
}

/// A SEND timer record: connection index, sequence number, transmission number.
pub(crate) type SendTimer = (u32, u32, u32);
/// An ACK timer record: connection index, ACK generation.
pub(crate) type AckTimer = (u32, u32);

/// A message with at least one fragment not yet acknowledged.
struct OutMsg {
    data: Vec<u8>,
    frag_count: u16,
    /// Next fragment to transmit for the first time.
    next_frag: u16,
}

/// An unacknowledged frame: where its bytes are, and its timer generation.
#[derive(Clone, Copy)]
struct SentFrame {
    msg_id: u64,
    frag_index: u16,
    /// Transmissions so far; a SEND timer record is current iff it carries this value.
    transmissions: u32,
    /// When it was last transmitted.
    sent_at: Micros,
    /// When its retransmission timeout (the connection's RTO at its last transmission)
    /// expires; its SEND timer records fire every `send_timeout` until then.
    due: Micros,
    /// SEND timer expiries so far.
    timeouts: u32,
    /// In `retx` already.
    retx_queued: bool,
    /// The receiver reported holding it (selective ACK): never resent.
    sacked: bool,
}

/// A buffered out-of-order frame.
#[derive(Default)]
struct Slot {
    present: bool,
    frag_index: u16,
    frag_count: u16,
    data: Vec<u8>,
}

/// Fragment bytes handed to the reassembler.
enum FragData<'a> {
    Borrowed(&'a [u8]),
    /// A buffered slot: a single-fragment message takes the buffer without copying.
    Owned(&'a mut Vec<u8>),
}

impl FragData<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            FragData::Borrowed(s) => s,
            FragData::Owned(v) => v,
        }
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            FragData::Borrowed(s) => s.to_vec(),
            FragData::Owned(v) => std::mem::take(v),
        }
    }
}

/// A message the reassembler completed: a single fragment, still where it arrived (the
/// datagram, or a buffered slot), or the fragments joined.
enum Complete<'a> {
    Single(FragData<'a>),
    Joined(Vec<u8>),
}

/// Where a connection's in-order messages go: the INI's event queue, or, for a message
/// complete in one fragment while no event waits (so that nothing delivered earlier is
/// overtaken), the caller's sink, which reads it in place.
pub(crate) struct Deliveries<'e, 's> {
    pub(crate) events: &'e mut VecDeque<Event>,
    pub(crate) sink: Option<Sink<'s>>,
}

/// The caller's sink of [`crate::Ini::handle_datagram_in_place`]: (the connection, its
/// peer INI, the message bytes read in place).
pub(crate) type Sink<'s> = &'s mut dyn FnMut(ConnHandle, IniAddr, &[u8]);

/// The message being reassembled from in-order fragments.
#[derive(Default)]
struct Reassembly {
    active: bool,
    next: u16,
    count: u16,
    buf: Vec<u8>,
}

impl Reassembly {
    /// Takes the next in-order fragment; returns a complete message.
    fn push<'d>(
        &mut self,
        index: u16,
        count: u16,
        data: FragData<'d>,
        max_len: usize,
        stats: &mut ConnStats,
    ) -> Option<Complete<'d>> {
        if self.active && (index != self.next || count != self.count) {
            stats.reassembly_errors += 1;
            self.active = false;
        }
        if !self.active {
            if index != 0 {
                stats.reassembly_errors += 1;
                return None;
            }
            if count == 1 {
                return Some(Complete::Single(data));
            }
            self.active = true;
            self.next = 0;
            self.count = count;
            self.buf = Vec::with_capacity(
                usize::from(count)
                    .saturating_mul(data.as_slice().len())
                    .min(max_len),
            );
        }
        let bytes = data.as_slice();
        if self.buf.len() + bytes.len() > max_len {
            stats.reassembly_errors += 1;
            self.active = false;
            self.buf = Vec::new();
            return None;
        }
        self.buf.extend_from_slice(bytes);
        self.next += 1;
        if self.next == self.count {
            self.active = false;
            return Some(Complete::Joined(std::mem::take(&mut self.buf)));
        }
        None
    }
}

/// State of one connection. See the module doc.
pub(crate) struct Connection {
    idx: u32,
    id: ConnId,
    // ---- sender ----
    /// Messages not yet started.
    pending: VecDeque<Vec<u8>>,
    /// Messages started and not fully acknowledged; `msgs[0]` has id `front_msg_id`.
    msgs: VecDeque<OutMsg>,
    front_msg_id: u64,
    /// Unacknowledged frames; `frames[0]` has sequence number `snd_base`.
    frames: VecDeque<SentFrame>,
    snd_base: u32,
    /// Sequence numbers to retransmit (NAK or SEND timeout), deduplicated by `retx_queued`.
    retx: VecDeque<u32>,
    /// Retransmission timeout of the next transmission ([`Rto`]).
    rto: Rto,
    /// Messages whose first fragment the last datagram [`poll_write`](Self::poll_write)
    /// wrote (first transmissions): they entered the window (more than one in a BATCH).
    pub(crate) started_messages: u16,
    /// The last datagram [`poll_write`](Self::poll_write) wrote is a DATA frame (a first
    /// transmission or a retransmission), not an ACK or NAK.
    pub(crate) wrote_data: bool,
    /// Last time the window moved (or became non-empty); liveness is measured from here.
    last_progress: Micros,
    /// Latest time the transport vouched that the peer's process was alive although it
    /// did not acknowledge ([`Ini::note_alive`](crate::Ini::note_alive)); liveness is
    /// measured from the later of this and `last_progress`.
    alive_at: Micros,
    pub(crate) liveness_armed: bool,
    unresponsive: bool,
    // ---- receiver ----
    rcv_next: u32,
    /// One past the highest sequence number received; `rcv_max - rcv_next <= window`.
    rcv_max: u32,
    slots: Vec<Slot>,
    slot_head: usize,
    buffered: u32,
    asm: Reassembly,
    naks: VecDeque<u32>,
    ack_now: bool,
    ack_armed: bool,
    ack_gen: u32,
    since_ack: u32,
    // ---- scheduling ----
    pub(crate) in_ready: bool,
    pub(crate) stats: ConnStats,
}

impl Connection {
    pub(crate) fn new(idx: u32, local: IniAddr, peer: IniAddr, p: &Params) -> Connection {
        Connection {
            idx,
            id: ConnId {
                src: local,
                dst: peer,
            },
            pending: VecDeque::new(),
            msgs: VecDeque::new(),
            front_msg_id: 0,
            frames: VecDeque::new(),
            snd_base: p.initial_seq,
            retx: VecDeque::new(),
            rto: Rto::new(p.send_timeout),
            started_messages: 0,
            wrote_data: false,
            last_progress: Micros::ZERO,
            alive_at: Micros::ZERO,
            liveness_armed: false,
            unresponsive: false,
            rcv_next: p.initial_seq,
            rcv_max: p.initial_seq,
            slots: Vec::new(),
            slot_head: 0,
            buffered: 0,
            asm: Reassembly::default(),
            naks: VecDeque::new(),
            ack_now: false,
            ack_armed: false,
            ack_gen: 0,
            since_ack: 0,
            in_ready: false,
            stats: ConnStats::default(),
        }
    }

    pub(crate) fn peer(&self) -> IniAddr {
        self.id.dst
    }

    pub(crate) fn handle(&self) -> ConnHandle {
        ConnHandle(self.idx)
    }

    pub(crate) fn queued(&self) -> usize {
        self.pending.len()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.frames.len()
    }

    pub(crate) fn next_seq(&self) -> u32 {
        self.snd_base.wrapping_add(self.frames.len() as u32)
    }

    pub(crate) fn rcv_next(&self) -> u32 {
        self.rcv_next
    }

    pub(crate) fn is_unresponsive(&self) -> bool {
        self.unresponsive
    }

    /// Nothing queued, nothing unacknowledged, no ACK or NAK owed, nothing buffered.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty()
            && self.frames.is_empty()
            && self.naks.is_empty()
            && !self.ack_now
            && !self.ack_armed
            && self.buffered == 0
    }

    pub(crate) fn enqueue(&mut self, msg: Vec<u8>, p: &Params) -> Result<(), EnqueueError> {
        if self.unresponsive {
            return Err(EnqueueError::PeerUnresponsive(msg));
        }
        if msg.len() > p.max_message_len {
            return Err(EnqueueError::TooLarge(msg));
        }
        if self.pending.len() >= p.send_queue_capacity {
            return Err(EnqueueError::Full(msg));
        }
        self.pending.push_back(msg);
        self.stats.msgs_enqueued += 1;
        Ok(())
    }

    fn has_new_data(&self) -> bool {
        !self.pending.is_empty() || self.msgs.back().is_some_and(|m| m.next_frag < m.frag_count)
    }

    /// Whether [`poll_write`](Self::poll_write) may produce a datagram (it may still
    /// return `None` when the only work was stale).
    pub(crate) fn wants_transmit(&self, p: &Params) -> bool {
        !self.naks.is_empty() || self.ack_now || self.data_ready(p)
    }

    /// Whether this connection has DATA it may send now: [`data_waiting`](Self::data_waiting)
    /// that is a retransmission, or new data with room in the window.
    pub(crate) fn data_ready(&self, p: &Params) -> bool {
        self.data_waiting() && (!self.retx.is_empty() || self.frames.len() < p.window as usize)
    }

    /// Whether this connection has DATA to send, now or once an ACK opens its window: a
    /// retransmission or new data (ACK- and NAK-only datagrams do not count).
    pub(crate) fn data_waiting(&self) -> bool {
        !self.unresponsive && (!self.retx.is_empty() || self.has_new_data())
    }

    /// Writes the next datagram of this connection into `buf` (at least the MTU long).
    /// Order: NAKs, retransmissions, new DATA while the window has room, standalone ACK.
    /// Every datagram carries the cumulative ACK, so any of them settles an owed ACK.
    pub(crate) fn poll_write(
        &mut self,
        now: Micros,
        p: &Params,
        buf: &mut [u8],
        send_timers: &mut TimerList<SendTimer>,
    ) -> Option<usize> {
        self.started_messages = 0;
        self.wrote_data = false;
        while let Some(seq) = self.naks.pop_front() {
            if self.still_missing(seq, p) {
                self.stats.naks_sent += 1;
                return Some(self.write_control(FrameKind::Nak, seq, p, buf));
            }
        }
        if self.ack_now && self.buffered > 0 {
            // A selective ACK is owed: send it before more DATA so the peer stops resending
            // what we hold.
            self.stats.acks_sent += 1;
            return Some(self.write_ack(p, buf));
        }
        if !self.unresponsive {
            while let Some(seq) = self.retx.pop_front() {
                let d = seq.wrapping_sub(self.snd_base) as usize;
                let Some(f) = self.frames.get_mut(d) else {
                    continue; // acknowledged since it was queued
                };
                if !f.retx_queued || f.sacked {
                    continue;
                }
                f.retx_queued = false;
                f.transmissions += 1;
                f.sent_at = now;
                f.due = now + self.rto.current;
                let tx = f.transmissions;
                send_timers.push(now + p.send_timeout, (self.idx, seq, tx));
                self.stats.retransmissions += 1;
                self.stats.data_frames_sent += 1;
                return Some(self.write_data(seq, d, p, buf));
            }
            if self.frames.len() < p.window as usize
                && let Some(n) = self.write_new(now, p, buf, send_timers)
            {
                return Some(n);
            }
        }
        if self.ack_now {
            self.stats.acks_sent += 1;
            return Some(self.write_ack(p, buf));
        }
        None
    }

    /// Length in bytes of the next new frame's data: the next fragment of the newest
    /// message, or the first of the next queued one; `None` when there is none.
    fn next_new_len(&self, p: &Params) -> Option<usize> {
        match self.msgs.back() {
            Some(m) if m.next_frag < m.frag_count => {
                Some(p.fragment(m.data.len(), m.next_frag).len())
            }
            _ => self.pending.front().map(|d| p.fragment(d.len(), 0).len()),
        }
    }

    /// Puts the next new frame in flight (its SEND timer started) and returns its
    /// position in `frames`; `None` when nothing is queued.
    fn push_new(
        &mut self,
        now: Micros,
        p: &Params,
        send_timers: &mut TimerList<SendTimer>,
    ) -> Option<usize> {
        if self.msgs.back().is_none_or(|m| m.next_frag >= m.frag_count) {
            let data = self.pending.pop_front()?;
            let frag_count = p.frag_count(data.len());
            self.msgs.push_back(OutMsg {
                data,
                frag_count,
                next_frag: 0,
            });
        }
        let msg_id = self.front_msg_id + self.msgs.len() as u64 - 1;
        let m = self.msgs.back_mut()?;
        let frag_index = m.next_frag;
        m.next_frag += 1;
        if frag_index == 0 {
            self.started_messages += 1;
        }
        if m.next_frag == m.frag_count {
            self.stats.msgs_sent += 1;
            self.stats.bytes_sent += m.data.len() as u64;
        }
        if self.frames.is_empty() {
            self.last_progress = now;
        }
        let seq = self.next_seq();
        self.frames.push_back(SentFrame {
            msg_id,
            frag_index,
            transmissions: 1,
            sent_at: now,
            due: now + self.rto.current,
            timeouts: 0,
            retx_queued: false,
            sacked: false,
        });
        send_timers.push(now + p.send_timeout, (self.idx, seq, 1));
        self.stats.data_frames_sent += 1;
        Some(self.frames.len() - 1)
    }

    /// Writes new frames: one DATA datagram, or — with [`Params::coalesce`], when the
    /// next frames fit in one datagram and in the window — a BATCH of as many as fit
    /// (see [`wire`]).
    fn write_new(
        &mut self,
        now: Micros,
        p: &Params,
        buf: &mut [u8],
        send_timers: &mut TimerList<SendTimer>,
    ) -> Option<usize> {
        let first_len = self.next_new_len(p)?;
        let d = self.push_new(now, p, send_timers)?;
        let seq = self.snd_base.wrapping_add(d as u32);
        let entry = |len: usize| wire::BATCH_ENTRY_HEADER + len;
        let joins = |c: &Connection, used: usize, count: u16| {
            count < u16::MAX
                && c.frames.len() < p.window as usize
                && c.next_new_len(p)
                    .is_some_and(|len| used + entry(len) <= p.max_payload)
        };
        if !p.coalesce || !joins(self, entry(first_len), 1) {
            return Some(self.write_data(seq, d, p, buf));
        }
        let mut used = self.put_batch_frame(d, 0, p, buf);
        let mut count = 1u16;
        while joins(self, used, count) {
            let Some(d) = self.push_new(now, p, send_timers) else {
                break;
            };
            used = self.put_batch_frame(d, used, p, buf);
            count += 1;
        }
        let header = Header {
            frag_count: count,
            ..self.header(FrameKind::Batch, seq, p)
        };
        self.stats.batches_sent += 1;
        self.stats.frames_in_batches_sent += u64::from(count);
        let n = wire::seal(&header, used, &p.key, buf);
        self.ack_sent(false);
        self.wrote_data = true;
        Some(n)
    }

    /// Appends in-flight frame `d` to the BATCH payload in `buf` (`used` bytes so far);
    /// returns the new payload length.
    fn put_batch_frame(&self, d: usize, used: usize, p: &Params, buf: &mut [u8]) -> usize {
        let (frag_index, frag_count, data) = self.frame(d, p);
        wire::put_batch_frame(buf, used, frag_index, frag_count, data)
    }

    /// In-flight frame `d`: its fragment index, its message's fragment count and its
    /// bytes (read from the message, thesis §4.4.1).
    fn frame(&self, d: usize, p: &Params) -> (u16, u16, &[u8]) {
        let f = self.frames[d];
        let m = &self.msgs[(f.msg_id - self.front_msg_id) as usize];
        (
            f.frag_index,
            m.frag_count,
            &m.data[p.fragment(m.data.len(), f.frag_index)],
        )
    }

    /// Encodes in-flight frame `d` (sequence number `seq`) from its message.
    fn write_data(&mut self, seq: u32, d: usize, p: &Params, buf: &mut [u8]) -> usize {
        let (frag_index, frag_count, data) = self.frame(d, p);
        let header = Header {
            frag_index,
            frag_count,
            ..self.header(FrameKind::Data, seq, p)
        };
        let n = wire::write_frame(&header, data, &p.key, buf);
        self.ack_sent(false);
        self.wrote_data = true;
        n
    }

    /// A header of `kind` from this connection, its cumulative ACK current and no
    /// fragment fields (DATA and BATCH set theirs).
    fn header(&self, kind: FrameKind, seq: u32, p: &Params) -> Header {
        Header {
            kind,
            epoch: p.epoch,
            conn: self.id,
            seq,
            ack: self.rcv_next,
            frag_index: 0,
            frag_count: 0,
        }
    }

    fn write_control(&mut self, kind: FrameKind, seq: u32, p: &Params, buf: &mut [u8]) -> usize {
        let n = wire::write_frame(&self.header(kind, seq, p), &[], &p.key, buf);
        self.ack_sent(false);
        n
    }

    /// A standalone ACK whose payload is the selective-ACK bitmap of the frames buffered
    /// beyond the cumulative ACK (see [`wire`]), written in place.
    fn write_ack(&mut self, p: &Params, buf: &mut [u8]) -> usize {
        let mut len = 0;
        if self.buffered > 0 {
            // Sequence numbers rcv_next + 1 .. rcv_max may be buffered.
            let span = (self.rcv_max.wrapping_sub(self.rcv_next) as usize)
                .saturating_sub(1)
                .min(p.max_payload * 8);
            len = span.div_ceil(8);
            let bitmap = &mut buf[wire::HEADER_LEN..wire::HEADER_LEN + len];
            bitmap.fill(0);
            for i in 0..span {
                if self.slot_present(i as u32 + 1, p) {
                    bitmap[i / 8] |= 1 << (i % 8);
                }
            }
        }
        let n = wire::seal(&self.header(FrameKind::Ack, 0, p), len, &p.key, buf);
        self.ack_sent(true);
        n
    }

    /// The cumulative ACK went out: cancel the ACK timer (lazily) and the owed ACK —
    /// unless frames are buffered out of order and this was not a standalone ACK, whose
    /// selective-ACK bitmap is then still owed.
    fn ack_sent(&mut self, standalone: bool) {
        if standalone || self.buffered == 0 {
            self.ack_now = false;
            self.ack_armed = false;
            self.ack_gen = self.ack_gen.wrapping_add(1);
            self.since_ack = 0;
        }
    }

    fn still_missing(&self, seq: u32, p: &Params) -> bool {
        let d = seq.wrapping_sub(self.rcv_next);
        d < p.window && !self.slot_present(d, p)
    }

    fn slot_present(&self, d: u32, p: &Params) -> bool {
        !self.slots.is_empty()
            && self.slots[(self.slot_head + d as usize) % p.window as usize].present
    }

    /// Handles a decoded frame of this connection (epoch, MAC and addresses already checked).
    pub(crate) fn on_frame(
        &mut self,
        now: Micros,
        h: &Header,
        payload: &[u8],
        p: &Params,
        ack_timers: &mut TimerList<AckTimer>,
        out: &mut Deliveries<'_, '_>,
    ) -> Result<(), Rejected> {
        self.on_cumulative_ack(h.ack, now, p);
        match h.kind {
            FrameKind::Ack => {
                self.stats.acks_received += 1;
                self.on_sack(h.ack, payload, now, p);
                Ok(())
            }
            FrameKind::Nak => {
                self.stats.naks_received += 1;
                self.on_nak(h.seq);
                Ok(())
            }
            FrameKind::Data => self.on_data(now, h, payload, p, ack_timers, out),
            FrameKind::Batch => {
                // Its frames, one by one, as if they had arrived back to back (wire
                // docs); the first rejection is reported, the other frames still count.
                self.stats.batches_received += 1;
                let mut result = Ok(());
                for f in wire::BatchFrames::new(h.seq, payload) {
                    self.stats.frames_in_batches_received += 1;
                    let frame = Header {
                        kind: FrameKind::Data,
                        seq: f.seq,
                        frag_index: f.frag_index,
                        frag_count: f.frag_count,
                        ..*h
                    };
                    let r = self.on_data(now, &frame, f.data, p, ack_timers, out);
                    if result.is_ok() {
                        result = r;
                    }
                }
                result
            }
        }
    }

    /// Slides the send window to `ack` if it acknowledges in-flight frames (thesis
    /// §3.2.1); older or impossible ACKs are ignored.
    fn on_cumulative_ack(&mut self, ack: u32, now: Micros, p: &Params) {
        let d = ack.wrapping_sub(self.snd_base) as usize;
        if d == 0 || d > self.frames.len() {
            return;
        }
        // Karn's rule: only a frame sent once gives an unambiguous round trip; the last
        // one acknowledged was sent latest, so its sample is the least inflated by the
        // receiver's delayed ACK.
        if let Some(f) = self
            .frames
            .range(..d)
            .rev()
            .find(|f| f.transmissions == 1 && !f.sacked)
        {
            self.rto.sample(now.saturating_sub(f.sent_at), p);
            self.stats.rtt_samples += 1;
        }
        for f in self.frames.drain(..d) {
            if f.msg_id == self.front_msg_id
                && let Some(m) = self.msgs.front()
                && f.frag_index + 1 == m.frag_count
            {
                self.msgs.pop_front();
                self.front_msg_id += 1;
                self.stats.msgs_acked += 1;
            }
        }
        self.snd_base = ack;
        self.last_progress = now;
    }

    /// Marks the frames a selective-ACK bitmap (relative to `ack`) reports as held.
    /// The newest of them newly reported and sent once gives a round-trip sample: while
    /// a lost frame holds the cumulative ACK back, selective ACKs are the only samples,
    /// and without them the retransmission timeout would keep backing off with every
    /// later loss (as TCP samples on selective ACKs, RFC 6675 §5).
    fn on_sack(&mut self, ack: u32, bitmap: &[u8], now: Micros, p: &Params) {
        // No honest bitmap is longer than the window.
        let most = (p.window as usize).div_ceil(8) + 1;
        let mut newest: Option<Micros> = None;
        for (j, &byte) in bitmap.iter().take(most).enumerate() {
            for i in 0..8 {
                if byte & (1 << i) != 0 {
                    let seq = ack.wrapping_add(1 + (8 * j + i) as u32);
                    let d = seq.wrapping_sub(self.snd_base) as usize;
                    if let Some(f) = self.frames.get_mut(d) {
                        if !f.sacked && f.transmissions == 1 {
                            newest = Some(newest.map_or(f.sent_at, |t| t.max(f.sent_at)));
                        }
                        f.sacked = true;
                    }
                }
            }
        }
        if let Some(sent_at) = newest {
            self.rto.sample(now.saturating_sub(sent_at), p);
            self.stats.rtt_samples += 1;
        }
    }

    fn on_nak(&mut self, seq: u32) {
        let d = seq.wrapping_sub(self.snd_base) as usize;
        if let Some(f) = self.frames.get_mut(d)
            && !f.retx_queued
            && !f.sacked
        {
            f.retx_queued = true;
            self.retx.push_back(seq);
        }
    }

    fn on_data(
        &mut self,
        now: Micros,
        h: &Header,
        payload: &[u8],
        p: &Params,
        ack_timers: &mut TimerList<AckTimer>,
        out: &mut Deliveries<'_, '_>,
    ) -> Result<(), Rejected> {
        self.stats.data_frames_received += 1;
        let w = p.window;
        let d = h.seq.wrapping_sub(self.rcv_next);
        if d >= w {
            let back = self.rcv_next.wrapping_sub(h.seq);
            if (1..=w).contains(&back) {
                // Already delivered: our ACK was probably lost, so ACK at once.
                self.stats.duplicates += 1;
                self.ack_now = true;
                return Err(Rejected::Duplicate);
            }
            self.stats.out_of_window += 1;
            return Err(Rejected::OutOfWindow);
        }
        if d == 0 {
            self.stats.frames_accepted += 1;
            let ahead = self.rcv_max.wrapping_sub(self.rcv_next);
            self.accept_in_order(
                h.frag_index,
                h.frag_count,
                FragData::Borrowed(payload),
                p,
                out,
            );
            let mut advanced = 1;
            while self.buffered > 0 {
                let head = self.slot_head;
                let slot = &mut self.slots[head];
                if !slot.present {
                    break;
                }
                slot.present = false;
                let (fi, fc) = (slot.frag_index, slot.frag_count);
                let mut data = std::mem::take(&mut slot.data);
                self.buffered -= 1;
                self.accept_in_order(fi, fc, FragData::Owned(&mut data), p, out);
                // Give the buffer back to its (now empty) slot for reuse, unless a
                // single-fragment message took it.
                data.clear();
                self.slots[head].data = data;
                advanced += 1;
            }
            if advanced >= ahead {
                self.rcv_max = self.rcv_next;
            }
        } else {
            if self.slots.is_empty() {
                self.slots.resize_with(w as usize, Slot::default);
            }
            let i = (self.slot_head + d as usize) % w as usize;
            let slot = &mut self.slots[i];
            if slot.present {
                self.stats.duplicates += 1;
                self.ack_now = true;
                return Err(Rejected::Duplicate);
            }
            slot.present = true;
            slot.frag_index = h.frag_index;
            slot.frag_count = h.frag_count;
            slot.data.clear();
            slot.data.extend_from_slice(payload);
            self.buffered += 1;
            self.stats.frames_accepted += 1;
            let ahead = self.rcv_max.wrapping_sub(self.rcv_next);
            if d >= ahead {
                if p.nak {
                    // Every sequence number between the highest received and this one is
                    // a new gap (thesis §3.2.1: NAK on out-of-order arrival).
                    let mut hole = self.rcv_max;
                    while hole != h.seq {
                        self.naks.push_back(hole);
                        hole = hole.wrapping_add(1);
                    }
                }
                self.rcv_max = h.seq.wrapping_add(1);
            }
        }
        self.since_ack += 1;
        if self.since_ack >= p.ack_every {
            self.ack_now = true;
        } else if !self.ack_armed && !self.ack_now {
            self.ack_armed = true;
            ack_timers.push(now + p.ack_timeout, (self.idx, self.ack_gen));
        }
        Ok(())
    }

    /// Consumes the frame at `rcv_next` and slides the receive window by one.
    fn accept_in_order(
        &mut self,
        frag_index: u16,
        frag_count: u16,
        data: FragData<'_>,
        p: &Params,
        out: &mut Deliveries<'_, '_>,
    ) {
        if let Some(msg) = self.asm.push(
            frag_index,
            frag_count,
            data,
            p.max_message_len,
            &mut self.stats,
        ) {
            self.stats.msgs_delivered += 1;
            let conn = ConnHandle(self.idx);
            match (msg, out.sink.as_mut()) {
                (Complete::Single(data), Some(sink)) if out.events.is_empty() => {
                    let bytes = data.as_slice();
                    self.stats.bytes_delivered += bytes.len() as u64;
                    sink(conn, self.peer(), bytes);
                }
                (msg, _) => {
                    let msg = match msg {
                        Complete::Single(data) => data.into_vec(),
                        Complete::Joined(v) => v,
                    };
                    self.stats.bytes_delivered += msg.len() as u64;
                    out.events.push_back(Event::Delivered { conn, msg });
                }
            }
        }
        self.rcv_next = self.rcv_next.wrapping_add(1);
        self.slot_head = (self.slot_head + 1) % p.window as usize;
    }

    /// Whether SEND timer record (`seq`, `tx`) is current.
    pub(crate) fn send_timer_live(&self, seq: u32, tx: u32) -> bool {
        let d = seq.wrapping_sub(self.snd_base) as usize;
        !self.unresponsive
            && self
                .frames
                .get(d)
                .is_some_and(|f| f.transmissions == tx && !f.sacked)
    }

    /// A current SEND timer record of frame `seq` expired at `now`. Before the frame's
    /// own retransmission timeout is due (an adaptive RTO above `send_timeout`), the
    /// record is pushed again for then, or for one `send_timeout` later, whichever comes
    /// first (so the timer list keeps its fixed-timeout order). Otherwise the frame is
    /// queued for retransmission and the RTO backs off. Returns true when the frame has
    /// used up `max_retransmits` and the peer is to be declared unresponsive.
    pub(crate) fn on_send_timeout(
        &mut self,
        seq: u32,
        tx: u32,
        now: Micros,
        p: &Params,
        send_timers: &mut TimerList<SendTimer>,
    ) -> bool {
        let d = seq.wrapping_sub(self.snd_base) as usize;
        let Some(f) = self.frames.get_mut(d) else {
            return false;
        };
        if now < f.due {
            send_timers.push(f.due.min(now + p.send_timeout), (self.idx, seq, tx));
            return false;
        }
        if self.rto.back_off(f.sent_at, now, p) {
            self.stats.rto_backoffs += 1;
        }
        f.timeouts += 1;
        self.stats.send_timeouts += 1;
        if p.max_retransmits.is_some_and(|max| f.timeouts > max) {
            return true;
        }
        if !f.retx_queued {
            f.retx_queued = true;
            self.retx.push_back(seq);
        }
        false
    }

    /// Whether ACK timer record `generation` is current.
    pub(crate) fn ack_timer_live(&self, generation: u32) -> bool {
        self.ack_armed && self.ack_gen == generation
    }

    /// A current ACK timer expired: owe a standalone ACK now.
    pub(crate) fn on_ack_timeout(&mut self) {
        self.ack_armed = false;
        self.ack_now = true;
    }

    /// When the peer is to be declared unresponsive if no ACK progress happens first;
    /// `None` when nothing is unacknowledged.
    pub(crate) fn liveness_deadline(&self, peer_timeout: Micros) -> Option<Micros> {
        (!self.unresponsive && !self.frames.is_empty())
            .then(|| self.last_progress.max(self.alive_at) + peer_timeout)
    }

    /// The peer's process was seen alive at `at` (see `Ini::note_alive`).
    pub(crate) fn note_alive(&mut self, at: Micros) {
        self.alive_at = self.alive_at.max(at);
    }

    /// Stops the send direction for good; the receive direction keeps working.
    pub(crate) fn fail(&mut self) {
        self.unresponsive = true;
        self.retx.clear();
    }

    /// For an unresponsive connection: every message not known to be acknowledged, in
    /// order (those that were in flight first; they may have been delivered).
    pub(crate) fn take_unacknowledged(&mut self) -> Vec<Vec<u8>> {
        if !self.unresponsive {
            return Vec::new();
        }
        self.frames.clear();
        self.front_msg_id += self.msgs.len() as u64;
        let mut out: Vec<Vec<u8>> = self.msgs.drain(..).map(|m| m.data).collect();
        out.extend(self.pending.drain(..));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(adaptive_timeout: bool) -> Params {
        Params::new(&WindowConfig {
            send_timeout: Micros(2_000),
            ack_timeout: Micros(200),
            peer_timeout: Micros::from_millis(3_000),
            adaptive_timeout,
            ..WindowConfig::default()
        })
    }

    /// RFC 6298 §2: the first sample sets SRTT = R and RTTVAR = R/2; the timeout stays
    /// between `send_timeout` and the cap (64 × 2 ms = 128 ms < 3 s / 16 = 187.5 ms).
    #[test]
    fn the_timeout_follows_the_samples_within_its_bounds() {
        let p = params(true);
        assert_eq!(p.max_rto, Micros(128_000));
        let mut rto = Rto::new(p.send_timeout);
        rto.sample(Micros(100), &p);
        assert_eq!(
            rto.current, p.send_timeout,
            "100 + 4 × 50 µs is below the floor"
        );
        rto.sample(Micros(6_000), &p);
        // SRTT = 100 − 12 + 750 = 838, RTTVAR = 50 − 12 + 5,900 / 4 = 1,513.
        assert_eq!((rto.srtt, rto.rttvar), (Some(838), 1_513));
        assert_eq!(rto.current, Micros(838 + 4 * 1_513));
        rto.sample(Micros(10_000_000), &p);
        assert_eq!(rto.current, p.max_rto, "capped");
    }

    /// An expiry doubles the timeout once per loss episode: frames sent before the
    /// back-off do not double it again, a frame sent after it does, and a sample ends it.
    #[test]
    fn an_expiry_backs_off_once_per_episode() {
        let p = params(true);
        let mut rto = Rto::new(p.send_timeout);
        assert!(rto.back_off(Micros(0), Micros(2_000), &p));
        assert_eq!(rto.current, Micros(4_000));
        assert!(
            !rto.back_off(Micros(10), Micros(2_010), &p),
            "sent before the back-off"
        );
        assert!(rto.back_off(Micros(2_000), Micros(6_000), &p));
        assert_eq!(rto.current, Micros(8_000));
        rto.sample(Micros(300), &p);
        assert_eq!(rto.current, Micros(2_000));
        for i in 0..20 {
            rto.back_off(Micros(i * 1_000_000), Micros(i * 1_000_000 + 1), &p);
        }
        assert_eq!(rto.current, p.max_rto);
    }

    /// Without the adaptive timeout nothing moves it (the thesis' fixed SEND timeout).
    #[test]
    fn a_fixed_timeout_never_moves() {
        let p = params(false);
        let mut rto = Rto::new(p.send_timeout);
        rto.sample(Micros(50_000), &p);
        assert!(!rto.back_off(Micros(0), Micros(2_000), &p));
        assert_eq!(rto.current, p.send_timeout);
    }
}
