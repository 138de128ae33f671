//! Which cluster this process is ([`Identity`]) and what it tells the
//! others at start-up ([`Registration`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};

use multigrain_cluster_config::{
    JobConfig, LaunchRank, Launcher, detect_placement, detect_rank, host_addresses, instance_key,
    rendezvous_port,
};
use serde::{Deserialize, Serialize};

use super::error::ControlError;
use super::secret::{ENV_KEY_FILE, Secret};
use super::{ENV_CLUSTER, ENV_CLUSTERS, ENV_COORDINATOR};

/// Which cluster this process is, and where the coordinator listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// This process's cluster id, below `clusters`.
    pub cluster: usize,
    /// The number of clusters in the job.
    pub clusters: usize,
    /// The TCP address of cluster 0's coordinator; cluster 0 binds it (or
    /// [`Identity::listen`]), the others connect to it.
    pub coordinator: SocketAddr,
    /// Where cluster 0 listens when it is not `coordinator` itself: a job
    /// whose hosts come from the launcher listens on every address
    /// (`0.0.0.0:port`), since the name the others resolve may not be the
    /// one this machine resolves for itself.
    pub listen: Option<SocketAddr>,
    /// A job placed by a launcher without named hosts: the job label to use
    /// instead of the config's (the config's mixed with the launch's
    /// identity, [`instance_key`]) and the address this cluster's INIs bind
    /// (all addresses on cluster 0; elsewhere the one that routes to the
    /// coordinator). Applied to the config by [`Identity::apply`].
    pub placed: Option<Placed>,
    /// The launcher whose ranks gave the cluster ids (`None`: `multigrain launch` or
    /// a test).
    pub launcher: Option<Launcher>,
    /// Why the config's coordinator address may be wrong: the launcher placed rank 0 on
    /// a node whose addresses do not include cluster 0's configured host. A member then
    /// gives up after 2 s (`DOUBT_WAIT`) without an answer there (naming both), instead of
    /// the whole start-up timeout; an answer proves the config right.
    pub doubt: Option<String>,
    /// The job's secret from the key file named by [`ENV_KEY_FILE`] (`multigrain
    /// launch`/`run` write one per run; a user may under `srun`/`mpirun`). `None`: cluster
    /// 0 generates the secret and hands it out at registration (see [`crate::secret`]).
    pub secret: Option<Secret>,
}

/// How long a member with an [`Identity::doubt`] tries the configured coordinator.
pub const DOUBT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What a launcher-placed job changes in the config of one cluster
/// ([`Identity::placed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The job label (`job.key`) of this launch.
    pub key: u64,
    /// The address this cluster's INIs bind.
    pub bind: IpAddr,
}

impl Identity {
    /// From the variables `multigrain launch` sets ([`ENV_CLUSTER`],
    /// [`ENV_CLUSTERS`], [`ENV_COORDINATOR`]); else from
    /// `SLURM_PROCID`/`SLURM_NTASKS`, `PMI_RANK`/`PMI_SIZE` or
    /// `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE` (see
    /// [`detect_rank`]), with the coordinator at cluster 0's `host:port`
    /// from `cfg` — or, when the config names no hosts (`[local]`) or gives
    /// cluster 0 no port, at rank 0's host as the launcher places it and a
    /// port derived from the launch ([`Identity::apply`] then adapts the
    /// config).
    ///
    /// # Errors
    ///
    /// [`ControlError::BadVariable`] for a missing or malformed launch
    /// variable or a cluster count that differs from `cfg`;
    /// [`ControlError::Rank`] for unusable launcher rank variables;
    /// [`ControlError::NoRendezvous`] when a launcher started the process,
    /// cluster 0 has no fixed port and the launcher does not identify the
    /// launch or rank 0's host; [`ControlError::HostNotHere`] when the
    /// config places this rank's cluster on another machine; [`ControlError::Resolve`] when
    /// cluster 0's host does not resolve; [`ControlError::NoIdentity`] when
    /// none of these variables is set.
    pub fn from_env(cfg: &JobConfig) -> Result<Identity, ControlError> {
        Self::from_lookup(cfg, |k| {
            std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
        })
    }

    /// [`Identity::from_env`] with variables read through `env` (which
    /// returns `None` for an unset variable).
    ///
    /// # Errors
    ///
    /// As [`Identity::from_env`].
    ///
    /// ```
    /// use multigrain_cluster_config::JobConfig;
    /// use multigrain_control::Identity;
    /// let cfg = JobConfig::from_str_named(
    ///     "[[cluster]]\nhost = \"127.0.0.1\"\nport = 7000\n[[cluster]]\nhost = \"127.0.0.1\"\nport = 7010\n",
    ///     "inline",
    /// )?;
    /// let env = |k: &str| match k {
    ///     "SLURM_PROCID" => Some("1".to_owned()),
    ///     "SLURM_NTASKS" => Some("2".to_owned()),
    ///     "SLURM_STEP_ID" => Some("0".to_owned()), // a task of a job step
    ///     _ => None,
    /// };
    /// let id = Identity::from_lookup(&cfg, env)?;
    /// assert_eq!((id.cluster, id.clusters, id.coordinator.port()), (1, 2, 7000));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_lookup(
        cfg: &JobConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Identity, ControlError> {
        let clusters = cfg.clusters.len();
        if let Some(value) = env(ENV_CLUSTER) {
            let cluster = parse_count(ENV_CLUSTER, &value)?;
            let total = env(ENV_CLUSTERS).ok_or_else(|| ControlError::BadVariable {
                var: ENV_CLUSTERS,
                value: None,
                problem: format!(
                    "not set, although {ENV_CLUSTER} is; start cluster processes with \
                     `multigrain launch`, which sets both"
                ),
            })?;
            let total_n = parse_count(ENV_CLUSTERS, &total)?;
            if total_n != clusters {
                return Err(ControlError::BadVariable {
                    var: ENV_CLUSTERS,
                    value: Some(total),
                    problem: format!(
                        "but the config defines {clusters} clusters; give every cluster process \
                         the config the launcher used"
                    ),
                });
            }
            if cluster >= clusters {
                return Err(ControlError::BadVariable {
                    var: ENV_CLUSTER,
                    value: Some(value),
                    problem: format!("must be below {ENV_CLUSTERS} = {clusters}"),
                });
            }
            let coordinator = env(ENV_COORDINATOR).ok_or_else(|| ControlError::BadVariable {
                var: ENV_COORDINATOR,
                value: None,
                problem: format!(
                    "not set, although {ENV_CLUSTER} is; it must be cluster 0's host:port"
                ),
            })?;
            let coordinator =
                parse_host_port(&coordinator).map_err(|problem| ControlError::BadVariable {
                    var: ENV_COORDINATOR,
                    value: Some(coordinator.clone()),
                    problem,
                })?;
            return Ok(Identity {
                cluster,
                clusters,
                coordinator,
                listen: None,
                placed: None,
                launcher: None,
                doubt: None,
                secret: key_file(&env)?,
            });
        }
        let Some(rank) = detect_rank(|k| env(k))? else {
            return Err(ControlError::NoIdentity { clusters });
        };
        cfg.check_launch_rank(&rank)?;
        let c0 = &cfg.clusters[0];
        if cfg.names_no_hosts() || c0.port == 0 {
            return Self::rendezvous(cfg, &rank, env);
        }
        let coordinator = resolve(&c0.host, c0.port).map_err(|reason| ControlError::Resolve {
            host: c0.host.clone(),
            port: c0.port,
            reason,
        })?;
        Ok(Identity {
            cluster: rank.rank,
            clusters,
            coordinator,
            listen: None,
            placed: None,
            launcher: Some(rank.launcher),
            doubt: placement_doubt(cfg, &rank, &env),
            secret: key_file(&env)?,
        })
    }

    /// A launcher started the clusters and the config gives the coordinator
    /// no fixed address: its host is the launcher's rank 0 host (or cluster
    /// 0's named host) and its port [`rendezvous_port`] of the launch.
    fn rendezvous(
        cfg: &JobConfig,
        rank: &LaunchRank,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Identity, ControlError> {
        let placement = detect_placement(rank, &env);
        let no = |reason: String| ControlError::NoRendezvous {
            launcher: rank.launcher,
            reason,
        };
        let instance = placement.instance.ok_or_else(|| {
            no(
                "it does not identify the launch (SLURM_JOB_ID, PMIX_NAMESPACE or PMI_KVSNAME)"
                    .to_owned(),
            )
        })?;
        let hostless = cfg.names_no_hosts();
        let pmix = hostless
            && rank.launcher != Launcher::Slurm
            && env("PMIX_NAMESPACE").is_some()
            && env(ENV_NO_PMIX).is_none();
        let mut pmix_secret = None;
        let (host, coordinator) = if pmix {
            // The launcher's own key-value service says where rank 0 listens, and hands
            // out the job's secret.
            let (host, addr, secret) = pmix_rendezvous(rank, cfg.job.startup_timeout())?;
            pmix_secret = Some(secret);
            (host, addr)
        } else {
            let port = rendezvous_port(&instance);
            let host = if hostless {
                placement.rank0_host.map_err(no)?
            } else {
                cfg.clusters[0].host.clone()
            };
            let coordinator = resolve(&host, port).map_err(|reason| ControlError::Resolve {
                host: host.clone(),
                port,
                reason,
            })?;
            (host, coordinator)
        };
        let port = coordinator.port();
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let (listen, placed) = if hostless {
            let bind = if rank.rank == 0 {
                any
            } else {
                route_to(coordinator).unwrap_or(any)
            };
            let key = instance_key(cfg.job.key, &instance);
            let listen = (rank.rank == 0).then_some(SocketAddr::new(any, port));
            (listen, Some(Placed { key, bind }))
        } else {
            (None, None)
        };
        tracing::debug!(
            cluster = rank.rank,
            "{} launch {instance}: coordinator at {coordinator} (rank 0 on {host}){}",
            rank.launcher,
            if hostless {
                ", hosts from the launcher"
            } else {
                ""
            }
        );
        Ok(Identity {
            cluster: rank.rank,
            clusters: cfg.clusters.len(),
            coordinator,
            listen,
            placed,
            launcher: Some(rank.launcher),
            doubt: if hostless {
                None
            } else {
                placement_doubt(cfg, rank, &env)
            },
            // A key file wins; else the secret rank 0 published through PMIx.
            secret: key_file(&env)?.or(pmix_secret),
        })
    }

    /// Checks, for a cluster started by a launcher with hosts named in the config, that
    /// its host is an address of this machine, so that a host list that does not match
    /// the launcher's placement fails at once, naming cluster and host.
    ///
    /// # Errors
    ///
    /// [`ControlError::HostNotHere`].
    pub fn check_host(&self, cfg: &JobConfig) -> Result<(), ControlError> {
        match (self.launcher, &self.placed) {
            (Some(launcher), None) => check_host_is_here(cfg, self.cluster, launcher),
            _ => Ok(()),
        }
    }

    /// Makes `cfg` this launch's: with [`Identity::placed`], its job key and
    /// this cluster's INI host. Call it before the job starts.
    pub fn apply(&self, cfg: &mut JobConfig) {
        if let Some(p) = &self.placed {
            cfg.job.key = p.key;
            if let Some(spec) = cfg.clusters.get_mut(self.cluster) {
                spec.host = p.bind.to_string();
            }
        }
    }
}

/// The secret in the key file named by [`ENV_KEY_FILE`], if it is set.
fn key_file(env: impl Fn(&str) -> Option<String>) -> Result<Option<Secret>, ControlError> {
    let Some(path) = env(ENV_KEY_FILE).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    Secret::read_file(path.as_ref())
        .map(Some)
        .map_err(|problem| ControlError::KeyFile { path, problem })
}

/// Set (to anything) to keep a launcher-placed job from using PMIx for its rendezvous;
/// ranks then find rank 0 as without PMIx (on this node, when every rank runs here).
pub const ENV_NO_PMIX: &str = "MULTIGRAIN_NO_PMIX";

/// The PMIx key under which rank 0 publishes its coordinator's addresses.
const PMIX_KEY: &str = "multigrain.coordinator";

/// Rendezvous through the launcher's PMIx key-value service: rank 0 picks a free TCP
/// port and a fresh job secret and publishes them with every address of this machine
/// (`a1,a2,…;port;secret-hex`, loopback last); every rank reads rank 0's entry after a
/// fence. A member then uses the first address at which rank 0's coordinator answers
/// (probing each until the start-up timeout), so the address need not resolve the same
/// everywhere. The secret thus never crosses the coordinator's TCP port: the job is
/// authenticated from the first control frame on (the PMIx exchange is as private as
/// the launcher makes it: its daemons' connections, per user).
fn pmix_rendezvous(
    rank: &LaunchRank,
    timeout: std::time::Duration,
) -> Result<(String, SocketAddr, Secret), ControlError> {
    let no = |reason: String| ControlError::NoRendezvous {
        launcher: rank.launcher,
        reason,
    };
    let mine = if rank.rank == 0 {
        let port = free_tcp_port(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
            .map_err(|e| no(format!("no free TCP port for the coordinator: {e}")))?;
        let ips: Vec<String> = local_ips().iter().map(IpAddr::to_string).collect();
        let secret = Secret::generate()
            .map_err(|e| no(format!("no random bytes for the job's secret: {e}")))?;
        format!("{};{port};{}", ips.join(","), secret.to_hex())
    } else {
        String::new()
    };
    let published = crate::pmix::exchange_with_rank0(PMIX_KEY, &mine).map_err(|e| {
        no(format!(
            "the PMIx exchange failed ({e}); set {ENV_NO_PMIX}=1 to skip it"
        ))
    })?;
    // Never quote the published value: it holds the secret.
    let bad = |what: &str| {
        no(format!(
            "rank 0 published no usable {what} under {PMIX_KEY}"
        ))
    };
    let (rest, secret) = published.rsplit_once(';').ok_or_else(|| bad("secret"))?;
    let secret = Secret::from_hex(secret).map_err(|_| bad("secret"))?;
    let (ips, port) = rest.rsplit_once(';').ok_or_else(|| bad("port"))?;
    let port: u16 = port.parse().map_err(|_| bad("port"))?;
    let addrs: Vec<SocketAddr> = ips
        .split(',')
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect();
    if addrs.is_empty() {
        return Err(bad("address"));
    }
    if rank.rank == 0 {
        return Ok((addrs[0].ip().to_string(), addrs[0], secret));
    }
    let deadline = std::time::Instant::now() + timeout;
    loop {
        for a in &addrs {
            let limit = std::time::Duration::from_millis(300);
            if std::net::TcpStream::connect_timeout(a, limit).is_ok() {
                return Ok((a.ip().to_string(), *a, secret));
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(no(format!(
                "rank 0's coordinator answered at none of {addrs:?} within {timeout:?}"
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// This machine's IPv4 addresses that are up, loopback last.
fn local_ips() -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|it| {
            it.filter(|i| i.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP))
                .filter_map(|i| i.address?.as_sockaddr_in().map(|a| IpAddr::V4(a.ip())))
                .collect()
        })
        .unwrap_or_default();
    ips.sort_by_key(IpAddr::is_loopback);
    ips.dedup();
    if ips.is_empty() {
        ips.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    ips
}

/// Whether the launcher placed rank 0 on a node that has none of the addresses of
/// cluster 0's configured host (both resolved here), in words; `None` when they share
/// an address or the launcher does not say where rank 0 runs.
fn placement_doubt(
    cfg: &JobConfig,
    rank: &LaunchRank,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    if rank.rank == 0 {
        return None;
    }
    let node = detect_placement(rank, &env).rank0_host.ok()?;
    let configured = &cfg.clusters[0].host;
    let (a, b) = (host_addresses(&node)?, host_addresses(configured)?);
    if a.iter().any(|ip| b.contains(ip)) {
        return None;
    }
    Some(format!(
        "{} placed rank 0 on {node}, but the config places cluster 0 on {configured}: list \
         the clusters in the order of the launcher's ranks, or leave the hosts out",
        rank.launcher
    ))
}

/// The local address this machine sends from to reach `to` (a connected UDP
/// socket; no datagram is sent), or `None` when there is no route.
fn route_to(to: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = if to.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = std::net::UdpSocket::bind(any).ok()?;
    s.connect(to).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// Checks that the config's host for this rank's cluster is an address of
/// this machine (binding it succeeds), so a config whose host list does not
/// match the launcher's placement fails at once, naming cluster and host.
fn check_host_is_here(
    cfg: &JobConfig,
    cluster: usize,
    launcher: Launcher,
) -> Result<(), ControlError> {
    let Some(spec) = cfg.clusters.get(cluster) else {
        return Ok(());
    };
    let host = &spec.host;
    // Unresolvable hosts are reported by the INIs' bind with the resolver's words.
    if host_is_here(host) != Some(false) {
        return Ok(());
    }
    Err(ControlError::HostNotHere {
        cluster,
        launcher,
        host: host.clone(),
        here: this_host_name().unwrap_or_else(|| "this machine".to_owned()),
    })
}

/// This machine's host name (`uname`'s node name).
pub fn this_host_name() -> Option<String> {
    nix::sys::utsname::uname()
        .ok()
        .map(|u| u.nodename().to_string_lossy().into_owned())
}

/// Whether `host` (a name or an address) is one of this machine's addresses: binding a
/// UDP socket to it succeeds, or fails only for another reason than "not an address of
/// this machine". `None` when it does not resolve.
pub fn host_is_here(host: &str) -> Option<bool> {
    let addr = resolve(host, 0).ok()?;
    Some(!matches!(
        std::net::UdpSocket::bind(addr),
        Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable
    ))
}

fn parse_count(var: &'static str, value: &str) -> Result<usize, ControlError> {
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    match value.parse() {
        Ok(n) if digits => Ok(n),
        _ => Err(ControlError::BadVariable {
            var,
            value: Some(value.to_owned()),
            problem: "expected a non-negative decimal integer".to_owned(),
        }),
    }
}

/// Parses `host:port` (`[v6]:port` for IPv6) and resolves the host,
/// preferring an IPv4 address.
///
/// # Errors
///
/// A message saying what is wrong.
pub fn parse_host_port(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("expected host:port".to_owned());
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("port {port:?} is not a number between 0 and 65535"))?;
    resolve(host, port)
}

/// Resolves `host` (a name or an address, IPv6 possibly in brackets) with
/// `port`, preferring an IPv4 address.
///
/// # Errors
///
/// The resolver's answer, in words.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| "the name has no address".to_owned())
}

/// A TCP port that is free on `ip` now (the kernel picks it). Another
/// process may take it before it is bound again; the coordinator then
/// fails with an error naming the port.
///
/// # Errors
///
/// The error of binding `ip:0`.
pub fn free_tcp_port(ip: IpAddr) -> io::Result<u16> {
    Ok(TcpListener::bind(SocketAddr::new(ip, 0))?
        .local_addr()?
        .port())
}

/// [`free_tcp_port`] on 127.0.0.1.
///
/// # Errors
///
/// As [`free_tcp_port`].
pub fn free_loopback_port() -> io::Result<u16> {
    free_tcp_port(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// What a cluster tells every other cluster at start-up. `payload` is
/// opaque to the control plane (the network layer puts its INI UDP
/// addresses and shared-segment name there).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The cluster's id.
    pub cluster: usize,
    /// The host name of the machine it runs on.
    pub host: String,
    /// The machine's boot id (`/proc/sys/kernel/random/boot_id`): two
    /// clusters with equal boot ids run on the same machine (and may share
    /// memory).
    pub boot_id: String,
    /// The cluster process's pid.
    pub pid: u32,
    /// Data for the layers above, opaque here.
    pub payload: Vec<u8>,
}

impl Registration {
    /// This process's registration as cluster `cluster`: the host name
    /// (`uname`'s node name), the boot id and the pid filled in.
    pub fn local(cluster: usize, payload: Vec<u8>) -> Registration {
        let host = this_host_name().unwrap_or_else(|| "unknown-host".to_owned());
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| format!("unknown-boot-id-of-{host}"));
        Registration {
            cluster,
            host,
            boot_id,
            pid: std::process::id(),
            payload,
        }
    }

    /// Whether `other` runs on the same machine (equal boot ids).
    pub fn same_machine(&self, other: &Registration) -> bool {
        self.boot_id == other.boot_id
    }
}
