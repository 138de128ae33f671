//! `multigrain bench apps`: the application comparisons of issue 10 — Water and EM3D
//! sequentially, on 2 plain threads and on the DSM topologies 2×1 over `shm`, 2×1 over
//! `udp`, 2×2 (the embedded default job) and 4×1 — with same-run baselines, speedups and
//! the ratios against their targets.
//!
//! Every run is this executable's own `multigrain run water|em3d … --json FILE`, started
//! as a user would start it (launcher variables removed); its `run_s` (the computation,
//! not process start-up) is the sample, the whole command (from its start to its exit)
//! a second one, and its energies (Water) or checksum (EM3D) are
//! checked against the sequential reference of the same problem. Runs are interleaved
//! round by round: round *r* runs every configuration once, so a change of the machine's
//! speed regime affects every configuration alike, and every ratio is taken per round
//! (configuration A's run of round *r* against configuration B's run of round *r*).

mod check;
mod plan;
mod report;

pub use check::*;
pub use plan::*;
pub use report::*;

use super::child_run::run_report;
use super::run::report::Outcome;
use super::run::spawn::ScratchDir;
use crate::measure::{Summary, Target, ratio, secs, spread, write_json};
use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use multigrain_apps::{em3d, water};
use multigrain_cluster_config::{EMBEDDED_DEFAULT_TOML, JobConfig, Override};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// Run the application comparisons of issue 10 and print them with same-run baselines.
///
/// For each problem — Water at two sizes (--water-small, default 512 molecules × 50
/// steps; --water-large, default 4096 × 3) and EM3D (good layout, read variant, 20,000
/// nodes per thread, 100 iterations by default) — runs `--sequential`, `--threads 2` and
/// the DSM topologies of --topologies: 2x1-shm (2 cluster processes × 1 thread, shared
/// memory between them), 2x1-udp (the same through INIs over UDP loopback), 2x2 (the
/// embedded default job: 2 × 2 threads, udp) and 4x1 (4 × 1 thread, udp). Each is run
/// --repeat times as this executable's `multigrain run water|em3d … --json FILE`; the
/// sample is the run's `run_s` (the computation, not process start-up), and the whole
/// command, from its start to its exit as `time` shows it, is timed too.
///
/// Runs are interleaved: round r runs every configuration once, so a change of the
/// machine's speed regime between rounds affects all configurations alike. Per
/// configuration the table shows the run time, median (min–max), the speedup against
/// the sequential run of the same round, median (min–max), and the whole command's
/// time. EM3D's graph grows with the thread count (--em3d-nodes-per-thread is per
/// thread), so its 4-thread topologies are compared with a sequential run of the
/// 4-partition graph, run as a configuration of its own.
///
/// Then the ratios of issue 10, each taken per round (median (min–max) over the rounds),
/// with its target: (1) Water large on 2×1: speedup over shm ≥ 0.8 × the speedup of
/// --threads 2, over udp ≥ 0.6 ×; (2) Water small on 2×1: time ≤ 1.5 × that of
/// --threads 2 over shm, ≤ 3 × over udp, on `run_s` and again on whole commands (start-up
/// and shutdown weigh on a run this short); (3) on each Water problem, 2×2 no slower than
/// 2×1 over udp, 4×1 no slower than 3 × 2×1 over udp; (4) EM3D on 2×1: speedup over shm
/// ≥ 0.7 × that of --threads 2, time over udp ≤ 1.5 × the sequential time. A ratio whose
/// configurations were not run (see --topologies) is left out.
///
/// Every run's result is checked against the sequential reference of its problem:
/// Water's energies must agree to at least 9 significant digits (they agree to 12+
/// today; parallel sums are added in another order), EM3D's checksum bit for bit. A
/// configuration with a run that fails, times out or disagrees is marked FAILED, and the
/// command exits non-zero after printing everything. Progress (which run of how many)
/// goes to stderr. The machine should be otherwise idle.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  multigrain bench apps\n  multigrain bench apps --only water --water-large none --repeat 5 --json water.json\n  multigrain bench apps --only em3d --topologies 2x1-shm,2x1-udp --em3d-iterations 20\n  multigrain bench apps --only water --topologies 2x1-shm,2x1-udp --compare dsm.protocol=sc"
)]
pub struct BenchAppsArgs {
    /// Runs of every configuration: rounds, each running every configuration once.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub repeat: u64,
    /// Only this application.
    #[arg(long, value_enum, value_name = "APP")]
    pub only: Option<AppChoice>,
    /// The DSM topologies to run, comma-separated: 2x1-shm, 2x1-udp, 2x2, 4x1
    /// [default: all four]. --sequential and --threads 2 always run.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_topology)]
    pub topologies: Vec<Topology>,
    /// The Water problem of target (2), MOLECULESxSTEPS (molecules a perfect cube), or
    /// `none` to skip it.
    #[arg(long, value_name = "MxS", default_value = "512x50", value_parser = parse_water_size)]
    pub water_small: WaterChoice,
    /// The Water problem of target (1), MOLECULESxSTEPS (molecules a perfect cube), or
    /// `none` to skip it.
    #[arg(long, value_name = "MxS", default_value = "4096x3", value_parser = parse_water_size)]
    pub water_large: WaterChoice,
    /// EM3D: E nodes (and as many H nodes) per thread.
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub em3d_nodes_per_thread: u64,
    /// EM3D: iterations (an E phase and an H phase each).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub em3d_iterations: u64,
    /// EM3D: where each cluster's threads sit in the processor grid.
    #[arg(long, value_name = "LAYOUT", default_value = "good", value_parser = ["naive", "good"])]
    pub em3d_layout: String,
    /// EM3D: how values reach the threads that need them.
    #[arg(long, value_name = "VARIANT", default_value = "read", value_parser = ["read", "write"])]
    pub em3d_variant: String,
    /// Stop a run (SIGTERM, then SIGKILL 5 s later) that takes longer than this many
    /// seconds, process start-up included, and count it as FAILED.
    #[arg(long, value_name = "S", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_s: u64,
    /// Also write every run, configuration and ratio as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Change one configuration value of every DSM run, e.g. `--set dsm.protocol=sc` or
    /// `--set dsm.release_batch=64` (repeatable; later wins), to run the tables under
    /// another protocol or parameter (to measure a change against the default in the
    /// same rounds, use --compare). Applied after the topology's own settings and
    /// checked against each topology's configuration before anything runs. Keys that
    /// would change what a topology is (`local.*`, `cluster.*`, `ini.substrate`) are
    /// refused: pick topologies with --topologies. --sequential and --threads 2 do not
    /// use the DSM and ignore it.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<Override>,
    /// Compare a configuration change on the same runs: every DSM topology also runs
    /// with these values (repeatable; applied after --set), as a row marked (B) right
    /// after the row without them (A) in every round, and each problem gets a table of
    /// the per-round ratios B / A. The issue-10 ratios stay on the A rows. Same keys
    /// as --set, e.g. `--compare dsm.protocol=sc` or `--compare dsm.release_batch=64`.
    #[arg(long = "compare", value_name = "KEY=VALUE")]
    pub compare: Vec<Override>,
}

/// The arguments of `multigrain run` for `problem` on `setup`: the app's, where it
/// runs, and — for DSM runs only — `--set` for each of `sets`, then (the (B) runs)
/// for each of `compare`.
fn run_args(
    dir: &Path,
    problem: &Problem,
    setup: Setup,
    sets: &[String],
    compare: &[String],
) -> Vec<String> {
    let (dsm, compared) = match setup {
        Setup::Dsm { compared, .. } => (true, compared),
        _ => (false, false),
    };
    let changes = sets
        .iter()
        .filter(|_| dsm)
        .chain(compare.iter().filter(|_| compared));
    problem
        .app_args()
        .into_iter()
        .chain(setup.args(dir))
        .chain(changes.flat_map(|s| ["--set".to_owned(), s.clone()]))
        .collect()
}

/// Runs `multigrain run` for `problem` on `setup` once.
fn run_once(
    exe: &Path,
    dir: &Path,
    problem: &Problem,
    setup: Setup,
    plan: &Plan,
    timeout: Duration,
) -> Result<RunOk, String> {
    let args = run_args(dir, problem, setup, &plan.sets, &plan.compare);
    let started = Instant::now();
    let report = run_report(exe, dir, &args, timeout)?;
    let command_s = started.elapsed().as_secs_f64();
    let (answer, locked_s) = match report.outcome {
        Outcome::Water { result, .. } => (
            Answer::Water(result.energies),
            Some(result.times.interf_locked_s),
        ),
        Outcome::Em3d { result, .. } => (Answer::Em3d(result.checksum), None),
        Outcome::Conformance { .. } => return Err("not an application run".to_owned()),
    };
    Ok(RunOk {
        run_s: report.run_s,
        command_s,
        locked_s,
        answer,
    })
}

/// Runs `multigrain bench apps`.
///
/// # Errors
/// Bad flags, a scratch directory that cannot be written, or (after printing the
/// report) a configuration marked FAILED.
pub fn run(args: &BenchAppsArgs) -> Result<()> {
    let plan = Plan::from_args(args)?;
    let exe = std::env::current_exe().context("locating the multigrain binary to run")?;
    let dir = ScratchDir::new()?;
    // The (A) runs take the --set values, the (B) runs the --compare ones after them:
    // each must give a valid job on every topology before anything runs.
    let with_compare: Vec<Override> = args.set.iter().chain(&args.compare).cloned().collect();
    let variants: &[&[Override]] = if args.compare.is_empty() {
        &[&args.set]
    } else {
        &[&args.set, &with_compare]
    };
    for t in &plan.topologies {
        let text = t.config_toml();
        let (body, origin) = match &text {
            Some(text) => (
                text.as_str(),
                config_file(dir.path(), *t).display().to_string(),
            ),
            None => (EMBEDDED_DEFAULT_TOML, "embedded default job".to_owned()),
        };
        for changes in variants {
            JobConfig::from_str_with_overrides(body, &origin, changes)
                .with_context(|| format!("the configuration of {}", t.name()))?;
        }
        if let Some(text) = text {
            let path = config_file(dir.path(), *t);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let timeout = Duration::from_secs(plan.timeout_s);
    let mut records: Vec<Vec<Record>> = plan
        .problems
        .iter()
        .map(|p| {
            p.setups(&plan.topologies, !plan.compare.is_empty())
                .into_iter()
                .map(|setup| Record {
                    setup,
                    runs: Vec::new(),
                })
                .collect()
        })
        .collect();
    let total = plan.runs();
    let mut done = 0;
    let started = Instant::now();
    // Under `-q`: no line per run, only failures.
    let quiet = crate::progress::quiet();
    for round in 0..plan.repeat {
        for (problem, recs) in plan.problems.iter().zip(records.iter_mut()) {
            for rec in recs.iter_mut() {
                done += 1;
                let what = format!(
                    "bench apps: run {done}/{total} (round {}/{}): {} on {}",
                    round + 1,
                    plan.repeat,
                    short_name(problem),
                    rec.setup.label()
                );
                if !quiet {
                    eprint!("{what} … ");
                }
                let r = run_once(&exe, dir.path(), problem, rec.setup, &plan, timeout);
                match &r {
                    Ok(_) if quiet => {}
                    Ok(ok) => eprintln!(
                        "run_s {} s (whole command {} s)",
                        secs(ok.run_s),
                        secs(ok.command_s)
                    ),
                    // `-q`: the error only, with what failed.
                    Err(e) if quiet => eprintln!("{what}: FAILED: {e}"),
                    Err(e) => eprintln!("FAILED: {e}"),
                }
                rec.runs.push(r);
            }
        }
    }
    if !quiet {
        eprintln!(
            "bench apps: {total} runs in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    let problems: Vec<ProblemReport> = plan
        .problems
        .iter()
        .zip(&records)
        .map(|(p, recs)| problem_report(p, recs))
        .collect();
    let failed = problems
        .iter()
        .flat_map(|p| &p.configurations)
        .filter(|c| matches!(c.check, Check::Failed { .. }))
        .count();
    let report = AppsReport {
        command: "multigrain bench apps",
        plan,
        problems,
        failed,
    };
    print!("{}", render(&report));
    if let Some(path) = &args.json {
        write_json(path, &report)?;
        println!("\nwrote {}", path.display());
    }
    if failed > 0 {
        return Err(anyhow!(
            "bench apps: {failed} configuration(s) FAILED: a run failed, timed out or disagreed with the sequential result (see the table)"
        ));
    }
    Ok(())
}

/// A problem's name in progress lines.
fn short_name(p: &Problem) -> String {
    match p {
        Problem::Water { size, .. } => format!("water {}×{}", size.molecules, size.steps),
        Problem::Em3d {
            nodes_per_thread,
            iterations,
            ..
        } => format!("em3d {nodes_per_thread} nodes/thread × {iterations} it."),
    }
}

#[cfg(test)]
mod tests;
