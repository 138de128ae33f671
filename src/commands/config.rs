//! `multigrain config check|show FILE`.

use anyhow::Result;
use multigrain_cluster_config::{JobConfig, Override};
use std::path::Path;

/// Validates `path` with `sets` applied; prints a one-line summary.
pub fn check(path: &Path, sets: &[Override]) -> Result<()> {
    let cfg = JobConfig::from_path_with_overrides(path, sets)?;
    let inis = if cfg.uniform_inis() {
        format!("{} INI(s) per cluster", cfg.ini.per_cluster)
    } else {
        format!("{} INIs in all", cfg.total_inis())
    };
    println!(
        "{}: ok — {} cluster(s), {} compute thread(s), {inis}, policy {}, substrate {}, protocol {}",
        path.display(),
        cfg.clusters.len(),
        cfg.total_threads(),
        cfg.ini.policy,
        cfg.ini.substrate,
        cfg.dsm.protocol
    );
    Ok(())
}

/// Validates `path` with `sets` applied and prints its topology table.
pub fn show(path: &Path, sets: &[Override]) -> Result<()> {
    let cfg = JobConfig::from_path_with_overrides(path, sets)?;
    print!("{}", cfg.render_table());
    Ok(())
}
