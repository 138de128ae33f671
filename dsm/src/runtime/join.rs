//! Joining a job: the coherence machine's configuration from the job's, the
//! destination table, the protocol thread, and the start-up handshake with the other
//! clusters.

use super::*;

/// A 40-bit fingerprint of everything the clusters of a job must agree on.
fn fingerprint(cfg: &JobConfig) -> u64 {
    let text = format!(
        "{}|{}|{:#x}|{}|{}|{:?}",
        cfg.dsm.protocol.as_str(),
        cfg.dsm.home.as_str(),
        cfg.dsm.region_base,
        cfg.dsm.region_size,
        cfg.clusters.len(),
        cfg.clusters.iter().map(|c| c.threads).collect::<Vec<_>>()
    );
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h & ((1 << 40) - 1)
}

/// Maps the virtual names of a runtime endpoint: name `c < clusters` to cluster `c`'s
/// protocol queue, name `clusters + i` to this cluster's wake-up queue `1 + i`
/// ([`crate::WAKE_QUEUES`]); the source id is this cluster's id.
pub(crate) fn map_destinations(
    table: &TableWriter,
    me: usize,
    clusters: usize,
) -> Result<(), String> {
    let source = SourceId::new(me as u16)
        .ok_or_else(|| format!("cluster id {me} does not fit a source id"))?;
    let names = (0..clusters)
        .map(|c| (c, SiteId(c as u16), PROTOCOL_QUEUE))
        .chain((0..WAKE_QUEUES).map(|i| (clusters + i, SiteId(me as u16), QueueId(1 + i as u16))));
    for (name, site, queue) in names {
        table
            .map(
                VirtualName(name as u16),
                Destination {
                    site,
                    queue,
                    source,
                },
            )
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The coherence configuration of a job.
fn coherence_config(cfg: &JobConfig, me: usize) -> Result<Config, DsmError> {
    let pages = u32::try_from(cfg.dsm.pages()).map_err(|_| DsmError::Config {
        cluster: me,
        reason: format!(
            "dsm.region_size {} is too large: at most {} pages of {PAGE_SIZE} bytes",
            cfg.dsm.region_size,
            multigrain_coherence::MAX_PAGES
        ),
    })?;
    let protocol = match cfg.dsm.protocol {
        CfgProtocol::Hlrc => Protocol::Hlrc,
        CfgProtocol::Sc => Protocol::Sc,
    };
    let mut c = Config::new(protocol, cfg.clusters.len() as u16, pages);
    c.prefetch = cfg.dsm.prefetch;
    c.write_ahead = cfg.dsm.write_ahead;
    c.release_batch = cfg.dsm.release_batch;
    c.idle_flushes = cfg.dsm.idle_flushes;
    c.barrier_updates = cfg.dsm.barrier_updates.enabled();
    c.flush_ahead = cfg.dsm.flush_ahead;
    c.home_policy = match cfg.dsm.home {
        HomePolicy::RoundRobin => Homes::RoundRobin,
        HomePolicy::Block => Homes::Block,
        HomePolicy::FirstTouch => Homes::FirstTouch,
    };
    Ok(c)
}

impl Dsm {
    /// Joins the job `cfg` as cluster `transport.cluster`: maps the region
    /// (`dsm.region_base`, `dsm.region_size`) and registers it with userfaultfd, creates
    /// the coherence machine (`dsm.protocol`, `dsm.home`), checks with every other
    /// cluster that they run the same configuration (within `job.startup_timeout_ms`),
    /// and starts the protocol thread. Every cluster of the job must call it.
    ///
    /// # Errors
    /// [`DsmError::Config`] when the transport and the configuration disagree or a route
    /// is missing, [`DsmError::Region`] when the region cannot be created (address taken,
    /// userfaultfd unavailable), [`DsmError::ConfigMismatch`],
    /// [`DsmError::StartupTimeout`], [`DsmError::PeerFailed`].
    pub fn join(transport: Transport, cfg: &JobConfig) -> Result<Dsm, DsmError> {
        Dsm::join_with(transport, cfg, DsmOptions::default())
    }

    /// [`Dsm::join`] with non-default [`DsmOptions`].
    ///
    /// # Errors
    /// As [`Dsm::join`].
    pub fn join_with(
        transport: Transport,
        cfg: &JobConfig,
        options: DsmOptions,
    ) -> Result<Dsm, DsmError> {
        let Transport {
            site,
            cluster: me,
            clusters,
            liveness,
        } = transport;
        let config_err = |reason: String| DsmError::Config {
            cluster: me,
            reason,
        };
        if clusters != cfg.clusters.len() || me >= clusters {
            return Err(config_err(format!(
                "the transport is for cluster {me} of {clusters}, the configuration has {} clusters",
                cfg.clusters.len()
            )));
        }
        if site.id() != SiteId(me as u16) {
            return Err(config_err(format!(
                "the transport's site is {}, expected site {me}",
                site.id()
            )));
        }
        if let Some(c) = (0..clusters).find(|&c| !site.reaches(SiteId(c as u16))) {
            return Err(config_err(format!(
                "the site has no route to cluster {c}: attach or connect every cluster before joining"
            )));
        }
        let machine_cfg = coherence_config(cfg, me)?;
        let machine = Machine::new(ClusterId::new(me as u16).expect("checked"), machine_cfg)
            .map_err(|source| DsmError::Protocol {
                cluster: me,
                source,
            })?;
        let (endpoint, table) =
            site.create_endpoint(&[PROTOCOL_QUEUE])
                .map_err(|source| DsmError::Site {
                    cluster: me,
                    source,
                })?;
        map_destinations(&table, me, clusters).map_err(config_err)?;
        let peer_timeout = cfg.job.peer_timeout();
        let wait_spin = options
            .wait_spin
            .unwrap_or(Duration::from_micros(cfg.dsm.wait_spin_us));
        let tuning = Tuning {
            busy_polls: BUSY_POLLS,
            handover: HANDOVER,
            spin: wait_spin,
            slice: Duration::from_millis(2),
            liveness_period: (peer_timeout / 8)
                .clamp(Duration::from_millis(1), Duration::from_millis(20)),
            send_slice: (peer_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        };
        let threads: Vec<usize> = cfg.clusters.iter().map(|c| c.threads).collect();
        let core = Arc::new(Core::new(
            me, &threads, site, endpoint, machine, liveness, tuning,
        ));
        if cfg.dsm.event_profile {
            core.enable_event_profile();
        }
        let base = match options.region_base {
            Some(b) => b,
            None => usize::try_from(cfg.dsm.region_base).map_err(|_| {
                config_err(format!(
                    "dsm.region_base {:#x} does not fit",
                    cfg.dsm.region_base
                ))
            })?,
        };
        let len = usize::try_from(cfg.dsm.region_size)
            .map_err(|_| config_err("dsm.region_size does not fit".into()))?;
        let region_cfg = RegionConfig::new(base, len)
            .with_backing(Backing::SharedMemory)
            .with_minor_faults(true);
        let region = Region::new(
            region_cfg,
            Arc::new(Resolver {
                core: Arc::clone(&core),
            }),
        )
        .map_err(|source| DsmError::Region {
            cluster: me,
            source,
        })?;
        let (server_spin, protocol_cpus) = (options.server_spin, options.protocol_cpus.clone());
        let mut dsm = Dsm {
            inner: Arc::new(Inner {
                core,
                region: Arc::new(region),
                running: AtomicBool::new(false),
                threads,
                options,
                wait_spin,
                peer_timeout,
                thread_policy: cfg.dsm.thread_policy,
                populate: cfg.dsm.populate,
            }),
            server: None,
            next_offset: 0,
            next_lock: 0,
            live: false,
        };
        dsm.inner
            .hello(fingerprint(cfg), cfg.job.startup_timeout())?;
        let core = Arc::clone(&dsm.inner.core);
        let region = Arc::clone(&dsm.inner.region);
        let over_udp = (0..clusters).any(|c| cfg.link_between(me, c) == Link::Udp);
        let spin = server_spin.unwrap_or(if over_udp {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        });
        dsm.live = true;
        let priority = cfg.dsm.protocol_priority;
        // The `static` INI policy maps compute thread i to INI i mod K; the protocol
        // thread counts as the thread after the cluster's compute threads.
        let protocol_thread_index = dsm.inner.threads[me];
        let (started, start) = std::sync::mpsc::channel();
        dsm.server = Some(
            std::thread::Builder::new()
                .name(format!("dsm-protocol-{me}"))
                .spawn(move || {
                    if let Some(cpus) = &protocol_cpus
                        && bind_protocol_thread(me, cpus)
                    {
                        let _ = core.protocol_cpus.set(crate::stats::thread_cpu_list());
                    }
                    let realtime = match priority {
                        ProtocolPriority::Normal => Ok(false),
                        ProtocolPriority::Auto | ProtocolPriority::Realtime => {
                            multigrain_messaging::sched::make_realtime().map(|()| true)
                        }
                    };
                    let ok = realtime.is_ok() || priority != ProtocolPriority::Realtime;
                    let realtime = realtime.map_err(|e| e.to_string());
                    let _ = started.send(realtime.clone());
                    if !ok {
                        return;
                    }
                    let realtime = realtime.unwrap_or(false);
                    core.realtime.store(realtime, Ordering::Relaxed);
                    // A real-time thread never polls: it would keep the compute
                    // threads off its CPU.
                    core.serve(
                        &region,
                        if realtime { Duration::ZERO } else { spin },
                        protocol_thread_index,
                    )
                })
                .map_err(|source| DsmError::Spawn {
                    cluster: me,
                    what: "the protocol thread",
                    source,
                })?,
        );
        match start.recv() {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                tracing::debug!("cluster {me}: the protocol thread runs at normal priority");
            }
            Ok(Err(e)) if priority == ProtocolPriority::Realtime => {
                return Err(config_err(format!(
                    "dsm.protocol_priority = \"realtime\": the protocol thread cannot run \
                     real-time ({e}); run as root, give the executable CAP_SYS_NICE, raise \
                     RLIMIT_RTPRIO (`ulimit -r 1`), or set dsm.protocol_priority = \"auto\""
                )));
            }
            Ok(Err(e)) => tracing::info!(
                "cluster {me}: the protocol thread runs at normal priority ({e}: real-time \
                 priority needs root, CAP_SYS_NICE or RLIMIT_RTPRIO ≥ 1); requests that \
                 arrive while every thread computes wait for the scheduler"
            ),
            Err(_) => {
                return Err(config_err("the protocol thread ended at its start".into()));
            }
        }
        Ok(dsm)
    }
}

impl Inner {
    /// Start-up: tells every other cluster our fingerprint and waits for theirs.
    fn hello(&self, fp: u64, timeout: Duration) -> Result<(), DsmError> {
        let core = &self.core;
        let me = core.me;
        core.hellos.lock()[me] = Some(fp);
        let deadline = Instant::now() + timeout;
        core.with_thread(|_, ep| {
            let hello = Express::new(RuntimeOp::Hello.handler(), fp).expect("40-bit fingerprint");
            let mut early = Vec::new();
            let before = ep.network_sent();
            for c in (0..core.clusters).filter(|&c| c != me) {
                ep.send_express_blocking(VirtualName(c as u16), hello, Some(timeout), |m| {
                    early.push(m)
                })
                .map_err(|e| DsmError::Send {
                    cluster: me,
                    to: c,
                    what: "Hello",
                    reason: e.to_string(),
                })?;
            }
            core.note_sent(ep, before);
            for m in early {
                core.dispatch(&self.region, ep, m)?;
            }
            loop {
                let missing: Vec<usize> = {
                    let h = core.hellos.lock();
                    if let Some((peer, theirs)) = h
                        .iter()
                        .enumerate()
                        .find_map(|(c, f)| f.filter(|&f| f != fp).map(|f| (c, f)))
                    {
                        return Err(DsmError::ConfigMismatch {
                            cluster: me,
                            peer,
                            ours: fp,
                            theirs,
                        });
                    }
                    (0..core.clusters).filter(|&c| h[c].is_none()).collect()
                };
                if missing.is_empty() {
                    return Ok(());
                }
                core.check_liveness(&self.region, ep, &|| "joining the job".into())?;
                if Instant::now() >= deadline {
                    return Err(DsmError::StartupTimeout {
                        cluster: me,
                        missing,
                        timeout_ms: timeout.as_millis() as u64,
                    });
                }
                if let Some(m) = ep.recv_timeout(Duration::from_millis(2)) {
                    core.dispatch(&self.region, ep, m)?;
                }
            }
        })
    }
}

/// Binds the calling thread (the protocol thread of cluster `me`) to `cpus`
/// ([`DsmOptions::protocol_cpus`]); a binding the kernel refuses (a CPU it cannot name
/// or this process may not use) is logged, and the thread keeps the process's CPUs.
/// Returns whether it is bound.
fn bind_protocol_thread(me: usize, cpus: &[usize]) -> bool {
    let mut set = nix::sched::CpuSet::new();
    let bound = cpus
        .iter()
        .try_for_each(|&c| set.set(c))
        // Pid 0: the calling thread.
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    match bound {
        Ok(()) => {
            tracing::debug!("cluster {me}: the protocol thread runs on CPUs {cpus:?}");
            true
        }
        Err(e) => {
            tracing::warn!(
                "cluster {me}: cannot bind the protocol thread to CPUs {cpus:?} ({e}); it \
                 runs on the process's CPUs"
            );
            false
        }
    }
}
