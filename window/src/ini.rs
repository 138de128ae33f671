//! One INI's protocol state: a connection per remote INI, their send queues, the
//! software timer lists, and the transmit scheduler (thesis §3.1, §3.2).

use super::connection::{AckTimer, Connection, Deliveries, Params, SendTimer, Sink};
use super::stats::{ConnStats, IniStats};
use super::timers::TimerList;
use super::wire::{self, DecodeError};
use super::{ConfigError, ConnHandle, IniAddr, Micros, WindowConfig};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use thiserror::Error;

/// Something that happened inside an [`Ini`], taken with [`Ini::poll_event`].
#[derive(Clone, PartialEq, Eq)]
pub enum Event {
    /// A whole message arrived on `conn`. Messages of one connection are delivered
    /// exactly once and in the order they were enqueued at the peer (thesis §3.2: in-order
    /// delivery holds per connection only).
    Delivered {
        /// The connection it arrived on.
        conn: ConnHandle,
        /// The message bytes, as the peer enqueued them.
        msg: Vec<u8>,
    },
    /// Frames to `peer` stayed unacknowledged for [`WindowConfig::peer_timeout`] (or one
    /// frame timed out more than [`WindowConfig::max_retransmits`] times). The connection
    /// stops sending; [`Ini::take_unacknowledged`] gives back its messages. Reported once.
    PeerUnresponsive {
        /// The connection.
        conn: ConnHandle,
        /// The remote INI.
        peer: IniAddr,
    },
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Delivered { conn, msg } => f
                .debug_struct("Delivered")
                .field("conn", conn)
                .field("len", &msg.len())
                .finish(),
            Event::PeerUnresponsive { conn, peer } => f
                .debug_struct("PeerUnresponsive")
                .field("conn", conn)
                .field("peer", peer)
                .finish(),
        }
    }
}

/// A datagram written by [`Ini::poll_transmit`]: send `buf[..len]` to `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The connection it belongs to.
    pub conn: ConnHandle,
    /// The remote INI to send it to (the caller maps it to a socket address).
    pub peer: IniAddr,
    /// Datagram length in bytes, at most [`WindowConfig::mtu`].
    pub len: usize,
    /// Messages whose first fragment this datagram carries for the first time: they have
    /// just entered the sliding window (messages of one connection enter it in the order
    /// they were enqueued; a BATCH datagram may start several). Per-message traces use
    /// it (paper 002 §4.4.2).
    pub messages_started: u16,
    /// DATA (first transmissions or a retransmission, the ACK piggy-backed): a DATA or a
    /// BATCH datagram; `false` for an ACK- or NAK-only datagram. The emulated gap *g* (paper 001 §3.2) stalls only
    /// after DATA injections.
    pub data: bool,
}

/// [`Ini::enqueue`] refused a message; it is handed back, never dropped (style practice 4).
#[derive(Clone, PartialEq, Eq, Error)]
pub enum EnqueueError {
    /// The connection's send queue holds [`WindowConfig::send_queue_capacity`] messages.
    #[error("send queue full")]
    Full(Vec<u8>),
    /// Longer than [`WindowConfig::max_message_len`].
    #[error("message of {} bytes exceeds max_message_len", .0.len())]
    TooLarge(Vec<u8>),
    /// The connection reported [`Event::PeerUnresponsive`] and no longer sends.
    #[error("peer unresponsive")]
    PeerUnresponsive(Vec<u8>),
    /// The handle does not name a connection of this INI.
    #[error("unknown connection")]
    UnknownConnection(Vec<u8>),
}

impl EnqueueError {
    /// The message that was not enqueued.
    pub fn into_inner(self) -> Vec<u8> {
        match self {
            EnqueueError::Full(m)
            | EnqueueError::TooLarge(m)
            | EnqueueError::PeerUnresponsive(m)
            | EnqueueError::UnknownConnection(m) => m,
        }
    }
}

impl fmt::Debug for EnqueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, m) = match self {
            EnqueueError::Full(m) => ("Full", m),
            EnqueueError::TooLarge(m) => ("TooLarge", m),
            EnqueueError::PeerUnresponsive(m) => ("PeerUnresponsive", m),
            EnqueueError::UnknownConnection(m) => ("UnknownConnection", m),
        };
        write!(f, "{name}(<{} bytes>)", m.len())
    }
}

/// Why [`Ini::handle_datagram`] discarded a datagram (each reason is also counted in
/// [`IniStats`] or [`ConnStats`]). Receiving such datagrams is normal on a lossy network;
/// callers usually ignore the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum Rejected {
    /// Malformed, from another run ([`DecodeError::WrongEpoch`]) or not authenticated
    /// under this job's secret ([`DecodeError::BadMac`]: corrupted or forged).
    #[error("undecodable datagram: {0}")]
    Decode(DecodeError),
    /// Came from a network address that is not the registered address of the INI it
    /// claims to be (see [`Ini::handle_datagram_from`]).
    #[error("from an address that is not the registered peer INI's")]
    UnknownSource,
    /// Addressed to another INI.
    #[error("addressed to {0}")]
    Misdirected(IniAddr),
    /// From an INI with no connection here.
    #[error("from unknown {0}")]
    UnknownPeer(IniAddr),
    /// DATA whose sequence number was already received (thesis §3.2.1).
    #[error("duplicate frame")]
    Duplicate,
    /// DATA whose sequence number is outside the receive window (thesis §3.2.1).
    #[error("frame outside the receive window")]
    OutOfWindow,
}

/// [`Ini::add_peer`] refused a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum AddPeerError {
    /// The peer is this INI itself.
    #[error("{0} is the local INI")]
    IsLocal(IniAddr),
    /// A connection to the peer exists already.
    #[error("already connected, as connection {0:?}")]
    AlreadyConnected(ConnHandle),
}

/// The protocol state of one INI thread (thesis §3.1, §3.2), sans I/O.
///
/// # Calling contract
///
/// The caller owns the UDP socket and the clock, and runs this loop on one thread:
///
/// 1. For each received datagram: [`handle_datagram(now, bytes)`](Self::handle_datagram).
/// 2. For each outgoing message: [`enqueue(conn, msg)`](Self::enqueue); on
///    [`EnqueueError::Full`] keep the message and retry after transmitting.
/// 3. Drain [`poll_transmit(now, buf)`](Self::poll_transmit) until `None`, sending
///    `buf[..len]` to the peer each time. `buf` must be at least `mtu` bytes. Call it
///    after every `handle_datagram`, `enqueue` and `handle_timeout`.
/// 4. Drain [`poll_event`](Self::poll_event) (deliveries, unresponsive peers).
/// 5. Call [`poll_timeout`](Self::poll_timeout) and wait for a datagram or that instant,
///    whichever is first; at or after it call [`handle_timeout(now)`](Self::handle_timeout)
///    and go to 3. `None` means no timer is pending.
///
/// `now` is in µs on a monotonic clock; a `now` earlier than one already seen is treated
/// as the latest one seen. Nothing here blocks, allocates per frame on the send path, or
/// drops a message silently: a message is delivered, handed back by `enqueue`, or (after
/// [`Event::PeerUnresponsive`]) handed back by [`take_unacknowledged`](Self::take_unacknowledged).
///
/// # Scheduling (thesis §3.1)
///
/// Connections with something to send wait in a FIFO ready queue; each `poll_transmit`
/// takes the first, writes one datagram and re-queues it at the back if it has more. A
/// connection whose window is full is not in the queue, so other connections' messages go
/// first ("elements deeper in the queue will be processed before the top one") and one
/// slow peer never blocks the others. Within a connection: NAKs, then an owed selective
/// ACK, then retransmissions, then new DATA, then a plain standalone ACK.
pub struct Ini {
    config: WindowConfig,
    params: Params,
    local: IniAddr,
    conns: Vec<Connection>,
    /// (peer key, connection index), sorted by key.
    peers: Vec<(u32, u32)>,
    ready: VecDeque<u32>,
    send_timers: TimerList<SendTimer>,
    ack_timers: TimerList<AckTimer>,
    /// At most one liveness record per connection; a heap because progress moves a
    /// connection's deadline by different amounts.
    liveness: BinaryHeap<Reverse<(Micros, u32)>>,
    events: VecDeque<Event>,
    stats: IniStats,
    now: Micros,
    /// Where a received datagram is decrypted (capacity kept between datagrams).
    scratch: Vec<u8>,
}

impl fmt::Debug for Ini {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ini")
            .field("local", &self.local)
            .field("connections", &self.conns.len())
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl Ini {
    /// An INI at `local` with no connections, after validating `config`.
    pub fn new(local: IniAddr, config: WindowConfig) -> Result<Ini, ConfigError> {
        config.validate()?;
        Ok(Ini {
            params: Params::new(&config),
            config,
            local,
            conns: Vec::new(),
            peers: Vec::new(),
            ready: VecDeque::new(),
            send_timers: TimerList::new(),
            ack_timers: TimerList::new(),
            liveness: BinaryHeap::new(),
            events: VecDeque::new(),
            stats: IniStats::default(),
            now: Micros::ZERO,
            scratch: Vec::new(),
        })
    }

    /// Creates the connection to `peer` (thesis §3.2: connections are allocated at
    /// start-up, one per remote INI). Both ends start at [`WindowConfig::initial_seq`].
    pub fn add_peer(&mut self, peer: IniAddr) -> Result<ConnHandle, AddPeerError> {
        if peer == self.local {
            return Err(AddPeerError::IsLocal(peer));
        }
        let key = peer.key();
        match self.peers.binary_search_by_key(&key, |&(k, _)| k) {
            Ok(i) => Err(AddPeerError::AlreadyConnected(ConnHandle(self.peers[i].1))),
            Err(i) => {
                let idx = self.conns.len() as u32;
                self.conns
                    .push(Connection::new(idx, self.local, peer, &self.params));
                self.peers.insert(i, (key, idx));
                Ok(ConnHandle(idx))
            }
        }
    }

    /// This INI's address.
    pub fn local(&self) -> IniAddr {
        self.local
    }

    /// The configuration in force.
    pub fn config(&self) -> &WindowConfig {
        &self.config
    }

    /// The connection to `peer`, if any.
    pub fn conn(&self, peer: IniAddr) -> Option<ConnHandle> {
        self.lookup(peer).map(ConnHandle)
    }

    /// Number of connections.
    pub fn num_connections(&self) -> usize {
        self.conns.len()
    }

    fn lookup(&self, peer: IniAddr) -> Option<u32> {
        let key = peer.key();
        self.peers
            .binary_search_by_key(&key, |&(k, _)| k)
            .ok()
            .map(|i| self.peers[i].1)
    }

    fn c(&self, conn: ConnHandle) -> &Connection {
        &self.conns[conn.index()]
    }

    fn advance(&mut self, now: Micros) -> Micros {
        if now > self.now {
            self.now = now;
        }
        self.now
    }

    fn schedule(&mut self, idx: u32) {
        let c = &mut self.conns[idx as usize];
        if !c.in_ready && c.wants_transmit(&self.params) {
            c.in_ready = true;
            self.ready.push_back(idx);
        }
    }

    fn fail(&mut self, idx: u32) {
        let c = &mut self.conns[idx as usize];
        if !c.is_unresponsive() {
            c.fail();
            self.events.push_back(Event::PeerUnresponsive {
                conn: c.handle(),
                peer: c.peer(),
            });
        }
    }

    /// Queues `msg` (opaque bytes, up to [`WindowConfig::max_message_len`]) for `conn`.
    /// On error the message comes back inside the [`EnqueueError`].
    pub fn enqueue(&mut self, conn: ConnHandle, msg: Vec<u8>) -> Result<(), EnqueueError> {
        let Some(c) = self.conns.get_mut(conn.index()) else {
            return Err(EnqueueError::UnknownConnection(msg));
        };
        c.enqueue(msg, &self.params)?;
        self.schedule(conn.0);
        Ok(())
    }

    /// Writes the next datagram to send into `buf` and says where it goes; `None` when
    /// nothing can be sent now (see the type doc for the scheduling rule).
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`WindowConfig::mtu`].
    pub fn poll_transmit(&mut self, now: Micros, buf: &mut [u8]) -> Option<Transmit> {
        assert!(
            buf.len() >= self.config.mtu,
            "poll_transmit buffer of {} bytes is below the mtu of {}",
            buf.len(),
            self.config.mtu
        );
        let now = self.advance(now);
        while let Some(idx) = self.ready.pop_front() {
            let c = &mut self.conns[idx as usize];
            c.in_ready = false;
            let Some(len) = c.poll_write(now, &self.params, buf, &mut self.send_timers) else {
                continue;
            };
            if !c.liveness_armed
                && let Some(deadline) = c.liveness_deadline(self.config.peer_timeout)
            {
                c.liveness_armed = true;
                self.liveness.push(Reverse((deadline, idx)));
            }
            let t = Transmit {
                conn: c.handle(),
                peer: c.peer(),
                len,
                messages_started: c.started_messages,
                data: c.wrote_data,
            };
            self.schedule(idx);
            self.stats.datagrams_sent += 1;
            self.stats.datagram_bytes_sent += len as u64;
            return Some(t);
        }
        None
    }

    /// Processes one received datagram whose source the transport vouches for (a
    /// simulator, a test); a UDP runtime calls [`Ini::handle_datagram_from`] instead.
    /// `Err` says why it was discarded; it is counted either way.
    pub fn handle_datagram(&mut self, now: Micros, datagram: &[u8]) -> Result<(), Rejected> {
        self.receive_copy(now, datagram, None)
    }

    /// Processes one datagram read from the network (thesis §3.1 receive path, with
    /// authentication): `from` is the connection whose peer's registered address the
    /// datagram came from, or `None` when its source address is no peer INI's. Checks,
    /// in order: the source address (`None`: [`Rejected::UnknownSource`], before any
    /// decoding or hashing), the wire checks of [`wire::decode`] (malformed, epoch, MAC),
    /// that the destination is this INI, and that the authenticated source INI is the
    /// one registered at that address. `Err` says why it was discarded; each reason is
    /// counted in [`IniStats`]. The datagram is copied into a scratch buffer of the INI
    /// and decrypted there; [`Ini::handle_datagram_in_place`] spares that copy.
    pub fn handle_datagram_from(
        &mut self,
        now: Micros,
        datagram: &[u8],
        from: Option<ConnHandle>,
    ) -> Result<(), Rejected> {
        match from {
            Some(c) => self.receive_copy(now, datagram, Some(c)),
            None => self.unknown_source(now, datagram.len()),
        }
    }

    /// As [`Ini::handle_datagram_from`], with the same checks, but decrypting `datagram`
    /// where it lies ([`wire::decode_in_place`]: its payload bytes become plaintext, or
    /// unspecified if it is rejected), and handing each message that completes in one
    /// fragment while no [`Event`] waits to `deliver` — the connection it came on, the
    /// peer INI and the message bytes, read in place — instead of queueing it as an
    /// [`Event::Delivered`]. A 4 KiB page in a datagram is then read once after the
    /// socket, by `deliver`, instead of copied into the scratch buffer and then into the
    /// event's vector. Messages of several fragments, and any message while events wait
    /// (so that delivery stays in order per connection), still come as events; `deliver`
    /// is called before this returns, never later.
    pub fn handle_datagram_in_place(
        &mut self,
        now: Micros,
        datagram: &mut [u8],
        from: Option<ConnHandle>,
        deliver: &mut dyn FnMut(ConnHandle, IniAddr, &[u8]),
    ) -> Result<(), Rejected> {
        match from {
            Some(c) => {
                let now = self.count_received(now, datagram.len());
                self.receive_decoded(now, datagram, Some(c), Some(deliver))
            }
            None => self.unknown_source(now, datagram.len()),
        }
    }

    /// A datagram from an address that is no peer INI's: counted and rejected.
    fn unknown_source(&mut self, now: Micros, len: usize) -> Result<(), Rejected> {
        self.count_received(now, len);
        self.stats.unknown_source += 1;
        Err(Rejected::UnknownSource)
    }

    /// Advances the clock to `now` and counts a received datagram of `len` bytes;
    /// returns the clock.
    fn count_received(&mut self, now: Micros, len: usize) -> Micros {
        let now = self.advance(now);
        self.stats.datagrams_received += 1;
        self.stats.datagram_bytes_received += len as u64;
        now
    }

    /// Receives `datagram` through a copy in the INI's scratch buffer (taken out for the
    /// call and put back whatever the outcome, so that the frame can borrow it).
    fn receive_copy(
        &mut self,
        now: Micros,
        datagram: &[u8],
        from: Option<ConnHandle>,
    ) -> Result<(), Rejected> {
        let now = self.count_received(now, datagram.len());
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(datagram);
        let result = self.receive_decoded(now, &mut scratch, from, None);
        self.scratch = scratch;
        result
    }

    /// The receive path past the statistics (`now`: the advanced clock): decodes
    /// `datagram` in place and hands the frame to its connection.
    fn receive_decoded(
        &mut self,
        now: Micros,
        datagram: &mut [u8],
        from: Option<ConnHandle>,
        sink: Option<Sink<'_>>,
    ) -> Result<(), Rejected> {
        let frame = match wire::decode_in_place(datagram, &self.params.key, self.params.epoch) {
            Ok(f) => f,
            Err(e) => {
                match e {
                    DecodeError::BadMac => self.stats.bad_mac += 1,
                    DecodeError::WrongEpoch { .. } => self.stats.wrong_epoch += 1,
                    _ => self.stats.decode_failures += 1,
                }
                return Err(Rejected::Decode(e));
            }
        };
        let h = frame.header;
        if h.conn.dst != self.local {
            self.stats.misdirected += 1;
            return Err(Rejected::Misdirected(h.conn.dst));
        }
        let Some(idx) = self.lookup(h.conn.src) else {
            self.stats.unknown_peer += 1;
            return Err(Rejected::UnknownPeer(h.conn.src));
        };
        if from.is_some_and(|c| c.0 != idx) {
            self.stats.unknown_source += 1;
            return Err(Rejected::UnknownSource);
        }
        let result = self.conns[idx as usize].on_frame(
            now,
            &h,
            frame.payload,
            &self.params,
            &mut self.ack_timers,
            &mut Deliveries {
                events: &mut self.events,
                sink,
            },
        );
        self.schedule(idx);
        result
    }

    /// The earliest instant at which [`handle_timeout`](Self::handle_timeout) has work, or
    /// `None` when no timer is pending. Discards cancelled timer records at the front of
    /// the lists first, so the answer is exact.
    pub fn poll_timeout(&mut self) -> Option<Micros> {
        while let Some(&(_, (idx, seq, tx))) = self.send_timers.peek() {
            if self.conns[idx as usize].send_timer_live(seq, tx) {
                break;
            }
            self.send_timers.pop();
        }
        while let Some(&(_, (idx, generation))) = self.ack_timers.peek() {
            if self.conns[idx as usize].ack_timer_live(generation) {
                break;
            }
            self.ack_timers.pop();
        }
        while let Some(&Reverse((_, idx))) = self.liveness.peek() {
            let c = &mut self.conns[idx as usize];
            if c.liveness_deadline(self.config.peer_timeout).is_some() {
                break;
            }
            c.liveness_armed = false;
            self.liveness.pop();
        }
        [
            self.send_timers.next_deadline(),
            self.ack_timers.next_deadline(),
            self.liveness.peek().map(|r| r.0.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs every timer due at `now`: SEND timeouts queue retransmissions (thesis
    /// §3.2.1), ACK timeouts queue standalone ACKs, and connections without ACK progress
    /// for `peer_timeout` are reported unresponsive.
    pub fn handle_timeout(&mut self, now: Micros) {
        let now = self.advance(now);
        while let Some((_, (idx, seq, tx))) = self.send_timers.pop_expired(now) {
            let c = &mut self.conns[idx as usize];
            if !c.send_timer_live(seq, tx) {
                continue;
            }
            if c.on_send_timeout(seq, tx, now, &self.params, &mut self.send_timers) {
                self.fail(idx);
            } else {
                self.schedule(idx);
            }
        }
        while let Some((_, (idx, generation))) = self.ack_timers.pop_expired(now) {
            let c = &mut self.conns[idx as usize];
            if c.ack_timer_live(generation) {
                c.on_ack_timeout();
                self.schedule(idx);
            }
        }
        while let Some(&Reverse((deadline, idx))) = self.liveness.peek() {
            if deadline > now {
                break;
            }
            self.liveness.pop();
            let c = &mut self.conns[idx as usize];
            c.liveness_armed = false;
            match c.liveness_deadline(self.config.peer_timeout) {
                None => {}
                Some(d) if d <= now => self.fail(idx),
                Some(d) => {
                    c.liveness_armed = true;
                    self.liveness.push(Reverse((d, idx)));
                }
            }
        }
    }

    /// Evidence from outside the window that `conn`'s peer process was alive at `at`
    /// (for example an authenticated answer of its liveness thread): the peer is declared
    /// unresponsive only `peer_timeout` after the later of its last ACK progress and the
    /// latest such evidence. A process that is alive but whose INI cannot run (its CPUs
    /// taken by compute threads) is so not declared dead; one that is stopped or killed
    /// gives no evidence and is still reported `peer_timeout` after it was last heard.
    /// `at` is on the clock of `now` arguments; call it before
    /// [`handle_timeout`](Self::handle_timeout).
    ///
    /// # Panics
    ///
    /// If `conn` is not a connection of this INI.
    pub fn note_alive(&mut self, conn: ConnHandle, at: Micros) {
        self.conns[conn.index()].note_alive(at);
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Counters of this INI: its own plus the sum over its connections.
    pub fn stats(&self) -> IniStats {
        let mut s = self.stats;
        for c in &self.conns {
            s.connections.accumulate(&c.stats);
        }
        s
    }

    /// Counters of one connection.
    ///
    /// # Panics
    ///
    /// If `conn` is not a connection of this INI (as for every accessor taking a handle).
    pub fn conn_stats(&self, conn: ConnHandle) -> &ConnStats {
        &self.c(conn).stats
    }

    /// The remote INI of `conn`.
    pub fn peer(&self, conn: ConnHandle) -> IniAddr {
        self.c(conn).peer()
    }

    /// Messages waiting in `conn`'s send queue (not yet started).
    pub fn queued(&self, conn: ConnHandle) -> usize {
        self.c(conn).queued()
    }

    /// Messages waiting over all connections: the load measure for a `least-loaded` INI
    /// scheduling policy (thesis §3.3). O(connections).
    pub fn total_queued(&self) -> usize {
        self.conns.iter().map(Connection::queued).sum()
    }

    /// Whether some connection has DATA to send: a retransmission, or new data, whether
    /// its window has room now or it waits for an ACK to open it (ACK- and NAK-only
    /// datagrams do not count). O(connections). The emulated gap uses it to tell a
    /// transmit side held back — by the gap, a late INI thread or a full window — from
    /// an idle one.
    pub fn data_waiting(&self) -> bool {
        self.conns.iter().any(Connection::data_waiting)
    }

    /// Unacknowledged frames of `conn` (at most [`WindowConfig::window`]).
    pub fn in_flight(&self, conn: ConnHandle) -> usize {
        self.c(conn).in_flight()
    }

    /// Sequence number `conn` gives its next new frame.
    pub fn next_seq(&self, conn: ConnHandle) -> u32 {
        self.c(conn).next_seq()
    }

    /// Sequence number `conn` expects to receive next (its cumulative ACK).
    pub fn expected_seq(&self, conn: ConnHandle) -> u32 {
        self.c(conn).rcv_next()
    }

    /// Whether `conn` reported [`Event::PeerUnresponsive`].
    pub fn is_unresponsive(&self, conn: ConnHandle) -> bool {
        self.c(conn).is_unresponsive()
    }

    /// True when no connection has anything queued, unacknowledged, buffered out of
    /// order, or an ACK or NAK owed.
    pub fn is_idle(&self) -> bool {
        self.conns.iter().all(Connection::is_idle)
    }

    /// For a connection that reported [`Event::PeerUnresponsive`]: removes and returns,
    /// in order, every message not known to be acknowledged. The first ones were in flight
    /// and may have been delivered; the rest were never sent. Empty for a live connection.
    pub fn take_unacknowledged(&mut self, conn: ConnHandle) -> Vec<Vec<u8>> {
        self.conns[conn.index()].take_unacknowledged()
    }
}
