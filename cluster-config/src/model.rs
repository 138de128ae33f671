//! The resolved, validated job configuration.

use std::fmt;
use std::net::{IpAddr, ToSocketAddrs as _};
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

/// Job label used when `[job] key` is not given: the ASCII bytes of `"multi"`,
/// a zero byte and the version 1 (`0x6d75_6c74_6900_0001`).
pub const DEFAULT_JOB_KEY: u64 = 0x6d75_6c74_6900_0001;
/// The only DSM page size supported now, in bytes (the x86-64 and default
/// aarch64 base page size that userfaultfd installs pages at).
pub const PAGE_SIZE: u64 = 4096;
/// Lowest DSM region base address, in bytes (Linux's default `vm.mmap_min_addr`).
pub const MIN_REGION_BASE: u64 = 0x1_0000;
/// End of the user address space that every 64-bit Linux target provides
/// without opting into 5-level paging: 2^47 bytes. The DSM region must end
/// at or below it.
pub const USER_SPACE_END: u64 = 1 << 47;
/// Largest sliding-window size in frames (`ini.window`): the sliding window's own
/// limit, [`multigrain_window::MAX_WINDOW`], so that what `config check` accepts
/// is what the INIs run.
pub const MAX_WINDOW: u32 = multigrain_window::MAX_WINDOW;
/// Largest `dsm.region_size`, in bytes: the coherence protocol's page numbers
/// ([`multigrain_coherence::MAX_PAGES`] pages of [`PAGE_SIZE`] bytes, 64 GiB), so that
/// what `config check` accepts is what the DSM runs.
pub const MAX_REGION_SIZE: u64 = multigrain_coherence::MAX_PAGES as u64 * PAGE_SIZE;
/// Smallest allowed `ini.mtu`, in bytes.
pub const MIN_MTU: usize = 512;
/// Largest allowed `ini.mtu`, in bytes: the largest UDP payload over IPv4
/// (65535 − 20 bytes IP header − 8 bytes UDP header).
pub const MAX_MTU: usize = 65_507;
/// Most clusters a job may have.
pub const MAX_CLUSTERS: usize = 1024;
/// Most compute threads a cluster may have.
pub const MAX_THREADS_PER_CLUSTER: usize = 1024;
/// Most INI (protocol) threads a cluster may have.
pub const MAX_INIS_PER_CLUSTER: usize = 64;
/// Host of the clusters the `[local]` shorthand creates.
pub const LOCAL_HOST: &str = "127.0.0.1";

/// The error of parsing one of the configuration's keyword values
/// (`static`, `round-robin`, `hlrc`, …) from a string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a valid {what}; must be one of: {allowed}")]
pub struct ParseChoiceError {
    /// What was being parsed, e.g. `INI scheduling policy`.
    pub what: &'static str,
    /// The rejected text.
    pub value: String,
    /// The accepted spellings, comma-separated.
    pub allowed: String,
}

/// Defines a keyword enum with its TOML spelling, `FromStr`, `Display` and a
/// string-based `Deserialize` whose error lists the allowed spellings.
macro_rules! choice_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in the order the schema documents them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spelling used in the TOML file.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }

            fn allowed() -> String {
                Self::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParseChoiceError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    ParseChoiceError { what: $what, value: s.to_owned(), allowed: Self::allowed() }
                })
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = crate::raw::Text::deserialize(d)?.0;
                text.parse().map_err(|_| {
                    serde::de::Error::custom(format!("must be one of: {}", Self::allowed()))
                })
            }
        }
    };
}

choice_enum! {
    /// How a compute thread picks the INI that sends its inter-cluster message
    /// (`ini.policy`).
    pub enum IniPolicy ("INI scheduling policy") {
        /// Compute thread *i* always uses INI *i* mod K (`static`, the default).
        #[default]
        Static = "static",
        /// Successive messages of a thread go to successive INIs (`round-robin`).
        RoundRobin = "round-robin",
        /// The INI with the shortest send queue (`least-loaded`).
        LeastLoaded = "least-loaded",
    }
}

choice_enum! {
    /// What carries messages between two clusters on the same host
    /// (`ini.substrate`). Clusters on different hosts always use UDP.
    pub enum Substrate ("substrate") {
        /// Shared memory between clusters on one host, UDP across hosts
        /// (`auto`, the default).
        #[default]
        Auto = "auto",
        /// Shared memory; every cluster must be on one host (`shm`).
        Shm = "shm",
        /// UDP through the INIs for every pair of clusters, even on one
        /// host (`udp`).
        Udp = "udp",
    }
}

choice_enum! {
    /// The page coherence protocol (`dsm.protocol`).
    pub enum Protocol ("coherence protocol") {
        /// Home-based lazy release consistency, multiple writers (`hlrc`,
        /// the default).
        #[default]
        Hlrc = "hlrc",
        /// Sequential consistency, single writer, write-invalidate (`sc`).
        Sc = "sc",
    }
}

choice_enum! {
    /// How pages are assigned their home cluster (`dsm.home`).
    pub enum HomePolicy ("home policy") {
        /// Page *p* lives at cluster *p* mod N (`round-robin`, the default).
        #[default]
        RoundRobin = "round-robin",
        /// The region is cut into N contiguous blocks, block *c* at cluster
        /// *c* (`block`).
        Block = "block",
        /// The cluster that touches a page first becomes its home
        /// (`first-touch`).
        FirstTouch = "first-touch",
    }
}

choice_enum! {
    /// The scheduling priority of each cluster's protocol thread
    /// (`dsm.protocol_priority`).
    pub enum ProtocolPriority ("protocol thread priority") {
        /// Real-time where the process may raise it (root, `CAP_SYS_NICE`, or
        /// `RLIMIT_RTPRIO` ≥ 1), normal otherwise (`auto`, the default).
        #[default]
        Auto = "auto",
        /// Real-time (`SCHED_FIFO`, priority 1), or the cluster fails to start
        /// (`realtime`).
        Realtime = "realtime",
        /// The normal time-sharing scheduler (`normal`).
        Normal = "normal",
    }
}

choice_enum! {
    /// The scheduling policy of each cluster's compute threads and INI threads
    /// (`dsm.thread_policy`); the protocol thread has its own
    /// ([`ProtocolPriority`]).
    pub enum ThreadPolicy ("thread scheduling policy") {
        /// `SCHED_BATCH` (`batch`, the default): a thread's wake-up does not preempt
        /// the thread running on its CPU, which keeps its time slice; only the
        /// real-time protocol thread preempts. A woken INI thread or compute thread
        /// preempted a compute thread that was computing, or polling for that very
        /// message, at every datagram or reply (issue 10, forty-first session: Water
        /// 512 × 50 on 2×2 and 4×1 over UDP 0.93–0.94 × the time, Water 4096 × 3 on 2×2
        /// 0.96 ×, EM3D on 2×2 0.95 ×, the rest within ±4 %). Any process may set it.
        #[default]
        Batch = "batch",
        /// The threads keep the policy they inherit: the time-sharing `SCHED_OTHER`
        /// unless the process was started with another (`normal`).
        Normal = "normal",
    }
}

choice_enum! {
    /// How `multigrain launch` places the cluster processes it starts on its own host
    /// on that host's CPUs (`launch.cpu_bind`), and how clusters it starts over ssh on
    /// a host they share place themselves on that host's.
    pub enum CpuBind ("CPU binding") {
        /// Where the clusters started on the launcher's host have inline INIs
        /// (`ini.inline`, the default): `split` when their compute threads together
        /// outnumber the CPUs the launcher may use, `apart` when they do not; `none`
        /// with dedicated INI threads (`auto`, the default). Oversubscribed, an unbound
        /// cluster can go a time slice with none of its threads running while another
        /// cluster waits for its answer; with a CPU per compute thread, a protocol thread
        /// confined with its own cluster's compute threads takes CPU from them; a
        /// dedicated INI thread confined with its cluster's busy compute threads waits
        /// for a time slice for every datagram.
        #[default]
        Auto = "auto",
        /// Where two or more clusters start on the launcher's host, each is bound to
        /// its own share of the CPUs the launcher may use, in proportion to its compute
        /// threads (one CPU at least; clusters share CPUs only when there are more
        /// clusters than CPUs), as `mpirun --bind-to` and `srun --cpu-bind` place ranks
        /// (`split`). A single cluster there stays unbound. Clusters started over ssh
        /// on a host that two or more of them name follow the same rule on that host:
        /// each binds itself to its share of the CPUs it may use there.
        Split = "split",
        /// As `split`, and each cluster's protocol thread is bound to the other
        /// clusters' shares instead of its own (`apart`): it answers the other clusters
        /// while its own compute threads compute, and runs on the CPUs of the threads
        /// that wait for those answers. A single cluster there stays unbound. Measured on
        /// 2 vCPUs, 2 × 1 against unbound (median of alternating pairs): Water 512 × 50
        /// 0.96 × the time over shared memory and 0.88 × over UDP, Water 4096 × 3 0.97 and
        /// 0.91 ×, EM3D within the spread (README, *CPU binding*). Oversubscribed (2 × 2 on
        /// 2 CPUs) it made Water 1.08 × slower: the other clusters' CPUs then run their
        /// own compute threads.
        Apart = "apart",
        /// No binding: the kernel places every thread (`none`).
        None = "none",
    }
}

choice_enum! {
    /// Whether homes send updates at barriers (`dsm.barrier_updates`, hlrc only).
    pub enum BarrierUpdates ("barrier update policy") {
        /// On (`auto`, the default): the same as `on` in every job, kept so that
        /// existing files still parse (it meant on with two clusters only before
        /// updates worked with more; see `docs/measurements.md`, *Applications*).
        #[default]
        Auto = "auto",
        /// Always (`on`).
        On = "on",
        /// Never: copies are invalidated at barriers and fetched again (`off`).
        Off = "off",
    }
}

impl BarrierUpdates {
    /// Whether updates are sent (whatever the number of clusters).
    pub fn enabled(self) -> bool {
        match self {
            BarrierUpdates::Auto | BarrierUpdates::On => true,
            BarrierUpdates::Off => false,
        }
    }
}

/// What carries messages between two clusters, as resolved by
/// [`JobConfig::link_between`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Link {
    /// Both ends are the same cluster: in-process queues.
    InProcess,
    /// Queues in a shared-memory segment mapped by both cluster processes.
    Shm,
    /// The INIs' reliable protocol over UDP.
    Udp,
}

impl Link {
    /// Short lower-case name: `in-process`, `shm` or `udp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Link::InProcess => "in-process",
            Link::Shm => "shm",
            Link::Udp => "udp",
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `[job]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSettings {
    /// `name`: optional label shown in reports. Default: none.
    pub name: Option<String>,
    /// `key`: 64-bit job label. Control-plane frames carry it, so that a process of
    /// another job (another label) is refused with both labels named. It is **not a
    /// secret** and authenticates nothing: every job runs under a fresh random secret
    /// (handed out by `multigrain launch`/`run` in a 0600 key file, or by cluster 0 at
    /// registration) under which every control frame and INI datagram carries a MAC, and
    /// INI datagrams carry a per-run random epoch instead of this label.
    /// Default: [`DEFAULT_JOB_KEY`].
    pub key: u64,
    /// `startup_timeout_ms`: start-up must complete within this many
    /// milliseconds, else it fails naming the clusters that never registered.
    /// Default: 10000.
    pub startup_timeout_ms: u64,
    /// `peer_timeout_ms`: a dead or silent peer is reported within this many
    /// milliseconds. Default: 3000.
    pub peer_timeout_ms: u64,
    /// `progress_timeout_ms`: the job fails, with a report of what every
    /// thread waits for, when every compute thread of every cluster has waited
    /// in the DSM (for a page, a lock or a barrier) this many milliseconds with
    /// no wait completing anywhere — a hang, not a slow computation (a cluster
    /// that computes is making progress). 0 turns the watchdog off.
    /// Default: [`DEFAULT_PROGRESS_TIMEOUT_MS`] (one minute).
    pub progress_timeout_ms: u64,
}

/// Default of [`JobSettings::progress_timeout_ms`]: one minute, far beyond any
/// wait of a healthy job (the longest waits are barriers behind a slow cluster,
/// and a cluster that computes is not waiting).
pub const DEFAULT_PROGRESS_TIMEOUT_MS: u64 = 60_000;

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            name: None,
            key: DEFAULT_JOB_KEY,
            startup_timeout_ms: 10_000,
            peer_timeout_ms: 3_000,
            progress_timeout_ms: DEFAULT_PROGRESS_TIMEOUT_MS,
        }
    }
}

impl JobSettings {
    /// [`startup_timeout_ms`](Self::startup_timeout_ms) as a `Duration`.
    pub fn startup_timeout(&self) -> Duration {
        Duration::from_millis(self.startup_timeout_ms)
    }

    /// [`peer_timeout_ms`](Self::peer_timeout_ms) as a `Duration`.
    pub fn peer_timeout(&self) -> Duration {
        Duration::from_millis(self.peer_timeout_ms)
    }

    /// [`progress_timeout_ms`](Self::progress_timeout_ms) as a `Duration`, or
    /// `None` when the watchdog is off (0).
    pub fn progress_timeout(&self) -> Option<Duration> {
        (self.progress_timeout_ms > 0).then(|| Duration::from_millis(self.progress_timeout_ms))
    }
}

/// One cluster: an OS process on one host with its compute threads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterSpec {
    /// The cluster's index in the topology (its `SiteId`), from 0.
    pub id: usize,
    /// Hostname or IP address the cluster runs on and its INIs bind to.
    pub host: String,
    /// UDP base port: INI *k* of this cluster uses `port + k`. 0 means each
    /// INI picks a free port (exchanged at start-up).
    pub port: u16,
    /// Number of compute threads, at least 1.
    pub threads: usize,
    /// `inis`: this cluster's INI (protocol) threads when it differs from
    /// `ini.per_cluster` (paper 002 Tables 5.8/5.9 give clusters of different
    /// sizes different INI counts); `None` uses `ini.per_cluster`. See
    /// [`JobConfig::inis_of`].
    pub inis: Option<usize>,
}

impl ClusterSpec {
    /// The UDP ports of this cluster's `inis` INIs, or `None` when the port is
    /// 0 (picked at start-up). Validation guarantees the range fits in `u16`.
    pub fn ini_ports(&self, inis: usize) -> Option<RangeInclusive<u16>> {
        if self.port == 0 || inis == 0 {
            return None;
        }
        let last = usize::from(self.port).saturating_add(inis - 1);
        Some(self.port..=u16::try_from(last).unwrap_or(u16::MAX))
    }

    /// Whether the cluster runs on this machine's loopback interface (see
    /// [`is_loopback`]), so it can be started without ssh.
    pub fn is_loopback(&self) -> bool {
        is_loopback(&self.host)
    }
}

/// The `[ini]` section: the inter-cluster message path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IniConfig {
    /// `per_cluster`: INI (protocol) threads per cluster, K, 1 to
    /// [`MAX_INIS_PER_CLUSTER`]. Default: 1.
    pub per_cluster: usize,
    /// `policy`: how compute threads pick an INI. Default: `static`.
    pub policy: IniPolicy,
    /// `substrate`: transport between clusters on one host. Default: `auto`.
    pub substrate: Substrate,
    /// `window`: sliding-window size in frames, 1 to [`MAX_WINDOW`].
    /// Default: 32.
    pub window: u32,
    /// `send_timeout_us`: least and initial retransmission (SEND) timeout in µs, > 0.
    /// Each connection then sets its own from the round trips it measures (RFC 6298;
    /// doubled after an expiry, at most 64 × this or `job.peer_timeout_ms` / 16; see
    /// `multigrain_window::WindowConfig::adaptive_timeout`). Default: 2000.
    pub send_timeout_us: u64,
    /// `ack_timeout_us`: delayed-ACK timer in µs when there is no reverse
    /// traffic, > 0 and below `send_timeout_us`. Default: 200.
    pub ack_timeout_us: u64,
    /// `mtu`: largest UDP datagram payload in bytes, [`MIN_MTU`] to
    /// [`MAX_MTU`]; larger messages are fragmented. Default: 1472 (a
    /// 1500-byte Ethernet frame less the IPv4 and UDP headers).
    pub mtu: usize,
    /// `queue_capacity`: messages each INI send queue holds, ≥ 1.
    /// Default: 4096.
    pub queue_capacity: usize,
    /// `inline`: a compute thread that hands a message to a free INI runs the INI's
    /// pass itself (its message leaves without a thread hand-over), and waiting
    /// threads poll the network. `false` makes the INI threads dedicated protocol
    /// processors, as in paper 002 chapter 3: compute threads only enqueue and return.
    /// Default: `true` (faster on few cores; `multigrain experiment` runs use `false`).
    pub inline: bool,
    /// `coalesce`: an INI packs messages that are ready together into one datagram
    /// when they fit (a BATCH of sliding-window frames: two 4 KiB pages per 8972-byte
    /// datagram, many small messages per datagram); each frame is still acknowledged
    /// and retransmitted on its own. Most of a datagram's cost is per datagram, so a
    /// barrier's or a prefetch's burst of pages costs about half as many `sendto`s,
    /// `recvfrom`s and MACs. `false`: one message fragment per datagram, as in paper 002
    /// §3.2.1. Not applied while the emulated gap `emulation.gap_us` or
    /// `emulation.per_byte_gap_ns` is set: paper 001's *g* is a gap per message.
    /// Default: `true`.
    pub coalesce: bool,
    /// `offload`: UDP segmentation and receive offload (Linux GSO and GRO). The
    /// datagrams an INI's sliding window releases together for one peer leave in one
    /// `sendmsg` that the kernel (or the NIC) cuts into datagrams, and one read takes
    /// the datagrams of one peer that the receiving kernel coalesced; on the wire
    /// every datagram stays a datagram with its own header and MAC. Most of a small
    /// datagram's cost is per system call: at the default 1,472-byte MTU a page's
    /// three datagrams cost about one send and one read. Not applied under an emulated
    /// gap (`emulation.gap_us`, `emulation.per_byte_gap_ns`) or latency
    /// (`emulation.latency_us`), nor while `[faults]` injects faults; where the kernel
    /// refuses segmentation the INI falls back to one `sendto` per datagram by itself.
    /// Default: `true`.
    pub offload: bool,
    /// `connected_sends`: each INI sends to each peer INI from a UDP socket connected to
    /// it, all bound to a second port of the INI's own (its send port, any free port on
    /// the cluster's address, registered at start-up beside its receive port; peers
    /// accept its datagrams only from there). An unconnected socket's `sendto` looks up the
    /// route for every datagram: ≈ 0.35 µs of a 2.3–2.7 µs one-way on loopback here.
    /// `false`: every datagram leaves from the INI's receive port (`port` + k), for
    /// networks that filter on the source port. Default: `true`.
    pub connected_sends: bool,
    /// `trace_dir`: when not empty, every INI records a 64-byte trace record per
    /// inter-cluster message (paper 002 §4.4.2) and each cluster writes
    /// `trace-cluster-<id>.mgtrace` into this directory at the end of the job
    /// (`multigrain trace summarize` reads them). Default: empty (no trace).
    pub trace_dir: String,
    /// `trace_records`: records each INI keeps (64 bytes each, reserved at start);
    /// later messages are counted as dropped. 1 to [`MAX_TRACE_RECORDS`].
    /// Default: 262,144 (16 MiB per INI).
    pub trace_records: usize,
    /// `poll_interval_min`: a receiving thread polls the network (the INIs' sockets) at
    /// most once in this many of its receive polls — the rest poll only its
    /// shared-memory queues — when recent network polls found messages; 1 to
    /// [`MAX_POLL_INTERVAL`], at most `poll_interval_max`. Default: 8. Paper 000 §3.4:
    /// a network poll costs an order of magnitude more than a shared-memory one. (A DSM
    /// thread waiting in the runtime reads the network at every busy poll whatever this
    /// says; see the README.)
    pub poll_interval_min: u32,
    /// `poll_interval_max`: a receiving thread polls the network at least once in this
    /// many of its receive polls, when recent network polls found nothing. The interval moves linearly between the two bounds
    /// with how many of the last 32 network polls found a message (≥ 24: the minimum;
    /// none: the maximum). Equal bounds poll a fixed fraction (1 and 1: every poll).
    /// 1 to [`MAX_POLL_INTERVAL`]. Default: 32 (paper 000 §3.4: one in 8 to one in 32).
    pub poll_interval_max: u32,
}

/// Largest `ini.poll_interval_min` and `ini.poll_interval_max`: receive polls per
/// network poll.
pub const MAX_POLL_INTERVAL: u32 = 1024;

/// Largest `ini.trace_records` (1 GiB of records per INI).
pub const MAX_TRACE_RECORDS: usize = 1 << 24;

impl Default for IniConfig {
    fn default() -> Self {
        Self {
            per_cluster: 1,
            policy: IniPolicy::Static,
            substrate: Substrate::Auto,
            window: 32,
            send_timeout_us: 2_000,
            ack_timeout_us: 200,
            mtu: 1_472,
            queue_capacity: 4_096,
            inline: true,
            coalesce: true,
            offload: true,
            connected_sends: true,
            trace_dir: String::new(),
            trace_records: 1 << 18,
            poll_interval_min: 8,
            poll_interval_max: 32,
        }
    }
}

impl IniConfig {
    /// [`send_timeout_us`](Self::send_timeout_us) as a `Duration`.
    pub fn send_timeout(&self) -> Duration {
        Duration::from_micros(self.send_timeout_us)
    }

    /// [`ack_timeout_us`](Self::ack_timeout_us) as a `Duration`.
    pub fn ack_timeout(&self) -> Duration {
        Duration::from_micros(self.ack_timeout_us)
    }
}

/// The `[dsm]` section: the shared region and its coherence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsmConfig {
    /// `protocol`: coherence protocol. Default: `hlrc`.
    pub protocol: Protocol,
    /// `home`: home assignment policy. Default: `round-robin`.
    pub home: HomePolicy,
    /// `region_base`: virtual address the region is mapped at in every
    /// cluster, in bytes; page-aligned, at least [`MIN_REGION_BASE`].
    /// Default: `0x5000_0000_0000`.
    pub region_base: u64,
    /// `region_size`: region length in bytes, a positive multiple of the page
    /// size; `region_base + region_size` ≤ [`USER_SPACE_END`]. The file may
    /// write it as an integer or a string like `"1GiB"`. Default: 1 GiB.
    pub region_size: u64,
    /// `page_size`: DSM page size in bytes; only [`PAGE_SIZE`] (4096) is
    /// supported. Default: 4096.
    pub page_size: u64,
    /// `prefetch`: hlrc only: pages after a faulting one that the same fault
    /// also requests from their homes (0 ..= [`MAX_PREFETCH`]; 0 turns
    /// prefetching off): the window a sweep starts with; a fault that continues the
    /// pages the previous one prefetched doubles it, up to 63 pages
    /// (`multigrain_coherence::readahead`). Default: [`DEFAULT_PREFETCH`].
    pub prefetch: u32,
    /// `write_ahead`: hlrc only: read-only pages after a written one that a write
    /// fault continuing a sweep of write faults also opens (twin taken, write
    /// protection lifted), so that the sweep takes one fault per `write_ahead + 1`
    /// pages (0 ..= [`MAX_WRITE_AHEAD`]; 0 turns it off). Default:
    /// [`DEFAULT_WRITE_AHEAD`]. See `multigrain_coherence::Config::write_ahead`.
    pub write_ahead: u32,
    /// `idle_flushes`: hlrc only: an open page (writable, with a twin) unchanged at
    /// this many flushes in a row is closed at the next one (0 ..=
    /// [`MAX_IDLE_FLUSHES`]; 0 closes every open page at every flush). Default:
    /// [`DEFAULT_IDLE_FLUSHES`]. See `multigrain_coherence::Config::idle_flushes`.
    pub idle_flushes: u32,
    /// `release_batch`: contended or pushed locks a cluster keeps, released, until
    /// they leave together after one flush (1 ..= [`MAX_RELEASE_BATCH`]; 1 sends
    /// each back at its release). They also leave at once when another cluster asks
    /// for one of them, when a local thread waits for another cluster's lock, and at
    /// barriers. Default: [`DEFAULT_RELEASE_BATCH`]. See
    /// `multigrain_coherence::Config::release_batch`.
    pub release_batch: u32,
    /// `barrier_updates`: hlrc only: at a barrier a home sends the diffs of its
    /// changed shared pages to the clusters holding copies, which apply them at the
    /// departure (or at a grant that brings their write notices first) instead of
    /// invalidating and fetching the pages again; so does a release for the diffs
    /// its lock cannot carry. Default:
    /// `auto` (on). See
    /// `multigrain_coherence::Config::barrier_updates`.
    pub barrier_updates: BarrierUpdates,
    /// `flush_ahead`: hlrc only: a thread that asks another cluster for a lock
    /// first flushes the cluster's open pages (closes its interval) while the request
    /// is on its way, so the critical section that follows flushes only its own
    /// writes. Default: `true`. See `multigrain_coherence::Config::flush_ahead`.
    pub flush_ahead: bool,
    /// `populate`: each cluster allocates the pages of every shared array in its
    /// region's memory when the array is allocated (`Dsm::alloc`), so that a page's
    /// first fault there, like any later one, maps memory already in place (a minor
    /// fault, where the kernel offers them: Linux >= 6.4); `false` allocates each page
    /// at its first fault, committing memory only for the pages a cluster touches.
    /// Default: `true`.
    pub populate: bool,
    /// `protocol_priority`: the scheduling priority of the protocol thread.
    /// Default: `auto`.
    pub protocol_priority: ProtocolPriority,
    /// `thread_policy`: the scheduling policy of the compute threads and INI threads.
    /// Default: `batch`.
    pub thread_policy: ThreadPolicy,
    /// `event_profile`: each cluster times every event its runtime hands the coherence
    /// machine (a fault, an acquire, a release, a barrier arrival, each received message
    /// by kind), the machine's part of it, and the actions executed for it (flushes,
    /// sends, diffs applied), and the run report shows the table. Two clock reads per
    /// event and per action (≈ 10 ns each), so it is off by default. Default: `false`.
    pub event_profile: bool,
    /// `wait_spin_us`: how long a compute thread that waits — for a page, a lock or a
    /// barrier — polls the protocol queue, yielding its CPU between polls, before it
    /// sleeps until a message wakes it, in µs. A wake-up costs more than a whole
    /// exchange over shared memory, so the default polls for [`DEFAULT_WAIT_SPIN_US`]
    /// (1 ms); where compute threads share their cores with other jobs, a shorter spin
    /// gives the CPU back sooner, and on dedicated cores a longer one spares more
    /// wake-ups. Not applied while more threads of a cluster wait than its process has
    /// CPUs: they sleep at once. `0` sleeps after the busy polls of the first
    /// microseconds. See `multigrain_dsm::DsmOptions::wait_spin`.
    pub wait_spin_us: u64,
}

/// Default of `dsm.wait_spin_us`: 1 ms (how it was chosen: `multigrain_dsm::DsmOptions`).
pub const DEFAULT_WAIT_SPIN_US: u64 = 1_000;

/// Largest `dsm.wait_spin_us`: one second.
pub const MAX_WAIT_SPIN_US: u64 = 1_000_000;

/// Default of `dsm.prefetch`: 7 pages after the faulting one, 8 per miss (as
/// ArgoDSM).
pub const DEFAULT_PREFETCH: u32 = 7;

/// Largest `dsm.prefetch`.
pub const MAX_PREFETCH: u32 = 64;

/// Default of `dsm.write_ahead` (the coherence protocol's).
pub const DEFAULT_WRITE_AHEAD: u32 = multigrain_coherence::DEFAULT_WRITE_AHEAD;

/// Largest `dsm.write_ahead` (the coherence protocol's).
pub const MAX_WRITE_AHEAD: u32 = multigrain_coherence::MAX_WRITE_AHEAD;

/// Default of `dsm.idle_flushes` (the coherence protocol's).
pub const DEFAULT_IDLE_FLUSHES: u32 = multigrain_coherence::DEFAULT_IDLE_FLUSHES;

/// Largest `dsm.idle_flushes` (the coherence protocol's).
pub const MAX_IDLE_FLUSHES: u32 = multigrain_coherence::MAX_IDLE_FLUSHES;

/// Default of `dsm.release_batch` (the coherence protocol's).
pub const DEFAULT_RELEASE_BATCH: u32 = multigrain_coherence::DEFAULT_RELEASE_BATCH;

/// Largest `dsm.release_batch` (the coherence protocol's).
pub const MAX_RELEASE_BATCH: u32 = multigrain_coherence::MAX_RELEASE_BATCH;

impl Default for DsmConfig {
    fn default() -> Self {
        Self {
            protocol: Protocol::Hlrc,
            home: HomePolicy::RoundRobin,
            region_base: 0x5000_0000_0000,
            region_size: 1 << 30,
            page_size: PAGE_SIZE,
            prefetch: DEFAULT_PREFETCH,
            write_ahead: DEFAULT_WRITE_AHEAD,
            idle_flushes: DEFAULT_IDLE_FLUSHES,
            release_batch: DEFAULT_RELEASE_BATCH,
            barrier_updates: BarrierUpdates::Auto,
            flush_ahead: true,
            populate: true,
            protocol_priority: ProtocolPriority::Auto,
            thread_policy: ThreadPolicy::Batch,
            event_profile: false,
            wait_spin_us: DEFAULT_WAIT_SPIN_US,
        }
    }
}

impl DsmConfig {
    /// Number of pages in the region.
    pub fn pages(&self) -> u64 {
        self.region_size / self.page_size
    }

    /// One past the region's last byte address.
    pub fn region_end(&self) -> u64 {
        self.region_base + self.region_size
    }
}

/// The `[emulation]` section: LogGP network emulation after Martin et al.
/// (paper 001, ISCA 1997, §3.2). Every value is ≥ 0 and finite; all 0 (the
/// default) turns emulation off.
///
/// What each parameter does between two clusters (never inside one):
///
/// | key | network path (INIs over UDP) | shared-memory link |
/// |---|---|---|
/// | `send_overhead_us` (*o_s*) | busy loop by the sending thread per message sent | the same |
/// | `recv_overhead_us` (*o_r*) | busy loop by the thread that takes the message from its receive queue (a compute thread's poll, the protocol thread) | the same |
/// | `gap_us` (*g*) | the sending INI injects DATA on a schedule of one datagram per *g* + *n*·*G* (*n* its bytes): the next starts no sooner than that after the previous one began — or was due, when DATA waited for a late INI thread or a full window (those datagrams catch up, never ahead of the schedule); ACK/NAK-only datagrams neither wait nor count | rejected ([`EmulationConfig::check_link`]) |
/// | `per_byte_gap_ns` (*G*) | the per-byte term of that gap | rejected |
/// | `latency_us` (*L*) | every datagram is held *L* after it is read, before the window sees it | every message is held *L* after the receiving thread first sees it |
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EmulationConfig {
    /// `send_overhead_us`: *o_s*, µs of busy loop by the sending thread,
    /// before the message enters the substrate, per message sent to another
    /// cluster (each fragment of a bulk message is a message).
    pub send_overhead_us: f64,
    /// `recv_overhead_us`: *o_r*, µs of busy loop by the receiving thread
    /// (the compute or protocol thread whose poll takes the message from its
    /// receive queue), per message from another cluster delivered to it.
    pub recv_overhead_us: f64,
    /// `gap_us`: *g*, µs from the start of one DATA injection of the sending
    /// INI to the earliest start of its next (network path only; LogP's *g*,
    /// the least interval between injections). The start counted is when the
    /// injection was due if DATA waited for a late INI thread, so that a thread
    /// descheduled at the end of a gap does not slow the emulated interface.
    pub gap_us: f64,
    /// `latency_us`: *L*, µs a message waits before delivery, independent of
    /// load (each message its own *L*, none behind another): in the
    /// receiving INIs on the network path (every datagram, read from the
    /// socket, enters the window *L* later), and at the receiving endpoint
    /// for messages between clusters over shared memory (each message held
    /// *L* from when it is first polled: the thesis's "IO delay", paper 002
    /// Table 5.3).
    pub latency_us: f64,
    /// `per_byte_gap_ns`: *G*, ns of gap per byte of an injected DATA
    /// datagram's fragment (network path only): the next injection starts no
    /// sooner than *g* + *n*·*G* after a datagram carrying *n* bytes of message
    /// frames began to leave (the sliding window's 56-byte header and tag are
    /// not counted).
    pub per_byte_gap_ns: f64,
}

impl EmulationConfig {
    /// Whether any emulation parameter is non-zero.
    pub fn is_enabled(&self) -> bool {
        [
            self.send_overhead_us,
            self.recv_overhead_us,
            self.gap_us,
            self.latency_us,
            self.per_byte_gap_ns,
        ]
        .iter()
        .any(|v| *v != 0.0)
    }

    /// The set parameters that only the INIs can emulate (*g*, *G*: they
    /// stall a network interface, and a shared-memory link has none), as
    /// `(key, value)` with the key's full name.
    pub fn network_only(&self) -> impl Iterator<Item = (&'static str, f64)> {
        [
            ("emulation.gap_us", self.gap_us),
            ("emulation.per_byte_gap_ns", self.per_byte_gap_ns),
        ]
        .into_iter()
        .filter(|(_, v)| *v != 0.0)
    }

    /// Checks that this emulation can be applied on the link `link` between
    /// clusters `a` and `b` chosen by `substrate`: on a shared-memory link
    /// *o_s*, *o_r* and *L* apply, *g* and *G* cannot and are refused. The
    /// one check behind both `config check` (on the links the file implies,
    /// [`JobConfig::check_emulation`]) and a running job (on the links it
    /// found).
    ///
    /// # Errors
    ///
    /// [`EmulationLinkError`] naming the first such key, its value, the
    /// clusters and the substrate.
    pub fn check_link(
        &self,
        link: Link,
        a: usize,
        b: usize,
        substrate: Substrate,
    ) -> Result<(), EmulationLinkError> {
        if link != Link::Shm {
            return Ok(());
        }
        match self.network_only().next() {
            Some((key, value)) => Err(EmulationLinkError {
                key,
                value,
                a,
                b,
                substrate,
            }),
            None => Ok(()),
        }
    }
}

/// An emulation key set for a link that cannot emulate it (see
/// [`EmulationConfig::check_link`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EmulationLinkError {
    /// The key, e.g. `emulation.gap_us`.
    pub key: &'static str,
    /// Its value.
    pub value: f64,
    /// One end of the link (cluster id).
    pub a: usize,
    /// The other end (cluster id).
    pub b: usize,
    /// `ini.substrate`, which chose the link.
    pub substrate: Substrate,
}

impl EmulationLinkError {
    /// Why the value is refused, without the `key = value: ` prefix.
    pub fn reason(&self) -> String {
        format!(
            "emulated only on the network path (it stalls the sending INI), but ini.substrate \
             = \"{}\" links clusters {} and {} over shared memory, where it is not emulated; \
             set ini.substrate = \"udp\" to emulate it between clusters on one host, or set \
             {} = 0",
            self.substrate, self.a, self.b, self.key
        )
    }
}

impl fmt::Display for EmulationLinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}: {}", self.key, self.value, self.reason())
    }
}

impl std::error::Error for EmulationLinkError {}

/// The `[faults]` section: fault injection in the datagram path. Each
/// probability is in [0, 1] and applies to every datagram independently; all
/// 0 (the default) turns injection off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// `drop`: probability that a datagram is dropped.
    pub drop: f64,
    /// `duplicate`: probability that a datagram is delivered twice.
    pub duplicate: f64,
    /// `reorder`: probability that a datagram is held back behind the next.
    pub reorder: f64,
    /// `corrupt`: probability that a byte of the datagram is flipped.
    pub corrupt: f64,
    /// `seed`: seed of the injection's random generator. Default: 1.
    pub seed: u64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            seed: 1,
        }
    }
}

impl FaultConfig {
    /// Whether any fault probability is non-zero.
    pub fn is_enabled(&self) -> bool {
        [self.drop, self.duplicate, self.reorder, self.corrupt]
            .iter()
            .any(|p| *p != 0.0)
    }
}

/// The `[launch]` section: how `multigrain launch` starts clusters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchConfig {
    /// `ssh`: command prefix that runs a command on a non-loopback host; the
    /// host and the command are appended. Non-empty. Default:
    /// `["ssh", "-o", "BatchMode=yes"]`.
    pub ssh: Vec<String>,
    /// `cpu_bind`: how the clusters started on the launcher's host are placed on its
    /// CPUs ([`CpuBind`]). Default: `auto`.
    pub cpu_bind: CpuBind,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self {
            ssh: ["ssh", "-o", "BatchMode=yes"].map(str::to_owned).to_vec(),
            cpu_bind: CpuBind::Auto,
        }
    }
}

/// A validated job configuration.
///
/// Build one with [`JobConfig::from_path`], [`JobConfig::from_str_named`],
/// [`JobConfig::embedded_default`] or [`JobConfig::local`]. The fields are
/// public so that tests can adjust a configuration; the parsers guarantee
/// the rules listed in the crate documentation, code that changes fields
/// takes that responsibility.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    /// The `[job]` section.
    pub job: JobSettings,
    /// The clusters, indexed by [`ClusterSpec::id`]; never empty.
    pub clusters: Vec<ClusterSpec>,
    /// The `[ini]` section.
    pub ini: IniConfig,
    /// The `[dsm]` section.
    pub dsm: DsmConfig,
    /// The `[emulation]` section.
    pub emulation: EmulationConfig,
    /// The `[faults]` section.
    pub faults: FaultConfig,
    /// The `[launch]` section.
    pub launch: LaunchConfig,
}

impl JobConfig {
    /// `clusters` clusters of `threads` compute threads each on
    /// [`LOCAL_HOST`] with port 0, and every section at its default — what
    /// `[local]` alone produces.
    ///
    /// # Panics
    ///
    /// If `clusters` is not in 1..=[`MAX_CLUSTERS`] or `threads` not in
    /// 1..=[`MAX_THREADS_PER_CLUSTER`].
    pub fn local(clusters: usize, threads: usize) -> Self {
        assert!(
            (1..=MAX_CLUSTERS).contains(&clusters),
            "clusters must be in 1..={MAX_CLUSTERS}, got {clusters}"
        );
        assert!(
            (1..=MAX_THREADS_PER_CLUSTER).contains(&threads),
            "threads must be in 1..={MAX_THREADS_PER_CLUSTER}, got {threads}"
        );
        Self {
            job: JobSettings::default(),
            clusters: local_clusters(clusters, threads),
            ini: IniConfig::default(),
            dsm: DsmConfig::default(),
            emulation: EmulationConfig::default(),
            faults: FaultConfig::default(),
            launch: LaunchConfig::default(),
        }
    }

    /// Compute threads summed over all clusters.
    pub fn total_threads(&self) -> usize {
        self.clusters.iter().map(|c| c.threads).sum()
    }

    /// INI threads summed over all clusters.
    pub fn total_inis(&self) -> usize {
        (0..self.clusters.len()).map(|c| self.inis_of(c)).sum()
    }

    /// INI threads of cluster `cluster`: its `[[cluster]] inis`, else
    /// `ini.per_cluster`.
    ///
    /// # Panics
    ///
    /// If `cluster` is not a cluster id.
    pub fn inis_of(&self, cluster: usize) -> usize {
        self.clusters[cluster].inis.unwrap_or(self.ini.per_cluster)
    }

    /// Whether every cluster has `ini.per_cluster` INIs (no `[[cluster]] inis`
    /// that differs).
    pub fn uniform_inis(&self) -> bool {
        (0..self.clusters.len()).all(|c| self.inis_of(c) == self.ini.per_cluster)
    }

    /// Whether clusters `a` and `b` run on the same host (see [`same_host`]).
    ///
    /// # Panics
    ///
    /// If `a` or `b` is not a cluster id.
    pub fn clusters_on_same_host(&self, a: usize, b: usize) -> bool {
        same_host(&self.clusters[a].host, &self.clusters[b].host)
    }

    /// Whether every cluster runs on one host.
    pub fn all_on_one_host(&self) -> bool {
        self.clusters
            .iter()
            .all(|c| same_host(&c.host, &self.clusters[0].host))
    }

    /// What carries messages from cluster `a` to cluster `b`, given
    /// `ini.substrate`.
    ///
    /// # Panics
    ///
    /// If `a` or `b` is not a cluster id.
    pub fn link_between(&self, a: usize, b: usize) -> Link {
        if a == b {
            assert!(a < self.clusters.len(), "no cluster {a}");
            return Link::InProcess;
        }
        match (self.ini.substrate, self.clusters_on_same_host(a, b)) {
            (Substrate::Udp, _) | (_, false) => Link::Udp,
            (Substrate::Auto | Substrate::Shm, true) => Link::Shm,
        }
    }

    /// Checks the emulation against every pair of clusters' link as
    /// [`JobConfig::link_between`] predicts it (see
    /// [`EmulationConfig::check_link`]).
    ///
    /// # Errors
    ///
    /// [`EmulationLinkError`] for the first pair linked over shared memory
    /// while *g* or *G* is set.
    pub fn check_emulation(&self) -> Result<(), EmulationLinkError> {
        if self.emulation.network_only().next().is_none() {
            return Ok(());
        }
        let n = self.clusters.len();
        for a in 0..n {
            for b in a + 1..n {
                self.emulation
                    .check_link(self.link_between(a, b), a, b, self.ini.substrate)?;
            }
        }
        Ok(())
    }
}

pub(crate) fn local_clusters(clusters: usize, threads: usize) -> Vec<ClusterSpec> {
    (0..clusters)
        .map(|id| ClusterSpec {
            id,
            host: LOCAL_HOST.to_owned(),
            port: 0,
            threads,
            inis: None,
        })
        .collect()
}

/// Whether `host` names this machine's loopback interface: `localhost`, a
/// name ending in `.localhost`, an address in 127.0.0.0/8, or `::1`.
/// No name resolution is done.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
        || host.to_ascii_lowercase().ends_with(".localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether two host strings name the same machine, as far as can be told
/// without name resolution: both loopback (see [`is_loopback`]), or equal
/// ignoring ASCII case and a trailing dot. A hostname and that host's IP
/// address count as different hosts.
pub fn same_host(a: &str, b: &str) -> bool {
    (is_loopback(a) && is_loopback(b))
        || a.trim_end_matches('.')
            .eq_ignore_ascii_case(b.trim_end_matches('.'))
}

/// Every address the system's resolver gives `host` (a name or an address, an IPv6
/// address possibly in brackets); `None` if it does not resolve. Two host strings that
/// [`same_host`] keeps apart may still share an address (`node1` and `10.0.0.1`).
pub fn host_addresses(host: &str) -> Option<Vec<IpAddr>> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    Some((bare, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses() {
        for host in [
            "localhost",
            "LOCALHOST",
            "node.localhost",
            "127.0.0.1",
            "127.8.9.1",
            "::1",
            "[::1]",
            "localhost.",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["node01", "10.0.0.1", "::2", "localhost-x", "", "128.0.0.1"] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn same_host_rules() {
        assert!(same_host("127.0.0.1", "localhost"));
        assert!(same_host("Node01", "node01."));
        assert!(!same_host("node01", "node02"));
        assert!(!same_host("node01", "127.0.0.1"));
    }

    #[test]
    fn choice_round_trip_and_error() {
        for p in IniPolicy::ALL {
            assert_eq!(p.as_str().parse::<IniPolicy>(), Ok(*p));
        }
        let err = "fastest".parse::<IniPolicy>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "`fastest` is not a valid INI scheduling policy; must be one of: static, round-robin, least-loaded"
        );
        assert_eq!(HomePolicy::default(), HomePolicy::RoundRobin);
        assert_eq!(Substrate::default().to_string(), "auto");
    }

    #[test]
    fn links_follow_substrate_and_hosts() {
        let mut cfg = JobConfig::local(3, 1);
        cfg.clusters[2].host = "node7".into();
        assert_eq!(cfg.link_between(0, 0), Link::InProcess);
        assert_eq!(cfg.link_between(0, 1), Link::Shm);
        assert_eq!(cfg.link_between(0, 2), Link::Udp);
        cfg.ini.substrate = Substrate::Udp;
        assert_eq!(cfg.link_between(0, 1), Link::Udp);
        assert!(!cfg.all_on_one_host());
        assert!(cfg.clusters_on_same_host(0, 1));
    }

    #[test]
    fn ini_ports_are_base_plus_k() {
        let c = ClusterSpec {
            id: 0,
            host: "h".into(),
            port: 7000,
            threads: 1,
            inis: None,
        };
        assert_eq!(c.ini_ports(3), Some(7000..=7002));
        assert_eq!(ClusterSpec { port: 0, ..c }.ini_ports(3), None);
    }

    #[test]
    fn local_constructor_and_totals() {
        let cfg = JobConfig::local(3, 4);
        assert_eq!(cfg.total_threads(), 12);
        assert_eq!(cfg.total_inis(), 3);
        assert_eq!(
            cfg.clusters[2],
            ClusterSpec {
                id: 2,
                host: LOCAL_HOST.into(),
                port: 0,
                threads: 4,
                inis: None,
            }
        );
        assert_eq!(cfg.dsm.pages(), (1 << 30) / 4096);
    }

    #[test]
    #[should_panic(expected = "clusters must be in")]
    fn local_constructor_rejects_zero_clusters() {
        let _ = JobConfig::local(0, 1);
    }
}
