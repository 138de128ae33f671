//! LogGP emulation as paper 001 §3.2 defines it, each parameter measured alone: on the
//! network path (two sites in this process, INIs over UDP on 127.0.0.1) and, for the
//! parameters that apply there, on a shared-memory link.
//!
//! * *o_s*: a busy loop of the sending thread per message sent;
//! * *o_r*: a busy loop of the thread that takes a message from its receive queue, per
//!   message from another cluster (not of the INI that delivered it);
//! * *g*: the sending INI injects DATA datagrams at most one per *g* (a stream's last
//!   datagram no sooner than (*n* − 1)·*g* after its first);
//! * *G*: *n*·*G* more after a datagram of *n* bytes, added to *g*;
//! * *L*: each message delivered no sooner than *L* after it was sent, none behind
//!   another.
//!
//! Each test also runs the same traffic without emulation and checks that it is far
//! below what was asked, so the lower bound measures the emulation and not the machine.
//! Lower bounds are tight (a busy loop or a stall never takes less than asked); upper
//! bounds are loose, since the tests run in parallel on small, noisy machines. Every
//! test prints what it measured (`cargo test -- --nocapture`).

use multigrain_cluster_config::{EmulationConfig, IniPolicy, JobConfig};
use multigrain_messaging::net::{self, IniGroup, NetConfig};
use multigrain_messaging::*;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);
/// The overhead the *o* tests ask for.
const O: Duration = Duration::from_micros(200);

struct Cluster {
    _site: Site,
    inis: IniGroup,
}

/// Two sites with one INI each, reached from each other over UDP on loopback under
/// `emulation`, and an endpoint on each (queue 0; name `s` leads to queue 0 of site `s`,
/// and each site's messages carry its own id as source).
fn network_pair(emulation: EmulationConfig) -> (Vec<Cluster>, Endpoint, Endpoint) {
    let mut job = JobConfig::local(2, 1);
    job.ini.policy = IniPolicy::Static;
    job.job.peer_timeout_ms = 20_000;
    // The emulation is set on the INI settings after they are made from the job, as
    // `experiment loggp-calibrate` does: what the INIs do under it (one message per
    // datagram under g and G, whatever `ini.coalesce` says) must not depend on where
    // it was set.
    let mut cfg = NetConfig::from_job(&job);
    cfg.emulation = emulation;
    let sites: Vec<Site> = (0..2)
        .map(|s| {
            Site::new(SiteConfig {
                site: SiteId(s),
                pool_slots: 2048,
                ..SiteConfig::default()
            })
            .unwrap()
        })
        .collect();
    let groups = net::connect_loopback(&sites, &cfg, 1).unwrap();
    let eps: Vec<Endpoint> = sites.iter().map(|s| endpoint(s, 2)).collect();
    let mut eps = eps.into_iter();
    let (a, b) = (eps.next().unwrap(), eps.next().unwrap());
    // Warm up: one message each way, so that no measurement includes a fresh thread's or
    // connection's first steps.
    a.send_express(VirtualName(1), express(0)).unwrap();
    recv(&b);
    b.send_express(VirtualName(0), express(0)).unwrap();
    recv(&a);
    let cs = sites
        .into_iter()
        .zip(groups)
        .map(|(site, inis)| Cluster { _site: site, inis })
        .collect();
    (cs, a, b)
}

/// An endpoint of `site` on queue 0; name `s` leads to queue 0 of site `s`.
fn endpoint(site: &Site, sites: u16) -> Endpoint {
    let (ep, w) = site.create_endpoint(&[QueueId(0)]).unwrap();
    for s in 0..sites {
        w.map(
            VirtualName(s),
            Destination {
                site: SiteId(s),
                queue: QueueId(0),
                source: SourceId::new(site.id().0).unwrap(),
            },
        )
        .unwrap();
    }
    std::mem::forget(w); // the table stays as mapped for the endpoint's life
    ep
}

fn express(payload: u64) -> Express {
    Express::new(Handler(1), payload).unwrap()
}

fn recv(ep: &Endpoint) -> Message {
    ep.recv_timeout(TIMEOUT)
        .expect("timed out waiting for a message")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn min(v: &[Duration]) -> Duration {
    *v.iter().min().unwrap()
}

/// `n` Express messages from `a` to `b`; the duration of each send call.
fn timed_sends(a: &Endpoint, b: &Endpoint, n: u64) -> Vec<Duration> {
    let times = (0..n)
        .map(|i| {
            let t = Instant::now();
            a.send_express(VirtualName(1), express(i)).unwrap();
            t.elapsed()
        })
        .collect();
    for _ in 0..n {
        recv(b);
    }
    times
}

/// `n` Express messages from `a` to `b`, left to arrive for a while; then the duration
/// of each of `b`'s receives.
fn timed_receives(a: &Endpoint, b: &Endpoint, n: u64) -> Vec<Duration> {
    for i in 0..n {
        a.send_express(VirtualName(1), express(i)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    (0..n)
        .map(|_| {
            let t = Instant::now();
            recv(b);
            t.elapsed()
        })
        .collect()
}

/// Sends `n` messages from `a` to `b` with `send`, back to back, while another thread
/// receives them at `b`; the time from the first send to each arrival.
fn arrivals(
    a: &Endpoint,
    b: Endpoint,
    n: usize,
    send: impl Fn(&Endpoint, usize),
) -> (Vec<Duration>, Endpoint) {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<Instant>();
    let rx = std::thread::spawn(move || {
        let t0 = go_rx.recv().unwrap();
        let at: Vec<Duration> = (0..n)
            .map(|_| {
                drop(recv(&b));
                t0.elapsed()
            })
            .collect();
        (at, b)
    });
    let t0 = Instant::now();
    go_tx.send(t0).unwrap();
    for i in 0..n {
        send(a, i);
    }
    rx.join().unwrap()
}

fn send_page(a: &Endpoint, _: usize) {
    let mut buf = a.alloc().unwrap();
    buf.fill(&[0x5a; 4096]);
    a.send_tag_on(VirtualName(1), Handler(2), buf).unwrap();
}

fn send_word(a: &Endpoint, i: usize) {
    a.send_express(VirtualName(1), express(i as u64)).unwrap();
}

#[test]
fn send_overhead_is_a_busy_loop_of_the_sender_per_message() {
    let n = 50;
    let (_cs, a, b) = network_pair(EmulationConfig::default());
    let base = median(timed_sends(&a, &b, n));
    let (_cs, a, b) = network_pair(EmulationConfig {
        send_overhead_us: O.as_secs_f64() * 1e6,
        ..EmulationConfig::default()
    });
    let sends = timed_sends(&a, &b, n);
    let (lo, med) = (min(&sends), median(sends));
    eprintln!("o_s = {O:?}: per send min {lo:?}, median {med:?}; without emulation {base:?}");
    assert!(lo >= O.mul_f64(0.9), "a send took {lo:?}, o_s is {O:?}");
    assert!(base < O / 2, "without emulation a send takes {base:?}");
}

#[test]
fn receive_overhead_is_paid_by_the_receiving_thread_per_message() {
    let n = 50;
    let (_cs, a, b) = network_pair(EmulationConfig::default());
    let base = median(timed_receives(&a, &b, n));
    let (_cs, a, b) = network_pair(EmulationConfig {
        recv_overhead_us: O.as_secs_f64() * 1e6,
        ..EmulationConfig::default()
    });
    // The INIs delivered every message during the pause: what the receives cost now is
    // the receiving thread's own.
    let receives = timed_receives(&a, &b, n);
    let (lo, med) = (min(&receives), median(receives));
    eprintln!("o_r = {O:?}: per receive min {lo:?}, median {med:?}; without emulation {base:?}");
    assert!(lo >= O.mul_f64(0.9), "a receive took {lo:?}, o_r is {O:?}");
    assert!(base < O / 2, "without emulation a receive takes {base:?}");
    // Messages within the receiving site cost nothing extra.
    let local = (0..n)
        .map(|i| {
            b.send_express(VirtualName(1), express(i)).unwrap();
            let t = Instant::now();
            recv(&b);
            t.elapsed()
        })
        .collect();
    let local = median(local);
    eprintln!("o_r = {O:?}: a message within the site, median {local:?}");
    assert!(local < O / 2, "a local message paid o_r ({local:?})");
}

#[test]
fn gap_spaces_the_sending_ini_s_data_injections() {
    let (n, g) = (30, Duration::from_millis(1));
    let (_cs, a, b) = network_pair(EmulationConfig::default());
    let (base, _b) = arrivals(&a, b, n, send_word);
    let base = *base.last().unwrap();
    let (_cs, a, b) = network_pair(EmulationConfig {
        gap_us: g.as_secs_f64() * 1e6,
        ..EmulationConfig::default()
    });
    let (at, _b) = arrivals(&a, b, n, send_word);
    let last = *at.last().unwrap();
    // One DATA datagram per Express message: the last leaves (n − 1)·g after the first.
    let want = g * (n as u32 - 1);
    eprintln!(
        "g = {g:?}: {n} messages, last arrival {last:?} (≥ {want:?} asked); without \
         emulation {base:?}"
    );
    assert!(last >= want.mul_f64(0.9), "last arrival {last:?}");
    assert!(base < want / 2, "without emulation {base:?}");
    assert!(last < want * 20, "far more than asked: {last:?}");
}

#[test]
fn per_byte_gap_grows_with_the_bytes_injected() {
    let (n, per_byte_ns) = (20, 200.0);
    let (_cs, a, b) = network_pair(EmulationConfig::default());
    let (base, _b) = arrivals(&a, b, n, send_page);
    let base = *base.last().unwrap();
    let (_cs, a, b) = network_pair(EmulationConfig {
        per_byte_gap_ns: per_byte_ns,
        ..EmulationConfig::default()
    });
    let (at, _b) = arrivals(&a, b, n, send_page);
    let last = *at.last().unwrap();
    // Each message's datagrams carry its 4096 bytes and more: all but the last
    // message's are spaced by at least 4096·G.
    let want = Duration::from_nanos(((n - 1) as f64 * 4096.0 * per_byte_ns) as u64);
    eprintln!(
        "G = {per_byte_ns} ns/B: {n} pages, last arrival {last:?} (≥ {want:?} asked); \
         without emulation {base:?}"
    );
    assert!(last >= want.mul_f64(0.9), "last arrival {last:?}");
    assert!(base < want / 2, "without emulation {base:?}");
    assert!(last < want * 20, "far more than asked: {last:?}");
}

#[test]
fn gap_and_per_byte_gap_add_up() {
    let (n, g, per_byte_ns) = (20, Duration::from_micros(300), 200.0);
    let (cs, a, b) = network_pair(EmulationConfig {
        gap_us: g.as_secs_f64() * 1e6,
        per_byte_gap_ns: per_byte_ns,
        ..EmulationConfig::default()
    });
    let (at, _b) = arrivals(&a, b, n, send_page);
    let last = *at.last().unwrap();
    let mut cs = cs;
    let _receiver = cs.pop().unwrap();
    let sender = cs.pop().unwrap();
    let report = sender.inis.shutdown(TIMEOUT).unwrap().remove(0);
    let frames = report.window.connections.data_frames_sent;
    let retx = report.window.connections.retransmissions;
    // g after every first transmission of a DATA datagram but the last, and G per byte
    // of every message but the last; max(g, n·G) per datagram would give about half.
    let want = g * ((frames - retx) as u32 - 1)
        + Duration::from_nanos(((n - 1) as f64 * 4096.0 * per_byte_ns) as u64);
    eprintln!(
        "g = {g:?}, G = {per_byte_ns} ns/B: {n} pages in {frames} DATA datagrams ({retx} \
         retransmitted), last arrival {last:?} (≥ {want:?} asked)"
    );
    assert!(frames >= 2 * n as u64, "pages fit one datagram? {frames}");
    assert!(last >= want.mul_f64(0.9), "last arrival {last:?}");
}

#[test]
fn latency_delays_each_message_independently_of_load() {
    let (n, l) = (20, Duration::from_millis(10));
    let (_cs, a, b) = network_pair(EmulationConfig::default());
    let (base, _b) = arrivals(&a, b, n, send_word);
    let base = median(base);
    let (_cs, a, b) = network_pair(EmulationConfig {
        latency_us: l.as_secs_f64() * 1e6,
        ..EmulationConfig::default()
    });
    let (at, _b) = arrivals(&a, b, n, send_word);
    let (first, last) = (at[0], *at.last().unwrap());
    eprintln!(
        "L = {l:?}: first of {n} arrives {first:?} after it was sent, last {last:?}; \
         without emulation a median arrival {base:?}"
    );
    assert!(first >= l.mul_f64(0.9), "first arrival {first:?}");
    assert!(base < l / 2, "without emulation {base:?}");
    // Held side by side, not one behind another (that would be n·L).
    assert!(
        last < l * 5,
        "the last arrived {last:?} after the first send"
    );
}

// ---- shared-memory links: o_s and o_r apply (L: tests/shm_latency.rs) ----------------

fn shm_site(id: u16, cfg: SiteConfig) -> Site {
    Site::new(SiteConfig {
        site: SiteId(id),
        shared: true,
        pool_slots: 64,
        ..cfg
    })
    .unwrap()
}

/// Two sites linked over shared memory, both with `cfg`'s emulation; an endpoint on each
/// (as [`endpoint`]).
fn shm_pair(cfg: SiteConfig) -> (Site, Site, Endpoint, Endpoint) {
    let (s0, s1) = (shm_site(0, cfg.clone()), shm_site(1, cfg));
    s0.attach_peer(SiteId(1), s1.segment_name().unwrap())
        .unwrap();
    s1.attach_peer(SiteId(0), s0.segment_name().unwrap())
        .unwrap();
    let (a, b) = (endpoint(&s0, 2), endpoint(&s1, 2));
    (s0, s1, a, b)
}

#[test]
fn overheads_apply_on_shared_memory_links_too() {
    let n = 50;
    let (_s0, _s1, a, b) = shm_pair(SiteConfig::default());
    let (base_send, base_recv) = (
        median(timed_sends(&a, &b, n)),
        median(timed_receives(&a, &b, n)),
    );
    let (_s0, _s1, a, b) = shm_pair(SiteConfig {
        shm_send_overhead: O,
        ..SiteConfig::default()
    });
    let sends = timed_sends(&a, &b, n);
    let (_s0, _s1, a, b) = shm_pair(SiteConfig {
        shm_recv_overhead: O,
        ..SiteConfig::default()
    });
    let receives = timed_receives(&a, &b, n);
    eprintln!(
        "shm, o = {O:?}: per send min {:?} (without {base_send:?}), per receive min {:?} \
         (without {base_recv:?})",
        min(&sends),
        min(&receives)
    );
    assert!(min(&sends) >= O.mul_f64(0.9), "o_s: {:?}", min(&sends));
    assert!(
        min(&receives) >= O.mul_f64(0.9),
        "o_r: {:?}",
        min(&receives)
    );
    assert!(base_send < O / 2 && base_recv < O / 2);
    // Within a site neither overhead applies.
    let (_s0, _s1, a, _b) = shm_pair(SiteConfig {
        shm_send_overhead: O,
        shm_recv_overhead: O,
        ..SiteConfig::default()
    });
    let local = median(
        (0..n)
            .map(|i| {
                let t = Instant::now();
                a.send_express(VirtualName(0), express(i)).unwrap();
                recv(&a);
                t.elapsed()
            })
            .collect(),
    );
    eprintln!("shm, o = {O:?}: a round within the site, median {local:?}");
    assert!(local < O / 2, "a local message paid an overhead: {local:?}");
}
