//! `multigrain`: run shared-memory programs across clusters of machines.
//!
//! See `multigrain --help`; every subcommand has its own `--help`.

mod commands;
mod launch;
mod logging;
mod measure;
mod progress;
mod synthetic;
mod text_table;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use multigrain_cluster_config::Override;
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
    /// More log output on stderr: -v info, -vv debug (join, address exchange, INI
    /// connections), -vvv trace. RUST_LOG (EnvFilter syntax, e.g.
    /// `RUST_LOG=multigrain_messaging=debug`) takes precedence. Cluster processes started
    /// by `run` and `launch` log at the same level.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Only errors on stderr: no warnings, no progress bars or lines.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Which launcher started this process: auto (default: a Slurm task inside a job step
    /// — SLURM_STEP_ID set, never the shell of an sbatch script or salloc — else PMI_RANK,
    /// else OMPI_COMM_WORLD_RANK), none (not a launcher rank, whatever the environment
    /// says), slurm, pmi or mpi (only that launcher's variables; `pmix` = mpi: Open MPI's
    /// rank variables, PMIx for the rendezvous). The environment variable
    /// MULTIGRAIN_LAUNCHER sets the same; this flag wins.
    #[arg(long, global = true, value_name = "LAUNCHER", value_parser = parse_launcher)]
    launcher: Option<multigrain_cluster_config::LauncherChoice>,
}

fn parse_launcher(s: &str) -> Result<multigrain_cluster_config::LauncherChoice, String> {
    s.parse()
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure a layer of the system beside its baselines (medians and spread).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Validate or display a cluster-configuration (topology) file.
    #[command(subcommand)]
    Config(ConfigCommand),
    Launch(LaunchArgs),
    Hello(HelloArgs),
    Selftest(SelftestArgs),
    Run(commands::run::RunArgs),
    /// Run an experiment of the INI thesis (paper 002 ch. 5): a sweep of real runs,
    /// repeated, with tables (CSV, JSON) and a figure (PNG, SVG).
    Experiment(commands::experiment::ExperimentArgs),
    /// Read the per-message INI traces a job wrote (paper 002 §4.4.2).
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Print a shell completion script on stdout.
    #[command(
        after_help = "Examples:\n  multigrain completions bash > ~/.local/share/bash-completion/completions/multigrain\n  multigrain completions zsh > ~/.zfunc/_multigrain\n  multigrain completions fish > ~/.config/fish/completions/multigrain.fish"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages (roff): multigrain.1 and one per subcommand, e.g. multigrain-run.1.
    #[command(
        after_help = "Example: multigrain man --out ~/.local/share/man/man1 && man multigrain-run"
    )]
    Man {
        /// Directory to write the pages into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Check a job's network end to end: every compute thread of every cluster sends Express and
/// 4 KiB Tag-On messages to every other cluster, and every receiver verifies that each
/// arrives exactly once, in order per (sender thread, destination queue), intact.
///
/// Run it as the command of `multigrain launch --config FILE -- multigrain selftest` (or
/// under srun). Clusters on one machine use shared memory unless `ini.substrate = "udp"`;
/// `[faults]` in the config injects drops, duplicates, reordering and corruption into the
/// INIs' datagrams to test the sliding window.
#[derive(Args, Debug)]
struct SelftestArgs {
    /// The job's TOML file (default: $MULTIGRAIN_CONFIG, set by `multigrain launch`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Change one configuration value, e.g. `--set ini.policy=round-robin --set
    /// local.clusters=4 --set cluster.1.threads=2` (repeatable; later wins). Checked like the
    /// file; errors name the flag.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<Override>,
    /// Express messages from each cluster to each other cluster.
    #[arg(long, default_value_t = 100_000)]
    express: u64,
    /// 4 KiB Tag-On messages from each cluster to each other cluster.
    #[arg(long, default_value_t = 10_000)]
    tag_on: u64,
    /// Fail if not done after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// Print each INI's statistics at the end (paper 002 Tables 5.3/5.4).
    #[arg(long)]
    stats: bool,
    /// Write each INI's statistics as JSON to this file.
    #[arg(long, value_name = "FILE")]
    stats_json: Option<PathBuf>,
}

/// Start one process per cluster of a job, locally or over ssh.
///
/// Every cluster runs COMMAND with MULTIGRAIN_CLUSTER_ID, MULTIGRAIN_CLUSTERS,
/// MULTIGRAIN_COORDINATOR (host:port of cluster 0's coordinator; a free port is picked when
/// cluster 0's port is 0) and MULTIGRAIN_CONFIG (the config's absolute path) set. Clusters on
/// loopback hosts run here (a COMMAND named `multigrain` runs this executable); the others run
/// as `SSH HOST 'cd CWD && exec env VAR=... COMMAND'`. Their output lines are prefixed with
/// `[cN] `.
///
/// Two or more clusters started here with inline INIs (`ini.inline`, the default) are each
/// bound to their own share of the CPUs launch may use (its own mask, so `taskset -c 0-7
/// multigrain launch …` confines them all), in proportion to their threads, as `mpirun
/// --bind-to core` places ranks; while every compute thread has a CPU, each cluster's
/// protocol thread is bound to the other clusters' shares (apart), where the threads that
/// wait for its answers run. Each cluster's launch line names its CPUs. `launch.cpu_bind =
/// "split"` in the config (or `--set launch.cpu_bind=split` with `run`) always splits with
/// the protocol threads at home, `"apart"` always places them apart, `"none"` leaves
/// placement to the kernel. Clusters started over ssh on a host that two or
/// more clusters name follow the same rule there: each binds itself to its share of that
/// host's CPUs (launch tells it its place in MULTIGRAIN_CPU_SHARE).
///
/// If a cluster fails, the others learn it through the control plane and exit. A cluster that
/// dies before the job started (before it reached cluster 0's coordinator, or as the
/// coordinator before the others reached it) is seen only by launch: it tells the `multigrain`
/// clusters still joining (on their stdin), which stop at once naming it and its last error.
/// Clusters still running peer_timeout + grace later get SIGTERM, then SIGKILL after grace. launch exits
/// non-zero naming the failed clusters and how they ended. Ctrl-C or SIGTERM stops every
/// cluster (SIGTERM to each one's process group, SIGKILL after grace; a second Ctrl-C kills at
/// once) and exits with 128 + the signal. Every cluster runs in its own process group and dies
/// with the launcher, even if the launcher is killed (PR_SET_PDEATHSIG).
///
/// Under Slurm or an MPI launcher no launcher is needed: `srun -n 4 multigrain hello --config
/// job.toml` works when cluster 0 has a fixed port in the config (their binding options
/// apply: `srun --cpu-bind=cores`, `mpirun --bind-to core`).
#[derive(Args, Debug)]
#[command(
    after_help = "Example: multigrain launch --config cluster-config/examples/4x1.toml -- multigrain hello"
)]
struct LaunchArgs {
    /// The job's TOML file (see cluster-config/examples/).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Change one configuration value, e.g. `--set ini.policy=round-robin --set
    /// local.clusters=4 --set cluster.1.threads=2` (repeatable; later wins). Checked like the
    /// file; errors name the flag. The clusters read the resolved job from a temporary
    /// file, so every cluster must run on this host.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<Override>,
    /// Command prefix that runs a command on a remote host, split at whitespace; overrides the
    /// config's `launch.ssh` (default `ssh -o BatchMode=yes`).
    #[arg(long, value_name = "CMD")]
    ssh: Option<String>,
    /// Milliseconds between SIGTERM and SIGKILL, and added to peer_timeout before stragglers
    /// are stopped after a failure.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    grace_ms: u64,
    /// The command every cluster runs, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Join the job's control plane, print every cluster (from cluster 0), pass a barrier, finish.
///
/// Run it under `multigrain launch --config FILE -- multigrain hello`, or one process per
/// cluster under `srun`/`mpirun`. If another cluster fails it prints
/// `multigrain: error: cluster N failed: REASON` and exits non-zero.
#[derive(Args, Debug)]
struct HelloArgs {
    /// The job's TOML file; default: $MULTIGRAIN_CONFIG (set by `multigrain launch`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Change one configuration value, e.g. `--set ini.policy=round-robin --set
    /// local.clusters=4 --set cluster.1.threads=2` (repeatable; later wins). Checked like the
    /// file; errors name the flag.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<Override>,
    /// After the barrier, wait this many milliseconds (watching for failures) before finishing.
    #[arg(long, value_name = "N", default_value_t = 0)]
    sleep_ms: u64,
    /// Fail on purpose after the barrier (and the sleep): report `abort` and exit non-zero.
    /// `--fail` alone fails every cluster; `--fail=N` only cluster N.
    #[arg(long, value_name = "CLUSTER", num_args = 0..=1, require_equals = true)]
    fail: Option<Option<usize>>,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// The message layer: Express latency and throughput, Tag-On vs Basic, cross-process.
    ///
    /// Each row is measured --samples times, alternating with its baseline round by round
    /// (A/B/A/B…), and reported as median and interquartile range (p25–p75); a row's ratio
    /// is the median of the per-pair ratios (sample i / baseline sample i) with their
    /// p25–p75, so that a change of the machine's speed regime between samples cannot flip
    /// a verdict. The machine should be otherwise idle: ping-pong needs both threads on
    /// their own cores.
    Messaging(BenchMessagingArgs),
    /// The inter-cluster path on loopback: Express latency through INIs beside raw UDP,
    /// and 4 KiB Tag-On throughput with 1 and 2 INIs per cluster.
    ///
    /// The raw-UDP baselines ping-pong 68-byte (an Express message's datagram) and 8-byte
    /// datagrams between two threads pinned to different CPUs, busy-polled (non-blocking
    /// recv in a spin loop: the baseline the INIs are held to, target Express one-way ≤
    /// 1.5 × busy-polled UDP one-way) and, as the weak baseline, with blocking sockets
    /// (every arrival wakes a sleeping thread). One-way = round trip ÷ 2. Samples of each
    /// row alternate with its baseline's; ratios are medians of per-pair ratios.
    Net(BenchNetArgs),
    /// The DSM runtime: fault service, lock hand-off, barrier, write fault, release cost
    /// per page and diff throughput, beside baselines measured in the same run.
    ///
    /// Baselines: UDP round trip of 8 bytes busy-polled (and blocking, the weak
    /// baseline; and busy-polled with a 4 KiB answer, a page fetch's shape), a bare
    /// userfaultfd fault, a 4 KiB copy, an Express round trip over shared memory between
    /// two processes, a one-way bulk message of 256 bytes (about what a hand-off sends)
    /// between the same processes, and one-way Express through INIs; the shared-memory
    /// hand-off is also shown against its data path (that bulk message plus a page
    /// diff's encoding and application), and the polled fault through INIs against the
    /// round trip with the 4 KiB answer plus the bare fault. Targets:
    /// remote read fault via INIs ≤ 1.5 × (busy UDP round trip + bare fault); over shared
    /// memory ≤ 1.5 × (bare fault + 4 KiB copy + Express round trip); lock hand-off
    /// between two clusters, each holder checking and rewriting the 64 bytes the lock
    /// protects, ≤ 2 × one-way Express + 1 µs over shared memory and ≤ 1.5 × one-way
    /// Express through INIs over UDP; for hlrc and sc. A barrier of the two clusters with
    /// nothing written between barriers (the synchronization alone) is shown against a
    /// round trip of the same substrate (Express over shared memory; twice the one-way
    /// Express through INIs), without a target. Every kernel runs once per round
    /// (--samples rounds of --ops/--samples operations each), so each row alternates
    /// with its baselines; a composite baseline is summed round by round, and ratios are
    /// medians of per-pair ratios. Ping-pongs, hand-offs and barriers are timed after 16
    /// untimed ones each round (warm caches, awake INI threads).
    Dsm(BenchDsmArgs),
    Apps(commands::bench_apps::BenchAppsArgs),
    /// Paper 002 chapter 6's contention model against a synthetic application: N client
    /// threads per INI, predicted and measured mean INI queue length and cycle time.
    ///
    /// For N = 1 ..= --threads-max, N compute threads in cluster 0 each compute for W µs
    /// (--work spin: busy; sleep: the CPU is left to others), then make a blocking
    /// Express request through the INIs (one dedicated INI thread per cluster, UDP on
    /// loopback) to a server thread in cluster 1, which replies. The model's inputs (W, o,
    /// O, l, L) are calibrated from the N = 1 runs; each row shows the measured INI queue
    /// length (from the INI traces) and cycle time beside equations 6.1–6.10 and the exact
    /// MVA of the same network, the relative error, and whether Q ≤ N. Rows whose threads
    /// (N clients + server + 2 INIs) outnumber the cores are marked oversubscribed.
    Mva(BenchMvaArgs),
}

#[derive(Args, Debug)]
struct BenchMvaArgs {
    /// Largest number of client threads per INI (rows N = 1 ..= this).
    #[arg(long, default_value_t = commands::bench_mva::DEFAULT_THREADS_MAX)]
    threads_max: usize,
    #[command(flatten)]
    workload: commands::bench_mva::WorkloadArgs,
    /// Timed requests per client thread per run.
    #[arg(long, default_value_t = commands::bench_mva::DEFAULT_REQUESTS)]
    requests: u64,
    /// Runs per N (median and min–max shown).
    #[arg(long, default_value_t = commands::bench_mva::DEFAULT_SAMPLES)]
    samples: usize,
    /// Also write the report as JSON to this file (`-`: standard output; the table goes
    /// to standard error).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct BenchDsmArgs {
    /// Operations timed per row, split evenly over its samples (at least --samples, at
    /// most 8192: the local-fault row touches each home page once).
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Samples per row (at least 3): rounds in which every kernel runs once, so each row
    /// alternates with its baselines.
    #[arg(long, default_value_t = 10)]
    samples: usize,
    /// Also write the rows as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct BenchNetArgs {
    /// Samples per row (at least 3).
    #[arg(long, default_value_t = 7)]
    samples: usize,
    /// Round trips per latency sample.
    #[arg(long, default_value_t = 5_000)]
    round_trips: u64,
    /// 4 KiB pages per throughput sample.
    #[arg(long, default_value_t = 20_000)]
    pages: u64,
    /// Also write the rows as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
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
        /// Change one configuration value, e.g. `--set ini.policy=round-robin --set
        /// local.clusters=4 --set cluster.1.threads=2` (repeatable; later wins). Checked like the
        /// file; errors name the flag.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<Override>,
    },
    /// Print a topology file as a table of clusters, hosts, ports, threads, INIs, policy.
    Show {
        /// The TOML file (see cluster-config/examples/).
        file: PathBuf,
        /// Change one configuration value, e.g. `--set ini.policy=round-robin --set
        /// local.clusters=4 --set cluster.1.threads=2` (repeatable; later wins). Checked like the
        /// file; errors name the flag.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<Override>,
    },
}

#[derive(Subcommand, Debug)]
enum TraceCommand {
    /// Summarize the trace files of one job (one per cluster): per INI the message length,
    /// time in the INI, queue length seen by arrivals and utilization (paper 002 Tables
    /// 5.3/5.4); per cluster the mis-scheduled time rate and count rate (Tables 5.6/5.7).
    Summarize {
        /// The clusters' trace files (`MGTRACE1` format; one per cluster of the job).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Also write the summary as JSON to this file (`-`: standard output instead of
        /// the tables).
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
}

fn main() {
    // A re-executed copy of this binary may be the peer of a cross-process benchmark.
    if multigrain_bench::cross_process::run_peer_if_requested() {
        return;
    }
    let cli = Cli::parse();
    // Before any thread exists: every thread inherits the mask.
    let bound = launch::self_bind::bind_self();
    launch::spawn::watch_stdin();
    if let Some(choice) = cli.launcher {
        multigrain_cluster_config::set_launcher_choice(choice);
    }
    progress::set_quiet(cli.quiet);
    logging::init(logging::filter_for(cli.verbose, cli.quiet, |k| {
        std::env::var(k).ok().filter(|v| !v.is_empty())
    }));
    launch::self_bind::log_outcome(bound.as_ref());
    if matches!(
        cli.command,
        Command::Run(_) | Command::Hello(_) | Command::Selftest(_)
    ) {
        launch::step_notice::watch();
    }
    if let Err(e) = run(cli) {
        if let Some(launch::Interrupted(signal)) = e.downcast_ref::<launch::Interrupted>() {
            std::process::exit(128 + *signal as i32);
        }
        logging::print_error(&e);
        launch::step_notice::tell_step();
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bench(BenchCommand::Messaging(a)) => commands::bench_messaging::run(
            commands::bench_messaging::Options {
                samples: a.samples,
                round_trips: a.round_trips,
                messages: a.messages,
                pages: a.pages,
                cross_process: !a.no_cross_process,
            },
            a.json.as_deref(),
        ),
        Command::Bench(BenchCommand::Dsm(a)) => commands::bench_dsm::run(
            commands::bench_dsm::Options {
                ops: a.ops,
                samples: a.samples,
            },
            a.json.as_deref(),
        ),
        Command::Bench(BenchCommand::Net(a)) => commands::bench_net::run(
            commands::bench_net::Options {
                samples: a.samples,
                round_trips: a.round_trips,
                pages: a.pages,
            },
            a.json.as_deref(),
        ),
        Command::Bench(BenchCommand::Apps(a)) => commands::bench_apps::run(&a),
        Command::Bench(BenchCommand::Mva(a)) => commands::bench_mva::main(
            &commands::bench_mva::Options::new(a.threads_max, a.requests, a.samples, &a.workload),
            a.json.as_deref(),
        ),
        Command::Selftest(a) => {
            let cfg = commands::choose_job(a.config.as_deref(), &a.set)?.cfg;
            let opts = commands::selftest::Options {
                express: a.express,
                tag_on: a.tag_on,
                timeout: std::time::Duration::from_secs(a.timeout_s),
            };
            commands::selftest::run(&cfg, opts, a.stats, a.stats_json.as_deref())
        }
        Command::Config(ConfigCommand::Check { file, set }) => commands::config::check(&file, &set),
        Command::Config(ConfigCommand::Show { file, set }) => commands::config::show(&file, &set),
        Command::Launch(a) => launch::run(launch::Options {
            config: a.config,
            set: a.set,
            ssh: a.ssh,
            grace: std::time::Duration::from_millis(a.grace_ms),
            command: a.command,
            key_dir: None,
        }),
        Command::Run(a) => commands::run::run(a),
        Command::Experiment(a) => commands::experiment::run(&a),
        Command::Trace(TraceCommand::Summarize { files, json }) => {
            commands::trace::summarize_files(&files, json.as_deref())
        }
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "multigrain",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Man { out } => {
            use anyhow::Context as _;
            use clap::CommandFactory as _;
            std::fs::create_dir_all(&out)
                .with_context(|| format!("--out: cannot create {}", out.display()))?;
            clap_mangen::generate_to(Cli::command(), &out)
                .with_context(|| format!("--out: cannot write man pages into {}", out.display()))?;
            println!("man pages written to {}", out.display());
            Ok(())
        }
        Command::Hello(a) => commands::hello::run(&commands::hello::Options {
            config: a.config,
            set: a.set,
            sleep: std::time::Duration::from_millis(a.sleep_ms),
            fail: a.fail,
        }),
    }
}
