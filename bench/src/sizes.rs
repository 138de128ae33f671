//! Kernels of the message-size experiment (paper 004 §6, Figures 4–7; paper 003 §4): one
//! message of `size` bytes sent as one of the message layer's four kinds, ping-ponged (one-way
//! latency = round trip ÷ 2) or streamed (bandwidth), between any two endpoints whose name 0
//! leads to the other side. The same send and receive code runs on every path: two threads
//! of one site ([`Threads`]), two processes over a shared segment
//! ([`crate::cross_process::PingPong::sized_pingpong`]) and two sites through INIs over UDP
//! loopback ([`crate::network::sized_pingpong`]).
//!
//! A kind that cannot carry `size` bytes in one message sends its *natural sequence*
//! (see [`Kind::messages`]): Express one word per 4 bytes, Basic one message per 256 bytes,
//! Tag-On one pool slot (4 KiB) per message. Bulk is one message of any size up to the
//! site's `max_bulk` (1 MiB). The sender copies the bytes from its own buffer into the
//! message (for Express: packs them into words) and the receiver reads every byte once
//! (a checksum it verifies), so every kind moves the same data from memory to memory.

use crate::*;
use multigrain_messaging::bulk::FRAGMENT_HEADER;
use multigrain_messaging::{BASIC_MAX, BasicSendError, DEFAULT_SLOT_SIZE};

/// Payload bytes per Express word in a message larger than one word: 4 (paper 004 §6
/// counts message size in 4-byte words; an Express word carries 40 payload bits).
pub const EXPRESS_BYTES: usize = 4;

/// Largest message sent as a sequence of Express words: 256 bytes (64 words), Basic's
/// limit. Past it Express is not a kind anyone would move data with (its bandwidth is flat
/// from two words on: one word per message), and through the INIs, where every word is a
/// message of its own, a 1 MiB message would take 262 144 of them.
pub const EXPRESS_MAX: usize = 256;

/// One of the message layer's kinds (paper 004 §5; design.md "messaging").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// One 64-bit word per message; 4 data bytes per word in a sequence.
    Express,
    /// Up to [`BASIC_MAX`] (256) bytes copied into a lock-guarded ring.
    Basic,
    /// An Express header plus one pool slot (4 KiB) read in place by the receiver.
    TagOn,
    /// Any length up to `max_bulk` (1 MiB), fragmented over pool slots (4 KiB less a
    /// 16-byte fragment header each) and reassembled at the receiving queue.
    Bulk,
}

impl Kind {
    /// The kinds, in table order.
    pub const ALL: [Kind; 4] = [Kind::Express, Kind::Basic, Kind::TagOn, Kind::Bulk];

    /// Its name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Express => "Express",
            Kind::Basic => "Basic",
            Kind::TagOn => "Tag-On",
            Kind::Bulk => "bulk",
        }
    }

    /// A short id for file names and JSON keys.
    pub fn id(self) -> &'static str {
        match self {
            Kind::Express => "express",
            Kind::Basic => "basic",
            Kind::TagOn => "tag_on",
            Kind::Bulk => "bulk",
        }
    }

    /// Bytes one message of this kind carries (bulk: one fragment).
    pub fn unit(self) -> usize {
        match self {
            Kind::Express => EXPRESS_BYTES,
            Kind::Basic => BASIC_MAX,
            Kind::TagOn => DEFAULT_SLOT_SIZE,
            Kind::Bulk => DEFAULT_SLOT_SIZE - FRAGMENT_HEADER,
        }
    }

    /// Messages (bulk: fragments) that carry one `size`-byte message of this kind, or
    /// `None` where the kind does not carry that size at all (Express above
    /// [`EXPRESS_MAX`], bulk above 1 MiB).
    pub fn messages(self, size: usize) -> Option<usize> {
        let limit = match self {
            Kind::Express => EXPRESS_MAX,
            Kind::Bulk => 1 << 20,
            Kind::Basic | Kind::TagOn => usize::MAX,
        };
        (size <= limit).then(|| size.div_ceil(self.unit()).max(1))
    }

    fn code(self) -> u64 {
        self as u64
    }

    fn from_code(c: u64) -> Kind {
        Kind::ALL[(c & 3) as usize]
    }
}

/// The handler every data message of these kernels carries.
const DATA: Handler = Handler(1);

/// `size` bytes of a fixed pattern (a multiple of [`EXPRESS_BYTES`] long).
///
/// # Panics
/// If `size` is not a multiple of [`EXPRESS_BYTES`] (the kernels' checksum counts 4-byte
/// words).
pub fn pattern(size: usize) -> Vec<u8> {
    assert!(
        size.is_multiple_of(EXPRESS_BYTES),
        "message size {size} is not a multiple of {EXPRESS_BYTES} bytes"
    );
    (0..size).map(|i| (i * 7 + 1) as u8).collect()
}

/// The kernels' checksum: the wrapping sum of the bytes as little-endian 4-byte words.
pub fn sum32(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(EXPRESS_BYTES).fold(0u64, |acc, w| {
        acc.wrapping_add(u64::from(u32::from_le_bytes(
            w.try_into().expect("4 bytes"),
        )))
    })
}

/// How a receiver waits for the next message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// `try_recv` in a spin loop (yielding now and then): memory paths.
    Spin,
    /// `recv_timeout`, which spins briefly and then sleeps on the queue's doorbell: the
    /// network path, where the INI threads need the CPU the receiver would spin on.
    Park,
}

fn next(ep: &Endpoint, wait: Wait, deadline: Instant) -> Message {
    match wait {
        Wait::Spin => spin_recv(ep, deadline),
        Wait::Park => loop {
            if let Some(m) = ep.recv_timeout(Duration::from_millis(100)) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "sized-message peer stuck for {DEADLINE:?}"
            );
        },
    }
}

/// Sends `data` to name 0 as one message of `kind` (its natural sequence, see
/// [`Kind::messages`]), waiting while the destination queue or the pool is full.
///
/// # Panics
/// On any error other than a full queue or pool, and after the benchmark deadline.
pub fn send(ep: &Endpoint, kind: Kind, data: &[u8], deadline: Instant) {
    // A full queue or pool waits for the receiver (or an INI thread): give it the CPU in
    // case it shares this one.
    let full = |what: &str| {
        assert!(Instant::now() < deadline, "{what} full for {DEADLINE:?}");
        std::thread::yield_now();
    };
    match kind {
        Kind::Express => {
            for w in data.chunks_exact(EXPRESS_BYTES) {
                let v = u32::from_le_bytes(w.try_into().expect("4 bytes"));
                let mut m = Express::new(DATA, u64::from(v)).expect("32-bit payload");
                while let Err(e) = ep.send_express(VirtualName(0), m) {
                    assert!(e.is_full(), "Express send: {e}");
                    m = e.into_inner();
                    full("Express queue");
                }
            }
        }
        Kind::Basic => {
            for chunk in data.chunks(BASIC_MAX) {
                while let Err(e) = ep.send_basic(VirtualName(0), DATA, chunk) {
                    assert!(
                        matches!(e, BasicSendError::Send(ref s) if s.is_full()),
                        "Basic send: {e}"
                    );
                    full("Basic ring");
                }
            }
        }
        Kind::TagOn => {
            for chunk in data.chunks(DEFAULT_SLOT_SIZE) {
                let mut buf = loop {
                    match ep.alloc() {
                        Ok(b) => break b,
                        Err(_) => full("pool"),
                    }
                };
                buf.fill(chunk);
                let mut d = buf.freeze();
                while let Err(e) = ep.send_tag_on(VirtualName(0), DATA, d) {
                    assert!(e.is_full(), "Tag-On send: {e}");
                    d = e.into_inner();
                    full("Express ring");
                }
            }
        }
        Kind::Bulk => ep
            .send_bulk(VirtualName(0), DATA, data, Some(DEADLINE), |m| {
                panic!("a {} message arrived while sending bulk", m.kind_name())
            })
            .expect("bulk send"),
    }
}

/// Receives messages of `kind` until `bytes` bytes have arrived (one message of `bytes`
/// bytes, or many in a stream); returns the checksum ([`sum32`]) of what arrived.
///
/// # Panics
/// On a message of another kind, and after the benchmark deadline.
pub fn recv(ep: &Endpoint, kind: Kind, bytes: usize, wait: Wait, deadline: Instant) -> u64 {
    let (mut got, mut sum) = (0usize, 0u64);
    while got < bytes {
        let (n, s) = match (kind, next(ep, wait, deadline)) {
            (Kind::Express, Message::Express(m)) => (EXPRESS_BYTES, m.payload),
            (Kind::Basic, Message::Basic(m)) => (m.data().len(), sum32(m.data())),
            (Kind::TagOn, Message::TagOn(m)) => (m.data.len(), sum32(&m.data)),
            (Kind::Bulk, Message::Bulk(m)) => (m.data.len(), sum32(&m.data)),
            (k, m) => panic!("expected {}, got {}", k.label(), m.kind_name()),
        };
        got += n;
        sum = sum.wrapping_add(s);
    }
    assert_eq!(got, bytes, "{} bytes overran", kind.label());
    sum
}

/// The pinging side of a sized ping-pong: `warm_up + round_trips` times, sends `size`
/// bytes as `kind` and waits for the whole echo; returns the time of the last
/// `round_trips` (one-way latency = time ÷ round trips ÷ 2).
pub fn ping(
    ep: &Endpoint,
    kind: Kind,
    size: usize,
    (warm_up, round_trips): (u64, u64),
    wait: Wait,
) -> Duration {
    let data = pattern(size);
    let expect = sum32(&data);
    let deadline = Instant::now() + DEADLINE;
    let mut t0 = Instant::now();
    for i in 0..warm_up + round_trips {
        if i == warm_up {
            t0 = Instant::now();
        }
        send(ep, kind, &data, deadline);
        assert_eq!(
            recv(ep, kind, size, wait, deadline),
            expect,
            "echo corrupted"
        );
    }
    t0.elapsed()
}

/// The echoing side of a sized ping-pong: `round_trips` times, waits for `size` bytes of
/// `kind` and sends them back.
pub fn echo(ep: &Endpoint, kind: Kind, size: usize, round_trips: u64, wait: Wait) {
    let data = pattern(size);
    let expect = sum32(&data);
    let deadline = Instant::now() + DEADLINE;
    for _ in 0..round_trips {
        assert_eq!(
            recv(ep, kind, size, wait, deadline),
            expect,
            "ping corrupted"
        );
        send(ep, kind, &data, deadline);
    }
}

/// How the threads of an in-process kernel are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The calling thread on the first CPU, the others on the second ([`pin_to_cpu`]).
    Pinned,
    /// Wherever the scheduler puts them (the network path: INI threads share the CPUs).
    Free,
}

impl Placement {
    fn pin(self, i: usize) -> Option<PinGuard> {
        (self == Placement::Pinned).then(|| pin_to_cpu(i))
    }
}

/// A sized ping-pong between two endpoints of this process: the calling thread pings on
/// `a`, a new thread echoes on `b`. Returns the time and `b`, to be used again.
pub fn pingpong_between(
    (a, b): (&Endpoint, Endpoint),
    kind: Kind,
    size: usize,
    (warm_up, round_trips): (u64, u64),
    (wait, place): (Wait, Placement),
) -> (Duration, Endpoint) {
    let _pin = place.pin(0);
    std::thread::scope(|s| {
        let echoer = s.spawn(move || {
            let _pin = place.pin(1);
            echo(&b, kind, size, warm_up + round_trips, wait);
            b
        });
        let t = ping(a, kind, size, (warm_up, round_trips), wait);
        (t, echoer.join().expect("echo thread"))
    })
}

/// A stream into one receiver in this process: each of `senders` (one thread each) sends
/// `per_sender` messages of `size` bytes as `kind`; the calling thread receives on `rx`
/// and checks the checksum. Returns the time from the start until the last byte arrived,
/// and the senders' endpoints, to be used again.
pub fn stream_between(
    rx: &Endpoint,
    senders: Vec<Endpoint>,
    kind: Kind,
    (size, per_sender): (usize, u64),
    (wait, place): (Wait, Placement),
) -> (Duration, Vec<Endpoint>) {
    let _pin = place.pin(0);
    let data = pattern(size);
    let n = senders.len();
    let deadline = Instant::now() + DEADLINE;
    let start = std::sync::Barrier::new(n + 1);
    std::thread::scope(|s| {
        let threads: Vec<_> = senders
            .into_iter()
            .enumerate()
            .map(|(t, ep)| {
                ep.set_thread_index(t);
                let (data, start) = (&data, &start);
                s.spawn(move || {
                    let _pin = place.pin(1);
                    start.wait();
                    for _ in 0..per_sender {
                        send(&ep, kind, data, deadline);
                    }
                    ep
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let total = n * per_sender as usize;
        let sum = recv(rx, kind, size * total, wait, deadline);
        let elapsed = t0.elapsed();
        assert_eq!(
            sum,
            sum32(&data).wrapping_mul(total as u64),
            "stream corrupted"
        );
        let back = threads
            .into_iter()
            .map(|t| t.join().expect("sender"))
            .collect();
        (elapsed, back)
    })
}

/// The threads path: one site whose endpoints live across samples, so that every sample
/// finds its pool's pages already touched (a fresh site per sample would time the first
/// touch of each slot).
pub struct Threads {
    /// Keeps the site (and its pool) alive.
    _site: Site,
    /// Receives on queue 0; name 0 leads to queue 1. Pings, and drains the streams.
    a: Endpoint,
    /// Receives on queue 1; name 0 leads to queue 0. Echoes.
    b: Option<Endpoint>,
    /// Stream senders (receive on queue 1, unused); name 0 leads to queue 0.
    tx: Vec<Endpoint>,
}

impl Threads {
    /// The site, with `senders` stream senders.
    pub fn new(senders: usize) -> Threads {
        let site = two_queue_site();
        let (a, b) = endpoint_pair(&site);
        let to0 = Destination {
            site: site.id(),
            queue: QueueId(0),
            source: SourceId::default(),
        };
        let tx = (0..senders)
            .map(|_| {
                let (ep, w) = site.create_endpoint(&[QueueId(1)]).expect("queue 1");
                w.map(VirtualName(0), to0).expect("name 0");
                ep
            })
            .collect();
        Threads {
            _site: site,
            a,
            b: Some(b),
            tx,
        }
    }

    /// A sized ping-pong between two threads (busy polling, the two ends pinned to
    /// different CPUs).
    pub fn pingpong(&mut self, kind: Kind, size: usize, rounds: (u64, u64)) -> Duration {
        let b = self.b.take().expect("echo endpoint");
        let (t, b) = pingpong_between(
            (&self.a, b),
            kind,
            size,
            rounds,
            (Wait::Spin, Placement::Pinned),
        );
        self.b = Some(b);
        t
    }

    /// `senders` threads (at most [`Threads::new`]'s) stream `per_sender` messages each of
    /// `size` bytes as `kind` into one queue that the calling thread drains (receiver on
    /// the first CPU, every sender on the second).
    ///
    /// # Panics
    /// If `senders` is more than the site was made with.
    pub fn stream(&mut self, kind: Kind, size: usize, senders: usize, per_sender: u64) -> Duration {
        assert!(
            senders <= self.tx.len(),
            "{senders} senders > {}",
            self.tx.len()
        );
        let tx: Vec<Endpoint> = self.tx.drain(..senders).collect();
        let (t, back) = stream_between(
            &self.a,
            tx,
            kind,
            (size, per_sender),
            (Wait::Spin, Placement::Pinned),
        );
        self.tx.splice(0..0, back);
        t
    }
}

/// Encodes a sized-kernel request for a peer process: `(payload of the first word, the
/// count)`; see [`decode_request`].
pub(crate) fn encode_request(stream: bool, kind: Kind, size: usize) -> u64 {
    u64::from(stream) | (kind.code() << 1) | ((size as u64) << 3)
}

/// Decodes [`encode_request`]'s word: (stream?, kind, size).
pub(crate) fn decode_request(w: u64) -> (bool, Kind, usize) {
    (w & 1 == 1, Kind::from_code(w >> 1), (w >> 3) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_sequences() {
        assert_eq!(Kind::Express.messages(8), Some(2));
        assert_eq!(Kind::Express.messages(256), Some(64));
        assert_eq!(Kind::Express.messages(512), None);
        assert_eq!(Kind::Basic.messages(256), Some(1));
        assert_eq!(Kind::Basic.messages(1 << 20), Some(4096));
        assert_eq!(Kind::TagOn.messages(8), Some(1));
        assert_eq!(Kind::TagOn.messages(16384), Some(4));
        assert_eq!(Kind::Bulk.messages(4096), Some(2));
        assert_eq!(Kind::Bulk.messages(1 << 20), Some(258));
        assert_eq!(Kind::Bulk.messages((1 << 20) + 8), None);
    }

    #[test]
    fn requests_round_trip() {
        for kind in Kind::ALL {
            for size in [8, 4096, 1 << 20] {
                for stream in [false, true] {
                    assert_eq!(
                        decode_request(encode_request(stream, kind, size)),
                        (stream, kind, size)
                    );
                }
            }
        }
    }

    #[test]
    fn every_kind_moves_every_byte_between_threads() {
        for kind in Kind::ALL {
            for size in [8, 264, 8200] {
                if kind.messages(size).is_none() {
                    continue;
                }
                let mut t = Threads::new(2);
                t.pingpong(kind, size, (1, 2));
                t.stream(kind, size, 2, 3);
                t.pingpong(kind, size, (1, 2));
                t.stream(kind, size, 1, 3);
            }
        }
    }
}
