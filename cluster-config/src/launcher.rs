//! Finding a process's cluster id from the rank variables of Slurm or an
//! MPI launcher, when `srun` or `mpirun` started one process per cluster,
//! and what the launcher says about where the ranks run ([`Placement`]).
//!
//! Detection cannot misfire in a batch shell: Slurm's variables count only
//! inside a job step (`SLURM_STEP_ID` set, as it is for every task `srun`
//! starts and never for the shell of `sbatch` or `salloc`). The choice can be
//! forced with [`LauncherChoice`] (`--launcher`, or [`ENV_LAUNCHER`]).

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::model::JobConfig;

/// A launcher whose rank environment variables are understood, in the order
/// [`detect_rank`] tries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// Slurm's `srun`: `SLURM_PROCID` / `SLURM_NTASKS`.
    Slurm,
    /// A PMI launcher such as MPICH's or Intel MPI's Hydra: `PMI_RANK` /
    /// `PMI_SIZE`.
    Pmi,
    /// Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE`.
    OpenMpi,
}

impl Launcher {
    /// Every launcher, in detection order.
    pub const ALL: [Launcher; 3] = [Launcher::Slurm, Launcher::Pmi, Launcher::OpenMpi];

    /// The variable holding this process's rank (0-based).
    pub fn rank_var(self) -> &'static str {
        match self {
            Launcher::Slurm => "SLURM_PROCID",
            Launcher::Pmi => "PMI_RANK",
            Launcher::OpenMpi => "OMPI_COMM_WORLD_RANK",
        }
    }

    /// The variable holding the number of processes started.
    pub fn size_var(self) -> &'static str {
        match self {
            Launcher::Slurm => "SLURM_NTASKS",
            Launcher::Pmi => "PMI_SIZE",
            Launcher::OpenMpi => "OMPI_COMM_WORLD_SIZE",
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Slurm => "Slurm",
            Launcher::Pmi => "PMI",
            Launcher::OpenMpi => "Open MPI",
        })
    }
}

/// Every variable through which a launcher tells a process its rank or placement (Slurm,
/// PMI, Open MPI/PMIx) or chooses the launcher ([`ENV_LAUNCHER`]): what a parent removes
/// from a child's environment so that the child is not taken for a launcher rank.
pub const LAUNCHER_VARIABLES: [&str; 18] = [
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_CPUS_PER_TASK",
    "PMI_RANK",
    "PMI_SIZE",
    "PMI_KVSNAME",
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE",
    ENV_LAUNCHER,
];

/// The environment variable that chooses how the launcher is detected
/// (`auto`, `none`, `slurm`, `pmi`, `mpi`); `--launcher` sets the same.
pub const ENV_LAUNCHER: &str = "MULTIGRAIN_LAUNCHER";

/// Which launcher's rank variables to believe (`--launcher`, [`ENV_LAUNCHER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LauncherChoice {
    /// Slurm inside a job step (`SLURM_STEP_ID` set), else PMI, else Open MPI.
    #[default]
    Auto,
    /// Not started by a launcher, whatever the environment says (e.g. a
    /// command in an `sbatch` script run by the batch shell itself).
    None,
    /// Only Slurm's variables (`SLURM_PROCID`/`SLURM_NTASKS`), step or not.
    Slurm,
    /// Only PMI's (`PMI_RANK`/`PMI_SIZE`).
    Pmi,
    /// Only Open MPI's (`OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`), with PMIx's
    /// key–value service for the rendezvous (`mpi`, or `pmix`).
    OpenMpi,
}

impl LauncherChoice {
    /// The names [`FromStr`] accepts.
    pub const NAMES: &'static str = "auto, none, slurm, pmi, mpi (or pmix)";
}

impl FromStr for LauncherChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "none" => Ok(Self::None),
            "slurm" | "srun" => Ok(Self::Slurm),
            "pmi" => Ok(Self::Pmi),
            "mpi" | "pmix" | "openmpi" | "ompi" | "mpirun" => Ok(Self::OpenMpi),
            other => Err(format!(
                "launcher {other:?} is not known; use one of {}",
                Self::NAMES
            )),
        }
    }
}

static CHOICE: OnceLock<LauncherChoice> = OnceLock::new();

/// Sets this process's launcher choice (from `--launcher`); it wins over
/// [`ENV_LAUNCHER`]. Only the first call counts.
pub fn set_launcher_choice(choice: LauncherChoice) {
    let _ = CHOICE.set(choice);
}

/// Whether `SLURM_STEP_ID` names a step that `srun` started (not the batch
/// script's or the extern step, which Slurm numbers 0xfffffffe and 0xfffffffc).
fn in_slurm_step(env: &mut impl FnMut(&str) -> Option<String>) -> bool {
    match env("SLURM_STEP_ID") {
        None => false,
        Some(v) => !matches!(
            v.trim(),
            "" | "batch" | "extern" | "interactive" | "4294967294" | "4294967292" | "4294967291"
        ),
    }
}

/// The Slurm job step this process is a task of, as `JOBID.STEPID` (what `scancel`
/// takes), read through `env`: `SLURM_JOB_ID` and a `SLURM_STEP_ID` that names a step
/// `srun` started (not a batch, extern or interactive step), both decimal. `None`
/// otherwise.
///
/// ```
/// use multigrain_cluster_config::slurm_step_id;
/// let env = |k: &str| match k {
///     "SLURM_JOB_ID" => Some("42".to_owned()),
///     "SLURM_STEP_ID" => Some("3".to_owned()),
///     _ => None,
/// };
/// assert_eq!(slurm_step_id(env).as_deref(), Some("42.3"));
/// ```
pub fn slurm_step_id(mut env: impl FnMut(&str) -> Option<String>) -> Option<String> {
    if !in_slurm_step(&mut env) {
        return None;
    }
    let job = env("SLURM_JOB_ID")?;
    let step = env("SLURM_STEP_ID")?;
    let (job, step) = (job.trim(), step.trim());
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (decimal(job) && decimal(step)).then(|| format!("{job}.{step}"))
}

/// This process's place among the processes a launcher started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchRank {
    /// Which launcher's variables were found.
    pub launcher: Launcher,
    /// This process's rank, below `size`; used as its cluster id.
    pub rank: usize,
    /// The number of processes started, at least 1.
    pub size: usize,
}

/// Why the launcher's rank variables cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RankError {
    /// The launcher choice is unknown, or names a launcher whose variables
    /// are not set.
    #[error("{0}")]
    Choice(String),
    /// A rank or size variable is not a plain decimal number.
    #[error("{var} = {value:?} (set by {launcher}): expected a non-negative decimal integer")]
    NotANumber {
        /// The launcher the variable belongs to.
        launcher: Launcher,
        /// The variable's name.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The rank variable is set but the size variable is not.
    #[error(
        "{rank_var} is set but {size_var} is not: cannot tell how many processes {launcher} started"
    )]
    MissingSize {
        /// The launcher the variables belong to.
        launcher: Launcher,
        /// The rank variable's name.
        rank_var: &'static str,
        /// The size variable's name.
        size_var: &'static str,
    },
    /// The size variable is 0.
    #[error("{size_var} = 0 (set by {launcher}): at least one process is needed")]
    ZeroSize {
        /// The launcher the variable belongs to.
        launcher: Launcher,
        /// The size variable's name.
        size_var: &'static str,
    },
    /// The rank is not below the size.
    #[error("{rank_var} = {rank} is not below {size_var} = {size} (set by {launcher})")]
    RankOutOfRange {
        /// The launcher the variables belong to.
        launcher: Launcher,
        /// The rank variable's name.
        rank_var: &'static str,
        /// The rank found.
        rank: usize,
        /// The size variable's name.
        size_var: &'static str,
        /// The size found.
        size: usize,
    },
    /// The launcher started a different number of processes than the
    /// configuration has clusters.
    #[error(
        "{size_var} = {size} (set by {launcher}), but the config defines {clusters} clusters: \
         start exactly one process per cluster (e.g. srun -n {clusters} or mpirun -n {clusters})"
    )]
    SizeMismatch {
        /// The launcher.
        launcher: Launcher,
        /// The size variable's name.
        size_var: &'static str,
        /// The number of processes started.
        size: usize,
        /// The number of clusters in the configuration.
        clusters: usize,
    },
}

/// Reads a decimal count: ASCII digits only (no sign, no spaces).
fn parse_count(launcher: Launcher, var: &'static str, value: String) -> Result<usize, RankError> {
    let digits_only = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    match value.parse::<usize>() {
        Ok(n) if digits_only => Ok(n),
        _ => Err(RankError::NotANumber {
            launcher,
            var,
            value,
        }),
    }
}

/// Finds this process's rank from launcher environment variables read
/// through `env`, trying Slurm (`SLURM_PROCID`/`SLURM_NTASKS`, only inside a
/// job step: `SLURM_STEP_ID` set), then PMI (`PMI_RANK`/`PMI_SIZE`), then
/// Open MPI (`OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`). The first
/// launcher whose rank variable is set decides; `Ok(None)` means none is set.
/// [`set_launcher_choice`] (else [`ENV_LAUNCHER`], read through `env`)
/// narrows this to one launcher, or to none.
///
/// `env` returns a variable's value, or `None` when it is unset; pass
/// [`detect_rank_from_env`] for the process environment.
///
/// # Errors
///
/// [`RankError`] when the chosen launcher's variables are not decimal
/// numbers, the size is missing or 0, or the rank is not below the size;
/// [`RankError::Choice`] for an unknown [`ENV_LAUNCHER`] value, or a forced
/// launcher whose rank variable is not set.
///
/// ```
/// use multigrain_cluster_config::{Launcher, detect_rank};
/// let env = |k: &str| match k {
///     "PMI_RANK" => Some("1".to_owned()),
///     "PMI_SIZE" => Some("2".to_owned()),
///     _ => None,
/// };
/// let r = detect_rank(env).unwrap().unwrap();
/// assert_eq!((r.launcher, r.rank, r.size), (Launcher::Pmi, 1, 2));
/// ```
pub fn detect_rank(
    mut env: impl FnMut(&str) -> Option<String>,
) -> Result<Option<LaunchRank>, RankError> {
    let choice = match CHOICE.get() {
        Some(c) => *c,
        None => match env(ENV_LAUNCHER) {
            Some(v) => v
                .parse::<LauncherChoice>()
                .map_err(|e| RankError::Choice(format!("{ENV_LAUNCHER}: {e}")))?,
            None => LauncherChoice::Auto,
        },
    };
    let only = match choice {
        LauncherChoice::None => return Ok(None),
        LauncherChoice::Auto => None,
        LauncherChoice::Slurm => Some(Launcher::Slurm),
        LauncherChoice::Pmi => Some(Launcher::Pmi),
        LauncherChoice::OpenMpi => Some(Launcher::OpenMpi),
    };
    for launcher in Launcher::ALL {
        if only.is_some_and(|l| l != launcher) {
            continue;
        }
        let (rank_var, size_var) = (launcher.rank_var(), launcher.size_var());
        if launcher == Launcher::Slurm && only.is_none() && !in_slurm_step(&mut env) {
            // A batch or salloc shell: Slurm variables but no step.
            continue;
        }
        let Some(rank) = env(rank_var) else {
            if only.is_some() {
                return Err(RankError::Choice(format!(
                    "the launcher is set to {launcher} but {rank_var} is not set: \
                     this process was not started by it (use --launcher auto or none)"
                )));
            }
            continue;
        };
        let rank = parse_count(launcher, rank_var, rank)?;
        let size = env(size_var).ok_or(RankError::MissingSize {
            launcher,
            rank_var,
            size_var,
        })?;
        let size = parse_count(launcher, size_var, size)?;
        if size == 0 {
            return Err(RankError::ZeroSize { launcher, size_var });
        }
        if rank >= size {
            return Err(RankError::RankOutOfRange {
                launcher,
                rank_var,
                rank,
                size_var,
                size,
            });
        }
        return Ok(Some(LaunchRank {
            launcher,
            rank,
            size,
        }));
    }
    Ok(None)
}

/// [`detect_rank`] on this process's environment. A value that is not valid
/// Unicode is passed on lossily, so it is reported as not a number.
///
/// # Errors
///
/// As [`detect_rank`].
pub fn detect_rank_from_env() -> Result<Option<LaunchRank>, RankError> {
    detect_rank(|k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
}

impl LaunchRank {
    /// Checks that the launcher started exactly one process per cluster.
    ///
    /// # Errors
    ///
    /// [`RankError::SizeMismatch`] when `size` differs from `clusters`.
    pub fn check_cluster_count(&self, clusters: usize) -> Result<(), RankError> {
        if self.size == clusters {
            Ok(())
        } else {
            Err(RankError::SizeMismatch {
                launcher: self.launcher,
                size_var: self.launcher.size_var(),
                size: self.size,
                clusters,
            })
        }
    }
}

impl JobConfig {
    /// Whether the config names no hosts: every cluster on
    /// [`LOCAL_HOST`](crate::LOCAL_HOST) with port 0, as `[local]` gives.
    /// Under a launcher such a job takes its hosts from the launcher.
    pub fn names_no_hosts(&self) -> bool {
        self.clusters
            .iter()
            .all(|c| c.host == crate::LOCAL_HOST && c.port == 0)
    }

    /// Checks that `rank` comes from a launch with one process per cluster
    /// of this configuration; the rank is then the process's cluster id.
    ///
    /// # Errors
    ///
    /// [`RankError::SizeMismatch`] when the process count differs from the
    /// number of clusters.
    pub fn check_launch_rank(&self, rank: &LaunchRank) -> Result<(), RankError> {
        rank.check_cluster_count(self.clusters.len())
    }
}

/// What a launcher's environment says about where its ranks run, for a job
/// whose configuration names no hosts ([`detect_placement`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// This launch's identity, the same in every rank and different in two
    /// launches running at the same time: Slurm's `JOBID.STEPID`, Open MPI's
    /// PMIx namespace (else its job id), PMI's KVS name. `None` when the
    /// launcher does not say.
    pub instance: Option<String>,
    /// The host rank 0 runs on, or why it is not known: under Slurm the
    /// first node of the step's node list (`SLURM_STEP_NODELIST`, where
    /// `srun` always places task 0); under an MPI launcher `127.0.0.1` when
    /// every rank runs on this node (local size = size).
    pub rank0_host: Result<String, String>,
    /// CPUs per task the launcher gave (`SLURM_CPUS_PER_TASK`), if it says.
    pub cpus_per_task: Option<usize>,
}

/// [`Placement`] of `rank`'s launch, from variables read through `env`.
///
/// ```
/// use multigrain_cluster_config::{Launcher, LaunchRank, detect_placement};
/// let env = |k: &str| match k {
///     "SLURM_JOB_ID" => Some("42".to_owned()),
///     "SLURM_STEP_ID" => Some("0".to_owned()),
///     "SLURM_STEP_NODELIST" => Some("node[07-09],gpu1".to_owned()),
///     _ => None,
/// };
/// let r = LaunchRank { launcher: Launcher::Slurm, rank: 1, size: 4 };
/// let p = detect_placement(&r, env);
/// assert_eq!(p.instance.as_deref(), Some("42.0"));
/// assert_eq!(p.rank0_host.as_deref(), Ok("node07"));
/// ```
pub fn detect_placement(rank: &LaunchRank, env: impl Fn(&str) -> Option<String>) -> Placement {
    let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let local_size = |vars: &[&str]| {
        vars.iter()
            .find_map(|k| var(k))
            .and_then(|v| v.trim().parse::<usize>().ok())
    };
    let all_here = |vars: &[&str], what: &str| match local_size(vars) {
        Some(n) if n == rank.size => Ok(crate::LOCAL_HOST.to_owned()),
        Some(n) => Err(format!(
            "{} placed {} rank(s) on this node and {} elsewhere, and says nothing about \
             where rank 0 runs ({what})",
            rank.launcher,
            n,
            rank.size.saturating_sub(n)
        )),
        None => Err(format!(
            "{} does not say how many ranks run on this node ({what} is not set)",
            rank.launcher
        )),
    };
    match rank.launcher {
        Launcher::Slurm => Placement {
            instance: var("SLURM_JOB_ID")
                .map(|j| format!("{}.{}", j.trim(), var("SLURM_STEP_ID").unwrap_or_default())),
            rank0_host: var("SLURM_STEP_NODELIST")
                .or_else(|| var("SLURM_JOB_NODELIST"))
                .or_else(|| var("SLURM_NODELIST"))
                .ok_or_else(|| "SLURM_STEP_NODELIST is not set".to_owned())
                .and_then(|l| first_host(&l)),
            cpus_per_task: var("SLURM_CPUS_PER_TASK").and_then(|v| v.trim().parse().ok()),
        },
        Launcher::OpenMpi => Placement {
            instance: var("PMIX_NAMESPACE").or_else(|| var("OMPI_MCA_ess_base_jobid")),
            rank0_host: all_here(
                &["OMPI_COMM_WORLD_LOCAL_SIZE"],
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            ),
            cpus_per_task: None,
        },
        Launcher::Pmi => Placement {
            instance: var("PMI_KVSNAME").or_else(|| var("PMI_ID")),
            rank0_host: all_here(&["MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"], "MPI_LOCALNRANKS"),
            cpus_per_task: None,
        },
    }
}

/// [`detect_placement`] on this process's environment.
pub fn detect_placement_from_env(rank: &LaunchRank) -> Placement {
    detect_placement(rank, |k| {
        std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
    })
}

/// The first host of a Slurm host list (`node[01-04,7],login2`, `rack[1-2]-n[3-4]`):
/// every bracket replaced by its first element, zero padding kept.
///
/// # Errors
///
/// A message when the list is empty or a bracket is not closed.
pub fn first_host(list: &str) -> Result<String, String> {
    let bad = || format!("cannot read the Slurm host list {list:?}");
    let mut out = String::new();
    let mut rest = list.trim();
    loop {
        match rest.find(['[', ',']) {
            Some(i) if rest.as_bytes()[i] == b'[' => {
                out.push_str(&rest[..i]);
                let close = rest[i..].find(']').ok_or_else(bad)? + i;
                let inner = &rest[i + 1..close];
                let first = inner.split([',', '-']).next().unwrap_or("").trim();
                if first.is_empty() {
                    return Err(bad());
                }
                out.push_str(first);
                rest = &rest[close + 1..];
            }
            Some(i) => {
                out.push_str(&rest[..i]);
                break;
            }
            None => {
                out.push_str(rest);
                break;
            }
        }
    }
    if out.is_empty() { Err(bad()) } else { Ok(out) }
}

/// The coordinator's TCP port for a launch whose configuration gives none:
/// derived from the launch's [`Placement::instance`] (FNV-1a) into
/// 20000..=29999, below Linux's ephemeral range, so that every rank computes
/// the same port and two launches on one node almost never share one (and
/// if they do, their job labels differ: see [`instance_key`]).
pub fn rendezvous_port(instance: &str) -> u16 {
    20_000 + (fnv1a(instance.as_bytes()) % 10_000) as u16
}

/// A job label (`job.key`) for one launch: `key` mixed with the launch's instance, so
/// that a rank of one launch that reaches another launch's coordinator is refused as a
/// foreign job instead of joining it. A label, not a secret: authentication is the
/// job's random secret (`multigrain-control`'s `secret` module).
pub fn instance_key(key: u64, instance: &str) -> u64 {
    key ^ fnv1a(instance.as_bytes()).rotate_left(17)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
