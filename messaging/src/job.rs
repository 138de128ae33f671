//! Joining a job: one call that gives a cluster process its [`Site`] with a route to every
//! other cluster, over shared memory or the network as the topology says.
//!
//! [`Job::join`] creates the site, binds the cluster's INI sockets, registers with the
//! coordinator (cluster 0) and learns every other cluster's INI addresses and segment
//! (paper 002 §3.2, the configuration broadcast) with the job's secret and the run's
//! epoch, under which the INIs authenticate every datagram. For each peer it then picks the
//! substrate (paper 000, multi-protocol): with `substrate = "auto"`, a peer on the same
//! machine (equal boot ids) is reached through its shared segment and one on another
//! machine through the INIs over UDP; `"udp"` forces INIs even on one machine (how the
//! experiments run); `"shm"` requires one machine. Everyone attaches, barriers, removes
//! its segment name (so nothing is left in `/dev/shm`), and begins together.
//!
//! [`Job::finish`] ends the job without losing a message: all clusters stop sending,
//! every INI drains (all it sent is acknowledged), all clusters agree, and the INIs stop.
//! A failure anywhere (a dead or silent cluster, an aborting one) is reported through
//! [`Job::failure`] within the configured peer timeout.

use crate::control::{Control, ControlError, Failure, Identity, Registration};
use crate::liveness::{Liveness, LivenessConfig, LivenessSocket, LivenessStats, Peer};
use crate::names::SiteId;
use crate::net::{BoundInis, IniEndpoint, IniGroup, IniReport, NetConfig, NetError};
use crate::site::{Site, SiteConfig, SiteError, Substrate};
use multigrain_cluster_config::{JobConfig, Substrate as Policy};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Barrier tags of the start-up and shutdown phases.
const PHASE_ATTACHED: u32 = 0x100;
const PHASE_BEGIN: u32 = 0x101;
const PHASE_QUIESCE: u32 = 0x102;
const PHASE_DRAINED: u32 = 0x103;

/// What a cluster publishes about its network endpoints at start-up.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct NetAddress {
    inis: Vec<IniEndpoint>,
    segment: Option<String>,
    /// The cluster's liveness socket ([`crate::liveness`]).
    #[serde(default)]
    liveness: Option<SocketAddr>,
}

/// Why joining or finishing a job failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The control plane failed (start-up timeout, dead cluster…).
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The site could not be created or a peer's segment attached.
    #[error(transparent)]
    Site(#[from] SiteError),
    /// The INIs could not be bound or started, or did not drain.
    #[error(transparent)]
    Net(#[from] NetError),
    /// A peer's registration is unusable, or the topology asks for something impossible.
    #[error("{0}")]
    Topology(String),
}

/// How this cluster reaches each other cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Link {
    /// This cluster itself.
    Local,
    /// Through the peer's shared segment (same machine).
    Shm,
    /// Through the INIs over UDP.
    Network,
}

/// One cluster's membership in a running job.
pub struct Job {
    identity: Identity,
    site: Site,
    control: Arc<Control>,
    inis: Option<IniGroup>,
    registrations: Vec<Registration>,
    links: Vec<Link>,
    /// The liveness thread (with more than one cluster).
    liveness: Option<Liveness>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("cluster", &self.identity.cluster)
            .field("clusters", &self.identity.clusters)
            .field("links", &self.links)
            .finish()
    }
}

impl Job {
    /// Joins the job as `identity.cluster` (see the module docs). `site_config` shapes this
    /// cluster's receive queues and pool (its `site` and `shared` fields are set here).
    ///
    /// # Errors
    /// [`JobError`] naming what failed: a cluster that never registered, a segment that
    /// cannot be attached, a port in use, a failed peer.
    pub fn join(
        cfg: &JobConfig,
        identity: Identity,
        mut site_config: SiteConfig,
    ) -> Result<Job, JobError> {
        let me = identity.cluster;
        let n = identity.clusters;
        if n != cfg.clusters.len() {
            return Err(JobError::Topology(format!(
                "the launcher says {n} clusters, the configuration has {}",
                cfg.clusters.len()
            )));
        }
        site_config.site = SiteId(me as u16);
        site_config.max_sites = site_config.max_sites.max(n);
        site_config.shared = n > 1 && cfg.ini.substrate != Policy::Udp;
        // LogGP emulation on shared-memory links (paper 001 §3.2): o_s, o_r and L apply
        // there too; g and G (they stall an INI) are refused on such links, here on the
        // links the configuration implies and below on those found at registration.
        site_config.shm_latency = Duration::from_secs_f64(cfg.emulation.latency_us / 1e6);
        site_config.shm_send_overhead =
            Duration::from_secs_f64(cfg.emulation.send_overhead_us / 1e6);
        site_config.shm_recv_overhead =
            Duration::from_secs_f64(cfg.emulation.recv_overhead_us / 1e6);
        // What can fail before this cluster registers is reported to the coordinator,
        // so that every cluster stops at once rather than at the start-up timeout.
        let early = (|| -> Result<(Site, Option<BoundInis>, Option<LivenessSocket>), JobError> {
            identity.check_host(cfg)?;
            cfg.check_emulation()
                .map_err(|e| JobError::Topology(e.to_string()))?;
            let site = Site::new(site_config)?;
            let spec = &cfg.clusters[me];
            let bound = if n > 1 {
                Some(BoundInis::bind(
                    SiteId(me as u16),
                    &spec.host,
                    spec.port,
                    cfg.inis_of(me),
                    cfg.ini.connected_sends,
                )?)
            } else {
                None
            };
            // The liveness socket sits next to INI 0 (same address, any port).
            let liveness = match &bound {
                Some(b) => Some(LivenessSocket::bind(b.addrs()[0].ip()).map_err(NetError::Io)?),
                None => None,
            };
            Ok((site, bound, liveness))
        })();
        let (site, bound, liveness_socket) =
            early.inspect_err(|e| Control::cannot_start(&identity, &cfg.job, &e.to_string()))?;
        let address = NetAddress {
            inis: bound.as_ref().map_or_else(Vec::new, BoundInis::endpoints),
            segment: site.segment_name().map(str::to_owned),
            liveness: liveness_socket.as_ref().map(LivenessSocket::addr),
        };
        let payload =
            serde_json::to_vec(&address).map_err(|e| JobError::Topology(e.to_string()))?;
        let (control, registrations) =
            Control::join(&identity, &cfg.job, Registration::local(me, payload))?;
        let control = Arc::new(control);
        let mut links = vec![Link::Local; n];
        let mut remote: Vec<Option<Vec<IniEndpoint>>> = vec![None; n];
        let mut any_ip_peers = Vec::new();
        let mut liveness_peers: Vec<Option<Peer>> = vec![None; n];
        for (p, reg) in registrations.iter().enumerate().filter(|(p, _)| *p != me) {
            let theirs: NetAddress = serde_json::from_slice(&reg.payload).map_err(|e| {
                JobError::Topology(format!("cluster {p} sent an unreadable registration: {e}"))
            })?;
            liveness_peers[p] = theirs.liveness.map(|mut addr| {
                // Bound to every address (cluster 0 placed by a launcher): reached where
                // the coordinator was reached, heard from any of its host's addresses.
                let any_ip = addr.ip().is_unspecified();
                if any_ip {
                    addr.set_ip(identity.coordinator.ip());
                }
                Peer { addr, any_ip }
            });
            let same_machine = reg.same_machine(&registrations[me]);
            links[p] = match (cfg.ini.substrate, same_machine) {
                (Policy::Udp, _) | (Policy::Auto, false) => Link::Network,
                (Policy::Auto, true) | (Policy::Shm, true) => Link::Shm,
                (Policy::Shm, false) => {
                    return Err(JobError::Topology(format!(
                        "substrate = \"shm\" but cluster {p} runs on {} and cluster {me} on {}: use \"auto\" or \"udp\"",
                        reg.host, registrations[me].host
                    )));
                }
            };
            if links[p] == Link::Shm {
                cfg.emulation
                    .check_link(
                        multigrain_cluster_config::Link::Shm,
                        me.min(p),
                        me.max(p),
                        cfg.ini.substrate,
                    )
                    .map_err(|e| JobError::Topology(e.to_string()))?;
            }
            match links[p] {
                Link::Shm => {
                    let seg = theirs.segment.ok_or_else(|| {
                        JobError::Topology(format!("cluster {p} has no shared segment"))
                    })?;
                    site.attach_peer(SiteId(p as u16), &seg)?;
                }
                Link::Network => {
                    if theirs.inis.len() != cfg.inis_of(p) {
                        return Err(JobError::Topology(format!(
                            "cluster {p} registered {} INIs but the job gives it {}",
                            theirs.inis.len(),
                            cfg.inis_of(p)
                        )));
                    }
                    // INIs bound to every address (cluster 0 of a job placed by a
                    // launcher) are reached where the coordinator was reached.
                    // Those heard from any address are listed by the address their
                    // datagrams come from.
                    let coordinator = identity.coordinator.ip();
                    let at_coordinator = |a: &mut SocketAddr| {
                        if a.ip().is_unspecified() {
                            a.set_ip(coordinator);
                        }
                    };
                    let inis = theirs
                        .inis
                        .into_iter()
                        .enumerate()
                        .map(|(k, mut e)| {
                            let any_ip = e.source().ip().is_unspecified();
                            at_coordinator(&mut e.addr);
                            if let Some(f) = e.sends_from.as_mut() {
                                at_coordinator(f);
                            }
                            if any_ip {
                                any_ip_peers.push(e.source());
                            }
                            tracing::debug!(
                                "cluster {p} INI {k}: receives at {}, heard from {}",
                                e.addr,
                                e.sends_from.unwrap_or(e.addr)
                            );
                            e
                        })
                        .collect();
                    remote[p] = Some(inis);
                }
                Link::Local => {}
            }
        }
        let session = control.session();
        let liveness = match liveness_socket {
            Some(socket) => {
                let l = socket
                    .start(
                        LivenessConfig {
                            me: me as u16,
                            key: crate::window::wire::MacKey::new(*session.secret.as_bytes()),
                            epoch: session.epoch,
                            period: crate::liveness::period_for(cfg.job.peer_timeout()),
                            realtime: true,
                        },
                        liveness_peers,
                    )
                    .map_err(NetError::Io)?;
                let evidence = l.evidence();
                control.consult_liveness(move |c| evidence.heard(c));
                Some(l)
            }
            None => None,
        };
        let inis = match bound {
            Some(b) if remote.iter().any(Option::is_some) => {
                // Datagrams are authenticated under the job's secret and carry the run's
                // epoch, both agreed at registration (issue 13).
                let mut net = NetConfig::from_job(cfg);
                net.window.mac_key = crate::window::wire::MacKey::new(*session.secret.as_bytes());
                net.window.epoch = session.epoch;
                net.any_ip_peers = any_ip_peers;
                net.liveness = liveness.as_ref().map(Liveness::evidence);
                Some(b.start(&site, &net, &remote)?)
            }
            _ => None,
        };
        let timeout = cfg.job.startup_timeout();
        control.barrier(PHASE_ATTACHED, timeout)?;
        site.unlink_segment();
        control.barrier(PHASE_BEGIN, timeout)?;
        Ok(Job {
            identity,
            site,
            control,
            inis,
            registrations,
            links,
            liveness,
        })
    }

    /// Joins with the identity from the environment (`multigrain launch`, Slurm, MPI).
    ///
    /// # Errors
    /// As [`Job::join`], plus a missing or inconsistent identity.
    pub fn join_from_env(cfg: &JobConfig, site_config: SiteConfig) -> Result<Job, JobError> {
        let id = Identity::from_env(cfg)?;
        let mut cfg = cfg.clone();
        id.apply(&mut cfg);
        Job::join(&cfg, id, site_config)
    }

    /// This cluster's site.
    pub fn site(&self) -> &Site {
        &self.site
    }

    /// This cluster's id.
    pub fn cluster(&self) -> usize {
        self.identity.cluster
    }

    /// Number of clusters.
    pub fn clusters(&self) -> usize {
        self.identity.clusters
    }

    /// How this cluster reaches cluster `c`.
    pub fn link(&self, c: usize) -> Link {
        self.links[c]
    }

    /// Every cluster's registration (host, pid…), by cluster id.
    pub fn registrations(&self) -> &[Registration] {
        &self.registrations
    }

    /// The control plane (barriers, failure notifications).
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// A cluster found failed — by the control plane (death, abort, silence) or by the INIs
    /// (a peer that stopped acknowledging) — if any.
    pub fn failure(&self) -> Option<Failure> {
        self.control.failure().or_else(|| {
            self.inis.as_ref()?.failure().map(|(s, reason)| Failure {
                cluster: usize::from(s.0),
                reason,
            })
        })
    }

    /// Runs `f` once when any cluster is found failed (from a background thread).
    pub fn on_failure(&self, f: impl Fn(&Failure) + Send + Sync + 'static) {
        let f = Arc::new(f);
        let g = f.clone();
        self.control.on_failure(move |failure| g(failure));
        if let Some(inis) = &self.inis {
            inis.on_failure(move |s, reason| {
                f(&Failure {
                    cluster: usize::from(s.0),
                    reason: reason.to_owned(),
                })
            });
        }
    }

    /// This cluster's INI statistics (empty without INIs); INI 0's carries the liveness
    /// thread's counters ([`IniReport::liveness`]).
    pub fn ini_reports(&self) -> Vec<IniReport> {
        let mut reports = self.inis.as_ref().map_or_else(Vec::new, IniGroup::reports);
        self.attach_liveness(&mut reports);
        reports
    }

    /// The liveness thread's counters (`None` with one cluster).
    pub fn liveness_stats(&self) -> Option<LivenessStats> {
        self.liveness.as_ref().map(Liveness::stats)
    }

    fn attach_liveness(&self, reports: &mut [IniReport]) {
        if let Some(first) = reports.first_mut() {
            first.liveness = self.liveness_stats();
        }
    }

    /// Tells every cluster that this one failed (they learn it as a failure naming it).
    pub fn abort(&self, reason: &str) {
        self.control.abort(reason);
    }

    /// Ends the job (see the module docs) and returns the final INI statistics. Call once
    /// this cluster will send nothing more.
    ///
    /// # Errors
    /// [`JobError`] if a cluster failed or the network did not drain within `timeout`.
    pub fn finish(mut self, timeout: Duration) -> Result<Vec<IniReport>, JobError> {
        self.control.barrier(PHASE_QUIESCE, timeout)?;
        if let Some(inis) = &self.inis {
            inis.drain(timeout)?;
        }
        self.control.barrier(PHASE_DRAINED, timeout)?;
        let mut reports = match self.inis.take() {
            Some(inis) => inis.shutdown(timeout)?,
            None => Vec::new(),
        };
        self.attach_liveness(&mut reports);
        self.control.finish(timeout)?;
        Ok(reports)
    }

    /// The substrate the site uses for cluster `c` (as the message statistics count it).
    pub fn substrate(&self, c: usize) -> Option<Substrate> {
        self.site.substrate(SiteId(c as u16))
    }
}
