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

mod error;
mod identity;
mod pmix;
pub mod secret;
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

use error::show_duration;

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
/// How often the coordinator looks for new connections during start-up.
const ACCEPT_POLL: Duration = Duration::from_millis(10);
/// How long a member waits for the coordinator's first frame after registering (at
/// most `job.peer_timeout_ms`). Cluster 0 answers every registration at once with the
/// clusters still missing (within milliseconds: it accepts and reads registrations in
/// a loop from the moment it listens), so silence means that whatever accepted the
/// connection is not this job's coordinator — the port was held by another process,
/// and cluster 0, unable to listen there, has failed — or that cluster 0 hangs. Under
/// `srun` without `-K` nothing else tells the members (issue 13: they waited for the
/// peer timeout, 3.3 s).
pub const FIRST_ANSWER: Duration = Duration::from_millis(750);

/// One control connection, seen from this end.
struct Conn {
    /// The cluster at the other end.
    cluster: usize,
    /// Its address.
    peer: SocketAddr,
    /// The job label frames carry.
    label: u64,
    /// Frames are written whole under this lock, with a MAC once it holds the secret.
    writer: Mutex<Writer>,
    /// A handle for `shutdown`, usable while a write blocks.
    ctl: TcpStream,
}

/// The writing side of a connection.
struct Writer {
    stream: TcpStream,
    /// Frames carry a MAC under this secret (`None`: before the bootstrap `Welcome`).
    key: Option<Secret>,
}

impl Conn {
    /// Wraps `stream`; returns the connection and a handle for its reader. Frames carry
    /// a MAC under `key` when given.
    fn new(
        stream: TcpStream,
        cluster: usize,
        label: u64,
        key: Option<Secret>,
        write_timeout: Duration,
    ) -> io::Result<(Arc<Conn>, TcpStream)> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(write_timeout))?;
        let peer = stream.peer_addr()?;
        let conn = Conn {
            cluster,
            peer,
            label,
            writer: Mutex::new(Writer {
                stream: stream.try_clone()?,
                key,
            }),
            ctl: stream.try_clone()?,
        };
        Ok((Arc::new(conn), stream))
    }

    fn send(&self, msg: &Message) -> io::Result<()> {
        let mut w = self.writer.lock();
        let frame = wire::encode(self.label, w.key.as_ref(), msg);
        w.stream.write_all(&frame)
    }

    /// Sends `msg`, then authenticates every later frame under `key` (the bootstrap
    /// `Welcome` and the switch, atomically with respect to other senders).
    fn send_then_authenticate(&self, msg: &Message, key: &Secret) -> io::Result<()> {
        let mut w = self.writer.lock();
        let frame = wire::encode(self.label, w.key.as_ref(), msg);
        let sent = w.stream.write_all(&frame);
        w.key = Some(key.clone());
        sent
    }

    /// Authenticates every later frame under `key`.
    fn authenticate(&self, key: &Secret) {
        self.writer.lock().key = Some(key.clone());
    }

    fn shutdown(&self) {
        let _ = self.ctl.shutdown(Shutdown::Both);
    }
}

/// How a connection ended.
enum Lost {
    Closed,
    Reset(io::Error),
    Silent,
    Read(io::Error),
    Send(io::Error),
    Frame(FrameError),
}

impl From<ReadError> for Lost {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Closed => Lost::Closed,
            ReadError::Frame(f) => Lost::Frame(f),
            ReadError::Io(e) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Lost::Silent,
                io::ErrorKind::UnexpectedEof => Lost::Closed,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => Lost::Reset(e),
                _ => Lost::Read(e),
            },
        }
    }
}

type Callback = Box<dyn Fn(&Failure) + Send + Sync>;

#[derive(Default)]
struct State {
    /// The first failure learned.
    failure: Option<Failure>,
    /// `on_failure` callbacks not yet called.
    callbacks: Vec<Callback>,
    /// Barrier releases not yet consumed, by tag.
    released: HashMap<u32, u64>,
    /// Coordinator: clusters arrived at each open barrier.
    arrivals: HashMap<u32, BTreeSet<usize>>,
    /// Coordinator: clusters that called `finish`.
    finished: BTreeSet<usize>,
    /// Coordinator: clusters whose connection has ended.
    closed: BTreeSet<usize>,
    /// Coordinator during start-up: clusters not registered yet.
    missing: Option<Vec<usize>>,
    /// Coordinator during start-up: a member gave up waiting (its own
    /// start-up timeout passed first).
    gave_up: Option<usize>,
    /// This cluster called `finish`.
    finishing: bool,
    /// Every cluster finished.
    done: bool,
    /// The `Control` is being dropped.
    closing: bool,
    /// A failure is being broadcast; it becomes `failure` afterwards.
    announcing: bool,
    /// Coordinator: `Done` is being broadcast; `done` follows.
    announcing_done: bool,
    /// Coordinator: each cluster's last progress report (`None`: not stalled, or
    /// nothing heard yet).
    stalls: Vec<Option<Stall>>,
}

struct Shared {
    me: usize,
    clusters: usize,
    /// The job label (`job.key`).
    label: u64,
    /// The secret came from a key file: every frame must carry a MAC.
    preshared: bool,
    /// The job's secret, once known (at once when pre-shared or on the coordinator;
    /// from the `Welcome` on a bootstrapped member).
    secret: OnceLock<Secret>,
    coordinator: SocketAddr,
    peer_timeout: Duration,
    /// `job.progress_timeout_ms`; `None`: the watchdog is off.
    progress_timeout: Option<Duration>,
    links: Mutex<Vec<Arc<Conn>>>,
    state: Mutex<State>,
    changed: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Evidence that a cluster's process is alive although its connection is silent
    /// ([`Control::consult_liveness`]).
    liveness: OnceLock<LivenessOracle>,
}

/// When a cluster's process was last proven alive, by cluster id.
type LivenessOracle = Box<dyn Fn(usize) -> Option<Instant> + Send + Sync>;

impl Shared {
    fn links(&self) -> Vec<Arc<Conn>> {
        self.links.lock().clone()
    }

    fn spawn(self: &Arc<Self>, name: String, f: impl FnOnce(Arc<Shared>) + Send + 'static) {
        let shared = Arc::clone(self);
        match thread::Builder::new().name(name).spawn(move || f(shared)) {
            Ok(h) => self.threads.lock().push(h),
            Err(e) => self.report(Failure {
                cluster: self.me,
                reason: format!("cannot start a control-plane thread: {e}"),
            }),
        }
    }

    /// Sends `msg` on `conn`; a failed send is that connection's loss.
    fn send_to(&self, conn: &Conn, msg: &Message) {
        if let Err(e) = conn.send(msg) {
            self.connection_lost(conn.cluster, conn.peer, Lost::Send(e));
        }
    }

    fn broadcast(&self, msg: &Message, except: Option<usize>) {
        for conn in self.links() {
            if Some(conn.cluster) != except {
                self.send_to(&conn, msg);
            }
        }
    }

    /// Records the job's first failure, tells every cluster (coordinator) and
    /// calls the callbacks. The coordinator broadcasts before the failure
    /// becomes visible here, so a caller that reacts by exiting cannot cut
    /// the broadcast short.
    fn report(&self, f: Failure) {
        {
            let mut st = self.state.lock();
            if st.failure.is_some() || st.announcing || st.done || st.announcing_done || st.closing
            {
                return;
            }
            st.announcing = true;
        }
        tracing::debug!(cluster = self.me, "control: {f}");
        if self.me == 0 {
            let msg = Message::Failed {
                cluster: f.cluster,
                reason: f.reason.clone(),
            };
            // The failed cluster too: a failure the coordinator declared (silence, a
            // stall) is news to it — a paused cluster that resumes then reports its own
            // failure instead of blaming the coordinator whose connection it finds
            // closed. One that reported its own failure ignores the echo.
            self.broadcast(&msg, None);
        }
        let callbacks = {
            let mut st = self.state.lock();
            st.announcing = false;
            st.failure = Some(f.clone());
            self.changed.notify_all();
            std::mem::take(&mut st.callbacks)
        };
        for cb in callbacks {
            cb(&f);
        }
    }

    /// The connection to `cluster` ended.
    fn connection_lost(&self, cluster: usize, peer: SocketAddr, how: Lost) {
        {
            let mut st = self.state.lock();
            if self.me == 0 {
                st.closed.insert(cluster);
                self.changed.notify_all();
                if st.finished.contains(&cluster) || st.gave_up.is_some() {
                    return;
                }
            }
            if st.closing || st.done || st.failure.is_some() || st.announcing {
                return;
            }
        }
        let timeout = show_duration(self.peer_timeout);
        let reason = if self.me == 0 {
            match how {
                Lost::Closed => "its control connection closed before it finished (the process \
                                 exited, crashed or was killed)"
                    .to_owned(),
                Lost::Reset(e) => format!(
                    "its control connection was reset ({e}): the process exited, crashed or was \
                     killed"
                ),
                Lost::Silent => format!(
                    "nothing heard from it (at {peer}) for {timeout}: it hangs, or its host or \
                     the network is down"
                ),
                Lost::Read(e) => format!("reading from its control connection failed: {e}"),
                Lost::Send(e) => format!("sending to it failed: {e}"),
                Lost::Frame(e) => format!("it sent a bad control frame: {e}"),
            }
        } else {
            match how {
                Lost::Closed => format!(
                    "cluster 0 (the coordinator) died: its control connection at {peer} closed"
                ),
                Lost::Reset(e) => format!(
                    "cluster 0 (the coordinator) died: its control connection at {peer} was \
                     reset ({e})"
                ),
                Lost::Silent => format!(
                    "cluster 0 (the coordinator) died or hangs: nothing heard from it at {peer} \
                     for {timeout}"
                ),
                Lost::Read(e) => {
                    format!("cluster 0 (the coordinator) died: reading from {peer} failed: {e}")
                }
                Lost::Send(e) => {
                    format!("cluster 0 (the coordinator) died: sending to {peer} failed: {e}")
                }
                Lost::Frame(e) => format!("cluster 0 (the coordinator) sent a bad frame: {e}"),
            }
        };
        let cluster = if self.me == 0 { cluster } else { 0 };
        self.report(Failure { cluster, reason });
    }

    /// A message from `from` after registration.
    fn handle(&self, from: usize, msg: Message) {
        match (self.me == 0, msg) {
            (_, Message::Heartbeat | Message::StartupStatus { .. }) => {}
            (true, Message::Barrier { tag }) => self.arrive(tag, from),
            (true, Message::Abort { reason }) => self.report(Failure {
                cluster: from,
                reason,
            }),
            (true, Message::Finish) => self.mark_finished(from),
            (true, Message::Progress { stall }) => self.progress(
                from,
                stall.map(|s| Stall {
                    duration: Duration::from_millis(s.for_ms),
                    waits: s.waits,
                }),
            ),
            (true, Message::StartupFailed { .. }) => {
                let mut st = self.state.lock();
                if st.missing.is_some() {
                    st.gave_up = Some(from);
                    self.changed.notify_all();
                }
            }
            (false, Message::Release { tag }) => {
                let mut st = self.state.lock();
                *st.released.entry(tag).or_default() += 1;
                self.changed.notify_all();
            }
            (false, Message::Failed { cluster, reason }) => {
                self.report(Failure { cluster, reason });
            }
            (false, Message::Done) => {
                let mut st = self.state.lock();
                st.done = true;
                self.changed.notify_all();
            }
            (_, other) => tracing::debug!(
                cluster = self.me,
                "control: ignoring unexpected {other:?} from cluster {from}"
            ),
        }
    }

    /// Coordinator: `from` reached barrier `tag`. The release is broadcast
    /// before the local waiters wake.
    fn arrive(&self, tag: u32, from: usize) {
        let complete = {
            let mut st = self.state.lock();
            let set = st.arrivals.entry(tag).or_default();
            set.insert(from);
            if set.len() == self.clusters {
                st.arrivals.remove(&tag);
                true
            } else {
                false
            }
        };
        if complete {
            self.broadcast(&Message::Release { tag }, None);
            let mut st = self.state.lock();
            *st.released.entry(tag).or_default() += 1;
            self.changed.notify_all();
        }
    }

    /// The secret every frame must carry a MAC under from the start (`None` unless it
    /// was pre-shared: a bootstrapped secret is sent in the `Welcome`, after start-up).
    fn preshared_key(&self) -> Option<&Secret> {
        self.preshared.then(|| self.secret.get()).flatten()
    }

    /// Logs (debug) the run's session: its epoch and where the secret came from.
    fn log_session(&self, epoch: u64) {
        let origin = match (self.preshared, self.me) {
            (true, _) => "pre-shared (key file or PMIx)",
            (false, 0) => "generated by cluster 0",
            (false, _) => "bootstrapped by cluster 0",
        };
        tracing::debug!(
            cluster = self.me,
            "session: epoch {epoch:#018x}, secret {origin}"
        );
    }

    /// Coordinator: `from`'s progress report. When every cluster's last report
    /// says it has stalled for at least `job.progress_timeout_ms`, the job fails
    /// with every cluster's waits, blamed on the cluster that stalled first. Only
    /// reported durations count (none is extrapolated), so a cluster that made
    /// progress since its last report cannot be declared stuck on stale evidence;
    /// the price is up to one watchdog period of delay.
    fn progress(&self, from: usize, stall: Option<Stall>) {
        let Some(timeout) = self.progress_timeout else {
            return;
        };
        let failure = {
            let mut st = self.state.lock();
            if st.failure.is_some() || st.announcing || st.done || st.closing {
                return;
            }
            if st.stalls.len() != self.clusters {
                st.stalls = vec![None; self.clusters];
            }
            let Some(entry) = st.stalls.get_mut(from) else {
                return;
            };
            *entry = stall;
            let all: Option<Vec<&Stall>> = st.stalls.iter().map(Option::as_ref).collect();
            match all {
                Some(all) if all.iter().all(|s| s.duration >= timeout) => {
                    Some(stall_failure(&all, timeout))
                }
                _ => None,
            }
        };
        if let Some(f) = failure {
            self.report(f);
        }
    }

    /// Coordinator: `from` called `finish`. `Done` is broadcast before the
    /// local `finish` returns.
    fn mark_finished(&self, from: usize) {
        let all = {
            let mut st = self.state.lock();
            st.finished.insert(from);
            let all = st.finished.len() == self.clusters
                && st.failure.is_none()
                && !st.announcing
                && !st.done
                && !st.announcing_done;
            st.announcing_done |= all;
            all
        };
        if all {
            self.broadcast(&Message::Done, None);
            let mut st = self.state.lock();
            st.done = true;
            self.changed.notify_all();
        }
    }

    /// Reads frames from `conn` until it ends. A MAC is required on every frame when
    /// the secret is pre-shared, and from the peer's first authenticated frame on when
    /// it was bootstrapped (its frames sent before it received the `Welcome` carry none).
    fn read_loop(&self, conn: &Conn, mut stream: TcpStream) {
        if let Err(e) = stream.set_read_timeout(Some(self.peer_timeout)) {
            self.connection_lost(conn.cluster, conn.peer, Lost::Read(e));
            return;
        }
        let mut required = self.preshared;
        loop {
            if let Err(lost) = self.await_frame(conn.cluster, &stream) {
                self.connection_lost(conn.cluster, conn.peer, lost);
                return;
            }
            let auth = Auth {
                key: self.secret.get(),
                required,
            };
            match wire::read_frame(&mut stream, self.label, auth) {
                Ok(Received { msg, authenticated }) => {
                    required |= authenticated;
                    self.handle(conn.cluster, msg)
                }
                Err(e) => {
                    self.connection_lost(conn.cluster, conn.peer, e.into());
                    return;
                }
            }
        }
    }

    /// Waits until `stream` (from `cluster`) has a byte to read, consuming nothing. A
    /// silence of `peer_timeout` is the connection's loss ([`Lost::Silent`]) unless the
    /// liveness oracle ([`Control::consult_liveness`]) proved the cluster alive within the
    /// last `peer_timeout`: its heartbeat thread may be starved by compute threads, so
    /// the wait goes on until `peer_timeout` after that evidence. Other errors are left to
    /// the read that follows.
    fn await_frame(&self, cluster: usize, stream: &TcpStream) -> Result<(), Lost> {
        let Some(oracle) = self.liveness.get() else {
            return Ok(());
        };
        let mut byte = [0u8; 1];
        let result = loop {
            match stream.peek(&mut byte) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    let left = oracle(cluster).and_then(|t| {
                        (t + self.peer_timeout).checked_duration_since(Instant::now())
                    });
                    match left {
                        Some(left) => {
                            let wait = left.max(Duration::from_millis(1));
                            if let Err(e) = stream.set_read_timeout(Some(wait)) {
                                break Err(Lost::Read(e));
                            }
                        }
                        None => break Err(Lost::Silent),
                    }
                }
                _ => break Ok(()),
            }
        };
        if result.is_ok()
            && let Err(e) = stream.set_read_timeout(Some(self.peer_timeout))
        {
            return Err(Lost::Read(e));
        }
        result
    }

    /// Sends a heartbeat (during the coordinator's start-up: the start-up
    /// status) on every connection every `peer_timeout / 4`.
    fn heartbeat_loop(&self) {
        let interval = (self.peer_timeout / 4).max(Duration::from_millis(1));
        let mut next = Instant::now() + interval;
        loop {
            let msg = {
                let mut st = self.state.lock();
                loop {
                    if st.closing || st.done {
                        return;
                    }
                    if Instant::now() >= next {
                        break;
                    }
                    self.changed.wait_until(&mut st, next);
                }
                match &st.missing {
                    Some(missing) => Message::StartupStatus {
                        missing: missing.clone(),
                    },
                    None => Message::Heartbeat,
                }
            };
            for conn in self.links() {
                self.send_to(&conn, &msg);
            }
            next += interval;
            let now = Instant::now();
            if next < now {
                next = now + interval;
            }
        }
    }

    /// Stops every thread and closes every connection.
    fn close(&self) {
        {
            let mut st = self.state.lock();
            st.closing = true;
            self.changed.notify_all();
        }
        for conn in self.links() {
            conn.shutdown();
        }
        let handles = std::mem::take(&mut *self.threads.lock());
        let me = thread::current().id();
        for h in handles {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }

    fn failed(&self) -> Result<(), ControlError> {
        match &self.state.lock().failure {
            Some(f) => Err(ControlError::ClusterFailed(f.clone())),
            None => Ok(()),
        }
    }
}

/// The job failure of a job whose every cluster (`stalls`, by cluster) has stalled
/// for at least `timeout`: blamed on the cluster stalled longest, naming every wait.
fn stall_failure(stalls: &[&Stall], timeout: Duration) -> Failure {
    // The longest stall; the lowest cluster id among equals.
    let first = (0..stalls.len())
        .min_by_key(|&c| (std::cmp::Reverse(stalls[c].duration), c))
        .unwrap_or(0);
    let waits: Vec<String> = stalls
        .iter()
        .enumerate()
        .map(|(c, s)| format!("cluster {c}: {}", s.waits.join(", ")))
        .collect();
    Failure {
        cluster: first,
        reason: format!(
            "no progress for {} (job.progress_timeout_ms): every compute thread of every \
             cluster waits in the DSM and none of the waits has ended, since cluster {first} \
             stopped first — a deadlock in the application (e.g. a lock held across a \
             barrier) or a lost protocol message. {}",
            show_duration(timeout),
            waits.join("; ")
        ),
    }
}

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
    fn new(id: &Identity, settings: &JobSettings) -> Control {
        let peer_timeout = settings.peer_timeout().max(Duration::from_millis(4));
        let secret = OnceLock::new();
        if let Some(s) = &id.secret {
            let _ = secret.set(s.clone());
        }
        Control {
            session: OnceLock::new(),
            shared: Arc::new(Shared {
                me: id.cluster,
                clusters: id.clusters,
                label: settings.key,
                preshared: id.secret.is_some(),
                secret,
                coordinator: id.coordinator,
                peer_timeout,
                progress_timeout: settings.progress_timeout(),
                links: Mutex::new(Vec::new()),
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                threads: Mutex::new(Vec::new()),
                liveness: OnceLock::new(),
            }),
        }
    }

    /// Joins the job. Cluster 0 becomes the coordinator (binds the TCP
    /// address `id.coordinator`); the others connect (retrying until the
    /// start-up timeout) and register. When all have registered, the
    /// coordinator broadcasts every registration (paper 002 §3.2) and every
    /// cluster returns them, indexed by cluster id. The broadcast also carries the run's
    /// random epoch and, when no key file gave every cluster the job's secret, the
    /// secret cluster 0 generated (see [`secret`]); [`Control::session`] returns both.
    ///
    /// # Errors
    ///
    /// Within `settings.startup_timeout()`:
    /// [`ControlError::StartupTimeout`] naming the clusters that never
    /// registered, [`ControlError::Unreachable`] when a member never reached
    /// the coordinator, [`ControlError::Bind`] when the coordinator cannot
    /// listen, [`ControlError::Rejected`] / [`ControlError::ForeignJob`] when
    /// the coordinator refuses this process (duplicate cluster id, other
    /// cluster count, other job label, no or a wrong MAC), [`ControlError::ClusterFailed`] when a
    /// cluster died during start-up, [`ControlError::Usage`] when `me` or
    /// `id` is inconsistent.
    pub fn join(
        id: &Identity,
        settings: &JobSettings,
        me: Registration,
    ) -> Result<(Control, Vec<Registration>), ControlError> {
        if id.clusters == 0 || id.cluster >= id.clusters {
            return Err(ControlError::Usage(format!(
                "cluster id {} is not below the cluster count {}",
                id.cluster, id.clusters
            )));
        }
        if me.cluster != id.cluster {
            return Err(ControlError::Usage(format!(
                "the registration is for cluster {} but this process is cluster {}",
                me.cluster, id.cluster
            )));
        }
        tracing::debug!(
            cluster = id.cluster,
            "joining the job as cluster {} of {} (coordinator {})",
            id.cluster,
            id.clusters,
            id.coordinator
        );
        let joined = if id.cluster == 0 {
            Self::join_coordinator(id, settings, me)
        } else {
            Self::join_member(id, settings, me)
        };
        if let Ok((_, regs)) = &joined {
            JOINED.store(true, Ordering::SeqCst);
            for r in regs {
                tracing::debug!(
                    cluster = id.cluster,
                    "address exchange: cluster {} is pid {} on {} ({} bytes of addresses)",
                    r.cluster,
                    r.pid,
                    r.host,
                    r.payload.len()
                );
            }
        }
        joined
    }

    /// This cluster cannot start for `reason`: tells the others, so that they stop at
    /// once — cluster 0 through [`Control::refuse_start`], a member through
    /// [`Control::report_cannot_start`].
    pub fn cannot_start(id: &Identity, settings: &JobSettings, reason: &str) {
        if id.cluster == 0 {
            Self::refuse_start(id, settings, reason);
        } else {
            Self::report_cannot_start(id, settings, reason);
        }
    }

    /// Called by cluster 0 when it cannot start: listens at the coordinator's address
    /// for up to the start-up timeout and answers every member that registers with
    /// [`Message::Failed`] naming cluster 0 and `reason`, so that the members stop at
    /// once with the cause instead of waiting for a coordinator that never comes.
    /// Returns when every member was told or the timeout passed; does nothing for a
    /// member or when the address cannot be bound.
    pub fn refuse_start(id: &Identity, settings: &JobSettings, reason: &str) {
        if id.cluster != 0 || id.clusters < 2 {
            return;
        }
        let addr = id.listen.unwrap_or(id.coordinator);
        let Ok(listener) = TcpListener::bind(addr) else {
            return;
        };
        let deadline = Instant::now() + settings.startup_timeout();
        let _ = listener.set_nonblocking(true);
        let mut told = std::collections::BTreeSet::new();
        let failed = Message::Failed {
            cluster: 0,
            reason: format!("could not start: {reason}"),
        };
        let key = id.secret.as_ref();
        let auth = Auth::preshared(key);
        while told.len() < id.clusters - 1 && Instant::now() < deadline {
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                    // A member that registers, or that cannot start either (it
                    // reports so and waits for this answer), is told.
                    match wire::read_frame(&mut &stream, settings.key, auth).map(|r| r.msg) {
                        Ok(Message::Register { registration, .. })
                            if (1..id.clusters).contains(&registration.cluster) =>
                        {
                            told.insert(registration.cluster);
                        }
                        Ok(Message::CannotStart { cluster, .. })
                            if (1..id.clusters).contains(&cluster) =>
                        {
                            told.insert(cluster);
                        }
                        _ => {}
                    }
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = wire::write_frame(&mut &stream, settings.key, key, &failed);
                    let _ = stream.shutdown(Shutdown::Write);
                }
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Tells the coordinator that this cluster (a member) cannot start, so that every
    /// cluster fails at once with `reason` instead of waiting for the start-up timeout.
    /// Best effort: tries to reach the coordinator for at most the start-up timeout (it
    /// may start later than this cluster); does nothing on cluster 0, whose members see
    /// the coordinator missing.
    pub fn report_cannot_start(id: &Identity, settings: &JobSettings, reason: &str) {
        if id.cluster == 0 || id.cluster >= id.clusters {
            return;
        }
        let limit = settings.startup_timeout();
        let Ok(stream) = connect(id, limit, Instant::now() + limit) else {
            return;
        };
        let msg = Message::CannotStart {
            cluster: id.cluster,
            reason: reason.to_owned(),
        };
        if let Err(e) = wire::write_frame(&mut &stream, settings.key, id.secret.as_ref(), &msg) {
            tracing::debug!("cluster {}: cannot tell the coordinator: {e}", id.cluster);
        }
        let _ = stream.shutdown(std::net::Shutdown::Write);
        // Give the coordinator time to read before the connection closes.
        let _ = stream.set_read_timeout(Some(limit));
        let _ = io::Read::read(&mut &stream, &mut [0u8; 1]);
    }

    fn join_coordinator(
        id: &Identity,
        settings: &JobSettings,
        me: Registration,
    ) -> Result<(Control, Vec<Registration>), ControlError> {
        let timeout = settings.startup_timeout();
        let deadline = Instant::now() + timeout;
        let addr = id.listen.unwrap_or(id.coordinator);
        let listener = TcpListener::bind(addr).map_err(|error| {
            let hint = match error.kind() {
                io::ErrorKind::AddrInUse => format!(
                    "; TCP port {} is in use on this host (another job or service?): give \
                     cluster 0 another port in the config",
                    addr.port()
                ),
                io::ErrorKind::AddrNotAvailable => format!(
                    "; {} is not an address of this host: cluster 0 must run on the host the \
                     config names for it",
                    addr.ip()
                ),
                _ => String::new(),
            };
            ControlError::Bind { addr, error, hint }
        })?;
        let control = Control::new(id, settings);
        let shared = &control.shared;
        let random = |e: io::Error| {
            ControlError::Usage(format!(
                "no random bytes for the job's secret and epoch: {e}"
            ))
        };
        if shared.secret.get().is_none() {
            let _ = shared.secret.set(Secret::generate().map_err(random)?);
        }
        let secret = shared.secret.get().cloned().expect("set just above");
        let epoch = Secret::random_epoch().map_err(random)?;
        let n = id.clusters;
        let mut regs: Vec<Option<Registration>> = vec![None; n];
        regs[0] = Some(me);
        if n > 1 {
            listener
                .set_nonblocking(true)
                .map_err(|error| ControlError::Bind {
                    addr,
                    error,
                    hint: String::new(),
                })?;
            shared.state.lock().missing = Some((1..n).collect());
            shared.spawn("mg-ctl-heartbeat".into(), |s| s.heartbeat_loop());
            let (tx, rx) = mpsc::channel();
            // Starts a handshake thread for each connection waiting to be accepted.
            let accept_all = || loop {
                match listener.accept() {
                    Ok((stream, from)) => {
                        let tx = tx.clone();
                        let label = settings.key;
                        let key = id.secret.clone();
                        let spawned = thread::Builder::new()
                            .name("mg-ctl-handshake".into())
                            .spawn(move || {
                                handshake(stream, from, label, key.as_ref(), deadline, &tx)
                            });
                        if let Err(e) = spawned {
                            tracing::warn!("cluster 0: cannot start a handshake thread: {e}");
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        tracing::debug!("cluster 0: accept on {addr} failed: {e}");
                        break;
                    }
                }
            };
            loop {
                accept_all();
                if let Ok((stream, from, result)) = rx.recv_timeout(ACCEPT_POLL) {
                    control.admit(&mut regs, stream, from, result);
                }
                if let Err(e) = shared.failed() {
                    if let ControlError::ClusterFailed(f) = &e {
                        // Members whose registration is still on its way would see this
                        // process hang up and blame it: tell them who failed.
                        let mut told: BTreeSet<usize> =
                            (1..n).filter(|&c| regs[c].is_some()).collect();
                        told.insert(f.cluster);
                        let until = (Instant::now() + LATE_WINDOW).min(deadline);
                        let failed = Message::Failed {
                            cluster: f.cluster,
                            reason: f.reason.clone(),
                        };
                        let key = shared.preshared_key();
                        while told.len() < n - 1 && Instant::now() < until {
                            accept_all();
                            if let Ok((stream, from, result)) = rx.recv_timeout(ACCEPT_POLL) {
                                if let Ok(Received {
                                    msg: Message::Register { registration, .. },
                                    ..
                                }) = &result
                                {
                                    told.insert(registration.cluster);
                                }
                                hang_up(Ok(stream), from, shared.label, key, &failed);
                            }
                        }
                    }
                    return Err(e);
                }
                let missing: Vec<usize> = (0..n).filter(|&c| regs[c].is_none()).collect();
                if missing.is_empty() {
                    break;
                }
                let gave_up = shared.state.lock().gave_up;
                if let Some(c) = gave_up {
                    tracing::debug!("cluster 0: cluster {c} gave up waiting for start-up");
                }
                if Instant::now() >= deadline || gave_up.is_some() {
                    let msg = Message::StartupFailed {
                        missing: missing.clone(),
                        timeout_ms: settings.startup_timeout_ms,
                    };
                    shared.broadcast(&msg, None);
                    return Err(ControlError::StartupTimeout {
                        cluster: 0,
                        coordinator: addr,
                        timeout,
                        missing,
                    });
                }
            }
            shared.state.lock().missing = None;
        }
        drop(listener);
        let registrations: Vec<Registration> = regs.into_iter().flatten().collect();
        if n > 1 {
            let welcome = Message::Welcome {
                registrations: registrations.clone(),
                epoch,
                secret: (!shared.preshared).then(|| secret.clone()),
            };
            if shared.preshared {
                shared.broadcast(&welcome, None);
            } else {
                // The bootstrap: each member learns the secret here; every later frame
                // on its connection carries the MAC.
                for conn in shared.links() {
                    if let Err(e) = conn.send_then_authenticate(&welcome, &secret) {
                        shared.connection_lost(conn.cluster, conn.peer, Lost::Send(e));
                    }
                }
            }
            shared.failed()?;
        }
        shared.log_session(epoch);
        let _ = control.session.set(Session { secret, epoch });
        Ok((control, registrations))
    }

    /// Coordinator during start-up: accepts or refuses one registration.
    fn admit(
        &self,
        regs: &mut [Option<Registration>],
        stream: TcpStream,
        from: SocketAddr,
        result: Result<Received, ReadError>,
    ) {
        let shared = &self.shared;
        let n = shared.clusters;
        let key = shared.preshared_key();
        let refuse = |reason: String| refuse(stream.try_clone(), from, shared.label, key, reason);
        let (registration, clusters) = match result.map(|r| r.msg) {
            Ok(Message::Register {
                registration,
                clusters,
            }) => (registration, clusters),
            Ok(Message::CannotStart { cluster, reason }) if (1..n).contains(&cluster) => {
                tracing::debug!("cluster 0: cluster {cluster} cannot start: {reason}");
                shared.report(Failure {
                    cluster,
                    reason: format!("could not start: {reason}"),
                });
                return;
            }
            Ok(other) => return refuse(format!("expected a registration, got {other:?}")),
            Err(ReadError::Frame(
                e @ (FrameError::ForeignKey { .. }
                | FrameError::Version { .. }
                | FrameError::MissingMac
                | FrameError::UnexpectedMac
                | FrameError::BadMac),
            )) => {
                return refuse(match e {
                    FrameError::ForeignKey { .. } => {
                        format!("{e} (a process of another job, or another `job.key`?)")
                    }
                    other => other.to_string(),
                });
            }
            Err(e) => {
                tracing::debug!(
                    "cluster 0: dropped a connection from {from} that did not register: {e}"
                );
                return;
            }
        };
        let c = registration.cluster;
        if clusters != n {
            return refuse(format!(
                "cluster {c} believes the job has {clusters} clusters, the coordinator's config \
                 has {n}: start every cluster with the same config"
            ));
        }
        if c == 0 || c >= n {
            return refuse(format!(
                "cluster id {c} is out of range: the members of this job are clusters 1 to {}",
                n - 1
            ));
        }
        if let Some(prev) = &regs[c] {
            return refuse(format!(
                "cluster {c} is already registered (pid {} on {}): two processes were started \
                 as cluster {c}",
                prev.pid, prev.host
            ));
        }
        let (conn, reader) = match Conn::new(
            stream,
            c,
            shared.label,
            key.cloned(),
            shared.peer_timeout / 2,
        ) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!("cluster 0: lost the connection of cluster {c} from {from}: {e}");
                return;
            }
        };
        shared.links.lock().push(Arc::clone(&conn));
        let reader_conn = Arc::clone(&conn);
        shared.spawn(format!("mg-ctl-read-{c}"), move |s| {
            s.read_loop(&reader_conn, reader)
        });
        regs[c] = Some(registration);
        let missing: Vec<usize> = (0..n).filter(|&i| regs[i].is_none()).collect();
        shared.state.lock().missing = Some(missing.clone());
        shared.send_to(&conn, &Message::StartupStatus { missing });
    }

    fn join_member(
        id: &Identity,
        settings: &JobSettings,
        me: Registration,
    ) -> Result<(Control, Vec<Registration>), ControlError> {
        let timeout = settings.startup_timeout();
        let deadline = Instant::now() + timeout;
        let addr = id.coordinator;
        let cluster = id.cluster;
        let stream = connect(id, timeout, deadline)?;
        let control = Control::new(id, settings);
        let shared = &control.shared;
        let io_err = |doing, error| ControlError::Io {
            cluster,
            peer: addr,
            doing,
            error,
        };
        let (conn, mut stream) = Conn::new(
            stream,
            0,
            settings.key,
            id.secret.clone(),
            shared.peer_timeout / 2,
        )
        .map_err(|e| io_err("setting up the connection", e))?;
        let auth = Auth::preshared(id.secret.as_ref());
        shared.links.lock().push(Arc::clone(&conn));
        let register = Message::Register {
            registration: me,
            clusters: id.clusters,
        };
        conn.send(&register).map_err(|e| io_err("registering", e))?;
        shared.spawn(format!("mg-ctl-heartbeat-{cluster}"), |s| {
            s.heartbeat_loop()
        });
        let mut missing = Vec::new();
        let mut heard = false;
        let (registrations, epoch, sent_secret) = loop {
            let now = Instant::now();
            if now >= deadline {
                // Tell the coordinator, so that this hang-up is not taken
                // for a crash.
                let _ = conn.send(&Message::StartupFailed {
                    missing: missing.clone(),
                    timeout_ms: settings.startup_timeout_ms,
                });
                return Err(ControlError::StartupTimeout {
                    cluster,
                    coordinator: addr,
                    timeout,
                    missing,
                });
            }
            let mut wait = (deadline - now).min(shared.peer_timeout);
            if !heard {
                wait = wait.min(FIRST_ANSWER);
            }
            stream
                .set_read_timeout(Some(wait))
                .map_err(|e| io_err("waiting for the configuration", e))?;
            let read = wire::read_frame(&mut stream, settings.key, auth).map(|r| r.msg);
            heard |= read.is_ok();
            match read {
                Ok(Message::StartupStatus { missing: m }) => missing = m,
                Ok(Message::Welcome {
                    registrations,
                    epoch,
                    secret,
                }) => break (registrations, epoch, secret),
                Ok(Message::StartupFailed {
                    missing,
                    timeout_ms,
                }) => {
                    return Err(ControlError::StartupTimeout {
                        cluster,
                        coordinator: addr,
                        timeout: Duration::from_millis(timeout_ms),
                        missing,
                    });
                }
                Ok(Message::Rejected { reason }) => {
                    return Err(ControlError::Rejected {
                        cluster,
                        coordinator: addr,
                        reason,
                    });
                }
                Ok(Message::Failed { cluster: c, reason }) => {
                    return Err(ControlError::ClusterFailed(Failure { cluster: c, reason }));
                }
                Ok(other) => tracing::debug!(
                    "cluster {cluster}: ignoring {other:?} from the coordinator during start-up"
                ),
                Err(ReadError::Frame(e)) => return Err(ControlError::from_frame(cluster, addr, e)),
                Err(e) => {
                    let lost = Lost::from(e);
                    if matches!(lost, Lost::Silent) && Instant::now() >= deadline {
                        continue;
                    }
                    let how = match lost {
                        Lost::Silent if !heard => format!(
                            "is not answering at {addr}: the connection was accepted, but \
                             nothing came back to this cluster's registration within {} — \
                             another process holds that port (so cluster 0 could not listen \
                             there), or cluster 0 hangs",
                            show_duration(wait)
                        ),
                        Lost::Silent => format!(
                            "died or hangs: nothing heard from it at {addr} for {}",
                            show_duration(wait)
                        ),
                        Lost::Closed => format!("died: its control connection at {addr} closed"),
                        Lost::Reset(e) | Lost::Read(e) | Lost::Send(e) => {
                            format!("died: its control connection at {addr} failed: {e}")
                        }
                        Lost::Frame(e) => format!("sent a bad frame: {e}"),
                    };
                    return Err(ControlError::ClusterFailed(Failure {
                        cluster: 0,
                        reason: format!("cluster 0 (the coordinator) {how} during start-up"),
                    }));
                }
            }
        };
        let consistent = registrations.len() == id.clusters
            && registrations
                .iter()
                .enumerate()
                .all(|(i, r)| r.cluster == i);
        if !consistent {
            return Err(ControlError::Protocol {
                cluster,
                peer: addr,
                error: format!(
                    "the configuration broadcast lists clusters {:?}, expected 0 to {}",
                    registrations.iter().map(|r| r.cluster).collect::<Vec<_>>(),
                    id.clusters - 1
                ),
            });
        }
        let secret = match (&id.secret, sent_secret) {
            (Some(mine), _) => mine.clone(),
            (None, Some(sent)) => {
                conn.authenticate(&sent);
                let _ = shared.secret.set(sent.clone());
                sent
            }
            (None, None) => {
                return Err(ControlError::Protocol {
                    cluster,
                    peer: addr,
                    error: format!(
                        "cluster 0 sent no job secret and this cluster has no key file \
                         ({ENV_KEY_FILE}): start every cluster of the job the same way"
                    ),
                });
            }
        };
        shared.log_session(epoch);
        let _ = control.session.set(Session { secret, epoch });
        let reader_conn = Arc::clone(&conn);
        shared.spawn(format!("mg-ctl-read-{cluster}"), move |s| {
            s.read_loop(&reader_conn, stream)
        });
        Ok((control, registrations))
    }

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

/// Coordinator: tells a refused process why and hangs up. The refused side
/// may still be sending, so its data is drained on a thread until it hangs up
/// too (at most a second): closing with unread data would reset the
/// connection and could destroy the reason before it is read.
fn refuse(
    stream: io::Result<TcpStream>,
    from: SocketAddr,
    label: u64,
    key: Option<&Secret>,
    reason: String,
) {
    tracing::warn!("cluster 0: refused the connection from {from}: {reason}");
    hang_up(stream, from, label, key, &Message::Rejected { reason });
}

/// Coordinator: sends `msg` on `stream` and hangs up, draining what the other side still
/// sends on a thread until it hangs up too (at most a second), so that the close does not
/// reset the connection and destroy `msg` before it is read.
fn hang_up(
    stream: io::Result<TcpStream>,
    from: SocketAddr,
    label: u64,
    key: Option<&Secret>,
    msg: &Message,
) {
    let Ok(stream) = stream else { return };
    let linger = Duration::from_secs(1);
    let _ = stream.set_write_timeout(Some(linger));
    if let Err(e) = wire::write_frame(&mut &stream, label, key, msg) {
        tracing::debug!("cluster 0: cannot answer {from}: {e}");
    }
    let _ = stream.shutdown(Shutdown::Write);
    let _ = thread::Builder::new()
        .name("mg-ctl-refuse".into())
        .spawn(move || {
            let deadline = Instant::now() + linger;
            let mut sink = [0u8; 4096];
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                if stream
                    .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                    .is_err()
                {
                    break;
                }
                match io::Read::read(&mut &stream, &mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        });
}

/// Coordinator: reads a new connection's first frame on its own thread (with a MAC
/// under `key` when the secret is pre-shared, without one otherwise).
fn handshake(
    stream: TcpStream,
    from: SocketAddr,
    label: u64,
    key: Option<&Secret>,
    deadline: Instant,
    tx: &mpsc::Sender<(TcpStream, SocketAddr, Result<Received, ReadError>)>,
) {
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(1), HANDSHAKE_LIMIT);
    let result = match stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(wait)))
    {
        Ok(()) => wire::read_frame(&mut &stream, label, Auth::preshared(key)),
        Err(e) => Err(ReadError::Io(e)),
    };
    let _ = tx.send((stream, from, result));
}

/// Member: connects to the coordinator, retrying until `deadline`.
fn connect(id: &Identity, timeout: Duration, deadline: Instant) -> Result<TcpStream, ControlError> {
    let mut pause = Duration::from_millis(20);
    let mut last_error = "no attempt was made".to_owned();
    let started = Instant::now();
    loop {
        let now = Instant::now();
        if let Some(doubt) = &id.doubt
            && now.duration_since(started) >= identity::DOUBT_WAIT
        {
            return Err(ControlError::Unreachable {
                cluster: id.cluster,
                addr: id.coordinator,
                timeout: identity::DOUBT_WAIT,
                last_error: format!("{last_error}; {doubt}"),
            });
        }
        if now >= deadline {
            return Err(ControlError::Unreachable {
                cluster: id.cluster,
                addr: id.coordinator,
                timeout,
                last_error,
            });
        }
        let remaining = deadline - now;
        match TcpStream::connect_timeout(&id.coordinator, remaining.min(Duration::from_secs(1))) {
            Ok(s) => return Ok(s),
            Err(e) => last_error = e.to_string(),
        }
        thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}
