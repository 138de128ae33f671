//! One cluster process of a DSM run: joins the job (identity from `multigrain launch`'s
//! variables or the launcher's rank), starts the DSM on the job's site, runs the app on
//! the DSM backend of `multigrain-apps`, gathers every cluster's INI statistics at
//! cluster 0 through the DSM itself, finishes the DSM (statistics of every cluster) and
//! the job, and — on cluster 0 — reports.

use super::report::{Backend, IniEntry, Report};
use super::watch::{Display, Forward, Sink};
use super::{AppSpec, RESULT_FILE, SOCKET_FILE};
use anyhow::{Context, Result, anyhow, bail};
use multigrain_apps::dsm_backend::DsmRuntime;
use multigrain_apps::progress::Progress;
use multigrain_cluster_config::JobConfig;
use multigrain_dsm::{
    Dsm, DsmError, DsmOptions, JobStats, Liveness, StallProbe, Transport, site_config,
};
use multigrain_messaging::control::{
    Control, ControlError, EXIT_PEER_FAILED, Identity, Stall as ControlStall,
};
use multigrain_messaging::job::{Job, JobError};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Words (8 bytes) of DSM memory per INI for gathering INI statistics at cluster 0.
const WORDS_PER_INI: usize = 1024;

/// The DSM's view of the job's failures: the control plane's (a dead, silent or aborting
/// cluster) and the INIs' (a peer that stopped acknowledging).
struct JobLiveness {
    control: Arc<Control>,
    seen: Arc<Mutex<Option<(usize, String)>>>,
}

impl Liveness for JobLiveness {
    fn failure(&self) -> Option<(usize, String)> {
        if let Some(f) = self.control.failure() {
            return Some((f.cluster, f.reason));
        }
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Where cluster 0 delivers its report.
pub struct Delivery<'a> {
    /// The spawning process's directory (`--report-to`): progress socket and result file.
    pub report_to: Option<&'a Path>,
    /// `--json FILE`, when there is no spawning process to write it.
    pub json: Option<&'a Path>,
}

/// The cluster another cluster's failure is blamed on, if that is why `e` happened.
fn blamed_peer(e: &anyhow::Error, me: usize) -> Option<usize> {
    e.chain().find_map(|cause| {
        if let Some(d) = cause.downcast_ref::<DsmError>() {
            return Some(d.blamed_cluster()).filter(|&c| c != me);
        }
        let control = cause.downcast_ref::<ControlError>().or_else(|| {
            match cause.downcast_ref::<JobError>() {
                Some(JobError::Control(c)) => Some(c),
                _ => None,
            }
        })?;
        control.failure().map(|f| f.cluster).filter(|&c| c != me)
    })
}

/// Runs `app` as this process's cluster of the job `cfg` (see the module docs). When
/// another cluster's failure stops the run, prints it and exits with
/// [`EXIT_PEER_FAILED`], so that `multigrain launch` tells causes from consequences.
pub fn run(app: &AppSpec, cfg: &JobConfig, backend: Backend, delivery: &Delivery) -> Result<()> {
    let started = Instant::now();
    let id = Identity::from_env(cfg).context("finding which cluster this process is")?;
    let mut placed = cfg.clone();
    id.apply(&mut placed);
    let cfg = &placed;
    let me = id.cluster;
    let sink = match (me, delivery.report_to) {
        (0, Some(dir)) => {
            Forward::connect(&dir.join(SOCKET_FILE)).map_or(Sink::Silent, Sink::Forward)
        }
        (0, None) => Sink::Display(Display::new(app.name())),
        _ => Sink::Silent,
    };
    sink.begin("joining the job", 0);
    let outcome = Job::join(cfg, id, site_config(cfg, me))
        .context("joining the job")
        .and_then(|job| {
            let r = on_dsm(app, cfg, &job, &sink);
            if let Err(e) = &r
                && blamed_peer(e, me).is_none()
            {
                job.abort(&format!("{e:#}"));
            }
            let (outcome, stats, inis) = r?;
            let timeout =
                (cfg.job.startup_timeout() + cfg.job.peer_timeout()).max(Duration::from_secs(30));
            job.finish(timeout).context("finishing the job")?;
            Ok((outcome, stats, inis))
        });
    let (outcome, stats, inis) = match outcome {
        Ok(o) => {
            sink.finish();
            o
        }
        Err(e) => {
            sink.abandon();
            if blamed_peer(&e, me).is_some() {
                crate::logging::print_error(&e);
                std::process::exit(EXIT_PEER_FAILED);
            }
            return Err(e);
        }
    };
    if me != 0 {
        return Ok(());
    }
    let report = Report {
        backend,
        run_s: outcome.run_s(),
        outcome,
        wall_s: started.elapsed().as_secs_f64(),
        stats: Some(stats),
        inis,
        trace: None,
    };
    match delivery.report_to {
        Some(dir) => {
            let tmp = dir.join(format!("{RESULT_FILE}.tmp"));
            std::fs::write(&tmp, serde_json::to_vec(&report)?)
                .with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, dir.join(RESULT_FILE))
                .with_context(|| format!("writing {}", dir.join(RESULT_FILE).display()))?;
        }
        None => super::deliver(&report, delivery.json, Some(cfg))?,
    }
    Ok(())
}

/// The DSM part of a cluster's run: join, run the app, gather, finish the DSM.
fn on_dsm(
    app: &AppSpec,
    cfg: &JobConfig,
    job: &Job,
    sink: &Sink,
) -> Result<(super::report::Outcome, JobStats, Vec<IniEntry>)> {
    let me = job.cluster();
    let seen = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&seen);
    job.on_failure(move |f| {
        slot.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert_with(|| (f.cluster, f.reason.clone()));
    });
    let transport = Transport {
        site: job.site().clone(),
        cluster: me,
        clusters: job.clusters(),
        liveness: Arc::new(JobLiveness {
            control: Arc::clone(job.control()),
            seen,
        }),
    };
    // Placed apart from the clusters sharing this host (`launch.cpu_bind`), the protocol
    // thread runs on their CPUs.
    let protocol_cpus = crate::launch::cpus::protocol_cpus().unwrap_or_else(|why| {
        tracing::warn!("{why}; the protocol thread runs on this process's CPUs");
        None
    });
    let options = DsmOptions {
        protocol_cpus,
        ..DsmOptions::default()
    };
    let dsm = Dsm::join_with(transport, cfg, options).context("starting the DSM")?;
    let _watchdog = Watchdog::start(job.control(), dsm.stall_probe());
    let mut rt = DsmRuntime::new(dsm)?;
    let outcome = app.run_on(&mut rt, sink)?;
    sink.begin("gathering statistics", 0);
    let inis = gather_inis(&mut rt, job, cfg)?;
    let stats = rt.finish().context("finishing the DSM")?;
    Ok((outcome, stats, inis))
}

/// The progress watchdog of this cluster (`job.progress_timeout_ms`): a thread that
/// reports the DSM's [`multigrain_dsm::Stall`] state to the control plane every
/// period, whose coordinator fails the job when every cluster has stalled for the
/// timeout. Stops when dropped.
struct Watchdog {
    /// Dropping it stops the thread.
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    control: Arc<Control>,
}

impl Watchdog {
    /// Starts the watchdog thread; `None` when the watchdog is off or the thread
    /// cannot start (a warning says so).
    fn start(control: &Arc<Control>, probe: StallProbe) -> Option<Watchdog> {
        let timeout = control.progress_timeout()?;
        // A report at least four times per timeout, at most once per 10 ms.
        let period = (timeout / 4)
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let reporter = Arc::clone(control);
        let spawned = std::thread::Builder::new()
            .name("mg-watchdog".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(period)
                {
                    reporter.report_progress(probe.stall().map(|s| ControlStall {
                        duration: s.duration,
                        waits: s.waits,
                    }));
                }
            });
        match spawned {
            Ok(t) => Some(Watchdog {
                stop: Some(stop),
                thread: Some(t),
                control: Arc::clone(control),
            }),
            Err(e) => {
                tracing::warn!(
                    "the progress watchdog cannot start ({e}): a hang will not be reported"
                );
                None
            }
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The DSM is done here: no report of this cluster may stay a stall.
        self.control.report_progress(None);
    }
}

/// Every cluster's INI statistics (so far), at cluster 0 (empty elsewhere): each cluster
/// writes its own as JSON into its slot of a DSM array, and cluster 0 reads them after
/// the section's closing barrier.
fn gather_inis(rt: &mut DsmRuntime, job: &Job, cfg: &JobConfig) -> Result<Vec<IniEntry>> {
    let (me, n) = (job.cluster(), job.clusters());
    let most = (0..n).map(|c| cfg.inis_of(c)).max().unwrap_or(1).max(1);
    let per = 1 + most * WORDS_PER_INI;
    let area = rt.dsm_mut().alloc::<u64>(n * per)?;
    let mut mine: Vec<IniEntry> = job.ini_reports().iter().map(IniEntry::of).collect();
    let mut bytes = serde_json::to_vec(&mine)?;
    if bytes.len() > (per - 1) * 8 {
        // Keep the summaries, drop the detailed counters.
        for m in &mut mine {
            m.report = serde_json::Value::Null;
        }
        bytes = serde_json::to_vec(&mine)?;
    }
    if bytes.len() > (per - 1) * 8 {
        bail!(
            "cluster {me}: the INI statistics take {} bytes, more than the {} reserved",
            bytes.len(),
            (per - 1) * 8
        );
    }
    let words: Vec<u64> = bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect();
    rt.dsm().run(|w| {
        if w.local_id() == 0 {
            area.set(me * per, bytes.len() as u64);
            area.write(me * per + 1, &words);
        }
    })?;
    if me != 0 {
        return Ok(Vec::new());
    }
    let mut all = Vec::new();
    for c in 0..n {
        let len = usize::try_from(area.get(c * per))?;
        if len > (per - 1) * 8 {
            return Err(anyhow!(
                "cluster {c} wrote {len} bytes of INI statistics, more than its slot"
            ));
        }
        let mut words = vec![0u64; len.div_ceil(8)];
        area.read(c * per + 1, &mut words);
        let bytes: Vec<u8> = words
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .take(len)
            .collect();
        let entries: Vec<IniEntry> = serde_json::from_slice(&bytes)
            .with_context(|| format!("reading cluster {c}'s INI statistics"))?;
        all.extend(entries);
    }
    Ok(all)
}
