//! `multigrain config check|show FILE`.

use anyhow::Result;
use multigrain_cluster_config::JobConfig;
use std::path::Path;

/// Validates `path`; prints a one-line summary.
pub fn check(path: &Path) -> Result<()> {
    let cfg = JobConfig::from_path(path)?;
    println!(
        "{}: ok — {} cluster(s), {} compute thread(s), {} INI(s) per cluster, policy {}, substrate {}, protocol {}",
        path.display(),
        cfg.clusters.len(),
        cfg.total_threads(),
        cfg.ini.per_cluster,
        cfg.ini.policy,
        cfg.ini.substrate,
        cfg.dsm.protocol
    );
    Ok(())
}

/// Validates `path` and prints its topology table.
pub fn show(path: &Path) -> Result<()> {
    let cfg = JobConfig::from_path(path)?;
    print!("{}", cfg.render_table());
    Ok(())
}
