//! Endpoints: how job code sends and receives.
//!
//! An endpoint sends only by [`VirtualName`], translated by its destination table (paper
//! 004 §4.1), and receives from its own receive queues, polled in a fixed priority order
//! (OnePoll, paper 004 §4.3). Send and receive of Express messages are each one claim on a
//! lock-free ring; any number of endpoints (in any threads or processes) may send to the
//! same queue, and [`Endpoint::share`] gives another thread its own handle on the same
//! queues and table.
//!
//! Failed sends hand the message back ([`SendError`]). Blocking sends poll the endpoint's
//! own queues while they wait, so two endpoints sending to each other's full queues cannot
//! deadlock (paper 000 §3.3); received messages go to the caller's `on_message` closure.
//! Blocking receives spin briefly, then sleep on the queues' doorbell (paper 003 §4).

use crate::basic::BasicRing;
use crate::basic::BasicTooLong;
use crate::bulk::{FRAGMENT_HEADER, FragmentHeader, FragmentReject};
use crate::deadline::Deadline;
use crate::message::{BasicSendError, BulkMsg, BulkSendError, Message, SendError, TagOnMsg};
use crate::names::{Destination, DestinationTable, QueueId, SiteId, VirtualName};
use crate::poll::AdaptivePoller;
use crate::pool::{PoolExhausted, TagOnBuf, TagOnData};
use crate::remote::{Lane, Refused, RemoteKind, RemoteRoute};
use crate::ring::RawRing;
use crate::site::{Route, SiteInner, Substrate};
use crate::stats::{EndpointCounters, KindCounters};
use crate::sync::{Backoff, Ordering, spin_hint};
use crate::word::{Express, Handler, SourceId, Word, WordKind};
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One source OnePoll can take a message from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PollSource {
    /// The Express/Tag-On/bulk ring of a queue.
    Express(QueueId),
    /// The Basic ring of a queue.
    Basic(QueueId),
}

/// A poll set named a queue the endpoint does not own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not one of this endpoint's receive queues")]
pub struct NotOwnQueue(pub QueueId);

/// How long a blocking receive spins before it sleeps on the doorbell, by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// A job's handle for sending and receiving (see the module docs). `Send` but not `Sync`:
/// give each thread its own with [`Endpoint::share`].
pub struct Endpoint {
    site: Arc<SiteInner>,
    table: Arc<DestinationTable>,
    queues: Box<[QueueId]>,
    /// Views of this endpoint's receive rings, copied here so polling does not chase
    /// pointers through the site (the site, held by `site`, keeps their memory alive).
    rx: Box<[RxQueue]>,
    doorbell: Option<u16>,
    counters: Arc<EndpointCounters>,
    spin: Duration,
    net: NetState,
    _not_sync: PhantomData<Cell<()>>,
}

/// Per-endpoint state of the network path.
struct NetState {
    /// The sender's lane: order, thread index, policy counter, sequence numbers.
    lane: Lane,
    /// When this endpoint's receive loop polls the network (paper 000 §3.4).
    poller: Cell<AdaptivePoller>,
    /// Epoll set for waiting on the network (created on first use).
    epoll: std::cell::OnceCell<Option<nix::sys::epoll::Epoll>>,
}

impl NetState {
    fn new(site: &SiteInner) -> NetState {
        NetState {
            lane: Lane::new(site.next_lane(), site.config.max_sites),
            poller: Cell::new(AdaptivePoller::default()),
            epoll: std::cell::OnceCell::new(),
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("site", &self.site.id)
            .field("queues", &self.queues)
            .finish()
    }
}

/// One receive queue's rings, as polled by an endpoint.
#[derive(Clone, Copy)]
struct RxQueue {
    id: QueueId,
    express: RawRing<u64>,
    basic: BasicRing,
}

pub(crate) fn alloc_from(site: &SiteInner) -> Result<TagOnBuf, PoolExhausted> {
    site.own
        .pool
        .alloc()
        .inspect_err(|_| site.counters.pool_exhausted.add_shared(1))
}

impl Endpoint {
    pub(crate) fn new(
        site: Arc<SiteInner>,
        table: Arc<DestinationTable>,
        queues: &[QueueId],
    ) -> Endpoint {
        let rx: Box<[RxQueue]> = queues
            .iter()
            .map(|&q| RxQueue {
                id: q,
                express: site.own.express[usize::from(q.0)],
                basic: site.own.basic[usize::from(q.0)],
            })
            .collect();
        let bells: Vec<u16> = queues
            .iter()
            .map(|q| site.own.queue_doorbell[usize::from(q.0)])
            .collect();
        let doorbell = match bells.first() {
            Some(&b) if bells.iter().all(|&x| x == b) => Some(b),
            _ => None,
        };
        let counters = Arc::new(EndpointCounters::default());
        site.register(counters.clone());
        Endpoint {
            table,
            queues: queues.into(),
            rx,
            doorbell,
            net: NetState::new(&site),
            counters,
            spin: DEFAULT_SPIN,
            _not_sync: PhantomData,
            site,
        }
    }

    /// Another handle on the same receive queues and destination table, with its own
    /// statistics counters: for another thread.
    pub fn share(&self) -> Endpoint {
        let counters = Arc::new(EndpointCounters::default());
        self.site.register(counters.clone());
        Endpoint {
            site: self.site.clone(),
            table: self.table.clone(),
            queues: self.queues.clone(),
            rx: self.rx.clone(),
            doorbell: self.doorbell,
            counters,
            spin: self.spin,
            net: NetState::new(&self.site),
            _not_sync: PhantomData,
        }
    }

    /// The site this endpoint belongs to.
    pub fn site(&self) -> SiteId {
        self.site.id
    }

    /// This endpoint's receive queues, highest priority first.
    pub fn queues(&self) -> &[QueueId] {
        &self.queues
    }

    /// The destination table (read-only).
    pub fn table(&self) -> &DestinationTable {
        &self.table
    }

    /// Sets how long blocking receives spin before sleeping (0 = sleep at once).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Translates `name` (paper 004 §4.1) and finds the route to its site.
    #[inline]
    fn resolve(&self, name: VirtualName) -> Result<(Destination, &Route), SendError<()>> {
        let Some(dest) = self.table.lookup(name) else {
            return Err(SendError::UnknownDestination(name, ()));
        };
        match self.site.route(dest.site) {
            Some(route) => Ok((dest, route)),
            None => Err(SendError::Unreachable(dest, ())),
        }
    }

    /// The largest payload [`Endpoint::send_bulk`] accepts, in bytes (the site's
    /// `max_bulk`).
    #[inline]
    pub fn max_bulk(&self) -> usize {
        self.site.config.max_bulk
    }

    /// Whether a message to `name` leaves through the network (an INI) rather than
    /// through shared memory or this process's own queues: there each message costs a
    /// datagram, so a sender gains by putting more into one. `false` for a name that is
    /// unmapped or whose site has no route yet.
    #[inline]
    pub fn reaches_over_network(&self, name: VirtualName) -> bool {
        matches!(self.resolve(name), Ok((_, Route::Network(_))))
    }

    #[inline]
    fn count_substrate(&self, substrate: Substrate) {
        match substrate {
            Substrate::Local => self.counters.local.add(1),
            Substrate::Shm => self.counters.shm.add(1),
            Substrate::Network => self.counters.network.add(1),
        }
    }

    /// After a push into one of this process's own queues: wakes a thread of this process
    /// that waits on the network (it cannot see the futex doorbell).
    #[inline]
    fn notify_local(&self, substrate: Substrate) {
        if substrate == Substrate::Local
            && let Some(net) = self.site.net.get()
        {
            net.notify_local();
        }
    }

    /// Messages this handle has handed to an INI for the network so far (a count; its
    /// share of the site's `network` count in
    /// [`MessageStats::substrate`](crate::MessageStats::substrate), which sums every
    /// endpoint's). Only this handle writes the counter: reading it costs a load.
    #[inline]
    pub fn network_sent(&self) -> u64 {
        self.counters.network.get()
    }

    /// Says which compute thread this endpoint serves; the `static` INI scheduling policy
    /// sends thread i's inter-cluster messages through INI i mod K (paper 002 §3.1).
    pub fn set_thread_index(&self, index: usize) {
        self.net.lane.thread_index.set(index);
    }

    /// Hands a message for a remote site to the route (an INI chosen by the job's
    /// policy). The buffer, if any, is named by `(pool, slot)`; on success the route
    /// owns that reference. `more`: this thread hands over another message at once (a
    /// bulk message's next fragment; see [`RemoteRoute::submit`]). `Err(())`: the
    /// hand-off queue is full (counted).
    #[inline]
    fn submit_remote(
        &self,
        link: &dyn RemoteRoute,
        dest: Destination,
        kind: RemoteKind,
        word: Word,
        buffer: Option<(u16, u32)>,
        more: bool,
    ) -> Result<(), ()> {
        match link.submit(&self.net.lane, dest, kind, word, buffer, more) {
            Ok(()) => {
                self.counters.network.add(1);
                Ok(())
            }
            Err(Refused::Full) => {
                self.counters.full.add(1);
                Err(())
            }
            Err(Refused::Dead) => Err(()),
        }
    }

    /// Sends an Express message to `name`: one claim on the destination ring.
    ///
    /// # Errors
    /// [`SendError`] with the message handed back: `Full`, `UnknownDestination`, `Unreachable`.
    #[inline]
    pub fn send_express(&self, name: VirtualName, msg: Express) -> Result<(), SendError<Express>> {
        let (dest, route) = self.resolve(name).map_err(|e| e.map(|()| msg))?;
        let word = Word::express(msg.handler(), dest.source, msg.payload());
        match route {
            Route::Segment { site, substrate } => {
                let Some(ring) = site.express.get(usize::from(dest.queue.0)) else {
                    return Err(SendError::Unreachable(dest, msg));
                };
                self.site.emulate_send_overhead(*substrate);
                if ring.push(word.0).is_err() {
                    self.counters.full.add(1);
                    return Err(SendError::Full(msg));
                }
                self.counts_sent().express.add(1);
                self.counts_sent().bytes.add(8);
                self.count_substrate(*substrate);
                self.notify_local(*substrate);
                Ok(())
            }
            Route::Network(link) => {
                if link.is_dead(dest.site) {
                    return Err(SendError::Unreachable(dest, msg));
                }
                self.submit_remote(link.as_ref(), dest, RemoteKind::Express, word, None, false)
                    .map_err(|()| SendError::Full(msg))?;
                self.counts_sent().express.add(1);
                self.counts_sent().bytes.add(8);
                Ok(())
            }
        }
    }

    /// Sends an Express message, waiting while the destination queue is full; while it
    /// waits it polls this endpoint's own queues and passes what arrives to `on_message`
    /// (paper 000 §3.3), for at most `timeout` (counted from the first wait; `None`
    /// waits indefinitely).
    ///
    /// # Errors
    /// As [`Endpoint::send_express`], plus `Timeout`.
    pub fn send_express_blocking(
        &self,
        name: VirtualName,
        msg: Express,
        timeout: Option<Duration>,
        on_message: impl FnMut(Message),
    ) -> Result<(), SendError<Express>> {
        self.blocking(msg, &mut Deadline::new(timeout), on_message, |m| {
            self.send_express(name, m)
        })
    }

    /// Allocates a Tag-On buffer from this site's pool.
    ///
    /// # Errors
    /// [`PoolExhausted`] when every slot is in use (counted in the statistics).
    pub fn alloc(&self) -> Result<TagOnBuf, PoolExhausted> {
        alloc_from(&self.site)
    }

    /// Sends a Tag-On message: the header to `name`'s Express ring, the buffer by reference.
    /// Pass a [`TagOnBuf`] to send once, or clones of a frozen [`TagOnData`] to multicast
    /// the same buffer without copying it (paper 004 §5.2).
    ///
    /// # Errors
    /// [`SendError`] handing the buffer reference back.
    #[inline]
    pub fn send_tag_on(
        &self,
        name: VirtualName,
        handler: Handler,
        data: impl Into<TagOnData>,
    ) -> Result<(), SendError<TagOnData>> {
        let data = data.into();
        let (dest, route) = match self.resolve(name) {
            Ok(r) => r,
            Err(e) => return Err(e.map(|()| data)),
        };
        self.push_buffer(dest, route, WordKind::TagOn, handler, data, false)?;
        self.counts_sent().tag_on.add(1);
        Ok(())
    }

    /// [`Endpoint::send_tag_on`], waiting (and polling own queues) while the queue is full.
    ///
    /// # Errors
    /// As [`Endpoint::send_tag_on`], plus `Timeout`.
    pub fn send_tag_on_blocking(
        &self,
        name: VirtualName,
        handler: Handler,
        data: impl Into<TagOnData>,
        timeout: Option<Duration>,
        on_message: impl FnMut(Message),
    ) -> Result<(), SendError<TagOnData>> {
        self.blocking(data.into(), &mut Deadline::new(timeout), on_message, |d| {
            self.send_tag_on(name, handler, d)
        })
    }

    /// Sends the buffer `data` as a message of `kind` (Tag-On or a bulk fragment);
    /// `more`: another fragment of the same bulk message follows at once.
    #[inline]
    fn push_buffer(
        &self,
        dest: Destination,
        route: &Route,
        kind: WordKind,
        handler: Handler,
        data: TagOnData,
        more: bool,
    ) -> Result<(), SendError<TagOnData>> {
        match route {
            Route::Segment { site, substrate } => {
                let (pool, slot) = data.location();
                // The receiver must be able to read the buffer in place: it is in the
                // receiver's own pool, or in this site's pool (which attached peers map).
                if pool != dest.site.0 && pool != self.site.id.0 {
                    return Err(SendError::Unreachable(dest, data));
                }
                let Some(ring) = site.express.get(usize::from(dest.queue.0)) else {
                    return Err(SendError::Unreachable(dest, data));
                };
                let word = Word::buffer(kind, handler, dest.source, pool, slot);
                let len = data.len() as u64;
                self.site.emulate_send_overhead(*substrate);
                if ring.push(word.0).is_err() {
                    self.counters.full.add(1);
                    return Err(SendError::Full(data));
                }
                // The receiver now owns this reference.
                let _ = data.into_transfer();
                self.counts_sent().bytes.add(len);
                self.count_substrate(*substrate);
                self.notify_local(*substrate);
                Ok(())
            }
            Route::Network(link) => {
                if link.is_dead(dest.site) {
                    return Err(SendError::Unreachable(dest, data));
                }
                let frame = if kind == WordKind::Bulk {
                    RemoteKind::Bulk
                } else {
                    RemoteKind::TagOn
                };
                let word = Word::express(handler, dest.source, 0);
                let len = data.len() as u64;
                if self
                    .submit_remote(
                        link.as_ref(),
                        dest,
                        frame,
                        word,
                        Some(data.location()),
                        more,
                    )
                    .is_err()
                {
                    return Err(SendError::Full(data));
                }
                // The INI now owns this reference (it frames the data, then releases it).
                let _ = data.into_transfer();
                self.counts_sent().bytes.add(len);
                Ok(())
            }
        }
    }

    /// Sends a Basic message of up to 256 bytes (copied into the destination's lock-guarded
    /// Basic ring).
    ///
    /// # Errors
    /// [`BasicSendError::TooLong`] over 256 bytes; routing and `Full` errors otherwise.
    pub fn send_basic(
        &self,
        name: VirtualName,
        handler: Handler,
        data: &[u8],
    ) -> Result<(), BasicSendError> {
        let (dest, route) = self.resolve(name)?;
        match route {
            Route::Segment { site, substrate } => {
                let Some(ring) = site.basic.get(usize::from(dest.queue.0)) else {
                    return Err(SendError::Unreachable(dest, ()).into());
                };
                self.site.emulate_send_overhead(*substrate);
                if !ring.push(handler, dest.source, data)? {
                    self.counters.full.add(1);
                    return Err(SendError::Full(()).into());
                }
                self.counts_sent().basic.add(1);
                self.counts_sent().bytes.add(data.len() as u64);
                self.count_substrate(*substrate);
                self.notify_local(*substrate);
                Ok(())
            }
            Route::Network(link) => {
                if data.len() > crate::BASIC_MAX {
                    return Err(BasicTooLong(data.len()).into());
                }
                if link.is_dead(dest.site) {
                    return Err(SendError::Unreachable(dest, ()).into());
                }
                // The bytes travel to the INI in a pool slot (copied once, as on a NIC).
                let Ok(mut buf) = self.alloc() else {
                    return Err(SendError::Full(()).into());
                };
                buf.fill(data);
                let frozen = buf.freeze();
                let word = Word::express(handler, dest.source, 0);
                if self
                    .submit_remote(
                        link.as_ref(),
                        dest,
                        RemoteKind::Basic,
                        word,
                        Some(frozen.location()),
                        false,
                    )
                    .is_err()
                {
                    return Err(SendError::Full(()).into());
                }
                let _ = frozen.into_transfer();
                self.counts_sent().basic.add(1);
                self.counts_sent().bytes.add(data.len() as u64);
                Ok(())
            }
        }
    }

    /// Sends a payload of any length up to the site's `max_bulk` (1 MiB by default) as
    /// fragments in Tag-On slots, reassembled at the destination queue. Waits while the
    /// pool is exhausted or the queue full, polling own queues into `on_message`, for at
    /// most `timeout` in all (counted from the first wait; `None`: indefinitely).
    ///
    /// # Errors
    /// [`BulkSendError`]; on an error after some fragments were sent, the receiver discards
    /// the incomplete message when its reassembly slot is reused (it never delivers a
    /// partial payload).
    pub fn send_bulk(
        &self,
        name: VirtualName,
        handler: Handler,
        data: &[u8],
        timeout: Option<Duration>,
        mut on_message: impl FnMut(Message),
    ) -> Result<(), BulkSendError> {
        let max = self.site.config.max_bulk;
        if data.len() > max || u32::try_from(data.len()).is_err() {
            return Err(BulkSendError::TooLong {
                len: data.len(),
                max,
            });
        }
        let (dest, route) = self.resolve(name)?;
        let mut deadline = Deadline::new(timeout);
        let per = self.site.config.slot_size - FRAGMENT_HEADER;
        let sequence = self.site.next_bulk_sequence();
        // An empty payload still travels as one (empty) fragment.
        let count = data.len().div_ceil(per).max(1);
        let mut fragments = 0u64;
        for i in 0..count {
            let chunk = &data[(i * per).min(data.len())..((i + 1) * per).min(data.len())];
            let mut backoff = Backoff::default();
            let mut buf = loop {
                match self.alloc() {
                    Ok(b) => break b,
                    Err(e) => {
                        self.drain_into(&mut on_message);
                        if deadline.passed() {
                            return Err(e.into());
                        }
                        backoff.snooze_or_nap();
                    }
                }
            };
            let header = FragmentHeader {
                origin: self.site.id.0,
                sequence,
                total: data.len() as u32,
                offset: (i * per) as u32,
            };
            let space = buf.as_mut_capacity();
            header.encode(&mut space[..FRAGMENT_HEADER]);
            space[FRAGMENT_HEADER..FRAGMENT_HEADER + chunk.len()].copy_from_slice(chunk);
            buf.set_len(FRAGMENT_HEADER + chunk.len());
            self.blocking(buf.freeze(), &mut deadline, &mut on_message, |d| {
                self.push_buffer(dest, route, WordKind::Bulk, handler, d, i + 1 < count)
            })
            .map_err(|e| e.map(drop))?;
            fragments += 1;
        }
        let sent = self.counts_sent();
        sent.bulk.add(1);
        sent.bulk_fragments.add(fragments);
        Ok(())
    }

    /// Sends an Express reply to the sender of a received message (its source id is a name
    /// in this endpoint's table, paper 004 §4.1).
    ///
    /// # Errors
    /// As [`Endpoint::send_express`].
    pub fn reply_express(&self, to: SourceId, msg: Express) -> Result<(), SendError<Express>> {
        self.send_express(VirtualName::from(to), msg)
    }

    fn blocking<M>(
        &self,
        mut msg: M,
        deadline: &mut Deadline,
        mut on_message: impl FnMut(Message),
        mut attempt: impl FnMut(M) -> Result<(), SendError<M>>,
    ) -> Result<(), SendError<M>> {
        let mut backoff = Backoff::default();
        loop {
            match attempt(msg) {
                Err(SendError::Full(m)) => {
                    msg = m;
                    self.drain_into(&mut on_message);
                    if deadline.passed() {
                        return Err(SendError::Timeout(msg));
                    }
                    backoff.snooze_or_nap();
                }
                other => return other,
            }
        }
    }

    fn drain_into(&self, on_message: &mut impl FnMut(Message)) {
        while let Some(m) = self.try_recv() {
            on_message(m);
        }
    }

    #[inline(always)]
    fn counts_sent(&self) -> &KindCounters {
        &self.counters.sent
    }

    /// OnePoll over this endpoint's queues: the highest-priority waiting message (queues in
    /// the order given at creation; within a queue, Express before Basic), or `None` at once.
    ///
    /// With LogGP emulation (paper 001 §3.2) a message from another cluster costs this
    /// thread the receive overhead *o_r* (a busy loop before the message is returned), and
    /// one over shared memory is held *L* from when this poll first sees it.
    #[inline]
    pub fn try_recv(&self) -> Option<Message> {
        if self.site.rx_emulated.load(Ordering::Relaxed) != 0 {
            return self.try_recv_emulated();
        }
        self.try_recv_now()
    }

    /// Whether this endpoint's site has INIs, so that its receive polls can read the
    /// network ([`Endpoint::poll_network_next`] has an effect).
    #[inline]
    pub fn polls_network(&self) -> bool {
        self.site.net.get().is_some()
    }

    /// Makes this endpoint's next [`Endpoint::try_recv`] poll the network (on a site with
    /// INIs) whatever the adaptive interval of paper 000 §3.4 says; the interval resumes
    /// after it. For a receive loop that gives its CPU away between polls (a
    /// `sched_yield`, ≈ 0.3 µs or a context switch): the interval exists to keep a
    /// system call off the polls that cost a few cycles, and one in 32 such loops left a
    /// polling home ≈ 10 µs behind a request that had arrived (`bench dsm`, thirty-ninth
    /// session). No effect on a site without INIs.
    #[inline]
    pub fn poll_network_next(&self) {
        let mut p = self.net.poller.get();
        p.force();
        self.net.poller.set(p);
    }

    /// [`Endpoint::try_recv`] without emulation.
    #[inline(always)]
    fn try_recv_now(&self) -> Option<Message> {
        if let Some(m) = self.poll_local() {
            return Some(m);
        }
        self.site.net.get()?;
        self.poll_network()
    }

    /// [`Endpoint::try_recv`] with emulated *L* on shared-memory links and *o_r*.
    #[inline(never)]
    fn try_recv_emulated(&self) -> Option<Message> {
        let m = match &self.site.delay {
            Some(lines) => self.try_recv_delayed(lines),
            None => self.try_recv_now(),
        }?;
        Some(self.received(m))
    }

    /// Pays the emulated receive overhead *o_r* of `m` (paper 001 §3.2: the receiving
    /// processor loops "before actually ... reading the message"): the overhead of the
    /// link it came over — shared memory (`SiteConfig::shm_recv_overhead`) or the
    /// network (the INIs' `emulation.recv_overhead_us`); none for a message from this
    /// site or from a source the table does not name.
    fn received(&self, m: Message) -> Message {
        let o = match self.link_of(&m) {
            Some(Route::Segment {
                substrate: Substrate::Shm,
                ..
            }) => self.site.config.shm_recv_overhead,
            Some(Route::Network(link)) => link.recv_overhead(),
            _ => Duration::ZERO,
        };
        if !o.is_zero() {
            crate::delay::spin_for(o);
        }
        m
    }

    /// The route to the site `m` came from: its source, looked up in this endpoint's
    /// destination table (`None`: a source the table does not name).
    fn link_of(&self, m: &Message) -> Option<&Route> {
        self.table
            .lookup(m.source().into())
            .and_then(|d| self.site.route(d.site))
    }

    /// [`Endpoint::try_recv_now`] with emulated latency *L* on shared-memory links (see
    /// [`crate::delay`]): a held message of this endpoint's queues whose time has come
    /// (queues in priority order); else what is waiting now is taken, messages from
    /// shared-memory peers are held in their queue's line until *L* after this poll, and
    /// a message that needs no delay is returned.
    fn try_recv_delayed(
        &self,
        lines: &[parking_lot::Mutex<crate::delay::DelayLine>],
    ) -> Option<Message> {
        let now = Instant::now();
        let due = || {
            self.rx
                .iter()
                .find_map(|q| lines[usize::from(q.id.0)].lock().due(now))
        };
        if let Some(m) = due() {
            return Some(m);
        }
        // Bounded, so a flood cannot keep the poll from returning.
        for _ in 0..64 {
            let Some((q, m)) = self.try_recv_now_at() else {
                break;
            };
            if self.came_over_shm(&m) {
                lines[usize::from(q.0)].lock().hold(now, m);
            } else {
                return Some(m);
            }
        }
        due()
    }

    /// [`Endpoint::try_recv_now`], naming the queue the message came from.
    fn try_recv_now_at(&self) -> Option<(QueueId, Message)> {
        if let Some(x) = self.poll_local_at() {
            return Some(x);
        }
        self.site.net.get()?;
        self.poll_network_then(|| self.poll_local_at())
    }

    /// Whether `m` came from another site over shared memory: its source, looked up in
    /// this endpoint's destination table, is a site reached through a peer's segment. A
    /// source the table does not name is not delayed.
    fn came_over_shm(&self, m: &Message) -> bool {
        matches!(
            self.link_of(m),
            Some(Route::Segment {
                substrate: Substrate::Shm,
                ..
            })
        )
    }

    /// When the oldest message held for the emulated latency in this endpoint's queues
    /// is due, if any is held.
    fn next_held(&self) -> Option<Instant> {
        let lines = self.site.delay.as_ref()?;
        self.rx
            .iter()
            .filter_map(|q| lines[usize::from(q.id.0)].lock().next_due())
            .min()
    }

    /// The rest of [`Endpoint::try_recv`] on a site with INIs, out of line. Paper 000 §3.4:
    /// the receive loop polls the network one time in 8 to 32, depending on how often
    /// recent network polls found something.
    #[inline(never)]
    fn poll_network(&self) -> Option<Message> {
        self.poll_network_then(|| self.poll_local())
    }

    /// [`Endpoint::poll_network`], then `local` (the poll of this endpoint's queues) when
    /// the network was polled.
    #[inline(always)]
    fn poll_network_then<T>(&self, local: impl FnOnce() -> Option<T>) -> Option<T> {
        let net = self.site.net.get()?;
        let mut p = self.net.poller.get();
        let poll = p.tick(net.poll_bounds());
        if poll {
            let found = net.poll();
            p.record(found);
            self.counters.network_polls.add(1);
        }
        self.net.poller.set(p);
        if poll { local() } else { None }
    }

    #[inline(always)]
    fn poll_local(&self) -> Option<Message> {
        for q in self.rx.iter() {
            if let Some(m) = self.poll_express(q) {
                return Some(m);
            }
            if let Some(m) = self.poll_basic(q) {
                return Some(m);
            }
        }
        None
    }

    /// [`Endpoint::poll_local`], naming the queue the message came from.
    fn poll_local_at(&self) -> Option<(QueueId, Message)> {
        self.rx.iter().find_map(|q| {
            self.poll_express(q)
                .or_else(|| self.poll_basic(q))
                .map(|m| (q.id, m))
        })
    }

    /// Validates a custom OnePoll order over this endpoint's own queues.
    ///
    /// # Errors
    /// [`NotOwnQueue`] for a queue the endpoint does not receive from.
    pub fn poll_set(&self, order: &[PollSource]) -> Result<PollSet, NotOwnQueue> {
        order
            .iter()
            .map(|s| {
                let (PollSource::Express(q) | PollSource::Basic(q)) = *s;
                let i = self
                    .queues
                    .iter()
                    .position(|&own| own == q)
                    .ok_or(NotOwnQueue(q))?;
                Ok((i, matches!(s, PollSource::Basic(_))))
            })
            .collect::<Result<_, _>>()
            .map(PollSet)
    }

    /// OnePoll with a custom priority order (paper 004 §4.3): the message from the first
    /// non-empty source in `set`, or `None`.
    ///
    /// It pays the emulated receive overhead *o_r* as [`Endpoint::try_recv`] does, but
    /// holds nothing for an emulated latency *L* on shared-memory links.
    pub fn one_poll(&self, set: &PollSet) -> Option<Message> {
        let m = set.0.iter().find_map(|&(i, basic)| {
            let q = &self.rx[i];
            if basic {
                self.poll_basic(q)
            } else {
                self.poll_express(q)
            }
        })?;
        if self.site.rx_emulated.load(Ordering::Relaxed) != 0 {
            return Some(self.received(m));
        }
        Some(m)
    }

    /// Waits up to `timeout` for a message: spins for the endpoint's spin time, then sleeps
    /// on the doorbell its queues share, so an idle receiver does not burn a core.
    ///
    /// While it spins it polls the network (on a site with INIs) at every pass, not one
    /// pass in 8 to 32 as [`Endpoint::try_recv`] does (paper 000 §3.4): the spinning
    /// thread does nothing else, so the system call costs no other work, and a reply from
    /// another machine is seen within one socket read instead of half an interval
    /// (`multigrain bench net`'s Express ping-pong through INIs, 8 alternating pairs of
    /// runs, forty-fifth session: 1.552 → 1.414 × busy-polled UDP, medians; one-way
    /// 3.62–3.68 → 3.20–3.33 µs). With a zero spin ([`Endpoint::set_spin`]) its one round
    /// of polls before it sleeps keeps the interval, and so does
    /// [`Endpoint::recv_until_woken`].
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Message> {
        self.recv_waiting(timeout, false)
    }

    /// As [`Endpoint::recv_timeout`], but gives up (`None`) at the first doorbell wake-up
    /// that finds no message: another endpoint of the same queues took it. A receiver that
    /// stands in for other threads polling the same queues — a DSM cluster's protocol
    /// thread — then learns that they poll, instead of sleeping again and being woken by
    /// every message they take (each wake-up of a real-time thread preempts the thread on
    /// its CPU). Where the site has INIs and the receiver waits on their sockets (when no
    /// other thread holds them), it waits as `recv_timeout` does: a datagram that wakes it
    /// is work it does itself (the INIs' pass), not a message another thread took.
    pub fn recv_until_woken(&self, timeout: Duration) -> Option<Message> {
        self.recv_waiting(timeout, true)
    }

    fn recv_waiting(&self, timeout: Duration, until_woken: bool) -> Option<Message> {
        let start = Instant::now();
        let deadline = start + timeout;
        let spin_until = start + self.spin.min(timeout);
        // A receiver spinning here has nothing else to do: it polls the network (INIs) at
        // every pass, as the busy-polled UDP baseline reads its socket, instead of one
        // pass in 8 to 32 (paper 000 §3.4's interval keeps a system call off loops that
        // do other work between polls). Not a receiver that stands in for other threads
        // (`until_woken`): its passes would hold the INIs from the threads whose
        // messages they carry. See `Endpoint::recv_timeout`.
        let every_pass = !until_woken && !self.spin.is_zero();
        loop {
            for _ in 0..64 {
                if every_pass {
                    self.poll_network_next();
                }
                if let Some(m) = self.try_recv() {
                    return Some(m);
                }
                spin_hint();
            }
            if Instant::now() >= spin_until {
                break;
            }
        }
        // Waits for a sender that has claimed a slot and not yet written it (below).
        let mut unpublished = Backoff::default();
        loop {
            if let Some(m) = self.try_recv() {
                return Some(m);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // A message held for the emulated latency is due soon (L is µs): wait for it
            // here rather than sleep past it.
            if let Some(due) = self.next_held() {
                while Instant::now() < due.min(deadline) {
                    spin_hint();
                }
                continue;
            }
            // With INIs, wait on the network sockets themselves when they are free, so a
            // datagram wakes this thread directly.
            // (Not with L on shared-memory links: the wait's check would take a message
            // that must be held.)
            if self.site.delay.is_none()
                && let Some(net) = self.site.net.get()
                && let Some(epoll) = self.net.epoll.get_or_init(|| net.waiter_epoll().ok())
                && let Ok(r) = net.wait(epoll, deadline, &mut || self.poll_local())
            {
                // The receive overhead is paid after the wait has let go of the INIs.
                return if self.site.rx_emulated.load(Ordering::Relaxed) != 0 {
                    r.map(|m| self.received(m))
                } else {
                    r
                };
            }
            match self.doorbell.and_then(|d| self.site.own.doorbell(d)) {
                Some(bell) => {
                    let seq = bell.register();
                    if self.any_claimed() {
                        // A sender claimed a slot and has not written it yet; its wake-up
                        // may have come before we registered, so the bell cannot be slept
                        // on. It usually finishes within nanoseconds on another CPU. One
                        // preempted on this CPU needs the CPU, which a yield gives only to
                        // threads of the same priority: a real-time protocol thread that
                        // yielded in a loop kept a preempted sender off its CPU until the
                        // kernel's real-time throttling (950 ms of each second) let it run
                        // — Water 512 × 50 on 4×1 over shared memory, 2 vCPUs, took ≈ 1 s
                        // longer in about one run in eight (fortieth session). So after the
                        // back-off's spins and yields, it naps 50 µs at a time.
                        bell.unregister();
                        unpublished.snooze_or_nap();
                        continue;
                    }
                    bell.sleep(seq, Some(deadline - now));
                    bell.unregister();
                    if until_woken {
                        return self.try_recv();
                    }
                }
                // Queues on different doorbells: no single futex covers them; poll gently.
                None => std::thread::sleep((deadline - now).min(Duration::from_micros(50))),
            }
        }
    }

    /// Waits for a message indefinitely (see [`Endpoint::recv_timeout`]).
    pub fn recv(&self) -> Message {
        loop {
            if let Some(m) = self.recv_timeout(Duration::from_secs(3600)) {
                return m;
            }
        }
    }

    fn any_claimed(&self) -> bool {
        self.rx
            .iter()
            .any(|q| q.express.has_claimed() || q.basic.has_claimed())
    }

    /// Takes the next message from one source. Words that are rejected, or bulk fragments
    /// that do not yet complete a message, are consumed and the source is polled again.
    #[inline(always)]
    fn poll_express(&self, q: &RxQueue) -> Option<Message> {
        loop {
            let word = Word(q.express.pop()?);
            // The common case inline; buffer headers and bad words out of line, so that the
            // receive loop stays small (paper 000 §4: the poll is on every message's path).
            if word.is_express() {
                let received = &self.counters.received;
                received.express.add(1);
                received.bytes.add(8);
                return Some(Message::Express(word.express_msg()));
            }
            if let Some(m) = self.decode(q.id, word) {
                return Some(m);
            }
        }
    }

    #[inline(always)]
    fn poll_basic(&self, q: &RxQueue) -> Option<Message> {
        if q.basic.looks_empty() {
            return None;
        }
        self.take_basic(q)
    }

    #[inline(never)]
    fn take_basic(&self, q: &RxQueue) -> Option<Message> {
        loop {
            match q.basic.pop()? {
                Ok(m) => {
                    let r = &self.counters.received;
                    r.basic.add(1);
                    r.bytes.add(m.data().len() as u64);
                    return Some(Message::Basic(Box::new(m)));
                }
                Err(_) => self.site.counters.bad_basic.add_shared(1),
            }
        }
    }

    /// Turns a received word into a message: Express inline, Tag-On and bulk fragments
    /// adopt their pool slot. `None` for a rejected word or an incomplete bulk message.
    #[cold]
    #[inline(never)]
    fn decode(&self, queue: QueueId, word: Word) -> Option<Message> {
        let received = &self.counters.received;
        let kind = match word.kind() {
            Ok(k) => k,
            Err(_) => {
                self.site.counters.bad_kind.add_shared(1);
                return None;
            }
        };
        if kind == WordKind::Express {
            received.express.add(1);
            received.bytes.add(8);
            return Some(Message::Express(word.express_msg()));
        }
        let Some(pool) = self.site.pool_of(word.pool()) else {
            self.site.counters.unknown_pool.add_shared(1);
            return None;
        };
        let data = match pool.adopt(word.slot()) {
            Ok(d) => d,
            Err(_) => {
                self.site.counters.bad_slot.add_shared(1);
                return None;
            }
        };
        if kind == WordKind::TagOn {
            received.tag_on.add(1);
            received.bytes.add(data.len() as u64);
            return Some(Message::TagOn(TagOnMsg {
                handler: word.handler(),
                source: word.source(),
                data,
            }));
        }
        received.bulk_fragments.add(1);
        let config = &self.site.config;
        let result = self.site.reassembly[usize::from(queue.0)].lock().add(
            &data,
            config.max_bulk,
            config.max_reassemblies,
        );
        drop(data);
        match result {
            Ok(Some(payload)) => {
                received.bulk.add(1);
                received.bytes.add(payload.len() as u64);
                Some(Message::Bulk(BulkMsg {
                    handler: word.handler(),
                    source: word.source(),
                    data: payload,
                }))
            }
            Ok(None) => None,
            Err(FragmentReject::Malformed) => {
                self.site.counters.bad_fragment.add_shared(1);
                None
            }
            Err(FragmentReject::Limit) => {
                self.site.counters.reassembly_limit.add_shared(1);
                None
            }
        }
    }
}

/// A validated OnePoll priority order (see [`Endpoint::poll_set`]).
#[derive(Clone, Debug)]
pub struct PollSet(Box<[(usize, bool)]>);
