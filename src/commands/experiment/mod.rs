//! `multigrain experiment NAME`: the experiments of paper 002 (Jiang's INI thesis),
//! chapters 5 and 6, as sweeps of real runs, and the message layer's cost against message
//! size (paper 004 §6, paper 003 §4) as in-process microbenchmarks.
//!
//! The framework: an experiment lays out its points (one `multigrain run` command line
//! each, [`sweep::Point`]), runs them `--repeat` times interleaved round by round
//! ([`sweep::Sweep`]), and turns the reports into tables shaped like the paper's
//! ([`table::Table`]: median (min–max) of the rounds) and a figure ([`plot::Figure`]).
//! This module writes them into `--out DIR`: a CSV per table, one JSON with every
//! table and every run, the printed text, and the figure as PNG and SVG.

pub mod cluster_size;
pub mod ini_scheduling;
pub mod loggp_calibrate;
pub mod loggp_param;
pub mod loggp_sensitivity;
pub mod message_size;
pub mod mis_scheduling;
pub mod mva;
pub mod plot;
pub mod polling;
pub mod sweep;
pub mod table;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};
use multigrain_cluster_config::{EMBEDDED_DEFAULT_TOML, JobConfig, Override};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use sweep::{Point, Runs};
use table::{Cell, Table};

/// Run one of the INI thesis's experiments (paper 002, chapters 5 and 6) as a sweep of
/// real runs, and write its tables (CSV, JSON, text) and figure (PNG, SVG).
///
/// Every point of a sweep is this executable's own `multigrain run … --json`, started
/// as a user would start it. `--repeat N` rounds each run every point once
/// (interleaved), and the tables show median (min–max) over the rounds; ratios such as
/// slowdowns are taken per round. The machine's core count is printed beside each table,
/// and rows with more threads (compute threads plus dedicated INI threads, every
/// cluster on this machine) than cores are marked "oversubscribed".
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  multigrain experiment ini-scheduling --quick\n  multigrain experiment ini-scheduling --molecules 512 --steps 3 --repeat 5 --out results/ini\n  multigrain experiment mis-scheduling --set ini.window=64\n  multigrain experiment cluster-size --threads 8 --json > cluster-size.json\n  multigrain experiment mva --threads-max 8 --repeat 5 --out results/mva\n  multigrain experiment polling --repeat 5 --set ini.poll_interval_max=64\n  multigrain experiment loggp-calibrate --repeat 3\n  multigrain experiment message-size --quick\n  multigrain experiment message-size --max-size 65536 --senders 1,4 --paths threads,shm\n  multigrain experiment loggp-sensitivity --quick"
)]
pub struct ExperimentArgs {
    /// The experiment.
    #[command(subcommand)]
    pub which: Which,
}

/// The experiments.
#[derive(Subcommand, Debug)]
pub enum Which {
    /// Tables 5.3–5.5: INI performance and Water's run time by cluster size, INIs per
    /// cluster and scheduling policy, against "No IO node" and "IO delay".
    ///
    /// Water (343 molecules × 2 steps, the thesis's problem; --molecules, --steps) on a
    /// fixed number of compute threads (--threads; default 8 on a machine with at least 8
    /// cores, else 4) split into every cluster shape clusters × threads (4×1, 2×2, 1×4),
    /// × INIs per cluster 1 … cluster size × policy static, round-robin, least-loaded;
    /// INIs over UDP, dedicated (ini.inline = false), traces on. Per row: mean message
    /// length (bytes), mean message time in the INIs (µs, send and receive INI), mean
    /// queue length seen by arriving messages, mean INI utilization, run time, and the
    /// slowdown against "No IO node" (the same shape over shared memory: no INIs) and
    /// against "IO delay" (shared memory, every inter-cluster message held
    /// emulation.latency_us = the INIs' unloaded message time, measured by a calibration
    /// run: 1 INI, static, traced; its message time without the hand-off queue, rounded
    /// to µs). The one-cluster shape (1×4) has no inter-cluster traffic: it is the
    /// all-hardware reference row. A second table puts the policies' run times side by
    /// side (Table 5.5) with per-round ratios to static.
    IniScheduling(ini_scheduling::IniSchedulingArgs),
    /// Tables 5.6–5.7: the INIs' mis-scheduled time rate and count rate by policy and
    /// INI count, from the traces.
    ///
    /// Water on a fixed number of compute threads (--threads, default 8: shapes 4×2 and
    /// 2×4), every shape whose clusters have at least 2 threads × INIs per cluster 2 …
    /// cluster size × policy static, round-robin, least-loaded; INIs over UDP,
    /// dedicated, traced. A message is mis-scheduled when it waits in one INI's queue
    /// while another INI of its cluster is idle; the time rate is the wasted queue time
    /// over the time the cluster's INIs were busy (by this definition it can exceed
    /// 100 %), the count rate the share of messages mis-scheduled.
    MisScheduling(mis_scheduling::MisSchedulingArgs),
    /// Tables 5.8–5.9 and paper 000 Table 4: run time and DSM statistics of Water and
    /// EM3D by cluster size at a fixed total of compute threads.
    ///
    /// Total compute threads fixed (--threads, default 4: shapes 4×1, 2×2, 1×4, i.e.
    /// cluster size 1, 2, 4, from all software DSM to all hardware). Per shape with
    /// several clusters: INIs over UDP (dedicated) with 1 INI per cluster, with
    /// round(√cluster size) INIs per cluster when that differs (the thesis's scaling),
    /// and "No IO node" (shared memory between the clusters) for the slowdown. Water
    /// (343 × 2) and EM3D (naive and good layout, read variant): run time, slowdown,
    /// lock acquires, remote page fetches, diffs, DSM messages, and for EM3D the edges
    /// to another thread of the same cluster (local, hardware) and to another cluster
    /// (remote, through the DSM).
    ClusterSize(cluster_size::ClusterSizeArgs),
    /// Chapter 6 and Figure 6-3: the contention model's mean INI queue length and cycle
    /// time beside the measured ones, for N = 1 … --threads-max compute threads per INI.
    ///
    /// The synthetic application of `multigrain bench mva` (its runs, calibration and
    /// model): N client threads in cluster 0 each compute W µs (--work-us, --work), then
    /// make a blocking Express request through the INIs (one dedicated INI thread per
    /// cluster, UDP on loopback) to a server thread in cluster 1. --repeat rounds run
    /// every N once each [default: 3; with --quick 1]; the model's inputs (W, o, O, l,
    /// L) come from the N = 1 runs. Per N: the measured time-average INI queue length Q
    /// (median (min–max) of the rounds) beside equations 6.1–6.10 and the exact MVA,
    /// their relative errors, the measured cycle time R beside the predicted, and
    /// whether Q ≤ N (eq. 6.11). Full size: N = 1 … 8, 2000 requests per client; --quick:
    /// N = 1 … 3, 500 requests. The runs are in this process, not `multigrain run` jobs:
    /// --set is refused, and --timeout-s does not apply (a run gives up when a reply takes
    /// more than a minute).
    Mva(mva::MvaArgs),
    /// Paper 000 Table 2 and §3.4: L, o_s, o_r, g and round trip of the shared-memory
    /// path and of the network path, alone and together, under network polling on
    /// every poll, one in 8, one in 32, and adaptive.
    ///
    /// Express messages between two endpoints pinned to different CPUs, in this
    /// process. Shared memory: two endpoints of one site — alone (no network on the
    /// site), beside the network idle, and beside the network in use (the other site
    /// streams ~10,000 Express messages a second into the same site). Network: an
    /// endpoint of each of two sites through INIs over UDP on loopback (the embedded job's
    /// `[ini]` settings). The adaptive policy's bounds are `ini.poll_interval_min` and
    /// `ini.poll_interval_max` (default 8 and 32; change them with --set). Checks the
    /// paper's claim that adaptive polling keeps the shared-memory round trip within 30 %
    /// of its alone value while the network is in use. Full size: 2,000 round trips, 100
    /// bursts of 16, a 20,000-message stream per row and round; --quick: 100, 8, 500.
    Polling(polling::PollingArgs),
    /// Paper 001 §3.3, Table 2 and Figure 3: does `[emulation]` add the L, o, g and G it
    /// is asked for, each independently?
    ///
    /// Two sites in this process joined by one INI each over UDP on loopback (the
    /// embedded job's `[ini]` and --set), Express messages between them. o (o_s and o_r
    /// together: 0, 2.5, 5, 10, 20, 40 µs), g (0, 5, 10, 20, 40 µs), L (0, 5, 10, 20, 40
    /// µs) and G (0, 2, 5, 10, 20 ns/byte) each varied alone; per setting the observed o
    /// = (o_s + o_r)/2, g, L = RTT/2 − o_s − o_r, and G from a stream of 4 KiB Tag-On
    /// messages, and whether the varied parameter's observed value above its baseline is
    /// within 10 % of what was asked. The figure is the LogP signature at g = 14 µs: the
    /// sender's average initiation interval against the burst length m = 1 … 128, for
    /// computational delays Δ = 0, 5, 10, 20 µs. --quick: 0 and one value per parameter.
    LoggpCalibrate(loggp_calibrate::LoggpCalibrateArgs),
    /// Paper 004 §6 (Figures 4–7) and paper 003 §4: one-way latency and streaming
    /// bandwidth against message size for Express, Basic, Tag-On and bulk, over threads,
    /// shared memory between two processes and INIs; the half-power point n½.
    ///
    /// Sizes 8 B … 1 MiB (powers of two; --max-size). Per path (threads of one site;
    /// this process and a peer process over a shared segment; two sites through one
    /// dedicated INI each over UDP loopback), kind and size: the one-way latency
    /// (ping-pong ÷ 2, µs) and the streaming bandwidth (MB/s) with 1, 2 and 4 sender
    /// threads into one receiver (--senders); from the bandwidth curves, the peak and
    /// n½, the smallest size reaching half of it. A kind that cannot carry a size in one
    /// message sends its natural sequence (Express: a word per 4 bytes, up to 256 B;
    /// Basic: 256-byte messages; Tag-On: a 4 KiB slot per message); bulk fragments and
    /// reassembles. --repeat rounds sample every point once each [default: 3; with
    /// --quick 1]; --quick: sizes 8, 64, 512, 4096, 32768, 1 and 2 senders, smaller
    /// samples (a few seconds). Besides NAME.png (bandwidth ÷ peak: n½ where a line
    /// crosses 0.5), it draws NAME-latency and NAME-bandwidth (log scale). The runs are
    /// in this process and one peer process, not `multigrain run` jobs: --set is refused
    /// and --timeout-s does not apply.
    MessageSize(message_size::MessageSizeArgs),
    /// Paper 001 §5 (Figures 5–8, Table 5) and §4 (Table 4, Figure 4): slowdown of
    /// Water and EM3D (read and write variants) as each LogGP parameter o, g, L, G grows
    /// alone; the overhead model beside the o sweep; communication summary and balance.
    ///
    /// Topologies 2×1 and 2×2 (the embedded default), one dedicated INI per cluster over
    /// UDP (so that g and G apply). Per app and topology: an all-zero run, then o (both
    /// emulation.send_overhead_us and recv_overhead_us) 5, 10, 20 µs, g (gap_us) 5, 10,
    /// 20 µs, L (latency_us) 10, 25, 50 µs, G (per_byte_gap_ns) 10, 50 ns/byte, each alone;
    /// slowdown = run time / the all-zero run's, per round. Beside the o rows: paper 001's
    /// r_pred = r_orig + 2·m·Δo, m the most network messages per compute thread of one
    /// cluster (messages are counted per cluster), and its relative error. A second table
    /// summarizes the all-zero runs like paper 001 Table 4 (messages per thread, per ms,
    /// per barrier interval, % reads, bytes); a third gives the cluster-to-cluster message
    /// matrix (Figure 4 at cluster granularity). Full size: Water 343 × 3, EM3D 2500
    /// nodes/thread × 50 iterations; --quick: Water 64 × 1, EM3D 500 × 5, one value per
    /// parameter (o 10, g 10, L 25 µs, G 50 ns/byte).
    LoggpSensitivity(loggp_sensitivity::LoggpSensitivityArgs),
}

/// Flags every experiment takes.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// A small version that finishes in under a minute on a 2-core machine: a smaller
    /// problem and 1 round unless --repeat says otherwise.
    #[arg(long)]
    pub quick: bool,
    /// Rounds: each runs every point once [default: 3; with --quick 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub repeat: Option<u64>,
    /// Directory for the results (created): a CSV per table, NAME.json, NAME.txt,
    /// NAME.png and NAME.svg [default: experiments/NAME-YYYYMMDD-HHMMSS under the
    /// current directory].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Change one configuration value of every run, e.g. `--set ini.window=64` (repeatable;
    /// later wins). The keys the experiment sweeps (topology, INIs, policy, substrate,
    /// inline, latency of "IO delay", trace_dir) are set per point after these.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<Override>,
    /// Print the JSON document (every table and run) on stdout, the tables on stderr.
    #[arg(long)]
    pub json: bool,
    /// Stop a run that takes longer than this many seconds (start-up included) and count
    /// it as FAILED.
    #[arg(long, value_name = "S", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_s: u64,
}

/// What every experiment knows about its invocation.
#[derive(Clone, Debug)]
pub struct Context {
    /// The experiment's name, e.g. `ini-scheduling`.
    pub name: &'static str,
    /// `--quick`.
    pub quick: bool,
    /// Rounds.
    pub repeat: usize,
    /// The output directory.
    pub out: PathBuf,
    /// `--set` values for every run.
    pub sets: Vec<Override>,
    /// Per-run time limit.
    pub timeout: Duration,
    /// Cores of this machine (`std::thread::available_parallelism`).
    pub cores: usize,
}

impl Context {
    fn new(name: &'static str, a: &CommonArgs) -> Result<Context> {
        // The user's values must make a valid job on their own (the sweep's keys are
        // checked per point by the runs).
        JobConfig::from_str_with_overrides(EMBEDDED_DEFAULT_TOML, "embedded default job", &a.set)
            .context("--set")?;
        let out = match &a.out {
            Some(o) => o.clone(),
            None => PathBuf::from("experiments").join(format!("{name}-{}", stamp())),
        };
        Ok(Context {
            name,
            quick: a.quick,
            repeat: usize::try_from(a.repeat.unwrap_or(if a.quick { 1 } else { 3 }))?,
            out,
            sets: a.set.clone(),
            timeout: Duration::from_secs(a.timeout_s),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        })
    }

    /// The note on the machine printed under every table.
    pub fn machine_note(&self) -> String {
        format!(
            "machine: {} core(s) (available_parallelism); \"oversubscribed\": the row's \
             threads (compute + dedicated INI threads of every cluster, all on this \
             machine) exceed the cores",
            self.cores
        )
    }

    /// The note cell of a row: why its runs failed, or whether it is oversubscribed.
    pub fn note(&self, threads: usize, runs: &[&Runs]) -> Cell {
        let failures: Vec<String> = runs.iter().flat_map(|r| r.failures()).collect();
        if !failures.is_empty() {
            return Cell::text(format!("FAILED: {}", failures.join("; ")));
        }
        Cell::text(if threads > self.cores {
            "oversubscribed"
        } else {
            ""
        })
    }
}

/// The time now as `YYYYMMDD-HHMMSS` (UTC).
fn stamp() -> String {
    let t = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    // 2026-11-25T12:29:00Z
    t.trim_end_matches('Z')
        .replace(['-', ':'], "")
        .replace('T', "-")
}

/// A job's shape: clusters × compute threads per cluster, all on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Cluster processes.
    pub clusters: usize,
    /// Compute threads per cluster (the cluster size).
    pub threads: usize,
}

impl Shape {
    /// Every shape of `total` compute threads, cluster size ascending (4 → 4×1, 2×2, 1×4).
    pub fn all(total: usize) -> Vec<Shape> {
        (1..=total)
            .filter(|s| total.is_multiple_of(*s))
            .map(|s| Shape {
                clusters: total / s,
                threads: s,
            })
            .collect()
    }

    /// `2×2`.
    pub fn label(self) -> String {
        format!("{}×{}", self.clusters, self.threads)
    }

    /// `2x2`, for file names.
    pub fn id(self) -> String {
        format!("{}x{}", self.clusters, self.threads)
    }

    /// Compute threads of the job.
    pub fn total(self) -> usize {
        self.clusters * self.threads
    }

    /// The `--set` values that give a job this shape.
    pub fn sets(self) -> Vec<String> {
        vec![
            format!("local.clusters={}", self.clusters),
            format!("local.threads={}", self.threads),
        ]
    }
}

/// How the clusters of a DSM point talk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Link {
    /// Through `inis` dedicated INI threads per cluster over UDP, scheduled by `policy`.
    Inis {
        /// INIs per cluster.
        inis: usize,
        /// `static`, `round-robin` or `least-loaded`.
        policy: &'static str,
    },
    /// Shared memory between the cluster processes, no INIs ("No IO node").
    NoIo,
    /// Shared memory with every inter-cluster message held `latency_us` ("IO delay").
    IoDelay {
        /// emulation.latency_us, µs.
        latency_us: u64,
    },
}

/// The INI scheduling policies, in table order.
pub const POLICIES: [&str; 3] = ["static", "round-robin", "least-loaded"];

impl Link {
    /// The `--set` values of this link.
    pub fn sets(self) -> Vec<String> {
        match self {
            // The thesis's apparatus: dedicated INIs, one message per datagram, one
            // system call per datagram.
            Link::Inis { inis, policy } => vec![
                "ini.substrate=udp".into(),
                "ini.inline=false".into(),
                "ini.coalesce=false".into(),
                "ini.offload=false".into(),
                format!("ini.per_cluster={inis}"),
                format!("ini.policy={policy}"),
            ],
            Link::NoIo => vec!["ini.substrate=shm".into()],
            Link::IoDelay { latency_us } => vec![
                "ini.substrate=shm".into(),
                format!("emulation.latency_us={latency_us}"),
            ],
        }
    }

    /// Row text, e.g. `round-robin` or `IO delay (L = 26 µs)`.
    pub fn label(self) -> String {
        match self {
            Link::Inis { policy, .. } => policy.to_owned(),
            Link::NoIo => "No IO node (shm)".to_owned(),
            Link::IoDelay { latency_us } => format!("IO delay (shm, L = {latency_us} µs)"),
        }
    }

    /// `inis-2-round-robin`, for file names.
    pub fn id(self) -> String {
        match self {
            Link::Inis { inis, policy } => format!("inis-{inis}-{policy}"),
            Link::NoIo => "noio".into(),
            Link::IoDelay { .. } => "iodelay".into(),
        }
    }

    /// Threads of a job of `shape` on this link: compute threads plus dedicated INIs.
    pub fn threads(self, shape: Shape) -> usize {
        match self {
            Link::Inis { inis, .. } if shape.clusters > 1 => shape.total() + shape.clusters * inis,
            _ => shape.total(),
        }
    }

    /// INIs per cluster, if any.
    pub fn inis(self) -> Option<usize> {
        match self {
            Link::Inis { inis, .. } => Some(inis),
            _ => None,
        }
    }
}

/// A point of `app` on `shape` over `link` (traced when over INIs).
pub fn dsm_point(app: &[String], app_id: &str, shape: Shape, link: Link) -> Point {
    Point {
        id: format!("{app_id}-{}-{}", shape.id(), link.id()),
        label: format!(
            "{app_id} {}, {}{}",
            shape.label(),
            link.inis()
                .map_or(String::new(), |k| format!("{k} INI(s), ")),
            link.label()
        ),
        app: app.to_vec(),
        sets: [shape.sets(), link.sets()].concat(),
        trace: matches!(link, Link::Inis { .. }) && shape.clusters > 1,
    }
}

/// The application arguments of Water with `molecules` × `steps`.
pub fn water_app(molecules: u64, steps: u64) -> Vec<String> {
    vec![
        "water".into(),
        "--molecules".into(),
        molecules.to_string(),
        "--steps".into(),
        steps.to_string(),
    ]
}

/// The application arguments of EM3D with `nodes` per thread × `iterations`, the
/// `variant` (`read`, `write`) and, if given, the `layout` (else EM3D's default).
pub fn em3d_app(nodes: u64, iterations: u64, layout: Option<&str>, variant: &str) -> Vec<String> {
    let mut args = vec![
        "em3d".to_owned(),
        "--nodes-per-thread".to_owned(),
        nodes.to_string(),
        "--iterations".to_owned(),
        iterations.to_string(),
    ];
    if let Some(l) = layout {
        args.extend(["--layout".to_owned(), l.to_owned()]);
    }
    args.extend(["--variant".to_owned(), variant.to_owned()]);
    args
}

/// Checks a Water problem before any run: molecules a positive perfect cube, steps ≥ 1.
///
/// # Errors
/// What is wrong, naming the flag.
/// Water's problem size flags, shared by the experiments that run Water.
#[derive(clap::Args, Debug)]
pub struct WaterSize {
    /// Water's molecules, a perfect cube [default: 343, the thesis's problem; with
    /// --quick 64]. A larger problem: --molecules 512 --steps 3.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub molecules: Option<u64>,
    /// Water's time steps [default: 2; with --quick 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: Option<u64>,
}

impl WaterSize {
    /// (molecules, steps) with the defaults filled in (`quick`: the small problem).
    ///
    /// # Errors
    /// A size Water cannot run (see [`check_water`]).
    pub fn resolve(&self, quick: bool) -> Result<(u64, u64)> {
        let molecules = self.molecules.unwrap_or(if quick { 64 } else { 343 });
        let steps = self.steps.unwrap_or(if quick { 1 } else { 2 });
        check_water(molecules, steps)?;
        Ok((molecules, steps))
    }
}

/// Checks that Water can run `molecules` × `steps`.
///
/// # Errors
/// Which flag is wrong and why.
pub fn check_water(molecules: u64, steps: u64) -> Result<()> {
    super::bench_apps::parse_water_size(&format!("{molecules}x{steps}"))
        .map_err(|e| anyhow::anyhow!("--molecules/--steps: {e}"))?;
    Ok(())
}

/// What an experiment produced.
pub struct Outcome {
    /// Its tables, in print order.
    pub tables: Vec<Table>,
    /// Its figure.
    pub figure: plot::Figure,
    /// Its parameters (problem, threads, …), for the JSON; for an experiment whose runs
    /// are not `multigrain run` jobs (mva), its measurements too.
    pub params: Value,
    /// Every point's runs, for the JSON (`multigrain run` jobs; none for mva).
    pub points: Vec<(Point, Runs)>,
    /// Runs that failed.
    pub failed: usize,
}

/// One run in the JSON: run time, wall time, DSM totals and the trace summary, or the
/// error.
fn run_json(r: &Result<crate::commands::run::report::Report, String>) -> Value {
    match r {
        Ok(rep) => json!({
            "run_s": rep.run_s,
            "wall_s": rep.wall_s,
            "stats_total": rep.stats.as_ref().map(|s| &s.total),
            "trace": rep.trace,
        }),
        Err(e) => json!({ "error": e }),
    }
}

/// Writes the outcome into `ctx.out` and prints the tables (or, with `print_json`, the
/// JSON document on stdout and the tables on stderr).
fn deliver(ctx: &Context, o: &Outcome, print_json: bool) -> Result<()> {
    let out = &ctx.out;
    let write = |name: &str, text: &str| -> Result<()> {
        let p = out.join(name);
        std::fs::write(&p, text).with_context(|| format!("--out: cannot write {}", p.display()))
    };
    let mut text = String::new();
    for t in &o.tables {
        text += &t.render();
        text.push('\n');
        write(&format!("{}.csv", t.id), &t.csv())?;
    }
    let points: Vec<Value> = o
        .points
        .iter()
        .map(|(p, runs)| {
            json!({
                "id": p.id, "label": p.label, "app": p.app, "sets": p.sets, "trace": p.trace,
                "rounds": runs.rounds.iter().map(run_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let doc = json!({
        "experiment": ctx.name,
        "meta": crate::commands::run::meta::Meta::now(None),
        "cores": ctx.cores,
        "quick": ctx.quick,
        "repeat": ctx.repeat,
        "sets": ctx.sets.iter().map(Override::flag).collect::<Vec<_>>(),
        "params": o.params,
        "tables": o.tables.iter().map(Table::json).collect::<Vec<_>>(),
        "points": points,
        "failed_runs": o.failed,
    });
    let doc_text = serde_json::to_string_pretty(&doc)? + "\n";
    write(&format!("{}.json", ctx.name), &doc_text)?;
    plot::write(&o.figure, &out.join(ctx.name))?;
    let files = format!(
        "wrote {}/: {}, {name}.json, {name}.txt, {name}.png, {name}.svg\n",
        out.display(),
        o.tables
            .iter()
            .map(|t| format!("{}.csv", t.id))
            .collect::<Vec<_>>()
            .join(", "),
        name = ctx.name
    );
    write(&format!("{}.txt", ctx.name), &text)?;
    if print_json {
        eprint!("{text}{files}");
        print!("{doc_text}");
    } else {
        print!("{text}{files}");
    }
    Ok(())
}

/// Runs `multigrain experiment`.
///
/// # Errors
/// Bad flags, an output directory that cannot be written, a calibration run that
/// failed, or (after writing everything) runs that failed.
pub fn run(args: &ExperimentArgs) -> Result<()> {
    let (name, common) = match &args.which {
        Which::IniScheduling(a) => ("ini-scheduling", &a.common),
        Which::MisScheduling(a) => ("mis-scheduling", &a.common),
        Which::ClusterSize(a) => ("cluster-size", &a.common),
        Which::Mva(a) => ("mva", &a.common),
        Which::Polling(a) => ("polling", &a.common),
        Which::LoggpCalibrate(a) => ("loggp-calibrate", &a.common),
        Which::MessageSize(a) => ("message-size", &a.common),
        Which::LoggpSensitivity(a) => ("loggp-sensitivity", &a.common),
    };
    let ctx = Context::new(name, common)?;
    std::fs::create_dir_all(&ctx.out)
        .with_context(|| format!("--out: cannot create {}", ctx.out.display()))?;
    let outcome = match &args.which {
        Which::IniScheduling(a) => ini_scheduling::run(&ctx, a)?,
        Which::MisScheduling(a) => mis_scheduling::run(&ctx, a)?,
        Which::ClusterSize(a) => cluster_size::run(&ctx, a)?,
        Which::Mva(a) => mva::run(&ctx, a)?,
        Which::Polling(a) => polling::run(&ctx, a)?,
        Which::LoggpCalibrate(a) => loggp_calibrate::run(&ctx, a)?,
        Which::MessageSize(a) => message_size::run(&ctx, a)?,
        Which::LoggpSensitivity(a) => loggp_sensitivity::run(&ctx, a)?,
    };
    deliver(&ctx, &outcome, common.json)?;
    if outcome.failed > 0 {
        bail!(
            "experiment {name}: {} run(s) FAILED (see the note column and {})",
            outcome.failed,
            ctx.out.join(format!("{name}.json")).display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_of_a_thread_count() {
        let s: Vec<String> = Shape::all(4).into_iter().map(Shape::label).collect();
        assert_eq!(s, ["4×1", "2×2", "1×4"]);
        assert_eq!(Shape::all(8).len(), 4);
        assert_eq!(Shape::all(6).len(), 4, "1, 2, 3, 6");
    }

    #[test]
    fn links_set_what_they_say() {
        let shape = Shape {
            clusters: 2,
            threads: 2,
        };
        let p = dsm_point(
            &water_app(64, 1),
            "water",
            shape,
            Link::Inis {
                inis: 2,
                policy: "round-robin",
            },
        );
        assert!(p.trace);
        assert_eq!(p.id, "water-2x2-inis-2-round-robin");
        assert!(p.sets.contains(&"ini.inline=false".to_owned()));
        assert!(p.sets.contains(&"local.clusters=2".to_owned()));
        let cfg = JobConfig::from_str_with_overrides(
            EMBEDDED_DEFAULT_TOML,
            "t",
            &p.sets
                .iter()
                .map(|s| s.parse().unwrap())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(cfg.inis_of(1), 2);
        assert_eq!(
            Link::IoDelay { latency_us: 26 }.label(),
            "IO delay (shm, L = 26 µs)"
        );
        assert_eq!(Link::NoIo.threads(shape), 4);
        assert_eq!(
            Link::Inis {
                inis: 2,
                policy: "static"
            }
            .threads(shape),
            8
        );
        assert!(!dsm_point(&water_app(64, 1), "water", shape, Link::NoIo).trace);
    }

    #[test]
    fn stamps_are_file_names() {
        let s = stamp();
        assert_eq!(s.len(), 15, "{s}");
        assert!(s.chars().all(|c| c.is_ascii_digit() || c == '-'), "{s}");
    }
}
