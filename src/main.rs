//! `multigrain`: run shared-memory programs across clusters of machines.
//!
//! See `multigrain --help`; every subcommand has its own `--help`.

mod commands;
mod measure;
mod progress;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// multigrain: a distributed shared memory system for clusters of SMPs.
///
/// Threads inside a cluster (one process) share memory through the hardware; between
/// clusters, pages are kept coherent in software (userfaultfd + a release-consistent
/// protocol) over a StarT-Voyager-style message layer.
#[derive(Parser, Debug)]
#[command(name = "multigrain", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure a layer of the system beside its baselines (medians and spread).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Validate or display a cluster-configuration (topology) file.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// The message layer: Express latency and throughput, Tag-On vs Basic, cross-process.
    ///
    /// Each row is measured --samples times, alternating with its baseline, and reported as
    /// median and interquartile range; ratios compare medians from the same run. The
    /// machine should be otherwise idle: ping-pong needs both threads on their own cores.
    Messaging(BenchMessagingArgs),
}

#[derive(Args, Debug)]
struct BenchMessagingArgs {
    /// Samples per row (at least 3).
    #[arg(long, default_value_t = 9)]
    samples: usize,
    /// Round trips per latency sample.
    #[arg(long, default_value_t = 20_000)]
    round_trips: u64,
    /// Messages per throughput sample.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// 4 KiB pages per Tag-On/Basic sample.
    #[arg(long, default_value_t = 20_000)]
    pages: u64,
    /// Skip the two-process latency rows.
    #[arg(long)]
    no_cross_process: bool,
    /// Also write the rows as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Check a topology file; errors name the file, line, column, key, value and what is allowed.
    Check {
        /// The TOML file (see cluster-config/examples/).
        file: PathBuf,
    },
    /// Print a topology file as a table of clusters, hosts, ports, threads, INIs, policy.
    Show {
        /// The TOML file (see cluster-config/examples/).
        file: PathBuf,
    },
}

fn main() {
    // A re-executed copy of this binary may be the peer of a cross-process benchmark.
    if multigrain_messaging::bench::cross_process::run_peer_if_requested() {
        return;
    }
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_env("MULTIGRAIN_LOG")).with_writer(std::io::stderr).init();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("multigrain: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bench(BenchCommand::Messaging(a)) => commands::bench_messaging::run(
            commands::bench_messaging::Options { samples: a.samples, round_trips: a.round_trips, messages: a.messages, pages: a.pages, cross_process: !a.no_cross_process },
            a.json.as_deref(),
        ),
        Command::Config(ConfigCommand::Check { file }) => commands::config::check(&file),
        Command::Config(ConfigCommand::Show { file }) => commands::config::show(&file),
    }
}
