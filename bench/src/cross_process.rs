//! Ping-pong between two processes through the shared-memory substrate.

use crate::*;
use multigrain_messaging::segment::Segment;
use std::process::{Child, Command};

/// Environment variable that tells a re-executed binary to act as the peer.
pub const PEER_ENV: &str = "MULTIGRAIN_BENCH_PEER";
const FLAG_ENV: &str = "MULTIGRAIN_BENCH_FLAG";
const STOP: u64 = u64::MAX - 1;
const ACK: u64 = u64::MAX;
const ECHO: Handler = Handler(1);
const ATOMIC_MODE: Handler = Handler(2);
const EXIT: Handler = Handler(3);
/// A sized-message request ([`crate::sizes`]): this word names the operation, kind and
/// size, the next Express word the count.
const SIZES: Handler = Handler(4);

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
            SIZES => {
                let Message::Express(req) = m else {
                    return true;
                };
                let Some(Message::Express(count)) = ep.recv_timeout(DEADLINE) else {
                    return true;
                };
                serve_sized(&ep, req.payload, count.payload);
            }
            _ => return true,
        }
    }
}

/// The peer's side of a sized request: echo `count` round trips, or drain a stream of
/// `count` messages and acknowledge it with the checksum (an Express word).
fn serve_sized(ep: &Endpoint, request: u64, count: u64) {
    use crate::sizes::{Wait, decode_request, echo, recv};
    let (stream, kind, size) = decode_request(request);
    if stream {
        let deadline = Instant::now() + DEADLINE;
        let sum = recv(ep, kind, size * count as usize, Wait::Spin, deadline);
        spin_send(
            ep,
            Express::new(ECHO, sum & multigrain_messaging::word::MAX_PAYLOAD).expect("payload"),
        );
    } else {
        echo(ep, kind, size, count, Wait::Spin);
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
        let flag_seg =
            Segment::create_shared(&multigrain_messaging::segment::unique_name("flag"), 4096)
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
        let ep = peer_endpoint(&site)?;
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
                Express::new(ECHO, i & multigrain_messaging::word::MAX_PAYLOAD).expect("payload"),
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

    /// Tells the peer what comes next: a sized ping-pong or stream of `count`.
    fn request(&self, stream: bool, kind: crate::sizes::Kind, size: usize, count: u64) {
        let word = crate::sizes::encode_request(stream, kind, size);
        spin_send(&self.ep, Express::new(SIZES, word).expect("payload"));
        spin_send(&self.ep, Express::new(ECHO, count).expect("payload"));
    }

    /// A sized ping-pong with the peer process ([`crate::sizes`]): `warm_up + round_trips`
    /// round trips of `size` bytes as `kind`, both ends busy-polling; returns the time of
    /// the last `round_trips`.
    pub fn sized_pingpong(
        &self,
        kind: crate::sizes::Kind,
        size: usize,
        (warm_up, round_trips): (u64, u64),
    ) -> Duration {
        let _pin = pin_to_cpu(0);
        self.request(false, kind, size, warm_up + round_trips);
        crate::sizes::ping(
            &self.ep,
            kind,
            size,
            (warm_up, round_trips),
            crate::sizes::Wait::Spin,
        )
    }

    /// A sized stream into the peer process: `senders` threads of this process (all on
    /// this process's CPU; the calling thread is the first) each send `per_sender`
    /// messages of `size` bytes as `kind` to one queue of the peer, which drains it and
    /// acknowledges with one Express word. Returns the time from the start until the
    /// acknowledgement arrived (one Express one-way latency more than the stream).
    pub fn sized_stream(
        &self,
        kind: crate::sizes::Kind,
        size: usize,
        senders: usize,
        per_sender: u64,
    ) -> Duration {
        use crate::sizes::{pattern, send, sum32};
        let _pin = pin_to_cpu(0);
        let data = pattern(size);
        let total = senders as u64 * per_sender;
        self.request(true, kind, size, total);
        let others: Vec<Endpoint> = (1..senders)
            .map(|_| peer_endpoint(&self.site).expect("endpoint"))
            .collect();
        let deadline = Instant::now() + DEADLINE;
        let start = std::sync::Barrier::new(senders);
        std::thread::scope(|s| {
            for ep in others {
                let (data, start) = (&data, &start);
                s.spawn(move || {
                    let _pin = pin_to_cpu(0);
                    start.wait();
                    for _ in 0..per_sender {
                        send(&ep, kind, data, deadline);
                    }
                });
            }
            start.wait();
            let t0 = Instant::now();
            for _ in 0..per_sender {
                send(&self.ep, kind, &data, deadline);
            }
            let Message::Express(ack) = spin_recv(&self.ep, deadline) else {
                panic!("the peer's acknowledgement is not Express")
            };
            let elapsed = t0.elapsed();
            assert_eq!(
                ack.payload,
                sum32(&data).wrapping_mul(total) & multigrain_messaging::word::MAX_PAYLOAD,
                "stream corrupted"
            );
            elapsed
        })
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

/// An endpoint of `site` on its queue 0 whose name 0 leads to queue 0 of the peer
/// process's site (site 1).
fn peer_endpoint(site: &Site) -> Result<Endpoint, String> {
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
    Ok(ep)
}
