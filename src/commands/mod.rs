//! One module per subcommand.

pub mod bench_apps;
pub mod bench_dsm;
pub mod bench_messaging;
pub mod bench_mva;
pub mod bench_net;
pub mod child_run;
pub mod config;
pub mod experiment;
pub mod hello;
pub mod run;
pub mod selftest;
pub mod trace;

use anyhow::{Context, Result};
use multigrain_cluster_config::{
    EMBEDDED_DEFAULT_TOML, JobConfig, Override, detect_placement_from_env, detect_rank_from_env,
};
use multigrain_messaging::control::ENV_CONFIG;
use std::path::{Path, PathBuf};

/// The job a command runs, and where it came from.
pub struct ChosenJob {
    /// The resolved configuration, `--set` values applied.
    pub cfg: JobConfig,
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// Where it came from, in words, for reports.
    pub label: String,
}

/// The job's configuration: `--config FILE`, else `$MULTIGRAIN_CONFIG` (set by `multigrain
/// launch` and by `run` for its cluster processes), else — in a process that `srun` or
/// `mpirun` started — one cluster per rank with the launcher's CPUs per task as compute
/// threads (else 1) and the embedded default's other settings, else the embedded default
/// job (`examples/2x2.toml`). `sets` (`--set KEY=VALUE`) are applied over it.
///
/// # Errors
/// An unreadable or invalid file or `--set` value; unusable launcher rank variables.
pub fn choose_job(config: Option<&Path>, sets: &[Override]) -> Result<ChosenJob> {
    let from_file = |p: PathBuf| -> Result<ChosenJob> {
        Ok(ChosenJob {
            cfg: JobConfig::from_path_with_overrides(&p, sets)?,
            label: p.display().to_string(),
            path: Some(p),
        })
    };
    if let Some(p) = config {
        return from_file(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os(ENV_CONFIG) {
        return from_file(p.into());
    }
    if let Some(rank) = detect_rank_from_env().context("reading the launcher's rank variables")? {
        let placement = detect_placement_from_env(&rank);
        let threads = placement.cpus_per_task.unwrap_or(1).max(1);
        let name = format!(
            "{}-{}",
            rank.launcher.to_string().to_lowercase().replace(' ', ""),
            placement.instance.as_deref().unwrap_or("job")
        );
        let mut all: Vec<Override> = vec![
            format!("local.clusters={}", rank.size).parse()?,
            format!("local.threads={threads}").parse()?,
            format!("job.name={name:?}").parse()?,
        ];
        all.extend_from_slice(sets);
        let origin = format!(
            "{} ranks: {} cluster(s) × {threads} thread(s), the embedded default's settings",
            rank.launcher, rank.size
        );
        return Ok(ChosenJob {
            cfg: JobConfig::from_str_with_overrides(EMBEDDED_DEFAULT_TOML, &origin, &all)?,
            path: None,
            label: origin,
        });
    }
    Ok(ChosenJob {
        cfg: JobConfig::from_str_with_overrides(
            EMBEDDED_DEFAULT_TOML,
            "embedded default job",
            sets,
        )?,
        path: None,
        label: "embedded default job, examples/2x2.toml".to_owned(),
    })
}
