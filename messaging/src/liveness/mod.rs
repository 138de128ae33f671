//! The liveness thread: evidence that a peer cluster's *process* is alive, which its
//! compute threads cannot starve.
//!
//! A cluster declares a peer dead when the peer's INIs stop acknowledging for
//! `job.peer_timeout_ms` ([`crate::window::Ini`]) or its control connection is silent
//! that long ([`crate::control`]). Both are served by threads at normal priority: a
//! cluster whose many compute threads compute without pause for longer than the timeout
//! (hundreds of threads per core) can keep its INI and heartbeat threads off the CPU,
//! and a live cluster is declared dead.
//!
//! Each cluster process therefore runs one small thread, `mg-liveness`, at real-time
//! priority (`SCHED_FIFO` 1, [`crate::sched::make_realtime`]) where the process may — as
//! `dsm.protocol_priority = "auto"` does for the protocol thread: without the permission
//! it runs at normal priority and says so in the log (`info`). Every period
//! (`peer_timeout / 8`, 1–100 ms) it sends each peer cluster a *probe* and answers the
//! probes it receives. An answer to the probe sent at *t* proves the peer's process ran
//! after *t*: that is the peer's evidence ([`Evidence::heard`]). The INIs consult it
//! before declaring a peer unresponsive ([`crate::window::Ini::note_alive`]) and the
//! control plane before declaring a silent connection dead
//! ([`crate::control::Control::consult_liveness`]): a peer is reported
//! `peer_timeout` after the later of its last sign of progress and its last answer. A
//! stopped (SIGSTOP) or killed process answers nothing, so it is still reported at most
//! `peer_timeout` after it was last heard; a live one whose protocol threads are starved
//! is not. (A live process whose protocol hangs is the progress watchdog's business,
//! `job.progress_timeout_ms`.)
//!
//! Why a separate UDP socket rather than the existing channels: the INI sockets are
//! drained by whichever thread runs an INI pass — precisely the threads that starve — and
//! the control plane is a star through cluster 0, so a member has no connection to
//! another member to probe. The liveness socket is bound next to the INIs before
//! registration, its address travels in the same registration payload as the INI
//! addresses, and a full mesh of tiny datagrams (40 bytes, [`wire`]) gives every cluster
//! evidence about every other, whatever the substrate between them. Datagrams are
//! authenticated with the job's secret (a keyed BLAKE3 MAC) and the run's epoch
//! and accepted only from the registered address of the cluster they claim; an answer
//! counts only if it echoes a probe number sent in the last 64 periods, so a replayed
//! answer proves nothing newer than the original. Every refusal is counted
//! ([`LivenessStats`]) and reported with the INI statistics.

pub mod wire;

use crate::sync::{AtomicU32, Ordering};
use crate::window::wire::MacKey;
use parking_lot::Mutex;
use serde::Serialize;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wire::{Datagram, Kind, Refused};

/// Probe numbers whose send times are remembered (answers to older ones are stale).
const REMEMBERED: usize = 64;

/// The probe period for a peer timeout: an eighth of it, 1 to 100 ms.
pub fn period_for(peer_timeout: Duration) -> Duration {
    (peer_timeout / 8).clamp(Duration::from_millis(1), Duration::from_millis(100))
}

/// Per peer cluster, when it was last proven alive (shared by the liveness thread, the
/// INIs and the control plane).
#[derive(Debug)]
pub struct Evidence {
    heard: Mutex<Vec<Option<Instant>>>,
}

impl Evidence {
    /// No evidence yet about any of `clusters` clusters.
    pub fn new(clusters: usize) -> Evidence {
        Evidence {
            heard: Mutex::new(vec![None; clusters]),
        }
    }

    /// The latest instant at which cluster `cluster`'s process is known to have been
    /// alive (the send time of the latest probe it answered); `None` before its first
    /// answer.
    pub fn heard(&self, cluster: usize) -> Option<Instant> {
        self.heard.lock().get(cluster).copied().flatten()
    }

    /// Records that `cluster` was alive at `at` (later evidence only).
    pub fn note(&self, cluster: usize, at: Instant) {
        if let Some(h) = self.heard.lock().get_mut(cluster) {
            *h = Some(h.map_or(at, |h| h.max(at)));
        }
    }
}

/// What a liveness thread did, and what it refused (with the INI statistics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LivenessStats {
    /// The thread runs `SCHED_FIFO` (false: normal priority, not permitted).
    pub realtime: bool,
    /// Probes sent (one per peer per period).
    pub probes_sent: u64,
    /// Probes of peers answered.
    pub probes_answered: u64,
    /// Answers to this cluster's probes accepted as evidence.
    pub answers: u64,
    /// Refused: the MAC did not verify (forged or corrupted).
    pub rejected_mac: u64,
    /// Refused: another run's epoch (replayed from an earlier run).
    pub rejected_epoch: u64,
    /// Refused: not from the registered liveness address of the cluster it claims.
    pub rejected_source: u64,
    /// Refused: malformed, misdirected, or an answer to no recent probe (stale replay).
    pub rejected_bad: u64,
}

/// A peer's liveness socket as registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Where its probes go, and the only source its datagrams are accepted from.
    pub addr: SocketAddr,
    /// It is bound to every address of its host: accept any source IP with its port
    /// (as `NetConfig::any_ip_peers` for INIs).
    pub any_ip: bool,
}

/// The authentication and timing a liveness thread uses.
#[derive(Clone, Debug)]
pub struct LivenessConfig {
    /// This cluster.
    pub me: u16,
    /// The job's secret as a MAC key (as the INIs').
    pub key: MacKey,
    /// The run's epoch (as the INIs').
    pub epoch: u64,
    /// Probe period ([`period_for`]).
    pub period: Duration,
    /// Try `SCHED_FIFO` (false: stay at normal priority).
    pub realtime: bool,
}

/// A bound liveness socket, before the peers are known.
#[derive(Debug)]
pub struct LivenessSocket {
    socket: UdpSocket,
    addr: SocketAddr,
}

impl LivenessSocket {
    /// Binds a UDP socket on `ip`, any port.
    ///
    /// # Errors
    /// The OS error.
    pub fn bind(ip: IpAddr) -> io::Result<LivenessSocket> {
        let socket = UdpSocket::bind(SocketAddr::new(ip, 0))?;
        let addr = socket.local_addr()?;
        Ok(LivenessSocket { socket, addr })
    }

    /// The bound address (what the peers need).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts the thread, probing `peers[c]` for every cluster `c` that has `Some`.
    ///
    /// # Errors
    /// The OS error setting the socket up or spawning the thread.
    pub fn start(self, cfg: LivenessConfig, peers: Vec<Option<Peer>>) -> io::Result<Liveness> {
        let shared = Arc::new(Shared {
            evidence: Arc::new(Evidence::new(peers.len())),
            stats: Mutex::new(LivenessStats::default()),
            stop: AtomicU32::new(0),
        });
        let s = Arc::clone(&shared);
        let waker = self.socket.try_clone()?;
        let socket = self.socket;
        let thread = std::thread::Builder::new()
            .name("mg-liveness".into())
            .spawn(move || Prober::new(cfg, socket, peers, s).run())?;
        Ok(Liveness {
            shared,
            waker,
            addr: self.addr,
            thread: Some(thread),
        })
    }
}

struct Shared {
    evidence: Arc<Evidence>,
    stats: Mutex<LivenessStats>,
    /// Non-zero: the thread ends.
    stop: AtomicU32,
}

/// A running liveness thread (stopped, woken and joined on drop).
pub struct Liveness {
    shared: Arc<Shared>,
    /// The thread's socket, to wake it at once when it is to stop.
    waker: UdpSocket,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Liveness {
    /// The evidence it gathers.
    pub fn evidence(&self) -> Arc<Evidence> {
        Arc::clone(&self.shared.evidence)
    }

    /// Its counters so far.
    pub fn stats(&self) -> LivenessStats {
        *self.shared.stats.lock()
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.shared.stop.store(1, Ordering::Release);
        // An empty datagram to itself ends its wait now rather than at the period's end.
        let _ = self.waker.send_to(&[], self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's state.
struct Prober {
    cfg: LivenessConfig,
    socket: UdpSocket,
    peers: Vec<Option<Peer>>,
    shared: Arc<Shared>,
    /// The last probe number sent.
    seq: u64,
    /// Send time of probe `n` at `n % REMEMBERED`.
    sent: [(u64, Option<Instant>); REMEMBERED],
}

impl Prober {
    fn new(
        cfg: LivenessConfig,
        socket: UdpSocket,
        peers: Vec<Option<Peer>>,
        shared: Arc<Shared>,
    ) -> Prober {
        Prober {
            cfg,
            socket,
            peers,
            shared,
            seq: 0,
            sent: [(0, None); REMEMBERED],
        }
    }

    fn run(mut self) {
        let me = self.cfg.me;
        if self.cfg.realtime {
            match crate::sched::make_realtime() {
                Ok(()) => {
                    self.shared.stats.lock().realtime = true;
                    tracing::debug!("cluster {me}: the liveness thread runs real-time");
                }
                Err(e) => tracing::info!(
                    "cluster {me}: the liveness thread runs at normal priority ({e}: \
                     real-time priority needs root, CAP_SYS_NICE or RLIMIT_RTPRIO ≥ 1); \
                     compute threads that never pause may delay its answers"
                ),
            }
        }
        let mut buf = [0u8; 64];
        let mut next = Instant::now();
        while self.shared.stop.load(Ordering::Acquire) == 0 {
            let now = Instant::now();
            if now >= next {
                self.probe(now);
                next += self.cfg.period;
                if next <= now {
                    next = now + self.cfg.period;
                }
            }
            let wait = next.saturating_duration_since(Instant::now());
            if self
                .socket
                .set_read_timeout(Some(wait.max(Duration::from_micros(100))))
                .is_err()
            {
                std::thread::sleep(self.cfg.period);
                continue;
            }
            match self.socket.recv_from(&mut buf) {
                Ok(_) if self.shared.stop.load(Ordering::Acquire) != 0 => break,
                Ok((n, src)) => self.receive(&buf[..n], src),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                // ICMP errors of a peer that is gone, and the like: it answers nothing.
                Err(_) => {}
            }
        }
    }

    /// Sends probe number `seq + 1` to every peer.
    fn probe(&mut self, now: Instant) {
        self.seq += 1;
        self.sent[(self.seq % REMEMBERED as u64) as usize] = (self.seq, Some(now));
        let mut sent = 0;
        for (c, p) in self.peers.iter().enumerate() {
            let Some(p) = p else { continue };
            let d = Datagram {
                kind: Kind::Probe,
                from: self.cfg.me,
                to: c as u16,
                seq: self.seq,
            };
            if self
                .socket
                .send_to(&d.encode(&self.cfg.key, self.cfg.epoch), p.addr)
                .is_ok()
            {
                sent += 1;
            }
        }
        self.shared.stats.lock().probes_sent += sent;
    }

    fn receive(&mut self, bytes: &[u8], src: SocketAddr) {
        let d = match Datagram::decode(bytes, &self.cfg.key, self.cfg.epoch, self.cfg.me) {
            Ok(d) => d,
            Err(r) => {
                let mut s = self.shared.stats.lock();
                match r {
                    Refused::Malformed => s.rejected_bad += 1,
                    Refused::WrongEpoch(_) => s.rejected_epoch += 1,
                    Refused::BadMac => s.rejected_mac += 1,
                }
                return;
            }
        };
        let from = usize::from(d.from);
        let registered = self
            .peers
            .get(from)
            .copied()
            .flatten()
            .filter(|p| p.addr == src || (p.any_ip && p.addr.port() == src.port()));
        let Some(peer) = registered else {
            self.shared.stats.lock().rejected_source += 1;
            return;
        };
        match d.kind {
            Kind::Probe => {
                let a = Datagram {
                    kind: Kind::Answer,
                    from: self.cfg.me,
                    to: d.from,
                    seq: d.seq,
                };
                let ok = self
                    .socket
                    .send_to(&a.encode(&self.cfg.key, self.cfg.epoch), peer.addr)
                    .is_ok();
                self.shared.stats.lock().probes_answered += u64::from(ok);
            }
            Kind::Answer => match self.sent[(d.seq % REMEMBERED as u64) as usize] {
                (n, Some(at)) if n == d.seq && d.seq != 0 => {
                    self.shared.evidence.note(from, at);
                    self.shared.stats.lock().answers += 1;
                }
                _ => self.shared.stats.lock().rejected_bad += 1,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn cfg(me: u16, key: [u8; 32]) -> LivenessConfig {
        LivenessConfig {
            me,
            key: MacKey::new(key),
            epoch: 5,
            period: Duration::from_millis(5),
            realtime: false,
        }
    }

    fn peer(addr: SocketAddr) -> Option<Peer> {
        Some(Peer {
            addr,
            any_ip: false,
        })
    }

    /// Two threads hear each other; a forger (another key, another epoch, an
    /// unregistered address, a replayed answer) is refused and counted.
    #[test]
    fn peers_answer_and_forgeries_are_counted() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (a, b) = (
            LivenessSocket::bind(lo).unwrap(),
            LivenessSocket::bind(lo).unwrap(),
        );
        let (aa, ba) = (a.addr(), b.addr());
        let forger = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let a = a.start(cfg(0, [1; 32]), vec![None, peer(ba)]).unwrap();
        let b = b.start(cfg(1, [1; 32]), vec![peer(aa), None]).unwrap();
        let t0 = Instant::now();
        while a.evidence().heard(1).is_none() || b.evidence().heard(0).is_none() {
            assert!(t0.elapsed() < Duration::from_secs(10), "no answers");
            std::thread::sleep(Duration::from_millis(2));
        }
        let probe = |key, epoch, seq| {
            Datagram {
                kind: Kind::Answer,
                from: 1,
                to: 0,
                seq,
            }
            .encode(&MacKey::new(key), epoch)
        };
        forger.send_to(&probe([2; 32], 5, 1), aa).unwrap();
        forger.send_to(&probe([1; 32], 4, 1), aa).unwrap();
        forger.send_to(&probe([1; 32], 5, 1), aa).unwrap();
        forger.send_to(b"junk", aa).unwrap();
        let want = |s: LivenessStats| {
            s.rejected_mac == 1
                && s.rejected_epoch == 1
                && s.rejected_source == 1
                && s.rejected_bad == 1
        };
        while !want(a.stats()) {
            assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", a.stats());
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(a.stats().answers > 0 && b.stats().probes_answered > 0);
        // A stopped peer answers nothing: its evidence ages.
        drop(b);
        let last = a.evidence().heard(1).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(a.evidence().heard(1).unwrap() <= last + Duration::from_millis(10));
    }
}
