//! Kernels of the inter-cluster path: two sites in this process connected through INI
//! threads over UDP on loopback, beside raw UDP ping-pongs (busy-polled, and with
//! blocking sockets as the weak baseline; see [`network::UdpWait`]).

use crate::*;
use multigrain_cluster_config::{IniPolicy, JobConfig};
use multigrain_messaging::net::{IniGroup, NetConfig};
use std::net::UdpSocket;

/// Bytes on the wire of an Express message through an INI (sliding-window overhead +
/// frame header): the size of the raw-UDP baseline's datagrams.
pub const EXPRESS_DATAGRAM: usize =
    multigrain_messaging::window::wire::OVERHEAD + multigrain_messaging::net::frame::HEADER;

/// How the two ends of a raw-UDP baseline wait for a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpWait {
    /// A blocking `recv`: every arrival wakes a sleeping thread, which on the
    /// development VM makes a round trip cost 40–360 µs across CPUs. The *weak*
    /// baseline: anything that polls beats it.
    Blocking,
    /// A non-blocking `recv` in a spin loop: no thread wake-up on the path, so a
    /// round trip costs what the kernel's UDP path itself costs. The baseline the
    /// INIs are held to.
    BusyPoll,
}

impl UdpWait {
    /// A short label for reports.
    pub fn label(self) -> &'static str {
        match self {
            UdpWait::Blocking => "blocking",
            UdpWait::BusyPoll => "busy-polled",
        }
    }
}

/// Two UDP sockets on loopback, connected to each other, set up for `wait`.
fn udp_pair(wait: UdpWait) -> (UdpSocket, UdpSocket) {
    let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
    a.connect(b.local_addr().expect("addr")).expect("connect");
    b.connect(a.local_addr().expect("addr")).expect("connect");
    for s in [&a, &b] {
        match wait {
            UdpWait::Blocking => s.set_read_timeout(Some(DEADLINE)).expect("timeout"),
            UdpWait::BusyPoll => s.set_nonblocking(true).expect("non-blocking"),
        }
    }
    (a, b)
}

/// Receives one datagram on `s` into `buf`, waiting as `wait` says; panics after
/// `deadline` (a lost peer) with `what`.
fn udp_recv(s: &UdpSocket, buf: &mut [u8], wait: UdpWait, deadline: Instant, what: &str) -> usize {
    if wait == UdpWait::Blocking {
        return s
            .recv(buf)
            .unwrap_or_else(|e| panic!("{what}: blocking recv: {e}"));
    }
    let mut polls = 0u32;
    loop {
        match s.recv(buf) {
            Ok(n) => return n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(4096) {
                    // A loaded machine may have put the peer behind us on our CPU.
                    std::thread::yield_now();
                    assert!(
                        Instant::now() < deadline,
                        "{what}: no datagram for {DEADLINE:?} (is the machine overloaded?)"
                    );
                }
                std::hint::spin_loop();
            }
            Err(e) => panic!("{what}: recv: {e}"),
        }
    }
}

/// A raw-UDP ping-pong between two threads on loopback, pinned to different CPUs,
/// each end waiting as `wait` says: `size`-byte datagrams out, answered by
/// `reply`-byte ones (the request's bytes, then zeros); after [`WARM_UP`] untimed
/// round trips, `round(i, t)` is called after timed round trip `i`, started at `t`.
///
/// # Panics
/// If `size` or `reply` is over 65,507 bytes (a UDP datagram's largest payload), or a
/// datagram of another size arrives at either end.
fn udp_pingpong_with(
    round_trips: u64,
    size: usize,
    reply: usize,
    wait: UdpWait,
    mut round: impl FnMut(u64, Instant),
) {
    const MAX_DATAGRAM: usize = 65_507;
    assert!(
        size <= MAX_DATAGRAM && reply <= MAX_DATAGRAM,
        "UDP datagrams carry at most {MAX_DATAGRAM} bytes (asked {size} and {reply})"
    );
    let _pin = pin_to_cpu(0);
    let (a, b) = udp_pair(wait);
    let deadline = Instant::now() + DEADLINE;
    let echo = std::thread::spawn(move || {
        let _pin = pin_to_cpu(1);
        let mut buf = vec![0u8; 65_536];
        for _ in 0..WARM_UP + round_trips {
            let n = udp_recv(&b, &mut buf, wait, deadline, "UDP echo");
            assert_eq!(n, size, "a request of another size");
            b.send(&buf[..reply]).expect("echo send");
        }
    });
    let msg = vec![7u8; size];
    let mut buf = vec![0u8; 65_536];
    for i in 0..WARM_UP + round_trips {
        let t = Instant::now();
        a.send(&msg).expect("send");
        let n = udp_recv(&a, &mut buf, wait, deadline, "UDP ping");
        assert_eq!(n, reply, "an answer of another size");
        if let Some(timed) = i.checked_sub(WARM_UP) {
            round(timed, t);
        }
    }
    echo.join().expect("echo thread");
}

/// Baseline: the time of `round_trips` round trips of `size`-byte datagrams between
/// two threads on loopback, pinned to different CPUs, both ends waiting as `wait`
/// says.
pub fn udp_pingpong(round_trips: u64, size: usize, wait: UdpWait) -> Duration {
    let mut start = None;
    let mut end = None;
    udp_pingpong_with(round_trips, size, size, wait, |i, t| {
        if i == 0 {
            start = Some(t);
        }
        end = Some(Instant::now());
    });
    match (start, end) {
        (Some(s), Some(e)) => e - s,
        _ => Duration::ZERO,
    }
}

/// Baseline: as [`udp_pingpong`], one sample per round trip (ns each).
pub fn udp_round_trips(round_trips: usize, size: usize, wait: UdpWait) -> Vec<u64> {
    udp_request_reply_round_trips(round_trips, size, size, wait)
}

/// Baseline: round trips of a `request`-byte datagram answered by a `reply`-byte one
/// (a page fetch's shape: a small request, a page back), one sample per round trip
/// (ns each); otherwise as [`udp_pingpong`].
///
/// # Panics
/// If `request` or `reply` is over 65,507 bytes.
pub fn udp_request_reply_round_trips(
    round_trips: usize,
    request: usize,
    reply: usize,
    wait: UdpWait,
) -> Vec<u64> {
    let mut out = Vec::with_capacity(round_trips);
    udp_pingpong_with(round_trips as u64, request, reply, wait, |_, t| {
        out.push(t.elapsed().as_nanos() as u64);
    });
    out
}

/// Two single-queue sites in this process joined by `inis` INIs each over loopback UDP.
pub struct Pair {
    /// Site 0 and its INIs.
    pub a: (Site, IniGroup),
    /// Site 1 and its INIs.
    pub b: (Site, IniGroup),
}

impl Pair {
    /// Builds the pair with `inis` INIs per site and `policy`.
    pub fn new(inis: usize, policy: IniPolicy) -> Pair {
        Pair::with_spin(
            inis,
            policy,
            NetConfig::from_job(&JobConfig::local(2, 1)).spin,
        )
    }

    /// As [`Pair::new`], with the INIs' idle spin time set to `spin`.
    pub fn with_spin(inis: usize, policy: IniPolicy, spin: Duration) -> Pair {
        let mut cfg = Pair::net_config(inis, policy);
        cfg.spin = spin;
        Pair::with_config(&cfg, 2)
    }

    /// The INI settings [`Pair::new`] uses: a local 2-cluster job's, with `inis` INIs per
    /// cluster, `policy` and a 8972-byte MTU.
    pub fn net_config(inis: usize, policy: IniPolicy) -> NetConfig {
        let mut job = JobConfig::local(2, 1);
        job.ini.per_cluster = inis;
        job.ini.policy = policy;
        job.ini.mtu = 8972;
        NetConfig::from_job(&job)
    }

    /// The pair with INI settings `cfg` (`cfg.inis` INIs per site) and `queues` receive
    /// queues per site (at least 2).
    pub fn with_config(cfg: &NetConfig, queues: usize) -> Pair {
        let inis = cfg.inis;
        let sites: Vec<Site> = (0..2)
            .map(|s| {
                Site::new(SiteConfig {
                    site: SiteId(s),
                    queues: vec![QueueSpec::default(); queues.max(2)],
                    pool_slots: 4096,
                    ..SiteConfig::default()
                })
                .expect("site")
            })
            .collect();
        let groups =
            multigrain_messaging::net::connect_loopback(&sites, cfg, inis).expect("start INIs");
        let mut made: Vec<(Site, IniGroup)> = sites.into_iter().zip(groups).collect();
        let b = made.pop().expect("two");
        let a = made.pop().expect("two");
        Pair { a, b }
    }

    /// An endpoint of `site` receiving on `queue` whose name 0 leads to queue `to` of
    /// the other site.
    pub fn endpoint(&self, side: usize, queue: u16, to: u16) -> Endpoint {
        let site = if side == 0 { &self.a.0 } else { &self.b.0 };
        let (ep, w) = site.create_endpoint(&[QueueId(queue)]).expect("endpoint");
        w.map(
            VirtualName(0),
            Destination {
                site: SiteId(1 - side as u16),
                queue: QueueId(to),
                source: SourceId::default(),
            },
        )
        .expect("map");
        ep
    }
}

/// `round_trips` Express round trips between the two sites of `pair` (after
/// [`WARM_UP`] untimed ones that wake the INIs); each side waits with `recv_timeout`
/// (spins briefly, then waits on the network itself).
pub fn express_pingpong(pair: &Pair, round_trips: u64) -> Duration {
    let _pin = pin_to_cpu(0);
    let a = pair.endpoint(0, 0, 0);
    let b = pair.endpoint(1, 0, 0);
    std::thread::scope(|s| {
        s.spawn(move || {
            let _pin = pin_to_cpu(1);
            for _ in 0..WARM_UP + round_trips {
                let m = b.recv_timeout(DEADLINE).expect("network ping-pong stuck");
                let Message::Express(e) = m else {
                    panic!("not Express")
                };
                spin_send(&b, Express::new(Handler(1), e.payload).expect("payload"));
            }
        });
        let mut t0 = Instant::now();
        for i in 0..WARM_UP + round_trips {
            if i == WARM_UP {
                t0 = Instant::now();
            }
            spin_send(
                &a,
                Express::new(Handler(1), i & multigrain_messaging::word::MAX_PAYLOAD)
                    .expect("payload"),
            );
            a.recv_timeout(DEADLINE).expect("network ping-pong stuck");
        }
        t0.elapsed()
    })
}

/// Streams `pages` 4 KiB Tag-On messages from site 0 to site 1, sent by `senders`
/// threads (thread i uses INI i mod K under the static policy). Returns the time until
/// the last one is received.
pub fn tag_on_stream(pair: &Pair, senders: usize, pages: u64) -> Duration {
    let rx = pair.endpoint(1, 1, 0);
    let per = pages / senders as u64;
    let deadline = Instant::now() + DEADLINE;
    let page: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    std::thread::scope(|s| {
        let t0 = Instant::now();
        for t in 0..senders {
            let ep = pair.endpoint(0, 0, 1);
            ep.set_thread_index(t);
            let page = &page;
            s.spawn(move || {
                for _ in 0..per {
                    let mut buf = loop {
                        match ep.alloc() {
                            Ok(b) => break b,
                            Err(_) => {
                                assert!(Instant::now() < deadline, "pool never freed");
                                std::thread::yield_now();
                            }
                        }
                    };
                    buf.fill(page);
                    ep.send_tag_on_blocking(
                        VirtualName(0),
                        Handler(1),
                        buf,
                        Some(DEADLINE),
                        |_| {},
                    )
                    .expect("send");
                }
            });
        }
        let mut got = 0;
        while got < per * senders as u64 {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Some(Message::TagOn(m)) => {
                    assert_eq!(m.data.len(), 4096);
                    got += 1;
                }
                Some(other) => panic!("unexpected {other:?}"),
                None => assert!(Instant::now() < deadline, "stream stuck at {got}"),
            }
        }
        t0.elapsed()
    })
}

/// A sized ping-pong ([`crate::sizes`]) between the two sites of `pair`: `warm_up +
/// round_trips` round trips of `size` bytes as `kind`, each end waiting with
/// `recv_timeout`, pinned to different CPUs; returns the time of the last `round_trips`.
pub fn sized_pingpong(
    pair: &Pair,
    kind: crate::sizes::Kind,
    size: usize,
    (warm_up, round_trips): (u64, u64),
) -> Duration {
    use crate::sizes::{Placement, Wait, pingpong_between};
    pingpong_between(
        (&pair.endpoint(0, 0, 0), pair.endpoint(1, 0, 0)),
        kind,
        size,
        (warm_up, round_trips),
        (Wait::Park, Placement::Pinned),
    )
    .0
}

/// A sized stream from site 0 to one queue of site 1: `senders` threads (thread i uses INI
/// i mod K under the static policy) each send `per_sender` messages of `size` bytes as
/// `kind`; returns the time until the last byte is received. No thread is pinned (the INI
/// threads share the CPUs).
pub fn sized_stream(
    pair: &Pair,
    kind: crate::sizes::Kind,
    size: usize,
    senders: usize,
    per_sender: u64,
) -> Duration {
    use crate::sizes::{Placement, Wait, stream_between};
    let tx = (0..senders).map(|_| pair.endpoint(0, 0, 1)).collect();
    stream_between(
        &pair.endpoint(1, 1, 0),
        tx,
        kind,
        (size, per_sender),
        (Wait::Park, Placement::Free),
    )
    .0
}
