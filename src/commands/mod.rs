//! One module per subcommand.

pub mod bench_apps;
pub mod bench_dsm;
pub mod bench_messaging;
pub mod bench_net;
pub mod child_run;
pub mod config;
pub mod experiment;
pub mod hello;
pub mod run;
pub mod selftest;
pub mod trace;

use anyhow::{Result, anyhow};
use multigrain_cluster_config::{JobConfig, Override};
use multigrain_messaging::control::ENV_CONFIG;
use std::path::Path;

/// The job's configuration: `--config FILE`, else `$MULTIGRAIN_CONFIG` (set by `multigrain
/// launch`), else an error saying how to start the job.
///
/// `sets` (`--set KEY=VALUE`) are applied over the file.
pub fn job_config(config: Option<&Path>, command: &str, sets: &[Override]) -> Result<JobConfig> {
    let path = match config {
        Some(p) => p.to_path_buf(),
        None => std::env::var_os(ENV_CONFIG).map(Into::into).ok_or_else(|| {
            anyhow!("no job configuration: pass --config FILE, or start the job with `multigrain launch --config FILE -- multigrain {command}`, which sets {ENV_CONFIG}")
        })?,
    };
    Ok(JobConfig::from_path_with_overrides(&path, sets)?)
}
