//! The job control plane: who is in the job, start-up, barriers between
//! start-up phases, failure propagation and the end of the job.
//!
//! Every cluster process of a job creates one [`Control`] with
//! [`Control::join`]. The clusters form a TCP star through cluster 0, the
//! *coordinator*: cluster 0 listens at [`Identity::coordinator`], every
//! other cluster (a *member*) connects, retrying until the start-up timeout,
//! and registers. When all have registered, the coordinator broadcasts every
//! [`Registration`] — the configuration broadcast of paper 002 §3.2, from
//! which every INI learns every other INI's address — and `join` returns
//! them everywhere, indexed by cluster id. If start-up cannot complete
//! within `job.startup_timeout_ms`, `join` fails naming the clusters that
//! never registered.
//!
//! After start-up:
//!
//! * [`Control::barrier`] holds every cluster until all have reached it
//!   (start-up phases such as "INIs up" and "begin");
//! * heartbeats travel both ways on every connection every
//!   `peer_timeout / 4`. A connection silent for `job.peer_timeout_ms`, or
//!   closed or reset before its cluster called [`Control::finish`], is a
//!   failure of that cluster; the coordinator tells every other cluster. If
//!   the coordinator dies, every member reports "cluster 0 (the coordinator)
//!   died". A process that dies closes its sockets at once, so a death is
//!   usually known everywhere within milliseconds, and always within
//!   `peer_timeout`. A silent connection whose cluster the caller's liveness
//!   oracle ([`Control::consult_liveness`]) proved alive more recently is given
//!   `peer_timeout` from that evidence instead (its heartbeat thread may be
//!   starved by compute threads). [`Control::failure`] and [`Control::on_failure`] tell
//!   the caller; [`Control::abort`] reports this cluster's own failure;
//! * [`Control::finish`] returns when every cluster has finished, so no
//!   cluster tears down its network while another still needs it.
//!
//! Frames ([`wire`]) carry the job label (`job.key`), a protocol version and a keyed
//! MAC under the job's secret ([`secret`]): a process of another job is refused, and
//! once the secret is agreed a frame that does not verify ends its connection. The
//! secret and the run's random epoch that the INIs authenticate their datagrams with
//! are agreed here ([`Control::session`]).
//!
//! The code: this file holds [`Control`]'s running-job calls; `join` the start-up entry
//! points, `coordinator` and `member` each side's start-up, `shared`
//! the state the reader and heartbeat threads share and their loops, `conn` one
//! connection.
//!
//! ```no_run
//! use multigrain_cluster_config::JobConfig;
//! use multigrain_control::{Control, Identity, Registration};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = JobConfig::from_path("job.toml".as_ref())?;
//! let id = Identity::from_env(&cfg)?;
//! let (control, all) = Control::join(&id, &cfg.job, Registration::local(id.cluster, vec![]))?;
//! println!("cluster {} of {}; cluster 0 runs on {}", id.cluster, all.len(), all[0].host);
//! control.barrier(1, cfg.job.startup_timeout())?;
//! // ... the job ...
//! control.finish(cfg.job.startup_timeout())?;
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

mod conn;
mod coordinator;
mod error;
mod identity;
mod join;
mod member;
mod pmix;
pub mod secret;
mod shared;
pub mod wire;

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use multigrain_cluster_config::JobSettings;
use parking_lot::{Condvar, Mutex};

pub use error::{ControlError, Failure};
pub use identity::{
    Identity, Placed, Registration, free_loopback_port, free_tcp_port, host_is_here,
    parse_host_port, resolve, this_host_name,
};
pub use secret::{ENV_KEY_FILE, Secret, Session};
use wire::{Auth, FrameError, Message, ReadError, Received};

use conn::{Conn, Lost};
use error::show_duration;
use member::connect;
use shared::{Shared, State};

/// Cluster id of this process; set by `multigrain launch`.
pub const ENV_CLUSTER: &str = "MULTIGRAIN_CLUSTER_ID";
/// Number of clusters in the job; set by `multigrain launch`.
pub const ENV_CLUSTERS: &str = "MULTIGRAIN_CLUSTERS";
/// `host:port` of cluster 0's coordinator (TCP); set by `multigrain launch`.
pub const ENV_COORDINATOR: &str = "MULTIGRAIN_COORDINATOR";
/// Absolute path of the job's TOML file; set by `multigrain launch`.
pub const ENV_CONFIG: &str = "MULTIGRAIN_CONFIG";

/// Exit code of a cluster process that stops because *another* cluster
/// failed ([`ControlError::ClusterFailed`] naming another cluster), so that
/// `multigrain launch` can tell the cause of a failed job from its
/// consequences. A cluster's own failure exits with another non-zero code.
pub const EXIT_PEER_FAILED: i32 = 3;

/// Set once a [`Control::join`] of this process has returned `Ok`: from then on the
/// control plane reports other clusters' failures; before it, only a launcher can.
static JOINED: AtomicBool = AtomicBool::new(false);

/// Whether this process has joined a job: a [`Control::join`] returned `Ok`. Before that,
/// a cluster that dies without reaching the coordinator (or a coordinator that dies
/// before a member reached it) is seen by no one but the launcher, which tells the
/// clusters still joining (see `multigrain launch`); after it, the control plane reports
/// every failure itself and such notices are ignored.
pub fn joined() -> bool {
    JOINED.load(Ordering::SeqCst)
}

/// How long the coordinator waits for a new connection's registration.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);
/// How long a coordinator whose start-up failed goes on telling members that connect
/// late which cluster failed.
const LATE_WINDOW: Duration = Duration::from_secs(1);
/// How often the coordinator looks for new connections during start-up: a member's
/// connection waits in the listen backlog for up to this long before its handshake
/// starts. (10 ms until the thirty-third session, which added up to 10 ms to every
/// job's start-up; a wake-up per millisecond for the few milliseconds of a start-up, or
/// the seconds of a slow one, costs nothing measurable.)
const ACCEPT_POLL: Duration = Duration::from_millis(1);
/// How long a member waits for the coordinator's first frame after registering (at
/// most `job.peer_timeout_ms`). Cluster 0 answers every registration at once with the
/// clusters still missing (within milliseconds: it accepts and reads registrations in
/// a loop from the moment it listens), so silence means that whatever accepted the
/// connection is not this job's coordinator — the port was held by another process,
/// and cluster 0, unable to listen there, has failed — or that cluster 0 hangs. Under
/// `srun` without `-K` nothing else tells the members (issue 13: they waited for the
/// peer timeout, 3.3 s).
pub const FIRST_ANSWER: Duration = Duration::from_millis(750);

/// A cluster whose every compute thread waits in the DSM (see
/// [`Control::report_progress`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    /// Since a wait of the cluster last began or ended.
    pub duration: Duration,
    /// One line per waiting thread: what it waits for and for how long.
    pub waits: Vec<String>,
}

/// One cluster's handle on the job's control plane. Dropping it without
/// [`Control::finish`] closes its connections, which every other cluster
/// learns as this cluster's failure.
pub struct Control {
    shared: Arc<Shared>,
    /// Set by [`Control::join`] before it returns.
    session: OnceLock<Session>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("cluster", &self.shared.me)
            .field("clusters", &self.shared.clusters)
            .field("coordinator", &self.shared.coordinator)
            .finish_non_exhaustive()
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl Control {
    /// This cluster's id.
    pub fn cluster(&self) -> usize {
        self.shared.me
    }

    /// The number of clusters in the job.
    pub fn clusters(&self) -> usize {
        self.shared.clusters
    }

    /// The coordinator's address.
    pub fn coordinator(&self) -> SocketAddr {
        self.shared.coordinator
    }

    /// The job's secret and the run's epoch, as agreed at registration: the INIs
    /// authenticate their datagrams with them.
    pub fn session(&self) -> &Session {
        // Invariant: `join` sets the session before it returns a `Control`.
        self.session
            .get()
            .expect("Control::join sets the session before returning")
    }

    /// Waits until every cluster has reached barrier `tag` (start-up phases
    /// such as "INIs up" and "begin"). Barriers with the same tag may be
    /// repeated; each call is one more round.
    ///
    /// # Errors
    ///
    /// [`ControlError::ClusterFailed`] when a cluster failed (before or
    /// during the wait), [`ControlError::BarrierTimeout`] after `timeout`
    /// (naming the missing clusters on the coordinator),
    /// [`ControlError::Finished`] after [`Control::finish`].
    pub fn barrier(&self, tag: u32, timeout: Duration) -> Result<(), ControlError> {
        let shared = &self.shared;
        let deadline = Instant::now() + timeout;
        {
            let st = shared.state.lock();
            if let Some(f) = &st.failure {
                return Err(ControlError::ClusterFailed(f.clone()));
            }
            if st.finishing || st.done {
                return Err(ControlError::Finished { cluster: shared.me });
            }
        }
        if shared.me == 0 {
            shared.arrive(tag, 0);
        } else {
            for conn in shared.links() {
                shared.send_to(&conn, &Message::Barrier { tag });
            }
        }
        let mut st = shared.state.lock();
        loop {
            if let Some(left) = st.released.get_mut(&tag) {
                *left -= 1;
                if *left == 0 {
                    st.released.remove(&tag);
                }
                return Ok(());
            }
            if let Some(f) = &st.failure {
                return Err(ControlError::ClusterFailed(f.clone()));
            }
            if Instant::now() >= deadline {
                let missing = match st.arrivals.get(&tag) {
                    Some(arrived) if shared.me == 0 => (0..shared.clusters)
                        .filter(|c| !arrived.contains(c))
                        .collect(),
                    _ => Vec::new(),
                };
                return Err(ControlError::BarrierTimeout {
                    cluster: shared.me,
                    tag,
                    timeout,
                    missing,
                });
            }
            shared.changed.wait_until(&mut st, deadline);
        }
    }

    /// Lets `heard(c)` — when cluster `c`'s process was last proven alive, for example by
    /// the liveness thread's authenticated answers — keep a silent connection alive: a
    /// cluster whose control connection is silent for `job.peer_timeout_ms` is declared
    /// dead only once `peer_timeout` has also passed since that evidence (its heartbeat
    /// thread may be starved by compute threads). A stopped or dead process gives no
    /// evidence and is reported as before. Set once; later calls are ignored.
    pub fn consult_liveness(
        &self,
        heard: impl Fn(usize) -> Option<Instant> + Send + Sync + 'static,
    ) {
        let _ = self.shared.liveness.set(Box::new(heard));
    }

    /// The first cluster that failed or died, if any (non-blocking).
    pub fn failure(&self) -> Option<Failure> {
        self.shared.state.lock().failure.clone()
    }

    /// Waits up to `timeout` for a failure; returns it, or `None` if none
    /// happened (or the job finished) in that time.
    pub fn wait_failure(&self, timeout: Duration) -> Option<Failure> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state.lock();
        loop {
            if st.failure.is_some() || st.done || Instant::now() >= deadline {
                return st.failure.clone();
            }
            self.shared.changed.wait_until(&mut st, deadline);
        }
    }

    /// Calls `f` from a background thread when any cluster (this one
    /// included, through [`Control::abort`]) fails or dies; at most once. If
    /// a failure is already known, `f` is called at once from a new thread.
    pub fn on_failure(&self, f: impl Fn(&Failure) + Send + Sync + 'static) {
        let mut st = self.shared.state.lock();
        match st.failure.clone() {
            Some(failure) => {
                drop(st);
                let spawned = thread::Builder::new()
                    .name("mg-ctl-on-failure".into())
                    .spawn(move || f(&failure));
                if let Err(e) = spawned {
                    tracing::warn!("cannot start the on_failure thread: {e}");
                }
            }
            None => st.callbacks.push(Box::new(f)),
        }
    }

    /// This cluster failed: tells the others, who learn it as a
    /// [`Failure`] naming this cluster with `reason`. This cluster's own
    /// [`Control::failure`] reports it too, and pending barriers return.
    pub fn abort(&self, reason: &str) {
        let shared = &self.shared;
        if shared.me != 0 {
            for conn in shared.links() {
                let _ = conn.send(&Message::Abort {
                    reason: reason.to_owned(),
                });
            }
        }
        shared.report(Failure {
            cluster: shared.me,
            reason: reason.to_owned(),
        });
    }

    /// The progress watchdog's report of this cluster: `Some` while every compute
    /// thread of the cluster waits in the DSM (what for, and since the last wait
    /// began or ended), `None` while any computes. Call it periodically (every
    /// second or so) while `job.progress_timeout_ms` is on; a member sends it to the
    /// coordinator, which fails the job — [`Failure`] naming what every cluster's
    /// threads wait for — once every cluster reports a stall of at least the
    /// timeout. A no-op when the watchdog is off, before start-up completed, or
    /// after a failure.
    pub fn report_progress(&self, stall: Option<Stall>) {
        let shared = &self.shared;
        if shared.progress_timeout.is_none() {
            return;
        }
        if shared.me == 0 {
            shared.progress(0, stall);
            return;
        }
        let msg = Message::Progress {
            stall: stall.map(|s| wire::StallReport {
                for_ms: u64::try_from(s.duration.as_millis()).unwrap_or(u64::MAX),
                waits: s.waits,
            }),
        };
        for conn in shared.links() {
            shared.send_to(&conn, &msg);
        }
    }

    /// The progress watchdog's timeout (`job.progress_timeout_ms`), `None` when off.
    pub fn progress_timeout(&self) -> Option<Duration> {
        self.shared.progress_timeout
    }

    /// This cluster is done: returns when every cluster is done (so nobody
    /// tears down its network while a peer still needs it). Calling it again
    /// after success returns at once.
    ///
    /// # Errors
    ///
    /// [`ControlError::ClusterFailed`] if a cluster failed,
    /// [`ControlError::FinishTimeout`] if not every cluster finished within
    /// `timeout`.
    pub fn finish(&self, timeout: Duration) -> Result<(), ControlError> {
        let shared = &self.shared;
        let deadline = Instant::now() + timeout;
        {
            let mut st = shared.state.lock();
            if st.done {
                return Ok(());
            }
            if let Some(f) = &st.failure {
                return Err(ControlError::ClusterFailed(f.clone()));
            }
            st.finishing = true;
        }
        if shared.me == 0 {
            shared.mark_finished(0);
        } else {
            for conn in shared.links() {
                shared.send_to(&conn, &Message::Finish);
            }
        }
        let mut st = shared.state.lock();
        while !st.done {
            if let Some(f) = &st.failure {
                return Err(ControlError::ClusterFailed(f.clone()));
            }
            if Instant::now() >= deadline {
                let missing = if shared.me == 0 {
                    (0..shared.clusters)
                        .filter(|c| !st.finished.contains(c))
                        .collect()
                } else {
                    Vec::new()
                };
                return Err(ControlError::FinishTimeout {
                    cluster: shared.me,
                    timeout,
                    missing,
                });
            }
            shared.changed.wait_until(&mut st, deadline);
        }
        if shared.me == 0 {
            // Let every member read `Done` and hang up before this process
            // may exit; a member that does not is cut off after peer_timeout.
            let limit = deadline.min(Instant::now() + shared.peer_timeout);
            while st.closed.len() + 1 < shared.clusters && Instant::now() < limit {
                shared.changed.wait_until(&mut st, limit);
            }
        } else {
            drop(st);
            for conn in shared.links() {
                conn.shutdown();
            }
        }
        Ok(())
    }
}
