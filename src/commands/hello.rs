//! `multigrain hello`: joins the job's control plane and reports who is
//! there — a check that a topology starts, and the test program of the
//! launcher.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use multigrain_cluster_config::JobConfig;
use multigrain_messaging::control::{
    Control, ControlError, EXIT_PEER_FAILED, Identity, Registration,
};
use multigrain_messaging::net::BoundInis;

/// What `multigrain hello` was asked to do.
pub struct Options {
    /// The job's TOML file; `None` means `$MULTIGRAIN_CONFIG`.
    pub config: Option<PathBuf>,
    /// `--set KEY=VALUE` values applied over it.
    pub set: Vec<multigrain_cluster_config::Override>,
    /// Sleep this long after the barrier (watching for failures).
    pub sleep: Duration,
    /// `Some(None)`: every cluster fails; `Some(Some(c))`: cluster `c` fails.
    pub fail: Option<Option<usize>>,
}

/// Joins the job, prints the clusters (on cluster 0), passes a barrier,
/// optionally sleeps or fails, and finishes. When another cluster fails,
/// prints `multigrain: error: cluster N failed: REASON` and exits with
/// [`EXIT_PEER_FAILED`].
pub fn run(opts: &Options) -> Result<()> {
    let cfg = super::choose_job(opts.config.as_deref(), &opts.set)?.cfg;
    let mut cfg = cfg;
    let id = Identity::from_env(&cfg)?;
    id.apply(&mut cfg);
    let me = id.cluster;
    match hello(opts, &cfg, &id) {
        Err(e)
            if e.downcast_ref::<ControlError>()
                .and_then(ControlError::failure)
                .is_some_and(|f| f.cluster != me) =>
        {
            crate::logging::print_error(&e);
            std::process::exit(EXIT_PEER_FAILED);
        }
        other => other,
    }
}

fn hello(opts: &Options, cfg: &JobConfig, id: &Identity) -> Result<()> {
    let me = id.cluster;
    // What `run` needs before it joins, checked the same way: the host is this machine
    // and the INIs can bind (then let go at once).
    let spec = &cfg.clusters[me];
    let ready = id
        .check_host(cfg)
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            if id.clusters > 1 {
                let ids = multigrain_messaging::SiteId(me as u16);
                BoundInis::bind(
                    ids,
                    &spec.host,
                    spec.port,
                    cfg.inis_of(me),
                    cfg.ini.connected_sends,
                )?;
            }
            Ok(())
        });
    ready.inspect_err(|e| Control::cannot_start(id, &cfg.job, &e.to_string()))?;
    let (control, all) = Control::join(id, &cfg.job, Registration::local(me, Vec::new()))?;
    if me == 0 {
        let name = cfg.job.name.as_deref().unwrap_or("(unnamed)");
        println!(
            "job {name}: {} cluster(s) joined; coordinator at {}",
            all.len(),
            control.coordinator()
        );
        for r in &all {
            let same = if r.cluster != 0 && r.same_machine(&all[0]) {
                ", same machine as cluster 0"
            } else {
                ""
            };
            println!(
                "cluster {}: host {}, pid {}{same}",
                r.cluster, r.host, r.pid
            );
        }
    }
    let startup = cfg.job.startup_timeout();
    control.barrier(1, startup)?;
    println!(
        "cluster {me} of {}: hello from pid {} on {}, CPUs {}",
        all.len(),
        all[me].pid,
        all[me].host,
        crate::launch::self_bind::this_process_cpus()
    );
    if !opts.sleep.is_zero()
        && let Some(f) = control.wait_failure(opts.sleep)
    {
        return Err(ControlError::ClusterFailed(f).into());
    }
    if let Some(which) = opts.fail
        && which.is_none_or(|c| c == me)
    {
        let reason = "failing on purpose (multigrain hello --fail)";
        control.abort(reason);
        bail!("cluster {me}: {reason}");
    }
    control.finish(startup + cfg.job.peer_timeout())?;
    if me == 0 {
        println!("all {} cluster(s) finished", all.len());
    }
    Ok(())
}
