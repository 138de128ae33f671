//! Under `srun`: a task that fails before its job started tells the other tasks of the
//! step through Slurm, so that none of them waits for the start-up timeout.
//!
//! Without `-K` (`--kill-on-bad-exit`) Slurm lets the other tasks of a step run on when
//! one exits. A cluster that dies before it reached cluster 0's coordinator, or a
//! cluster 0 that fails before it listens (its port held by a socket that does not
//! accept), is then seen by no other task: the members retry cluster 0's refused port
//! until `job.startup_timeout_ms` (10 s by default). `multigrain launch` tells its
//! clusters on their stdin ([`super::spawn::watch_stdin`]); under Slurm the step itself
//! is the channel:
//!
//! - [`watch`]: each `multigrain` task of a step of several tasks that joins a job
//!   (`run`, `hello`, `selftest`) as a Slurm rank waits for `SIGUSR1` on a thread.
//! - [`tell_step`]: a task whose command fails (or panics) before it joined its job runs
//!   `scancel --signal=USR1 JOBID.STEPID` (`SLURM_JOB_ID`, `SLURM_STEP_ID`), which
//!   Slurm delivers to every task of the step, then exits with its own error.
//! - A task that gets the signal while it has not joined its job yet stops as on
//!   `multigrain launch`'s notice ([`super::spawn::stop_if_still_joining`]: 200 ms later,
//!   so that the control plane's report, which names the failed cluster and why, comes
//!   first when the failed task reached the coordinator), with exit code 3. Once joined,
//!   the signal is ignored: the control plane reports every failure itself.
//!
//! Not covered: a task killed outright (`kill -9`, an out-of-memory kill) before the job
//! started runs no code; `srun -K` (`--kill-on-bad-exit`) covers that case too.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use multigrain_cluster_config::{Launcher, detect_rank_from_env, slurm_step_id};
use multigrain_messaging::control::joined;
use signal_hook::consts::SIGUSR1;
use signal_hook::iterator::Signals;

use super::spawn::stop_if_still_joining;
use crate::commands::child_run::wait_bounded;

/// How long [`tell_step`] lets `scancel` run before stopping it.
const SCANCEL_LIMIT: Duration = Duration::from_secs(2);

/// The step (`JOBID.STEPID`) whose signal [`watch`] waits for: set once it does.
static STEP: OnceLock<String> = OnceLock::new();

/// This task failed and signalled its step: the signal that comes back is its own.
static FAILING: AtomicBool = AtomicBool::new(false);

/// Starts waiting for the step's signal (see the module documentation) when Slurm's
/// ranks place this process (the launcher detection of `--launcher`, as for its cluster
/// id) in a step of more than one task. Call it before the command starts joining its
/// job.
pub fn watch() {
    let slurm_step = matches!(
        detect_rank_from_env(),
        Ok(Some(r)) if r.launcher == Launcher::Slurm && r.size > 1
    );
    let Some(step) = slurm_step
        .then(|| slurm_step_id(|k| std::env::var(k).ok()))
        .flatten()
    else {
        return;
    };
    let mut signals = match Signals::new([SIGUSR1]) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch for the Slurm step's failure signal (SIGUSR1): {e}");
            return;
        }
    };
    // Set even if no watcher starts: this task's own failure still tells the others.
    let _ = STEP.set(step.clone());
    let spawned = std::thread::Builder::new()
        .name("mg-watch-step".into())
        .spawn(move || {
            for _ in signals.forever() {
                stop_if_still_joining(
                    || FAILING.load(Ordering::SeqCst),
                    || {
                        format!(
                            "another task of Slurm step {step} failed before the job started \
                             (it signalled the step; srun names the task and its error is above)"
                        )
                    },
                );
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch for the Slurm step's failure signal: {e}");
    }
    // A panic before the job started is a failure too (the default report first).
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tell_step();
    }));
}

/// This task's command failed: if [`watch`] armed it and it has not joined its job,
/// signal every task of its step (`scancel --signal=USR1 JOBID.STEPID`, stopped after
/// [`SCANCEL_LIMIT`]) so that those still joining stop now. Does nothing otherwise; a
/// `scancel` that fails is logged, and the exit goes on.
pub fn tell_step() {
    let Some(step) = STEP.get() else {
        return;
    };
    if joined() {
        return;
    }
    FAILING.store(true, Ordering::SeqCst);
    let child = Command::new("scancel")
        .args(["--quiet", "--signal=USR1", step])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("cannot run scancel to tell Slurm step {step} of this failure: {e}");
            return;
        }
    };
    match wait_bounded(&mut child, SCANCEL_LIMIT) {
        // `scancel` is a process of the step too (this task started it): the signal it
        // asked for ends it, once Slurm is delivering it.
        Ok((status, false)) if status.success() || status.signal() == Some(SIGUSR1) => {}
        Ok((status, stopped)) => {
            let how = if stopped { "was stopped" } else { "failed" };
            tracing::warn!("scancel --signal=USR1 {step} {how}: {status}");
        }
        Err(e) => tracing::warn!("scancel --signal=USR1 {step}: {e:#}"),
    }
}
