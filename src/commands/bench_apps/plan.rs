//! What `bench apps` runs: the problems, the topologies and their configurations, the
//! ratios of issue 10, and the plan built from the command line.

use super::*;

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
pub(super) fn parse_topology(s: &str) -> Result<Topology, String> {
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
    pub(super) fn app_args(&self) -> Vec<String> {
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
                measure: Measure::Run,
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
                        // The same, timed as a user timing the command would: start-up
                        // and shutdown weigh on a run this short.
                        all.push(RatioSpec {
                            measure: Measure::Command,
                            ..spec(
                                "(2)",
                                "the same, whole commands (start to exit)",
                                shm,
                                thr,
                                Target::at_most(1.5, "≤ 1.5"),
                            )
                        });
                        all.push(RatioSpec {
                            measure: Measure::Command,
                            ..spec(
                                "(2)",
                                "the same over udp, whole commands",
                                udp,
                                thr,
                                Target::at_most(3.0, "≤ 3"),
                            )
                        });
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
    pub(super) fn args(self, configs: &Path) -> Vec<String> {
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
pub(super) fn config_file(dir: &Path, topology: Topology) -> PathBuf {
    dir.join(format!("{}.toml", topology.name()))
}

/// Which time of a run a ratio divides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Measure {
    /// `run_s`: the computation, from the first time step's start to the end.
    Run,
    /// The whole `multigrain run` command, from its start to its exit (what `time`
    /// shows): process start-up and the clusters' joining and leaving included.
    Command,
}

/// A ratio of issue 10: per round, the time of `numerator` over that of `denominator`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RatioSpec {
    /// The number of the target, e.g. `(1)`.
    pub id: &'static str,
    /// What the ratio is.
    pub name: String,
    /// The configuration whose time is divided.
    pub numerator: Setup,
    /// The configuration whose time divides.
    pub denominator: Setup,
    /// Which time.
    pub measure: Measure,
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
