//! Errors of the DSM runtime.

use crate::uffd::{OpError, RegionError};
use multigrain_coherence::{ConfigError, DecodeError, ProtocolError};
use multigrain_messaging::SiteError;

/// Why a DSM operation failed. Every variant names the cluster (and page or lock) it is
/// about and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DsmError {
    /// The job configuration and the transport do not fit together or the runtime
    /// cannot use them.
    #[error("DSM configuration of cluster {cluster}: {reason}")]
    Config {
        /// This cluster.
        cluster: usize,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The coherence protocol rejected the configuration.
    #[error("DSM configuration of cluster {cluster}: {source}")]
    Protocol {
        /// This cluster.
        cluster: usize,
        /// The protocol's reason.
        #[source]
        source: ConfigError,
    },
    /// Creating the userfaultfd region failed (see the source for the kernel's reason and
    /// what to change: another base address, `vm.unprivileged_userfaultfd`, ...).
    #[error("cluster {cluster}: cannot create the DSM region: {source}")]
    Region {
        /// This cluster.
        cluster: usize,
        /// Why.
        #[source]
        source: RegionError,
    },
    /// The message layer refused an endpoint or a route.
    #[error("cluster {cluster}: message layer: {source}")]
    Site {
        /// This cluster.
        cluster: usize,
        /// Why.
        #[source]
        source: SiteError,
    },
    /// Another cluster of the job started with a different configuration.
    #[error(
        "cluster {peer} runs a different DSM configuration than cluster {cluster} \
         (fingerprint {theirs:#012x} vs {ours:#012x}): start every cluster from the same \
         job configuration"
    )]
    ConfigMismatch {
        /// This cluster.
        cluster: usize,
        /// The other cluster.
        peer: usize,
        /// Our fingerprint.
        ours: u64,
        /// Theirs.
        theirs: u64,
    },
    /// Some clusters did not start the runtime in time.
    #[error(
        "cluster {cluster}: clusters {missing:?} did not join the DSM job within {timeout_ms} ms \
         (job.startup_timeout_ms); check that every cluster process was started"
    )]
    StartupTimeout {
        /// This cluster.
        cluster: usize,
        /// Clusters not heard from.
        missing: Vec<usize>,
        /// The timeout.
        timeout_ms: u64,
    },
    /// A cluster of the job failed: its process died, it aborted, or it fell silent. The
    /// job cannot continue; every cluster reports this.
    #[error("cluster {cluster} failed: {reason} (detected by cluster {detected_by}{})", context.as_deref().map(|c| format!(" while {c}")).unwrap_or_default())]
    PeerFailed {
        /// The cluster that failed.
        cluster: usize,
        /// What happened to it.
        reason: String,
        /// The cluster reporting this error.
        detected_by: usize,
        /// What the reporting thread was waiting for, when known.
        context: Option<String>,
    },
    /// A protocol message could not be decoded (a peer bug or corrupted memory).
    #[error("cluster {cluster}: malformed message from cluster {from}: {reason}")]
    Malformed {
        /// This cluster.
        cluster: usize,
        /// The sender.
        from: usize,
        /// What was wrong.
        reason: String,
    },
    /// The coherence machine reported a protocol violation (fatal for the job).
    #[error("cluster {cluster}: coherence protocol violation: {source}")]
    Violation {
        /// This cluster.
        cluster: usize,
        /// The machine's error.
        #[source]
        source: ProtocolError,
    },
    /// A page operation the protocol asked for failed in the kernel.
    #[error("cluster {cluster}: page operation failed: {source}")]
    PageOp {
        /// This cluster.
        cluster: usize,
        /// The failed operation.
        #[source]
        source: OpError,
    },
    /// A send failed for a reason other than a full queue (no route, unknown name).
    #[error("cluster {cluster}: sending {what} to cluster {to} failed: {reason}")]
    Send {
        /// This cluster.
        cluster: usize,
        /// The destination.
        to: usize,
        /// The message.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// Shared allocation beyond the region.
    #[error(
        "cluster {cluster}: cannot allocate {bytes} bytes of shared memory: only {available} \
         of the region's {region} bytes are left (raise dsm.region_size)"
    )]
    OutOfSpace {
        /// This cluster.
        cluster: usize,
        /// Bytes requested.
        bytes: usize,
        /// Bytes left.
        available: usize,
        /// Region size.
        region: usize,
    },
    /// A lock id beyond the protocol's range.
    #[error("cluster {cluster}: lock {lock} is out of range (locks are below {max})")]
    BadLock {
        /// This cluster.
        cluster: usize,
        /// The lock id.
        lock: u64,
        /// The bound.
        max: u32,
    },
    /// A compute thread panicked; the parallel section was abandoned and the job aborted.
    #[error("cluster {cluster}: compute thread {thread} panicked: {message}")]
    ThreadPanicked {
        /// This cluster.
        cluster: usize,
        /// Global thread id.
        thread: usize,
        /// The panic message.
        message: String,
    },
    /// A thread could not be started.
    #[error("cluster {cluster}: starting {what} failed: {source}")]
    Spawn {
        /// This cluster.
        cluster: usize,
        /// Which thread.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A runtime invariant broke: a bug in multigrain.
    #[error("cluster {cluster}: internal error (a multigrain bug, please report it): {detail}")]
    Internal {
        /// This cluster.
        cluster: usize,
        /// What broke.
        detail: String,
    },
    /// Too many threads of this process use the runtime at once.
    #[error(
        "cluster {cluster}: more than {max} threads use the DSM runtime at once in this process"
    )]
    TooManyThreads {
        /// This cluster.
        cluster: usize,
        /// The limit.
        max: usize,
    },
}

impl DsmError {
    /// A decode error of a message from `from`.
    pub(crate) fn malformed(cluster: usize, from: usize, e: DecodeError) -> Self {
        DsmError::Malformed {
            cluster,
            from,
            reason: e.to_string(),
        }
    }

    /// The cluster this error blames: the failed peer for [`DsmError::PeerFailed`], this
    /// cluster otherwise.
    pub fn blamed_cluster(&self) -> usize {
        match self {
            DsmError::PeerFailed { cluster, .. }
            | DsmError::Config { cluster, .. }
            | DsmError::Protocol { cluster, .. }
            | DsmError::Region { cluster, .. }
            | DsmError::Site { cluster, .. }
            | DsmError::StartupTimeout { cluster, .. }
            | DsmError::Malformed { cluster, .. }
            | DsmError::Violation { cluster, .. }
            | DsmError::PageOp { cluster, .. }
            | DsmError::Send { cluster, .. }
            | DsmError::OutOfSpace { cluster, .. }
            | DsmError::BadLock { cluster, .. }
            | DsmError::ThreadPanicked { cluster, .. }
            | DsmError::Spawn { cluster, .. }
            | DsmError::Internal { cluster, .. }
            | DsmError::TooManyThreads { cluster, .. } => *cluster,
            DsmError::ConfigMismatch { peer, .. } => *peer,
        }
    }
}
