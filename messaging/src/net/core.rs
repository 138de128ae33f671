//! One INI's protocol state and the pass that advances it.
//!
//! The state sits behind a mutex in an [`IniSlot`]. The INI thread runs passes in a loop;
//! a compute thread that finds the INI free runs a pass itself — right after handing it a
//! message (its message leaves at once, no thread hand-over on the send path) and, one
//! poll in 8 to 32, while it waits for messages (paper 000 §3.4: the receive loop polls
//! the network adaptively). Whoever holds the lock does the same work.
//!
//! A pass: frame waiting hand-off messages into the window; transmit what the window
//! releases (fault shim, emulated gap); read the socket (if asked); release datagrams
//! whose emulated latency has passed; fire due timers; deliver what the window
//! reassembled, in each sender's order, into this site's receive queues.

use super::Net;
use super::faults::{FaultShim, Verdict};
use super::frame::{Frame, FrameKind, HEADER};
use super::handoff::{Handoff, NO_SLOT, OutMsg};
use super::offload::Offload;
use super::reseq::{Arrival, Delivery, Ready};
use super::senders::Senders;
use super::stats::IniReport;
use super::tracer::IniTracer;
use crate::layout::MappedSite;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::window::{ConnHandle, EnqueueError, Event, Ini, Micros};
use crate::word::{Word, WordKind};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// Most hand-off messages framed per pass.
const PULL_BUDGET: usize = 64;
/// Most datagrams read per socket poll.
const RECV_BUDGET: usize = 64;
/// An INI thread asleep longer than this past a new timer deadline is woken.
pub(crate) const TIMER_SLACK_US: u64 = 1000;

/// How much of its socket a pass reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SocketRead {
    /// Nothing: a sender's pass right after its hand-off, or an INI thread's pass
    /// between its adaptive socket polls.
    Skip,
    /// Until the socket is empty (at most [`RECV_BUDGET`] reads): the INI thread's polls
    /// and those of a thread asleep on the network between them (`Net::wait`).
    Drain,
    /// Until a read completes a message for this site, or the socket is empty: a
    /// thread that polls the network in a busy wait for a message (`Net::poll`). It
    /// stops there and looks in its queues instead of paying the one more read that
    /// finds the socket empty — a system call of ≈ 0.3 µs on this VM (a `recvmsg` of
    /// ≈ 0.4 µs until the sixty-fourth session), on the path of every reply (`bench
    /// net`'s Express ping-pong, fifty-seventh session: read → delivered 0.22 µs,
    /// delivered → that empty read's end 0.42 µs, the pass's rest 0.05 µs). Datagrams
    /// left behind are read by the next poll or wake the INI thread's `epoll_wait`
    /// (level-triggered), which drains them.
    UntilDelivered,
}

/// An INI: its lockable protocol state, its hand-off queue and its reporting.
pub(crate) struct IniSlot {
    /// A second handle on the core's UDP socket, for network waiters' epoll sets.
    pub(crate) socket_fd: UdpSocket,
    pub(crate) core: Mutex<IniCore>,
    pub(crate) handoff: Handoff,
    /// Messages this INI holds for its sliding windows (connection send queues and the
    /// one waiting outside a full queue), as of its last pass.
    pub(crate) backlog: AtomicU64,
    /// 1 while a pass that has messages to move is running.
    pub(crate) busy: AtomicU32,
    /// When the sleeping INI thread will wake by itself (µs on the net clock); 0 while awake.
    pub(crate) sleep_until_us: AtomicU64,
    pub(crate) report: Mutex<IniReport>,
}

impl IniSlot {
    /// Runs a pass from a compute thread if nobody else is running one. Returns whether
    /// anything happened, or `None` if the INI was busy.
    #[inline]
    pub(crate) fn try_pass(&self, net: &Net, read: SocketRead) -> Option<bool> {
        let mut core = self.core.try_lock()?;
        let work = self.run_pass(&mut core, net, read);
        // Wake a sleeping INI thread if this pass created a timer it would sleep through,
        // or an emulated gap or latency it would overshoot.
        let until = self.sleep_until_us.load(Ordering::Acquire);
        if until != 0 {
            let timer = core
                .ini
                .poll_timeout()
                .is_some_and(|due| until > due.as_u64() + TIMER_SLACK_US);
            let emulated = core
                .next_release()
                .is_some_and(|r| until > r.saturating_duration_since(net.epoch).as_micros() as u64);
            if timer || emulated {
                self.handoff.kick();
            }
        }
        Some(work)
    }
}

impl IniSlot {
    /// The outstanding work `least-loaded` compares: hand-off queue + window backlog +
    /// 1 while serving.
    #[inline]
    pub(crate) fn load(&self) -> usize {
        self.handoff.len()
            + self.backlog.load(Ordering::Relaxed) as usize
            + self.busy.load(Ordering::Relaxed) as usize
    }

    /// Runs one pass of `core` (this slot's, locked by the caller), publishing whether
    /// it is serving and its window backlog for [`IniSlot::load`].
    #[inline]
    pub(crate) fn run_pass(&self, core: &mut IniCore, net: &Net, read: SocketRead) -> bool {
        let serving = !self.handoff.ring.is_empty() || core.stalled.is_some();
        if serving {
            self.busy.store(1, Ordering::Relaxed);
        }
        let work = core.pass(net, &self.handoff, read);
        let backlog = core.ini.total_queued() + usize::from(core.stalled.is_some());
        self.backlog.store(backlog as u64, Ordering::Relaxed);
        if serving {
            self.busy.store(0, Ordering::Relaxed);
        }
        work
    }
}

/// Counters kept by whoever runs passes.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    pub(crate) time_in_ini_ns: u64,
    pub(crate) misscheduled_time_ns: u64,
    pub(crate) delivered: u64,
    pub(crate) rejected: u64,
    pub(crate) busy_ns: u64,
    /// Socket reads that returned several coalesced datagrams, and those datagrams.
    pub(crate) coalesced_reads: u64,
    pub(crate) coalesced_datagrams: u64,
}

/// The protocol state of one INI (see the module docs).
pub(crate) struct IniCore {
    pub(crate) index: u8,
    /// INIs of this cluster (K).
    pub(crate) local_inis: u8,
    pub(crate) ini: Ini,
    /// The socket this INI receives on.
    pub(crate) socket: UdpSocket,
    /// Where datagrams to each connection's peer leave from (module `senders`).
    pub(crate) senders: Senders,
    /// The connection whose peer INI registered each address: a datagram is accepted
    /// only from its claimed sender's registered address (issue 13).
    pub(crate) sources: HashMap<SocketAddr, ConnHandle>,
    /// Peers bound to every address of their host, by port (`NetConfig::any_ip_peers`):
    /// consulted only when `sources` has no entry.
    pub(crate) port_sources: HashMap<u16, ConnHandle>,
    /// Connections to the INIs of site `s` at `[s]`, INI 0 first (empty: no route).
    pub(crate) conns: Vec<Vec<ConnHandle>>,
    /// Per site, the next of this INI's remote INIs to send to (see `conn_for`).
    pub(crate) next_remote: Vec<u8>,
    pub(crate) faults: FaultShim,
    /// Emulated gap *g* after each DATA datagram (paper 001 §3.2).
    pub(crate) gap: Duration,
    /// Emulated per-byte gap *G*, ns per byte of a DATA datagram, added to *g*.
    pub(crate) per_byte_ns: f64,
    /// Emulated latency *L*: every datagram read is held this long before the window
    /// sees it.
    pub(crate) latency: Duration,
    pub(crate) stalled: Option<(ConnHandle, Vec<u8>)>,
    pub(crate) delayed: VecDeque<(Instant, Option<ConnHandle>, Vec<u8>)>,
    /// Under the emulated gap, when the transmit side may send again.
    pub(crate) next_inject: Instant,
    /// Under the emulated gap, whether DATA has waited to be sent since before
    /// `next_inject` (seen right after the last injection or by a pass the gap held
    /// back; in the window or behind it): the next gap then runs from `next_inject`,
    /// however late the INI thread got to the injection (see [`gap_start`]).
    pub(crate) gap_backlog: bool,
    pub(crate) buf: Vec<u8>,
    /// Segmentation offload of `socket` (`ini.offload`).
    pub(crate) offload: Offload,
    pub(crate) c: Counters,
    pub(crate) started: Instant,
    /// The per-message trace, when the job asks for one (`ini.trace_dir`).
    pub(crate) trace: Option<Box<IniTracer>>,
    /// When the datagram being processed was read (or released from the emulated
    /// latency), ns on the group's clock; stamped only while tracing.
    pub(crate) rx_ns: u64,
}

/// A datagram held for the emulated latency that is due within this long is waited for
/// at the end of the pass that finds it (about one pass of an INI here).
const HELD_SPIN: Duration = Duration::from_micros(2);

impl IniCore {
    /// Advances this INI (see the module docs), reading its socket as `read` says.
    /// Returns whether it did anything.
    pub(crate) fn pass(&mut self, net: &Net, handoff: &Handoff, read: SocketRead) -> bool {
        // One clock read for the pass's timestamps (`Net::now` and `Net::now_ns` are
        // this offset): a compute thread polling the network runs a pass every few
        // microseconds, and each read is tens of ns on this VM.
        let t0 = Instant::now();
        let since = t0.saturating_duration_since(net.epoch);
        let now = Micros(since.as_micros() as u64);
        let mut work = self.pull(net, handoff, since.as_nanos() as u64);
        work |= self.transmit(net, now);
        if read != SocketRead::Skip {
            work |= self.receive(net, now, read == SocketRead::UntilDelivered);
        }
        work |= self.release_delayed(net);
        // A held datagram due within a pass's length: wait for it here and release it
        // now, instead of at the end of the next pass — whose socket read and sends
        // would otherwise add up to a pass (≈ 1 µs here) to L (paper 001 §3.2).
        if let Some(due) = self.held_due().filter(|&d| d < Instant::now() + HELD_SPIN) {
            while Instant::now() < due {
                std::hint::spin_loop();
            }
            work |= self.release_delayed(net);
        }
        if self.ini.poll_timeout().is_some_and(|t| t <= now) {
            self.note_alive(net);
            self.ini.handle_timeout(now);
            work = true;
        }
        work |= self.events(net);
        if net.held.load(Ordering::Relaxed) > 0 {
            work |= self.retry_held(net);
        }
        work |= self.transmit(net, now);
        if work {
            self.c.busy_ns += t0.elapsed().as_nanos() as u64;
        }
        work
    }

    /// Tells the window when each peer's process was last proven alive by the liveness
    /// thread (see [`crate::liveness`]), before its timers decide who is unresponsive.
    fn note_alive(&mut self, net: &Net) {
        let Some(evidence) = &net.liveness else {
            return;
        };
        for (site, conns) in self.conns.iter().enumerate() {
            if conns.is_empty() {
                continue;
            }
            if let Some(t) = evidence.heard(site) {
                let at = Micros(t.saturating_duration_since(net.epoch).as_micros() as u64);
                for &c in conns {
                    self.ini.note_alive(c, at);
                }
            }
        }
    }

    /// When this INI next has something to do that no event announces: the first
    /// datagram held for the emulated latency *L* is due, or the emulated gap in progress
    /// ends (its transmit side may then send again). `None`: neither.
    pub(crate) fn next_release(&self) -> Option<Instant> {
        let held = self.held_due();
        // Without an emulated gap `next_inject` never moves ahead: no clock read.
        let gap =
            (self.emulates_gap() && self.next_inject > Instant::now()).then_some(self.next_inject);
        match (held, gap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the emulated gap *g* or per-byte gap *G* is on (paper 001 §3.2).
    fn emulates_gap(&self) -> bool {
        !self.gap.is_zero() || self.per_byte_ns > 0.0
    }

    /// When the first datagram held for the emulated latency *L* is due, if any.
    fn held_due(&self) -> Option<Instant> {
        self.delayed.front().map(|(t, _, _)| *t)
    }

    /// Nothing queued, in flight, stalled or delayed.
    pub(crate) fn idle(&self, handoff: &Handoff) -> bool {
        handoff.ring.is_empty()
            && self.stalled.is_none()
            && self.delayed.is_empty()
            && self.ini.is_idle()
    }

    /// The connection a message to `site` leaves on: this INI's next remote INI of that
    /// cluster by [`policy::remote_ini`]. Order across INIs is restored by the receiver's
    /// resequencer.
    fn conn_for(&mut self, site: u16) -> Option<ConnHandle> {
        let s = usize::from(site);
        let remote = self.conns.get(s).filter(|c| !c.is_empty())?;
        let (j, next) = super::policy::remote_ini(
            usize::from(self.index),
            usize::from(self.local_inis),
            remote.len(),
            usize::from(self.next_remote[s]),
        );
        self.next_remote[s] = next as u8;
        Some(remote[j])
    }

    /// Frames hand-off messages into the window (paper 002 §3.1).
    /// `now_ns`: the pass's start ([`Net::now_ns`]).
    fn pull(&mut self, net: &Net, handoff: &Handoff, now_ns: u64) -> bool {
        let mut work = false;
        if let Some((conn, bytes)) = self.stalled.take() {
            match self.ini.enqueue(conn, bytes) {
                Ok(()) => {
                    work = true;
                    if let Some(t) = self.trace.as_mut() {
                        t.unstall(conn);
                    }
                }
                Err(EnqueueError::Full(b)) => {
                    self.stalled = Some((conn, b));
                    return false;
                }
                Err(e) => {
                    if let Some(t) = self.trace.as_mut() {
                        t.drop_stalled();
                    }
                    self.undeliverable(net, conn, &e.to_string());
                }
            }
        }
        for _ in 0..PULL_BUDGET {
            let Some(m) = handoff.ring.pop() else { break };
            work = true;
            let waited = now_ns.saturating_sub(m.enqueued_ns);
            self.c.time_in_ini_ns += waited;
            if m.misscheduled {
                self.c.misscheduled_time_ns += waited;
            }
            let Some(bytes) = frame(net, &m) else {
                self.c.rejected += 1;
                continue;
            };
            self.c.messages += 1;
            self.c.bytes += (bytes.len() - HEADER) as u64;
            let Some(conn) = self.conn_for(m.dest_site) else {
                net.fail(
                    m.dest_site,
                    format!("no INI connection to cluster {}", m.dest_site),
                );
                continue;
            };
            let record = self
                .trace
                .as_ref()
                .map(|t| t.dequeued(&m, self.ini.peer(conn), bytes.len() - HEADER, net.now_ns()));
            match self.ini.enqueue(conn, bytes) {
                Ok(()) => {
                    if let (Some(t), Some(r)) = (self.trace.as_mut(), record) {
                        t.queued(conn, r);
                    }
                }
                Err(EnqueueError::Full(b)) => {
                    self.stalled = Some((conn, b));
                    if let (Some(t), Some(r)) = (self.trace.as_mut(), record) {
                        t.stall(r);
                    }
                    break;
                }
                Err(e) => self.undeliverable(net, conn, &e.to_string()),
            }
        }
        work
    }

    fn undeliverable(&self, net: &Net, conn: ConnHandle, why: &str) {
        let peer = self.ini.peer(conn);
        net.fail(
            peer.site,
            format!(
                "a message to cluster {} could not be sent: {why}",
                peer.site
            ),
        );
    }

    /// Sends what the window releases, unless the emulated gap holds the INI's transmit
    /// side (paper 001 §3.2): after a DATA datagram of *n* bytes it sends nothing until
    /// *g* + *n*·*G* after that datagram's injection began. Nothing is taken from the window meanwhile, so a frame's SEND timer
    /// starts when it leaves, and no thread spins: the INI keeps receiving (the paper's
    /// LANai receives while its transmit context stalls), and the INI thread, or a
    /// compute thread polling, sends the next datagram once the gap is over. ACK- and
    /// NAK-only datagrams do not start a gap (they wait out one in progress, being sent
    /// by the same transmit side).
    fn transmit(&mut self, net: &Net, now: Micros) -> bool {
        let mut work = false;
        let emulate_gap = self.emulates_gap();
        // Datagrams the window releases together leave in segmented sends (module
        // `offload`; never under an emulated gap or with the fault shim, see
        // `BoundInis::start`).
        let batch = self.offload.batching();
        // Trace records of the batched datagrams, written once the batch is sent.
        let mut on_wire: Vec<(ConnHandle, u16, u64)> = Vec::new();
        loop {
            // The gap runs from the start of this injection — the INI taking the
            // datagram from the window, framing and authenticating it, then `sendto`:
            // LogP's g is the least interval between the starts of two injections, so
            // the next one's own work fits inside the gap instead of adding to it.
            let injected = emulate_gap.then(Instant::now);
            if injected.is_some_and(|t| self.next_inject > t) {
                // Once DATA is known to wait, every pass the gap holds back need not
                // ask again (only an injection clears it).
                if !self.gap_backlog {
                    self.gap_backlog = self.ini.data_waiting();
                }
                break;
            }
            let Some(t) = self.ini.poll_transmit(now, &mut self.buf) else {
                break;
            };
            work = true;
            let traced = t.messages_started > 0 && self.trace.is_some();
            let windowed_ns = if traced { net.now_ns() } else { 0 };
            let to = t.conn.index();
            if batch {
                self.offload.push(&self.senders, to, &self.buf[..t.len]);
                if traced {
                    on_wire.push((t.conn, t.messages_started, windowed_ns));
                }
                continue;
            }
            if self.faults.is_active() {
                let Verdict::Send(ds) = self.faults.apply(to, &self.buf[..t.len]);
                for (conn, d) in ds {
                    self.senders.send(conn, &d);
                }
            } else {
                self.senders.send(to, &self.buf[..t.len]);
            }
            if let Some(injected) = injected.filter(|_| t.data) {
                self.next_inject = gap_start(injected, self.next_inject, self.gap_backlog)
                    + gap_after(self.gap, self.per_byte_ns, t.len);
                self.gap_backlog = self.ini.data_waiting();
            }
            if traced && let Some(tr) = self.trace.as_mut() {
                tr.on_wire(t.conn, t.messages_started, windowed_ns, net.now_ns());
            }
        }
        if batch {
            self.offload.flush(&self.senders);
            if let Some(tr) = self.trace.as_mut() {
                let sent_ns = net.now_ns();
                for (conn, started, windowed_ns) in on_wire {
                    tr.on_wire(conn, started, windowed_ns, sent_ns);
                }
            }
        }
        work
    }

    /// Reads datagrams; a message they complete is delivered at once (so that its trace
    /// record's arrival is the read of its last datagram). A read may return several
    /// datagrams the kernel coalesced (module `offload`), handled one by one. With
    /// `until_delivered`, stops after the read that delivered a message
    /// ([`SocketRead::UntilDelivered`]).
    fn receive(&mut self, net: &Net, now: Micros, until_delivered: bool) -> bool {
        let mut got = false;
        // Taken out for the loop, so that handling a datagram may borrow the INI.
        let mut buf = std::mem::take(&mut self.buf);
        let delivered = self.c.delivered;
        for _ in 0..RECV_BUDGET {
            if until_delivered && self.c.delivered > delivered {
                break;
            }
            let Some(read) = self.offload.recv(&self.socket, &mut buf) else {
                break;
            };
            got = true;
            if read.stride < read.len {
                self.c.coalesced_reads += 1;
                self.c.coalesced_datagrams += read.len.div_ceil(read.stride.max(1)) as u64;
            }
            let from = self
                .sources
                .get(&read.from)
                .or_else(|| self.port_sources.get(&read.from.port()))
                .copied();
            for d in buf[..read.len].chunks_mut(read.stride.max(1)) {
                if self.latency.is_zero() {
                    self.handle_datagram(net, now, d, from);
                } else {
                    self.delayed
                        .push_back((Instant::now() + self.latency, from, d.to_vec()));
                }
            }
        }
        self.buf = buf;
        got
    }

    /// Emulated latency *L* (paper 001 §3.2): datagrams wait in arrival order.
    fn release_delayed(&mut self, net: &Net) -> bool {
        if self.delayed.is_empty() {
            return false;
        }
        let mut work = false;
        let t = Instant::now();
        while self.delayed.front().is_some_and(|(due, _, _)| *due <= t) {
            let (_, from, mut d) = self.delayed.pop_front().expect("front exists");
            self.handle_datagram(net, net.now(), &mut d, from);
            work = true;
        }
        work
    }

    /// Hands one datagram read from `from` to the window, decrypted in place, and
    /// delivers what it completes: a message in one fragment straight from the datagram
    /// ([`Ini::handle_datagram_in_place`]), the others from the window's events.
    fn handle_datagram(&mut self, net: &Net, now: Micros, d: &mut [u8], from: Option<ConnHandle>) {
        if self.trace.is_some() {
            self.rx_ns = net.now_ns();
        }
        let (trace, c, rx_ns) = (&mut self.trace, &mut self.c, self.rx_ns);
        let _ = self
            .ini
            .handle_datagram_in_place(now, d, from, &mut |_, peer, msg| {
                let arrival = Arrival {
                    peer_ini: peer.ini,
                    arrived_ns: rx_ns,
                };
                accept(net, trace, c, arrival, msg);
            });
        self.events(net);
    }

    fn events(&mut self, net: &Net) -> bool {
        let mut work = false;
        while let Some(ev) = self.ini.poll_event() {
            work = true;
            match ev {
                Event::Delivered { msg, conn } => {
                    let arrival = Arrival {
                        peer_ini: self.ini.peer(conn).ini,
                        arrived_ns: self.rx_ns,
                    };
                    accept(net, &mut self.trace, &mut self.c, arrival, &msg);
                }
                Event::PeerUnresponsive { peer, .. } => {
                    net.fail(
                        peer.site,
                        format!(
                            "cluster {} stopped acknowledging: INI {} silent for the peer timeout",
                            peer.site, peer.ini
                        ),
                    );
                }
            }
        }
        work
    }

    fn retry_held(&mut self, net: &Net) -> bool {
        let trace = &mut self.trace;
        let n = net.reseq.retry(|r| deliver_traced(net, trace, r));
        self.c.delivered += n as u64;
        net.held.store(net.reseq.held() as u64, Ordering::Relaxed);
        if n > 0 {
            net.notify_local();
        }
        n > 0
    }

    /// A held-back (reordered) datagram, sent before the INI stops.
    pub(crate) fn flush_faults(&mut self) {
        if let Some((conn, d)) = self.faults.flush() {
            self.senders.send(conn, &d);
        }
    }

    /// Copies the counters into `r`.
    pub(crate) fn publish(&self, handoff: &Handoff, r: &mut IniReport) {
        let arrivals = handoff.arrivals.load(Ordering::Relaxed);
        let qsum = handoff.queue_len_sum.load(Ordering::Relaxed);
        let m = self.c.messages;
        r.messages = m;
        r.bytes = self.c.bytes;
        r.mean_message_bytes = if m == 0 {
            0.0
        } else {
            self.c.bytes as f64 / m as f64
        };
        r.mean_time_in_ini_us = if m == 0 {
            0.0
        } else {
            self.c.time_in_ini_ns as f64 / m as f64 / 1e3
        };
        r.mean_queue_len_at_arrival = if arrivals == 0 {
            0.0
        } else {
            qsum as f64 / arrivals as f64
        };
        let elapsed = self.started.elapsed();
        r.utilization = self.c.busy_ns as f64 / elapsed.as_nanos().max(1) as f64;
        r.misscheduled = handoff.misscheduled.load(Ordering::Relaxed);
        r.misscheduled_time_us = self.c.misscheduled_time_ns as f64 / 1e3;
        r.sender_wakeups = handoff.sender_wakeups.load(Ordering::Relaxed);
        r.delivered = self.c.delivered;
        r.rejected_frames = self.c.rejected;
        r.injected = self.faults.counts;
        r.window = self.ini.stats();
        r.offload = super::stats::OffloadStats {
            sends: self.offload.batches,
            sent_datagrams: self.offload.batched,
            reads: self.c.coalesced_reads,
            read_datagrams: self.c.coalesced_datagrams,
        };
        r.elapsed_us = elapsed.as_secs_f64() * 1e6;
    }
}

/// How late an injection may start after its gap ended and still have the next gap
/// counted from when it was due, when nothing says that DATA waited for the gap (see
/// [`gap_start`]).
const GAP_SLACK: Duration = Duration::from_micros(2);

/// When the gap after an injection that began at `injected` starts, the previous gap
/// having ended at `due`: at `due` if DATA waited to be sent since before `due`
/// (`backlog`) or the injection began at most [`GAP_SLACK`] after it, else at
/// `injected`.
///
/// The emulated network interface's transmit side sends one DATA datagram per *g* +
/// *n*·*G* while it has DATA (paper 001 §3.2: the LANai, a processor of its own, stalls
/// after each injection). The INI is a thread that shares the CPUs: the pass that finds
/// a gap over does its own work (the INI's lock, the hand-off ring, framing) before the
/// injection begins, 0.3–0.9 µs a datagram on 2 vCPUs, and the scheduler may have taken
/// the thread off its CPU at the end of a gap for a whole time slice. Counted from the
/// late start, each delay added itself to the rate: with only the slack (no `backlog`),
/// `experiment loggp-calibrate` read g = 10 µs as 11.9 µs and G = 5 ns/B as 5.7 (a
/// stream of 20,000 messages; 4 CPU-bound threads on 2 vCPUs). With `backlog` the
/// injections keep to the interface's schedule: after a delay the datagrams that waited
/// leave back to back until the schedule is met, so the stream's rate is the asked one,
/// and injection *k* of a backlog never starts before the first one's start + *k* gaps.
///
/// Data behind a full window counts as waiting too: the window fills when the receiving
/// INI thread is off its CPU longer than a window's worth of gaps (32 × 42 µs for 4 KiB
/// datagrams at G = 10 ns/B), a stall the paper's receiving LANai, never descheduled,
/// does not have. Restarting the schedule after such a stall read G = 10 / 20 ns/B as
/// 11.5–20.8 / 23.0–30.0 in four alternating pairs where catching up read 10.7–11.6 /
/// 21.0–26.5 (`loggp-calibrate --repeat 2`). A receiver that is slow for real still
/// bounds the stream's rate; the catch-up after it is at most a window of datagrams
/// back to back.
///
/// An injection that nothing waited for (the INI had nothing to send when the gap
/// ended) starts its gap itself, so nothing is sent in a burst to make up for idle
/// time.
fn gap_start(injected: Instant, due: Instant, backlog: bool) -> Instant {
    if backlog || injected.saturating_duration_since(due) <= GAP_SLACK {
        due.min(injected)
    } else {
        injected
    }
}

/// The emulated gap after a DATA datagram of `len` bytes: *g* + *n*·*G*, *n* the bytes
/// of the fragment it carries — `len` less the sliding window's header and MAC
/// ([`crate::window::wire::OVERHEAD`]), which are this layer's, not the message's (paper
/// 001 §3.2: *G* is a stall "proportional to the fragment size", added to *g*; LogGP's
/// *G* is a gap per byte of the message). A 4 KiB page then costs 4,128 × *G*, its
/// message frame's header included, instead of the datagram's 4,176 × *G*.
fn gap_after(gap: Duration, per_byte_ns: f64, len: usize) -> Duration {
    let fragment = len.saturating_sub(crate::window::wire::OVERHEAD);
    gap + Duration::from_nanos((fragment as f64 * per_byte_ns).round() as u64)
}

/// Builds the frame for `m`, reading (and then releasing) its buffer.
fn frame(net: &Net, m: &OutMsg) -> Option<Vec<u8>> {
    let data = if m.slot == NO_SLOT {
        None
    } else {
        Some(
            net.pools
                .get(usize::from(m.pool))?
                .get()?
                .adopt(m.slot)
                .ok()?,
        )
    };
    let (tag, bytes): (u64, &[u8]) = data
        .as_ref()
        .map_or((0, &[][..]), |d| (d.tag(), d.as_slice()));
    Some(
        Frame {
            kind: m.kind,
            queue: m.dest_queue,
            origin: net.site.0,
            lane: m.lane,
            seq: m.seq,
            word: m.word,
            tag,
            data: bytes,
        }
        .encode(),
    )
}

/// Takes one message the window delivered (`msg`: a frame of module
/// [`frame`](super::frame)) into this site: restores its sender's order and delivers
/// what is ready ([`deliver`]); a frame that does not decode is counted as rejected.
fn accept(
    net: &Net,
    trace: &mut Option<Box<IniTracer>>,
    c: &mut Counters,
    arrival: Arrival,
    msg: &[u8],
) {
    match Frame::decode(msg, net.own.pool.slot_size()) {
        Ok(f) => {
            let n = net
                .reseq
                .accept(&f, arrival, |r| deliver_traced(net, trace, r));
            c.delivered += n as u64;
            net.held.store(net.reseq.held() as u64, Ordering::Relaxed);
            if n > 0 {
                // A thread of this process waiting on the network may have checked its
                // queues before this delivery, and this pass may have emptied the socket
                // it sleeps on.
                net.notify_local();
            }
        }
        Err(_) => c.rejected += 1,
    }
}

/// [`deliver`], and the trace record of a delivered message when tracing.
fn deliver_traced(net: &Net, trace: &mut Option<Box<IniTracer>>, r: &Ready<'_>) -> Delivery {
    let d = deliver(&net.own, r);
    if d == Delivery::Done
        && let Some(t) = trace.as_mut()
    {
        t.delivered(r, net.now_ns());
    }
    d
}

/// Delivers one arrived message into this site's receive queue `r.queue`: Express words
/// directly; Tag-On and bulk data copied into a slot of this site's pool (the header is
/// re-pointed at it); Basic payloads into the Basic ring. A full queue or empty pool asks
/// for a retry; an impossible destination or a corrupt word is dropped (counted by the
/// caller as delivered-and-rejected: it can never be delivered). The emulated receive
/// overhead is not paid here but by the thread that takes the message from the queue
/// (paper 001 §3.2: the receiving processor's cost).
fn deliver(own: &MappedSite, r: &Ready<'_>) -> Delivery {
    let Ready {
        kind,
        queue,
        word,
        tag,
        data,
        ..
    } = *r;
    let q = usize::from(queue);
    let (Some(ring), Some(basic)) = (own.express.get(q), own.basic.get(q)) else {
        return Delivery::Done;
    };
    let w = Word(word);
    match kind {
        FrameKind::Express => {
            if w.kind() != Ok(WordKind::Express) {
                return Delivery::Done;
            }
            if ring.push(word).is_ok() {
                Delivery::Done
            } else {
                Delivery::Retry
            }
        }
        FrameKind::TagOn | FrameKind::Bulk => {
            let Ok(mut buf) = own.pool.alloc() else {
                return Delivery::Retry;
            };
            buf.fill(data);
            buf.set_tag(tag);
            let d = buf.freeze();
            let (pool, slot) = d.location();
            let k = if kind == FrameKind::Bulk {
                WordKind::Bulk
            } else {
                WordKind::TagOn
            };
            if ring
                .push(Word::buffer(k, w.handler(), w.source(), pool, slot).0)
                .is_ok()
            {
                let _ = d.into_transfer();
                Delivery::Done
            } else {
                Delivery::Retry
            }
        }
        FrameKind::Basic => match basic.push(w.handler(), w.source(), data) {
            Ok(true) => Delivery::Done,
            Ok(false) => Delivery::Retry,
            Err(_) => Delivery::Done,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{GAP_SLACK, SocketRead, gap_start};
    use crate::net::{NetConfig, connect_loopback};
    use crate::{
        Destination, Express, Handler, Message, QueueId, QueueSpec, Site, SiteConfig, SiteId,
        SourceId, VirtualName,
    };
    use multigrain_cluster_config::JobConfig;
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    /// Whether `socket` has a datagram queued, waiting up to `ms`.
    fn readable(socket: &std::net::UdpSocket, ms: u16) -> bool {
        let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::from(ms)).expect("poll") == 1
    }

    /// A thread that polls the network in a busy wait stops reading the socket at the
    /// read that delivers a message (it then looks in its queues); the INI thread's
    /// reads take the rest. Nothing is lost or reordered.
    #[test]
    fn a_waiting_threads_poll_stops_at_the_first_delivered_message() {
        let sites: Vec<Site> = (0..2)
            .map(|s| {
                Site::new(SiteConfig {
                    site: SiteId(s),
                    queues: vec![QueueSpec::default(); 2],
                    pool_slots: 64,
                    ..SiteConfig::default()
                })
                .expect("site")
            })
            .collect();
        let cfg = NetConfig::from_job(&JobConfig::local(2, 1));
        let groups = connect_loopback(&sites, &cfg, 1).expect("INIs");
        let (tx, w) = sites[0].create_endpoint(&[QueueId(0)]).expect("endpoint");
        w.map(
            VirtualName(0),
            Destination {
                site: SiteId(1),
                queue: QueueId(1),
                source: SourceId::new(0).expect("source"),
            },
        )
        .expect("map");
        let (rx, _w) = sites[1].create_endpoint(&[QueueId(1)]).expect("endpoint");
        let net = &groups[1].net;
        let slot = &net.slots[0];
        const N: u64 = 3;
        let delivered = {
            // Holding the receiving INI keeps its thread (and any poll) off the socket.
            let mut core = slot.core.lock();
            // One datagram each: the next message is sent once the last has left (sent by
            // the sending thread's pass, or by its INI thread if that held the INI).
            let sender = &groups[0].net.slots[0];
            let sent = || sender.core.lock().ini.stats().datagrams_sent;
            let base = sent();
            let deadline = Instant::now() + Duration::from_secs(10);
            for i in 0..N {
                tx.send_express(
                    VirtualName(0),
                    Express::new(Handler(3), i).expect("payload"),
                )
                .expect("send");
                while sent() <= base + i {
                    assert!(Instant::now() < deadline, "message {i} never left");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            // Loopback queues a datagram at the receiver inside `sendto`.
            assert!(readable(&slot.socket_fd, 1000), "no datagram arrived");
            let before = core.c.delivered;
            core.pass(net, &slot.handoff, SocketRead::UntilDelivered);
            let first = core.c.delivered - before;
            let left = readable(&slot.socket_fd, 0);
            core.pass(net, &slot.handoff, SocketRead::Drain);
            (first, left, core.c.delivered - before)
        };
        assert_eq!(delivered.0, 1, "the poll delivered one message and stopped");
        assert!(delivered.1, "the other datagrams stayed in the socket");
        assert_eq!(delivered.2, N, "the INI's drain delivered the rest");
        for i in 0..N {
            let Some(Message::Express(e)) = rx.recv_timeout(Duration::from_secs(10)) else {
                panic!("message {i} missing")
            };
            assert_eq!(e.payload, i, "in order");
        }
        drop((tx, rx));
        for g in groups {
            g.shutdown(Duration::from_secs(10)).expect("shutdown");
        }
    }

    #[test]
    fn a_slightly_late_injection_counts_its_gap_from_when_it_was_due() {
        let due = Instant::now();
        let us = Duration::from_micros;
        // A pass's own work late: the next gap starts when this one was due, so the
        // average interval stays g.
        assert_eq!(gap_start(due + us(1), due, false), due);
        assert_eq!(gap_start(due + GAP_SLACK, due, false), due);
        assert_eq!(gap_start(due, due, false), due);
        // Later than the slack with nothing waiting (idle): no catching up, the gap
        // starts with the injection.
        let late = due + GAP_SLACK + us(1);
        assert_eq!(gap_start(late, due, false), late);
        let idle = due + Duration::from_millis(5);
        assert_eq!(gap_start(idle, due, false), idle);
    }

    #[test]
    fn a_backlog_keeps_to_the_schedule_however_late_the_injection() {
        let due = Instant::now();
        // DATA waited since before `due` and the INI thread ran 5 ms late: the gap
        // still starts at `due`, so the datagrams that waited catch up.
        let late = due + Duration::from_millis(5);
        assert_eq!(gap_start(late, due, true), due);
        // Never earlier than the injection itself.
        let early = due - Duration::from_micros(3);
        assert_eq!(gap_start(early, due, true), early);
    }
}
