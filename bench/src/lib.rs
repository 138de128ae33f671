//! The benchmark harness of the message layer, outside the library: measurement kernels
//! shared by the criterion benchmarks (`bench/benches/`) and the `multigrain bench
//! messaging|net|dsm` commands, so both measure exactly the same code, each beside its
//! baseline in the same run. In-process kernels here; [`cross_process`] (two processes
//! over a shared segment) and [`network`] (two sites through INIs over UDP loopback);
//! [`sizes`]: every message kind against message size, on all three paths.
//!
//! Each kernel runs a fixed amount of work and returns the elapsed wall time; the caller
//! divides. Ping-pong kernels return the time for `round_trips` round trips (one-way
//! latency = time / round trips / 2). Every wait spins (the latency path), bounded by a
//! generous deadline so that a broken peer fails instead of hanging.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(clippy::disallowed_types)] // baselines use std atomics on purpose

pub mod cross_process;
pub mod loggp;
pub mod network;
pub mod sizes;

use crossbeam_utils::CachePadded;
use multigrain_messaging::{
    Destination, Endpoint, Express, Handler, Message, QueueId, QueueSpec, Site, SiteConfig, SiteId,
    SourceId, VirtualName,
};
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
    let cpus = ALLOWED.get_or_init(|| multigrain_messaging::sched::cpus_in(&before));
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
pub(crate) fn endpoint_pair(site: &Site) -> (Endpoint, Endpoint) {
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

pub(crate) fn two_queue_site() -> Site {
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
            Express::new(Handler(1), i & multigrain_messaging::word::MAX_PAYLOAD).expect("payload"),
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
            for chunk in out.chunks_mut(multigrain_messaging::BASIC_MAX) {
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
        for chunk in page.chunks(multigrain_messaging::BASIC_MAX) {
            while let Err(e) = a.send_basic(VirtualName(0), Handler(1), chunk) {
                assert!(
                    matches!(e, multigrain_messaging::BasicSendError::Send(ref s) if s.is_full()),
                    "{e}"
                );
                std::hint::spin_loop();
            }
        }
    }
    rx.join().expect("receiver");
    t0.elapsed()
}

/// Busy-waits `d` (the computational delay Δ of a LogP signature); returns at once for
/// zero.
pub fn busy_wait(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
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
