//! `multigrain bench apps`: the application comparisons of issue 10 — Water and EM3D
//! sequentially, on 2 plain threads and on the DSM topologies 2×1 over `shm`, 2×1 over
//! `udp`, 2×2 (the embedded default job) and 4×1 — with same-run baselines, speedups and
//! the issue's ratios against their targets.
//!
//! Every run is this executable's own `multigrain run water|em3d … --json FILE`, started
//! as a user would start it (launcher variables removed); its `run_s` (the computation,
//! not process start-up) is the sample, and its energies (Water) or checksum (EM3D) are
//! checked against the sequential reference of the same problem. Runs are interleaved
//! round by round: round *r* runs every configuration once, so a change of the machine's
//! speed regime affects every configuration alike, and every ratio is taken per round
//! (configuration A's run of round *r* against configuration B's run of round *r*).

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
/// sample is the run's `run_s` (the computation, not process start-up).
///
/// Runs are interleaved: round r runs every configuration once, so a change of the
/// machine's speed regime between rounds affects all configurations alike. Per
/// configuration the table shows the run time, median (min–max), and the speedup
/// against the sequential run of the same round, median (min–max). EM3D's graph grows
/// with the thread count (--em3d-nodes-per-thread is per thread), so its 4-thread
/// topologies are compared with a sequential run of the 4-partition graph, run as a
/// configuration of its own.
///
/// Then the ratios of issue 10, each taken per round (median (min–max) over the rounds),
/// with its target: (1) Water large on 2×1: speedup over shm ≥ 0.8 × the speedup of
/// --threads 2, over udp ≥ 0.6 ×; (2) Water small on 2×1: time ≤ 1.5 × that of
/// --threads 2 over shm, ≤ 3 × over udp; (3) on each Water problem, 2×2 no slower than
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

/// The applications of `bench apps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AppChoice {
    /// Water-Nsquared (both problem sizes).
    Water,
    /// EM3D.
    Em3d,
}

/// A DSM topology of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Topology {
    /// 2 clusters × 1 thread, shared memory between the cluster processes.
    #[serde(rename = "2x1-shm")]
    Shm2x1,
    /// 2 clusters × 1 thread, INIs over UDP loopback.
    #[serde(rename = "2x1-udp")]
    Udp2x1,
    /// The embedded default job: 2 clusters × 2 threads, INIs over UDP loopback.
    #[serde(rename = "2x2")]
    Udp2x2,
    /// 4 clusters × 1 thread, INIs over UDP loopback.
    #[serde(rename = "4x1")]
    Udp4x1,
}

impl Topology {
    /// Every topology, in table order.
    pub const ALL: [Topology; 4] = [
        Topology::Shm2x1,
        Topology::Udp2x1,
        Topology::Udp2x2,
        Topology::Udp4x1,
    ];

    /// Its name in --topologies.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Shm2x1 => "2x1-shm",
            Topology::Udp2x1 => "2x1-udp",
            Topology::Udp2x2 => "2x2",
            Topology::Udp4x1 => "4x1",
        }
    }

    /// Its label in the table.
    pub fn label(self) -> &'static str {
        match self {
            Topology::Shm2x1 => "DSM 2×1 shm",
            Topology::Udp2x1 => "DSM 2×1 udp",
            Topology::Udp2x2 => "DSM 2×2 udp (default job)",
            Topology::Udp4x1 => "DSM 4×1 udp",
        }
    }

    /// Compute threads of the job.
    pub fn threads(self) -> usize {
        match self {
            Topology::Shm2x1 | Topology::Udp2x1 => 2,
            Topology::Udp2x2 | Topology::Udp4x1 => 4,
        }
    }

    /// The configuration file the runs use; `None`: the embedded default job (no
    /// `--config`).
    pub fn config_toml(self) -> Option<String> {
        let (clusters, substrate) = match self {
            Topology::Shm2x1 => (2, "shm"),
            Topology::Udp2x1 => (2, "udp"),
            Topology::Udp4x1 => (4, "udp"),
            Topology::Udp2x2 => return None,
        };
        Some(format!(
            "# Written by `multigrain bench apps`: {clusters} clusters x 1 compute thread on this machine.\n\
             [job]\nname = \"bench-{name}\"\n\n\
             [local]\nclusters = {clusters}\nthreads = 1\n\n\
             [ini]\nsubstrate = \"{substrate}\"\nmtu = 8972\n",
            name = self.name()
        ))
    }
}

impl FromStr for Topology {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Topology::ALL
            .into_iter()
            .find(|t| t.name() == s.trim())
            .ok_or_else(|| {
                format!(
                    "unknown topology {s:?} (allowed: {})",
                    Topology::ALL.map(Topology::name).join(", ")
                )
            })
    }
}

/// clap's parser of one --topologies entry.
fn parse_topology(s: &str) -> Result<Topology, String> {
    s.parse()
}

/// A Water problem: molecules × time steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WaterSize {
    /// Molecules (a perfect cube).
    pub molecules: usize,
    /// Time steps.
    pub steps: usize,
}

/// A Water problem of --water-small/--water-large, or `None` for `none`.
pub type WaterChoice = Option<WaterSize>;

/// Parses `MOLECULESxSTEPS` (`x`, `X` or `×`), or `none`.
///
/// # Errors
/// A message naming the value and what is allowed.
pub fn parse_water_size(s: &str) -> Result<WaterChoice, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let usage = "expected MOLECULESxSTEPS such as 512x50, or none";
    let (m, st) = t
        .split_once(['x', 'X', '×'])
        .ok_or_else(|| format!("{s:?}: {usage}"))?;
    let molecules: usize = m
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: {m:?} is not a number of molecules; {usage}"))?;
    let steps: usize = st
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: {st:?} is not a number of steps; {usage}"))?;
    let side = (molecules as f64).cbrt().round() as usize;
    if molecules == 0 || side * side * side != molecules {
        return Err(format!(
            "{s:?}: {molecules} molecules is not a positive perfect cube (Water places molecules on a cubic lattice: 8, 27, 64, 125, 343, 512, 4096, …)"
        ));
    }
    if steps == 0 {
        return Err(format!("{s:?}: at least 1 time step"));
    }
    Ok(Some(WaterSize { molecules, steps }))
}

/// Which of Water's targets a problem carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaterRole {
    /// --water-small: target (2).
    Small,
    /// --water-large: target (1).
    Large,
}

/// One problem of the comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "app", rename_all = "kebab-case")]
pub enum Problem {
    /// Water-Nsquared.
    Water {
        /// Which targets apply.
        role: WaterRole,
        /// Its size.
        size: WaterSize,
    },
    /// EM3D.
    Em3d {
        /// E nodes per thread.
        nodes_per_thread: u64,
        /// Iterations.
        iterations: u64,
        /// `naive` or `good`.
        layout: String,
        /// `read` or `write`.
        variant: String,
    },
}

impl Problem {
    /// Its title in the table.
    pub fn title(&self) -> String {
        match self {
            Problem::Water { role, size } => format!(
                "Water {} molecules × {} step{} ({})",
                size.molecules,
                size.steps,
                if size.steps == 1 { "" } else { "s" },
                match role {
                    WaterRole::Small => "--water-small, issue-10 targets (2) and (3)",
                    WaterRole::Large => "--water-large, issue-10 targets (1) and (3)",
                }
            ),
            Problem::Em3d {
                nodes_per_thread,
                iterations,
                layout,
                variant,
            } => format!(
                "EM3D {layout} layout, {variant} variant, {nodes_per_thread} nodes per thread, {iterations} iterations (issue-10 target (4))"
            ),
        }
    }

    /// Arguments of `multigrain run` for the problem (app and its flags).
    fn app_args(&self) -> Vec<String> {
        let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        match self {
            Problem::Water { size, .. } => v(&[
                "water",
                "--molecules",
                &size.molecules.to_string(),
                "--steps",
                &size.steps.to_string(),
            ]),
            Problem::Em3d {
                nodes_per_thread,
                iterations,
                layout,
                variant,
            } => v(&[
                "em3d",
                "--nodes-per-thread",
                &nodes_per_thread.to_string(),
                "--iterations",
                &iterations.to_string(),
                "--layout",
                layout,
                "--variant",
                variant,
            ]),
        }
    }

    /// The configurations run for this problem on `topologies`, in table order; with
    /// `compare`, each DSM configuration is followed by its (B) twin.
    pub fn setups(&self, topologies: &[Topology], compare: bool) -> Vec<Setup> {
        let dsm = |threads: usize| -> Vec<Setup> {
            topologies
                .iter()
                .filter(|t| t.threads() == threads)
                .flat_map(|&topology| {
                    [false, true]
                        .into_iter()
                        .filter(move |&b| compare || !b)
                        .map(move |compared| Setup::Dsm { topology, compared })
                })
                .collect()
        };
        let (two, four) = (dsm(2), dsm(4));
        match self {
            Problem::Water { .. } => [
                vec![
                    Setup::Sequential { partitions: None },
                    Setup::Threads { threads: 2 },
                ],
                two,
                four,
            ]
            .concat(),
            Problem::Em3d { .. } => {
                let mut s = vec![
                    Setup::Sequential {
                        partitions: Some(2),
                    },
                    Setup::Threads { threads: 2 },
                ];
                s.extend(two);
                if !four.is_empty() {
                    s.push(Setup::Sequential {
                        partitions: Some(4),
                    });
                    s.extend(four);
                }
                s
            }
        }
    }

    /// The sequential configuration whose result and time `setup` is compared with.
    pub fn reference_of(&self, setup: Setup) -> Setup {
        match self {
            Problem::Water { .. } => Setup::Sequential { partitions: None },
            Problem::Em3d { .. } => Setup::Sequential {
                partitions: Some(match setup {
                    Setup::Sequential { partitions } => partitions.unwrap_or(2),
                    Setup::Threads { threads } => threads,
                    Setup::Dsm { topology, .. } => topology.threads(),
                }),
            },
        }
    }

    /// The issue-10 ratios of this problem, as far as its configurations were run.
    pub fn ratios(&self, setups: &[Setup]) -> Vec<RatioSpec> {
        let seq2 = self.reference_of(Setup::Threads { threads: 2 });
        let thr = Setup::Threads { threads: 2 };
        let shm = Setup::Dsm {
            topology: Topology::Shm2x1,
            compared: false,
        };
        let udp = Setup::Dsm {
            topology: Topology::Udp2x1,
            compared: false,
        };
        let r2x2 = Setup::Dsm {
            topology: Topology::Udp2x2,
            compared: false,
        };
        let r4x1 = Setup::Dsm {
            topology: Topology::Udp4x1,
            compared: false,
        };
        let spec =
            |id: &'static str, name: &str, num: Setup, den: Setup, target: Target| RatioSpec {
                id,
                name: name.to_owned(),
                numerator: num,
                denominator: den,
                target,
            };
        let mut all = Vec::new();
        match self {
            Problem::Water { role, .. } => {
                match role {
                    WaterRole::Large => {
                        all.push(spec(
                            "(1)",
                            "speedup of 2×1 shm / speedup of --threads 2 (= time of --threads 2 / time of 2×1 shm)",
                            thr,
                            shm,
                            Target::at_least(0.8, "≥ 0.8"),
                        ));
                        all.push(spec(
                            "(1)",
                            "speedup of 2×1 udp / speedup of --threads 2",
                            thr,
                            udp,
                            Target::at_least(0.6, "≥ 0.6"),
                        ));
                    }
                    WaterRole::Small => {
                        all.push(spec(
                            "(2)",
                            "time of 2×1 shm / time of --threads 2",
                            shm,
                            thr,
                            Target::at_most(1.5, "≤ 1.5"),
                        ));
                        all.push(spec(
                            "(2)",
                            "time of 2×1 udp / time of --threads 2",
                            udp,
                            thr,
                            Target::at_most(3.0, "≤ 3"),
                        ));
                    }
                }
                all.push(spec(
                    "(3)",
                    "time of 2×2 / time of 2×1 udp",
                    r2x2,
                    udp,
                    Target::at_most(1.0, "≤ 1 (no slower)"),
                ));
                all.push(spec(
                    "(3)",
                    "time of 4×1 / time of 2×1 udp",
                    r4x1,
                    udp,
                    Target::at_most(3.0, "≤ 3"),
                ));
            }
            Problem::Em3d { .. } => {
                all.push(spec(
                    "(4)",
                    "speedup of 2×1 shm / speedup of --threads 2 (= time of --threads 2 / time of 2×1 shm)",
                    thr,
                    shm,
                    Target::at_least(0.7, "≥ 0.7"),
                ));
                all.push(spec(
                    "(4)",
                    "time of 2×1 udp / time of --sequential (2 partitions)",
                    udp,
                    seq2,
                    Target::at_most(1.5, "≤ 1.5"),
                ));
            }
        }
        all.retain(|r| setups.contains(&r.numerator) && setups.contains(&r.denominator));
        all
    }
}

/// How one configuration runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Setup {
    /// `--sequential` (EM3D: on the graph of `partitions` partitions).
    Sequential {
        /// EM3D's `--partitions`.
        partitions: Option<usize>,
    },
    /// `--threads N`: plain threads in one process.
    Threads {
        /// Threads.
        threads: usize,
    },
    /// A DSM job.
    Dsm {
        /// Its topology.
        topology: Topology,
        /// Run with the `--compare` values too (the (B) row).
        compared: bool,
    },
}

impl Setup {
    /// Its label in the table.
    pub fn label(self) -> String {
        match self {
            Setup::Sequential { partitions: None } => "--sequential".to_owned(),
            Setup::Sequential {
                partitions: Some(p),
            } => format!("--sequential ({p} partitions)"),
            Setup::Threads { threads } => format!("--threads {threads}"),
            Setup::Dsm {
                topology,
                compared: false,
            } => topology.label().to_owned(),
            Setup::Dsm {
                topology,
                compared: true,
            } => format!("{} (B)", topology.label()),
        }
    }

    /// The flags after the app's: where it runs.
    fn args(self, configs: &Path) -> Vec<String> {
        match self {
            Setup::Sequential { partitions } => {
                let mut a = vec!["--sequential".to_owned()];
                if let Some(p) = partitions {
                    a.extend(["--partitions".to_owned(), p.to_string()]);
                }
                a
            }
            Setup::Threads { threads } => vec!["--threads".to_owned(), threads.to_string()],
            Setup::Dsm { topology, .. } => match topology.config_toml() {
                Some(_) => vec![
                    "--config".to_owned(),
                    config_file(configs, topology)
                        .to_string_lossy()
                        .into_owned(),
                ],
                None => Vec::new(),
            },
        }
    }
}

/// Where `topology`'s configuration file is written.
fn config_file(dir: &Path, topology: Topology) -> PathBuf {
    dir.join(format!("{}.toml", topology.name()))
}

/// A ratio of issue 10: per round, the time of `numerator` over that of `denominator`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RatioSpec {
    /// The issue's number of the target, e.g. `(1)`.
    pub id: &'static str,
    /// What the ratio is.
    pub name: String,
    /// The configuration whose time is divided.
    pub numerator: Setup,
    /// The configuration whose time divides.
    pub denominator: Setup,
    /// The target on the median per-round ratio.
    pub target: Target,
}

/// The settings of a `bench apps` run, checked.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Rounds.
    pub repeat: usize,
    /// Problems in table order.
    pub problems: Vec<Problem>,
    /// DSM topologies run.
    pub topologies: Vec<Topology>,
    /// Per-run time limit, s.
    pub timeout_s: u64,
    /// The `--set` values of every DSM run, `KEY=VALUE` as given.
    pub sets: Vec<String>,
    /// The `--compare` values of the (B) runs, `KEY=VALUE` as given (empty: no B
    /// runs).
    pub compare: Vec<String>,
}

/// Refuses a `--set` or `--compare` (`flag`) key that would change what a topology is.
fn check_set(flag: &str, o: &Override) -> Result<()> {
    let key = o.key.join(".");
    let topology_key = matches!(o.key.first().map(String::as_str), Some("local" | "cluster"))
        || key == "ini.substrate";
    if topology_key {
        bail!(
            "{flag} {}: {key} sets the topology, which each row of the tables fixes; \
             choose the rows with --topologies (allowed keys: those of [job], [ini] but \
             substrate, [dsm], [emulation], [faults], [launch])",
            o.assignment()
        );
    }
    Ok(())
}

impl Plan {
    /// Checks the flags and lays out the problems.
    ///
    /// # Errors
    /// A repeated topology, or nothing left to run.
    pub fn from_args(a: &BenchAppsArgs) -> Result<Plan> {
        let mut topologies = Vec::new();
        for &t in &a.topologies {
            if topologies.contains(&t) {
                bail!("--topologies: {} is named twice", t.name());
            }
            topologies.push(t);
        }
        if topologies.is_empty() {
            topologies = Topology::ALL.to_vec();
        }
        topologies.sort_by_key(|t| Topology::ALL.iter().position(|x| x == t));
        let mut problems = Vec::new();
        if a.only != Some(AppChoice::Em3d) {
            for (role, choice) in [
                (WaterRole::Small, a.water_small),
                (WaterRole::Large, a.water_large),
            ] {
                if let Some(size) = choice {
                    problems.push(Problem::Water { role, size });
                }
            }
            if problems.is_empty() && a.only == Some(AppChoice::Water) {
                bail!(
                    "--only water with --water-small none and --water-large none: nothing to run"
                );
            }
        }
        if a.only != Some(AppChoice::Water) {
            let p = Problem::Em3d {
                nodes_per_thread: a.em3d_nodes_per_thread,
                iterations: a.em3d_iterations,
                layout: a.em3d_layout.clone(),
                variant: a.em3d_variant.clone(),
            };
            problems.push(p);
        }
        if problems.is_empty() {
            bail!("--water-small none and --water-large none with --only em3d… nothing to run");
        }
        for o in &a.set {
            check_set("--set", o)?;
        }
        for o in &a.compare {
            check_set("--compare", o)?;
        }
        Ok(Plan {
            repeat: usize::try_from(a.repeat)?,
            problems,
            topologies,
            timeout_s: a.timeout_s,
            sets: a.set.iter().map(Override::assignment).collect(),
            compare: a.compare.iter().map(Override::assignment).collect(),
        })
    }

    /// Runs in all: rounds × configurations.
    pub fn runs(&self) -> usize {
        self.repeat
            * self
                .problems
                .iter()
                .map(|p| p.setups(&self.topologies, !self.compare.is_empty()).len())
                .sum::<usize>()
    }
}

/// What a run computed, for the correctness check.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Water(Vec<water::StepEnergies>),
    Em3d(em3d::Checksum),
}

/// A run that ended successfully.
#[derive(Clone, Debug)]
struct RunOk {
    run_s: f64,
    answer: Answer,
}

/// One configuration's runs, round by round.
#[derive(Clone, Debug)]
struct Record {
    setup: Setup,
    runs: Vec<Result<RunOk, String>>,
}

/// Water's energies of a run, in the order of [`ENERGY_NAMES`].
fn energy_values(e: &water::StepEnergies) -> [f64; 7] {
    [
        e.kinetic,
        e.intra_potential,
        e.inter_potential,
        e.reaction_field,
        e.total,
        e.avg_temperature_k,
        e.virial,
    ]
}

/// The fields of [`energy_values`].
const ENERGY_NAMES: [&str; 7] = [
    "kinetic",
    "intra_potential",
    "inter_potential",
    "reaction_field",
    "total",
    "avg_temperature_k",
    "virial",
];

/// Significant decimal digits on which every Water energy of a run must agree with the
/// sequential reference (parallel runs add the sums in another order; they agree to 12+
/// digits today).
const MIN_DIGITS: f64 = 9.0;

/// Significant decimal digits on which `a` agrees with the reference `b` (17 if equal).
pub fn digits(a: f64, b: f64) -> f64 {
    if a == b {
        return 17.0;
    }
    if b == 0.0 {
        return 0.0;
    }
    let rel = ((a - b) / b).abs();
    (-rel.log10()).clamp(0.0, 17.0)
}

/// Compares a run's answer with the reference's: the fewest agreeing digits (Water) or
/// 17 (EM3D, equal), or why they disagree.
fn agreement(got: &Answer, reference: &Answer) -> Result<f64, String> {
    match (got, reference) {
        (Answer::Water(g), Answer::Water(r)) => {
            if g.len() != r.len() {
                return Err(format!(
                    "{} printed steps, the reference {}",
                    g.len(),
                    r.len()
                ));
            }
            let mut fewest = 17.0f64;
            for (a, b) in g.iter().zip(r) {
                for (k, (x, y)) in energy_values(a)
                    .into_iter()
                    .zip(energy_values(b))
                    .enumerate()
                {
                    let d = digits(x, y);
                    if d < MIN_DIGITS || a.step != b.step {
                        return Err(format!(
                            "step {} {}: {x:e} vs the sequential {y:e}, {d:.1} digits agree (at least {MIN_DIGITS} needed)",
                            b.step, ENERGY_NAMES[k]
                        ));
                    }
                    fewest = fewest.min(d);
                }
            }
            Ok(fewest)
        }
        (Answer::Em3d(g), Answer::Em3d(r)) => {
            if g == r {
                Ok(17.0)
            } else {
                Err(format!(
                    "checksum {:#018x} (E sum {:e}, H sum {:e}) vs the sequential {:#018x} (E sum {:e}, H sum {:e})",
                    g.fnv1a,
                    g.e_sum(),
                    g.h_sum(),
                    r.fnv1a,
                    r.e_sum(),
                    r.h_sum()
                ))
            }
        }
        _ => Err("the run computed another application".to_owned()),
    }
}

/// The verdict on one configuration's results.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Check {
    /// A sequential reference whose runs agree with each other bit for bit.
    Reference,
    /// Every run agrees with the reference.
    Agrees {
        /// Fewest significant digits on which a run agrees (17: bitwise equal).
        min_digits: f64,
    },
    /// A run failed or disagreed.
    Failed {
        /// Why, per failed run.
        reasons: Vec<String>,
    },
    /// No run of the reference succeeded: nothing to check against.
    Unchecked,
}

impl Check {
    fn text(&self) -> String {
        match self {
            Check::Reference => "reference".to_owned(),
            Check::Agrees { min_digits } if *min_digits >= 17.0 => "agrees (bitwise)".to_owned(),
            Check::Agrees { min_digits } => format!("agrees (≥ {min_digits:.1} digits)"),
            Check::Failed { reasons } => format!("FAILED: {}", reasons.join("; ")),
            Check::Unchecked => "unchecked (no sequential result)".to_owned(),
        }
    }
}

/// One configuration in the report.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigReport {
    /// How it ran.
    pub setup: Setup,
    /// Its label.
    pub label: String,
    /// `run_s` of each round (`null`: the run failed).
    pub run_s: Vec<Option<f64>>,
    /// The successful runs' times, s.
    pub time: Option<Summary>,
    /// Per round, the reference's time over this one's (rounds where both succeeded).
    pub speedup: Option<Summary>,
    /// The correctness verdict.
    pub check: Check,
}

/// One issue-10 ratio in the report.
#[derive(Clone, Debug, Serialize)]
pub struct RatioReport {
    /// The ratio and its target.
    #[serde(flatten)]
    pub spec: RatioSpec,
    /// Per round (`null`: a run of that round failed).
    pub per_round: Vec<Option<f64>>,
    /// Over the rounds where both runs succeeded.
    pub summary: Option<Summary>,
    /// Whether the median meets the target.
    pub met: Option<bool>,
}

/// One problem in the report.
#[derive(Clone, Debug, Serialize)]
pub struct ProblemReport {
    /// The problem.
    pub problem: Problem,
    /// Its title.
    pub title: String,
    /// Its configurations in table order.
    pub configurations: Vec<ConfigReport>,
    /// The issue-10 ratios.
    pub ratios: Vec<RatioReport>,
    /// With `--compare`: per DSM topology, its (B) runs against its (A) runs.
    pub comparisons: Vec<ComparisonReport>,
}

/// A DSM topology's (B) runs (with the `--compare` values) against its (A) runs.
#[derive(Clone, Debug, Serialize)]
pub struct ComparisonReport {
    /// The topology.
    pub topology: Topology,
    /// The ratio, as printed.
    pub name: String,
    /// Per round, time of (B) / time of (A) (`null`: a run of that round failed).
    pub per_round: Vec<Option<f64>>,
    /// Over the rounds where both runs succeeded.
    pub summary: Option<Summary>,
}

/// The whole report (the `--json` file).
#[derive(Clone, Debug, Serialize)]
pub struct AppsReport {
    /// The command.
    pub command: &'static str,
    /// What ran.
    pub plan: Plan,
    /// Per problem.
    pub problems: Vec<ProblemReport>,
    /// Configurations marked FAILED.
    pub failed: usize,
}

/// Per round, `f(num_r, den_r)` where both succeeded.
fn per_round(num: &Record, den: &Record) -> Vec<Option<f64>> {
    num.runs
        .iter()
        .zip(&den.runs)
        .map(|(a, b)| match (a, b) {
            (Ok(a), Ok(b)) => Some(a.run_s / b.run_s),
            _ => None,
        })
        .collect()
}

/// The summary of the rounds that have a value.
fn summary_of(values: &[Option<f64>]) -> Option<Summary> {
    let v: Vec<f64> = values.iter().flatten().copied().collect();
    (!v.is_empty()).then(|| Summary::of(&v))
}

/// Builds a problem's report from its records (in `setups` order).
fn problem_report(problem: &Problem, records: &[Record]) -> ProblemReport {
    let find = |s: Setup| records.iter().find(|r| r.setup == s);
    let mut configurations = Vec::new();
    for rec in records {
        let reference = find(problem.reference_of(rec.setup)).expect("references are run");
        let is_reference = reference.setup == rec.setup;
        let mut reasons = Vec::new();
        for (round, r) in rec.runs.iter().enumerate() {
            if let Err(e) = r {
                reasons.push(format!("round {}: {e}", round + 1));
            }
        }
        let first_ref = reference.runs.iter().find_map(|r| r.as_ref().ok());
        let mut min_digits = 17.0f64;
        if let Some(want) = first_ref {
            for (round, r) in rec.runs.iter().enumerate() {
                if let Ok(got) = r {
                    match agreement(&got.answer, &want.answer) {
                        Ok(d) if is_reference && d < 17.0 => reasons.push(format!(
                            "round {}: the sequential runs differ from each other",
                            round + 1
                        )),
                        Ok(d) => min_digits = min_digits.min(d),
                        Err(e) => reasons.push(format!("round {}: {e}", round + 1)),
                    }
                }
            }
        }
        let check = if !reasons.is_empty() {
            Check::Failed { reasons }
        } else if is_reference {
            Check::Reference
        } else if first_ref.is_none() {
            Check::Unchecked
        } else {
            Check::Agrees { min_digits }
        };
        let run_s: Vec<Option<f64>> = rec
            .runs
            .iter()
            .map(|r| r.as_ref().ok().map(|r| r.run_s))
            .collect();
        configurations.push(ConfigReport {
            setup: rec.setup,
            label: rec.setup.label(),
            time: summary_of(&run_s),
            run_s,
            speedup: summary_of(&per_round(reference, rec)),
            check,
        });
    }
    let setups: Vec<Setup> = records.iter().map(|r| r.setup).collect();
    let ratios = problem
        .ratios(&setups)
        .into_iter()
        .map(|spec| {
            let rounds = per_round(
                find(spec.numerator).expect("run"),
                find(spec.denominator).expect("run"),
            );
            let summary = summary_of(&rounds);
            RatioReport {
                met: summary.map(|s| spec.target.bound.holds(s.median)),
                spec,
                per_round: rounds,
                summary,
            }
        })
        .collect();
    let comparisons = records
        .iter()
        .filter_map(|b| match b.setup {
            Setup::Dsm {
                topology,
                compared: true,
            } => {
                let a = find(Setup::Dsm {
                    topology,
                    compared: false,
                })
                .expect("every (B) row follows its (A) row");
                let rounds = per_round(b, a);
                Some(ComparisonReport {
                    topology,
                    name: format!("time of {} / time of {}", b.setup.label(), a.setup.label()),
                    summary: summary_of(&rounds),
                    per_round: rounds,
                })
            }
            _ => None,
        })
        .collect();
    ProblemReport {
        problem: problem.clone(),
        title: problem.title(),
        configurations,
        ratios,
        comparisons,
    }
}

/// The report as printed.
pub fn render(report: &AppsReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "multigrain bench apps: {} round(s); every round runs each configuration once (interleaved); \
         times are `run_s` (the computation, not process start-up): median (min–max) over the rounds; \
         speedups and ratios are taken per round, then median (min–max)",
        report.plan.repeat
    );
    if !report.plan.sets.is_empty() {
        let _ = writeln!(
            out,
            "every DSM run with --set {}",
            report.plan.sets.join(" --set ")
        );
    }
    if !report.plan.compare.is_empty() {
        let _ = writeln!(
            out,
            "(B): the DSM row above it, run in the same round with --set {} as well",
            report.plan.compare.join(" --set ")
        );
    }
    for p in &report.problems {
        let _ = writeln!(out, "\n{}", p.title);
        let rows: Vec<[String; 4]> = p
            .configurations
            .iter()
            .map(|c| {
                [
                    c.label.clone(),
                    spread(c.time.as_ref(), secs),
                    if c.check == Check::Reference {
                        "1 (reference)".to_owned()
                    } else {
                        spread(c.speedup.as_ref(), ratio)
                    },
                    c.check.text(),
                ]
            })
            .collect();
        let head = [
            "configuration",
            "run time, s",
            "speedup vs sequential",
            "result",
        ];
        let w = |k: usize| {
            rows.iter()
                .map(|r| r[k].chars().count())
                .chain([head[k].chars().count()])
                .max()
                .unwrap_or(0)
        };
        let (w0, w1, w2) = (w(0), w(1), w(2));
        let _ = writeln!(
            out,
            "  {:<w0$}  {:<w1$}  {:<w2$}  {}",
            head[0], head[1], head[2], head[3]
        );
        for r in &rows {
            let _ = writeln!(
                out,
                "  {:<w0$}  {:<w1$}  {:<w2$}  {}",
                r[0], r[1], r[2], r[3]
            );
        }
        if !p.ratios.is_empty() {
            let lines: Vec<[String; 3]> = p
                .ratios
                .iter()
                .map(|r| {
                    let verdict = match r.met {
                        Some(true) => "met",
                        Some(false) => "NOT MET",
                        None => "no data",
                    };
                    [
                        format!("{} {}", r.spec.id, r.spec.name),
                        spread(r.summary.as_ref(), ratio),
                        format!("{}: {verdict}", r.spec.target.text),
                    ]
                })
                .collect();
            let head = ["issue-10 ratio (per round)", "median (min–max)", "target"];
            let w = |k: usize| {
                lines
                    .iter()
                    .map(|r| r[k].chars().count())
                    .chain([head[k].chars().count()])
                    .max()
                    .unwrap_or(0)
            };
            let (w0, w1) = (w(0), w(1));
            let _ = writeln!(out, "  {:<w0$}  {:<w1$}  {}", head[0], head[1], head[2]);
            for l in &lines {
                let _ = writeln!(out, "  {:<w0$}  {:<w1$}  {}", l[0], l[1], l[2]);
            }
        }
        if !p.comparisons.is_empty() {
            let head = "--compare (per round)";
            let w0 = p
                .comparisons
                .iter()
                .map(|c| c.name.chars().count())
                .chain([head.chars().count()])
                .max()
                .unwrap_or(0);
            let _ = writeln!(out, "  {head:<w0$}  median (min–max)");
            for c in &p.comparisons {
                let _ = writeln!(
                    out,
                    "  {:<w0$}  {}",
                    c.name,
                    spread(c.summary.as_ref(), ratio)
                );
            }
        }
    }
    if report.failed > 0 {
        let _ = writeln!(
            out,
            "\n{} configuration(s) FAILED (see the result column)",
            report.failed
        );
    }
    out
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
    let report = run_report(exe, dir, &args, timeout)?;
    let answer = match report.outcome {
        Outcome::Water { result, .. } => Answer::Water(result.energies),
        Outcome::Em3d { result, .. } => Answer::Em3d(result.checksum),
        Outcome::Conformance { .. } => return Err("not an application run".to_owned()),
    };
    Ok(RunOk {
        run_s: report.run_s,
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
    for round in 0..plan.repeat {
        for (problem, recs) in plan.problems.iter().zip(records.iter_mut()) {
            for rec in recs.iter_mut() {
                done += 1;
                eprint!(
                    "bench apps: run {done}/{total} (round {}/{}): {} on {} … ",
                    round + 1,
                    plan.repeat,
                    short_name(problem),
                    rec.setup.label()
                );
                let t = Instant::now();
                let r = run_once(&exe, dir.path(), problem, rec.setup, &plan, timeout);
                match &r {
                    Ok(ok) => eprintln!(
                        "run_s {} s ({:.1} s with start-up)",
                        secs(ok.run_s),
                        t.elapsed().as_secs_f64()
                    ),
                    Err(e) => eprintln!("FAILED: {e}"),
                }
                rec.runs.push(r);
            }
        }
    }
    eprintln!(
        "bench apps: {total} runs in {:.0} s",
        started.elapsed().as_secs_f64()
    );
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
mod tests {
    use super::*;
    use crate::measure::Bound;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: BenchAppsArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchAppsArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench-apps").chain(args.iter().copied()))
            .map(|c| c.args)
    }

    fn plan(args: &[&str]) -> Result<Plan> {
        Plan::from_args(&parse(args).map_err(|e| anyhow!("{e}"))?)
    }

    #[test]
    fn water_sizes_parse_and_are_checked() {
        assert_eq!(
            parse_water_size("512x50"),
            Ok(Some(WaterSize {
                molecules: 512,
                steps: 50
            }))
        );
        assert_eq!(
            parse_water_size("4096×3"),
            Ok(Some(WaterSize {
                molecules: 4096,
                steps: 3
            }))
        );
        assert_eq!(parse_water_size("none"), Ok(None));
        let e = parse_water_size("500x50").unwrap_err();
        assert!(
            e.contains("500 molecules is not a positive perfect cube"),
            "{e}"
        );
        let e = parse_water_size("512x0").unwrap_err();
        assert!(e.contains("at least 1 time step"), "{e}");
        let e = parse_water_size("512").unwrap_err();
        assert!(e.contains("expected MOLECULESxSTEPS"), "{e}");
        let e = parse_water_size("ax3").unwrap_err();
        assert!(e.contains("is not a number of molecules"), "{e}");
    }

    #[test]
    fn defaults_run_the_issue_10_problems_on_every_topology() {
        let p = plan(&[]).unwrap();
        assert_eq!(p.repeat, 3);
        assert_eq!(p.topologies, Topology::ALL.to_vec());
        assert_eq!(
            p.problems,
            vec![
                Problem::Water {
                    role: WaterRole::Small,
                    size: WaterSize {
                        molecules: 512,
                        steps: 50
                    }
                },
                Problem::Water {
                    role: WaterRole::Large,
                    size: WaterSize {
                        molecules: 4096,
                        steps: 3
                    }
                },
                Problem::Em3d {
                    nodes_per_thread: 20_000,
                    iterations: 100,
                    layout: "good".into(),
                    variant: "read".into()
                },
            ]
        );
        // Water: sequential, threads, 4 topologies; EM3D also a 4-partition sequential.
        assert_eq!(p.runs(), 3 * (6 + 6 + 7));
        assert_eq!(p.timeout_s, 600);
    }

    #[test]
    fn topologies_only_and_sizes_restrict_the_plan() {
        let p = plan(&[
            "--only",
            "em3d",
            "--topologies",
            "4x1,2x1-shm",
            "--repeat",
            "1",
        ])
        .unwrap();
        assert_eq!(p.topologies, vec![Topology::Shm2x1, Topology::Udp4x1]);
        assert_eq!(p.problems.len(), 1);
        let setups = p.problems[0].setups(&p.topologies, false);
        assert_eq!(
            setups.iter().map(|s| s.label()).collect::<Vec<_>>(),
            [
                "--sequential (2 partitions)",
                "--threads 2",
                "DSM 2×1 shm",
                "--sequential (4 partitions)",
                "DSM 4×1 udp"
            ]
        );
        assert_eq!(
            p.problems[0].reference_of(Setup::Dsm {
                topology: Topology::Udp4x1,
                compared: true,
            }),
            Setup::Sequential {
                partitions: Some(4)
            }
        );
        // Only the (4) ratio whose configurations ran.
        let ratios = p.problems[0].ratios(&setups);
        assert_eq!(ratios.len(), 1);
        assert_eq!(ratios[0].target.bound, Bound::AtLeast(0.7));

        let p = plan(&["--only", "water", "--water-large", "none"]).unwrap();
        assert_eq!(p.problems.len(), 1);
        let water = &p.problems[0];
        let ids: Vec<&str> = water
            .ratios(&water.setups(&p.topologies, false))
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, ["(2)", "(2)", "(3)", "(3)"]);
    }

    #[test]
    fn bad_flags_are_named_with_what_is_allowed() {
        let e = parse(&["--topologies", "2x1-shm,3x3"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown topology \"3x3\" (allowed: 2x1-shm, 2x1-udp, 2x2, 4x1)"),
            "{e}"
        );
        assert!(e.contains("--topologies"), "{e}");
        let e = parse(&["--water-small", "100x2"]).unwrap_err().to_string();
        assert!(
            e.contains("--water-small") && e.contains("perfect cube"),
            "{e}"
        );
        let e = parse(&["--repeat", "0"]).unwrap_err().to_string();
        assert!(e.contains("--repeat"), "{e}");
        let e = parse(&["--only", "fft"]).unwrap_err().to_string();
        assert!(e.contains("possible values: water, em3d"), "{e}");
        let e = parse(&["--em3d-layout", "diagonal"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("naive") && e.contains("good"), "{e}");
        let e = plan(&["--topologies", "2x2,2x2"]).unwrap_err().to_string();
        assert_eq!(e, "--topologies: 2x2 is named twice");
        let e = plan(&[
            "--only",
            "water",
            "--water-small",
            "none",
            "--water-large",
            "none",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("nothing to run"), "{e}");
    }

    #[test]
    fn sets_reach_only_the_dsm_runs_and_topology_keys_are_refused() {
        let p = plan(&[
            "--set",
            "dsm.release_batch=64",
            "--set",
            "dsm.protocol=sc",
            "--compare",
            "dsm.prefetch=0",
        ])
        .unwrap();
        assert_eq!(p.sets, ["dsm.release_batch=64", "dsm.protocol=sc"]);
        assert_eq!(p.compare, ["dsm.prefetch=0"]);
        let dir = Path::new("/configs");
        let water = &p.problems[0];
        let setups = water.setups(&p.topologies, true);
        // Every DSM row is followed by its (B) twin; the ratios stay on the A rows.
        assert_eq!(
            setups.iter().map(|s| s.label()).collect::<Vec<_>>(),
            [
                "--sequential",
                "--threads 2",
                "DSM 2×1 shm",
                "DSM 2×1 shm (B)",
                "DSM 2×1 udp",
                "DSM 2×1 udp (B)",
                "DSM 2×2 udp (default job)",
                "DSM 2×2 udp (default job) (B)",
                "DSM 4×1 udp",
                "DSM 4×1 udp (B)",
            ]
        );
        // EM3D: 2 sequential references, --threads 2 and 8 DSM rows.
        assert_eq!(p.runs(), 3 * (10 + 10 + 11));
        for r in water.ratios(&setups) {
            for s in [r.numerator, r.denominator] {
                assert!(!matches!(s, Setup::Dsm { compared: true, .. }), "{r:?}");
            }
        }
        for setup in setups {
            let args = run_args(dir, water, setup, &p.sets, &p.compare);
            let sets: Vec<&str> = args
                .windows(2)
                .filter(|w| w[0] == "--set")
                .map(|w| w[1].as_str())
                .collect();
            match setup {
                Setup::Dsm {
                    compared: false, ..
                } => assert_eq!(
                    sets,
                    ["dsm.release_batch=64", "dsm.protocol=sc"],
                    "{args:?}"
                ),
                Setup::Dsm { compared: true, .. } => assert_eq!(
                    sets,
                    ["dsm.release_batch=64", "dsm.protocol=sc", "dsm.prefetch=0"],
                    "{args:?}"
                ),
                _ => assert!(sets.is_empty(), "{setup:?} got {args:?}"),
            }
        }
        let e = plan(&["--compare", "local.clusters=3"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--compare local.clusters=3"), "{e}");
        for key in [
            "local.threads=2",
            "cluster.0.threads=3",
            "ini.substrate=shm",
        ] {
            let e = plan(&["--set", key]).unwrap_err().to_string();
            assert!(
                e.contains(&format!("--set {key}")) && e.contains("--topologies"),
                "{e}"
            );
        }
        let e = parse(&["--set", "dsm.release_batch"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--set"), "{e}");
        // A value the schema refuses is named against the topology it breaks.
        let bad: Override = "dsm.release_batch=0".parse().unwrap();
        let text = Topology::Shm2x1.config_toml().unwrap();
        let e = JobConfig::from_str_with_overrides(&text, "2x1-shm", &[bad])
            .unwrap_err()
            .to_string();
        assert!(e.contains("release_batch"), "{e}");
    }

    #[test]
    fn generated_configurations_are_valid_jobs() {
        for t in Topology::ALL {
            let Some(text) = t.config_toml() else {
                assert_eq!(t, Topology::Udp2x2, "only 2x2 uses the embedded job");
                continue;
            };
            let cfg = JobConfig::from_str_named(&text, t.name()).unwrap();
            assert_eq!(cfg.total_threads(), t.threads());
            let substrate = if t == Topology::Shm2x1 { "shm" } else { "udp" };
            assert_eq!(cfg.ini.substrate.as_str(), substrate);
        }
        assert_eq!(JobConfig::embedded_default().total_threads(), 4);
    }

    fn ok(run_s: f64, answer: &Answer) -> Result<RunOk, String> {
        Ok(RunOk {
            run_s,
            answer: answer.clone(),
        })
    }

    fn energies(total: f64) -> Answer {
        Answer::Water(vec![water::StepEnergies {
            step: 1,
            kinetic: 1.5,
            intra_potential: 0.006,
            inter_potential: 10.6,
            reaction_field: -2.1,
            total,
            avg_temperature_k: 299.3,
            virial: -19.2,
        }])
    }

    #[test]
    fn results_are_checked_and_ratios_taken_per_round() {
        let problem = Problem::Water {
            role: WaterRole::Small,
            size: WaterSize {
                molecules: 64,
                steps: 1,
            },
        };
        let seq = Setup::Sequential { partitions: None };
        let thr = Setup::Threads { threads: 2 };
        let shm = Setup::Dsm {
            topology: Topology::Shm2x1,
            compared: false,
        };
        let shm_b = Setup::Dsm {
            topology: Topology::Shm2x1,
            compared: true,
        };
        let udp = Setup::Dsm {
            topology: Topology::Udp2x1,
            compared: false,
        };
        let good = energies(10.0);
        let close = energies(10.000_000_000_01);
        let wrong = energies(10.01);
        let records = vec![
            Record {
                setup: seq,
                runs: vec![ok(1.0, &good), ok(4.0, &good)],
            },
            Record {
                setup: thr,
                runs: vec![ok(0.5, &close), ok(2.0, &good)],
            },
            Record {
                setup: shm,
                // A regime change: round 2 is 4× slower for everyone.
                runs: vec![ok(1.0, &good), ok(4.0, &good)],
            },
            Record {
                setup: udp,
                runs: vec![ok(3.0, &wrong), Err("exit status: 1: boom".into())],
            },
            Record {
                setup: shm_b,
                // Twice as fast as the A row in both rounds.
                runs: vec![ok(0.5, &good), ok(2.0, &good)],
            },
        ];
        let r = problem_report(&problem, &records);
        assert_eq!(r.comparisons.len(), 1);
        assert_eq!(r.comparisons[0].per_round, vec![Some(0.5), Some(0.5)]);
        assert_eq!(r.comparisons[0].topology, Topology::Shm2x1);
        let c = &r.configurations;
        assert_eq!(c[0].check, Check::Reference);
        assert!(
            matches!(c[1].check, Check::Agrees { min_digits } if (11.0..13.0).contains(&min_digits)),
            "{:?}",
            c[1].check
        );
        assert_eq!(c[2].check, Check::Agrees { min_digits: 17.0 });
        let Check::Failed { reasons } = &c[3].check else {
            panic!("{:?}", c[3].check)
        };
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(
            reasons[0].contains("round 2: exit status: 1: boom"),
            "{reasons:?}"
        );
        assert!(reasons[1].contains("round 1: step 1 total"), "{reasons:?}");
        assert_eq!(c[1].speedup.unwrap().median, 2.0);
        assert_eq!(c[3].run_s, vec![Some(3.0), None]);
        // (2) shm / threads: 2.0 in both rounds despite the regime change.
        let shm_ratio = &r.ratios[0];
        assert_eq!(shm_ratio.per_round, vec![Some(2.0), Some(2.0)]);
        assert_eq!(shm_ratio.met, Some(false));
        // (2) udp / threads: only round 1 has both runs.
        assert_eq!(r.ratios[1].per_round, vec![Some(6.0), None]);
        assert_eq!(r.ratios[1].summary.unwrap().samples, 1);

        let report = AppsReport {
            command: "multigrain bench apps",
            plan: Plan {
                repeat: 2,
                problems: vec![problem],
                topologies: vec![Topology::Shm2x1, Topology::Udp2x1],
                timeout_s: 600,
                sets: vec!["dsm.release_batch=64".to_owned()],
                compare: vec!["dsm.prefetch=0".to_owned()],
            },
            problems: vec![r],
            failed: 1,
        };
        let text = render(&report);
        for needle in [
            "Water 64 molecules × 1 step (",
            "--threads 2",
            "2.00 (2.00–2.00)",
            "agrees (bitwise)",
            "FAILED: round 2: exit status: 1: boom",
            "(2) time of 2×1 shm / time of --threads 2",
            "≤ 1.5: NOT MET",
            "1 configuration(s) FAILED",
            "every DSM run with --set dsm.release_batch=64",
            "(B): the DSM row above it, run in the same round with --set dsm.prefetch=0 as well",
            "DSM 2×1 shm (B)",
            "time of DSM 2×1 shm (B) / time of DSM 2×1 shm  0.50 (0.50–0.50)",
        ] {
            assert!(text.contains(needle), "no {needle:?} in\n{text}");
        }
        let json = serde_json::to_value(&report).unwrap();
        let shm_json = &json["problems"][0]["configurations"][2];
        assert_eq!(shm_json["setup"]["topology"], "2x1-shm");
        assert_eq!(shm_json["check"]["status"], "agrees");
        assert_eq!(json["problems"][0]["ratios"][0]["id"], "(2)");
        assert_eq!(json["plan"]["sets"][0], "dsm.release_batch=64");
        assert_eq!(
            json["problems"][0]["ratios"][0]["target"]["bound"]["at_most"],
            1.5
        );
    }

    #[test]
    fn seconds_keep_three_significant_digits() {
        assert_eq!(secs(12.345), "12.3");
        assert_eq!(secs(0.6213), "0.621");
        assert_eq!(secs(0.000_123_4), "0.000123");
        assert_eq!(secs(345.6), "346");
    }

    #[test]
    fn digits_of_agreement() {
        assert_eq!(digits(1.0, 1.0), 17.0);
        assert!((digits(1.000_001, 1.0) - 6.0).abs() < 0.01);
        assert_eq!(digits(1.0, 0.0), 0.0);
    }
}
