//! `multigrain launch`: one process per cluster, its output prefixed with
//! its cluster id, failures and signals turned into a stop of the whole job.
//!
//! Each cluster process gets [`ENV_CLUSTER`], [`ENV_CLUSTERS`],
//! [`ENV_COORDINATOR`] and [`ENV_CONFIG`]; the control plane
//! (`multigrain_messaging::control`) reads them. When every cluster runs on this
//! machine, they also get [`ENV_KEY_FILE`]: the path of a file, mode 0600 in a private
//! (0700) scratch directory removed at the end, holding the job's fresh random secret,
//! under which every control frame and INI datagram is authenticated. The path, not the
//! key, is in the environment, so the key is on no command line and in no
//! `/proc/PID/environ` (both readable by the same user's other processes; the file is
//! too, but only through the file system's permissions, which a key file can keep
//! tightest). A job with clusters on other hosts gets no key file: cluster 0
//! generates the secret and hands it out at registration (see
//! `multigrain_messaging::control::secret`). Clusters on loopback hosts
//! are started directly, the others over ssh. Every child runs in its own
//! process group with `PR_SET_PDEATHSIG(SIGKILL)`, so no cluster outlives
//! the launcher, even when the launcher is killed with SIGKILL.
//!
//! A `multigrain` cluster's stdin is a pipe from the launcher (a remote one's: the ssh
//! channel). When a cluster fails by itself, the launcher writes a notice naming it, how
//! it ended and its last error line to every cluster still running: one that has not
//! joined the job yet — which the control plane cannot tell, e.g. because the dead
//! cluster never reached the coordinator, or was the coordinator — stops at once with
//! that report (see [`spawn::watch_stdin`]) instead of waiting for a timeout.

pub(crate) mod cpus;
mod output;
pub mod self_bind;
mod signals;
pub mod spawn;
pub mod step_notice;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ChildStdin, ExitStatus};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use multigrain_cluster_config::JobConfig;
use multigrain_messaging::control::{
    ENV_CLUSTER, ENV_CLUSTERS, ENV_CONFIG, ENV_COORDINATOR, ENV_KEY_FILE, EXIT_PEER_FAILED, Secret,
    free_tcp_port, resolve,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use output::{ErrorTail, Sink};
use spawn::Plan;

/// How often the launcher looks for signals and timeouts.
const POLL: Duration = Duration::from_millis(20);
/// How long the launcher waits for a failed cluster's last error line before it tells
/// the others.
const TAIL_WAIT: Duration = Duration::from_millis(100);
/// How long the launcher waits for the last output of its children.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// What `multigrain launch` was asked to do.
pub struct Options {
    /// The job's TOML file.
    pub config: PathBuf,
    /// `--set KEY=VALUE` values applied over it; the clusters then read the resolved job
    /// from a scratch file (so all must run on this host).
    pub set: Vec<multigrain_cluster_config::Override>,
    /// Replaces the config's `launch.ssh` prefix; split at whitespace.
    pub ssh: Option<String>,
    /// From a failure (or signal) to SIGKILL: stragglers get SIGTERM
    /// `peer_timeout + grace` after the first failure, and SIGKILL `grace`
    /// after any SIGTERM.
    pub grace: Duration,
    /// The command each cluster runs.
    pub command: Vec<String>,
    /// A private directory of this process (`multigrain run`'s scratch directory) for the
    /// job's key file; `None`: `launch` makes its own when it needs one.
    pub key_dir: Option<PathBuf>,
}

/// One started cluster process.
struct Proc {
    plan: Plan,
    pid: i32,
    status: Option<ExitStatus>,
    /// Position in the order in which the clusters ended.
    ended: usize,
    /// The launcher signalled it while it was running.
    stopped: Option<Signal>,
    /// Its stdin, where the launcher writes notices (a `multigrain` cluster, or a remote
    /// one, whose ssh channel this is: closing it stops the cluster).
    notices: Option<ChildStdin>,
    /// The last error line of its stderr.
    tail: Arc<Mutex<ErrorTail>>,
}

impl Proc {
    fn signal_group(&mut self, signal: Signal) {
        if self.status.is_none() && self.stopped != Some(Signal::SIGKILL) {
            self.stopped = Some(signal);
        }
        // The group may already be empty (ESRCH): nothing to do then.
        let _ = killpg(Pid::from_raw(self.pid), signal);
    }

    fn describe(&self) -> String {
        let status = match self.status {
            Some(s) => describe_status(s),
            None => "is still running".to_owned(),
        };
        let how = if self.plan.remote { "ssh to" } else { "on" };
        let by_us = match (self.stopped, self.status.and_then(|s| s.signal())) {
            (Some(sent), Some(got)) if sent as i32 == got => " by launch".to_owned(),
            (Some(sent), _) if self.failed() => format!(", after launch sent {sent}"),
            _ => String::new(),
        };
        format!(
            "cluster {} (pid {} {how} {}) {status}{by_us}",
            self.plan.cluster, self.pid, self.plan.host
        )
    }

    /// How it ended, with its last error line when it printed one (waiting a moment for
    /// the end of its stderr, which may still be on its way).
    fn why(&self) -> String {
        let until = Instant::now() + TAIL_WAIT;
        let last = loop {
            let (last, ended) = match self.tail.lock() {
                Ok(t) => (t.last.clone(), t.ended),
                Err(_) => (None, true),
            };
            if ended || Instant::now() >= until {
                break last;
            }
            thread::sleep(Duration::from_millis(5));
        };
        match last {
            Some(text) => format!("{}: {text}", self.describe()),
            None => self.describe(),
        }
    }

    fn failed(&self) -> bool {
        self.status.is_some_and(|s| !s.success())
    }
}

fn describe_status(s: ExitStatus) -> String {
    if let Some(code) = s.code() {
        format!("exited with code {code}")
    } else if let Some(sig) = s.signal() {
        match Signal::try_from(sig) {
            Ok(name) => format!("was killed by signal {sig} ({name})"),
            Err(_) => format!("was killed by signal {sig}"),
        }
    } else {
        format!("ended with status {s}")
    }
}

fn launch_line(text: &str) {
    eprintln!("multigrain launch: {text}");
}

/// Runs `multigrain launch`. Returns when every cluster has ended; an error
/// summarises which clusters failed and how. On SIGINT or SIGTERM every
/// cluster is stopped and the process exits with 128 + the signal number.
pub fn run(opts: Options) -> Result<()> {
    if opts.command.is_empty() {
        bail!(
            "no command to launch: give it after `--`, e.g. `multigrain launch --config job.toml -- multigrain hello`"
        );
    }
    let cfg = JobConfig::from_path_with_overrides(&opts.config, &opts.set)?;
    // With --set, the clusters read the resolved job from a scratch file of this host.
    let scratch = if opts.set.is_empty() {
        None
    } else {
        if let Some(c) = cfg.clusters.iter().find(|c| !c.is_loopback()) {
            bail!(
                "--set with a cluster on another host ({}): the clusters read the job from a file of this host; write the values into {} instead",
                c.host,
                opts.config.display()
            );
        }
        let dir = crate::commands::run::spawn::ScratchDir::new()?;
        let p = dir.path().join("job.toml");
        std::fs::write(&p, cfg.to_toml_string())
            .with_context(|| format!("writing {}", p.display()))?;
        Some((dir, p))
    };
    let config_file = scratch
        .as_ref()
        .map_or(opts.config.as_path(), |(_, p)| p.as_path());
    let config = std::fs::canonicalize(config_file)
        .with_context(|| format!("cannot resolve the path of {}", config_file.display()))?;
    let n = cfg.clusters.len();
    let ssh: Vec<String> = match &opts.ssh {
        Some(s) => s.split_whitespace().map(str::to_owned).collect(),
        None => cfg.launch.ssh.clone(),
    };
    let here: Vec<bool> = cfg
        .clusters
        .iter()
        .map(|c| is_this_machine(&c.host))
        .collect();
    if ssh.is_empty() && here.iter().any(|h| !h) {
        bail!("--ssh is empty: remote clusters need a command such as `ssh -o BatchMode=yes`");
    }
    let c0 = &cfg.clusters[0];
    if c0.is_loopback()
        && let Some(remote) = cfg.clusters.iter().find(|c| !c.is_loopback())
    {
        bail!(
            "{}: cluster 0 runs on {} (this machine's loopback), but cluster {} runs on {}, which \
             could not reach cluster 0's coordinator there; give cluster 0 a host name or address \
             that every host can reach",
            opts.config.display(),
            c0.host,
            remote.id,
            remote.host
        );
    }
    let port = if c0.port != 0 {
        c0.port
    } else {
        // Pick a port free here; for a remote cluster 0 it is very likely
        // free there too (set a fixed port in the config if it is not).
        let ip = if c0.is_loopback() {
            resolve(&c0.host, 0)
                .map(|a| a.ip())
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        free_tcp_port(ip).with_context(|| {
            format!("cannot find a free TCP port on {ip} for cluster 0's coordinator")
        })?
    };
    let coordinator = if c0.host.contains(':') && !c0.host.starts_with('[') {
        format!("[{}]:{port}", c0.host)
    } else {
        format!("{}:{port}", c0.host)
    };
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    // The job's secret, for clusters that can read a file of this host (all of them, or
    // none: cluster 0 then bootstraps it).
    // It goes into the caller's private directory, else the one made for --set, else
    // one made here (every one removed at the end).
    let key_file = if here.iter().all(|&h| h) {
        let given = opts
            .key_dir
            .clone()
            .or_else(|| scratch.as_ref().map(|(d, _)| d.path().to_path_buf()));
        let (own, dir) = match given {
            Some(d) => (None, d),
            None => {
                let s = crate::commands::run::spawn::ScratchDir::new()?;
                let d = s.path().to_path_buf();
                (Some(s), d)
            }
        };
        let path = dir.join("job.key");
        Secret::generate()
            .and_then(|s| s.write_file(&path))
            .with_context(|| format!("cannot write the job's key file {}", path.display()))?;
        Some((own, path))
    } else {
        None
    };
    let binding = match cpus::allowed() {
        Ok(allowed) => cpus::plan(
            cfg.launch.cpu_bind,
            &cfg.clusters,
            &here,
            &allowed,
            !cfg.ini.inline,
            cpus::sysfs_core,
        ),
        Err(e) => {
            tracing::warn!("cannot read this process's CPU mask ({e}): clusters not bound");
            vec![None; n]
        }
    };
    // Clusters started over ssh on a shared host bind themselves (self_bind).
    let remote_shares = self_bind::remote_shares(
        cfg.launch.cpu_bind,
        &cfg.clusters,
        &here,
        !cfg.ini.inline,
        self_bind::same_machine(),
    );
    let plans: Vec<Plan> = cfg
        .clusters
        .iter()
        .map(|c| {
            let mut env = vec![
                (ENV_CLUSTER.to_owned(), c.id.to_string()),
                (ENV_CLUSTERS.to_owned(), n.to_string()),
                (ENV_COORDINATOR.to_owned(), coordinator.clone()),
                (ENV_CONFIG.to_owned(), config.to_string_lossy().into_owned()),
            ];
            if let Some((_, path)) = &key_file {
                env.push((ENV_KEY_FILE.to_owned(), path.to_string_lossy().into_owned()));
            }
            // The clusters log as this process does (-v/-q or RUST_LOG).
            if let Some(f) = crate::logging::filter() {
                env.push(("RUST_LOG".to_owned(), f.to_owned()));
            }
            if here[c.id] {
                if let Some(protocol) = binding[c.id].as_ref().and_then(|b| b.protocol.as_ref()) {
                    env.push((cpus::ENV_PROTOCOL_CPUS.to_owned(), cpus::describe(protocol)));
                }
                let mut plan = Plan::local(c.id, &c.host, &opts.command, env);
                plan.cpus = binding[c.id].as_ref().map(|b| b.cpus.clone());
                plan
            } else {
                if let Some(share) = &remote_shares[c.id] {
                    env.push((self_bind::ENV_CPU_SHARE.to_owned(), share.encode()));
                }
                Plan::remote(c.id, &c.host, &ssh, &cwd, &opts.command, env)
            }
        })
        .collect();

    signals::install()?;
    let (done_tx, done_rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel();
    let mut procs: Vec<Proc> = Vec::with_capacity(n);
    for plan in plans {
        let mut child = match plan.spawn() {
            Ok(child) => child,
            Err(e) => {
                for p in &mut procs {
                    p.signal_group(Signal::SIGKILL);
                }
                let deadline = Instant::now() + OUTPUT_DRAIN;
                for _ in 0..procs.len() {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if exit_rx.recv_timeout(left).is_err() {
                        break;
                    }
                }
                bail!(
                    "cannot start cluster {} on {}: `{}`: {e}",
                    plan.cluster,
                    plan.host,
                    plan.display()
                );
            }
        };
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        let how = if plan.remote { "ssh to" } else { "on" };
        if !crate::progress::quiet() {
            let cpus = match (&plan.cpus, &remote_shares[plan.cluster]) {
                (Some(c), _) => match binding[plan.cluster]
                    .as_ref()
                    .and_then(|b| b.protocol.as_ref())
                {
                    Some(p) => format!(
                        ", CPUs {}, its protocol thread on CPUs {}",
                        cpus::describe(c),
                        cpus::describe(p)
                    ),
                    None => format!(", CPUs {}", cpus::describe(c)),
                },
                (None, Some(share)) => format!(
                    ", binds itself to its share of that host's CPUs with the other \
                     clusters there (launch.cpu_bind = {})",
                    share.bind
                ),
                (None, None) => String::new(),
            };
            launch_line(&format!(
                "cluster {}: pid {pid} {how} {}{cpus}",
                plan.cluster, plan.host
            ));
        }
        let streams = [
            child
                .stdout
                .take()
                .map(|s| (Box::new(s) as Box<dyn std::io::Read + Send>, Sink::Stdout)),
            child
                .stderr
                .take()
                .map(|s| (Box::new(s) as Box<dyn std::io::Read + Send>, Sink::Stderr)),
        ];
        let tail = Arc::new(Mutex::new(ErrorTail::default()));
        for (stream, sink) in streams.into_iter().flatten() {
            let keep = matches!(sink, Sink::Stderr).then(|| Arc::clone(&tail));
            if let Err(e) = output::forward(plan.cluster, stream, sink, done_tx.clone(), keep) {
                launch_line(&format!(
                    "cannot forward the output of cluster {}: {e}",
                    plan.cluster
                ));
            }
        }
        // The notice channel (a remote cluster's ssh channel) stays open while the
        // launcher lives (Child::wait would close it): its end tells the cluster to stop.
        let notices = child.stdin.take();
        let index = procs.len();
        let exit_tx = exit_tx.clone();
        // Waiting on its own thread records the order in which clusters end.
        let waiter = thread::Builder::new()
            .name(format!("launch-wait-c{}", plan.cluster))
            .spawn(move || {
                let status = child.wait();
                let _ = exit_tx.send((index, status));
            });
        if let Err(e) = waiter {
            bail!(
                "cannot start a thread to wait for cluster {}: {e}",
                plan.cluster
            );
        }
        procs.push(Proc {
            plan,
            pid,
            status: None,
            ended: usize::MAX,
            stopped: None,
            notices,
            tail,
        });
    }
    drop(done_tx);
    drop(exit_tx);
    let streams = procs.len() * 2;

    let outcome = monitor(&mut procs, &exit_rx, cfg.job.peer_timeout(), opts.grace);
    // Whatever a cluster left behind in its process group goes too.
    for p in &mut procs {
        let _ = killpg(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
    // So do the shared-memory names of clusters that ended before unlinking them (a
    // cluster unlinks its segment once its peers attached; one stopped earlier — killed,
    // or told by this launcher that another cluster failed before the job started —
    // leaves it). Only names of this user whose creating process is gone are removed.
    if procs.iter().any(|p| !p.plan.remote) {
        multigrain_messaging::segment::sweep_stale();
    }
    let drain_until = Instant::now() + OUTPUT_DRAIN;
    for _ in 0..streams {
        let left = drain_until.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }

    if let Some(signal) = outcome.interrupted {
        let report: Vec<String> = procs.iter().map(Proc::describe).collect();
        launch_line(&format!("stopped by {signal}: {}", report.join("; ")));
        // Returned, not exited here, so that callers' scratch directories are removed on
        // the way out; `main` exits with 128 + the signal's number.
        return Err(Interrupted(signal).into());
    }
    let mut failed: Vec<&Proc> = procs.iter().filter(|p| p.failed()).collect();
    if failed.is_empty() {
        return Ok(());
    }
    failed.sort_by_key(|p| p.ended);
    // Clusters that stopped because another failed say so with their exit
    // code; the others are the causes, in the order they ended.
    let (mut causes, mut consequences): (Vec<&Proc>, Vec<&Proc>) = failed
        .iter()
        .partition(|p| p.status.and_then(|s| s.code()) != Some(EXIT_PEER_FAILED));
    if causes.is_empty() {
        causes = std::mem::take(&mut consequences);
    }
    let mut summary: Vec<String> = causes.iter().map(|p| p.describe()).collect();
    if !consequences.is_empty() {
        consequences.sort_by_key(|p| p.plan.cluster);
        let ids: Vec<String> = consequences
            .iter()
            .map(|p| p.plan.cluster.to_string())
            .collect();
        summary.push(format!(
            "{} {} then stopped because another cluster failed (exit code {EXIT_PEER_FAILED})",
            if ids.len() == 1 {
                "cluster"
            } else {
                "clusters"
            },
            ids.join(", ")
        ));
    }
    bail!(
        "{} of {n} clusters failed: {}",
        failed.len(),
        summary.join("; ")
    )
}

/// What happened while the clusters ran.
struct Outcome {
    /// The first cluster that failed.
    first_failure: Option<usize>,
    /// The signal that stopped the job.
    interrupted: Option<Signal>,
}

/// Waits until every child has ended, stopping them all on SIGINT/SIGTERM
/// and stopping stragglers `peer_timeout + grace` after the first failure.
/// `exits` delivers `(index in procs, wait result)` as children end.
fn monitor(
    procs: &mut [Proc],
    exits: &mpsc::Receiver<(usize, std::io::Result<ExitStatus>)>,
    peer_timeout: Duration,
    grace: Duration,
) -> Outcome {
    let mut outcome = Outcome {
        first_failure: None,
        interrupted: None,
    };
    let mut failed_at: Option<Instant> = None;
    let mut term_at: Option<Instant> = None;
    let mut killed = false;
    let mut noticed = false;
    let mut ended = 0;
    loop {
        let event = exits.recv_timeout(POLL);
        let now = Instant::now();
        if let Ok((index, result)) = event {
            let p = &mut procs[index];
            let status = result.unwrap_or_else(|e| {
                launch_line(&format!(
                    "cannot wait for cluster {} (pid {}): {e}",
                    p.plan.cluster, p.pid
                ));
                ExitStatus::from_raw(1 << 8)
            });
            p.status = Some(status);
            p.ended = ended;
            ended += 1;
            if !status.success() && outcome.first_failure.is_none() {
                outcome.first_failure = Some(p.plan.cluster);
                failed_at = Some(now);
            }
            // A cluster that failed by itself (not because another did) may have died
            // before it reached the coordinator, or as the coordinator before the others
            // reached it: then only the launcher knows. It tells the clusters still
            // running; those still joining the job stop at once naming it, the others
            // (whose control plane reports failures) ignore the notice.
            if !status.success()
                && status.code() != Some(EXIT_PEER_FAILED)
                && outcome.interrupted.is_none()
                && !noticed
            {
                noticed = true;
                let notice = spawn::failure_notice(p.plan.cluster, &p.why());
                for q in procs.iter_mut().filter(|q| q.status.is_none()) {
                    if let Some(pipe) = &mut q.notices {
                        // A cluster that just ended cannot read it (EPIPE): nothing to do.
                        let _ = pipe.write_all(notice.as_bytes());
                    }
                }
            }
        }
        if procs.iter().all(|p| p.status.is_some()) {
            return outcome;
        }
        if let Some(signal) = signals::take() {
            if outcome.interrupted.is_none() {
                outcome.interrupted = Some(signal);
                launch_line(&format!(
                    "{signal} received: stopping every cluster (SIGTERM now, SIGKILL after {} ms)",
                    grace.as_millis()
                ));
                for p in procs.iter_mut() {
                    p.signal_group(Signal::SIGTERM);
                }
                term_at = Some(now);
            } else if !killed {
                launch_line(&format!("{signal} received again: killing every cluster"));
                for p in procs.iter_mut() {
                    p.signal_group(Signal::SIGKILL);
                }
                killed = true;
            }
        }
        if let (Some(at), None) = (failed_at, term_at)
            && now >= at + peer_timeout + grace
        {
            let running: Vec<String> = procs
                .iter()
                .filter(|p| p.status.is_none())
                .map(|p| p.plan.cluster.to_string())
                .collect();
            launch_line(&format!(
                "cluster(s) {} still running {} ms after cluster {} failed: stopping them",
                running.join(", "),
                (peer_timeout + grace).as_millis(),
                outcome.first_failure.unwrap_or_default()
            ));
            for p in procs.iter_mut() {
                p.signal_group(Signal::SIGTERM);
            }
            term_at = Some(now);
        }
        if let Some(t) = term_at
            && !killed
            && now >= t + grace
        {
            for p in procs.iter_mut() {
                p.signal_group(Signal::SIGKILL);
            }
            killed = true;
        }
    }
}

/// Whether `host` names this machine: a loopback name or address, this machine's host
/// name, or a name or address that resolves to an address of this machine (binding a
/// UDP socket to it succeeds). Such clusters are started directly, not over ssh.
fn is_this_machine(host: &str) -> bool {
    use multigrain_messaging::control::{host_is_here, this_host_name};
    multigrain_cluster_config::is_loopback(host)
        || this_host_name().is_some_and(|n| n.eq_ignore_ascii_case(host))
        || host_is_here(host) == Some(true)
}

/// The launcher was stopped by SIGINT or SIGTERM after stopping every cluster; the
/// process should exit with 128 + the signal's number (the shell's convention), saying
/// nothing more (the launcher has reported).
#[derive(Debug, Clone, Copy)]
pub struct Interrupted(pub Signal);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped by {}", self.0)
    }
}

impl std::error::Error for Interrupted {}
