//! From the file as written ([`RawFile`]) to a validated [`JobConfig`]:
//! defaults, ranges, and the rules that involve more than one value.

use std::fmt::Display;
use std::ops::Range;

use toml::Spanned;

use crate::error::{ConfigError, Source};
use crate::model::{
    ClusterSpec, DsmConfig, EmulationConfig, FaultConfig, IniConfig, JobConfig, JobSettings,
    LaunchConfig, MAX_CLUSTERS, MAX_IDLE_FLUSHES, MAX_INIS_PER_CLUSTER, MAX_MTU, MAX_PREFETCH,
    MAX_REGION_SIZE, MAX_RELEASE_BATCH, MAX_THREADS_PER_CLUSTER, MAX_WAIT_SPIN_US, MAX_WINDOW,
    MAX_WRITE_AHEAD, MIN_MTU, MIN_REGION_BASE, PAGE_SIZE, Substrate, USER_SPACE_END,
    local_clusters, same_host,
};
use crate::raw::{
    Field, Int, Number, RawCluster, RawDsm, RawEmulation, RawFaults, RawFile, RawIni, RawJob,
    RawLaunch, RawLocal, Text, U64,
};
use crate::size::format_bytes;

/// The resolved clusters and, for each, the span of its `port` when written.
type ClusterList = (Vec<ClusterSpec>, Vec<Option<Range<usize>>>);

/// A resolved value and, when the file wrote it, where.
#[derive(Clone)]
struct Val<T> {
    value: T,
    span: Option<Range<usize>>,
}

impl<T: Clone> Val<T> {
    fn from_field<R>(field: &Field<R>, default: T, get: impl FnOnce(&R) -> T) -> Self {
        match field {
            Some(f) => Val {
                value: get(f.get_ref()),
                span: Some(f.span()),
            },
            None => Val {
                value: default,
                span: None,
            },
        }
    }
}

/// An inclusive range check with the message that explains it.
struct Bounds {
    lo: i128,
    hi: i128,
    why: &'static str,
}

impl Bounds {
    fn between(lo: i128, hi: i128) -> Self {
        Self { lo, hi, why: "" }
    }

    fn because(self, why: &'static str) -> Self {
        Self { why, ..self }
    }

    fn message(&self) -> String {
        format!("must be between {} and {}{}", self.lo, self.hi, self.why)
    }
}

/// Resolves a parsed file.
pub(crate) fn resolve(raw: RawFile, src: &Source<'_>) -> Result<JobConfig, ConfigError> {
    let r = Resolver { src };
    let job = r.job(raw.job.as_ref())?;
    let (clusters, port_spans) = r.clusters(raw.local.as_ref(), raw.cluster.as_ref())?;
    let ini = r.ini(raw.ini.as_ref())?;
    let dsm = r.dsm(raw.dsm.as_ref())?;
    let emulation = r.emulation(raw.emulation.as_ref())?;
    let faults = r.faults(raw.faults.as_ref())?;
    let launch = r.launch(raw.launch.as_ref())?;

    r.check_ports(&clusters, &port_spans, ini.per_cluster.value)?;
    r.check_substrate(&clusters, &ini.substrate)?;
    r.check_timeouts(
        &job.peer_timeout_ms,
        &ini.send_timeout_us,
        &ini.ack_timeout_us,
    )?;
    r.check_poll_interval(&ini.poll_interval_min, &ini.poll_interval_max)?;

    let cfg = JobConfig {
        job: JobSettings {
            name: job.name,
            key: job.key,
            startup_timeout_ms: job.startup_timeout_ms,
            peer_timeout_ms: job.peer_timeout_ms.value,
            progress_timeout_ms: job.progress_timeout_ms,
        },
        clusters,
        ini: IniConfig {
            per_cluster: ini.per_cluster.value,
            policy: ini.policy,
            substrate: ini.substrate.value,
            window: ini.window,
            send_timeout_us: ini.send_timeout_us.value,
            ack_timeout_us: ini.ack_timeout_us.value,
            mtu: ini.mtu,
            queue_capacity: ini.queue_capacity,
            inline: ini.inline,
            coalesce: ini.coalesce,
            offload: ini.offload,
            connected_sends: ini.connected_sends,
            trace_dir: ini.trace_dir,
            trace_records: ini.trace_records,
            poll_interval_min: ini.poll_interval_min.value,
            poll_interval_max: ini.poll_interval_max.value,
        },
        dsm,
        emulation,
        faults,
        launch,
    };
    r.check_emulation(&cfg, raw.emulation.as_ref())?;
    Ok(cfg)
}

struct Job {
    name: Option<String>,
    key: u64,
    startup_timeout_ms: u64,
    peer_timeout_ms: Val<u64>,
    progress_timeout_ms: u64,
}

struct Ini {
    per_cluster: Val<usize>,
    policy: crate::IniPolicy,
    substrate: Val<Substrate>,
    window: u32,
    send_timeout_us: Val<u64>,
    ack_timeout_us: Val<u64>,
    mtu: usize,
    queue_capacity: usize,
    inline: bool,
    coalesce: bool,
    offload: bool,
    connected_sends: bool,
    trace_dir: String,
    trace_records: usize,
    poll_interval_min: Val<u32>,
    poll_interval_max: Val<u32>,
}

struct Resolver<'a, 'b> {
    src: &'b Source<'a>,
}

impl Resolver<'_, '_> {
    /// An error about a value that is written in the file, or — for a
    /// default — about the whole file.
    fn invalid<T: Display>(&self, val: &Val<T>, key: &str, allowed: String) -> ConfigError {
        match &val.span {
            Some(span) => self.src.invalid(span.clone(), key, allowed),
            None => ConfigError::Invalid {
                at: self.src.location(0),
                key: key.to_owned(),
                value: format!("{} (default)", val.value),
                allowed,
            },
        }
    }

    /// An integer within `bounds`, converted to `T`.
    fn int<T>(
        &self,
        field: &Field<Int>,
        key: &str,
        default: T,
        bounds: Bounds,
    ) -> Result<Val<T>, ConfigError>
    where
        T: TryFrom<i128> + Clone,
    {
        let Some(f) = field else {
            return Ok(Val {
                value: default,
                span: None,
            });
        };
        let v = f.get_ref().0;
        let in_range = (bounds.lo..=bounds.hi).contains(&v);
        match T::try_from(v) {
            Ok(value) if in_range => Ok(Val {
                value,
                span: Some(f.span()),
            }),
            _ => Err(self.src.invalid(f.span(), key, bounds.message())),
        }
    }

    /// A finite number that is at least 0 and, when `max` is given, at most
    /// `max`.
    fn number(
        &self,
        field: &Field<Number>,
        key: &str,
        max: Option<f64>,
        allowed: &str,
    ) -> Result<f64, ConfigError> {
        let Some(f) = field else { return Ok(0.0) };
        let v = f.get_ref().0;
        if v.is_finite() && v >= 0.0 && max.is_none_or(|m| v <= m) {
            Ok(v)
        } else {
            Err(self.src.invalid(f.span(), key, allowed))
        }
    }

    fn job(&self, raw: Option<&RawJob>) -> Result<Job, ConfigError> {
        let d = JobSettings::default();
        let Some(raw) = raw else {
            return Ok(Job {
                name: d.name,
                key: d.key,
                startup_timeout_ms: d.startup_timeout_ms,
                peer_timeout_ms: Val {
                    value: d.peer_timeout_ms,
                    span: None,
                },
                progress_timeout_ms: d.progress_timeout_ms,
            });
        };
        let name = match &raw.name {
            Some(n) if n.get_ref().0.chars().any(char::is_control) => {
                return Err(self.src.invalid(
                    n.span(),
                    "job.name",
                    "must not contain control characters such as newlines or tabs",
                ));
            }
            Some(n) => Some(n.get_ref().0.clone()),
            None => None,
        };
        let timeout = Bounds::between(1, u64::MAX.into()).because(" (milliseconds)");
        Ok(Job {
            name,
            key: raw.key.as_ref().map_or(d.key, |k| k.get_ref().0),
            startup_timeout_ms: self
                .int(
                    &raw.startup_timeout_ms,
                    "job.startup_timeout_ms",
                    d.startup_timeout_ms,
                    timeout,
                )?
                .value,
            peer_timeout_ms: self.int(
                &raw.peer_timeout_ms,
                "job.peer_timeout_ms",
                d.peer_timeout_ms,
                Bounds::between(1, u64::MAX.into()).because(" (milliseconds)"),
            )?,
            progress_timeout_ms: self
                .int(
                    &raw.progress_timeout_ms,
                    "job.progress_timeout_ms",
                    d.progress_timeout_ms,
                    Bounds::between(0, u64::MAX.into()).because(" (milliseconds; 0: off)"),
                )?
                .value,
        })
    }

    /// The cluster list from `[local]` or `[[cluster]]`, and the span of each
    /// cluster's `port` when written.
    fn clusters(
        &self,
        local: Option<&Spanned<RawLocal>>,
        list: Option<&Spanned<Vec<Spanned<RawCluster>>>>,
    ) -> Result<ClusterList, ConfigError> {
        match (local, list) {
            (Some(local), Some(list)) => {
                let (later, key, other, other_at) = if local.span().start > list.span().start {
                    (local.span(), "local", "[[cluster]]", list.span())
                } else {
                    (list.span(), "cluster", "[local]", local.span())
                };
                Err(ConfigError::Conflict {
                    at: self.src.location(later.start),
                    key: key.to_owned(),
                    allowed: format!(
                        "[local] and [[cluster]] cannot both be given ({other} is at line {}): \
                         use [local] for N clusters on {}, or one [[cluster]] per cluster",
                        self.src.location(other_at.start).line,
                        crate::LOCAL_HOST,
                    ),
                })
            }
            (Some(local), None) => self.local(local.get_ref()),
            (None, Some(list)) => self.explicit(list),
            (None, None) => Err(ConfigError::Missing {
                at: self.src.location(0),
                key: "cluster".to_owned(),
                allowed: "a job needs at least one cluster: add a [local] section \
                          (clusters = N, threads = T) or one [[cluster]] table per cluster"
                    .to_owned(),
            }),
        }
    }

    fn local(&self, raw: &RawLocal) -> Result<ClusterList, ConfigError> {
        let clusters = self.int(
            &Some(raw.clusters.clone()),
            "local.clusters",
            1,
            Bounds::between(1, MAX_CLUSTERS as i128),
        )?;
        let threads = self.int(
            &raw.threads,
            "local.threads",
            1,
            Bounds::between(1, MAX_THREADS_PER_CLUSTER as i128),
        )?;
        let n = clusters.value;
        Ok((local_clusters(n, threads.value), vec![None; n]))
    }

    fn explicit(
        &self,
        list: &Spanned<Vec<Spanned<RawCluster>>>,
    ) -> Result<ClusterList, ConfigError> {
        let items = list.get_ref();
        if items.is_empty() {
            return Err(self.src.invalid(
                list.span(),
                "cluster",
                "at least one cluster is required",
            ));
        }
        if items.len() > MAX_CLUSTERS {
            return Err(self.src.invalid(
                items[MAX_CLUSTERS].span(),
                "cluster",
                format!("a job may have at most {MAX_CLUSTERS} clusters"),
            ));
        }
        let mut clusters = Vec::with_capacity(items.len());
        let mut port_spans = Vec::with_capacity(items.len());
        for (id, item) in items.iter().enumerate() {
            let raw = item.get_ref();
            let host = self.host(&raw.host, &format!("cluster[{id}].host"))?;
            let port = self.int(
                &raw.port,
                &format!("cluster[{id}].port"),
                0u16,
                Bounds::between(0, u16::MAX.into()).because(" (0 picks a free port for each INI)"),
            )?;
            let threads = self.int(
                &raw.threads,
                &format!("cluster[{id}].threads"),
                1usize,
                Bounds::between(1, MAX_THREADS_PER_CLUSTER as i128),
            )?;
            let inis = match &raw.inis {
                None => None,
                Some(_) => Some(
                    self.int(
                        &raw.inis,
                        &format!("cluster[{id}].inis"),
                        1usize,
                        Bounds::between(1, MAX_INIS_PER_CLUSTER as i128)
                            .because(" (this cluster's INI threads; default ini.per_cluster)"),
                    )?
                    .value,
                ),
            };
            clusters.push(ClusterSpec {
                id,
                host,
                port: port.value,
                threads: threads.value,
                inis,
            });
            port_spans.push(port.span);
        }
        Ok((clusters, port_spans))
    }

    fn host(&self, raw: &Spanned<Text>, key: &str) -> Result<String, ConfigError> {
        let host = &raw.get_ref().0;
        let problem = if host.is_empty() {
            Some("must not be empty: give a hostname or IP address")
        } else if host.starts_with('-') {
            Some("must not start with '-' (ssh would read it as an option)")
        } else if !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_:%".contains(c))
        {
            Some(
                "must be a hostname or IP address: letters, digits, '.', '-', '_', ':' and '%' \
                 only",
            )
        } else {
            None
        };
        match problem {
            Some(p) => Err(self.src.invalid(raw.span(), key, p)),
            None => Ok(host.clone()),
        }
    }

    fn ini(&self, raw: Option<&RawIni>) -> Result<Ini, ConfigError> {
        let d = IniConfig::default();
        let empty = RawIni {
            per_cluster: None,
            policy: None,
            substrate: None,
            window: None,
            send_timeout_us: None,
            ack_timeout_us: None,
            mtu: None,
            queue_capacity: None,
            inline: None,
            coalesce: None,
            offload: None,
            connected_sends: None,
            trace_dir: None,
            trace_records: None,
            poll_interval_min: None,
            poll_interval_max: None,
        };
        let raw = raw.unwrap_or(&empty);
        let timeout = || Bounds::between(1, u64::MAX.into()).because(" (microseconds)");
        let poll = || {
            Bounds::between(1, crate::MAX_POLL_INTERVAL.into())
                .because(" (receive polls per network poll)")
        };
        Ok(Ini {
            per_cluster: self.int(
                &raw.per_cluster,
                "ini.per_cluster",
                d.per_cluster,
                Bounds::between(1, MAX_INIS_PER_CLUSTER as i128)
                    .because(" (INI threads per cluster)"),
            )?,
            policy: raw.policy.as_ref().map_or(d.policy, |p| *p.get_ref()),
            substrate: Val::from_field(&raw.substrate, d.substrate, |s| *s),
            window: self
                .int(
                    &raw.window,
                    "ini.window",
                    d.window,
                    Bounds::between(1, MAX_WINDOW.into())
                        .because(" (frames in flight per INI connection)"),
                )?
                .value,
            send_timeout_us: self.int(
                &raw.send_timeout_us,
                "ini.send_timeout_us",
                d.send_timeout_us,
                timeout(),
            )?,
            ack_timeout_us: self.int(
                &raw.ack_timeout_us,
                "ini.ack_timeout_us",
                d.ack_timeout_us,
                timeout(),
            )?,
            mtu: self
                .int(
                    &raw.mtu,
                    "ini.mtu",
                    d.mtu,
                    Bounds::between(MIN_MTU as i128, MAX_MTU as i128).because(
                        " bytes (the largest UDP payload is 65507; 1472 fits a 1500-byte \
                         Ethernet frame)",
                    ),
                )?
                .value,
            queue_capacity: self
                .int(
                    &raw.queue_capacity,
                    "ini.queue_capacity",
                    d.queue_capacity,
                    Bounds::between(1, u32::MAX.into()).because(" (messages)"),
                )?
                .value,
            inline: raw.inline.as_ref().map_or(d.inline, |b| *b.get_ref()),
            coalesce: raw.coalesce.as_ref().map_or(d.coalesce, |b| *b.get_ref()),
            offload: raw.offload.as_ref().map_or(d.offload, |b| *b.get_ref()),
            connected_sends: raw
                .connected_sends
                .as_ref()
                .map_or(d.connected_sends, |b| *b.get_ref()),
            trace_dir: raw
                .trace_dir
                .as_ref()
                .map_or(d.trace_dir, |t| t.get_ref().0.clone()),
            trace_records: self
                .int(
                    &raw.trace_records,
                    "ini.trace_records",
                    d.trace_records,
                    Bounds::between(1, crate::MAX_TRACE_RECORDS as i128)
                        .because(" (records of 64 bytes per INI)"),
                )?
                .value,
            poll_interval_min: self.int(
                &raw.poll_interval_min,
                "ini.poll_interval_min",
                d.poll_interval_min,
                poll(),
            )?,
            poll_interval_max: self.int(
                &raw.poll_interval_max,
                "ini.poll_interval_max",
                d.poll_interval_max,
                poll(),
            )?,
        })
    }

    fn dsm(&self, raw: Option<&RawDsm>) -> Result<DsmConfig, ConfigError> {
        let d = DsmConfig::default();
        let Some(raw) = raw else { return Ok(d) };
        if let Some(p) = &raw.page_size
            && p.get_ref().0 != i128::from(PAGE_SIZE)
        {
            return Err(self.src.invalid(
                p.span(),
                "dsm.page_size",
                format!("only {PAGE_SIZE} is supported now (the kernel's base page size)"),
            ));
        }
        let base = self.int(
            &raw.region_base,
            "dsm.region_base",
            d.region_base,
            Bounds::between(MIN_REGION_BASE.into(), (USER_SPACE_END - PAGE_SIZE).into()),
        );
        let base = base.map_err(|_| {
            let f = raw.region_base.as_ref().map(|f| f.span()).unwrap_or(0..0);
            self.src.invalid(
                f,
                "dsm.region_base",
                format!(
                    "must be a page-aligned address in the user address space, from {MIN_REGION_BASE:#x} \
                     to {:#x}",
                    USER_SPACE_END - PAGE_SIZE
                ),
            )
        })?;
        if !base.value.is_multiple_of(PAGE_SIZE) {
            return Err(self.invalid(
                &base,
                "dsm.region_base",
                format!(
                    "must be a multiple of the page size ({PAGE_SIZE} bytes); {:#x} or {:#x} would do",
                    base.value / PAGE_SIZE * PAGE_SIZE,
                    (base.value / PAGE_SIZE + 1) * PAGE_SIZE
                ),
            ));
        }
        let size = match &raw.region_size {
            None => Val {
                value: d.region_size,
                span: None,
            },
            Some(f) => {
                let v = f.get_ref().0;
                let ok = u64::try_from(v)
                    .ok()
                    .filter(|v| *v > 0 && v.is_multiple_of(PAGE_SIZE) && *v <= MAX_REGION_SIZE);
                match ok {
                    Some(value) => Val {
                        value,
                        span: Some(f.span()),
                    },
                    None => {
                        return Err(self.src.invalid(
                            f.span(),
                            "dsm.region_size",
                            format!(
                                "must be a positive multiple of the page size ({PAGE_SIZE} \
                                 bytes) and at most {} (the protocol's page numbers), e.g. \
                                 1073741824 or \"1GiB\"",
                                format_bytes(MAX_REGION_SIZE)
                            ),
                        ));
                    }
                }
            }
        };
        if base
            .value
            .checked_add(size.value)
            .is_none_or(|end| end > USER_SPACE_END)
        {
            let allowed = format!(
                "the region {:#x}..{:#x} ({}) ends above {USER_SPACE_END:#x}, the end of the \
                 47-bit user address space: lower dsm.region_base or dsm.region_size",
                base.value,
                u128::from(base.value) + u128::from(size.value),
                format_bytes(size.value),
            );
            return Err(if size.span.is_some() {
                self.invalid(&size, "dsm.region_size", allowed)
            } else {
                self.invalid(&base, "dsm.region_base", allowed)
            });
        }
        Ok(DsmConfig {
            protocol: raw.protocol.as_ref().map_or(d.protocol, |p| *p.get_ref()),
            home: raw.home.as_ref().map_or(d.home, |h| *h.get_ref()),
            region_base: base.value,
            region_size: size.value,
            page_size: PAGE_SIZE,
            prefetch: self
                .int(
                    &raw.prefetch,
                    "dsm.prefetch",
                    d.prefetch,
                    Bounds::between(0, MAX_PREFETCH.into())
                        .because(" pages after the faulting one (0 turns prefetching off)"),
                )?
                .value,
            write_ahead: self
                .int(
                    &raw.write_ahead,
                    "dsm.write_ahead",
                    d.write_ahead,
                    Bounds::between(0, MAX_WRITE_AHEAD.into()).because(
                        " read-only pages opened after a written one (0 turns write-ahead off)",
                    ),
                )?
                .value,
            idle_flushes: self
                .int(
                    &raw.idle_flushes,
                    "dsm.idle_flushes",
                    d.idle_flushes,
                    Bounds::between(0, MAX_IDLE_FLUSHES.into()).because(
                        " unchanged flushes before an open page closes (0 closes it at every flush)",
                    ),
                )?
                .value,
            release_batch: self
                .int(
                    &raw.release_batch,
                    "dsm.release_batch",
                    d.release_batch,
                    Bounds::between(1, MAX_RELEASE_BATCH.into())
                        .because(" locks given back together (1 = each at its release)"),
                )?
                .value,
            barrier_updates: raw
                .barrier_updates
                .as_ref()
                .map_or(d.barrier_updates, |b| *b.get_ref()),
            flush_ahead: raw
                .flush_ahead
                .as_ref()
                .map_or(d.flush_ahead, |b| *b.get_ref()),
            populate: raw.populate.as_ref().map_or(d.populate, |b| *b.get_ref()),
            protocol_priority: raw
                .protocol_priority
                .as_ref()
                .map_or(d.protocol_priority, |p| *p.get_ref()),
            thread_policy: raw
                .thread_policy
                .as_ref()
                .map_or(d.thread_policy, |p| *p.get_ref()),
            event_profile: raw
                .event_profile
                .as_ref()
                .map_or(d.event_profile, |b| *b.get_ref()),
            wait_spin_us: self
                .int(
                    &raw.wait_spin_us,
                    "dsm.wait_spin_us",
                    d.wait_spin_us,
                    Bounds::between(0, MAX_WAIT_SPIN_US.into()).because(
                        " µs a waiting thread polls before it sleeps (0 sleeps at once)",
                    ),
                )?
                .value,
        })
    }

    fn emulation(&self, raw: Option<&RawEmulation>) -> Result<EmulationConfig, ConfigError> {
        let Some(raw) = raw else {
            return Ok(EmulationConfig::default());
        };
        let us = "must be a finite number of microseconds, at least 0 (0 turns it off)";
        Ok(EmulationConfig {
            send_overhead_us: self.number(
                &raw.send_overhead_us,
                "emulation.send_overhead_us",
                None,
                us,
            )?,
            recv_overhead_us: self.number(
                &raw.recv_overhead_us,
                "emulation.recv_overhead_us",
                None,
                us,
            )?,
            gap_us: self.number(&raw.gap_us, "emulation.gap_us", None, us)?,
            latency_us: self.number(&raw.latency_us, "emulation.latency_us", None, us)?,
            per_byte_gap_ns: self.number(
                &raw.per_byte_gap_ns,
                "emulation.per_byte_gap_ns",
                None,
                "must be a finite number of nanoseconds per byte, at least 0 (0 turns it off)",
            )?,
        })
    }

    fn faults(&self, raw: Option<&RawFaults>) -> Result<FaultConfig, ConfigError> {
        let d = FaultConfig::default();
        let Some(raw) = raw else { return Ok(d) };
        let p = "must be a probability between 0 and 1";
        Ok(FaultConfig {
            drop: self.number(&raw.drop, "faults.drop", Some(1.0), p)?,
            duplicate: self.number(&raw.duplicate, "faults.duplicate", Some(1.0), p)?,
            reorder: self.number(&raw.reorder, "faults.reorder", Some(1.0), p)?,
            corrupt: self.number(&raw.corrupt, "faults.corrupt", Some(1.0), p)?,
            seed: raw
                .seed
                .as_ref()
                .map_or(d.seed, |s: &Spanned<U64>| s.get_ref().0),
        })
    }

    fn launch(&self, raw: Option<&RawLaunch>) -> Result<LaunchConfig, ConfigError> {
        let d = LaunchConfig::default();
        let cpu_bind = raw
            .and_then(|r| r.cpu_bind.as_ref())
            .map_or(d.cpu_bind, |b| *b.get_ref());
        let Some(ssh) = raw.and_then(|r| r.ssh.as_ref()) else {
            return Ok(LaunchConfig { cpu_bind, ..d });
        };
        let words = ssh.get_ref();
        if words
            .first()
            .is_none_or(|w| w.get_ref().0.trim().is_empty())
        {
            return Err(self.src.invalid(
                ssh.span(),
                "launch.ssh",
                "must start with a command, e.g. [\"ssh\", \"-o\", \"BatchMode=yes\"]",
            ));
        }
        Ok(LaunchConfig {
            ssh: words.iter().map(|w| w.get_ref().0.clone()).collect(),
            cpu_bind,
        })
    }

    /// Clusters on one host with explicit ports must not share an INI port:
    /// INI `k` of a cluster uses `port + k`, and the last one must fit in 16
    /// bits.
    fn check_ports(
        &self,
        clusters: &[ClusterSpec],
        spans: &[Option<Range<usize>>],
        per_cluster: usize,
    ) -> Result<(), ConfigError> {
        let inis_of = |c: &ClusterSpec| c.inis.unwrap_or(per_cluster);
        let last_port = |c: &ClusterSpec| usize::from(c.port) + inis_of(c) - 1;
        let val = |c: &ClusterSpec| Val {
            value: c.port,
            span: spans[c.id].clone(),
        };
        for c in clusters.iter().filter(|c| c.port != 0) {
            let key = format!("cluster[{}].port", c.id);
            let inis = inis_of(c);
            if last_port(c) > usize::from(u16::MAX) {
                return Err(self.invalid(
                    &val(c),
                    &key,
                    format!(
                        "with {inis} INIs this cluster would use ports {}..={}, past 65535: \
                         INI k uses base port + k",
                        c.port,
                        last_port(c)
                    ),
                ));
            }
            let clash = clusters[..c.id].iter().find(|o| {
                o.port != 0
                    && same_host(&o.host, &c.host)
                    && usize::from(c.port) <= last_port(o)
                    && usize::from(o.port) <= last_port(c)
            });
            if let Some(o) = clash {
                let allowed = if inis == 1 && inis_of(o) == 1 {
                    format!(
                        "cluster[{}] on the same host ({}) already uses port {}: give each \
                         cluster on a host its own port, or 0 to pick a free one",
                        o.id, o.host, o.port
                    )
                } else {
                    format!(
                        "INI ports {}..={} overlap ports {}..={} of cluster[{}] on the same \
                         host ({}): INI k uses base port + k (INIs per cluster: ini.per_cluster \
                         or the cluster's inis); use base ports further apart, or 0",
                        c.port,
                        last_port(c),
                        o.port,
                        last_port(o),
                        o.id,
                        o.host
                    )
                };
                return Err(self.invalid(&val(c), &key, allowed));
            }
        }
        Ok(())
    }

    /// `shm` needs every cluster on one host.
    fn check_substrate(
        &self,
        clusters: &[ClusterSpec],
        substrate: &Val<Substrate>,
    ) -> Result<(), ConfigError> {
        if substrate.value != Substrate::Shm {
            return Ok(());
        }
        match clusters
            .iter()
            .find(|c| !same_host(&c.host, &clusters[0].host))
        {
            Some(c) => Err(self.invalid(
                substrate,
                "ini.substrate",
                format!(
                    "\"shm\" needs every cluster on one host, but cluster[0] is on {} and \
                     cluster[{}] on {}: use \"auto\" (shm within a host, udp across hosts) \
                     or \"udp\"",
                    clusters[0].host, c.id, c.host
                ),
            )),
            None => Ok(()),
        }
    }

    /// *g* and *G* only on links that can emulate them
    /// ([`JobConfig::check_emulation`], the check a running job repeats on the
    /// links it finds), reported at the key.
    fn check_emulation(
        &self,
        cfg: &JobConfig,
        raw: Option<&RawEmulation>,
    ) -> Result<(), ConfigError> {
        let Err(e) = cfg.check_emulation() else {
            return Ok(());
        };
        let field = raw.and_then(|r| match e.key {
            "emulation.gap_us" => r.gap_us.as_ref(),
            _ => r.per_byte_gap_ns.as_ref(),
        });
        let val = Val {
            value: e.value,
            span: field.map(|f| f.span()),
        };
        Err(self.invalid(&val, e.key, e.reason()))
    }

    /// The adaptive network-polling interval's bounds must not cross (paper 000 §3.4).
    fn check_poll_interval(&self, min: &Val<u32>, max: &Val<u32>) -> Result<(), ConfigError> {
        if min.value <= max.value {
            return Ok(());
        }
        // Blame the key the file set (the min when both are set).
        let (val, key, bound, other, other_value) = if min.span.is_some() {
            (
                min,
                "ini.poll_interval_min",
                "at most",
                "ini.poll_interval_max",
                max.value,
            )
        } else {
            (
                max,
                "ini.poll_interval_max",
                "at least",
                "ini.poll_interval_min",
                min.value,
            )
        };
        Err(self.invalid(
            val,
            key,
            format!(
                "must be {bound} {other} ({other_value}); equal bounds poll the network a \
                 fixed fraction of the time"
            ),
        ))
    }

    /// The delayed ACK must leave before the sender retransmits, and a peer
    /// must get at least one retransmission before it is declared dead.
    fn check_timeouts(
        &self,
        peer_ms: &Val<u64>,
        send_us: &Val<u64>,
        ack_us: &Val<u64>,
    ) -> Result<(), ConfigError> {
        if ack_us.value >= send_us.value {
            let (val, key, allowed) = if ack_us.span.is_some() {
                (
                    ack_us,
                    "ini.ack_timeout_us",
                    format!(
                        "must be less than ini.send_timeout_us ({} µs), or the sender \
                         retransmits before the delayed ACK is sent",
                        send_us.value
                    ),
                )
            } else {
                (
                    send_us,
                    "ini.send_timeout_us",
                    format!(
                        "must be greater than ini.ack_timeout_us ({} µs), or the sender \
                         retransmits before the delayed ACK is sent",
                        ack_us.value
                    ),
                )
            };
            return Err(self.invalid(val, key, allowed));
        }
        if u128::from(peer_ms.value) * 1000 <= u128::from(send_us.value) {
            return Err(if peer_ms.span.is_some() || send_us.span.is_none() {
                self.invalid(
                    peer_ms,
                    "job.peer_timeout_ms",
                    format!(
                        "must be longer than ini.send_timeout_us ({} µs), so that a peer gets \
                         at least one retransmission before it is declared dead",
                        send_us.value
                    ),
                )
            } else {
                self.invalid(
                    send_us,
                    "ini.send_timeout_us",
                    format!(
                        "must be shorter than job.peer_timeout_ms ({} ms), so that a peer gets \
                         at least one retransmission before it is declared dead",
                        peer_ms.value
                    ),
                )
            });
        }
        Ok(())
    }
}
