//! `multigrain run APP` started by hand: the process becomes the job's launcher. It
//! starts one cluster process per cluster through `multigrain launch`'s machinery (same
//! environment, prefixed output, failure handling, no orphans), each running
//! `multigrain run APP` with the resolved parameters and `--report-to DIR`. Cluster 0
//! sends its progress to a Unix socket in DIR, shown here as bars (or lines), and writes
//! its report to DIR/result.json, printed here unprefixed once every cluster has ended.
//! When cluster 0 runs on another host it cannot reach DIR: it then prints the report
//! itself (its lines prefixed `[c0] `) and writes `--json` there.

use super::report::{Backend, Report};
use super::watch::{self, Display};
use super::{AppSpec, RESULT_FILE, SOCKET_FILE};
use crate::launch;
use anyhow::{Context, Result, anyhow};
use multigrain_cluster_config::{JobConfig, Override};
use multigrain_messaging::net::trace::{ClusterTrace, TraceSummary, summarize};
use multigrain_messaging::net::trace_file_name;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A private directory (mode 0700) under the system temp dir, removed on drop.
pub struct ScratchDir(PathBuf);

/// Name prefix of the scratch directories.
const PREFIX: &str = "multigrain-run-";

/// Removes scratch directories left by `multigrain run` processes that no longer exist
/// (a run stopped by a signal ends without cleaning up).
fn sweep_stale(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl ScratchDir {
    /// Creates `multigrain-run-PID-NANOS` under the temp dir (first removing those of
    /// runs that are gone).
    pub fn new() -> Result<ScratchDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let temp = std::env::temp_dir();
        sweep_stale(&temp);
        let dir = temp.join(format!("{PREFIX}{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create the directory {}", dir.display()))?;
        Ok(ScratchDir(dir))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Spawns the job described by `cfg` (read from `config`, or the embedded default when
/// `None`) running `app`, and prints cluster 0's report. When `sets` (`--set` values)
/// changed `cfg`, the cluster processes read `cfg` as written out into the scratch
/// directory instead.
pub fn run(
    app: &AppSpec,
    cfg: &JobConfig,
    config: Option<&Path>,
    sets: &[Override],
    json: Option<&Path>,
) -> Result<()> {
    let resolved = !sets.is_empty();
    let started = Instant::now();
    let dir = ScratchDir::new()?;
    let config_path = match config {
        _ if resolved => {
            let p = dir.path().join("job.toml");
            std::fs::write(&p, cfg.to_toml_string())
                .with_context(|| format!("writing {}", p.display()))?;
            p
        }
        Some(p) => p.to_path_buf(),
        None => {
            let p = dir.path().join("2x2.toml");
            std::fs::write(&p, multigrain_cluster_config::EMBEDDED_DEFAULT_TOML)
                .with_context(|| format!("writing {}", p.display()))?;
            p
        }
    };
    let local_reporter = cfg.clusters[0].is_loopback();
    let mut command = vec!["multigrain".to_owned(), "run".to_owned()];
    command.extend(app.child_args());
    if local_reporter {
        command.push("--report-to".into());
        command.push(dir.path().to_string_lossy().into_owned());
    } else if let Some(j) = json {
        command.push("--json".into());
        command.push(j.to_string_lossy().into_owned());
    }
    let n = cfg.clusters.len();
    if !crate::progress::quiet() {
        eprintln!(
            "multigrain run: starting {n} cluster process(es) of {}{} ({} compute threads); their own messages are prefixed [cN]",
            config.map_or_else(
                || "the embedded default job (examples/2x2.toml)".to_owned(),
                |p| p.display().to_string()
            ),
            if resolved { " with --set values" } else { "" },
            cfg.total_threads()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = if local_reporter {
        let listener = UnixListener::bind(dir.path().join(SOCKET_FILE))
            .with_context(|| format!("listening on {}", dir.path().join(SOCKET_FILE).display()))?;
        Some(watch::serve(
            listener,
            Display::new(app.name()),
            Arc::clone(&stop),
        )?)
    } else {
        None
    };
    let launched = launch::run(launch::Options {
        config: config_path,
        set: Vec::new(),
        ssh: None,
        grace: std::time::Duration::from_secs(2),
        command,
        key_dir: Some(dir.path().to_path_buf()),
    });
    stop.store(true, Ordering::Release);
    if let Some(w) = watcher {
        let _ = w.join();
    }
    launched?;
    if !local_reporter {
        return Ok(());
    }
    let path = dir.path().join(RESULT_FILE);
    let text = std::fs::read(&path).map_err(|e| {
        anyhow!(
            "every cluster ended successfully but cluster 0 left no report ({}: {e})",
            path.display()
        )
    })?;
    let mut report: Report =
        serde_json::from_slice(&text).with_context(|| format!("reading {}", path.display()))?;
    report.wall_s = started.elapsed().as_secs_f64();
    if let Backend::Dsm { config: label, .. } = &mut report.backend {
        // The clusters read the configuration from a file this process chose.
        *label = std::iter::once(config.map_or_else(
            || "embedded default job, examples/2x2.toml".to_owned(),
            |p| p.display().to_string(),
        ))
        .chain(sets.iter().map(Override::flag))
        .collect::<Vec<_>>()
        .join(" ");
    }
    if !cfg.ini.trace_dir.is_empty() {
        report.trace = Some(read_traces(Path::new(&cfg.ini.trace_dir), n)?);
    }
    super::deliver(&report, json, Some(cfg))
}

/// Summarizes the trace files the `clusters` clusters of a job wrote into `dir`
/// (`ini.trace_dir`). A cluster without INIs (every peer over shared memory) writes none.
fn read_traces(dir: &Path, clusters: usize) -> Result<TraceSummary> {
    let mut traces = Vec::with_capacity(clusters);
    for c in 0..clusters {
        let path = dir.join(trace_file_name(c as u16));
        match std::fs::read(&path) {
            Ok(bytes) => traces
                .push(ClusterTrace::parse(&bytes).with_context(|| format!("{}", path.display()))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    Ok(summarize(&traces))
}
