//! `multigrain trace summarize FILE…`: what a job's per-message INI traces say (paper 002
//! Tables 5.3/5.4 and 5.6/5.7), from the trace files its clusters wrote.

use anyhow::{Context, Result, bail};
use multigrain_messaging::net::trace::{ClusterTrace, summarize};
use std::path::{Path, PathBuf};

/// Reads every file (one per cluster), summarizes them together, prints the summary and
/// writes it as JSON to `json` if given (`-` = standard output, then nothing else is
/// printed there).
///
/// # Errors
/// A file that cannot be read or is not a valid trace (named, with the reason); two files
/// of the same cluster.
pub fn summarize_files(files: &[PathBuf], json: Option<&Path>) -> Result<()> {
    let mut traces: Vec<ClusterTrace> = Vec::with_capacity(files.len());
    for f in files {
        let bytes = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
        let t = ClusterTrace::parse(&bytes).with_context(|| format!("{}", f.display()))?;
        if let Some(i) = traces.iter().position(|o| o.cluster == t.cluster) {
            bail!(
                "{} and {} are both traces of cluster {}; give one file per cluster of one job",
                files[i].display(),
                f.display(),
                t.cluster
            );
        }
        traces.push(t);
    }
    let summary = summarize(&traces);
    let text = serde_json::to_string_pretty(&summary)?;
    match json {
        Some(p) if p == Path::new("-") => {
            println!("{text}");
            return Ok(());
        }
        Some(p) => std::fs::write(p, text + "\n")
            .with_context(|| format!("cannot write {}", p.display()))?,
        None => {}
    }
    print!("{}", summary.render());
    Ok(())
}
