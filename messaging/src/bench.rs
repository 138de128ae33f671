//! Measurement kernels shared by the criterion benchmarks (`messaging/benches/`) and the
//! `multigrain bench messaging` command, so both measure exactly the same code, each beside
//! its baseline in the same run.
//!
//! Each kernel runs a fixed amount of work and returns the elapsed wall time; the caller
//! divides. Ping-pong kernels return the time for `round_trips` round trips (one-way
//! latency = time / round trips / 2). Every wait spins (the latency path), bounded by a
//! generous deadline so that a broken peer fails instead of hanging.

#![allow(clippy::disallowed_types)] // baselines use std atomics on purpose

use crate::{
    Destination, Endpoint, Express, Handler, Message, QueueId, QueueSpec, Site, SiteConfig, SiteId,
    SourceId, VirtualName,
};
use crossbeam_utils::CachePadded;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(120);

/// Untimed round trips before a timed ping-pong whose peer may be asleep (a process or
/// INI thread waiting in a blocking receive, a freshly spawned thread): the first
/// exchanges would otherwise time its wake-up, not the path.
pub const WARM_UP: u64 = 16;

/// Pins the calling thread to the `i`-th CPU this process may use (modulo their number),
/// so that the two ends of a ping-pong or stream sit on different CPUs run after run
/// instead of sometimes time-sharing one. Returns a guard restoring the thread's previous
/// CPU set; best effort (does nothing where affinity cannot be read or set).
///
/// The CPUs "this process may use" are the calling thread's CPU set at the first call in
/// the process, remembered: a thread spawned by a pinned thread inherits its single CPU,
/// and must still be able to pin itself to another one.
pub fn pin_to_cpu(i: usize) -> PinGuard {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    static ALLOWED: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    let Ok(before) = sched_getaffinity(Pid::from_raw(0)) else {
        return PinGuard(None);
    };
    let cpus = ALLOWED.get_or_init(|| {
        (0..CpuSet::count())
            .filter(|&c| before.is_set(c).unwrap_or(false))
            .collect()
    });
    if cpus.len() < 2 {
        return PinGuard(None);
    }
    let mut one = CpuSet::new();
    if one.set(cpus[i % cpus.len()]).is_err() || sched_setaffinity(Pid::from_raw(0), &one).is_err()
    {
        return PinGuard(None);
    }
    PinGuard(Some(before))
}

/// Restores a thread's CPU set when dropped (see [`pin_to_cpu`]).
#[derive(Debug)]
pub struct PinGuard(Option<nix::sched::CpuSet>);

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some(set) = self.0.take() {
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
        }
    }
}

fn spin_until(deadline: Instant, what: &str, mut cond: impl FnMut() -> bool) {
    let mut n = 0u32;
    while !cond() {
        std::hint::spin_loop();
        n = n.wrapping_add(1);
        if n.is_multiple_of(1024) {
            // A loaded machine may have put the peer behind us on our CPU: let it run.
            std::thread::yield_now();
            if Instant::now() > deadline {
                panic!(
                    "benchmark peer stuck for {DEADLINE:?}: {what} (is the machine overloaded?)"
                );
            }
        }
    }
}

/// Two endpoints on one site, each receiving on its own queue; name 0 leads to the other.
fn endpoint_pair(site: &Site) -> (Endpoint, Endpoint) {
    let (a, wa) = site.create_endpoint(&[QueueId(0)]).expect("queue 0");
    let (b, wb) = site.create_endpoint(&[QueueId(1)]).expect("queue 1");
    let to = |q| Destination {
        site: site.id(),
        queue: QueueId(q),
        source: SourceId::default(),
    };
    wa.map(VirtualName(0), to(1)).expect("name 0");
    wb.map(VirtualName(0), to(0)).expect("name 0");
    (a, b)
}

fn two_queue_site() -> Site {
    Site::new(SiteConfig {
        queues: vec![QueueSpec::default(); 2],
        ..SiteConfig::default()
    })
    .expect("site")
}

fn spin_recv(ep: &Endpoint, deadline: Instant) -> Message {
    let mut got = None;
    spin_until(deadline, "waiting for a message", || {
        got = ep.try_recv();
        got.is_some()
    });
    got.expect("received")
}

fn spin_send(ep: &Endpoint, msg: Express) {
    let mut m = msg;
    while let Err(e) = ep.send_express(VirtualName(0), m) {
        assert!(e.is_full(), "send failed: {e}");
        m = e.into_inner();
        std::hint::spin_loop();
    }
}

/// Baseline: two threads bounce a counter through one cache line.
pub fn atomic_pingpong(round_trips: u64) -> Duration {
    let _pin = pin_to_cpu(0);
    let flag = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let deadline = Instant::now() + DEADLINE;
    let echo = {
        let flag = flag.clone();
        std::thread::spawn(move || {
            let _pin = pin_to_cpu(1);
            for i in 0..round_trips {
                spin_until(deadline, "atomic echo", || {
                    flag.load(Ordering::Acquire) == 2 * i + 1
                });
                flag.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    let t0 = Instant::now();
    for i in 0..round_trips {
        flag.store(2 * i + 1, Ordering::Release);
        spin_until(deadline, "atomic ping", || {
            flag.load(Ordering::Acquire) == 2 * i + 2
        });
    }
    let elapsed = t0.elapsed();
    echo.join().expect("echo thread");
    elapsed
}

/// Baseline: like [`atomic_pingpong`], but each direction has its own flag on its own
/// cache line, as any ping-pong through two queues must (the ping's queue and the pong's
/// queue are different memory). Each one-way trip then needs the writer to take a line the
/// reader is spinning on, where the one-flag ping-pong's writer already holds its line:
/// the floor under a queue-based round trip on this machine.
pub fn two_flag_pingpong(round_trips: u64) -> Duration {
    let _pin = pin_to_cpu(0);
    let flags = Arc::new([
        CachePadded::new(AtomicU64::new(0)),
        CachePadded::new(AtomicU64::new(0)),
    ]);
    let deadline = Instant::now() + DEADLINE;
    let echo = {
        let flags = flags.clone();
        std::thread::spawn(move || {
            let _pin = pin_to_cpu(1);
            for i in 0..round_trips {
                spin_until(deadline, "two-flag echo", || {
                    flags[0].load(Ordering::Acquire) == i + 1
                });
                flags[1].store(i + 1, Ordering::Release);
            }
        })
    };
    let t0 = Instant::now();
    for i in 0..round_trips {
        flags[0].store(i + 1, Ordering::Release);
        spin_until(deadline, "two-flag ping", || {
            flags[1].load(Ordering::Acquire) == i + 1
        });
    }
    let elapsed = t0.elapsed();
    echo.join().expect("echo thread");
    elapsed
}

/// Express messages bounced between two endpoints in two threads (busy polling).
pub fn express_pingpong(round_trips: u64) -> Duration {
    let _pin = pin_to_cpu(0);
    let site = two_queue_site();
    let (a, b) = endpoint_pair(&site);
    let deadline = Instant::now() + DEADLINE;
    let echo = std::thread::spawn(move || {
        let _pin = pin_to_cpu(1);
        for _ in 0..round_trips {
            let Message::Express(m) = spin_recv(&b, deadline) else {
                panic!("not Express")
            };
            spin_send(&b, Express::new(Handler(1), m.payload).expect("payload"));
        }
    });
    let t0 = Instant::now();
    for i in 0..round_trips {
        spin_send(
            &a,
            Express::new(Handler(1), i & crate::word::MAX_PAYLOAD).expect("payload"),
        );
        spin_recv(&a, deadline);
    }
    let elapsed = t0.elapsed();
    echo.join().expect("echo thread");
    elapsed
}

/// A ping-pong through two queues, each given as the closures that use it: the calling
/// thread sends pings and polls for pongs, an echo thread polls for pings and sends each
/// back as a pong. `what` names the queues in a stuck-peer panic.
fn queue_pingpong(
    round_trips: u64,
    what: &str,
    (mut send_ping, mut pong_arrived): (impl FnMut(u64), impl FnMut() -> bool),
    (mut poll_ping, mut send_pong): (
        impl FnMut() -> Option<u64> + Send + 'static,
        impl FnMut(u64) + Send + 'static,
    ),
) -> Duration {
    let _pin = pin_to_cpu(0);
    let deadline = Instant::now() + DEADLINE;
    let echo_what = format!("{what} echo");
    let echo = std::thread::spawn(move || {
        let _pin = pin_to_cpu(1);
        for _ in 0..round_trips {
            let mut v = None;
            spin_until(deadline, &echo_what, || {
                v = poll_ping();
                v.is_some()
            });
            send_pong(v.expect("value"));
        }
    });
    let ping_what = format!("{what} ping");
    let t0 = Instant::now();
    for i in 0..round_trips {
        send_ping(i);
        spin_until(deadline, &ping_what, &mut pong_arrived);
    }
    let elapsed = t0.elapsed();
    echo.join().expect("echo thread");
    elapsed
}

/// Baseline: the same ping-pong through two single-producer single-consumer rings (the
/// `rtrb` crate: cached indices, no read-modify-write, no per-message check of the other
/// side's line). Not a substitute for Express, which any number of threads may send to and
/// receive from, but the floor under any ring-based round trip: each message takes a fresh
/// slot, where the flag ping-pongs reuse one line.
pub fn spsc_pingpong(round_trips: u64) -> Duration {
    let (mut tx_a, mut rx_a) = rtrb::RingBuffer::<u64>::new(1024);
    let (mut tx_b, mut rx_b) = rtrb::RingBuffer::<u64>::new(1024);
    queue_pingpong(
        round_trips,
        "spsc",
        (
            move |i| tx_a.push(i).expect("room"),
            move || rx_b.pop().is_ok(),
        ),
        (
            move || rx_a.pop().ok(),
            move |v| tx_b.push(v).expect("room"),
        ),
    )
}

/// Baseline: crossbeam-channel bounded channels, `try_recv` polling (its fastest mode).
pub fn crossbeam_pingpong(round_trips: u64) -> Duration {
    let (tx_a, rx_a) = crossbeam_channel::bounded::<u64>(1024);
    let (tx_b, rx_b) = crossbeam_channel::bounded::<u64>(1024);
    queue_pingpong(
        round_trips,
        "crossbeam",
        (
            move |i| tx_a.send(i).expect("send"),
            move || rx_b.try_recv().is_ok(),
        ),
        (
            move || rx_a.try_recv().ok(),
            move |v| tx_b.send(v).expect("send"),
        ),
    )
}

/// `senders` threads push `messages` Express messages in total into one queue; the calling
/// thread drains it. Returns the time until the last message is received.
pub fn express_throughput(senders: usize, messages: u64) -> Duration {
    let _pin = pin_to_cpu(0);
    let site = two_queue_site();
    let (rx, _w) = site.create_endpoint(&[QueueId(0)]).expect("queue 0");
    let per = messages / senders as u64;
    let start = Arc::new(std::sync::Barrier::new(senders + 1));
    let threads: Vec<_> = (0..senders)
        .map(|_| {
            let (tx, w) = site.create_endpoint(&[QueueId(1)]).expect("queue 1");
            w.map(
                VirtualName(0),
                Destination {
                    site: SiteId(0),
                    queue: QueueId(0),
                    source: SourceId::default(),
                },
            )
            .expect("map");
            let start = start.clone();
            std::thread::spawn(move || {
                let _pin = pin_to_cpu(1);
                start.wait();
                for i in 0..per {
                    spin_send(&tx, Express::new(Handler(1), i).expect("payload"));
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let deadline = t0 + DEADLINE;
    let mut got = 0;
    while got < per * senders as u64 {
        if rx.try_recv().is_some() {
            got += 1;
        } else {
            std::hint::spin_loop();
            assert!(
                got % 1024 != 0 || Instant::now() < deadline,
                "throughput run stuck"
            );
        }
    }
    let elapsed = t0.elapsed();
    threads.into_iter().for_each(|t| t.join().expect("sender"));
    elapsed
}

fn queue_throughput<Q: Send + Sync + 'static>(
    senders: usize,
    messages: u64,
    q: Q,
    push: fn(&Q, u64) -> bool,
    pop: fn(&Q) -> Option<u64>,
) -> Duration {
    let _pin = pin_to_cpu(0);
    let q = Arc::new(q);
    let per = messages / senders as u64;
    let start = Arc::new(std::sync::Barrier::new(senders + 1));
    let threads: Vec<_> = (0..senders)
        .map(|_| {
            let (q, start) = (q.clone(), start.clone());
            std::thread::spawn(move || {
                let _pin = pin_to_cpu(1);
                start.wait();
                for i in 0..per {
                    while !push(&q, i) {
                        std::hint::spin_loop();
                    }
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let mut got = 0;
    while got < per * senders as u64 {
        if pop(&q).is_some() {
            got += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    let elapsed = t0.elapsed();
    threads.into_iter().for_each(|t| t.join().expect("sender"));
    elapsed
}

/// Baseline: the same workload through crossbeam's `ArrayQueue` (capacity 1024).
pub fn array_queue_throughput(senders: usize, messages: u64) -> Duration {
    queue_throughput(
        senders,
        messages,
        crossbeam_queue::ArrayQueue::<u64>::new(1024),
        |q, v| q.push(v).is_ok(),
        |q| q.pop(),
    )
}

/// Baseline: the same workload through a `Mutex<VecDeque>` bounded at 1024.
pub fn mutex_deque_throughput(senders: usize, messages: u64) -> Duration {
    queue_throughput(
        senders,
        messages,
        parking_lot::Mutex::new(VecDeque::<u64>::with_capacity(1024)),
        |q, v| {
            let mut g = q.lock();
            if g.len() >= 1024 {
                return false;
            }
            g.push_back(v);
            true
        },
        |q| q.lock().pop_front(),
    )
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).fold(0, |acc, w| {
        acc ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))
    })
}

/// Streams `pages` 4 KiB pages one way as Tag-On messages: the sender fills a pool buffer
/// (one copy), the receiver reads it in place and releases it. Returns the elapsed time;
/// the receiver checks a checksum so neither side can skip the data.
pub fn tag_on_stream(pages: u64) -> Duration {
    let _pin = pin_to_cpu(0);
    let site = two_queue_site();
    let (a, b) = endpoint_pair(&site);
    let page: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    let expect = checksum(&page);
    let deadline = Instant::now() + DEADLINE;
    let rx = std::thread::spawn(move || {
        let _pin = pin_to_cpu(1);
        for _ in 0..pages {
            let Message::TagOn(m) = spin_recv(&b, deadline) else {
                panic!("not Tag-On")
            };
            assert_eq!(checksum(&m.data), expect);
        }
    });
    let t0 = Instant::now();
    for _ in 0..pages {
        let mut buf = loop {
            match a.alloc() {
                Ok(b) => break b,
                Err(_) => std::hint::spin_loop(),
            }
        };
        buf.fill(&page);
        let mut data = buf.freeze();
        while let Err(e) = a.send_tag_on(VirtualName(0), Handler(1), data) {
            data = e.into_inner();
            std::hint::spin_loop();
        }
    }
    rx.join().expect("receiver");
    t0.elapsed()
}

/// Streams `pages` 4 KiB pages one way as 16 Basic messages of 256 bytes each (copied into
/// the lock-guarded ring and copied out again): the baseline of paper 004 §6.
pub fn basic_stream(pages: u64) -> Duration {
    let _pin = pin_to_cpu(0);
    let site = two_queue_site();
    let (a, b) = endpoint_pair(&site);
    let page: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    let expect = checksum(&page);
    let deadline = Instant::now() + DEADLINE;
    let rx = std::thread::spawn(move || {
        let _pin = pin_to_cpu(1);
        let mut out = vec![0u8; 4096];
        for _ in 0..pages {
            for chunk in out.chunks_mut(crate::BASIC_MAX) {
                let Message::Basic(m) = spin_recv(&b, deadline) else {
                    panic!("not Basic")
                };
                chunk.copy_from_slice(m.data());
            }
            assert_eq!(checksum(&out), expect);
        }
    });
    let t0 = Instant::now();
    for _ in 0..pages {
        for chunk in page.chunks(crate::BASIC_MAX) {
            while let Err(e) = a.send_basic(VirtualName(0), Handler(1), chunk) {
                assert!(
                    matches!(e, crate::BasicSendError::Send(ref s) if s.is_full()),
                    "{e}"
                );
                std::hint::spin_loop();
            }
        }
    }
    rx.join().expect("receiver");
    t0.elapsed()
}

/// Ping-pong between two processes through the shared-memory substrate.
pub mod cross_process {
    use super::*;
    use crate::segment::Segment;
    use std::process::{Child, Command};

    /// Environment variable that tells a re-executed binary to act as the peer.
    pub const PEER_ENV: &str = "MULTIGRAIN_BENCH_PEER";
    const FLAG_ENV: &str = "MULTIGRAIN_BENCH_FLAG";
    const STOP: u64 = u64::MAX - 1;
    const ACK: u64 = u64::MAX;
    const ECHO: Handler = Handler(1);
    const ATOMIC_MODE: Handler = Handler(2);
    const EXIT: Handler = Handler(3);

    fn flag(seg: &Segment) -> &AtomicU64 {
        // SAFETY: the segment is at least 4096 bytes, page aligned and alive as long as the
        // returned borrow; an AtomicU64 has no invalid bit patterns.
        unsafe { &*seg.base().as_ptr().cast::<AtomicU64>() }
    }

    /// If this process was started as a ping-pong peer (by [`PingPong::start`]), serves
    /// until told to exit and returns `true`; otherwise returns `false` at once.
    pub fn run_peer_if_requested() -> bool {
        let Ok(parent_segment) = std::env::var(PEER_ENV) else {
            return false;
        };
        let _pin = pin_to_cpu(1);
        let flag_seg = Segment::open_shared(&std::env::var(FLAG_ENV).expect("flag segment"))
            .expect("map flag segment");
        let site = Site::new(SiteConfig {
            site: SiteId(1),
            shared: true,
            ..SiteConfig::default()
        })
        .expect("peer site");
        site.attach_peer(SiteId(0), &parent_segment)
            .expect("attach parent");
        println!("{}", site.segment_name().expect("shared"));
        let (ep, w) = site.create_endpoint(&[QueueId(0)]).expect("endpoint");
        w.map(
            VirtualName(0),
            Destination {
                site: SiteId(0),
                queue: QueueId(0),
                source: SourceId::default(),
            },
        )
        .expect("map");
        loop {
            let Some(m) = ep.recv_timeout(Duration::from_secs(60)) else {
                return true;
            };
            match m.handler() {
                ECHO => {
                    if let Message::Express(e) = m {
                        spin_send(&ep, Express::new(ECHO, e.payload).expect("payload"));
                    }
                }
                ATOMIC_MODE => {
                    let f = flag(&flag_seg);
                    let deadline = Instant::now() + DEADLINE;
                    loop {
                        let v = f.load(Ordering::Acquire);
                        if v == STOP {
                            f.store(ACK, Ordering::Release);
                            break;
                        }
                        if v % 2 == 1 {
                            f.store(v + 1, Ordering::Release);
                        }
                        if v.is_multiple_of(4096) && Instant::now() > deadline {
                            return true;
                        }
                    }
                }
                _ => return true,
            }
        }
    }

    /// A peer process plus the shared state to ping-pong with it.
    pub struct PingPong {
        site: Site,
        ep: Endpoint,
        flag_seg: Segment,
        child: Child,
    }

    impl PingPong {
        /// Starts the peer with `command` (which must call [`run_peer_if_requested`] first
        /// thing) and connects to it.
        ///
        /// # Errors
        /// If the peer cannot be spawned or does not connect within 30 s.
        pub fn start(mut command: Command) -> Result<PingPong, String> {
            let site = Site::new(SiteConfig {
                site: SiteId(0),
                shared: true,
                ..SiteConfig::default()
            })
            .map_err(|e| e.to_string())?;
            let flag_seg = Segment::create_shared(&crate::segment::unique_name("flag"), 4096)
                .map_err(|e| e.to_string())?;
            command
                .env(PEER_ENV, site.segment_name().expect("shared"))
                .env(FLAG_ENV, flag_seg.name().expect("shared"));
            command.stdout(std::process::Stdio::piped());
            let mut child = command
                .spawn()
                .map_err(|e| format!("spawn benchmark peer: {e}"))?;
            let stdout = child.stdout.take().expect("piped");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                use std::io::BufRead;
                let mut line = String::new();
                let _ = std::io::BufReader::new(stdout).read_line(&mut line);
                let _ = tx.send(line);
            });
            let name = match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if !l.trim().is_empty() => l.trim().to_owned(),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("benchmark peer did not start".into());
                }
            };
            site.attach_peer(SiteId(1), &name)
                .map_err(|e| e.to_string())?;
            site.unlink_segment();
            flag_seg.unlink();
            let (ep, w) = site
                .create_endpoint(&[QueueId(0)])
                .map_err(|e| e.to_string())?;
            w.map(
                VirtualName(0),
                Destination {
                    site: SiteId(1),
                    queue: QueueId(0),
                    source: SourceId::default(),
                },
            )
            .map_err(|e| e.to_string())?;
            Ok(PingPong {
                site,
                ep,
                flag_seg,
                child,
            })
        }

        /// `round_trips` Express round trips with the peer process (after [`WARM_UP`]
        /// untimed ones that wake it).
        pub fn express(&self, round_trips: u64) -> Duration {
            let _pin = pin_to_cpu(0);
            let deadline = Instant::now() + DEADLINE;
            let mut t0 = Instant::now();
            for i in 0..WARM_UP + round_trips {
                if i == WARM_UP {
                    t0 = Instant::now();
                }
                spin_send(
                    &self.ep,
                    Express::new(ECHO, i & crate::word::MAX_PAYLOAD).expect("payload"),
                );
                spin_recv(&self.ep, deadline);
            }
            t0.elapsed()
        }

        /// Baseline: `round_trips` round trips of a bare atomic counter in a shared segment.
        pub fn atomic(&self, round_trips: u64) -> Duration {
            let _pin = pin_to_cpu(0);
            let f = flag(&self.flag_seg);
            f.store(0, Ordering::Release);
            spin_send(&self.ep, Express::new(ATOMIC_MODE, 0).expect("payload"));
            let deadline = Instant::now() + DEADLINE;
            let t0 = Instant::now();
            for i in 0..round_trips {
                f.store(2 * i + 1, Ordering::Release);
                spin_until(deadline, "cross-process atomic echo", || {
                    f.load(Ordering::Acquire) == 2 * i + 2
                });
            }
            let elapsed = t0.elapsed();
            f.store(STOP, Ordering::Release);
            spin_until(deadline, "peer leaving atomic mode", || {
                f.load(Ordering::Acquire) == ACK
            });
            elapsed
        }

        /// The parent's site (statistics).
        pub fn site(&self) -> &Site {
            &self.site
        }
    }

    impl Drop for PingPong {
        fn drop(&mut self) {
            let _ = self
                .ep
                .send_express(VirtualName(0), Express::new(EXIT, 0).expect("payload"));
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Kernels of the inter-cluster path: two sites in this process connected through INI
/// threads over UDP on loopback, beside raw UDP ping-pongs (busy-polled, and with
/// blocking sockets as the weak baseline; see [`network::UdpWait`]).
pub mod network {
    use super::*;
    use crate::net::{IniGroup, NetConfig};
    use multigrain_cluster_config::{IniPolicy, JobConfig};
    use std::net::UdpSocket;

    /// Bytes on the wire of an Express message through an INI (sliding-window overhead +
    /// frame header): the size of the raw-UDP baseline's datagrams.
    pub const EXPRESS_DATAGRAM: usize = crate::window::wire::OVERHEAD + crate::net::frame::HEADER;

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
    fn udp_recv(
        s: &UdpSocket,
        buf: &mut [u8],
        wait: UdpWait,
        deadline: Instant,
        what: &str,
    ) -> usize {
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

    /// A raw-UDP ping-pong of `size`-byte datagrams between two threads on loopback,
    /// pinned to different CPUs, each end waiting as `wait` says; after [`WARM_UP`]
    /// untimed round trips, `round(i, t)` is called after timed round trip `i`, started
    /// at `t`.
    fn udp_pingpong_with(
        round_trips: u64,
        size: usize,
        wait: UdpWait,
        mut round: impl FnMut(u64, Instant),
    ) {
        let _pin = pin_to_cpu(0);
        let (a, b) = udp_pair(wait);
        let deadline = Instant::now() + DEADLINE;
        let echo = std::thread::spawn(move || {
            let _pin = pin_to_cpu(1);
            let mut buf = vec![0u8; 65_536];
            for _ in 0..WARM_UP + round_trips {
                let n = udp_recv(&b, &mut buf, wait, deadline, "UDP echo");
                b.send(&buf[..n]).expect("echo send");
            }
        });
        let msg = vec![7u8; size];
        let mut buf = vec![0u8; 65_536];
        for i in 0..WARM_UP + round_trips {
            let t = Instant::now();
            a.send(&msg).expect("send");
            let n = udp_recv(&a, &mut buf, wait, deadline, "UDP ping");
            assert_eq!(n, size, "echoed datagram of another size");
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
        udp_pingpong_with(round_trips, size, wait, |i, t| {
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
        let mut out = Vec::with_capacity(round_trips);
        udp_pingpong_with(round_trips as u64, size, wait, |_, t| {
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
            let mut job = JobConfig::local(2, 1);
            job.ini.per_cluster = inis;
            job.ini.policy = policy;
            job.ini.mtu = 8972;
            let mut cfg = NetConfig::from_job(&job);
            cfg.spin = spin;
            let sites: Vec<Site> = (0..2)
                .map(|s| {
                    Site::new(SiteConfig {
                        site: SiteId(s),
                        queues: vec![QueueSpec::default(); 2],
                        pool_slots: 4096,
                        ..SiteConfig::default()
                    })
                    .expect("site")
                })
                .collect();
            let groups = crate::net::connect_loopback(&sites, &cfg, inis).expect("start INIs");
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
                    Express::new(Handler(1), i & crate::word::MAX_PAYLOAD).expect("payload"),
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
}

#[cfg(test)]
mod tests {
    use super::pin_to_cpu;
    use nix::sched::sched_getaffinity;
    use nix::unistd::Pid;

    fn cpus_of_this_thread() -> Vec<usize> {
        let set = sched_getaffinity(Pid::from_raw(0)).expect("getaffinity");
        (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect()
    }

    #[test]
    fn a_thread_spawned_by_a_pinned_thread_still_pins_to_another_cpu() {
        let all = cpus_of_this_thread();
        let _pin = pin_to_cpu(0);
        let here = cpus_of_this_thread();
        if all.len() < 2 {
            assert_eq!(here, all, "one CPU: pinning must leave the set alone");
            return;
        }
        assert_eq!(here.len(), 1, "pinned to one CPU");
        let there = std::thread::spawn(|| {
            let inherited = cpus_of_this_thread();
            let _pin = pin_to_cpu(1);
            (inherited, cpus_of_this_thread())
        })
        .join()
        .expect("thread");
        assert_eq!(
            there.0, here,
            "a spawned thread inherits its parent's CPU set"
        );
        assert_eq!(there.1.len(), 1);
        assert_ne!(there.1, here, "the two ends of a ping-pong share a CPU");
    }
}
