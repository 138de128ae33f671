//! The synthetic application of paper 002 §6.3 and Figure 6-3, on the real message layer:
//! `N` compute threads in cluster 0 each loop *compute `W` µs, then make a blocking
//! inter-cluster request*; one server thread in cluster 1 answers every request at once.
//! Requests and replies are one-word Express messages through one dedicated INI thread
//! per cluster (K = 1, `ini.inline = false`: the thesis's INIs are protocol processors
//! of their own) over UDP on loopback — the two-cluster harness of `multigrain bench net`
//! ([`multigrain_bench::network::Pair`]), both clusters in this process.
//!
//! Each client times its own cycles (compute start → reply received). The INIs record a
//! per-message trace ([`multigrain_messaging::net::trace`]), from which come the message
//! time in the INI per pass (enqueued → on the wire at the sender, last datagram read →
//! delivered at the receiver), the mean INI queue length seen by arriving messages (the
//! thesis's §4.4.2 measure) and the time-average number of messages in the INI
//! (Little's result: messages × time in the INI ÷ time, over the central 90 % of the
//! run), which is what the model's `Q_o` (equation 6.5) is.
//!
//! This lives in the binary crate beside `multigrain bench mva` rather than in
//! `multigrain-model`: the model crate stays pure arithmetic with no dependency on the
//! message layer, and the binary already links the benchmark harness this reuses.

use anyhow::{Context as _, Result, anyhow};
use multigrain_bench::network::Pair;
use multigrain_cluster_config::IniPolicy;
use multigrain_messaging::net::TraceConfig;
use multigrain_messaging::net::trace::{self, IniTrace};
use multigrain_messaging::{
    Destination, Endpoint, Express, Handler, Message, QueueId, SiteId, SourceId, VirtualName,
};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Requests each client makes before it starts timing (they wake the INIs and the server).
pub const WARM_UP: u64 = 16;

/// Longest wait for one reply before the run is declared stuck.
const STUCK: Duration = Duration::from_secs(60);

/// The request handler (server side) and reply handler (client side).
const REQUEST: Handler = Handler(1);
const REPLY: Handler = Handler(2);

/// How a client spends its compute time `W`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Work {
    /// Busy-wait on the clock: the thread holds its CPU for `W` µs (the thesis's PEs).
    Spin,
    /// `thread::sleep` for `W` µs: the CPU is free for the INIs and the server, at the
    /// price of the kernel's timer slack (the measured compute time is longer than `W`).
    Sleep,
}

/// One run of the synthetic application.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Config {
    /// `N`: client threads in cluster 0 (all through its one INI).
    pub threads: usize,
    /// `W`: compute time per cycle, µs.
    pub work_us: f64,
    /// How the compute time is spent.
    pub work: Work,
    /// Timed requests per client (after [`WARM_UP`] untimed ones).
    pub requests: u64,
    /// How long an idle INI thread keeps polling before it sleeps, µs.
    pub ini_spin_us: u64,
}

/// What one run measured. Times in µs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Measurement {
    /// `N`: client threads.
    pub threads: usize,
    /// Timed cycles, all clients.
    pub cycles: u64,
    /// Mean cycle time (compute start → reply received), µs: the model's `R`.
    pub cycle_us: f64,
    /// Mean compute time actually spent per cycle, µs (≥ `W`; `W` plus timer slack when
    /// sleeping).
    pub compute_us: f64,
    /// Mean response time (request sent → reply received), µs.
    pub response_us: f64,
    /// Mean time the server spent on one request (received → reply sent), µs: `o`.
    pub server_us: f64,
    /// Mean time of a message in one INI (one pass), µs, both INIs: the model's `R_o`.
    pub ini_time_us: f64,
    /// Time-average messages in an INI (queued or in processing), mean of the two INIs,
    /// over the central 90 % of the run: the model's `Q_o`.
    pub ini_queue: f64,
    /// Mean messages in the INI an arriving message finds there (itself excluded; the
    /// trace summary's queue length), mean over both INIs' arrivals.
    pub ini_queue_seen: f64,
    /// Mean INI utilization (fraction of time processing at least one message).
    pub ini_utilization: f64,
    /// Trace records lost to full buffers (0 expected).
    pub dropped: u64,
    /// Wall time of the run, s (set-up and warm-up included).
    pub wall_s: f64,
}

/// Spends `us` µs as `work` says; returns the time actually spent.
fn compute(work: Work, us: f64) -> Duration {
    let t0 = Instant::now();
    let d = Duration::from_secs_f64(us * 1e-6);
    match work {
        Work::Spin => {
            while t0.elapsed() < d {
                std::hint::spin_loop();
            }
        }
        Work::Sleep => std::thread::sleep(d),
    }
    t0.elapsed()
}

/// Sends `msg` to `name`, retrying while the destination queue is full.
fn send(ep: &Endpoint, name: VirtualName, msg: Express) -> Result<()> {
    let deadline = Instant::now() + STUCK;
    let mut m = msg;
    loop {
        match ep.send_express(name, m) {
            Ok(()) => return Ok(()),
            Err(e) if e.is_full() && Instant::now() < deadline => {
                m = e.into_inner();
                std::thread::yield_now();
            }
            Err(e) => return Err(anyhow!("synthetic application: send failed: {e}")),
        }
    }
}

/// Per-client sums, µs.
#[derive(Default)]
struct ClientSums {
    cycles: u64,
    cycle: f64,
    compute: f64,
    response: f64,
}

fn client(ep: Endpoint, index: usize, cfg: Config) -> Result<ClientSums> {
    ep.set_thread_index(index);
    let mut sums = ClientSums::default();
    for i in 0..WARM_UP + cfg.requests {
        let t0 = Instant::now();
        let spent = compute(cfg.work, cfg.work_us);
        let t1 = Instant::now();
        send(&ep, VirtualName(0), Express::new(REQUEST, index as u64)?)?;
        let m = ep
            .recv_timeout(STUCK)
            .ok_or_else(|| anyhow!("client {index}: no reply for {STUCK:?}"))?;
        let t2 = Instant::now();
        anyhow::ensure!(
            m.handler() == REPLY,
            "client {index}: unexpected message {m:?}"
        );
        if i >= WARM_UP {
            sums.cycles += 1;
            sums.cycle += (t2 - t0).as_secs_f64() * 1e6;
            sums.compute += spent.as_secs_f64() * 1e6;
            sums.response += (t2 - t1).as_secs_f64() * 1e6;
        }
    }
    Ok(sums)
}

/// Serves `total` requests; returns the mean handling time, µs.
fn server(ep: Endpoint, total: u64) -> Result<f64> {
    let mut busy = 0.0;
    for _ in 0..total {
        let m = ep
            .recv_timeout(STUCK)
            .ok_or_else(|| anyhow!("server: no request for {STUCK:?}"))?;
        let t0 = Instant::now();
        let Message::Express(e) = m else {
            anyhow::bail!("server: unexpected message {m:?}");
        };
        let client = u16::try_from(e.payload).context("server: client index")?;
        send(&ep, VirtualName(client), Express::new(REPLY, 0)?)?;
        busy += t0.elapsed().as_secs_f64() * 1e6;
    }
    Ok(busy / total.max(1) as f64)
}

/// Time-average messages in one INI over the central 90 % of its records' span, ns·ns⁻¹.
fn time_average_queue(ini: &IniTrace) -> f64 {
    let (Some(first), Some(last)) = (
        ini.records.iter().map(|r| r.start_ns()).min(),
        ini.records.iter().map(|r| r.end_ns()).max(),
    ) else {
        return 0.0;
    };
    let cut = (last - first) / 20;
    let (a, b) = (first + cut, last - cut);
    if b <= a {
        return 0.0;
    }
    let inside: u64 = ini
        .records
        .iter()
        .map(|r| r.end_ns().min(b).saturating_sub(r.start_ns().max(a)))
        .sum();
    inside as f64 / (b - a) as f64
}

/// Runs the synthetic application once with `cfg`.
///
/// # Errors
/// If the INIs cannot start, a message cannot be sent, or a reply does not come within
/// a minute.
pub fn run(cfg: Config) -> Result<Measurement> {
    anyhow::ensure!(
        (1..=u16::MAX as usize).contains(&cfg.threads),
        "threads must be 1..=65535"
    );
    anyhow::ensure!(cfg.requests >= 1, "requests must be at least 1");
    anyhow::ensure!(
        cfg.work_us.is_finite() && cfg.work_us >= 0.0,
        "work must be a non-negative number of µs"
    );
    let started = Instant::now();
    let n = cfg.threads;
    let total = n as u64 * (WARM_UP + cfg.requests);
    let mut net = Pair::net_config(1, IniPolicy::Static);
    net.inline = false;
    // The thesis's INIs send one message per datagram: its model's service time is per
    // message, so queued requests must not share datagrams here.
    net.window.coalesce = false;
    net.offload = false;
    net.spin = Duration::from_micros(cfg.ini_spin_us);
    net.trace = Some(TraceConfig {
        // Never written: the traces are read from memory and the INIs are dropped, not
        // shut down.
        dir: std::env::temp_dir(),
        records: usize::try_from(2 * total + 1024)?,
    });
    let pair = Pair::with_config(&net, n);
    let clients: Vec<Endpoint> = (0..n).map(|i| pair.endpoint(0, i as u16, 0)).collect();
    let (srv, names) = pair
        .b
        .0
        .create_endpoint(&[QueueId(0)])
        .map_err(|e| anyhow!("server endpoint: {e}"))?;
    for i in 0..n {
        names
            .map(
                VirtualName(i as u16),
                Destination {
                    site: SiteId(0),
                    queue: QueueId(i as u16),
                    source: SourceId::default(),
                },
            )
            .map_err(|e| anyhow!("server name {i}: {e}"))?;
    }
    let (sums, server_us) = std::thread::scope(|s| -> Result<_> {
        let srv = s.spawn(move || server(srv, total));
        let cl: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, ep)| s.spawn(move || client(ep, i, cfg)))
            .collect();
        let mut sums = Vec::with_capacity(n);
        for c in cl {
            sums.push(c.join().map_err(|_| anyhow!("client thread panicked"))??);
        }
        let server_us = srv
            .join()
            .map_err(|_| anyhow!("server thread panicked"))??;
        Ok((sums, server_us))
    })?;
    let traces: Vec<_> = [&pair.a.1, &pair.b.1]
        .iter()
        .map(|g| g.trace().ok_or_else(|| anyhow!("INI traces missing")))
        .collect::<Result<_>>()?;
    let summary = trace::summarize(&traces);
    let inis: Vec<&IniTrace> = traces.iter().flat_map(|t| &t.inis).collect();
    let records: u64 = inis.iter().map(|i| i.records.len() as u64).sum();
    let in_ini_ns: u64 = inis
        .iter()
        .flat_map(|i| &i.records)
        .map(|r| r.end_ns().saturating_sub(r.start_ns()))
        .sum();
    drop(pair);
    let cycles: u64 = sums.iter().map(|c| c.cycles).sum();
    let mean = |f: fn(&ClientSums) -> f64| sums.iter().map(f).sum::<f64>() / cycles as f64;
    Ok(Measurement {
        threads: n,
        cycles,
        cycle_us: mean(|c| c.cycle),
        compute_us: mean(|c| c.compute),
        response_us: mean(|c| c.response),
        server_us,
        ini_time_us: in_ini_ns as f64 / records.max(1) as f64 / 1e3,
        ini_queue: inis.iter().map(|i| time_average_queue(i)).sum::<f64>() / inis.len() as f64,
        ini_queue_seen: summary.mean_queue_len,
        ini_utilization: summary.mean_utilization,
        dropped: summary.dropped,
        wall_s: started.elapsed().as_secs_f64(),
    })
}
