//! A deterministic simulated network for protocol tests and benchmarks (style practice 8,
//! after quinn-proto's `tests/util.rs`).
//!
//! A virtual clock, a seeded random generator, and a delay queue of datagrams between
//! several [`Ini`]s. Each datagram handed out by an INI can be dropped, duplicated,
//! delayed (base latency plus jitter; a link stays FIFO like a real one) or held back so
//! that later datagrams overtake it (reordering), and corrupted (one bit flipped), with
//! the probabilities of [`SimConfig`] (the fault injection of design.md *Network
//! emulation*). Time only advances to the next datagram
//! arrival or INI timeout, so a run takes as long as its computation, and the same seed
//! always gives the same run.

use super::{Event, Ini, IniAddr, Micros};
use serde::Serialize;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

/// Network behaviour of a [`Sim`]. Probabilities are per datagram, in `0.0..=1.0`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimConfig {
    /// Seed of the random generator: same seed, same run.
    pub seed: u64,
    /// One-way base delay in µs.
    pub latency: Micros,
    /// Extra delay drawn uniformly from `0..=jitter` µs per datagram. Jitter alone keeps
    /// each link FIFO: a datagram never arrives before one sent earlier on the same link
    /// unless that one was reordered.
    pub jitter: Micros,
    /// Probability that a datagram is lost.
    pub drop: f64,
    /// Probability that a datagram is delivered twice (each copy delayed independently).
    pub duplicate: f64,
    /// Probability that a delivered copy has one random bit flipped.
    pub corrupt: f64,
    /// Probability that a copy is held back by up to `reorder_delay` more µs, outside the
    /// link's FIFO order, so that later datagrams overtake it.
    pub reorder: f64,
    /// Largest extra delay of a reordered copy, in µs.
    pub reorder_delay: Micros,
}

impl SimConfig {
    /// A perfect link: 50 µs latency, no jitter, no faults.
    pub fn lossless(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            latency: Micros(50),
            jitter: Micros::ZERO,
            drop: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            reorder_delay: Micros::ZERO,
        }
    }
}

/// What the simulated network did, in datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// Datagrams handed to the network by the INIs.
    pub sent: u64,
    /// Datagrams lost to the `drop` probability.
    pub dropped: u64,
    /// Extra copies made by the `duplicate` probability.
    pub duplicated: u64,
    /// Copies delivered with a flipped bit.
    pub corrupted: u64,
    /// Copies held back by the `reorder` probability.
    pub reordered: u64,
    /// Copies handed to a destination INI (corrupted ones included).
    pub delivered: u64,
    /// Datagrams lost because their source or destination is black-holed.
    pub blackholed: u64,
    /// Datagrams addressed to an INI not in the simulation.
    pub unroutable: u64,
}

/// SplitMix64: small, fast, and good enough to draw network faults.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `p` (draws nothing when `p <= 0`).
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Uniform in `0..=max` (draws nothing when `max == 0`).
    fn upto(&mut self, max: u64) -> u64 {
        if max == 0 {
            0
        } else {
            self.next_u64() % (max + 1)
        }
    }
}

/// A datagram on the wire; ordered by arrival time, then by creation order.
struct InFlight {
    arrival: Micros,
    order: u64,
    to: usize,
    bytes: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.arrival, self.order) == (other.arrival, other.order)
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.arrival, self.order).cmp(&(other.arrival, other.order))
    }
}

/// Several [`Ini`]s on a simulated network with a virtual clock. See the module doc.
pub struct Sim {
    cfg: SimConfig,
    rng: Rng,
    now: Micros,
    nodes: Vec<Ini>,
    route: HashMap<IniAddr, usize>,
    blackholed: Vec<bool>,
    /// Latest in-order arrival per (from, to) link, to keep links FIFO under jitter.
    link_tail: HashMap<(usize, usize), Micros>,
    wire: BinaryHeap<Reverse<InFlight>>,
    order: u64,
    pool: Vec<Vec<u8>>,
    tx: Vec<u8>,
    stats: SimStats,
}

impl Sim {
    /// An empty network at time 0.
    pub fn new(cfg: SimConfig) -> Sim {
        Sim {
            rng: Rng(cfg.seed),
            cfg,
            now: Micros::ZERO,
            nodes: Vec::new(),
            route: HashMap::new(),
            blackholed: Vec::new(),
            link_tail: HashMap::new(),
            wire: BinaryHeap::new(),
            order: 0,
            pool: Vec::new(),
            tx: Vec::new(),
            stats: SimStats::default(),
        }
    }

    /// Attaches `ini` and returns its node index (0, 1, … in order).
    pub fn add_node(&mut self, ini: Ini) -> usize {
        let i = self.nodes.len();
        self.route.insert(ini.local(), i);
        if self.tx.len() < ini.config().mtu {
            self.tx.resize(ini.config().mtu, 0);
        }
        self.nodes.push(ini);
        self.blackholed.push(false);
        i
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &Ini {
        &self.nodes[i]
    }

    /// Node `i`, mutably (to enqueue messages and take events).
    pub fn node_mut(&mut self, i: usize) -> &mut Ini {
        &mut self.nodes[i]
    }

    /// The virtual time in µs.
    pub fn now(&self) -> Micros {
        self.now
    }

    /// What the network did so far.
    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// Datagrams on the wire now.
    pub fn datagrams_in_flight(&self) -> usize {
        self.wire.len()
    }

    /// When `on`, every datagram from or to node `i` is lost (a dead peer).
    pub fn set_blackhole(&mut self, i: usize, on: bool) {
        self.blackholed[i] = on;
    }

    /// Hands every datagram the INIs want to send to the network, at the current time.
    pub fn flush(&mut self) {
        for from in 0..self.nodes.len() {
            while let Some(t) = self.nodes[from].poll_transmit(self.now, &mut self.tx) {
                self.stats.sent += 1;
                let Some(&to) = self.route.get(&t.peer) else {
                    self.stats.unroutable += 1;
                    continue;
                };
                if self.blackholed[from] || self.blackholed[to] {
                    self.stats.blackholed += 1;
                    continue;
                }
                if self.rng.chance(self.cfg.drop) {
                    self.stats.dropped += 1;
                    continue;
                }
                let copies = if self.rng.chance(self.cfg.duplicate) {
                    self.stats.duplicated += 1;
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    self.launch(from, to, t.len);
                }
            }
        }
    }

    /// Puts one copy of `self.tx[..len]` on the wire from node `from` to node `to`.
    fn launch(&mut self, from: usize, to: usize, len: usize) {
        let mut arrival = self.now + self.cfg.latency + Micros(self.rng.upto(self.cfg.jitter.0));
        if self.rng.chance(self.cfg.reorder) {
            self.stats.reordered += 1;
            arrival = arrival + Micros(self.rng.upto(self.cfg.reorder_delay.0));
        } else {
            let tail = self.link_tail.entry((from, to)).or_insert(Micros::ZERO);
            arrival = arrival.max(*tail);
            *tail = arrival;
        }
        let mut bytes = self.pool.pop().unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(&self.tx[..len]);
        if self.rng.chance(self.cfg.corrupt) {
            self.stats.corrupted += 1;
            let bit = self.rng.upto(len as u64 * 8 - 1) as usize;
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        self.order += 1;
        self.wire.push(Reverse(InFlight {
            arrival,
            order: self.order,
            to,
            bytes,
        }));
    }

    /// The next instant anything happens: a datagram arrival or an INI timeout.
    pub fn next_time(&mut self) -> Option<Micros> {
        let net = self.wire.peek().map(|r| r.0.arrival);
        let timers = self.nodes.iter_mut().filter_map(Ini::poll_timeout).min();
        net.into_iter().chain(timers).min()
    }

    /// Flushes, advances the clock to the next instant anything happens, delivers the
    /// datagrams due and runs the INI timers due, then flushes again. Returns false (and
    /// does nothing more) when nothing is pending anywhere.
    pub fn step(&mut self) -> bool {
        self.flush();
        let Some(t) = self.next_time() else {
            return false;
        };
        self.now = self.now.max(t);
        while let Some(head) = self.wire.peek()
            && head.0.arrival <= self.now
        {
            let Some(Reverse(d)) = self.wire.pop() else {
                break;
            };
            if self.blackholed[d.to] {
                self.stats.blackholed += 1;
            } else {
                self.stats.delivered += 1;
                // Rejections are counted in the INI's statistics.
                let _ = self.nodes[d.to].handle_datagram(self.now, &d.bytes);
            }
            self.pool.push(d.bytes);
        }
        for node in &mut self.nodes {
            if node.poll_timeout().is_some_and(|t| t <= self.now) {
                node.handle_timeout(self.now);
            }
        }
        self.flush();
        true
    }

    /// Steps until `done(self)` holds (checked before each step) or nothing is pending.
    /// Returns whether `done` held.
    pub fn run_until(&mut self, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
    }

    /// Takes every pending event of node `i`.
    pub fn drain_events(&mut self, i: usize) -> Vec<Event> {
        std::iter::from_fn(|| self.nodes[i].poll_event()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_roughly_fair() {
        let mut a = Rng(7);
        let mut b = Rng(7);
        let hits = (0..100_000).filter(|_| a.chance(0.1)).count();
        for _ in 0..100_000 {
            b.chance(0.1);
        }
        assert_eq!(a.next_u64(), b.next_u64());
        assert!((9_000..11_000).contains(&hits), "{hits}");
        assert!(!a.chance(0.0));
        assert!((0..1000).all(|_| a.upto(5) <= 5));
        assert_eq!(a.upto(0), 0);
    }
}
