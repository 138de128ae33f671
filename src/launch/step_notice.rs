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
//! - A task that gets the signal while it has not joined its job yet waits
//!   [`NOTICE_DELAY`] (the control plane's report, which names the failed cluster and
//!   why, comes first when the failed task reached the coordinator), then, if still not
//!   joined, prints that another task of the step failed before the job started and
//!   exits with [`EXIT_PEER_FAILED`]. Once joined, the signal is ignored: the control
//!   plane reports every failure itself.
//!
//! Not covered: a task killed outright (`kill -9`, an out-of-memory kill) before the job
//! started runs no code; `srun -K` (`--kill-on-bad-exit`) covers that case too.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use multigrain_cluster_config::Launcher;
use multigrain_messaging::control::{EXIT_PEER_FAILED, joined};
use signal_hook::consts::SIGUSR1;
use signal_hook::iterator::Signals;

/// How long a task still joining waits after the step's signal before it stops (as
/// for `multigrain launch`'s notice).
const NOTICE_DELAY: Duration = Duration::from_millis(200);

/// How long [`tell_step`] lets `scancel` run.
const SCANCEL_LIMIT: Duration = Duration::from_secs(2);

/// [`watch`] ran: this task is one of a step's several `multigrain` clusters.
static WATCHING: AtomicBool = AtomicBool::new(false);

/// This task failed and signalled its step: the signal that comes back is its own.
static FAILING: AtomicBool = AtomicBool::new(false);

/// The step of this task, `JOBID.STEPID`, when `srun` started it (`SLURM_STEP_ID` names
/// a step, not a batch or extern step).
fn step_id(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let job = env("SLURM_JOB_ID")?;
    let step = env("SLURM_STEP_ID")?;
    let (job, step) = (job.trim(), step.trim());
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    // Slurm numbers its batch, extern and interactive steps 0xfffffffe, 0xfffffffc and
    // 0xfffffffb: those have no tasks of ours.
    let special = matches!(step, "4294967294" | "4294967292" | "4294967291");
    (numeric(job) && numeric(step) && !special).then(|| format!("{job}.{step}"))
}

/// Starts waiting for the step's signal (see the module documentation) when Slurm's
/// ranks place this process (the launcher detection of `--launcher`, as for its cluster
/// id) in a step of more than one task. Call it before the command starts joining its
/// job.
pub fn watch() {
    let slurm_step = matches!(
        multigrain_cluster_config::detect_rank_from_env(),
        Ok(Some(r)) if r.launcher == Launcher::Slurm && r.size > 1
    );
    if !slurm_step || step_id(|k| std::env::var(k).ok()).is_none() {
        return;
    }
    let mut signals = match Signals::new([SIGUSR1]) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch for the Slurm step's failure signal (SIGUSR1): {e}");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("mg-watch-step".into())
        .spawn(move || {
            for _ in signals.forever() {
                if FAILING.load(Ordering::SeqCst) || joined() {
                    continue;
                }
                std::thread::sleep(NOTICE_DELAY);
                if FAILING.load(Ordering::SeqCst) || joined() {
                    continue;
                }
                let step = step_id(|k| std::env::var(k).ok()).unwrap_or_default();
                // stderr may be gone: a failed write must not stop the exit.
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    format!(
                        "multigrain: error: another task of Slurm step {step} failed before \
                         the job started (it signalled the step; srun names the task and its \
                         error is above); stopping this cluster\n"
                    )
                    .as_bytes(),
                );
                std::process::exit(EXIT_PEER_FAILED);
            }
        });
    match spawned {
        Ok(_) => WATCHING.store(true, Ordering::SeqCst),
        Err(e) => {
            tracing::warn!("cannot watch for the Slurm step's failure signal: {e}");
            return;
        }
    }
    // A panic before the job started is a failure too (the default report first).
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tell_step();
    }));
}

/// This task's command failed: if [`watch`] armed it and it has not joined its job,
/// signal every task of its step (`scancel --signal=USR1 JOBID.STEPID`, at most
/// [`SCANCEL_LIMIT`]) so that those still joining stop now. Does nothing otherwise; a
/// `scancel` that fails is logged, and the exit goes on.
pub fn tell_step() {
    if !WATCHING.load(Ordering::SeqCst) || joined() {
        return;
    }
    let Some(step) = step_id(|k| std::env::var(k).ok()) else {
        return;
    };
    FAILING.store(true, Ordering::SeqCst);
    let child = Command::new("scancel")
        .args(["--quiet", "--signal=USR1", &step])
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
    let deadline = Instant::now() + SCANCEL_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                // `scancel` is a process of the step too (this task started it): the
                // signal it asked for ends it, once Slurm is delivering it.
                let own_signal = status.signal() == Some(SIGUSR1);
                if !status.success() && !own_signal {
                    tracing::warn!("scancel --signal=USR1 {step} failed: {status}");
                }
                return;
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!(
                    "scancel --signal=USR1 {step} did not finish within {SCANCEL_LIMIT:?}"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::step_id;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_task_of_an_srun_step_names_its_step() {
        let vars = [("SLURM_JOB_ID", "42"), ("SLURM_STEP_ID", "3")];
        assert_eq!(step_id(env(&vars)).as_deref(), Some("42.3"));
    }

    #[test]
    fn batch_extern_and_malformed_steps_name_none() {
        for step in [
            "4294967294",
            "4294967292",
            "4294967291",
            "batch",
            "",
            "1;rm",
        ] {
            let vars = [("SLURM_JOB_ID", "42"), ("SLURM_STEP_ID", step)];
            assert_eq!(step_id(env(&vars)), None, "{step:?}");
        }
        assert_eq!(step_id(env(&[("SLURM_JOB_ID", "42")])), None);
        let vars = [("SLURM_JOB_ID", "4 2"), ("SLURM_STEP_ID", "0")];
        assert_eq!(step_id(env(&vars)), None);
    }
}
