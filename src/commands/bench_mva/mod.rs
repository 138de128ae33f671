//! `multigrain bench mva`: paper 002 chapter 6's contention model against the synthetic
//! application ([`crate::synthetic`]) for N = 1 … `--threads-max` compute threads per
//! INI — predicted and measured mean INI queue length and cycle time side by side, as in
//! the thesis's Figure 6-3.
//!
//! **Calibration** (from one N = 1 run, the one with the median cycle time, so that the
//! inputs belong together; nothing is fitted to the N > 1 rows):
//! * `W` = the measured compute time per cycle (`--work-us` when spinning; plus the
//!   timer's slack when sleeping);
//! * `o` = the server's measured time per request (received → reply sent);
//! * `O` = the measured mean time of a message in one INI (one pass; from the INI
//!   traces; a lone client's messages never queue behind each other);
//! * `l` = the one-way latency of an Express message between two threads of one cluster
//!   (a busy-polled ping-pong on one site, 2000 round trips);
//! * `L` = what is left of the lone client's cycle: `(R₁ − W − 4O − 2o − 2l) / 2`
//!   (kernel UDP path, socket wait, receiver wake-ups), at least 0.
//!
//! The model is then the thesis's equations 6.1–6.10 for this client–server pattern
//! ([`multigrain_model::Pattern::ClientServer`]), as printed ([`Arrival::Thesis`]) and
//! with Schweitzer's arrivals, and the exact MVA of the same network
//! ([`multigrain_model::exact`]); with Schweitzer's arrivals and in the exact MVA, N = 1
//! reproduces the calibration run by construction.

pub mod table;

use crate::synthetic::{self, Measurement, Work};
use anyhow::Result;
use multigrain_model::{Arrival, ExactSolution, Inputs, Pattern, equations};
use serde::Serialize;
use std::time::Instant;

/// Rows of a full-size run: N = 1 ..= this (`--threads-max`).
pub const DEFAULT_THREADS_MAX: usize = 8;
/// Timed requests per client per run of a full-size run (`--requests`).
pub const DEFAULT_REQUESTS: u64 = 2000;
/// Runs per N of a full-size run (`bench mva --samples`, `experiment mva --repeat`).
pub const DEFAULT_SAMPLES: usize = 3;

/// The synthetic application's flags that `multigrain bench mva` and `multigrain
/// experiment mva` share (the sizes, whose defaults differ, are each command's own).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct WorkloadArgs {
    /// W: compute time per cycle, µs.
    #[arg(long, default_value_t = 200.0)]
    pub work_us: f64,
    /// How a client spends W: spin (busy-wait) or sleep.
    #[arg(long, value_enum, default_value_t = Work::Spin)]
    pub work: Work,
    /// How long an idle INI thread keeps polling before it sleeps, µs.
    #[arg(long, default_value_t = 50)]
    pub ini_spin_us: u64,
}

/// The command's options.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Options {
    /// Largest N (client threads per INI); rows for 1 ..= this.
    pub threads_max: usize,
    /// `W`: compute time per cycle, µs.
    pub work_us: f64,
    /// How the compute time is spent.
    pub work: Work,
    /// Timed requests per client per run.
    pub requests: u64,
    /// Runs per N (the table shows medians and the min–max of the runs).
    pub samples: usize,
    /// How long an idle INI thread keeps polling before it sleeps, µs.
    pub ini_spin_us: u64,
}

impl Options {
    /// Options for N = 1 ..= `threads_max`, `requests` timed requests per client and
    /// `samples` runs per N, with the workload `w`.
    pub fn new(threads_max: usize, requests: u64, samples: usize, w: &WorkloadArgs) -> Options {
        Options {
            threads_max,
            work_us: w.work_us,
            work: w.work,
            requests,
            samples,
            ini_spin_us: w.ini_spin_us,
        }
    }
}

/// The model's inputs as calibrated from the N = 1 runs, µs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Calibration {
    /// `W`: measured compute time per cycle.
    pub w: f64,
    /// `o`: the server's time per request.
    pub o: f64,
    /// `O`: a message's time in one INI (one pass).
    pub big_o: f64,
    /// `l`: intra-cluster one-way Express latency.
    pub l: f64,
    /// `L`: the rest of the lone cycle, per crossing.
    pub big_l: f64,
    /// The lone client's measured cycle time that `L` closes (the median N = 1 run's).
    pub solo_cycle: f64,
}

impl Calibration {
    /// The model's inputs for `n` threads.
    pub fn inputs(&self, n: usize, arrival: Arrival) -> Inputs {
        Inputs {
            n: u32::try_from(n).unwrap_or(u32::MAX),
            w: self.w,
            o: self.o,
            big_o: self.big_o,
            l: self.l,
            big_l: self.big_l,
            pattern: Pattern::ClientServer,
            arrival,
        }
    }
}

/// Median, minimum and maximum over the runs of one N.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(f64::total_cmp);
        let k = v.len();
        let median = if k % 2 == 1 {
            v[k / 2]
        } else {
            (v[k / 2 - 1] + v[k / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[k - 1],
        }
    }
}

/// One row: N threads, measured beside predicted.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// `N`: client threads per INI.
    pub n: usize,
    /// Threads the run keeps busy: N clients, 1 server, 2 INI threads.
    pub threads: usize,
    /// More threads than the machine's cores.
    pub oversubscribed: bool,
    /// Measured time-average INI queue length (messages in one INI, in service included).
    pub q_measured: Spread,
    /// Measured mean INI queue length seen by arriving messages (itself excluded).
    pub q_seen_measured: f64,
    /// `Q_o` of equations 6.1–6.10 as printed.
    pub q_model: f64,
    /// `Q_o` with Schweitzer's arrivals.
    pub q_model_schweitzer: f64,
    /// INI queue of the exact MVA (time average).
    pub q_exact: f64,
    /// INI queue an arrival finds, exact MVA.
    pub q_seen_exact: f64,
    /// `(q_model − measured) / measured`.
    pub q_error: f64,
    /// Measured mean cycle time, µs.
    pub r_measured: Spread,
    /// `R` of equations 6.1–6.10 as printed, µs.
    pub r_model: f64,
    /// `R` with Schweitzer's arrivals, µs.
    pub r_model_schweitzer: f64,
    /// Cycle time of the exact MVA, µs.
    pub r_exact: f64,
    /// `(r_model − measured) / measured`.
    pub r_error: f64,
    /// Measured message time in one INI, µs (median).
    pub ini_time_measured: f64,
    /// `R_o` of the equations as printed, µs.
    pub ini_time_model: f64,
    /// Measured INI utilization (median).
    pub ini_utilization: f64,
    /// Measured compute time per cycle, µs (median).
    pub compute_measured: f64,
    /// Measured and predicted (all three) queue lengths are at most N (eq. 6.11).
    pub q_within_n: bool,
    /// Every run of this N.
    pub runs: Vec<Measurement>,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The options it ran with.
    pub options: Options,
    /// Logical CPUs of this machine.
    pub cores: usize,
    /// Model inputs from the N = 1 runs.
    pub calibration: Calibration,
    /// One per N.
    pub rows: Vec<Row>,
    /// `Q_o` of equations 6.1–6.10 with the thesis's Figure 6-3 inputs (W = 41789,
    /// o = 742, O = 2336, l = L = 0 cycles, homogeneous pattern), N = 1 ..= threads_max.
    pub figure_6_3_model: Vec<f64>,
    /// Wall time of all runs, s.
    pub wall_s: f64,
}

/// Intra-cluster one-way Express latency, µs (busy-polled ping-pong on one site).
fn intra_cluster_latency_us() -> f64 {
    const ROUND_TRIPS: u64 = 2000;
    multigrain_bench::express_pingpong(ROUND_TRIPS).as_secs_f64() * 1e6 / ROUND_TRIPS as f64 / 2.0
}

/// Runs the synthetic application for N = 1 ..= `threads_max`, `samples` times each (the
/// samples of different N interleaved round by round, so that a change of the machine's
/// speed hits every N alike), calibrates the model from N = 1 and returns the rows.
/// `tick` is called after each run.
///
/// # Errors
/// Bad options, or a run that fails ([`synthetic::run`]).
pub fn run(opts: &Options, mut tick: impl FnMut()) -> Result<Report> {
    anyhow::ensure!(
        (1..=256).contains(&opts.threads_max),
        "--threads-max must be 1..=256, got {}",
        opts.threads_max
    );
    anyhow::ensure!(opts.samples >= 1, "--samples must be at least 1");
    anyhow::ensure!(opts.requests >= 1, "--requests must be at least 1");
    anyhow::ensure!(
        opts.work_us.is_finite() && opts.work_us >= 0.0,
        "--work-us must be a non-negative number"
    );
    let started = Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut runs: Vec<Vec<Measurement>> = vec![Vec::new(); opts.threads_max];
    for _ in 0..opts.samples {
        for (i, slot) in runs.iter_mut().enumerate() {
            slot.push(synthetic::run(synthetic::Config {
                threads: i + 1,
                work_us: opts.work_us,
                work: opts.work,
                requests: opts.requests,
                ini_spin_us: opts.ini_spin_us,
            })?);
            tick();
        }
    }
    let med = |ms: &[Measurement], f: fn(&Measurement) -> f64| {
        Spread::of(ms.iter().map(f).collect()).median
    };
    // One coherent run: the N = 1 run whose cycle time is the median (the lower middle
    // for an even number), all its quantities together.
    let mut solo: Vec<&Measurement> = runs[0].iter().collect();
    solo.sort_by(|a, b| a.cycle_us.total_cmp(&b.cycle_us));
    let solo = solo[(solo.len() - 1) / 2];
    let (w, o, big_o, solo_cycle) = (
        solo.compute_us,
        solo.server_us,
        solo.ini_time_us,
        solo.cycle_us,
    );
    let l = intra_cluster_latency_us();
    let big_l = ((solo_cycle - w - 4.0 * big_o - 2.0 * o - 2.0 * l) / 2.0).max(0.0);
    let calibration = Calibration {
        w,
        o,
        big_o,
        l,
        big_l,
        solo_cycle,
    };
    let mut rows = Vec::with_capacity(opts.threads_max);
    for (i, ms) in runs.into_iter().enumerate() {
        let n = i + 1;
        let th = equations::solve(&calibration.inputs(n, Arrival::Thesis))?;
        let sw = equations::solve(&calibration.inputs(n, Arrival::Schweitzer))?;
        let ex = ExactSolution::for_inputs(&calibration.inputs(n, Arrival::Schweitzer))
            .ok_or_else(|| anyhow::anyhow!("client-server has an exact MVA"))?;
        let q = Spread::of(ms.iter().map(|m| m.ini_queue).collect());
        let r = Spread::of(ms.iter().map(|m| m.cycle_us).collect());
        let nf = n as f64;
        let within = |x: f64| x <= nf + 1e-9;
        rows.push(Row {
            n,
            threads: n + 3,
            oversubscribed: n + 3 > cores,
            q_seen_measured: med(&ms, |m| m.ini_queue_seen),
            q_model: th.q_o,
            q_model_schweitzer: sw.q_o,
            q_exact: ex.ini_queue(),
            q_seen_exact: ex.ini_seen_on_arrival(),
            q_error: (th.q_o - q.median) / q.median,
            r_model: th.r,
            r_model_schweitzer: sw.r,
            r_exact: ex.cycle,
            r_error: (th.r - r.median) / r.median,
            ini_time_measured: med(&ms, |m| m.ini_time_us),
            ini_time_model: th.r_o,
            ini_utilization: med(&ms, |m| m.ini_utilization),
            compute_measured: med(&ms, |m| m.compute_us),
            q_within_n: [q.max, th.q_o, sw.q_o, ex.ini_queue()]
                .into_iter()
                .all(within),
            q_measured: q,
            r_measured: r,
            runs: ms,
        });
    }
    let figure_6_3_model = (1..=opts.threads_max)
        .map(|n| {
            equations::solve(&Inputs::figure_6_3(u32::try_from(n).unwrap_or(u32::MAX)))
                .map(|s| s.q_o)
        })
        .collect::<Result<_, _>>()?;
    Ok(Report {
        options: *opts,
        cores,
        calibration,
        rows,
        figure_6_3_model,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Runs the benchmark with a progress bar, prints the table (to stderr when the JSON goes
/// to stdout) and writes the JSON if asked.
///
/// # Errors
/// As [`run`], or the JSON cannot be written.
pub fn main(opts: &Options, json: Option<&std::path::Path>) -> Result<()> {
    let progress =
        crate::progress::bar((opts.samples * opts.threads_max) as u64, "bench mva (runs)");
    let report = run(opts, || progress.inc(1))?;
    progress.finish_and_clear();
    let text = table::render(&report);
    let to_stdout = json.is_some_and(|p| p.as_os_str() == "-");
    if to_stdout {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    if let Some(path) = json {
        crate::measure::write_json(path, &report)?;
        if !to_stdout {
            println!("\nwrote {}", path.display());
        }
    }
    Ok(())
}
