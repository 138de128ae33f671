//! LogP parameters of one message path, measured with the microbenchmarks of Culler,
//! Liu, Martin and Yoshikawa ("Assessing Fast Network Interfaces", IEEE Micro 1996) as
//! paper 000 §4.1 (Table 2) and paper 001 §3.3 use them: Express messages (one word)
//! between two endpoints whose name 0 leads to each other, the two threads pinned to
//! different CPUs.
//!
//! * **RTT**: a ping-pong, time per round trip.
//! * **o_s** (send overhead): the sender's time per send in a short burst
//!   ([`BURST`] messages, well below any queue's capacity, so no send waits for the
//!   gap), the receiver having drained the previous burst. The sends are
//!   [`SEND_SPACING`] apart and only the sends are timed — Culler et al. read o_s off
//!   the burst signature at a large computational delay Δ — so that each send finds
//!   the path idle, as a sender slowed by an emulated o does: sent back to back, a
//!   send through an INI leaves the framing and the `sendto` to the INI thread, which
//!   is still busy with the previous message, while an isolated send does them itself
//!   (the inline pass), and a back-to-back baseline would understate that.
//! * **o_r** (receive overhead): the receiver's time per receive of a burst that is
//!   already there: the sender sends [`BURST`] messages and says so; the receiver waits
//!   [`Options::settle`] (the messages reach its queues or socket) and then times receiving them.
//!   Over INIs that time includes pulling datagrams off the socket when the receiving
//!   thread's own poll does it, but not when an INI thread already has.
//! * **g** (gap): a long stream ([`Options::stream`] messages sent back to back; a full
//!   queue makes the sender retry): the receiver's time between the first and the last
//!   arrival, per message — the steady-state rate of the slowest stage.
//! * **L** (latency) = RTT / 2 − o_s − o_r (negative when send and receive overheads
//!   overlap, as paper 000 Table 2 reports for its shared-memory protocol).
//!
//! Every wait spins (bounded by a generous deadline, so a broken peer fails instead of
//! hanging). Each function runs one sample and returns it; callers repeat and alternate.

use crate::{DEADLINE, WARM_UP, pin_to_cpu, spin_send, spin_until};
use multigrain_messaging::{Endpoint, Express, Handler, Message};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Messages per burst of the o_s and o_r measurements.
pub const BURST: u64 = 16;

/// Time between the sends of an o_s burst (busy, not timed): longer than an INI's work
/// on one message, so that every send finds it done.
pub const SEND_SPACING: Duration = Duration::from_micros(20);

/// How long the o_r receiver waits after the sender's burst before it starts timing: long
/// enough for an Express message to cross loopback UDP and an INI (tens of µs).
pub const SETTLE: Duration = Duration::from_micros(300);

/// How much work one sample does.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Round trips of the RTT ping-pong.
    pub round_trips: u64,
    /// Bursts of [`BURST`] messages for o_s and for o_r (each).
    pub bursts: u64,
    /// Messages of the g stream.
    pub stream: u64,
    /// How long the o_r receiver waits after a burst before timing it ([`SETTLE`];
    /// longer when an emulated g or L delays the burst's arrival).
    pub settle: Duration,
}

impl Options {
    /// A full sample: 2,000 round trips, 100 bursts, a 20,000-message stream.
    pub const FULL: Options = Options {
        round_trips: 2_000,
        bursts: 100,
        stream: 20_000,
        settle: SETTLE,
    };
    /// A quick sample (shape only): 100 round trips, 8 bursts, 500 messages.
    pub const QUICK: Options = Options {
        round_trips: 100,
        bursts: 8,
        stream: 500,
        settle: SETTLE,
    };
}

/// One sample of a path's LogP parameters, µs (serialized with these field names).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct LogP {
    /// Round-trip time, µs.
    pub rtt_us: f64,
    /// Send overhead o_s, µs per message.
    pub o_s_us: f64,
    /// Receive overhead o_r, µs per message.
    pub o_r_us: f64,
    /// Gap g, µs per message in a long stream.
    pub g_us: f64,
    /// Latency L = RTT / 2 − o_s − o_r, µs.
    pub l_us: f64,
}

/// Measures every parameter of the path `a` ⇄ `b` once (RTT, o_s, o_r, g, then L).
///
/// # Panics
/// If the path loses a message or a peer stays silent past the harness deadline.
/// `b` works on the second thread; both endpoints come back.
pub fn measure(a: Endpoint, b: Endpoint, opts: Options) -> (LogP, Endpoint, Endpoint) {
    let (rtt, b) = round_trips(&a, b, opts.round_trips);
    let rtt_us = per_us(rtt, opts.round_trips);
    let (o_s_us, b) = send_overhead(&a, b, opts.bursts);
    let (o_r_us, b) = receive_overhead(&a, b, opts.bursts, opts.settle);
    let (g_us, b) = gap(&a, b, opts.stream);
    let logp = LogP {
        rtt_us,
        o_s_us,
        o_r_us,
        g_us,
        l_us: rtt_us / 2.0 - o_s_us - o_r_us,
    };
    (logp, a, b)
}

fn per_us(d: Duration, n: u64) -> f64 {
    d.as_secs_f64() * 1e6 / n.max(1) as f64
}

fn express(v: u64) -> Express {
    Express::new(Handler(1), v & multigrain_messaging::word::MAX_PAYLOAD).expect("payload")
}

/// Spins until `ep` receives a message; its payload (0 for other kinds).
fn recv(ep: &Endpoint, deadline: Instant, what: &str) -> u64 {
    let mut got = None;
    spin_until(deadline, what, || {
        got = ep.try_recv();
        got.is_some()
    });
    match got {
        Some(Message::Express(e)) => e.payload,
        _ => 0,
    }
}

/// Runs `peer` on a second thread pinned to the second CPU while the caller, pinned to
/// the first, runs `me`; returns what each returns.
fn two_threads<R, P: Send>(me: impl FnOnce() -> R, peer: impl FnOnce() -> P + Send) -> (R, P) {
    let _pin = pin_to_cpu(0);
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let _pin = pin_to_cpu(1);
            peer()
        });
        let r = me();
        (r, h.join().expect("LogP peer thread"))
    })
}

/// `n` timed round trips (after [`WARM_UP`] untimed ones), `b` echoing.
fn round_trips(a: &Endpoint, b: Endpoint, n: u64) -> (Duration, Endpoint) {
    let deadline = Instant::now() + DEADLINE;
    two_threads(
        || {
            let mut t0 = Instant::now();
            for i in 0..WARM_UP + n {
                if i == WARM_UP {
                    t0 = Instant::now();
                }
                spin_send(a, express(i));
                recv(a, deadline, "LogP round trip: pong");
            }
            t0.elapsed()
        },
        move || {
            for _ in 0..WARM_UP + n {
                let v = recv(&b, deadline, "LogP round trip: ping");
                spin_send(&b, express(v));
            }
            b
        },
    )
}

/// o_s: median over `bursts` of the sender's time per send in a burst of [`BURST`]
/// sends [`SEND_SPACING`] apart (only the sends timed).
fn send_overhead(a: &Endpoint, b: Endpoint, bursts: u64) -> (f64, Endpoint) {
    let deadline = Instant::now() + DEADLINE;
    two_threads(
        || {
            let mut per = Vec::with_capacity(bursts as usize);
            for i in 0..WARM_UP + bursts {
                let mut t = Duration::ZERO;
                for k in 0..BURST {
                    let t0 = Instant::now();
                    spin_send(a, express(k));
                    let sent = Instant::now();
                    t += sent - t0;
                    while sent.elapsed() < SEND_SPACING {
                        std::hint::spin_loop();
                    }
                }
                if i >= WARM_UP {
                    per.push(per_us(t, BURST));
                }
                // The receiver says it drained the burst: the next one finds empty queues.
                recv(a, deadline, "LogP o_s: drained");
            }
            median(&mut per)
        },
        move || {
            for _ in 0..WARM_UP + bursts {
                for _ in 0..BURST {
                    recv(&b, deadline, "LogP o_s: burst");
                }
                spin_send(&b, express(0));
            }
            b
        },
    )
}

/// o_r: median over `bursts` of the receiver's time per receive of a burst of [`BURST`]
/// that is already there.
fn receive_overhead(a: &Endpoint, b: Endpoint, bursts: u64, settle: Duration) -> (f64, Endpoint) {
    let deadline = Instant::now() + DEADLINE;
    let (sent, done) = (&AtomicU64::new(0), &AtomicU64::new(0));
    two_threads(
        || {
            let mut per = Vec::with_capacity(bursts as usize);
            for i in 1..=WARM_UP + bursts {
                spin_until(deadline, "LogP o_r: burst sent", || {
                    sent.load(Ordering::Acquire) == i
                });
                std::thread::sleep(settle);
                let t0 = Instant::now();
                for _ in 0..BURST {
                    recv(a, deadline, "LogP o_r: burst");
                }
                let t = t0.elapsed();
                if i > WARM_UP {
                    per.push(per_us(t, BURST));
                }
                done.store(i, Ordering::Release);
            }
            median(&mut per)
        },
        move || {
            for i in 1..=WARM_UP + bursts {
                for k in 0..BURST {
                    spin_send(&b, express(k));
                }
                sent.store(i, Ordering::Release);
                spin_until(deadline, "LogP o_r: burst received", || {
                    done.load(Ordering::Acquire) == i
                });
            }
            b
        },
    )
}

/// g: the receiver's time per message between the first and the last arrival of a
/// stream of `n` messages sent back to back.
fn gap(a: &Endpoint, b: Endpoint, n: u64) -> (f64, Endpoint) {
    let deadline = Instant::now() + DEADLINE;
    let n = n.max(2);
    two_threads(
        || {
            recv(a, deadline, "LogP g: first of the stream");
            let t0 = Instant::now();
            for _ in 1..n {
                recv(a, deadline, "LogP g: stream");
            }
            per_us(t0.elapsed(), n - 1)
        },
        move || {
            for k in 0..n {
                spin_send(&b, express(k));
            }
            b
        },
    )
}

/// Median of `v` (0 when empty); sorts it.
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// How far apart the background stream of [`shm_beside_network`] sends its messages
/// (about 10,000 messages a second once the sleep's slack is added).
pub const BACKGROUND_PERIOD: Duration = Duration::from_micros(50);

/// The shared-memory path alone: two endpoints of one site with no network at all
/// (paper 000 Table 2's single-protocol column).
pub fn shm_alone(opts: Options) -> LogP {
    let site = crate::two_queue_site();
    let (a, b) = crate::endpoint_pair(&site);
    measure(a, b, opts).0
}

/// The shared-memory path of site 0 of a [`crate::network::Pair`] built from `cfg`: two
/// of its endpoints, whose receive loops also poll the network as `cfg.poll` says (the
/// multi-protocol column). With `busy`, site 1 streams Express messages to a third queue
/// of site 0 meanwhile, one per [`BACKGROUND_PERIOD`] (a sleeping sender), drained by a
/// third thread that polls every 200 µs: the network polls of the measured threads find
/// those datagrams and deliver them.
pub fn shm_beside_network(
    cfg: &multigrain_messaging::net::NetConfig,
    busy: bool,
    opts: Options,
) -> LogP {
    let pair = crate::network::Pair::with_config(cfg, 3);
    let (a, b) = crate::endpoint_pair(&pair.a.0);
    if !busy {
        return measure(a, b, opts).0;
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let tx = pair.endpoint(1, 1, 2);
    let rx = pair.endpoint(0, 2, 1);
    std::thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                spin_send(&tx, express(k));
                k += 1;
                std::thread::sleep(BACKGROUND_PERIOD);
            }
        });
        s.spawn(move || {
            // Polls now and then instead of blocking: a blocked receiver would wait on
            // the network itself and take the datagrams the measured threads should see.
            while !stop.load(Ordering::Relaxed) {
                while rx.try_recv().is_some() {}
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let logp = measure(a, b, opts).0;
        stop.store(true, Ordering::Relaxed);
        logp
    })
}

/// The network path: an endpoint of each site of a [`crate::network::Pair`] built from
/// `cfg` (INIs over UDP on loopback), polling the network as `cfg.poll` says.
pub fn network(cfg: &multigrain_messaging::net::NetConfig, opts: Options) -> LogP {
    let pair = crate::network::Pair::with_config(cfg, 2);
    let a = pair.endpoint(0, 0, 0);
    let b = pair.endpoint(1, 0, 0);
    measure(a, b, opts).0
}

/// One point of a LogP signature (paper 001 §3.3, Figure 3; Culler et al.): the
/// sender's average initiation interval, µs per message, for bursts of `m` Express
/// messages with `delta` of busy computation after each send; the clock stops when the
/// last message of a burst is issued. The receiver drains each burst and answers once,
/// so every burst starts with empty queues; the median of `reps` bursts. For short
/// bursts the interval is o_s + Δ; in paper 001's layer, whose senders may have only so
/// many messages outstanding, long ones approach the steady-state interval, the larger
/// of g and o_s + o_r + Δ. (Through INIs a sender waits for g only once thousands of
/// messages are buffered — the INI's hand-off queue and its window's send queue — so
/// in bursts of up to a few thousand its interval stays o_s + Δ and g shows in the
/// receiver's inter-arrival times.)
///
/// `b` works on the second thread and comes back.
pub fn signature_point(
    a: &Endpoint,
    b: Endpoint,
    m: u64,
    delta: Duration,
    reps: u64,
) -> (f64, Endpoint) {
    let deadline = Instant::now() + DEADLINE;
    let m = m.max(1);
    two_threads(
        || {
            let mut per = Vec::with_capacity(reps as usize);
            for r in 0..1 + reps {
                let t0 = Instant::now();
                for k in 0..m {
                    spin_send(a, express(k));
                    crate::busy_wait(delta);
                }
                let t = t0.elapsed();
                if r > 0 {
                    per.push(per_us(t, m));
                }
                recv(a, deadline, "LogP signature: drained");
            }
            median(&mut per)
        },
        move || {
            for _ in 0..1 + reps {
                for _ in 0..m {
                    recv(&b, deadline, "LogP signature: burst");
                }
                spin_send(&b, express(0));
            }
            b
        },
    )
}
