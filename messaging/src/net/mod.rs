//! The inter-cluster path: INI threads running the sliding-window protocol over UDP
//! (paper 002 chapter 3), reached through the same [`Endpoint`](crate::Endpoint) API as
//! local and shared-memory destinations.
//!
//! Each cluster runs K INI threads ([`IniGroup`]); each has its own UDP socket and a
//! connection (a [`window::Ini`](crate::window::Ini) core) to every INI of every other
//! cluster reached over the network. A compute thread's send to a remote site picks an INI
//! by the job's scheduling policy (`static`, `round-robin`, `least-loaded`) and drops the
//! message into that INI's lock-free hand-off queue; the INI frames it (module [`frame`]),
//! the window fragments, seals (AES-256-GCM under a key of the job's secret and the run's
//! epoch: encrypted and authenticated), sequences and
//! retransmits it, and the receiving INI reassembles it, restores the sending endpoint's
//! order (per-lane sequence numbers) and deposits it in the destination receive queue — Tag-On data into a slot of the receiving site's pool.
//!
//! Also here: paper 000's adaptive network polling (in the queue layer's `poll` module), fault injection
//! ([`faults`]), UDP segmentation and receive offload (the `offload` module: one system
//! call for a run of datagrams, `ini.offload`), one connected sending socket per peer INI
//! (the `senders` module, `ini.connected_sends`), the LogGP emulation of paper 001 §3.2 (o, g, L, G from the job's
//! `[emulation]` section) and per-INI statistics ([`IniReport`]).

mod core;
pub mod faults;
pub mod frame;
pub(crate) mod handoff;
mod offload;
mod policy;
mod reseq;
mod route;
mod senders;
mod sleep_watch;
pub mod stats;
mod thread;
pub mod trace;
mod tracer;

pub use stats::{IniReport, OffloadStats};

use crate::layout::MappedSite;
use crate::names::SiteId;
use crate::poll::PollBounds;
use crate::pool::Pool;
use crate::site::Site;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::window::{IniAddr, Micros, WindowConfig};
use core::{Counters, IniCore, IniSlot, SocketRead};
use handoff::{Handoff, OutMsg};
use multigrain_cluster_config::{EmulationConfig, FaultConfig, IniPolicy, JobConfig, ThreadPolicy};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use parking_lot::Mutex;
use policy::pick;
use reseq::Resequencer;
use sleep_watch::SleepWatch;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Everything the INI layer takes from the job's configuration.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// INI threads per cluster (K).
    pub inis: usize,
    /// How compute threads choose an INI.
    pub policy: IniPolicy,
    /// Sliding-window parameters (epoch and MAC key, MTU, window, SEND/ACK timeouts, peer
    /// timeout). [`NetConfig::from_job`] leaves the all-zero test key and epoch 0: a job
    /// sets the secret and epoch its control plane agreed ([`crate::job::Job::join`]),
    /// [`connect_loopback`] a fresh random pair.
    pub window: WindowConfig,
    /// Messages each hand-off queue holds.
    pub queue_capacity: usize,
    /// LogGP emulation (all zero = off).
    pub emulation: EmulationConfig,
    /// Fault injection (all zero = off).
    pub faults: FaultConfig,
    /// How long an idle INI keeps polling before it sleeps.
    pub spin: Duration,
    /// How often receive loops (endpoints and INI threads) poll the network among
    /// their polls of shared memory (`ini.poll_interval_min`/`max`; paper 000 §3.4).
    pub poll: PollBounds,
    /// Compute threads run a free INI's pass themselves (`ini.inline`); `false`: only
    /// the INI threads do (dedicated protocol processors, paper 002 chapter 3).
    pub inline: bool,
    /// UDP segmentation and receive offload (`ini.offload`, module `offload`): the
    /// datagrams the window releases together leave in one segmented send per peer,
    /// and a read takes what the kernel coalesced. Off under an emulated gap, per-byte
    /// gap or latency and while the fault shim is active, whatever this says.
    pub offload: bool,
    /// Each INI sends from one connected socket per peer INI, bound to a send port of its
    /// own (`ini.connected_sends`, module `senders`); `false`: from its receive socket,
    /// with `sendto`. Applied where the INIs are bound ([`BoundInis::bind`]'s
    /// `connected_sends`; [`connect_loopback`] passes this).
    pub connected_sends: bool,
    /// Per-message traces (`ini.trace_dir`, `ini.trace_records`); `None`: off.
    pub trace: Option<TraceConfig>,
    /// Peer INI source addresses ([`IniEndpoint::sends_from`], else the receive address,
    /// as passed to [`BoundInis::start`]) whose INIs are bound to every address of their
    /// host: their datagrams are accepted from any IP address with that port, since the
    /// kernel picks the source address per route (cluster 0 of
    /// a job placed by a launcher). Every other peer is heard only from exactly its
    /// registered address. Empty by default.
    pub any_ip_peers: Vec<SocketAddr>,
    /// Evidence that peer processes are alive, from the cluster's liveness thread
    /// ([`crate::liveness`]): a peer whose INIs stop acknowledging is declared dead only
    /// `window.peer_timeout` after the later of its last ACK progress and its last
    /// liveness answer. `None` (the default): ACK progress alone decides.
    pub liveness: Option<Arc<crate::liveness::Evidence>>,
    /// The INI threads' scheduling policy (`dsm.thread_policy`; see
    /// [`crate::sched::set_policy`]).
    pub thread_policy: ThreadPolicy,
}

/// Where and how much each INI traces (see [`trace`]).
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// Directory for the cluster's trace file, [`trace_file_name`].
    pub dir: std::path::PathBuf,
    /// Records kept per INI (64 bytes each, reserved at start).
    pub records: usize,
}

/// The name of cluster `cluster`'s trace file in the trace directory.
pub fn trace_file_name(cluster: u16) -> String {
    format!("trace-cluster-{cluster}.mgtrace")
}

impl NetConfig {
    /// The INI settings of `cfg` (`[ini]`, `[emulation]`, `[faults]`,
    /// `job.peer_timeout_ms`). The MAC key and epoch are not in the configuration: see
    /// [`NetConfig::window`].
    pub fn from_job(cfg: &JobConfig) -> NetConfig {
        let mut window = WindowConfig {
            mtu: cfg.ini.mtu,
            window: cfg.ini.window,
            ..WindowConfig::default()
        };
        // A standalone ACK once half the window has arrived unacknowledged (at most
        // every 32 frames): the sender's window then slides while the second half is
        // still in flight, instead of draining and waiting a round trip for the ACK of a
        // full window on every one-way stream (the ACK every other segment of TCP,
        // RFC 1122 §4.2.3.2, at window scale).
        window.ack_every = window.ack_every.min((window.window / 2).max(1));
        // Off under an emulated g or G whatever this says (see `BoundInis::start`).
        window.coalesce = cfg.ini.coalesce;
        window.send_timeout = crate::window::Micros(cfg.ini.send_timeout_us);
        window.ack_timeout = crate::window::Micros(cfg.ini.ack_timeout_us);
        window.peer_timeout = crate::window::Micros::from_millis(cfg.job.peer_timeout_ms);
        window.max_message_len = window
            .max_message_len
            .max(crate::DEFAULT_SLOT_SIZE + frame::HEADER);
        NetConfig {
            inis: cfg.ini.per_cluster,
            policy: cfg.ini.policy,
            window,
            queue_capacity: cfg.ini.queue_capacity,
            emulation: cfg.emulation,
            faults: cfg.faults,
            spin: Duration::from_micros(50),
            poll: PollBounds::new(cfg.ini.poll_interval_min, cfg.ini.poll_interval_max),
            inline: cfg.ini.inline,
            offload: cfg.ini.offload,
            connected_sends: cfg.ini.connected_sends,
            trace: (!cfg.ini.trace_dir.is_empty()).then(|| TraceConfig {
                dir: cfg.ini.trace_dir.clone().into(),
                records: cfg.ini.trace_records,
            }),
            any_ip_peers: Vec::new(),
            liveness: None,
            thread_policy: cfg.dsm.thread_policy,
        }
    }
}

/// Errors setting up or running the INI layer.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A socket could not be bound.
    #[error("cannot bind INI {ini} of cluster {site} to {addr}: {source}")]
    Bind {
        /// Cluster.
        site: u16,
        /// INI index.
        ini: usize,
        /// Address tried.
        addr: String,
        /// OS error.
        source: std::io::Error,
    },
    /// A host name did not resolve.
    #[error("cannot resolve host {host:?} of cluster {site}: {reason}")]
    Resolve {
        /// Cluster.
        site: u16,
        /// Host.
        host: String,
        /// Why.
        reason: String,
    },
    /// The configuration is unusable.
    #[error("INI configuration: {0}")]
    Config(String),
    /// An OS call failed while starting.
    #[error("starting INI threads: {0}")]
    Io(#[from] std::io::Error),
    /// A peer failed (dead, unreachable, protocol error).
    #[error("cluster {site} failed: {reason}")]
    PeerFailed {
        /// The failed cluster.
        site: u16,
        /// What happened.
        reason: String,
    },
    /// Shutdown could not deliver everything in time.
    #[error("INIs did not drain within {0:?}: messages still unacknowledged")]
    DrainTimeout(Duration),
}

type FailureHook = Box<dyn Fn(SiteId, &str) + Send + Sync>;

/// A cluster's network layer as seen by its endpoints and INI threads: the INIs, the
/// scheduling policy, and the receive side's shared state.
pub(crate) struct Net {
    pub(crate) site: SiteId,
    pub(crate) own: Arc<MappedSite>,
    pub(crate) pools: Arc<[OnceLock<Arc<Pool>>]>,
    pub(crate) slots: Box<[Arc<IniSlot>]>,
    pub(crate) policy: IniPolicy,
    /// Emulated send overhead *o_s* (paper 001 §3.2), busy-waited by the sending thread
    /// per message before it is handed to an INI.
    pub(crate) send_overhead: Duration,
    /// Emulated receive overhead *o_r* (paper 001 §3.2), busy-waited by the thread that
    /// takes a message delivered by the INIs from its receive queue (see
    /// `RemoteRoute::recv_overhead`).
    pub(crate) recv_overhead: Duration,
    /// Compute threads may run INI passes (see [`NetConfig::inline`]).
    pub(crate) inline: bool,
    /// When receive loops poll the network ([`NetConfig::poll`]).
    pub(crate) poll: PollBounds,
    /// Per site: non-zero once the site is known dead (its messages are refused).
    pub(crate) dead: Box<[AtomicU32]>,
    pub(crate) reseq: Resequencer,
    /// Messages held by the resequencer (a cheap check on the hot path).
    pub(crate) held: AtomicU64,
    /// 0 run, 1 drain then stop, 2 stop now.
    pub(crate) stop: AtomicU32,
    pub(crate) epoch: Instant,
    /// [`NetConfig::liveness`].
    pub(crate) liveness: Option<Arc<crate::liveness::Evidence>>,
    failure: Mutex<Option<(SiteId, String)>>,
    hooks: Mutex<Vec<FailureHook>>,
    /// Threads of this process blocked in `epoll_wait` as network waiters, and the eventfd
    /// that local senders write to wake them (a futex doorbell cannot be polled with
    /// sockets).
    waiters: AtomicU32,
    local_efd: EventFd,
    /// Cap on a network waiter's sleep when same-machine peers (which can only ring the
    /// futex doorbell) may also deliver to it.
    waiter_cap: Duration,
}

impl Net {
    /// Called after a message was put in one of this site's own queues by this process:
    /// wakes a thread waiting on the network, if any (one load when none waits).
    #[inline]
    pub(crate) fn notify_local(&self) {
        if self.waiters.load(Ordering::SeqCst) != 0 {
            let _ = self.local_efd.write(1);
        }
    }

    /// Waits up to `deadline` for `check` to find a message, the calling thread acting as
    /// the network's receiver: it takes every INI (if all are free), then alternates passes
    /// and `epoll_wait` on the INIs' sockets, hand-off eventfds and the local eventfd, so
    /// an arriving datagram wakes the thread that wants it — one wake-up, as for a plain
    /// blocking socket. It lets go of the INIs while it sleeps, so that the threads that
    /// poll meanwhile receive too (measured with `multigrain bench apps`, 2×1 over UDP on
    /// 2 vCPUs: holding them through the sleep made every poller wait for this thread's
    /// wake-up — Water 512 × 50 1.5–2.6 s, EM3D 1.3–2.2 s; letting go 1.1–1.3 s and
    /// 0.39–0.48 s). Returns `Err(())` if an INI is busy when it starts or wakes (its
    /// thread or another waiter holds it: the caller sleeps on its doorbell instead).
    pub(crate) fn wait<T>(
        &self,
        epoll: &Epoll,
        deadline: Instant,
        mut check: impl FnMut() -> Option<T>,
    ) -> Result<Option<T>, ()> {
        if !self.inline {
            return Err(());
        }
        let mut cores = Vec::with_capacity(self.slots.len());
        for s in self.slots.iter() {
            cores.push(s.core.try_lock().ok_or(())?);
        }
        let mut events = [EpollEvent::empty(); 8];
        loop {
            // Draining: this loop sleeps between its passes, so a datagram left in a
            // socket would cost it a round of system calls (an epoll_wait that returns at
            // once), not the next poll's read as in a busy wait.
            for (slot, core) in self.slots.iter().zip(cores.iter_mut()) {
                slot.run_pass(core, self, SocketRead::Drain);
            }
            if let Some(m) = check() {
                return Ok(Some(m));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            // A datagram held for the emulated latency is due, or an emulated gap ends,
            // within the sleep's 1 ms grain: stay awake, so that L or g does not grow by
            // a sleep.
            if cores
                .iter()
                .any(|c| c.next_release().is_some_and(|t| t < now + RELEASE_SPIN))
            {
                std::thread::yield_now();
                continue;
            }
            // Announce the sleep (hand-offs and local senders then write eventfds), re-check,
            // sleep until the first timer, the deadline, or an event.
            for s in self.slots.iter() {
                s.handoff.prepare_sleep();
            }
            self.waiters.fetch_add(1, Ordering::SeqCst);
            let ready = check();
            let mut wait = deadline - now;
            let tnow = self.now();
            for core in cores.iter_mut() {
                if let Some(t) = core.ini.poll_timeout() {
                    wait = wait.min(Duration::from_micros(t.saturating_sub(tnow).as_u64()));
                }
                if let Some(t) = core.next_release() {
                    wait = wait.min(t.saturating_duration_since(now));
                }
                if core.stalled.is_some() {
                    wait = wait.min(Duration::from_micros(core::TIMER_SLACK_US));
                }
            }
            wait = wait.min(self.waiter_cap);
            let slept = ready.is_none() && !wait.is_zero();
            if slept {
                // Leave the INIs to whoever polls meanwhile.
                cores.clear();
                let watch = SleepWatch::new(epoll, self.slots.iter().map(|s| &s.socket_fd));
                let ms = watch.cap(wait).as_micros().div_ceil(1000).clamp(1, 1000) as u16;
                let _ = epoll.wait(&mut events, EpollTimeout::from(ms));
            }
            self.waiters.fetch_sub(1, Ordering::SeqCst);
            let _ = self.local_efd.read();
            for s in self.slots.iter() {
                s.handoff.woke();
            }
            if ready.is_some() {
                return Ok(ready);
            }
            if slept {
                for s in self.slots.iter() {
                    cores.push(s.core.try_lock().ok_or(())?);
                }
            }
        }
    }

    /// An epoll instance watching every INI's hand-off eventfd and the local eventfd,
    /// for [`Net::wait`], which adds the INI sockets for each sleep (module
    /// `sleep_watch`).
    pub(crate) fn waiter_epoll(&self) -> std::io::Result<Epoll> {
        let e = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        for s in self.slots.iter() {
            e.add(&s.handoff.efd, EpollEvent::new(EpollFlags::EPOLLIN, 1))?;
        }
        e.add(&self.local_efd, EpollEvent::new(EpollFlags::EPOLLIN, 2))?;
        Ok(e)
    }

    /// The window clock: µs since the group started.
    pub(crate) fn now(&self) -> Micros {
        Micros(self.epoch.elapsed().as_micros() as u64)
    }

    /// ns since the group started (hand-off timestamps).
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// True if `site` has been declared dead.
    #[inline]
    pub(crate) fn is_dead(&self, site: u16) -> bool {
        self.dead
            .get(usize::from(site))
            .is_some_and(|d| d.load(Ordering::Relaxed) != 0)
    }

    /// Records that `site` failed: its messages are refused from now on, and the failure
    /// hooks run (once per site).
    pub(crate) fn fail(&self, site: u16, reason: String) {
        if let Some(d) = self.dead.get(usize::from(site))
            && d.swap(1, Ordering::AcqRel) != 0
        {
            return;
        }
        tracing::error!(cluster = site, "{reason}");
        {
            let mut f = self.failure.lock();
            if f.is_none() {
                *f = Some((SiteId(site), reason.clone()));
            }
        }
        for h in self.hooks.lock().iter() {
            h(SiteId(site), &reason);
        }
    }

    /// Picks an INI for a message of compute thread `thread_index` (see [`pick`]) and
    /// says whether the choice is mis-scheduled: the chosen INI has work while another
    /// INI of this cluster is idle (paper 002 §5.3).
    #[inline]
    pub(crate) fn choose(&self, thread_index: usize, rr: &Cell<usize>) -> (usize, bool) {
        let k = self.slots.len();
        if k == 1 {
            return (0, false);
        }
        let load = |j: usize| self.slots[j].load();
        let i = pick(self.policy, k, thread_index, rr, load);
        let mis = load(i) > 0 && (0..k).any(|j| j != i && load(j) == 0);
        (i, mis)
    }

    /// Busy-waits the emulated send overhead.
    #[inline]
    pub(crate) fn emulate_send_overhead(&self) {
        if !self.send_overhead.is_zero() {
            spin_for(self.send_overhead);
        }
    }

    /// Hands `msg` to INI `ini` and, if that INI is free and no message of the caller
    /// follows at once (`more` false), sends it right away from the calling thread. A
    /// full hand-off queue hands the message back.
    #[inline]
    pub(crate) fn submit(&self, ini: usize, msg: OutMsg, more: bool) -> Result<(), OutMsg> {
        let slot = &self.slots[ini];
        if !self.inline || more {
            return slot.handoff.push(msg);
        }
        // The pass below takes the message unless another thread runs one (it may
        // have pulled before this push) or the pass's budget ran out first: only then
        // does the INI thread need waking. Waking it for every message cost the sender
        // an eventfd write (a cross-CPU wake-up) and the woken thread a CPU to find its
        // queue empty (Water 512 × 50 on 2×2 over UDP: the compute threads' eventfd
        // writes fell from ≈ 13,900 to ≈ 7,400 a run, the rest mostly waking threads
        // that wait on the network; `bench dsm`'s remote read fault through INIs 54–58
        // → 38.5 µs, 2026-12-04).
        slot.handoff.push_quiet(msg)?;
        if slot.try_pass(self, SocketRead::Skip).is_none() || !slot.handoff.ring.is_empty() {
            slot.handoff.wake_if_sleeping();
        }
        Ok(())
    }

    /// One network poll from a receiving thread (paper 000 §3.4): a pass of every INI that
    /// is free. Returns whether anything arrived or moved.
    pub(crate) fn poll(&self) -> bool {
        if !self.inline {
            return false;
        }
        let mut work = false;
        for slot in self.slots.iter() {
            work |= slot
                .try_pass(self, SocketRead::UntilDelivered)
                .unwrap_or(false);
        }
        work
    }
}

pub(crate) use crate::delay::spin_for;

/// A thread that would sleep while a datagram held for the emulated latency *L* is due,
/// or an emulated gap *g* ends, sooner than this yields instead (`epoll_wait` sleeps in
/// whole milliseconds).
pub(crate) const RELEASE_SPIN: Duration = Duration::from_millis(2);

/// UDP sockets bound for a cluster's INIs, before the peers' addresses are known (their
/// addresses go into the start-up exchange).
#[derive(Debug)]
pub struct BoundInis {
    site: SiteId,
    sockets: Vec<UdpSocket>,
    addrs: Vec<SocketAddr>,
    /// Each INI's send port (module `senders`); empty: INIs send from their receive
    /// sockets.
    send_ports: Vec<senders::SendPort>,
}

/// One INI as its cluster registers it in the start-up exchange: where it receives, and
/// where its datagrams come from. A peer accepts an INI's datagrams only from the latter
/// (issue 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IniEndpoint {
    /// The INI's receive socket; its IP unspecified where the INI is bound to every
    /// address of its host.
    pub addr: SocketAddr,
    /// The send port its connected sending sockets share (`ini.connected_sends`); `None`:
    /// it sends from `addr`.
    pub sends_from: Option<SocketAddr>,
}

impl IniEndpoint {
    /// The address this INI's datagrams come from: its send port, or without one its
    /// receive address.
    pub(crate) fn source(&self) -> SocketAddr {
        self.sends_from.unwrap_or(self.addr)
    }
}

/// Socket buffer size an INI asks for, bytes, in each direction: a full window of
/// jumbo frames to every peer INI without a drop. The default (`net.core.rmem_default`,
/// 208 KiB here) holds less than one window of 32 frames of 8,972 bytes — the kernel
/// counts each datagram's buffer overhead too — so bursts (a barrier's updates, a
/// release batch) lost datagrams on loopback and waited for NAKs and retransmissions.
/// The kernel caps the request at `net.core.rmem_max` / `wmem_max`.
pub const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Asks for [`SOCKET_BUFFER_BYTES`] of send buffer and, with `receive`, of receive
/// buffer (a sending socket that is never read keeps the default); a refusal only costs
/// drops (the window recovers them), so it is logged, not an error.
fn grow_socket_buffers(s: &UdpSocket, receive: bool) {
    use nix::sys::socket::{setsockopt, sockopt};
    let ask = |what: &str, r: nix::Result<()>| {
        if let Err(e) = r {
            tracing::debug!("INI socket: {what} {SOCKET_BUFFER_BYTES} bytes refused: {e}");
        }
    };
    if receive {
        ask(
            "SO_RCVBUF",
            setsockopt(s, sockopt::RcvBuf, &SOCKET_BUFFER_BYTES),
        );
    }
    ask(
        "SO_SNDBUF",
        setsockopt(s, sockopt::SndBuf, &SOCKET_BUFFER_BYTES),
    );
}

impl BoundInis {
    /// Binds `count` UDP sockets for cluster `site` on `host` (its address in the topology),
    /// ports `base_port + k` (`base_port` 0: any free port each); with `connected_sends`
    /// ([`NetConfig::connected_sends`]), also a send port for each INI on the same
    /// address (any free port).
    ///
    /// # Errors
    /// [`NetError::Resolve`] or [`NetError::Bind`] naming the cluster, INI and address.
    pub fn bind(
        site: SiteId,
        host: &str,
        base_port: u16,
        count: usize,
        connected_sends: bool,
    ) -> Result<BoundInis, NetError> {
        let ip = (host, 0)
            .to_socket_addrs()
            .map_err(|e| NetError::Resolve {
                site: site.0,
                host: host.to_owned(),
                reason: e.to_string(),
            })?
            .find(|a| a.is_ipv4())
            .or_else(|| (host, 0).to_socket_addrs().ok().and_then(|mut a| a.next()))
            .ok_or_else(|| NetError::Resolve {
                site: site.0,
                host: host.to_owned(),
                reason: "no address".into(),
            })?
            .ip();
        let mut sockets = Vec::with_capacity(count);
        let mut addrs = Vec::with_capacity(count);
        let mut send_ports = Vec::new();
        for k in 0..count {
            let port = if base_port == 0 {
                0
            } else {
                base_port + k as u16
            };
            let addr = SocketAddr::new(ip, port);
            let s = UdpSocket::bind(addr).map_err(|source| NetError::Bind {
                site: site.0,
                ini: k,
                addr: addr.to_string(),
                source,
            })?;
            s.set_nonblocking(true)?;
            grow_socket_buffers(&s, true);
            addrs.push(s.local_addr()?);
            sockets.push(s);
            if connected_sends {
                let any = SocketAddr::new(ip, 0);
                send_ports.push(
                    senders::SendPort::bind(ip).map_err(|source| NetError::Bind {
                        site: site.0,
                        ini: k,
                        addr: format!("{any} (its send port)"),
                        source,
                    })?,
                );
            }
        }
        Ok(BoundInis {
            site,
            sockets,
            addrs,
            send_ports,
        })
    }

    /// The bound receive addresses, INI 0 first.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Each INI's receive address and send port, INI 0 first (what the other clusters
    /// need: pass them to their [`BoundInis::start`]).
    pub fn endpoints(&self) -> Vec<IniEndpoint> {
        self.addrs
            .iter()
            .enumerate()
            .map(|(k, &addr)| IniEndpoint {
                addr,
                sends_from: self.send_ports.get(k).map(senders::SendPort::addr),
            })
            .collect()
    }

    /// Starts the INI threads and gives `site` a network route to every site `s` with
    /// `remote[s] = Some(its INIs)` ([`BoundInis::endpoints`] of its cluster). Each INI
    /// gets a connection to every remote INI; clusters may have different INI counts
    /// (see `IniCore::conn_for` for which remote INI a message goes to).
    ///
    /// # Errors
    /// [`NetError::Config`] for an INI count outside 1..=255, bad window parameters or
    /// an address registered for two peer INIs; [`NetError::Io`] where a sending socket
    /// cannot be connected to its peer (no route to it).
    pub fn start(
        self,
        site: &Site,
        cfg: &NetConfig,
        remote: &[Option<Vec<IniEndpoint>>],
    ) -> Result<IniGroup, NetError> {
        let k = self.sockets.len();
        for (s, n) in std::iter::once((usize::from(self.site.0), self.addrs.len())).chain(
            remote
                .iter()
                .enumerate()
                .filter_map(|(s, a)| Some((s, a.as_ref()?.len()))),
        ) {
            if n == 0 || n > usize::from(u8::MAX) {
                return Err(NetError::Config(format!(
                    "cluster {s} has {n} INIs; 1..=255 allowed"
                )));
            }
        }
        let inner = site.inner_arc().clone();
        let max_sites = inner.config.max_sites;
        if remote.len() > max_sites {
            return Err(NetError::Config(format!(
                "{} clusters exceed the site's max_sites {max_sites}",
                remote.len()
            )));
        }
        let epoch = Instant::now();
        let mut slots = Vec::with_capacity(k);
        // Paper 001's emulated gap g (and G) is per message: under it, one message per
        // datagram, however the configuration was built.
        let mut window = cfg.window.clone();
        window.coalesce &= cfg.emulation.gap_us == 0.0 && cfg.emulation.per_byte_gap_ns == 0.0;
        let mut send_ports = self.send_ports.into_iter();
        for (i, socket) in self.sockets.into_iter().enumerate() {
            let mut ini =
                crate::window::Ini::new(IniAddr::new(self.site.0, i as u8), window.clone())
                    .map_err(|e| NetError::Config(e.to_string()))?;
            let mut peer_addrs = Vec::new();
            let mut sources = HashMap::new();
            let mut port_sources = HashMap::new();
            let mut conns = vec![Vec::new(); remote.len()];
            for (s, addrs) in remote.iter().enumerate() {
                let Some(addrs) = addrs else { continue };
                for (j, e) in addrs.iter().enumerate() {
                    let c = ini
                        .add_peer(IniAddr::new(s as u16, j as u8))
                        .map_err(|e| NetError::Config(e.to_string()))?;
                    peer_addrs.push(e.addr);
                    let a = e.source();
                    if let Some(other) = sources.insert(a, c) {
                        return Err(NetError::Config(format!(
                            "INI address {a} is registered for two peer INIs (connections {} \
                             and {})",
                            other.index(),
                            c.index()
                        )));
                    }
                    if cfg.any_ip_peers.contains(&a) {
                        port_sources.insert(a.port(), c);
                    }
                    conns[s].push(c);
                }
            }
            let faults =
                faults::FaultShim::new(&cfg.faults, (u64::from(self.site.0) << 8) | i as u64);
            // Datagrams leave and arrive one by one where their own timing is emulated
            // (paper 001 §3.2) or the fault shim rearranges them.
            let e = &cfg.emulation;
            let offload = cfg.offload
                && e.gap_us == 0.0
                && e.per_byte_gap_ns == 0.0
                && e.latency_us == 0.0
                && !faults.is_active();
            let offload = offload::Offload::new(&socket, offload);
            let senders = match send_ports.next() {
                Some(port) => port.connect(peer_addrs)?,
                None => senders::Senders::shared(socket.try_clone()?, peer_addrs),
            };
            let core = IniCore {
                index: i as u8,
                local_inis: k as u8,
                ini,
                socket,
                senders,
                sources,
                port_sources,
                conns,
                next_remote: vec![0; remote.len()],
                faults,
                gap: Duration::from_secs_f64(cfg.emulation.gap_us / 1e6),
                per_byte_ns: cfg.emulation.per_byte_gap_ns,
                latency: Duration::from_secs_f64(cfg.emulation.latency_us / 1e6),
                stalled: None,
                delayed: VecDeque::new(),
                next_inject: epoch,
                gap_backlog: false,
                buf: vec![0; 65_536],
                offload,
                c: Counters::default(),
                started: epoch,
                trace: None,
                rx_ns: 0,
            };
            let mut core = core;
            if let Some(t) = &cfg.trace {
                core.trace = Some(Box::new(tracer::IniTracer::new(
                    self.site.0,
                    i as u16,
                    core.ini.num_connections(),
                    t.records,
                    0,
                )));
            }
            let socket_fd = core.socket.try_clone()?;
            slots.push(Arc::new(IniSlot {
                socket_fd,
                core: Mutex::new(core),
                handoff: Handoff::new(cfg.queue_capacity)?,
                backlog: AtomicU64::new(0),
                busy: AtomicU32::new(0),
                sleep_until_us: AtomicU64::new(0),
                report: Mutex::new(IniReport {
                    site: self.site.0,
                    ini: i as u8,
                    ..IniReport::default()
                }),
            }));
        }
        let net = Arc::new(Net {
            site: self.site,
            own: inner.own.clone(),
            pools: inner.pools.clone(),
            slots: slots.into(),
            policy: cfg.policy,
            send_overhead: Duration::from_secs_f64(cfg.emulation.send_overhead_us / 1e6),
            recv_overhead: Duration::from_secs_f64(cfg.emulation.recv_overhead_us / 1e6),
            inline: cfg.inline,
            poll: cfg.poll,
            dead: (0..max_sites).map(|_| AtomicU32::new(0)).collect(),
            reseq: Resequencer::default(),
            held: AtomicU64::new(0),
            stop: AtomicU32::new(0),
            epoch,
            liveness: cfg.liveness.clone(),
            failure: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
            waiters: AtomicU32::new(0),
            local_efd: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(std::io::Error::from)?,
            waiter_cap: if (0..remote.len())
                .any(|s| site.substrate(SiteId(s as u16)) == Some(crate::site::Substrate::Shm))
            {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(100)
            },
        });
        let mut threads = Vec::with_capacity(k);
        for (i, slot) in net.slots.iter().enumerate() {
            let (n, s, spin, policy) = (net.clone(), slot.clone(), cfg.spin, cfg.thread_policy);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("mg-ini-{i}"))
                    .spawn(move || {
                        crate::sched::set_policy(policy);
                        thread::run(n, s, i, spin)
                    })?,
            );
        }
        for (s, addrs) in remote.iter().enumerate() {
            if addrs.is_some() {
                site.add_network_route(SiteId(s as u16), net.clone())
                    .map_err(|e| NetError::Config(e.to_string()))?;
            }
        }
        let _ = inner.net.set(net.clone());
        Ok(IniGroup {
            net,
            threads,
            trace_dir: cfg.trace.as_ref().map(|t| t.dir.clone()),
        })
    }
}

/// Joins `sites` (site `i` must have id `i`) in this process through their INIs over
/// UDP on 127.0.0.1: `inis` INI threads each, every site reaching every other one over
/// the network, authenticated under a fresh random secret and epoch (those of `cfg` are
/// replaced). For tests, benchmarks and single-machine tools; real jobs use
/// [`crate::job::Job`]. Returns each site's INI group (keep them alive with the sites).
///
/// # Errors
/// [`NetError`] naming the site whose INIs could not be bound or started;
/// [`NetError::Io`] when the OS gives no random bytes for the secret.
pub fn connect_loopback(
    sites: &[Site],
    cfg: &NetConfig,
    inis: usize,
) -> Result<Vec<IniGroup>, NetError> {
    let mut cfg = cfg.clone();
    let secret = crate::control::Secret::generate()?;
    cfg.window.mac_key = crate::window::wire::MacKey::new(*secret.as_bytes());
    cfg.window.epoch = crate::control::Secret::random_epoch()?;
    let cfg = &cfg;
    let bound: Vec<BoundInis> = sites
        .iter()
        .map(|s| BoundInis::bind(s.id(), "127.0.0.1", 0, inis, cfg.connected_sends))
        .collect::<Result<_, _>>()?;
    let addrs: Vec<Vec<IniEndpoint>> = bound.iter().map(BoundInis::endpoints).collect();
    bound
        .into_iter()
        .zip(sites)
        .enumerate()
        .map(|(i, (b, site))| {
            let remote: Vec<Option<Vec<IniEndpoint>>> = (0..sites.len())
                .map(|j| (j != i).then(|| addrs[j].clone()))
                .collect();
            b.start(site, cfg, &remote)
        })
        .collect()
}

/// A cluster's running INI threads.
pub struct IniGroup {
    net: Arc<Net>,
    threads: Vec<JoinHandle<()>>,
    /// Where [`IniGroup::shutdown`] writes the cluster's trace file, when tracing.
    trace_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for IniGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IniGroup")
            .field("site", &self.net.site)
            .field("inis", &self.net.slots.len())
            .finish()
    }
}

impl IniGroup {
    /// The statistics of each INI, current: each INI's counters are copied under its
    /// core's lock, waiting for a pass in progress to end (microseconds), not taken
    /// from the copy the INI thread publishes every 100 ms (a job shorter than that
    /// would report zeros). Exact after [`IniGroup::shutdown`]. Not to be called from
    /// a thread running an INI pass (it would wait for itself); the statistics are
    /// read after the computation, from the main thread.
    pub fn reports(&self) -> Vec<IniReport> {
        self.net
            .slots
            .iter()
            .map(|s| {
                s.core.lock().publish(&s.handoff, &mut s.report.lock());
                s.report.lock().clone()
            })
            .collect()
    }

    /// The first cluster this INI group found failed (unresponsive, undeliverable), if any.
    pub fn failure(&self) -> Option<(SiteId, String)> {
        self.net.failure.lock().clone()
    }

    /// Runs `f` (on whichever thread detects it) when a cluster is found failed, once per
    /// cluster.
    pub fn on_failure(&self, f: impl Fn(SiteId, &str) + Send + Sync + 'static) {
        self.net.hooks.lock().push(Box::new(f));
    }

    /// Waits until every INI has sent, and had acknowledged, everything queued so far
    /// (without stopping them: peers may still need to be acknowledged).
    ///
    /// # Errors
    /// [`NetError::DrainTimeout`] if messages are still unacknowledged after `timeout`.
    pub fn drain(&self, timeout: Duration) -> Result<(), NetError> {
        let deadline = Instant::now() + timeout;
        loop {
            let idle = self.net.slots.iter().all(|s| {
                s.handoff.kick();
                s.core.lock().idle(&s.handoff)
            }) && self.net.held.load(Ordering::Relaxed) == 0;
            if idle {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NetError::DrainTimeout(timeout));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops the INIs after they have delivered and had acknowledged everything queued
    /// (so no message is lost at the end of a job), or after `timeout`. Returns the final
    /// statistics.
    ///
    /// # Errors
    /// [`NetError::DrainTimeout`] if messages were still unacknowledged at the timeout (the
    /// threads are stopped anyway).
    pub fn shutdown(mut self, timeout: Duration) -> Result<Vec<IniReport>, NetError> {
        self.net.stop.store(1, Ordering::Release);
        let deadline = Instant::now() + timeout;
        let mut drained = true;
        while self.threads.iter().any(|t| !t.is_finished()) {
            for s in self.net.slots.iter() {
                s.handoff.kick();
            }
            if Instant::now() >= deadline {
                drained = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.join();
        let reports = self
            .net
            .slots
            .iter()
            .map(|s| s.report.lock().clone())
            .collect();
        if let Some(dir) = self.trace_dir.clone()
            && let Err(e) = self.write_trace(&dir)
        {
            tracing::error!(
                cluster = self.net.site.0,
                "cannot write the INI trace into {}: {e}",
                dir.display()
            );
        }
        if drained {
            Ok(reports)
        } else {
            Err(NetError::DrainTimeout(timeout))
        }
    }

    /// The INIs' traces so far, closed now (`None` when the job does not trace).
    pub fn trace(&self) -> Option<trace::ClusterTrace> {
        self.trace_dir.as_ref()?;
        let now = self.net.now_ns();
        let cores: Vec<_> = self.net.slots.iter().map(|s| s.core.lock()).collect();
        let mut bufs = Vec::with_capacity(cores.len());
        for mut c in cores {
            let t = c.trace.as_mut()?;
            bufs.push(trace::ClusterTrace::from_buffers(
                self.net.site.0,
                [t.finish(now)],
            ));
        }
        Some(trace::ClusterTrace {
            cluster: self.net.site.0,
            inis: bufs.into_iter().flat_map(|b| b.inis).collect(),
        })
    }

    /// Writes this cluster's trace file, [`trace_file_name`], into `dir` (created if
    /// missing; written under a temporary name, then renamed).
    fn write_trace(&self, dir: &std::path::Path) -> Result<(), trace::TraceError> {
        let Some(t) = self.trace() else {
            return Ok(());
        };
        std::fs::create_dir_all(dir)?;
        let path = dir.join(trace_file_name(self.net.site.0));
        let tmp = dir.join(format!(".{}.tmp", trace_file_name(self.net.site.0)));
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        t.write(&mut w)?;
        std::io::Write::flush(&mut w)?;
        drop(w);
        std::fs::rename(&tmp, &path)?;
        tracing::debug!(
            cluster = self.net.site.0,
            "INI trace written to {}",
            path.display()
        );
        Ok(())
    }

    fn join(&mut self) {
        self.net.stop.store(2, Ordering::Release);
        for s in self.net.slots.iter() {
            s.handoff.kick();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for IniGroup {
    fn drop(&mut self) {
        self.join();
    }
}
