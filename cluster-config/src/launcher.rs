//! Finding a process's cluster id from the rank variables of Slurm or an
//! MPI launcher, when `srun` or `mpirun` started one process per cluster.

use std::fmt;

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
/// through `env`, trying Slurm (`SLURM_PROCID`/`SLURM_NTASKS`), then PMI
/// (`PMI_RANK`/`PMI_SIZE`), then Open MPI
/// (`OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`). The first launcher whose
/// rank variable is set decides; `Ok(None)` means none is set.
///
/// `env` returns a variable's value, or `None` when it is unset; pass
/// [`detect_rank_from_env`] for the process environment.
///
/// # Errors
///
/// [`RankError`] when the chosen launcher's variables are not decimal
/// numbers, the size is missing or 0, or the rank is not below the size.
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
    for launcher in Launcher::ALL {
        let (rank_var, size_var) = (launcher.rank_var(), launcher.size_var());
        let Some(rank) = env(rank_var) else { continue };
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
