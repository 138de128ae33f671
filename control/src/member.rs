//! Start-up at every other cluster, a member: connecting to the coordinator, retrying
//! until the start-up timeout, registering and waiting for the broadcast.

use crate::*;

impl Control {
    pub(crate) fn join_member(
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
}

/// Member: connects to the coordinator, retrying until `deadline` after pauses of 1 ms,
/// doubling up to 200 ms: a member usually starts within milliseconds of cluster 0, so
/// the first retries come soon (a first pause of 20 ms, as before the thirty-third
/// session, cost 20 ms of start-up whenever a member was ready before the coordinator
/// listened), and one that waits for a late coordinator retries 5 times a second.
pub(crate) fn connect(
    id: &Identity,
    timeout: Duration,
    deadline: Instant,
) -> Result<TcpStream, ControlError> {
    let mut pause = Duration::from_millis(1);
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
