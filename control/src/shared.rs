//! The state every thread of the control plane shares: the connections, who has
//! arrived at which barrier, who has finished, failures; the reader and heartbeat
//! threads' loops; and the progress watchdog's verdict.

use crate::*;

pub(crate) type Callback = Box<dyn Fn(&Failure) + Send + Sync>;

#[derive(Default)]
pub(crate) struct State {
    /// The first failure learned.
    pub(crate) failure: Option<Failure>,
    /// `on_failure` callbacks not yet called.
    pub(crate) callbacks: Vec<Callback>,
    /// Barrier releases not yet consumed, by tag.
    pub(crate) released: HashMap<u32, u64>,
    /// Coordinator: clusters arrived at each open barrier.
    pub(crate) arrivals: HashMap<u32, BTreeSet<usize>>,
    /// Coordinator: clusters that called `finish`.
    pub(crate) finished: BTreeSet<usize>,
    /// Coordinator: clusters whose connection has ended.
    pub(crate) closed: BTreeSet<usize>,
    /// Coordinator during start-up: clusters not registered yet.
    pub(crate) missing: Option<Vec<usize>>,
    /// Coordinator during start-up: a member gave up waiting (its own
    /// start-up timeout passed first).
    pub(crate) gave_up: Option<usize>,
    /// This cluster called `finish`.
    pub(crate) finishing: bool,
    /// Every cluster finished.
    pub(crate) done: bool,
    /// The `Control` is being dropped.
    pub(crate) closing: bool,
    /// A failure is being broadcast; it becomes `failure` afterwards.
    pub(crate) announcing: bool,
    /// Coordinator: `Done` is being broadcast; `done` follows.
    pub(crate) announcing_done: bool,
    /// Coordinator: each cluster's last progress report (`None`: not stalled, or
    /// nothing heard yet).
    pub(crate) stalls: Vec<Option<Stall>>,
}

pub(crate) struct Shared {
    pub(crate) me: usize,
    pub(crate) clusters: usize,
    /// The job label (`job.key`).
    pub(crate) label: u64,
    /// The secret came from a key file: every frame must carry a MAC.
    pub(crate) preshared: bool,
    /// The job's secret, once known (at once when pre-shared or on the coordinator;
    /// from the `Welcome` on a bootstrapped member).
    pub(crate) secret: OnceLock<Secret>,
    pub(crate) coordinator: SocketAddr,
    pub(crate) peer_timeout: Duration,
    /// `job.progress_timeout_ms`; `None`: the watchdog is off.
    pub(crate) progress_timeout: Option<Duration>,
    pub(crate) links: Mutex<Vec<Arc<Conn>>>,
    pub(crate) state: Mutex<State>,
    pub(crate) changed: Condvar,
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    /// Evidence that a cluster's process is alive although its connection is silent
    /// ([`Control::consult_liveness`]).
    pub(crate) liveness: OnceLock<LivenessOracle>,
}

/// When a cluster's process was last proven alive, by cluster id.
pub(crate) type LivenessOracle = Box<dyn Fn(usize) -> Option<Instant> + Send + Sync>;

impl Shared {
    pub(crate) fn links(&self) -> Vec<Arc<Conn>> {
        self.links.lock().clone()
    }

    pub(crate) fn spawn(
        self: &Arc<Self>,
        name: String,
        f: impl FnOnce(Arc<Shared>) + Send + 'static,
    ) {
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
    pub(crate) fn send_to(&self, conn: &Conn, msg: &Message) {
        if let Err(e) = conn.send(msg) {
            self.connection_lost(conn.cluster, conn.peer, Lost::Send(e));
        }
    }

    pub(crate) fn broadcast(&self, msg: &Message, except: Option<usize>) {
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
    pub(crate) fn report(&self, f: Failure) {
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
    pub(crate) fn connection_lost(&self, cluster: usize, peer: SocketAddr, how: Lost) {
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
    pub(crate) fn arrive(&self, tag: u32, from: usize) {
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
    pub(crate) fn preshared_key(&self) -> Option<&Secret> {
        self.preshared.then(|| self.secret.get()).flatten()
    }

    /// Logs (debug) the run's session: its epoch and where the secret came from.
    pub(crate) fn log_session(&self, epoch: u64) {
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
    pub(crate) fn progress(&self, from: usize, stall: Option<Stall>) {
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
    pub(crate) fn mark_finished(&self, from: usize) {
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
    pub(crate) fn read_loop(&self, conn: &Conn, mut stream: TcpStream) {
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
    pub(crate) fn heartbeat_loop(&self) {
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
    pub(crate) fn close(&self) {
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

    pub(crate) fn failed(&self) -> Result<(), ControlError> {
        match &self.state.lock().failure {
            Some(f) => Err(ControlError::ClusterFailed(f.clone())),
            None => Ok(()),
        }
    }
}

/// The job failure of a job whose every cluster (`stalls`, by cluster) has stalled
/// for at least `timeout`: blamed on the cluster stalled longest, naming every wait.
pub(crate) fn stall_failure(stalls: &[&Stall], timeout: Duration) -> Failure {
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
