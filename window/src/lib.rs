//! Sans-I/O reliable transport core of the inter-cluster protocol threads (INIs).
//!
//! This is the sliding-window protocol of the thesis (paper 002, chapter 3) as pure
//! state machines: the caller owns the UDP socket and the clock, hands received
//! datagrams and the current time in, and takes datagrams to send, the next deadline and
//! events out. Nothing here blocks, spawns, reads a clock or touches a socket.
//!
//! | thesis rule | where |
//! |---|---|
//! | protocol stack, FIFO with window-full bypass (§3.1) | [`Ini::poll_transmit`] |
//! | sequence numbers, send/receive windows, piggy-backed ACK (§3.2.1) | [`Ini`], [`wire`] |
//! | fixed SEND and ACK timeouts, NAK on out-of-order arrival (§3.2.1) | [`WindowConfig`] |
//! | software timer lists, one per timer kind (§3.2.2) | [`timers`] |
//! | selective ACK on standalone ACKs (ours: keeps a SEND timeout behind one lost frame from resending the window) | [`wire`], [`Ini`] |
//! | checksum over each datagram (ours: AES-256-GCM under a per-run key and a per-run epoch instead, so forged and replayed datagrams are dropped and payloads are encrypted), fragmentation above the MTU (§3.1, §4.4.1) | [`wire`] |
//! | several new frames in one BATCH datagram (ours: most of a datagram's cost is per datagram; each frame still acknowledged and retransmitted alone) | [`WindowConfig::coalesce`], [`wire`] |
//! | statistics (§4.4.2) | [`stats`] |
//!
//! Time is [`Micros`]: microseconds on a caller-chosen monotonic clock. Sizes are
//! bytes; window sizes are frames (one frame per datagram, or several in a BATCH).
//!
//! A deterministic network simulator for tests and benchmarks lives in [`sim`].

#![forbid(unsafe_code)]

mod connection;
mod ini;
pub mod sim;
pub mod stats;
pub mod timers;
pub mod wire;

pub use ini::{AddPeerError, EnqueueError, Event, Ini, Rejected, Transmit};
pub use stats::{ConnStats, IniStats};

use serde::Serialize;
use std::fmt;
use std::ops::Add;
use thiserror::Error;

/// A point in time or a duration, in microseconds (µs).
///
/// The caller's clock must be monotonic (thesis §3.2.2 keeps timer deadlines relative
/// to one clock per INI); the origin is arbitrary. Addition saturates, so a deadline
/// never wraps around.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Micros(pub u64);

impl Micros {
    /// Time zero, or a zero-length duration.
    pub const ZERO: Micros = Micros(0);

    /// `ms` milliseconds as microseconds (saturating).
    pub const fn from_millis(ms: u64) -> Micros {
        Micros(ms.saturating_mul(1_000))
    }

    /// The raw number of microseconds.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// `self - earlier`, or zero when `earlier` is later than `self`.
    pub const fn saturating_sub(self, earlier: Micros) -> Micros {
        Micros(self.0.saturating_sub(earlier.0))
    }
}

impl Add for Micros {
    type Output = Micros;

    fn add(self, rhs: Micros) -> Micros {
        Micros(self.0.saturating_add(rhs.0))
    }
}

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} µs", self.0)
    }
}

/// The address of one INI thread: its site (cluster process index in the topology)
/// and its index among that site's INIs (thesis §3.2: every INI has a connection to
/// every INI of every other cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct IniAddr {
    /// Site (cluster process) index, as in the topology.
    pub site: u16,
    /// INI index within the site.
    pub ini: u8,
}

impl IniAddr {
    /// The INI `ini` of site `site`.
    pub const fn new(site: u16, ini: u8) -> IniAddr {
        IniAddr { site, ini }
    }

    /// A dense 24-bit key used to look connections up.
    pub(crate) const fn key(self) -> u32 {
        ((self.site as u32) << 8) | self.ini as u32
    }
}

impl fmt::Display for IniAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "site {} INI {}", self.site, self.ini)
    }
}

/// A local handle to one connection of an [`Ini`] (one per remote INI, thesis §3.2:
/// connections are statically allocated at start-up). Valid only for the [`Ini`] that
/// returned it from [`Ini::add_peer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ConnHandle(pub(crate) u32);

impl ConnHandle {
    /// The connection's index in its [`Ini`], in [`Ini::add_peer`] order from 0.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// Parameters of the sliding-window protocol, shared by every connection of an INI.
///
/// Both ends of a connection must use the same values (they come from the job's cluster
/// config). Defaults follow the thesis where it gives a value and a LAN otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WindowConfig {
    /// The run's epoch, carried by every datagram: random per run, agreed at
    /// registration, so that datagrams of an earlier run (or another job sharing the
    /// ports) are rejected and counted. Default 0 (tests and simulations).
    pub epoch: u64,
    /// The job's secret: every datagram is sealed under a key derived from it and the
    /// epoch (AES-256-GCM, [`wire::DatagramKey`]); datagrams that fail the tag are
    /// rejected and counted. Default all zeros (tests and simulations only). Never
    /// serialized.
    #[serde(skip)]
    pub mac_key: wire::MacKey,
    /// Largest datagram, in bytes, header and checksum included (the UDP payload size).
    /// Messages are fragmented into frames of at most `mtu - wire::OVERHEAD` payload
    /// bytes (thesis §3.1 leaves fragmentation to IP; we fragment ourselves so that a
    /// lost fragment costs one frame). Range [`wire::MIN_MTU`]..=[`wire::MAX_MTU`];
    /// default 1472 (Ethernet MTU 1500 less IPv4 and UDP headers).
    pub mtu: usize,
    /// Send and receive window, in frames (thesis §3.2.1; §4.4.1 uses 16). At most this
    /// many frames per connection are unacknowledged. Range 1..=[`MAX_WINDOW`]; default 64.
    pub window: u32,
    /// SEND timeout in µs: an unacknowledged frame is retransmitted this long after its
    /// last transmission (thesis §3.2.1: "several times longer than the average RTT", no
    /// runtime adjustment). With [`adaptive_timeout`](Self::adaptive_timeout) it is the
    /// least and the initial retransmission timeout of each connection. Default 20 000 µs.
    pub send_timeout: Micros,
    /// Fixed ACK timeout in µs: a received frame is acknowledged by a standalone ACK at
    /// most this long after arrival when no reverse DATA carries the ACK (thesis §3.2.1:
    /// "relatively smaller" than the SEND timeout). Must be below `send_timeout`.
    /// Default 1 000 µs.
    pub ack_timeout: Micros,
    /// Send a standalone ACK at once after this many frames were received without one
    /// (ours, not the thesis': keeps a one-way stream from stalling a full window for an
    /// ACK timeout). Range 1..=`window`; default 32.
    pub ack_every: u32,
    /// Send a NAK for each gap seen in the received sequence numbers (thesis §3.2.1:
    /// "optionally send out NAK messages"). Default true.
    pub nak: bool,
    /// Liveness: if frames stay unacknowledged with no ACK progress for this long, the
    /// connection reports [`Event::PeerUnresponsive`] and stops sending. At least
    /// `send_timeout`. Default 5 s.
    pub peer_timeout: Micros,
    /// Liveness: a frame whose SEND timer expires more than this many times makes the
    /// peer unresponsive. `None` (default): only `peer_timeout` applies.
    pub max_retransmits: Option<u32>,
    /// Messages that may wait per connection before [`Ini::enqueue`] answers
    /// [`EnqueueError::Full`]. At least 1; default 4096.
    pub send_queue_capacity: usize,
    /// Largest message, in bytes, accepted by [`Ini::enqueue`] and reassembled on
    /// receipt. At least 1 MiB and at most what 65 535 fragments carry at this `mtu`;
    /// default 16 MiB.
    pub max_message_len: usize,
    /// First sequence number of every connection in both directions (tests set it near
    /// `u32::MAX` to exercise wrap-around). Default 0.
    pub initial_seq: u32,
    /// Pack new frames that fit together into one BATCH datagram (see [`wire`]): two
    /// 4 KiB pages per 8972-byte datagram, or many small messages per datagram, at one
    /// datagram's cost. Frames are still acknowledged and retransmitted one by one.
    /// `false`: one frame per datagram (the thesis' protocol, §3.2.1). Default true.
    pub coalesce: bool,
    /// Adapt each connection's retransmission timeout (RTO) to the round trips it
    /// measures (ours; RFC 6298 §2–5): RTO = smoothed RTT + 4 × the RTT's mean deviation,
    /// sampled only from frames acknowledged after one transmission (Karn's rule), never
    /// below `send_timeout`; a SEND timer expiry doubles it, up to [`MAX_RTO_FACTOR`] ×
    /// `send_timeout` or `peer_timeout` / 16, whichever is less (so that a frame is still
    /// resent within a sixteenth of the peer timeout after an outage ends), until the
    /// next sample. The thesis fixes the timeout (§3.2.1); on a
    /// loaded host whose round trip exceeds it, every frame of a full window times out
    /// and is resent each `send_timeout`, the resends crowd out the datagrams that would
    /// acknowledge them, and throughput collapses. `false`: the thesis' fixed timeout.
    /// Default true.
    pub adaptive_timeout: bool,
}

/// Largest adaptive retransmission timeout, as a multiple of
/// [`WindowConfig::send_timeout`] (RFC 6298 §2.5 allows a maximum; 64 × the 2 ms of
/// multigrain's INIs is 128 ms, well inside their peer timeout of seconds).
pub const MAX_RTO_FACTOR: u64 = 64;

/// Largest window, in frames. Selective repeat needs the window to be at most half the
/// sequence space (2^31); we also bound the per-connection receive buffer.
pub const MAX_WINDOW: u32 = 1 << 15;

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            epoch: 0,
            mac_key: wire::MacKey::default(),
            mtu: 1472,
            window: 64,
            send_timeout: Micros(20_000),
            ack_timeout: Micros(1_000),
            ack_every: 32,
            nak: true,
            peer_timeout: Micros::from_millis(5_000),
            max_retransmits: None,
            send_queue_capacity: 4096,
            max_message_len: 16 << 20,
            initial_seq: 0,
            coalesce: true,
            adaptive_timeout: true,
        }
    }
}

impl WindowConfig {
    /// Payload bytes carried by one full frame: `mtu - wire::OVERHEAD`.
    pub const fn max_payload(&self) -> usize {
        self.mtu.saturating_sub(wire::OVERHEAD)
    }

    /// Checks every field against its documented range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(wire::MIN_MTU..=wire::MAX_MTU).contains(&self.mtu) {
            return Err(ConfigError::Mtu(self.mtu));
        }
        if !(1..=MAX_WINDOW).contains(&self.window) {
            return Err(ConfigError::Window(self.window));
        }
        if self.send_timeout == Micros::ZERO {
            return Err(ConfigError::SendTimeout);
        }
        if self.ack_timeout == Micros::ZERO || self.ack_timeout >= self.send_timeout {
            return Err(ConfigError::AckTimeout {
                ack: self.ack_timeout,
                send: self.send_timeout,
            });
        }
        if !(1..=self.window).contains(&self.ack_every) {
            return Err(ConfigError::AckEvery {
                ack_every: self.ack_every,
                window: self.window,
            });
        }
        if self.peer_timeout < self.send_timeout {
            return Err(ConfigError::PeerTimeout {
                peer: self.peer_timeout,
                send: self.send_timeout,
            });
        }
        if self.send_queue_capacity == 0 {
            return Err(ConfigError::SendQueueCapacity);
        }
        let most = usize::from(u16::MAX) * self.max_payload();
        if self.max_message_len < MIN_MAX_MESSAGE_LEN || self.max_message_len > most {
            return Err(ConfigError::MaxMessageLen {
                len: self.max_message_len,
                most,
            });
        }
        Ok(())
    }
}

/// The smallest allowed [`WindowConfig::max_message_len`]: 1 MiB.
pub const MIN_MAX_MESSAGE_LEN: usize = 1 << 20;

/// A [`WindowConfig`] field outside its range.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// `mtu` outside [`wire::MIN_MTU`]..=[`wire::MAX_MTU`].
    #[error("mtu {0} bytes is outside {min}..={max}", min = wire::MIN_MTU, max = wire::MAX_MTU)]
    Mtu(usize),
    /// `window` outside 1..=[`MAX_WINDOW`].
    #[error("window {0} frames is outside 1..={MAX_WINDOW}")]
    Window(u32),
    /// `send_timeout` is zero.
    #[error("send_timeout must be above 0 µs")]
    SendTimeout,
    /// `ack_timeout` is zero or not below `send_timeout` (thesis §3.2.1).
    #[error("ack_timeout {ack} must be above 0 and below send_timeout {send}")]
    AckTimeout {
        /// The ACK timeout given.
        ack: Micros,
        /// The SEND timeout given.
        send: Micros,
    },
    /// `ack_every` outside 1..=`window`.
    #[error("ack_every {ack_every} frames is outside 1..={window}")]
    AckEvery {
        /// The value given.
        ack_every: u32,
        /// The window size.
        window: u32,
    },
    /// `peer_timeout` below `send_timeout`.
    #[error("peer_timeout {peer} must be at least send_timeout {send}")]
    PeerTimeout {
        /// The peer timeout given.
        peer: Micros,
        /// The SEND timeout given.
        send: Micros,
    },
    /// `send_queue_capacity` is zero.
    #[error("send_queue_capacity must be at least 1 message")]
    SendQueueCapacity,
    /// `max_message_len` below 1 MiB or above what 65 535 fragments carry.
    #[error("max_message_len {len} bytes is outside 1 MiB..={most} bytes for this mtu")]
    MaxMessageLen {
        /// The value given.
        len: usize,
        /// The most 65 535 fragments carry at the configured mtu.
        most: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(WindowConfig::default().validate(), Ok(()));
    }

    #[test]
    fn config_ranges_are_checked() {
        let bad = |f: fn(&mut WindowConfig)| {
            let mut c = WindowConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert_eq!(bad(|c| c.mtu = 10), ConfigError::Mtu(10));
        assert_eq!(bad(|c| c.window = 0), ConfigError::Window(0));
        assert_eq!(
            bad(|c| c.window = MAX_WINDOW + 1),
            ConfigError::Window(MAX_WINDOW + 1)
        );
        assert_eq!(
            bad(|c| c.send_timeout = Micros::ZERO),
            ConfigError::SendTimeout
        );
        assert!(matches!(
            bad(|c| c.ack_timeout = c.send_timeout),
            ConfigError::AckTimeout { .. }
        ));
        assert!(matches!(
            bad(|c| c.ack_every = 0),
            ConfigError::AckEvery { .. }
        ));
        assert!(matches!(
            bad(|c| c.peer_timeout = Micros(1)),
            ConfigError::PeerTimeout { .. }
        ));
        assert_eq!(
            bad(|c| c.send_queue_capacity = 0),
            ConfigError::SendQueueCapacity
        );
        assert!(matches!(
            bad(|c| c.max_message_len = 1000),
            ConfigError::MaxMessageLen { .. }
        ));
        // At the smallest MTU, 65 535 fragments still carry 1 MiB.
        let small = WindowConfig {
            mtu: wire::MIN_MTU,
            max_message_len: MIN_MAX_MESSAGE_LEN,
            ..WindowConfig::default()
        };
        assert_eq!(small.validate(), Ok(()));
    }

    #[test]
    fn micros_saturate() {
        assert_eq!(Micros(u64::MAX) + Micros(5), Micros(u64::MAX));
        assert_eq!(Micros(3).saturating_sub(Micros(5)), Micros::ZERO);
        assert_eq!(Micros::from_millis(2), Micros(2_000));
    }
}
