//! Job topology: the cluster-config TOML schema and its validation.
//!
//! A TOML file describes a multigrain job: its clusters (host, UDP base
//! port, compute threads), the INI (protocol) threads and their scheduling
//! policy, the substrate between clusters on one host, the DSM protocol and
//! region, network emulation, fault injection and how remote clusters are
//! started. [`JobConfig::from_path`] parses and validates such a file;
//! every error names the file, line and column, the key, the value and what
//! is allowed, e.g.
//!
//! ```text
//! jobs/2x2.toml:14:10: ini.window = 0: must be between 1 and 32768 (frames in flight per INI connection)
//! ```
//!
//! [`JobConfig::from_str_with_overrides`] applies `--set KEY=VALUE` values
//! ([`Override`]) over a file and validates the result as one file; errors
//! in them name the flag instead of a file position.
//!
//! `examples/*.toml` in this crate are ready topologies; `examples/2x2.toml`
//! is [`JobConfig::embedded_default`] and comments every key.
//!
//! # Schema
//!
//! Every table rejects unknown keys. Every section except the cluster list
//! is optional, and so is every key marked with a default.
//!
//! | key | default | allowed |
//! |---|---|---|
//! | `job.name` | none | string without control characters |
//! | `job.key` | `0x6d75_6c74_6900_0001` | 0 ..= 2^64−1 (integer, or string above 2^63−1); a label that tells jobs apart, not a secret (each run gets a random secret and epoch) |
//! | `job.startup_timeout_ms` | 10000 | ≥ 1 |
//! | `job.peer_timeout_ms` | 3000 | ≥ 1, and × 1000 > `ini.send_timeout_us` |
//! | `job.progress_timeout_ms` | 60000 | ≥ 0 (0: no progress watchdog) |
//! | `local.clusters` | required | 1 ..= 1024 |
//! | `local.threads` | 1 | 1 ..= 1024 |
//! | `cluster[i].host` | required | hostname or IP: letters, digits, `.-_:%`, not starting with `-` |
//! | `cluster[i].port` | 0 (any free port) | 0 ..= 65535; INI *k* uses port + *k* |
//! | `cluster[i].threads` | 1 | 1 ..= 1024 |
//! | `cluster[i].inis` | `ini.per_cluster` | 1 ..= 64 INI threads of this cluster (counts may differ between clusters) |
//! | `ini.per_cluster` | 1 | 1 ..= 64 |
//! | `ini.policy` | `"static"` | `static`, `round-robin`, `least-loaded` |
//! | `ini.substrate` | `"auto"` | `auto`, `shm`, `udp` |
//! | `ini.window` | 32 | 1 ..= 32768 (2^15) frames |
//! | `ini.send_timeout_us` | 2000 | ≥ 1 µs (the least retransmission timeout; each connection adapts its own to its round trip) |
//! | `ini.ack_timeout_us` | 200 | ≥ 1 µs, < `ini.send_timeout_us` |
//! | `ini.mtu` | 1472 | 512 ..= 65507 bytes |
//! | `ini.queue_capacity` | 4096 | 1 ..= 2^32−1 messages |
//! | `ini.inline` | `true` | `true` (compute threads run free INIs' passes), `false` (dedicated INI threads) |
//! | `ini.trace_dir` | `""` (off) | directory for per-message INI traces (`trace-cluster-<id>.mgtrace`) |
//! | `ini.trace_records` | 262144 | 1 ..= 2^24 records of 64 bytes per INI |
//! | `ini.poll_interval_min` | 8 | 1 ..= 1024 receive polls per network poll while the network is busy; ≤ `ini.poll_interval_max` |
//! | `ini.poll_interval_max` | 32 | 1 ..= 1024 receive polls per network poll while it is quiet (equal bounds: a fixed fraction; paper 000 §3.4) |
//! | `dsm.protocol` | `"hlrc"` | `hlrc`, `sc` |
//! | `dsm.home` | `"round-robin"` | `round-robin`, `block`, `first-touch` |
//! | `dsm.region_base` | `0x5000_0000_0000` | page-aligned, 0x10000 ..= 2^47 − 4096 |
//! | `dsm.region_size` | 1073741824 | bytes or `"1GiB"`-style string; multiple of 4096; at most 64 GiB (2^24 pages); base + size ≤ 2^47 |
//! | `dsm.page_size` | 4096 | 4096 only |
//! | `dsm.prefetch` | 7 | 0 ..= 64 pages after a faulting one, fetched with it (hlrc; doubles along a sweep, up to 63) |
//! | `dsm.write_ahead` | 4 | 0 ..= 64 read-only pages after a written one that a write fault continuing a sweep also opens (hlrc; 0: off) |
//! | `dsm.barrier_updates` | `"auto"` | `auto` (= `on`), `on`, `off`: hlrc homes send their changed shared pages' diffs to the copies at barriers, and at releases those the lock cannot carry (update instead of invalidate) |
//! | `dsm.flush_ahead` | `true` | `true`, `false`: a thread that asks another cluster for a lock first flushes the cluster's open pages while the request is on its way (hlrc) |
//! | `dsm.populate` | `true` | `true`, `false`: each cluster allocates a shared array's pages in memory when the array is allocated, so that every fault maps memory already in place (a minor fault, Linux >= 6.4); `false`: memory only for the pages a cluster touches |
//! | `dsm.idle_flushes` | 64 | 0 ..= 64 flushes an open page may stay unchanged before the next one closes it (hlrc; 0: close at every flush) |
//! | `dsm.release_batch` | 16 | 1 ..= 1024 contended or pushed locks given back together after one flush (1: each at its release) |
//! | `dsm.protocol_priority` | `"auto"` | `auto`, `realtime`, `normal` |
//! | `dsm.event_profile` | `false` | `true`, `false`: time the runtime's handling of each event and action; the run report shows the table (≈ 10 ns per clock read) |
//! | `dsm.wait_spin_us` | 1000 | 0 ..= 1000000 µs a waiting compute thread polls (yielding) before it sleeps; 0: sleep after the first busy polls |
//! | `dsm.thread_policy` | `"batch"` | `batch`, `normal`: the compute and INI threads' scheduling policy (`SCHED_BATCH`: their wake-ups do not preempt) |
//! | `emulation.send_overhead_us`, `recv_overhead_us`, `latency_us` | 0 | finite, ≥ 0 µs (*o_s*, *o_r*, *L*; see [`EmulationConfig`]) |
//! | `emulation.gap_us` | 0 | finite, ≥ 0 µs (*g*); 0 when two clusters are linked over shared memory |
//! | `emulation.per_byte_gap_ns` | 0 | finite, ≥ 0 ns per byte (*G*); 0 when two clusters are linked over shared memory |
//! | `faults.drop`, `duplicate`, `reorder`, `corrupt` | 0 | 0 ..= 1 |
//! | `faults.seed` | 1 | 0 ..= 2^64−1 |
//! | `launch.ssh` | `["ssh", "-o", "BatchMode=yes"]` | non-empty list of strings |
//! | `launch.cpu_bind` | `"auto"` | `auto` (with `ini.inline` true: `split` when the clusters started together on the launcher's host have more compute threads than it has CPUs, else `apart`; `none` with dedicated INI threads), `split` (each of them gets its own share of those CPUs), `apart` (the same shares, each cluster's protocol thread on the other clusters' shares), `none`; clusters started over ssh on a host that two or more of them name apply the same rule to that host's CPUs themselves |
//!
//! The cluster list is either `[local]` (N clusters on 127.0.0.1, port 0)
//! or one `[[cluster]]` table per cluster, not both, with at least one
//! cluster. Clusters on one host with non-zero ports must not share an INI
//! port, and `ini.substrate = "shm"` needs every cluster on one host. The
//! gap *g* and per-byte gap *G* stall an INI, so they are refused when
//! `ini.substrate` links two clusters over shared memory
//! ([`JobConfig::check_emulation`]; a running job repeats the check on the
//! links it finds).
//!
//! # Launchers
//!
//! Under `srun` or an MPI launcher, [`detect_rank`] finds the process's
//! cluster id from the launcher's rank variables, and
//! [`JobConfig::check_launch_rank`] checks that one process was started per
//! cluster.
#![forbid(unsafe_code)]

mod error;
mod launcher;
mod model;
mod overrides;
mod raw;
mod render;
mod resolve;
mod size;

use std::path::Path;

pub use error::{ConfigError, Location};
pub use launcher::{
    ENV_LAUNCHER, LAUNCHER_VARIABLES, LaunchRank, Launcher, LauncherChoice, Placement, RankError,
    detect_placement, detect_placement_from_env, detect_rank, detect_rank_from_env, first_host,
    instance_key, rendezvous_port, set_launcher_choice, slurm_step_id,
};
pub use model::{
    BarrierUpdates, ClusterSpec, CpuBind, DEFAULT_IDLE_FLUSHES, DEFAULT_JOB_KEY, DEFAULT_PREFETCH,
    DEFAULT_PROGRESS_TIMEOUT_MS, DEFAULT_RELEASE_BATCH, DEFAULT_WAIT_SPIN_US, DEFAULT_WRITE_AHEAD,
    DsmConfig, EmulationConfig, EmulationLinkError, FaultConfig, HomePolicy, IniConfig, IniPolicy,
    JobConfig, JobSettings, LOCAL_HOST, LaunchConfig, Link, MAX_CLUSTERS, MAX_IDLE_FLUSHES,
    MAX_INIS_PER_CLUSTER, MAX_MTU, MAX_POLL_INTERVAL, MAX_PREFETCH, MAX_REGION_SIZE,
    MAX_RELEASE_BATCH, MAX_THREADS_PER_CLUSTER, MAX_TRACE_RECORDS, MAX_WAIT_SPIN_US, MAX_WINDOW,
    MAX_WRITE_AHEAD, MIN_MTU, MIN_REGION_BASE, PAGE_SIZE, ParseChoiceError, Protocol,
    ProtocolPriority, Substrate, ThreadPolicy, USER_SPACE_END, host_addresses, is_loopback,
    same_host,
};
pub use overrides::{BadOverride, Override};
pub use size::{ParseSizeError, format_bytes, parse_byte_size};

/// The text of `examples/2x2.toml`, the default job: 2 clusters × 2 compute
/// threads on 127.0.0.1 talking UDP through one INI each.
pub const EMBEDDED_DEFAULT_TOML: &str = include_str!("../examples/2x2.toml");

/// The origin [`JobConfig::embedded_default`] reports in errors.
const EMBEDDED_ORIGIN: &str = "<embedded examples/2x2.toml>";

impl JobConfig {
    /// Reads and validates the configuration file at `path`; errors name the
    /// path as given.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] if the file cannot be read (or is not UTF-8),
    /// otherwise as [`JobConfig::from_str_named`].
    pub fn from_path(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::from_str_named(&text, &path.display().to_string())
    }

    /// Parses and validates a configuration text; `origin` (a file name or a
    /// label) starts every error message.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Syntax`] for invalid TOML, [`ConfigError::UnknownKey`],
    /// [`ConfigError::Missing`], [`ConfigError::Conflict`] or
    /// [`ConfigError::Invalid`] for a file that breaks the schema.
    ///
    /// ```
    /// use multigrain_cluster_config::JobConfig;
    /// let cfg = JobConfig::from_str_named("[local]\nclusters = 3\nthreads = 2\n", "inline")?;
    /// assert_eq!(cfg.total_threads(), 6);
    /// let err = JobConfig::from_str_named("[local]\nclusters = 0\n", "inline").unwrap_err();
    /// assert_eq!(err.to_string(), "inline:2:12: local.clusters = 0: must be between 1 and 1024");
    /// # Ok::<(), multigrain_cluster_config::ConfigError>(())
    /// ```
    pub fn from_str_named(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::from_str_with_overrides(text, origin, &[])
    }

    /// As [`JobConfig::from_path`], with `overrides` (`--set KEY=VALUE`) applied over the
    /// file before validation.
    ///
    /// # Errors
    /// As [`JobConfig::from_str_with_overrides`].
    pub fn from_path_with_overrides(
        path: &Path,
        overrides: &[Override],
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::from_str_with_overrides(&text, &path.display().to_string(), overrides)
    }

    /// Parses a configuration text, sets each of `overrides` over it (creating tables as
    /// needed; a later override of a key wins) and validates the result as one file.
    ///
    /// # Errors
    /// As [`JobConfig::from_str_named`]; an error in an override's value, or one the
    /// schema finds at it, is located at the flag:
    ///
    /// ```
    /// use multigrain_cluster_config::{JobConfig, Override};
    /// let set = |s: &str| s.parse::<Override>().unwrap();
    /// let text = "[local]\nclusters = 2\n";
    /// let cfg = JobConfig::from_str_with_overrides(text, "job.toml", &[set("ini.policy=round-robin")])?;
    /// assert_eq!(cfg.ini.policy.as_str(), "round-robin");
    /// let err = JobConfig::from_str_with_overrides(text, "job.toml", &[set("local.clusters=0")]).unwrap_err();
    /// assert_eq!(err.to_string(), "--set local.clusters=0: local.clusters = 0: must be between 1 and 1024");
    /// # Ok::<(), multigrain_cluster_config::ConfigError>(())
    /// ```
    pub fn from_str_with_overrides(
        text: &str,
        origin: &str,
        overrides: &[Override],
    ) -> Result<Self, ConfigError> {
        let plain = error::Source {
            origin,
            text,
            overrides: None,
        };
        if let Err(e) = toml::de::DeTable::parse(text) {
            return Err(plain.toml_error(&e, true));
        }
        if overrides.is_empty() {
            let raw: raw::RawFile =
                toml::from_str(text).map_err(|e| plain.toml_error(&e, false))?;
            return resolve::resolve(raw, &plain);
        }
        let combined = overrides::Combined::new(text, overrides);
        let src = error::Source {
            origin,
            text: &combined.text,
            overrides: Some(&combined),
        };
        // The file again, from the combined text, so that it and the values share a lifetime.
        let mut root = toml::de::DeTable::parse(&combined.text[..text.len()])
            .map_err(|e| plain.toml_error(&e, true))?;
        overrides::apply(root.get_mut(), &combined, overrides)?;
        let de = toml::de::Deserializer::from(root);
        let raw = <raw::RawFile as serde::Deserialize>::deserialize(de)
            .map_err(|e| src.toml_error(&e, false))?;
        resolve::resolve(raw, &src)
    }

    /// The default job, [`EMBEDDED_DEFAULT_TOML`]: 2 clusters × 2 compute
    /// threads on 127.0.0.1, one INI each, `static` policy, `udp` substrate.
    /// It cannot fail: this crate's tests parse the same text.
    pub fn embedded_default() -> Self {
        Self::from_str_named(EMBEDDED_DEFAULT_TOML, EMBEDDED_ORIGIN)
            .expect("examples/2x2.toml is valid: checked by this crate's tests")
    }
}
