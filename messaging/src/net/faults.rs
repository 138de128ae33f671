//! Fault injection in the datagram path (drop, duplicate, reorder, corrupt), each a
//! probability from the job's `[faults]` section, with a seeded generator so a failing
//! run can be reproduced. Off by default; used to test that the sliding window delivers
//! every message exactly once and in order anyway.

use multigrain_cluster_config::FaultConfig;
use serde::Serialize;

/// Counts of injected faults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InjectedFaults {
    /// Datagrams not sent.
    pub dropped: u64,
    /// Datagrams sent twice.
    pub duplicated: u64,
    /// Datagrams held back and sent after the next one.
    pub reordered: u64,
    /// Datagrams sent with one bit flipped.
    pub corrupted: u64,
}

/// What to put on the wire for one datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send these datagrams now, in order (0, 1, 2 or 3 of them), each on the
    /// connection it names: a datagram held back for reordering goes to the peer it was
    /// written for, whichever connection's datagram releases it.
    Send(Vec<(usize, Vec<u8>)>),
}

/// The shim: one per INI.
#[derive(Debug)]
pub struct FaultShim {
    cfg: FaultConfig,
    state: u64,
    /// A datagram held back for reordering and the connection it is for.
    held: Option<(usize, Vec<u8>)>,
    /// Counters.
    pub counts: InjectedFaults,
}

impl FaultShim {
    /// A shim with `cfg`'s probabilities, seeded with `cfg.seed` mixed with `stream` (e.g.
    /// the INI's address) so INIs do not inject identical patterns.
    pub fn new(cfg: &FaultConfig, stream: u64) -> FaultShim {
        let state = cfg.seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
        FaultShim {
            cfg: *cfg,
            state: state | 1,
            held: None,
            counts: InjectedFaults::default(),
        }
    }

    /// True if any probability is non-zero.
    pub fn is_active(&self) -> bool {
        self.cfg.is_enabled()
    }

    fn next(&mut self) -> u64 {
        // xorshift64*: fast, deterministic, good enough for fault dice.
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Decides the fate of `datagram`, written for connection `conn` (an index into the
    /// INI's senders).
    pub fn apply(&mut self, conn: usize, datagram: &[u8]) -> Verdict {
        let mut out = Vec::with_capacity(3);
        if self.chance(self.cfg.drop) {
            self.counts.dropped += 1;
        } else {
            let mut d = datagram.to_vec();
            if self.chance(self.cfg.corrupt) && !d.is_empty() {
                let bit = self.next() as usize % (d.len() * 8);
                d[bit / 8] ^= 1 << (bit % 8);
                self.counts.corrupted += 1;
            }
            if self.chance(self.cfg.duplicate) {
                out.push((conn, d.clone()));
                self.counts.duplicated += 1;
            }
            if self.held.is_none() && self.chance(self.cfg.reorder) {
                self.held = Some((conn, d));
                self.counts.reordered += 1;
            } else {
                out.push((conn, d));
            }
        }
        if out.is_empty() {
            return Verdict::Send(out);
        }
        if let Some(h) = self.held.take() {
            out.push(h);
        }
        Verdict::Send(out)
    }

    /// A datagram held back for reordering and its connection, to be sent when the INI
    /// stops (else it is sent after the next datagram the INI sends).
    pub fn flush(&mut self) -> Option<(usize, Vec<u8>)> {
        self.held.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_roughly_the_configured_probabilities_and_seeded() {
        let cfg = FaultConfig {
            drop: 0.1,
            duplicate: 0.05,
            reorder: 0.05,
            corrupt: 0.01,
            seed: 7,
        };
        let run = || {
            let mut s = FaultShim::new(&cfg, 3);
            let mut sent = 0;
            for i in 0..100_000u32 {
                let Verdict::Send(v) = s.apply(0, &i.to_le_bytes());
                sent += v.len();
            }
            (s.counts, sent)
        };
        let (c, sent) = run();
        assert_eq!(run(), (c, sent), "deterministic from the seed");
        assert!((9_000..11_000).contains(&c.dropped), "{c:?}");
        assert!((4_000..5_500).contains(&c.duplicated), "{c:?}");
        assert!((3_500..5_500).contains(&c.reordered), "{c:?}");
        assert!((700..1_300).contains(&c.corrupted), "{c:?}");
        assert!(sent > 90_000);
    }

    #[test]
    fn off_passes_everything_through_unchanged() {
        let mut s = FaultShim::new(&FaultConfig::default(), 0);
        assert!(!s.is_active());
        assert_eq!(
            s.apply(2, b"abc"),
            Verdict::Send(vec![(2, b"abc".to_vec())])
        );
    }

    /// A datagram held back for reordering still goes to the peer it was written for
    /// when another connection's datagram releases it (an INI with several peers), and
    /// at the INI's stop.
    #[test]
    fn a_reordered_datagram_keeps_its_connection() {
        let cfg = FaultConfig {
            reorder: 0.5,
            seed: 11,
            ..FaultConfig::default()
        };
        let mut s = FaultShim::new(&cfg, 1);
        let mut sent = Vec::new();
        for i in 0..1_000u32 {
            let conn = (i % 3) as usize;
            let mut d = i.to_le_bytes().to_vec();
            d.push(conn as u8);
            let Verdict::Send(v) = s.apply(conn, &d);
            sent.extend(v);
        }
        sent.extend(s.flush());
        assert!(s.counts.reordered > 100, "{:?}", s.counts);
        assert_eq!(sent.len(), 1_000, "nothing lost or doubled");
        let mut late = 0;
        for (k, (conn, d)) in sent.iter().enumerate() {
            assert_eq!(
                usize::from(d[4]),
                *conn,
                "datagram {d:?} sent on connection {conn}"
            );
            let i = u32::from_le_bytes(d[..4].try_into().unwrap());
            late += usize::from(i as usize != k);
        }
        assert!(late > 100, "the order changed ({late} out of place)");
    }
}
