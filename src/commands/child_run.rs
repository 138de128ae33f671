//! This executable's own `multigrain run`, started in a child process as a user would
//! start it, and its JSON [`Report`] read back: the one way `bench apps` and
//! `experiment` take a sample.

use super::run::report::Report;
use anyhow::{Context, Result};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Variables that would make a child `multigrain run` think a launcher started it:
/// `multigrain launch`'s (the job key file's included: each run gets its own) and every
/// launcher's.
pub fn launch_vars() -> impl Iterator<Item = &'static str> {
    [
        multigrain_messaging::control::ENV_CLUSTER,
        multigrain_messaging::control::ENV_CLUSTERS,
        multigrain_messaging::control::ENV_COORDINATOR,
        multigrain_messaging::control::ENV_CONFIG,
        multigrain_messaging::control::ENV_KEY_FILE,
    ]
    .into_iter()
    .chain(multigrain_cluster_config::LAUNCHER_VARIABLES)
}

/// The last `n` non-empty lines of a file joined by ` | `, for an error message.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// How often [`wait_bounded`] looks for the child's exit. `bench apps` times a whole
/// command from the spawn to this wait's return, so the interval bounds that sample's
/// error: at 20 ms (before the forty-eighth session) every whole-command time was rounded
/// up to the next tick, up to 20 ms on a 0.1–0.4 s run (Water 512 × 50's whole commands
/// read 0.282 and 0.384 s in 20 ms steps). A poll is one `waitpid(WNOHANG)`.
const EXIT_POLL: Duration = Duration::from_millis(1);

/// Waits for `child` at most `limit`; then SIGTERM, and SIGKILL 5 s later. Returns its
/// status and whether it was stopped. Its exit is seen within [`EXIT_POLL`].
///
/// # Errors
/// When the child's status cannot be read.
pub fn wait_bounded(
    child: &mut std::process::Child,
    limit: Duration,
) -> Result<(ExitStatus, bool)> {
    let start = Instant::now();
    let mut stopped = false;
    loop {
        if let Some(status) = child.try_wait().context("waiting for a run")? {
            return Ok((status, stopped));
        }
        let waited = start.elapsed();
        if waited > limit && !stopped {
            stopped = true;
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        if waited > limit + Duration::from_secs(5) {
            let _ = child.kill();
        }
        std::thread::sleep(EXIT_POLL);
    }
}

/// Runs `EXE run ARGS… --json DIR/run.json` once (launcher variables removed, stdout
/// and stderr into `DIR/run.stdout` and `DIR/run.stderr`) and reads its report.
///
/// `timeout` bounds the whole command, process start-up included.
///
/// # Errors
/// Why the run produced no report, in one line for a table: it could not start, was
/// stopped at `timeout`, exited non-zero (with the last lines of its stderr), or left
/// no readable JSON.
pub fn run_report(
    exe: &Path,
    dir: &Path,
    args: &[String],
    timeout: Duration,
) -> Result<Report, String> {
    let json = dir.join("run.json");
    let (out, err) = (dir.join("run.stdout"), dir.join("run.stderr"));
    let _ = std::fs::remove_file(&json);
    let mut cmd = Command::new(exe);
    cmd.arg("run").args(args).arg("--json").arg(&json);
    for var in launch_vars() {
        cmd.env_remove(var);
    }
    let file =
        |p: &Path| std::fs::File::create(p).map_err(|e| format!("creating {}: {e}", p.display()));
    cmd.stdin(Stdio::null())
        .stdout(file(&out)?)
        .stderr(file(&err)?);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let (status, stopped) = wait_bounded(&mut child, timeout).map_err(|e| format!("{e:#}"))?;
    if stopped {
        return Err(format!(
            "stopped after the --timeout-s limit of {} s",
            timeout.as_secs()
        ));
    }
    if !status.success() {
        return Err(format!("{status}: {}", tail(&err, 3)));
    }
    let text = std::fs::read_to_string(&json)
        .map_err(|e| format!("no JSON report {}: {e}", json.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("unreadable JSON report {}: {e}", json.display()))
}
