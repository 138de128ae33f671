//! `multigrain run water | em3d | conformance`: the applications on the DSM, or on
//! their sequential reference (`--sequential`), or on plain threads in one process
//! (`--threads N`).
//!
//! A DSM run started by hand spawns its cluster processes ([`spawn`]); a process started
//! by `multigrain launch` or by a launcher with rank variables (srun, mpirun) is one
//! cluster of the job ([`cluster`]). Cluster 0 reports: the app's output (Water's
//! energies in SPLASH's layout, EM3D's checksum), the run time and the DSM statistics
//! ([`report`]); progress goes to stderr ([`watch`]).

pub mod cluster;
pub mod meta;
pub mod report;
pub mod spawn;
pub mod watch;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use multigrain_apps::progress::Progress;
use multigrain_apps::team::{Runtime, Team, Topology};
use multigrain_apps::threads::ThreadsRuntime;
use multigrain_apps::{conformance, em3d, water};
use multigrain_cluster_config::{JobConfig, Override, detect_rank_from_env};
use multigrain_messaging::control::ENV_CLUSTER;
use report::{Backend, CheckResult, Outcome, Report};
use std::path::{Path, PathBuf};
use std::time::Instant;
use watch::Display;

/// The progress socket in a `--report-to` directory.
pub const SOCKET_FILE: &str = "progress.sock";
/// Cluster 0's report in a `--report-to` directory.
pub const RESULT_FILE: &str = "result.json";

/// Run Water or EM3D on the DSM (or sequentially, or on plain threads).
///
/// With no other argument, `multigrain run water` runs on the embedded default job: 2
/// cluster processes × 2 compute threads on this machine, talking through their INIs over
/// UDP loopback. It starts the cluster processes itself (as `multigrain launch` would),
/// shows cluster 0's progress, and prints cluster 0's report: the app's output, the run
/// time, and the DSM statistics (faults, fetches, diffs, messages by kind, INI
/// utilization). Messages of the cluster processes themselves are prefixed `[cN]`.
///
/// `--config FILE` runs any topology. Under `multigrain launch --config FILE -- multigrain
/// run water`, or one process per cluster under srun/mpirun, each process is one cluster
/// and cluster 0 prints the report. A cluster that fails before the job started stops the
/// others at once: under `launch` through their stdin, under srun by signalling its step
/// (`scancel --signal=USR1`); use `srun -K` so that Slurm also stops the step for a task
/// killed outright. Exit code 3: another cluster failed (this one stopped because of it).
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  multigrain run water\n  multigrain run em3d --config cluster-config/examples/4x1.toml --layout good\n  multigrain run water --sequential --velocities random.in --molecules 512 --steps 3\n  multigrain launch --config job.toml -- multigrain run water --steps 10"
)]
pub struct RunArgs {
    /// The application.
    #[command(subcommand)]
    pub app: AppCommand,
}

/// The applications of `multigrain run`.
#[derive(Subcommand, Debug)]
pub enum AppCommand {
    /// SPLASH-2 Water-Nsquared: molecular dynamics of water; prints the energies per step
    /// in SPLASH's layout.
    Water(WaterArgs),
    /// EM3D: wave propagation on a bipartite graph of E and H nodes; prints a checksum of
    /// the final fields (bitwise equal on every topology).
    Em3d(Em3dArgs),
    /// The runtime conformance suite (the guarantees the apps rely on: results in thread
    /// order, zeroed allocations, barriers publish writes, locks serialise updates) on
    /// the DSM of a topology, or on plain threads with --threads.
    Conformance(CommonArgs),
    /// (Testing) An application deadlock: every thread takes the same lock and waits
    /// at a barrier while holding it. It ends only through the progress watchdog
    /// (`job.progress_timeout_ms`), whose report it exists to show and test.
    #[command(hide = true)]
    Deadlock(CommonArgs),
    /// (Testing) The job's last compute thread panics after a first barrier; the others
    /// wait at the next one. The job must fail everywhere, naming the panic, and leave
    /// no process, shared-memory segment or scratch file behind.
    #[command(hide = true)]
    Panic(CommonArgs),
}

/// Where to run; shared by every app.
#[derive(Args, Debug)]
pub struct CommonArgs {
    /// The job's topology (TOML, see cluster-config/examples/). Default: $MULTIGRAIN_CONFIG
    /// in a cluster process started by `multigrain launch`, else the embedded 2×2 job.
    #[arg(long, value_name = "FILE", conflicts_with = "threads")]
    pub config: Option<PathBuf>,
    /// Change one configuration value, e.g. `--set ini.policy=round-robin --set
    /// local.clusters=4 --set cluster.1.threads=2` (repeatable; later wins). Checked like the
    /// file; errors name the flag.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<Override>,
    /// Run the sequential reference in this process, without the DSM.
    #[arg(long, conflicts_with = "threads")]
    pub sequential: bool,
    /// Run on N plain threads in this process (hardware shared memory, no DSM).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Also write the results and statistics as JSON to FILE (`-`: to stdout, with the
    /// text report on stderr). The JSON carries `meta`: schema_version, multigrain_version,
    /// timestamp (RFC 3339, UTC), host, cluster_hosts, argv and the resolved config (TOML).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// (Internal) the spawning process's directory for cluster 0's progress and report.
    #[arg(long, value_name = "DIR", hide = true)]
    pub report_to: Option<PathBuf>,
}

/// Water's parameters: SPLASH's input deck and/or flags (flags win).
#[derive(Args, Debug)]
pub struct WaterArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// SPLASH input deck: `TSTEP NMOL NSTEP NORDER / NSAVE NRST NPRINT NFMC / NumProcs
    /// CUTOFF` (NumProcs is ignored: the topology decides).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Number of molecules (NMOL): a perfect cube such as 343, 512, 4096 or 8000
    /// [default: 343].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    molecules: Option<u64>,
    /// Time steps (NSTEP) [default: 2].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    steps: Option<u64>,
    /// Time step in seconds (TSTEP) [default: 1.5e-16].
    #[arg(long, value_name = "SECONDS")]
    timestep: Option<f64>,
    /// Spherical cutoff radius in Å (CUTOFF; 0 = half the box) [default: 6.212752].
    #[arg(long, value_name = "ANGSTROM")]
    cutoff: Option<f64>,
    /// Print (and compute) the energies every N steps (NPRINT) [default: 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    print_every: Option<u64>,
    /// Predictor-corrector order (NORDER), 3 to 6 [default: 6].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(3..=6))]
    order: Option<u64>,
    /// Initial velocities from SPLASH's `random.in` (reproduces SPLASH's energies; enough
    /// numbers for 588 molecules). Default: a seeded generator (any molecule count).
    #[arg(long, value_name = "PATH", conflicts_with = "seed")]
    velocities: Option<PathBuf>,
    /// Seed of the velocity generator [default: 0x53504c4153483200].
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
}

/// EM3D's layout flag.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum LayoutArg {
    /// Partition p on thread p: clusters own slabs of the processor grid.
    Naive,
    /// Clusters own compact blocks of the grid (fewer cross-cluster edges).
    Good,
}

/// EM3D's variant flag.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum VariantArg {
    /// Pull: read neighbour values from their owners through the DSM.
    Read,
    /// Push: owners write updated values into consumers' boundary copies, then barrier.
    Write,
}

/// EM3D's parameters.
#[derive(Args, Debug)]
pub struct Em3dArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// E nodes (and as many H nodes) per thread.
    #[arg(long, value_name = "N", default_value_t = 2500, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    nodes_per_thread: u64,
    /// Edges per node.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    degree: u64,
    /// Percentage of edges to another thread's partition, 0 to 100.
    #[arg(long, value_name = "PCT", default_value_t = 40, value_parser = clap::value_parser!(u32).range(0..=100))]
    percent_remote: u32,
    /// Where each cluster's threads sit in the processor grid (paper 000 §5.2).
    #[arg(long, value_enum, default_value_t = LayoutArg::Naive)]
    layout: LayoutArg,
    /// How values reach the threads that need them (paper 001 §4.1).
    #[arg(long, value_enum, default_value_t = VariantArg::Read)]
    variant: VariantArg,
    /// Iterations (an E phase and an H phase each).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    iterations: u64,
    /// Seed of the graph and the initial values.
    #[arg(long, value_name = "N", default_value_t = 0x454d_3344)]
    seed: u64,
    /// With --sequential: the number of partitions of the graph (the graph depends on
    /// it). Default: the thread count of the topology, so that the result equals the DSM
    /// run's.
    #[arg(long, value_name = "P", requires = "sequential", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    partitions: Option<u64>,
}

/// A resolved application and its parameters.
#[derive(Clone, Debug)]
pub enum AppSpec {
    /// Water-Nsquared.
    Water(water::Params),
    /// EM3D; `partitions` only for the sequential reference.
    Em3d {
        /// Parameters.
        params: em3d::Params,
        /// `--partitions`.
        partitions: Option<usize>,
    },
    /// The conformance suite.
    Conformance,
    /// The deliberate deadlock (`multigrain run deadlock`).
    Deadlock,
    /// The deliberate panic (`multigrain run panic`).
    Panic,
}

impl AppSpec {
    /// The app's name.
    pub fn name(&self) -> &'static str {
        match self {
            AppSpec::Water(_) => "water",
            AppSpec::Em3d { .. } => "em3d",
            AppSpec::Conformance => "conformance",
            AppSpec::Deadlock => "deadlock",
            AppSpec::Panic => "panic",
        }
    }

    /// The arguments after `multigrain run` that make a cluster process run exactly this.
    pub fn child_args(&self) -> Vec<String> {
        let mut a = vec![self.name().to_owned()];
        let mut flag = |k: &str, v: String| {
            a.push(format!("--{k}"));
            a.push(v);
        };
        match self {
            AppSpec::Water(p) => {
                flag("molecules", p.molecules.to_string());
                flag("steps", p.steps.to_string());
                // `{:?}` prints the shortest text that parses back to the same f64.
                flag("timestep", format!("{:?}", p.timestep_s));
                flag("cutoff", format!("{:?}", p.cutoff_angstrom));
                flag("print-every", p.print_every.to_string());
                flag("order", p.order.to_string());
                match &p.velocities {
                    water::VelocitySource::File(f) => {
                        flag("velocities", f.to_string_lossy().into_owned())
                    }
                    water::VelocitySource::Seeded(s) => flag("seed", s.to_string()),
                }
            }
            AppSpec::Em3d { params: p, .. } => {
                flag("nodes-per-thread", p.nodes_per_thread.to_string());
                flag("degree", p.degree.to_string());
                flag("percent-remote", p.percent_remote.to_string());
                flag(
                    "layout",
                    match p.layout {
                        em3d::Layout::Naive => "naive",
                        em3d::Layout::Good => "good",
                    }
                    .into(),
                );
                flag(
                    "variant",
                    match p.variant {
                        em3d::Variant::Read => "read",
                        em3d::Variant::Write => "write",
                    }
                    .into(),
                );
                flag("iterations", p.iterations.to_string());
                flag("seed", p.seed.to_string());
            }
            AppSpec::Conformance | AppSpec::Deadlock | AppSpec::Panic => {}
        }
        a
    }

    /// Checks what can be checked before any process starts, on `topology`.
    fn precheck(&self, topology: &Topology) -> Result<()> {
        if let AppSpec::Em3d { params, .. } = self {
            em3d::check(params, topology).map_err(|e| match e {
                em3d::Em3dError::LayoutUnsupported(why) => {
                    anyhow!("--layout good does not fit this topology: {why}")
                }
                other => anyhow!(other),
            })?;
        }
        Ok(())
    }

    /// Runs the parallel program on `rt` (thread 0 reports progress to `progress`).
    pub fn run_on<R: Runtime>(&self, rt: &mut R, progress: &dyn Progress) -> Result<Outcome> {
        Ok(match self {
            AppSpec::Water(p) => Outcome::Water {
                params: p.clone(),
                result: water::run_parallel_with(rt, p, progress)?,
            },
            AppSpec::Em3d { params, .. } => Outcome::Em3d {
                params: params.clone(),
                result: em3d::run_parallel_with(rt, params, progress)?,
            },
            AppSpec::Conformance => {
                type Check<R> = (&'static str, fn(&mut R));
                let checks: [Check<R>; 4] = [
                    (
                        "results_in_thread_order",
                        conformance::results_in_thread_order::<R>,
                    ),
                    ("fresh_allocations", conformance::fresh_allocations::<R>),
                    ("barrier_publishes_writes", |rt| {
                        conformance::barrier_publishes_writes(rt, 50)
                    }),
                    ("locks_serialise_updates", |rt| {
                        conformance::locks_serialise_updates(rt, 500)
                    }),
                ];
                progress.begin("conformance checks", checks.len() as u64);
                let mut done = Vec::new();
                for (k, (name, check)) in checks.iter().enumerate() {
                    let t = Instant::now();
                    check(rt);
                    done.push(CheckResult {
                        name: (*name).to_owned(),
                        seconds: t.elapsed().as_secs_f64(),
                    });
                    progress.advance(k as u64 + 1);
                }
                Outcome::Conformance { checks: done }
            }
            AppSpec::Deadlock => {
                if rt.topology().num_threads() < 2 {
                    bail!("a deadlock needs at least 2 threads");
                }
                let lock = rt.alloc_locks(1)?;
                progress.begin("deadlocked (ends through job.progress_timeout_ms)", 0);
                rt.run(|team| {
                    // Whoever holds the lock waits at the barrier; everyone else waits
                    // for the lock.
                    let _held = team.lock(lock);
                    team.barrier();
                })?;
                bail!("the deadlock did not happen")
            }
            AppSpec::Panic => {
                let last = rt.topology().num_threads() - 1;
                progress.begin("a compute thread panics", 0);
                rt.run(|team| {
                    team.barrier();
                    if team.thread_id() == last {
                        panic!("deliberate panic of compute thread {last} (multigrain run panic)");
                    }
                    team.barrier();
                })?;
                bail!("the panic did not stop the job")
            }
        })
    }

    /// Runs the sequential reference (EM3D on the graph of `threads` partitions unless
    /// `--partitions` says otherwise).
    fn run_sequential(&self, threads: usize, progress: &dyn Progress) -> Result<Outcome> {
        Ok(match self {
            AppSpec::Water(p) => Outcome::Water {
                params: p.clone(),
                result: water::run_sequential_with(p, progress)?,
            },
            AppSpec::Em3d { params, partitions } => Outcome::Em3d {
                params: params.clone(),
                result: em3d::run_sequential_with(params, partitions.unwrap_or(threads), progress)?,
            },
            AppSpec::Conformance => bail!(
                "the conformance suite checks a parallel runtime: drop --sequential (and use --threads N or a --config)"
            ),
            AppSpec::Deadlock => bail!("the deadlock needs a parallel runtime: drop --sequential"),
            AppSpec::Panic => bail!("the panic needs a parallel runtime: drop --sequential"),
        })
    }
}

/// Water's parameters from `--input` and the flags, checked (the velocity file read).
fn water_params(a: &WaterArgs) -> Result<water::Params> {
    let mut p = match &a.input {
        Some(deck) => {
            water::parse_input_file(deck)
                .context("--input: not a usable SPLASH Water input deck")?
                .params
        }
        None => water::Params::default(),
    };
    if let Some(m) = a.molecules {
        p.molecules = usize::try_from(m)?;
    }
    if let Some(s) = a.steps {
        p.steps = usize::try_from(s)?;
    }
    if let Some(t) = a.timestep {
        if !(t.is_finite() && t > 0.0) {
            bail!("--timestep {t:?}: must be a positive number of seconds, e.g. 1.5e-16");
        }
        p.timestep_s = t;
    }
    if let Some(c) = a.cutoff {
        if !(c.is_finite() && c >= 0.0) {
            bail!("--cutoff {c:?}: must be 0 (half the box) or a positive radius in Å");
        }
        p.cutoff_angstrom = c;
    }
    if let Some(n) = a.print_every {
        p.print_every = usize::try_from(n)?;
    }
    if let Some(o) = a.order {
        p.order = usize::try_from(o)?;
    }
    if let Some(path) = &a.velocities {
        // Cluster processes may run elsewhere in the file system: pass an absolute path.
        let abs = std::fs::canonicalize(path).with_context(|| {
            format!(
                "--velocities {}: cannot open the velocity file",
                path.display()
            )
        })?;
        p.velocities = water::VelocitySource::File(abs);
    } else if let Some(seed) = a.seed {
        p.velocities = water::VelocitySource::Seeded(seed);
    }
    p.check_inputs().map_err(|e| match e {
        water::WaterError::InvalidParams(why) if why.contains("cubic lattice") => {
            let src = match (&a.input, a.molecules) {
                (Some(deck), None) => format!("--input {}: NMOL", deck.display()),
                _ => "--molecules".to_owned(),
            };
            anyhow!("{src}: {why}")
        }
        water::WaterError::InvalidParams(why) => anyhow!("{why}"),
        other => anyhow!(other).context("--velocities: the velocity file is not usable"),
    })?;
    Ok(p)
}

fn em3d_spec(a: &Em3dArgs) -> Result<AppSpec> {
    let params = em3d::Params {
        nodes_per_thread: usize::try_from(a.nodes_per_thread)?,
        degree: usize::try_from(a.degree)?,
        percent_remote: a.percent_remote,
        layout: match a.layout {
            LayoutArg::Naive => em3d::Layout::Naive,
            LayoutArg::Good => em3d::Layout::Good,
        },
        variant: match a.variant {
            VariantArg::Read => em3d::Variant::Read,
            VariantArg::Write => em3d::Variant::Write,
        },
        iterations: usize::try_from(a.iterations)?,
        seed: a.seed,
    };
    params.validate()?;
    Ok(AppSpec::Em3d {
        params,
        partitions: a.partitions.map(usize::try_from).transpose()?,
    })
}

/// Prints `report` and writes it as JSON to `json` if given, with the run's [`meta::Meta`]
/// (`cfg`: the resolved job of a DSM run). `json` = `-` writes the JSON to stdout and the
/// text report to stderr, so that the JSON can be piped.
pub fn deliver(report: &Report, json: Option<&Path>, cfg: Option<&JobConfig>) -> Result<()> {
    #[derive(serde::Serialize)]
    struct WithMeta<'a> {
        meta: meta::Meta,
        #[serde(flatten)]
        report: &'a Report,
    }
    let to_stdout = json.is_some_and(|p| p.as_os_str() == "-");
    if to_stdout {
        eprint!("{}", report::render(report));
    } else {
        print!("{}", report::render(report));
    }
    if let Some(path) = json {
        let out = WithMeta {
            meta: meta::Meta::now(cfg),
            report,
        };
        let text = serde_json::to_string_pretty(&out)? + "\n";
        if to_stdout {
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
                .context("--json -: cannot write to stdout")?;
        } else {
            std::fs::write(path, text)
                .with_context(|| format!("--json: cannot write {}", path.display()))?;
        }
    }
    Ok(())
}

/// Whether a launcher started this process as one cluster of a job.
fn started_by_launcher() -> Result<bool> {
    Ok(std::env::var_os(ENV_CLUSTER).is_some()
        || detect_rank_from_env()
            .context("reading the launcher's rank variables")?
            .is_some())
}

/// The topology of `cfg` as the apps see it.
fn topology_of(cfg: &JobConfig) -> Result<Topology> {
    Ok(Topology::from_cluster_of(
        cfg.clusters
            .iter()
            .enumerate()
            .flat_map(|(c, spec)| std::iter::repeat_n(c, spec.threads))
            .collect(),
    )?)
}

fn dsm_backend(cfg: &JobConfig, label: String) -> Backend {
    Backend::Dsm {
        config: label,
        threads: cfg.clusters.iter().map(|c| c.threads).collect(),
        protocol: cfg.dsm.protocol.as_str().to_owned(),
        home: cfg.dsm.home.as_str().to_owned(),
        substrate: cfg.ini.substrate.as_str().to_owned(),
        inis: (0..cfg.clusters.len()).map(|c| cfg.inis_of(c)).collect(),
        policy: cfg.ini.policy.as_str().to_owned(),
    }
}

/// Runs `multigrain run`.
pub fn run(args: RunArgs) -> Result<()> {
    let (spec, common) = match &args.app {
        AppCommand::Water(a) => (AppSpec::Water(water_params(a)?), &a.common),
        AppCommand::Em3d(a) => (em3d_spec(a)?, &a.common),
        AppCommand::Conformance(c) => (AppSpec::Conformance, c),
        AppCommand::Deadlock(c) => (AppSpec::Deadlock, c),
        AppCommand::Panic(c) => (AppSpec::Panic, c),
    };
    let started = Instant::now();
    let json = common.json.as_deref();
    if let Some(t) = common.threads {
        let t = usize::try_from(t)?;
        let mut rt = ThreadsRuntime::new(t)?;
        // clap rejects --sequential and --config with --threads.
        let outcome = shown(spec.name(), |d| spec.run_on(&mut rt, d))?;
        return finish_local(Backend::Threads { threads: t }, outcome, started, json);
    }
    let launched = started_by_launcher()?;
    let super::ChosenJob {
        cfg,
        path: config_path,
        label,
    } = super::choose_job(common.config.as_deref(), &common.set)?;
    let label = std::iter::once(label)
        .chain(common.set.iter().map(Override::flag))
        .collect::<Vec<_>>()
        .join(" ");
    let topology = topology_of(&cfg)?;
    if common.sequential {
        let outcome = shown(spec.name(), |d| {
            spec.run_sequential(topology.num_threads(), d)
        })?;
        return finish_local(Backend::Sequential, outcome, started, json);
    }
    let backend = dsm_backend(&cfg, label);
    if launched {
        return cluster::run(
            &spec,
            &cfg,
            backend,
            &cluster::Delivery {
                report_to: common.report_to.as_deref(),
                json,
            },
        );
    }
    if common.report_to.is_some() {
        bail!(
            "--report-to is for cluster processes that `multigrain run` starts itself; this process was not started by a launcher"
        );
    }
    spec.precheck(&topology)?;
    // The cluster processes read the job from a file: with --set, the resolved one.
    spawn::run(&spec, &cfg, config_path.as_deref(), &common.set, json)
}

/// Runs `f` with its progress shown under `label`.
fn shown<T>(label: &str, f: impl FnOnce(&Display) -> Result<T>) -> Result<T> {
    let display = Display::new(label);
    let r = f(&display);
    match &r {
        Ok(_) => display.finish(),
        Err(_) => display.abandon(),
    }
    r
}

fn finish_local(
    backend: Backend,
    outcome: Outcome,
    started: Instant,
    json: Option<&Path>,
) -> Result<()> {
    let report = Report {
        backend,
        run_s: outcome.run_s(),
        outcome,
        wall_s: started.elapsed().as_secs_f64(),
        stats: None,
        inis: Vec::new(),
        trace: None,
    };
    deliver(&report, json, None)
}
