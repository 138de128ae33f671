//! The control plane's errors and the failure record.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use multigrain_cluster_config::{Launcher, RankError};

use super::ENV_CLUSTER;
use super::wire::FrameError;

/// A cluster that failed or died, as every cluster learns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The cluster that failed.
    pub cluster: usize,
    /// What happened, in words (the `abort` reason, or how its death was
    /// noticed).
    pub reason: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cluster {} failed: {}", self.cluster, self.reason)
    }
}

/// Why the control plane could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// Neither `multigrain launch` nor a known launcher set this process's
    /// cluster id.
    #[error(
        "this process does not know which cluster it is: {ENV_CLUSTER} is not set, and neither \
         is a Slurm, PMI or Open MPI rank (SLURM_PROCID, PMI_RANK, OMPI_COMM_WORLD_RANK). Start \
         the job with `multigrain launch --config FILE -- COMMAND`, or one process per cluster \
         with `srun -n {clusters} COMMAND` or `mpirun -n {clusters} COMMAND` (a Slurm rank counts \
         only inside a job step: SLURM_STEP_ID set)"
    )]
    NoIdentity {
        /// The number of clusters in the configuration.
        clusters: usize,
    },
    /// The key file named by `MULTIGRAIN_KEY_FILE` is unusable.
    #[error("job key file {path} (MULTIGRAIN_KEY_FILE): {problem}")]
    KeyFile {
        /// The file's path.
        path: String,
        /// What is wrong with it (never its contents).
        problem: String,
    },
    /// A variable set by `multigrain launch` is missing or wrong.
    #[error("{var}{}: {problem}", value.as_ref().map(|v| format!(" = {v:?}")).unwrap_or_default())]
    BadVariable {
        /// The variable's name.
        var: &'static str,
        /// Its value, `None` when unset.
        value: Option<String>,
        /// What is wrong and what to do.
        problem: String,
    },
    /// The launcher's rank variables are unusable.
    #[error("{0}")]
    Rank(#[from] RankError),
    /// Started by a launcher, cluster 0 has no fixed port, and the launcher
    /// does not say enough to find the coordinator.
    #[error(
        "the clusters were started by {launcher} and cluster 0 has no fixed port in the config, \
         but {reason}: name every cluster's host in [[cluster]] tables and give the first one a \
         fixed `port` (the coordinator listens on that TCP port)"
    )]
    NoRendezvous {
        /// The launcher whose rank variables were found.
        launcher: Launcher,
        /// What the launcher does not say.
        reason: String,
    },
    /// The config places this cluster on a host that is not this machine.
    #[error(
        "cluster {cluster} ({launcher} rank {cluster}) runs on {here}, but the config places it on \
         {host}, which is not an address of this machine: list the clusters in the order of the \
         launcher's ranks, or leave the hosts out (a [local] config) and let {launcher} place them"
    )]
    HostNotHere {
        /// The cluster (= rank).
        cluster: usize,
        /// The launcher.
        launcher: Launcher,
        /// The host the config names.
        host: String,
        /// This machine's name.
        here: String,
    },
    /// The coordinator's host name does not resolve.
    #[error("cannot resolve the coordinator address {host}:{port} (cluster 0's host): {reason}")]
    Resolve {
        /// The host name.
        host: String,
        /// The port.
        port: u16,
        /// The resolver's answer.
        reason: String,
    },
    /// The registration passed to `join` does not match the identity.
    #[error("{0}")]
    Usage(String),
    /// Cluster 0 could not listen at the coordinator address.
    #[error("cluster 0 (the coordinator) cannot listen on TCP {addr}: {error}{hint}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        error: io::Error,
        /// What to do, starting with `"; "`, or empty.
        hint: String,
    },
    /// A member never reached the coordinator.
    #[error(
        "cluster {cluster} could not reach the coordinator (cluster 0) at {addr} within {}: \
         {last_error}; is cluster 0 running, with the same config, and can this host reach {addr}?",
        show_duration(*timeout)
    )]
    Unreachable {
        /// The member.
        cluster: usize,
        /// The coordinator's address.
        addr: SocketAddr,
        /// The start-up timeout.
        timeout: Duration,
        /// The last connection error.
        last_error: String,
    },
    /// Start-up did not complete in time.
    #[error(
        "cluster {cluster}: start-up did not complete within {}: {} (coordinator at {coordinator}); \
         check that every cluster was started, with the same config, and can reach that address",
        show_duration(*timeout),
        missing_text(missing)
    )]
    StartupTimeout {
        /// The cluster reporting.
        cluster: usize,
        /// The coordinator's address.
        coordinator: SocketAddr,
        /// The start-up timeout.
        timeout: Duration,
        /// The clusters that never registered (empty when unknown).
        missing: Vec<usize>,
    },
    /// The coordinator refused this cluster.
    #[error("cluster {cluster}: the coordinator at {coordinator} refused it: {reason}")]
    Rejected {
        /// The cluster refused.
        cluster: usize,
        /// The coordinator's address.
        coordinator: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The peer belongs to another job (another `job.key`).
    #[error(
        "cluster {cluster}: {peer} belongs to another job: its frames carry job key {theirs:#018x}, \
         this job's key (config `job.key`) is {ours:#018x}; another job may be using the port \
         (choose another port for cluster 0), or the clusters were started with different configs"
    )]
    ForeignJob {
        /// The cluster reporting.
        cluster: usize,
        /// The peer's address.
        peer: SocketAddr,
        /// This job's key.
        ours: u64,
        /// The key the peer sent.
        theirs: u64,
    },
    /// The peer sent something that is not a valid frame.
    #[error("cluster {cluster}: bad control-plane frame from {peer}: {error}")]
    Protocol {
        /// The cluster reporting.
        cluster: usize,
        /// The peer's address.
        peer: SocketAddr,
        /// What was wrong.
        error: String,
    },
    /// A control connection failed.
    #[error("cluster {cluster}: control connection to {peer} failed while {doing}: {error}")]
    Io {
        /// The cluster reporting.
        cluster: usize,
        /// The peer's address.
        peer: SocketAddr,
        /// What was being done.
        doing: &'static str,
        /// The error.
        error: io::Error,
    },
    /// A cluster failed or died; the job cannot go on.
    #[error("{0}")]
    ClusterFailed(Failure),
    /// Not every cluster reached a barrier in time.
    #[error(
        "cluster {cluster}: barrier {tag} was not reached by {} within {}",
        waiting_text(missing),
        show_duration(*timeout)
    )]
    BarrierTimeout {
        /// The cluster reporting.
        cluster: usize,
        /// The barrier's tag.
        tag: u32,
        /// The timeout.
        timeout: Duration,
        /// The clusters that had not arrived (empty when unknown).
        missing: Vec<usize>,
    },
    /// Not every cluster finished in time.
    #[error(
        "cluster {cluster}: {} did not finish within {}",
        waiting_text(missing),
        show_duration(*timeout)
    )]
    FinishTimeout {
        /// The cluster reporting.
        cluster: usize,
        /// The timeout.
        timeout: Duration,
        /// The clusters that had not finished (empty when unknown).
        missing: Vec<usize>,
    },
    /// A barrier after `finish`.
    #[error("cluster {cluster}: the control plane has finished; no barrier after finish")]
    Finished {
        /// The cluster reporting.
        cluster: usize,
    },
}

impl ControlError {
    /// The failure this error reports, if it is [`ControlError::ClusterFailed`].
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            ControlError::ClusterFailed(f) => Some(f),
            _ => None,
        }
    }

    /// Turns a frame error from `peer` into the matching control error.
    pub(crate) fn from_frame(cluster: usize, peer: SocketAddr, e: FrameError) -> Self {
        match e {
            FrameError::ForeignKey { found, expected } => ControlError::ForeignJob {
                cluster,
                peer,
                ours: expected,
                theirs: found,
            },
            other => ControlError::Protocol {
                cluster,
                peer,
                error: other.to_string(),
            },
        }
    }
}

/// `"cluster 2"`, `"clusters 2, 3"`.
pub(crate) fn cluster_list(ids: &[usize]) -> String {
    let list = ids
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() == 1 {
        format!("cluster {list}")
    } else {
        format!("clusters {list}")
    }
}

fn missing_text(missing: &[usize]) -> String {
    if missing.is_empty() {
        "the coordinator did not broadcast the configuration (which clusters are missing is \
         unknown)"
            .to_owned()
    } else {
        format!("{} never registered", cluster_list(missing))
    }
}

fn waiting_text(missing: &[usize]) -> String {
    if missing.is_empty() {
        "every cluster".to_owned()
    } else {
        cluster_list(missing)
    }
}

/// `"800 ms"`, `"2 s"`, `"1.5 s"`.
pub(crate) fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}
