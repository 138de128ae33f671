//! Joining a job: [`Control::join`], which starts the coordinator's or a member's side,
//! and the reports of a cluster that cannot start.

use crate::*;

impl Control {
    pub(crate) fn new(id: &Identity, settings: &JobSettings) -> Control {
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
}
