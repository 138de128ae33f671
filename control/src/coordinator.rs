//! Start-up at cluster 0, the coordinator: accepting, checking and answering
//! registrations until every cluster is in, then the configuration broadcast; the
//! handshake of a new connection, and refusing one.

use crate::*;

impl Control {
    pub(crate) fn join_coordinator(
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
